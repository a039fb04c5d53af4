"""The cost report charges the part of each heartbeat interval that lies in its window, so two
adjacent windows cost, together, what the window covering both costs. Before 7 Dec a window
charged only the heartbeats stamped in it: the stretch from its start to a worker's first
heartbeat in it, and from a worker's last heartbeat before its end to the end, cost nothing (up
to 3 s a worker at each end), and ``--until`` windows added up to less than the whole.

The windows: ``[A, B)`` and ``[B, C)``, a day each, and ``[A, C)``, two days, with ``C`` a
second past midnight two days ago, at fixed times of fixed days. Workers heart-beat across each
of ``A``, ``B`` (and its midnight, a second before it) and ``C``, every 0.7 s; one is paused
across ``B`` for 8 s (its silence costs the 3 s cap, part of it in each window), one crashes
(its last heartbeat costs nothing, whichever window it ends) and one stops just before ``B``.
What each window should cost comes from the rule itself, clipped to the window (``charged_s``).
"""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.store import Store, StoreLocation
from schemas import events
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from tests.unit.analytics.test_last_attempt import _write

DAY_MS = 86_400_000
CAP_MS = 3000  # the heartbeat timeout: a silence costs at most this
_midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
C = int((_midnight - dt.timedelta(days=2)).timestamp() * 1000) + 1000
B, A = C - DAY_MS, C - 2 * DAY_MS
PRICE_PER_S = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
NAMESPACE = "t_adjacent"


def _beat(worker_id: str, t: int, state: str = "warm") -> events.WorkerStatus:
    return events.WorkerStatus(event_time_ms=t, worker_id=worker_id, slot=0, pool="h100@m",
                               gpu_type="h100", state=state, started_ms=A - 60_000)


def _every(worker_id: str, first: int, last: int) -> list[events.WorkerStatus]:
    """A heartbeat every 0.7 s from ``first`` to ``last`` (ms)."""
    return [_beat(worker_id, t) for t in range(first, last + 1, 700)]


def _heartbeats() -> list[events.WorkerStatus]:
    return [*_every("w-a", A - 5000, A + 5000), *_every("w-c", C - 5000, C + 5000),
            *_every("w-b", B - 5000, B + 5000),
            *_every("w-paused", B - 5000, B - 1200), *_every("w-paused", B + 6800, B + 9000),
            *_every("w-crashed", B - 5000, B - 400),
            *_every("w-stopped", B - 5000, B - 1000), _beat("w-stopped", B - 300, "stopped")]


def charged_s(beats: list[events.WorkerStatus], start: int, end: int) -> float:
    """GPU-seconds of ``[start, end)``: each heartbeat but a ``stopped`` one provisions its
    worker up to the next heartbeat, at most ``CAP_MS``, and the last one nothing; the part of
    that in the window counts."""
    charged_ms = 0
    for worker in {b.worker_id for b in beats}:
        times = sorted((b.event_time_ms, b.state) for b in beats if b.worker_id == worker)
        for (t, state), (t_next, _) in zip(times, times[1:]):
            if state != "stopped":
                charged_ms += max(0, min(t + min(t_next - t, CAP_MS), end) - max(t, start))
    return charged_ms / 1000


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("analytics")
    store = Store.open(StoreLocation.for_namespace(NAMESPACE, folder))
    _write(store, 1, [("telemetry", beat) for beat in _heartbeats()])
    yield StoreSource(store)
    store.close()


def _cost_by_day(source: StoreSource, days: int, until: int) -> dict[str, float]:
    costs: dict[str, float] = {}
    for row in run_report(source, "cost", days=days, until_ms=until).dicts():
        costs[str(row["day"])] = costs.get(str(row["day"]), 0.0) + row["cost_usd"]
    return costs


@pytest.mark.parametrize(("start", "end"), [(A, B), (B, C), (A, C)])
def test_a_window_costs_the_part_of_each_heartbeat_interval_inside_it(source, start, end):
    costs = _cost_by_day(source, (end - start) // DAY_MS, end)
    want = charged_s(_heartbeats(), start, end) * PRICE_PER_S
    assert sum(costs.values()) == pytest.approx(want, abs=1e-6 * len(costs))


def test_two_adjacent_windows_cost_what_the_window_of_both_costs(source):
    """Day by day: ``B``'s day is in both of the shorter windows, each with its part."""
    first, second = _cost_by_day(source, 1, B), _cost_by_day(source, 1, C)
    both = _cost_by_day(source, 2, C)
    assert set(both) == set(first) | set(second)
    for day, cost in both.items():
        assert first.get(day, 0.0) + second.get(day, 0.0) == pytest.approx(cost, abs=3e-6)


def test_a_window_without_an_end_charges_from_its_start(source):
    """Without ``--until`` the window has no end (a worker's last heartbeat costs nothing, as
    ever), and its start is clipped as ``--until``'s is."""
    rows = run_report(source, "cost", days=1, now_ms=B).dicts()  # [A, no end)
    want = charged_s(_heartbeats(), A, C + DAY_MS) * PRICE_PER_S
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(want, abs=1e-6 * len(rows))
