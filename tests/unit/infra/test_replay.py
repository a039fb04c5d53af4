"""Tests of infra.replay.to_request: a trace row becomes an InferenceRequest."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.replay import SentRows, replay, to_request
from infra.traces import TraceRequest
from schemas.codec import decode, encode
from schemas.limits import MAX_OUTPUT_TOKENS
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000


def test_maps_every_field() -> None:
    item = TraceRequest(arrival_s=12.5, prompt_tokens=1025, output_tokens=7, hash_ids=(4, 5, 6),
                        block_size=512, tenant="acme", priority=3, model="llama-3-70b",
                        task_id="task-9", step=2, steps_total=4, ttft_slo_s=1.5, deadline_s=30.0)
    request = to_request(item, "run-000001", T0)
    assert request.request_id == "run-000001"
    assert request.created_ms == request.event_time_ms == T0
    assert request.deadline_ms == T0 + 30_000
    assert request.ttft_slo_s == 1.5
    assert request.prompt_tokens == 1025
    assert request.max_tokens == 7
    assert request.prefix_hashes == [4, 5, 6]
    assert request.block_size == 512
    assert (request.tenant, request.priority, request.model) == ("acme", 3, "llama-3-70b")
    assert (request.task_id, request.step, request.steps_total) == ("task-9", 2, 4)
    assert request.prompt_text is None and request.prompt_token_ids is None
    spec = TopicCatalog().spec("governor.requests")
    assert decode(spec, encode(request)) == request


def test_defaults_of_a_bare_row() -> None:
    request = to_request(TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3), "r", T0)
    assert request.deadline_ms is None
    assert request.ttft_slo_s is None
    assert request.prefix_hashes == []
    assert request.block_size == 512
    assert (request.tenant, request.model, request.priority) == ("default", "llama-3-8b", 0)
    assert (request.task_id, request.step, request.steps_total) == (None, 1, 1)


@pytest.mark.parametrize(
    ("output_tokens", "max_tokens"),
    [(0, 1), (1, 1), (500, 500), (MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS)],
)
def test_output_tokens_become_max_tokens(output_tokens: int, max_tokens: int) -> None:
    item = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=output_tokens)
    assert to_request(item, "r", T0).max_tokens == max_tokens


def test_a_row_asking_more_output_tokens_than_a_request_may_is_refused_not_cut() -> None:
    from infra.replay import check_requests
    from infra.traces import TraceError

    rows = [TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=5),
            TraceRequest(arrival_s=1.0, prompt_tokens=10, output_tokens=MAX_OUTPUT_TOKENS + 1)]
    with pytest.raises(TraceError, match=r"trace request 1 .*output_tokens: .*less than or equal "
                                         f"to {MAX_OUTPUT_TOKENS}"):
        check_requests(rows, "run")


@pytest.mark.parametrize(
    ("deadline_s", "deadline_ms"),
    [(1.0, T0 + 1_000), (0.25, T0 + 250), (0.0004, T0), (86_400.0, T0 + 86_400_000)],
)
def test_deadline_is_relative_to_creation(deadline_s: float, deadline_ms: int) -> None:
    item = TraceRequest(arrival_s=3.0, prompt_tokens=1, output_tokens=1, deadline_s=deadline_s)
    assert to_request(item, "r", T0).deadline_ms == deadline_ms


def test_hash_ids_keep_order_and_block_size() -> None:
    item = TraceRequest(arrival_s=0.0, prompt_tokens=40, output_tokens=1, hash_ids=(9, 1, 5),
                        block_size=16)
    request = to_request(item, "r", T0)
    assert request.prefix_hashes == [9, 1, 5]
    assert request.block_size == 16


def test_replay_refuses_a_non_positive_speedup() -> None:
    import asyncio

    # It refuses before connecting, so no broker is needed.
    with pytest.raises(ValueError, match="speedup"):
        asyncio.run(replay([], "127.0.0.1:1", TopicCatalog(), run_id="r", speedup=0))


@pytest.mark.parametrize(("bad", "named"), [
    (dict(tenant="acme corp"), "tenant"),
    (dict(priority=12), "priority"),
    (dict(ttft_slo_s=100_000.0), "ttft_slo_s"),
])
def test_a_trace_with_an_invalid_row_is_refused_whole_before_replaying(
        bad: dict, named: str) -> None:
    """A row the router would refuse stops a replay before its first request is on the topic
    (``governor replay`` and ``governor demo`` check first), not partway."""
    from infra.replay import check_requests
    from infra.traces import TraceError

    rows = [TraceRequest(arrival_s=float(i), prompt_tokens=10, output_tokens=3) for i in range(3)]
    assert check_requests(iter(rows), "r") == 3  # streamed: one row at a time
    rows.append(TraceRequest(arrival_s=3.0, prompt_tokens=10, output_tokens=3, **bad))
    with pytest.raises(TraceError, match=rf"trace request 3 \(arrival 3s\) is not a valid "
                                         rf"request: {named}") as info:
        check_requests(iter(rows), "r")
    assert "\n" not in str(info.value)


def test_with_deadlines_gives_the_targets_governor_sim_gives():
    """A live replay with ``--deadlines rule`` asks what a simulated run of the rows judges by."""
    from infra.replay import with_deadlines
    from infra.sim.requests import request_specs
    from infra.sim.slo import SloRule

    rows = [TraceRequest(arrival_s=0.0, prompt_tokens=12_000, output_tokens=300),
            TraceRequest(arrival_s=1.0, prompt_tokens=10, output_tokens=0),
            TraceRequest(arrival_s=2.0, prompt_tokens=500, output_tokens=20, ttft_slo_s=0.5),
            TraceRequest(arrival_s=3.0, prompt_tokens=500, output_tokens=20, deadline_s=9.0)]
    stamped = list(with_deadlines(rows))
    specs = request_specs(rows, 1.0, SloRule())
    assert [(r.ttft_slo_s, r.deadline_s) for r in stamped] == \
        [(s.ttft_slo_s, s.deadline_s) for s in specs]
    assert (stamped[0].ttft_slo_s, stamped[0].deadline_s) == (3.2, 3.2 + 30.0)
    assert (stamped[2].ttft_slo_s, stamped[3].deadline_s) == (0.5, 9.0)  # a row's own kept
    assert to_request(stamped[0], "r", T0).deadline_ms == T0 + 33_200


def test_a_rule_ttft_target_stops_at_the_deadline_a_row_states():
    """A row that states only a short deadline gets the rule's TTFT target cut to it, live and
    simulated alike (a first token due after the whole answer is no target; a trace row with
    one is refused, so replay and demo could not stamp it)."""
    from infra.replay import with_deadlines
    from infra.sim.requests import request_specs
    from infra.sim.slo import SloRule

    rows = [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=20, deadline_s=1.0)]
    assert SloRule().ttft_slo_s(500) == 2.05  # the rule alone: past the deadline
    stamped = list(with_deadlines(rows))
    spec = request_specs(rows, 1.0, SloRule())[0]
    assert (stamped[0].ttft_slo_s, stamped[0].deadline_s) == (1.0, 1.0)
    assert (spec.ttft_slo_s, spec.deadline_s) == (1.0, 1.0)


def test_a_ttft_target_past_the_configured_deadline_stops_at_it():
    """``sim --deadlines config``: a row that states only a TTFT target above ``slo.deadline_s``
    (or a prompt so long that the rule's target passes it) is judged against a first-token
    target at the deadline, not after it, as the live streams judge such a row replayed (its
    SLO is met only by completing within the deadline). The row is no bad row: ``replay``
    sends it as it is, so ``sim`` takes it too."""
    from infra.replay import check_requests
    from infra.sim.options import SimOptions
    from infra.sim.requests import request_specs

    rows = [TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=20, ttft_slo_s=90.0),
            TraceRequest(arrival_s=1.0, prompt_tokens=800_000, output_tokens=20),
            TraceRequest(arrival_s=2.0, prompt_tokens=500, output_tokens=20, ttft_slo_s=5.0)]
    assert check_requests(iter(rows), "r") == 3  # replay sends each
    rule = SimOptions(deadlines="config").slo_rule  # slo.deadline_s: 60 s
    specs = request_specs(rows, 1.0, rule)
    assert [(s.ttft_slo_s, s.deadline_s) for s in specs] == [(60.0, 60.0), (60.0, 60.0),
                                                            (5.0, 60.0)]


def test_a_runs_task_ids_are_its_own() -> None:
    """Replaying a workload again is a new run: its tasks are not the earlier run's (the router
    fails a task's later steps once one of its steps is refused)."""
    item = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3, task_id="taskA",
                        step=1, steps_total=2)
    assert to_request(item, "ta-000000", T0, "ta").task_id == "ta-taskA"
    assert to_request(item, "tb-000000", T0, "tb").task_id == "tb-taskA"
    alone = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3)
    assert to_request(alone, "ta-000001", T0, "ta").task_id is None
    long_id = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3, task_id="t" * 120,
                           step=1, steps_total=2)  # valid alone, too long with a run id
    run = "replay-20261205-120000-abcdef"
    first = to_request(long_id, f"{run}-000000", T0, run).task_id
    assert first == to_request(long_id, f"{run}-000001", T0, run).task_id
    assert first.startswith(f"{run}-") and len(first) <= 128


@pytest.mark.parametrize("run_length", [111, 121])  # (--run-id takes up to 121 characters)
def test_a_long_run_id_does_not_make_a_valid_task_id_invalid(run_length: int) -> None:
    """A task id of 17 characters, valid alone, under a --run-id the CLI takes: before 6 Dec
    the row was refused (`task_id: String should have at most 128 characters`), blaming the
    trace's task id for the run id's length; tasks stay apart, the steps of one together."""
    run = "r" * run_length
    ids = {}
    for task in ("conversation-0001", "conversation-0002"):
        item = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3, task_id=task,
                            step=1, steps_total=2)
        ids[task] = to_request(item, f"{run}-000000", T0, run).task_id
        assert ids[task] == to_request(item, f"{run}-000001", T0, run).task_id
        assert len(ids[task]) <= 128 and ids[task].startswith(run[:95])
    assert len(set(ids.values())) == 2
    other = run[:-1] + "s"  # another run: other task ids, though only its last letter differs
    item = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3,
                        task_id="conversation-0001", step=1, steps_total=2)
    assert to_request(item, f"{other}-000000", T0, other).task_id != ids["conversation-0001"]


def test_check_requests_names_the_line_and_column_of_the_file_the_rows_came_from(
        tmp_path: Path) -> None:
    """``governor replay`` and ``governor demo`` check a trace's rows by ``check_requests``
    given the file: its error names the row's line and the file's column for the field."""
    from infra.replay import check_requests
    from infra.traces import TraceError, load_trace

    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                    "\n2023-11-16 18:15:46.9,374,9\n2023-11-16 18:15:47.0,374,10\n"
                    f"2023-11-16 18:15:48.0,374,{MAX_OUTPUT_TOKENS + 1}\n")
    with pytest.raises(TraceError, match=rf"^{path} line 6: trace request 3 \(arrival 1.31941s\) "
                                         r"is not a valid request: GeneratedTokens: "):
        check_requests(load_trace(path), "r", path)


@pytest.mark.parametrize(("run_length", "most"), [(122, 121), (128, 121)])
def test_a_run_id_too_long_for_the_request_ids_is_named_not_the_row(run_length: int,
                                                                     most: int) -> None:
    """``replay --run-id`` of 121 characters (the most it takes) on a trace of over a million
    rows: request 1,000,000's id, ``<run id>-1000000``, is 129 characters. Before, that row was
    refused as the trace's fault (``trace request 1000000 ... is not a valid request:
    request_id: String should have at most 128 characters``); the same check holds at row 0
    for a longer run id, which only a caller of ``check_requests`` can give."""
    from infra.replay import check_requests
    from infra.traces import TraceError

    item = TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=3)
    with pytest.raises(TraceError, match=rf"^request ids <run id>-NNNNNN pass 128 characters "
                                         rf"from request 0 on \(a run id of {run_length}\): give "
                                         rf"a --run-id of at most {most} characters"):
        check_requests(iter([item]), "r" * run_length)
    assert check_requests(iter([item]), "r" * 121) == 1


def test_a_closed_loop_replay_schedules_as_sim_rate_scale_does():
    """``replay --closed-loop --rate-scale 2``: each request waits for none before its time in
    ``sim --rate-scale 2`` (over ``--speedup``), a task's later step for its previous step."""
    from infra.replay import _TaskSteps
    from infra.sim.requests import earliest_arrivals
    from schemas.topics import TopicCatalog

    rows = [TraceRequest(arrival_s=2.0, prompt_tokens=10, output_tokens=3, task_id="t",
                         steps_total=2),
            TraceRequest(arrival_s=4.0, prompt_tokens=10, output_tokens=3),
            TraceRequest(arrival_s=8.0, prompt_tokens=10, output_tokens=3, task_id="t", step=2,
                         steps_total=2)]
    steps = _TaskSteps(rows, 4.0, 2.0, "r", TopicCatalog("x"), "127.0.0.1:1")
    assert [d.arrival_s for d in steps.arrivals.specs] == \
        [t / 4.0 for t in earliest_arrivals(rows, 2.0)] == [0.25, 0.5, 1.75]
    assert steps.arrivals.next() == (0.25, 0) and list(steps.arrivals.waiting) == [0]


@pytest.mark.parametrize(("rows", "said"), [
    ([], "none"),
    ([0, 1, 2], "r-000000 to r-000002"),
    ([0, 1, 2, 4, 5], "r-000000 to r-000002, r-000004 to r-000005"),
    ([5, 0, 4, 2, 1], "r-000000 to r-000002, r-000004 to r-000005"),  # (in any order)
    ([0, 2, 1], "r-000000 to r-000002"),  # (a row that joins two runs)
    ([3], "r-000003"),
    ([1_000_000, 1_000_001], "r-1000000 to r-1000001"),
    (list(range(0, 14, 2)), "r-000000, r-000002, r-000004, r-000006, r-000008 and 2 more runs"),
])
def test_the_rows_a_replay_sent_are_named_as_runs_of_ids(rows, said) -> None:
    """What an interrupted replay prints; before 7 Dec it named the first rows of the trace,
    as many as were sent, whichever were."""
    sent = SentRows()
    for row in rows:
        sent.add(row)
    assert len(sent) == len(rows)
    assert sent.said("r") == said


class _CountingOutbox:
    """An outbox that counts what it holds unflushed, at most."""

    def __init__(self) -> None:
        self.held = self.most_held = 0

    def emit(self, topic, message, key) -> None:
        self.held += 1
        self.most_held = max(self.most_held, self.held)

    async def flush(self) -> int:
        flushed, self.held = self.held, 0
        return flushed


def test_a_replay_flushes_every_thousand_requests_sent_without_pause() -> None:
    """A replay behind its schedule sends without pause: before, it flushed only before a
    pause, at its end at the latest, hundreds of thousands of requests, which took the broker
    longer than the 15 s a flush may wait (``DELIVERY_S``) to acknowledge."""
    import asyncio

    from infra.replay import FLUSH_EVERY, Deliveries

    outbox = _CountingOutbox()
    deliveries = Deliveries(outbox, "127.0.0.1:1")
    request = to_request(TraceRequest(0.0, 8, 2), "r-000000", 1)

    async def send(count: int) -> None:
        for _ in range(count):
            await deliveries.emit("ns.requests", request, request.request_id)

    asyncio.run(send(2_500))
    assert outbox.most_held == FLUSH_EVERY == 1_000
    assert (deliveries.delivered, len(deliveries.unconfirmed)) == (2_000, 500)
