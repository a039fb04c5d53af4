"""A request running across the start of the cost report's window is charged for its time in
it, though it counts nowhere (it was sent before the window): before 6 Dec it was left out, and
the pool's other requests that day took its time.

One H100 (``w1``, 3.00 $/h by default) heart-beats every second from 25 h ago to 23 h ago:
about an hour of it in the window of ``--days 1``. ``A`` (tenant beta) was sent 24.5 h ago and
runs for an hour, half an hour of it in the window; ``B`` (acme) runs 20 s, 23.5 h ago, and
completes in time. The window's hour is shared 20 : 1,800 (idle time by busy time): before,
acme paid for all of it.
"""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

DAY_S = 86_400


def _history() -> list[tuple[str, object]]:
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)

    def at(seconds: float) -> int:
        return now + int(seconds * 1000) - DAY_S * 1000

    out: list[tuple[str, object]] = [("telemetry", events.WorkerStatus(
        event_time_ms=at(-3600 + i), worker_id="w1", slot=0, pool="h100@m", gpu_type="h100",
        state="stopped" if i == 7200 else "warm", started_ms=at(-3601))) for i in range(7201)]
    for rid, tenant, start, end in (("A", "beta", -1800, 1800), ("B", "acme", 1800, 1820)):
        common = {"request_id": rid, "tenant": tenant, "model": "m", "created_ms": at(start)}
        out += [("requests", InferenceRequest(event_time_ms=at(start), prompt_tokens=100,
                                              max_tokens=10, **common)),
                *(("telemetry", m) for m in (
                    events.Queued(event_time_ms=at(start), prompt_tokens=100, max_tokens=10,
                                  **common),
                    events.Started(event_time_ms=at(start), worker_id="w1", **common),
                    events.Completed(event_time_ms=at(end), worker_id="w1", prompt_tokens=100,
                                     output_tokens=10, e2e_s=end - start, **common)))]
    return out


def test_a_request_across_the_windows_start_pays_for_its_time_in_it(store):
    _write(store, 1, _history())
    rows = run_report(StoreSource(store), "cost", days=1).dicts()

    def total(tenant: str, column: str) -> float:
        return sum(r[column] for r in rows if r["tenant"] == tenant)

    assert {r["tenant"] for r in rows} == {"acme", "beta"}  # (none unattributed)
    assert (total("acme", "requests"), total("acme", "successful_tasks")) == (1, 1)
    assert (total("beta", "requests"), total("beta", "successful_tasks")) == (0, 0)
    # the window's hour, less the seconds the test took before the report ran
    assert total("acme", "gpu_hours") + total("beta", "gpu_hours") == pytest.approx(1, abs=0.01)
    assert total("acme", "gpu_hours") == pytest.approx(20 / 1820, abs=2e-4)
    assert total("beta", "gpu_hours") == pytest.approx(1800 / 1820, abs=0.01)
    assert total("acme", "cost_usd") == pytest.approx(3 * 20 / 1820, abs=1e-3)
