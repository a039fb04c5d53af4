"""A request running across the start of the cost report's window is charged for its time in
it, though it counts nowhere (it was sent before the window): before 6 Dec it was left out, and
the pool's other requests that day took its time.

One H100 (``w1``, 3.00 $/h by default) heart-beats every second from 25 h ago to 23 h ago:
about an hour of it in the window of ``--days 1``. ``A`` (tenant beta) was sent 24.5 h ago and
runs for an hour, half an hour of it in the window; ``B`` (acme) runs 20 s, 23.5 h ago, and
completes in time. The window's hour is shared 20 : 1,800 (idle time by busy time): before,
acme paid for all of it. Where midnight falls in that hour (the test run between 23:00 and
midnight UTC) each day's part is shared apart, by the requests' time that day, and the part
of a day none ran on is unattributed (``expected``).
"""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

DAY_S = 86_400
UNATTRIBUTED = "(unattributed)"
#: tenant -> (start, end) of its request, in seconds from the window's start
RAN = {"beta": (-1800, 1800), "acme": (1800, 1820)}
HEARD_UNTIL_S = 3600  # the worker's last heartbeat (stopped), from the window's start


def _history(now: int) -> list[tuple[str, object]]:
    def at(seconds: float) -> int:
        return now + int(seconds * 1000) - DAY_S * 1000

    out: list[tuple[str, object]] = [("telemetry", events.WorkerStatus(
        event_time_ms=at(-3600 + i), worker_id="w1", slot=0, pool="h100@m", gpu_type="h100",
        state="stopped" if i == 7200 else "warm", started_ms=at(-3601))) for i in range(7201)]
    for rid, (tenant, (start, end)) in zip("AB", RAN.items()):
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


def expected(window_start_ms: int) -> dict[str, float]:
    """Each tenant's GPU-hours: each day's part of the pool's time in the window, shared by the
    requests' time in it that day; unattributed where none ran that day."""
    hours: dict[str, float] = {}
    end_ms = window_start_ms + HEARD_UNTIL_S * 1000
    first_day = window_start_ms // (DAY_S * 1000)
    for day in range(first_day, (end_ms - 1) // (DAY_S * 1000) + 1):
        lo, hi = max(window_start_ms, day * DAY_S * 1000), min(end_ms, (day + 1) * DAY_S * 1000)
        busy = {tenant: max(0, min(hi, window_start_ms + e * 1000)
                            - max(lo, window_start_ms + s * 1000))
                for tenant, (s, e) in RAN.items()}
        shares = {t: b / sum(busy.values()) for t, b in busy.items() if b > 0} or \
            {UNATTRIBUTED: 1.0}
        for tenant, share in shares.items():
            hours[tenant] = hours.get(tenant, 0.0) + (hi - lo) / 3_600_000 * share
    return hours


def test_a_request_across_the_windows_start_pays_for_its_time_in_it(store):
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    _write(store, 1, _history(now))
    rows = run_report(StoreSource(store), "cost", days=1, now_ms=now).dicts()  # (ends at now)

    def total(tenant: str, column: str) -> float:
        return sum(r[column] for r in rows if r["tenant"] == tenant)

    want = expected(now - DAY_S * 1000)
    assert {r["tenant"] for r in rows} == set(want)  # (unattributed: a day none ran on only)
    assert (total("acme", "requests"), total("acme", "successful_tasks")) == (1, 1)
    assert (total("beta", "requests"), total("beta", "successful_tasks")) == (0, 0)
    # the window's hour, each row's share of it rounded to 4 places
    assert sum(total(t, "gpu_hours") for t in want) == pytest.approx(1, abs=2e-4)
    for tenant in want:
        assert total(tenant, "gpu_hours") == pytest.approx(want[tenant], abs=2e-4)
