"""Sliding event-time windows per scope key, kept in a mapping (a Faust table or a dict). Pure.

Each scope key (``tenant:acme``, ``pool:h100@llama-3-8b``, ``fleet:all``...) owns one-second
buckets keyed ``<scope key>|<epoch second>`` and a running total keyed ``<scope key>|total``.
A window of ``W`` seconds ending at ``end_ms`` merges the buckets of the ``W`` seconds before it;
windows are closed in this code, from event time, never from the wall clock.

Event time and lateness: the watermark of a partition is the newest event time seen on it (the
stages refuse events stamped further ahead of the streams' clock than ``max_event_ahead_s``, so
one bad clock cannot move it far). An
observation older than ``watermark - allowed_lateness`` is late: it still counts in the running
total, but not in any window (and ``late_events`` says how many), and moves the total's start
(``first``, which its rates are over) back to that horizon at most: one event stamped far in the
past (an unset clock: 0) spread them over decades. One within the allowed lateness
goes into its own second's bucket, so every window published afterwards that covers that second
includes it (a window published before it arrived is not published again). Buckets are kept for
the longest window plus the allowed lateness, then deleted.

Idle keys: tenants and models are named by clients, so scope keys come and go. A key with no
observation for ``idle_retention_s`` (an hour by default; at least the buckets' retention) is
idle: it is not published, and ``forget`` deletes its running total and buckets. Seen again
after such a gap, it starts a new running total, whether or not it was forgotten meanwhile.
Before 5 Dec every key ever seen was kept and published at every tick: 2,000 one-off tenants
made 6,006 snapshots a tick, and the Prometheus bound kept the earliest tenants' series while
the active one was folded into ``~other``.

Duplicates: every observation carries the identity of the record it came from (source partition,
offset, index within that record). Observations from one source partition reach a bucket in that
order, so each bucket keeps the highest identity it has applied per source and drops anything at
or below it: a record replayed after a crash, or re-sent by an upstream stage, counts once. The
identities are kept inside the bucket itself, so the count and the dedupe state are written to the
changelog as one record and can never disagree after a restart. A running total forgets the
identity of a source it has applied nothing from for ``idle_retention_s`` (``forget_sources``):
a pool's meets one with every worker id that serves it.
"""

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from schemas.limits import MAX_EPOCH_MS
from streams.signals import window

TOTAL = "total"


@dataclass(frozen=True)
class WindowPolicy:
    """``windows_s``: the sliding windows published every tick; ``allowed_lateness_s``: how far
    behind the watermark an observation may be and still enter its window (30 s by default: longer
    than a Faust worker takes to hand its partitions to another one, so a takeover's replay is not
    late)."""

    windows_s: tuple[int, ...] = (10, 60)
    allowed_lateness_s: float = 30.0
    idle_retention_s: float = 3600.0

    @property
    def retention_ms(self) -> int:
        return int((max(self.windows_s) + self.allowed_lateness_s) * 1000) + 1000

    @property
    def idle_retention_ms(self) -> int:
        """How long a scope key is kept without an observation (never less than its buckets)."""
        return max(int(self.idle_retention_s * 1000), self.retention_ms)


def window_end_ms(watermark_ms: int) -> int:
    """The end of the second that holds the watermark: windows include the current second."""
    return (watermark_ms // 1000 + 1) * 1000


def last_observed_ms(total: Mapping) -> int:
    """The newest event time a running total has counted (an entry written before 5 Dec has
    none: the newest second it kept a bucket for, else its first)."""
    last = total.get("last")
    if last is None:
        last = (max(total["secs"]) * 1000 + 999) if total["secs"] else total["first"]
    return last


class WindowBook:
    def __init__(self, table: MutableMapping[str, Any], policy: WindowPolicy = WindowPolicy()):
        self.table = table
        self.policy = policy

    def observe(self, scope_key: str, source: str, offset: int, index: int, obs: Mapping,
                watermark_ms: int) -> bool:
        """Apply one observation; False when both its bucket and the total had it already."""
        return self.observe_many(scope_key, [(source, offset, index, obs)], watermark_ms) > 0

    def observe_many(self, scope_key: str, items, watermark_ms: int,
                     arrivals: list[int] | None = None) -> int:
        """Apply ``(source, offset, index, obs)`` items in order; return how many were new.

        ``arrivals``: the partition's watermark as each item arrived (its own time included),
        which its lateness is judged against; default ``watermark_ms`` for every item. A batch
        applies several records' items at once, so an item judged against the batch's newest
        time would be late where the same item read alone was not (before 7 Dec two heartbeats
        of one worker 31 s apart, read in one batch, made the first late: out of the windows,
        and the rates' span shortened).

        An observation ``idle_retention_s`` after the key's newest one starts a new running
        total (``forget``, then it): a gap within one call, between two calls, or across
        another key's observations that moved the partition's event time on alike, so the
        totals do not depend on how the records were batched (before 7 Dec a total kept or
        lost what came before such a gap by the order its partition's keys were applied in).
        The new total keeps the identities the old one had applied (``_restart``)."""
        if arrivals is None:
            arrivals = [watermark_ms] * len(items)
        applied, start, seen = 0, 0, None
        total = self.table.get(f"{scope_key}|{TOTAL}")
        newest = last_observed_ms(total) if total else None
        for i, item in enumerate(items):
            t = item[3]["t"]
            if newest is not None and t > newest + self.policy.idle_retention_ms:
                applied += self._observe_run(scope_key, items[start:i], arrivals[start:i], seen)
                start = i
                seen = self._restart(scope_key)
            newest = t if newest is None else max(newest, t)
        return applied + self._observe_run(scope_key, items[start:], arrivals[start:], seen)

    def _restart(self, scope_key: str) -> dict:
        """Forget the key's running total and buckets for a new total after an idle gap; return
        the identities the old total had applied, for the new one to keep: a crash's replay of
        observations from before the gap is dropped as seen. Before 7 Dec the new total started
        with none, and counted them again (late, or on time behind a watermark the crash left
        behind its keys)."""
        total = self.table.get(f"{scope_key}|{TOTAL}")
        self.forget(scope_key)
        return dict(total["hw"]) if total else {}

    def _observe_run(self, scope_key: str, items, arrivals: list[int],
                     seen: dict | None = None) -> int:
        """``observe_many`` for items with no idle gap before or among them. ``seen``: the
        identities a new total starts with (``_restart``).

        The total and each bucket are separate table entries (so separate changelog records), so
        each keeps and checks its own identities: a crash between their writes loses nothing on
        replay. Observations new to both are aggregated once and merged into both."""
        if not items:
            return 0
        table, agg = self.table, window.agg
        lateness = int(self.policy.allowed_lateness_s * 1000)
        total_key = f"{scope_key}|{TOTAL}"
        t0 = items[0][3]["t"]
        total = table.get(total_key) or {"b": window.initialize(), "hw": dict(seen or {}),
                                          "first": max(t0, arrivals[0] - lateness), "last": t0,
                                          "secs": []}
        total_hw, first, last = total["hw"], total["first"], last_observed_ms(total)
        secs = set(total["secs"])
        buckets: dict[int, dict] = {}
        both: dict[int, dict] = {}
        only_bucket: dict[int, dict] = {}
        only_total = window.initialize()
        applied = late = 0
        for (source, offset, index, obs), arrival in zip(items, arrivals):
            t, horizon = obs["t"], arrival - lateness
            seen = total_hw.get(source)
            to_total = seen is None or offset > seen[0] or (offset == seen[0] and index > seen[1])
            if to_total:
                total_hw[source] = [offset, index, arrival]
                first = min(first, max(t, horizon))  # a late one: no further back than that
                last = max(last, t)
            to_bucket = False
            if t >= horizon:
                second = t // 1000
                bucket = buckets.get(second)
                if bucket is None:
                    bucket = buckets[second] = table.get(f"{scope_key}|{second}") or {
                        "b": window.initialize(), "hw": {}}
                bucket_hw = bucket["hw"]
                seen = bucket_hw.get(source)
                to_bucket = seen is None or offset > seen[0] or (
                    offset == seen[0] and index > seen[1])
                if to_bucket:
                    bucket_hw[source] = [offset, index]
                    secs.add(second)
                    partials = both if to_total else only_bucket
                    partial = partials.get(second)
                    if partial is None:
                        partial = partials[second] = window.initialize()
                    agg(partial, obs, t)
                    applied += 1
                    continue
            elif to_total:
                late += 1
            if to_total:
                agg(only_total, obs, t)
                applied += 1
        total["first"], total["last"] = first, last
        for second in both.keys() | only_bucket.keys():
            bucket = buckets[second]
            for partial in (both.get(second), only_bucket.get(second)):
                if partial is not None:
                    window.merge(bucket["b"], partial)
            table[f"{scope_key}|{second}"] = bucket
        for partial in (*both.values(), only_total):
            window.merge(total["b"], partial)
        if late:
            total["b"]["c"]["late_events"] = total["b"]["c"].get("late_events", 0.0) + late
        if applied:
            total["secs"] = sorted(secs)
            table[total_key] = total
        return applied

    def expire(self, scope_key: str, watermark_ms: int) -> list[str]:
        """Delete the buckets no window can cover any more; return their keys. The running
        total forgets, with them, the gauges of the workers it has not heard from since: no
        snapshot shows them (``snapshots`` shows those of the longest window). Before 7 Dec it
        kept every worker's ever heard, and ``fleet:all``'s total, one changelog record, grew
        by about 50 bytes a worker id (pods named anew at each restart) for good."""
        total = self.table.get(f"{scope_key}|{TOTAL}")
        if total is None:
            return []
        horizon = (watermark_ms - self.policy.retention_ms) // 1000
        old = [s for s in total["secs"] if s < horizon]
        if not old:
            return []
        total["secs"] = [s for s in total["secs"] if s >= horizon]
        gauges = total["b"]["g"]
        for worker in [w for w, gauge in gauges.items() if gauge[0] < horizon * 1000]:
            del gauges[worker]
        self.table[f"{scope_key}|{TOTAL}"] = total
        keys = [f"{scope_key}|{s}" for s in old]
        for key in keys:
            self.table.pop(key, None)
        return keys

    def idle(self, scope_key: str, watermark_ms: int) -> bool:
        """True when the key has had no observation for ``idle_retention_s`` before
        ``watermark_ms`` (or has no running total)."""
        total = self.table.get(f"{scope_key}|{TOTAL}")
        return total is None or \
            last_observed_ms(total) < watermark_ms - self.policy.idle_retention_ms

    def forget_sources(self, scope_key: str, horizon_ms: int) -> list[str]:
        """Forget the identities the key's running total keeps of sources it has applied
        nothing from for ``idle_retention_s`` before ``horizon_ms`` (the allowed lateness
        before the watermark, as ``idle`` is judged for a key); return those sources.

        A source is a partition, or one worker's relays from it (``r2:worker-1``), so a pool's
        total met a new source with every worker id it ever served: before 7 Dec it kept them
        all, and one record of its running total, which a changelog record must hold, grew by
        about 50 bytes a worker id for as long as the pool served (pods named anew at each
        restart). A replay reads a source again at most the allowed lateness (and a commit
        interval) behind, well within that. An identity kept before 7 Dec has no time of its
        own: it is given ``horizon_ms``, at the first look."""
        total = self.table.get(f"{scope_key}|{TOTAL}")
        if total is None:
            return []
        hw, cut = total["hw"], horizon_ms - self.policy.idle_retention_ms
        stale = [source for source, seen in hw.items() if len(seen) > 2 and seen[2] < cut]
        unstamped = [seen for seen in hw.values() if len(seen) == 2]
        if not stale and not unstamped:
            return []
        for source in stale:
            del hw[source]
        for seen in unstamped:
            seen.append(horizon_ms)
        self.table[f"{scope_key}|{TOTAL}"] = total
        return stale

    def forget(self, scope_key: str) -> list[str]:
        """Delete the key's running total and buckets; return their keys."""
        total = self.table.pop(f"{scope_key}|{TOTAL}", None)
        if total is None:
            return []
        keys = [f"{scope_key}|{s}" for s in total["secs"]]
        for key in keys:
            self.table.pop(key, None)
        return [f"{scope_key}|{TOTAL}", *keys]

    def snapshots(self, scope_key: str, watermark_ms: int) -> list[tuple[float, int, dict]]:
        """``(window_s, window_end_ms, values)`` for each sliding window and the running total
        (``window_end_ms`` at most ``MAX_EPOCH_MS``: a snapshot's end is a valid epoch)."""
        total = self.table.get(f"{scope_key}|{TOTAL}")
        if total is None:
            return []
        end = window_end_ms(watermark_ms)
        # the label, not the coverage, stays a valid epoch: the last second ends past the limit
        label = min(end, MAX_EPOCH_MS)
        out = []
        for width in self.policy.windows_s:
            merged = window.initialize()
            for second in total["secs"]:
                if end // 1000 - width <= second < end // 1000:
                    bucket = self.table.get(f"{scope_key}|{second}")
                    if bucket is not None:
                        window.merge(merged, bucket["b"])
            out.append((float(width), label, window.result(merged, width)))
        span = max(1.0, (end - total["first"]) / 1000)
        # rates over the whole span; the label is capped at the longest window a snapshot names;
        # gauges of the workers heard within the longest window (not one killed long ago)
        since = end - max(self.policy.windows_s) * 1000
        b = total["b"]
        current = {**b, "g": {w: g for w, g in b["g"].items() if g[0] >= since}}
        out.append((min(86_400.0, span), label, window.result(current, span)))
        return out
