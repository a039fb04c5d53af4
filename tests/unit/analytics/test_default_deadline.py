"""A request that states no deadline is judged as the streams (and ``governor sim --deadlines
config``) judge it: by its creation plus ``slo.deadline_s``, the setting in force (default 60 s);
one with no TTFT target by ``slo.ttft_slo_s`` in force. Before, the reports took any completion
of such a request for a success and every TTFT target for 2 s: with ``slo.deadline_s`` set to
1.5 s, a live run's streams counted 6 of 12 tasks succeeded and ``governor report cost`` 12."""

from schemas import events
from schemas.config import ConfigSet
from analytics.reports import run_report
from tests.unit.analytics.test_task_outcomes import _History, _successful_tasks, ms


def _served(history: _History, rid: str, done_s: float, ttft_s: float = 0.5) -> None:
    task = f"task-{rid}"
    history.sent(rid, "acme", task, 1, 1, deadline_s=None)
    history.started(rid, "acme", task, 0.2)
    history._event(events.FirstToken, rid, "acme", task, ttft_s, worker_id="w1", ttft_s=ttft_s)
    history.completed(rid, "acme", task, done_s)


def _slo(source) -> tuple[int, int]:
    rows = run_report(source, "slo", bucket="day").dicts()
    return sum(r["finished"] for r in rows), sum(r["slo_met"] for r in rows)


def test_a_request_without_a_deadline_is_late_after_the_default_deadline(store):
    history = _History()
    _served(history, "quick", 30.0)
    _served(history, "slow", 70.0)  # past created + 60 s
    source = history.write(store)
    assert _successful_tasks(source) == 1
    assert _slo(source) == (2, 1)
    failures = run_report(source, "task-failures").dicts()
    assert [(f["outcome"], f["tasks"]) for f in failures] == [("late", 1)]


def test_the_slo_settings_in_force_judge_requests_that_state_none(store):
    history = _History()
    _served(history, "quick", 2.0, ttft_s=0.5)
    _served(history, "slow", 30.0, ttft_s=0.5)  # past the 20 s set below
    _served(history, "slow-start", 3.0, ttft_s=1.5)  # in time, its first token past 1 s
    history.out += [("config", ConfigSet(event_time_ms=ms(0), key="slo.deadline_s", value=20.0,
                                         set_by="ops")),
                    ("config", ConfigSet(event_time_ms=ms(1), key="slo",
                                         value={"ttft_slo_s": 1.0, "deadline_s": 20.0},
                                         set_by="ops"))]
    source = history.write(store)
    assert _successful_tasks(source) == 2
    assert _slo(source) == (3, 1)
