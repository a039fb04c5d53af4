"""A request that runs past midnight is charged to each day for its time in that day.

One H100 (``w-h``, pool h100@m, 3.00 $/h by default) heart-beats every 0.5 s from 4 s before
midnight (``M``, yesterday's start) to 4 s after, and stops: 4 GPU-seconds on the first day (its
last half second is the gap from its last heartbeat to midnight's) and 4 on the second. ``r-late``
runs from M-2 s to M+2 s: 2 s in each day, for tenant ``acme``. ``r-day`` runs from M+2.5 s to
M+3.5 s, for ``beta``. Both complete their one-step tasks. The first day's cost is all
``r-late``'s; the second's is shared 2 : 1. A request and its task count on the day it started.
"""

import datetime as dt

import pytest

from analytics.query import StoreSource
from analytics.reports import run_report
from schemas import events
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _write

_midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
MIDNIGHT = _midnight - dt.timedelta(days=1)
M = int(MIDNIGHT.timestamp() * 1000)
DAY1, DAY2 = (MIDNIGHT - dt.timedelta(days=1)).date().isoformat(), MIDNIGHT.date().isoformat()
H100 = "h100@m"


def ms(seconds: float) -> int:
    return M + int(round(seconds * 1000))


REQUESTS = (("r-late", "acme", -2, 2), ("r-day", "beta", 2.5, 3.5))


def _history(requests=REQUESTS) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [("telemetry", events.WorkerStatus(
        event_time_ms=ms(-4 + i * 0.5), worker_id="w-h", slot=0, pool=H100, gpu_type="h100",
        state="stopped" if i == 16 else "warm", started_ms=ms(-10))) for i in range(17)]
    for rid, tenant, start, end in requests:
        common = {"request_id": rid, "tenant": tenant, "model": "m", "created_ms": ms(start)}
        out.append(("requests", InferenceRequest(
            event_time_ms=ms(start), task_id=f"t-{rid}", step=1, steps_total=1,
            prompt_tokens=100, max_tokens=10, **common)))
        out += [("telemetry", m) for m in (
            events.Queued(event_time_ms=ms(start), prompt_tokens=100, max_tokens=10, **common),
            events.Started(event_time_ms=ms(start), worker_id="w-h", **common),
            events.Completed(event_time_ms=ms(end), worker_id="w-h", prompt_tokens=100,
                             output_tokens=10, e2e_s=end - start, **common))]
    return out


def test_a_request_past_midnight_is_charged_to_each_day_for_its_time_in_it(store):
    _write(store, 1, _history())
    got = run_report(StoreSource(store), "cost").dicts()
    per_s = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
    assert [(r["day"], r["tenant"], r["requests"], r["successful_tasks"], r["pool_share"])
            for r in got] == [(DAY1, "acme", 1, 1, 1.0), (DAY2, "acme", 0, 0, round(2 / 3, 4)),
                              (DAY2, "beta", 1, 1, round(1 / 3, 4))]
    assert [r["cost_usd"] for r in got] == [pytest.approx(c * per_s, abs=1e-6)
                                            for c in (4, 4 * 2 / 3, 4 / 3)]


def test_a_request_that_ends_at_midnight_is_charged_to_its_day_only(store):
    """Its end is where it stops taking GPU time: the next day owes it nothing, and that day's
    GPU time, which no request used, shows as unattributed (it was lost: a share of 0 / 0)."""
    _write(store, 1, _history(requests=(("r-late", "acme", -2, 0),)))
    got = run_report(StoreSource(store), "cost").dicts()
    per_s = DEFAULT_GPU_PRICES_USD_PER_HOUR["h100"] / 3600
    assert [(r["day"], r["tenant"], r["requests"], r["pool_share"]) for r in got] == [
        (DAY1, "acme", 1, 1.0), (DAY2, "(unattributed)", 0, 1.0)]
    assert [r["cost_usd"] for r in got] == [pytest.approx(c * per_s, abs=1e-6) for c in (4, 4)]
