"""What the router expects a request to generate: its max_tokens times the share of their caps
that its tenant's answers have run to."""

import pytest

from controllers.router.answers import MAX_TENANTS, OWN_AFTER, PRIOR_TOKENS, SPAN, AnswerLengths
from router_factories import MODEL, request_factory


def capped(tenant: str = "acme", cap: int = 2000, model: str = MODEL):
    return request_factory(tenant=tenant, model=model, max_tokens=cap)


def test_before_any_answer_a_short_one_is_expected_never_more_than_the_cap():
    answers = AnswerLengths()
    assert answers.expected(capped()) == PRIOR_TOKENS
    assert answers.expected(capped(cap=40)) == 40


def test_a_fixed_cap_gives_the_mean_answer_and_answers_run_to_their_cap_give_the_cap():
    """A client whose cap is 2,000 and whose answers run 200-600 tokens; an engine that ignores
    the end of sequence (the live workers), every answer as long as its max_tokens."""
    chat, to_cap = AnswerLengths(), AnswerLengths()
    for i in range(OWN_AFTER):
        chat.completed("acme", MODEL, 200 + 400 * (i % 2), 2000)
        to_cap.completed("acme", MODEL, 900 + 10 * i, 900 + 10 * i)
    assert chat.expected(capped()) == pytest.approx(400)
    assert to_cap.expected(capped(cap=1000)) == pytest.approx(1000)


def test_short_capped_calls_do_not_stand_for_long_capped_ones():
    """A tenant's one-token classifications (their answers run to the cap) beside its chats
    capped at 4,096 that answer 300 tokens: a share over both would expect 1,400 of a chat."""
    answers = AnswerLengths()
    for _ in range(3 * OWN_AFTER):
        answers.completed("acme", MODEL, 1, 1)
        answers.completed("acme", MODEL, 1, 1)
        answers.completed("acme", MODEL, 300, 4096)
    assert answers.expected(capped(cap=4096)) == pytest.approx(300)
    assert answers.expected(capped(cap=1)) == 1
    assert answers.expected(capped(cap=3000)) == pytest.approx(3000 * 300 / 4096)  # same band


def test_the_models_answers_stand_for_a_tenant_until_it_has_enough_of_its_own():
    answers = AnswerLengths()
    for _ in range(OWN_AFTER - 1):
        answers.completed("other", MODEL, 100, 1000)
        answers.completed("acme", MODEL, 500, 1000)
    assert answers.expected(capped(cap=1000)) == pytest.approx(300)  # the model's share, 0.3
    answers.completed("acme", MODEL, 500, 1000)
    assert answers.expected(capped(cap=1000)) == pytest.approx(500)  # its own 0.5, from its 8th
    model_share = ((OWN_AFTER - 1) * 0.1 + OWN_AFTER * 0.5) / (2 * OWN_AFTER - 1)
    assert answers.expected(capped("new", cap=1000)) == pytest.approx(1000 * model_share)
    assert answers.expected(capped(cap=2000)) == PRIOR_TOKENS  # no answer with a cap that long
    assert answers.expected(capped(model="another-model")) == PRIOR_TOKENS


def test_the_mean_follows_the_recent_answers():
    answers = AnswerLengths()
    for _ in range(SPAN):
        answers.completed("acme", MODEL, 1000, 1000)
    for _ in range(4 * SPAN):  # the answers got short: the mean comes down to them
        answers.completed("acme", MODEL, 50, 1000)
    assert 50 <= answers.expected(capped(cap=1000)) < 50 + 950 * 0.03


def test_tokens_left_is_the_rest_of_the_expected_answer_and_at_least_one_within_the_cap():
    answers = AnswerLengths()
    for _ in range(OWN_AFTER):
        answers.completed("acme", MODEL, 200, 2000)
    assert answers.left(capped(), 0) == 200
    assert answers.left(capped(), 150) == 50
    assert answers.left(capped(), 900) == 1  # past the mean: not known to be ending
    assert answers.left(capped(cap=900), 900) == 0  # the cap reached: nothing more comes


def test_tenants_named_by_clients_are_kept_to_a_bound_the_least_recently_heard_forgotten():
    answers = AnswerLengths()
    for i in range(MAX_TENANTS + 10):
        answers.completed(f"t{i}", MODEL, 10, 100)
        answers.completed("busy", MODEL, 10, 100)  # heard of all along: kept
    band = (100 - 1).bit_length()
    assert len(answers._tenants) == MAX_TENANTS and ("t0", MODEL, band) not in answers._tenants
    assert answers._tenants[("busy", MODEL, band)].count == MAX_TENANTS + 10  # never forgotten
