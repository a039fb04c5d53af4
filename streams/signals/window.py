"""The per-scope bucket aggregator: observations in, signal values out. Pure.

quix-streams style: ``initialize()`` gives an empty bucket, ``agg(bucket, obs, timestamp_ms)``
adds one observation, ``merge(into, other)`` combines buckets, ``result(bucket, window_s)`` turns
a bucket (one second, a merged window, or the running total) into the values of a
``SignalSnapshot``. A bucket is plain JSON (counters, DDSketch bins, latest gauges per worker) so
it can live in a Faust table and come back from its changelog unchanged.

Observations are compact dicts that the request, worker and task aggregators emit; ``k`` says what
happened (see ``KINDS``) and ``t`` when (event time, ms).
"""

import math
from collections.abc import Mapping
from typing import Any

from streams.signals import sketch

Obs = Mapping[str, Any]
Bucket = dict[str, Any]

#: Observation kinds: q queued, s started, f first token, c completed, x failed, r rejected,
#: xr a failure taken back (its attempt had been replaced: the request went on),
#: n cancelled, p preempted, rq requeued, rqe requeued after its request's end (not a requeue:
#: ``streams.signals.requests``), h heartbeat, ch attributed attempt cost, tc task closed,
#: tl cost that reached a task after it closed, tr a task closed as failed or timed out that
#: succeeded after all (its missed steps retried: one of those outcomes less, one success more),
#: lost what a worker's book gave up.
KINDS = ("q", "s", "f", "c", "x", "xr", "r", "n", "p", "rq", "rqe", "h", "ch", "tc", "tl", "tr",
         "lost")
LIFECYCLE = frozenset({"q", "s", "f", "c", "x", "r", "n", "p", "rq", "rqe"})
_COUNT = {"q": "queued", "s": "started", "f": "first_tokens", "c": "completed", "x": "failed",
          "r": "rejected", "n": "cancelled", "p": "preemptions", "rq": "requeued",
          "rqe": "requeued_after_end"}
_TASK_OUTCOMES = {"succeeded": "tasks_succeeded", "failed": "tasks_failed",
                  "timed_out": "tasks_timed_out"}
_QUANTILES = {"ttft": (0.50, 0.95, 0.99), "itl": (0.50, 0.99), "e2e": (0.50, 0.99)}


def initialize() -> Bucket:
    """c: counters, q: sketches, g: latest gauges per worker, last: newest lifecycle event."""
    return {"c": {}, "q": {}, "g": {}, "last": 0}


def _inc(bucket: Bucket, name: str, amount: float = 1.0) -> None:
    counters = bucket["c"]
    counters[name] = counters.get(name, 0.0) + amount


def _sample(bucket: Bucket, name: str, value: float) -> None:
    sketches = bucket["q"]
    bins = sketches.get(name)
    if bins is None:
        bins = sketches[name] = sketch.initialize()
    sketch.add(bins, value)


def agg(bucket: Bucket, obs: Obs, timestamp_ms: int) -> Bucket:
    """Add one observation (deduplication happens before, in ``streams.signals.book``).

    The hottest function of the streams worker (once per observation and scope key): counters
    are incremented in place rather than through ``_inc``."""
    kind = obs["k"]
    c = bucket["c"]
    count = _COUNT.get(kind)
    if count is not None:
        c[count] = c.get(count, 0.0) + 1.0
        c["events"] = c.get("events", 0.0) + 1.0
        if timestamp_ms > bucket["last"]:
            bucket["last"] = timestamp_ms
    if kind == "s":
        if obs.get("a", 1) > 1:
            c["retries"] = c.get("retries", 0.0) + 1.0
    elif kind == "f":
        _sample(bucket, "ttft", obs["v"])
    elif kind == "c":
        c["tokens_in"] = c.get("tokens_in", 0.0) + obs["in"]
        c["tokens_out"] = c.get("tokens_out", 0.0) + obs["out"]
        c["succeeded"] = c.get("succeeded", 0.0) + obs["ok"]
        c["slo_met"] = c.get("slo_met", 0.0) + obs["slo"]
        _sample(bucket, "e2e", obs["e2e"])
        if obs.get("itl") is not None:
            _sample(bucket, "itl", obs["itl"])
    elif kind == "r" and obs.get("shed"):
        _inc(bucket, "sheds")
    elif kind == "h":
        _heartbeat(bucket, obs, timestamp_ms)
    elif kind == "ch":
        _inc(bucket, "attributed_usd", obs["usd"])
    elif kind == "tc":
        _inc(bucket, "tasks_closed")
        _inc(bucket, _TASK_OUTCOMES[obs["o"]])
        _inc(bucket, "task_cost_usd", obs["usd"])
    elif kind == "tl":
        _inc(bucket, "task_cost_usd", obs["usd"])
    elif kind == "xr":
        _inc(bucket, "failed", -1.0)
    elif kind == "tr":
        _inc(bucket, _TASK_OUTCOMES[obs["was"]], -1.0)
        _inc(bucket, "tasks_succeeded")
    elif kind == "lost":
        _inc(bucket, "pool_observations_dropped", obs["held"])
        _inc(bucket, "attempts_uncharged", obs["ends"])
    return bucket


def _heartbeat(bucket: Bucket, obs: Obs, timestamp_ms: int) -> None:
    _inc(bucket, "provisioned_s", obs["dt"])
    _inc(bucket, "busy_s", obs["dt"] if obs["busy"] else 0.0)
    if "g" in obs:  # a worker of several GPUs: each GPU's time is GPU time
        _inc(bucket, "more_gpu_s", obs["dt"] * (obs["g"] - 1))
    _inc(bucket, "spend_usd", obs["usd"])
    _inc(bucket, "prefix_queries", obs["pq"])
    _inc(bucket, "prefix_hits", obs["ph"])
    gauges = bucket["g"]
    known = gauges.get(obs["w"])
    if known is None or known[0] <= timestamp_ms:
        gauges[obs["w"]] = [timestamp_ms, obs["run"], obs["wait"], obs["kvu"], obs["kvf"]]


def merge(into: Bucket, other: Bucket) -> Bucket:
    counters, sketches = into["c"], into["q"]
    for name, value in other["c"].items():
        counters[name] = counters.get(name, 0.0) + value
    for name, bins in other["q"].items():
        mine = sketches.get(name)
        if mine is None:
            mine = sketches[name] = sketch.initialize()
        sketch.merge(mine, bins)
    for worker, gauge in other["g"].items():
        known = into["g"].get(worker)
        if known is None or known[0] <= gauge[0]:
            into["g"][worker] = list(gauge)
    into["last"] = max(into["last"], other["last"])
    return into


#: Values that add up across scope keys (counts and sums): what may be summed where keys are
#: folded together (``streams.metrics``). Rates (over spans that differ by key), ratios,
#: quantiles and gauges (a worker serving two models is in both) do not.
ADDITIVE = frozenset({
    "queued", "started", "first_tokens", "completed", "succeeded", "slo_met", "failed",
    "rejected", "sheds", "cancelled", "retries", "requeued", "preemptions", "tokens_in",
    "tokens_out", "events", "provisioned_s", "gpu_hours", "spend_usd", "attributed_usd",
    "tasks_closed", "tasks_succeeded", "tasks_failed", "tasks_timed_out", "task_cost_usd",
    "late_events", "pool_observations_dropped", "attempts_uncharged", "requeued_after_end"})


def _ratio(num: float, den: float) -> float | None:
    """``num / den``; undefined where ``den`` is 0 or the quotient is past the largest float
    (a spend of 1e-310 USD: a snapshot carries finite values only, and before 7 Dec an
    ``inf`` failed every publication)."""
    if den <= 0:
        return None
    quotient = num / den
    return quotient if math.isfinite(quotient) else None


def result(bucket: Bucket, window_s: float) -> dict[str, float]:
    """The signal values of a bucket covering ``window_s`` seconds; undefined ones are left out."""
    c = bucket["c"]
    get = lambda name: c.get(name, 0.0)  # noqa: E731
    values: dict[str, float | None] = {}
    for name, qs in _QUANTILES.items():
        bins = bucket["q"].get(name)
        if bins:
            for q, value in zip(qs, sketch.quantiles(bins, qs), strict=True):
                values[f"{name}_p{round(q * 100)}_s"] = value
    terminal = get("completed") + get("failed") + get("rejected")
    for name in ("queued", "started", "first_tokens", "completed", "succeeded", "slo_met",
                 "failed", "rejected", "sheds", "cancelled", "retries", "requeued", "preemptions",
                 "tokens_in", "tokens_out", "events"):
        values[name] = get(name)
    values.update(
        requests_per_s=get("completed") / window_s,
        arrivals_per_s=get("queued") / window_s,
        tokens_in_per_s=get("tokens_in") / window_s,
        tokens_out_per_s=get("tokens_out") / window_s,
        goodput_per_s=get("slo_met") / window_s,
        success_rate=_ratio(get("succeeded"), terminal),
        slo_attainment=_ratio(get("slo_met"), terminal),
    )
    if bucket["last"]:
        values["last_event_ms"] = bucket["last"]
    if bucket["g"]:
        gauges = bucket["g"].values()
        values["workers"] = len(bucket["g"])
        values["running"] = sum(g[1] for g in gauges)
        values["queue_depth"] = sum(g[2] for g in gauges)
        values["kv_utilisation"] = _ratio(sum(g[3] for g in gauges),
                                          sum(g[3] + g[4] for g in gauges))
    if "provisioned_s" in c:
        values.update(
            provisioned_s=get("provisioned_s"),
            gpu_hours=(get("provisioned_s") + get("more_gpu_s")) / 3600,
            utilisation_ratio=_ratio(get("busy_s"), get("provisioned_s")),
            spend_usd=get("spend_usd"),
            prefix_cache_hit_rate=_ratio(get("prefix_hits"), get("prefix_queries")),
            spend_per_successful_task_usd=_ratio(get("spend_usd"), get("tasks_succeeded")),
        )
    if "attributed_usd" in c:
        values["attributed_usd"] = get("attributed_usd")
    spend = get("spend_usd") or get("attributed_usd")
    values["success_per_dollar"] = _ratio(get("succeeded"), spend)
    if "task_cost_usd" in c or "tasks_closed" in c:
        for name in ("tasks_closed", "tasks_succeeded", "tasks_failed", "tasks_timed_out",
                     "task_cost_usd"):
            values[name] = get(name)
        values["cost_per_successful_task_usd"] = _ratio(get("task_cost_usd"),
                                                        get("tasks_succeeded"))
    for name in ("late_events", "pool_observations_dropped", "attempts_uncharged",
                 "requeued_after_end"):
        if name in c:
            values[name] = get(name)
    return {name: float(value) for name, value in values.items() if value is not None}
