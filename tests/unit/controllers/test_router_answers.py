"""What the router expects a request to generate when its max_tokens is only a cap."""

import pytest

from controllers.router.answers import MAX_TENANTS, OWN_AFTER, PRIOR_TOKENS, SPAN, AnswerLengths
from router_factories import MODEL, request_factory


def capped(tenant: str = "acme", cap: int = 2000, model: str = MODEL):
    return request_factory(tenant=tenant, model=model, max_tokens=cap)


def test_before_any_answer_a_short_one_is_expected_never_more_than_the_cap():
    answers = AnswerLengths()
    assert answers.expected(capped()) == PRIOR_TOKENS
    assert answers.expected(capped(cap=40)) == 40


def test_the_models_answers_stand_for_a_tenant_until_it_has_enough_of_its_own():
    answers = AnswerLengths()
    for _ in range(OWN_AFTER - 1):
        answers.completed("other", MODEL, 100)
        answers.completed("acme", MODEL, 500)
    assert answers.expected(capped()) == 300  # the model's mean, both tenants'
    answers.completed("acme", MODEL, 500)
    assert answers.expected(capped()) == 500  # acme's own, from its OWN_AFTER-th answer
    model_mean = ((OWN_AFTER - 1) * 100 + OWN_AFTER * 500) / (2 * OWN_AFTER - 1)
    assert answers.expected(capped("new")) == pytest.approx(model_mean)
    assert answers.expected(capped(model="another-model")) == PRIOR_TOKENS


def test_the_mean_follows_the_recent_answers():
    answers = AnswerLengths()
    for _ in range(SPAN):
        answers.completed("acme", MODEL, 1000)
    for _ in range(4 * SPAN):  # the answers got short: the mean comes down to them
        answers.completed("acme", MODEL, 50)
    assert 50 <= answers.expected(capped()) < 50 + 950 * 0.03


def test_tokens_left_is_the_rest_of_the_expected_answer_and_at_least_one_within_the_cap():
    answers = AnswerLengths()
    for _ in range(OWN_AFTER):
        answers.completed("acme", MODEL, 200)
    assert answers.left(capped(), 0) == 200
    assert answers.left(capped(), 150) == 50
    assert answers.left(capped(), 900) == 1  # past the mean: not known to be ending
    assert answers.left(capped(cap=900), 900) == 0  # the cap reached: nothing more comes


def test_tenants_named_by_clients_are_kept_to_a_bound():
    answers = AnswerLengths()
    for i in range(MAX_TENANTS + 10):
        answers.completed(f"t{i}", MODEL, 10)
    assert len(answers._tenants) == MAX_TENANTS and ("t0", MODEL) not in answers._tenants
