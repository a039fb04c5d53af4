"""Routing weights per pool from measured success per dollar and latency: pure, ticked.

From the latest pool signals (``SignalSnapshot`` with scope ``pool``; ``success_per_dollar`` and
``ttft_p99_s``) each pool's weight is its success per dollar relative to the best pool, halved
for every multiple by which its p99 TTFT exceeds the SLO. A pool with no signal yet keeps weight
1 (unknown is not bad); a pool measured at 0 successes per dollar is not "no signal": it gets
the least weight, ``PROBE_WEIGHT``, which every pool keeps so that it is measured again (where
every pool is measured at 0, none succeeding, all weigh 1). The whole
weight vector is published each tick, for the pools whose workers send heartbeats: a pool no
worker of which has been heard from for as long as the controllers forget a worker after
(``forget_after_ms``: 300 s, or the heartbeat timeout where longer; scaled to zero, renamed)
leaves the vector with its signals. (Heartbeats alone say a pool lives: the signals app
publishes every pool it has seen on every tick, with a window end that other pools' traffic
moves on.) A restarted process keeps the weights its predecessor last commanded
(``continue_from``, read back from the control topic) for each pool until that pool's first
signal.
"""

from dataclasses import dataclass, field

from controllers.breakers import FORGET_MS
from controllers.router.scorers import NO_SIGNAL_WEIGHT
from schemas.commands import SetRoutingWeights
from schemas.events import SignalSnapshot


#: The least weight of a pool with signals: enough traffic to measure it again.
PROBE_WEIGHT = 0.05


@dataclass
class RoutingWeights:
    ttft_slo_s: float = 2.0
    window_s: float = 60.0
    _signals: dict[str, dict[str, float]] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)  # pool -> its last heartbeat (ms)
    #: pool -> the weight read back (``continue_from``), until the pool's first signal
    _continued: dict[str, float] = field(default_factory=dict)

    def continue_from(self, command: SetRoutingWeights) -> None:
        """The weights an earlier process commanded last (read back from the control topic)."""
        self._continued = dict(command.weights)

    def observe_pool(self, pool: str, now_ms: int) -> None:
        """A worker of ``pool`` sent a heartbeat at ``now_ms``."""
        self._seen[pool] = max(self._seen.get(pool, now_ms), now_ms)

    def observe(self, snapshot: SignalSnapshot) -> None:
        if snapshot.scope == "pool" and snapshot.window_s == self.window_s:
            self._signals[snapshot.key] = dict(snapshot.values)
            self._continued.pop(snapshot.key, None)

    def tick(self, now_ms: int, forget_after_ms: int = FORGET_MS) -> SetRoutingWeights | None:
        """``forget_after_ms``: how long a pool is remembered after the last heartbeat of one of
        its workers (the controllers' ``forget_after_ms``: before 7 Dec 600 s whatever the
        heartbeat timeout, so a pool still alive by a longer one lost its measured weight)."""
        for pool in [p for p, seen in self._seen.items() if now_ms - seen > forget_after_ms]:
            del self._seen[pool]
        for pool in [p for p in self._signals if p not in self._seen]:
            del self._signals[pool]  # measured before it went, or a pool with no worker
        if not self._seen:
            return None
        spd = {p: self._signals.get(p, {}).get("success_per_dollar") for p in self._seen}
        best = max((v for v in spd.values() if v is not None), default=None)
        # nobody succeeds: every pool measured at 0 (one not measured yet may succeed: before
        # 7 Dec a pool at 0 beside it weighed 1 too, a full share)
        none_succeed = not best and all(v is not None for v in spd.values())
        weights, notes = {}, []
        for pool in sorted(self._seen):
            if spd[pool] is None and pool in self._continued:  # (a restarted process's)
                weights[pool] = self._continued[pool]
                notes.append(f"{pool} {weights[pool]:g} as last commanded (no signal yet)")
                continue
            if none_succeed or spd[pool] is None:  # no signal yet, or no pool succeeds at all
                weights[pool] = NO_SIGNAL_WEIGHT
                continue
            weight = spd[pool] / best if best else 0.0
            p99 = self._signals[pool].get("ttft_p99_s")
            if p99 is not None and p99 > self.ttft_slo_s:
                weight *= 0.5 ** int(p99 / self.ttft_slo_s)  # (a float: no overflow)
                notes.append(f"{pool} p99 TTFT {p99:.2f}s over the {self.ttft_slo_s:g}s SLO")
            # never 0: a pool keeps a probe's share of traffic, so that it is measured again
            weights[pool] = round(max(weight, PROBE_WEIGHT), 4)
            notes.append(f"{pool} {spd[pool]:.1f} successes/$")
        return SetRoutingWeights(event_time_ms=now_ms, command_id=f"weights-{now_ms}",
                                 issued_by="routing-weights", weights=weights,
                                 reason="; ".join(notes) or "no pool signals yet: equal weights")
