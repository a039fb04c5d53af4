"""Settings of the streams component (frozen; every default documented)."""

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR, GovernorConfig, SloConfig
from streams.signals.book import WindowPolicy

#: How often the streams worker commits its offsets (Faust's ``broker_commit_interval``): a
#: crash's replay reads up to this far behind what was processed, in wall time.
COMMIT_INTERVAL_S = 1.0


class StreamsSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    namespace: str = "governor"
    bootstrap: str = "127.0.0.1:9092"
    #: Sliding windows published every tick, in seconds (the running total is published too).
    windows_s: tuple[int, ...] = (10, 60)
    #: How far behind its partition's newest event an observation may be and still enter its
    #: window (it always enters the running total).
    allowed_lateness_s: float = Field(default=30.0, ge=0, le=3600)
    #: An event of the telemetry or requests topic stamped more than this ahead of the streams'
    #: clock is dead-lettered (``future_event_time``), not counted: one accepted would move its
    #: partition's event time (windows, lateness, sweeps) and its worker's last heartbeat as far
    #: ahead. Keep it under ``allowed_lateness_s``: events on time are then never late behind
    #: one that was accepted ahead.
    max_event_ahead_s: float = Field(default=10.0, ge=0, le=3600)
    #: How often snapshots are published (wall clock); windows themselves are in event time.
    #: Up to one tick of an event's signal lag is the wait for the next publication; a tick
    #: costs about 10 ms of CPU for the 14 scope keys of the benchmark (``_publish``).
    tick_s: float = Field(default=0.5, gt=0, le=60)
    #: USD per GPU-hour by GPU type (config's documented defaults unless set). This, ``slo``
    #: and ``heartbeat_timeout_s`` are taken from the configuration topic (``Taken``).
    gpu_prices_usd_per_hour: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_PRICES_USD_PER_HOUR))
    #: TTFT SLO and deadline for requests that state none.
    slo: SloConfig = SloConfig()
    #: A worker not heard from for this long is shown as not live in the fleet view (the
    #: configuration's ``worker_heartbeat_timeout_s``, as the router judges it).
    heartbeat_timeout_s: float = Field(default=3.0, gt=0)
    #: A silence between two heartbeats of one worker run counts as provisioned up to this long
    #: (a longer one: a stall, a lost link; the GPU may have been let go). The cost report caps
    #: each gap at the same default, the configuration's default ``worker_heartbeat_timeout_s``.
    max_heartbeat_gap_s: float = Field(default=GovernorConfig().worker_heartbeat_timeout_s, gt=0)
    #: An open task with no progress for this long (event time) is closed as timed out.
    task_idle_timeout_s: float = Field(default=120.0, gt=0)
    #: A scope key (tenant, model, worker, pool) with no observation for this long (event time)
    #: is no longer published and its windows and running total are deleted (seen again, it
    #: starts a new running total): client-named tenants and models would otherwise be kept,
    #: and their Prometheus series too, for ever. At least the longest window plus the allowed
    #: lateness.
    scope_retention_s: float = Field(default=3600.0, gt=0)
    #: Finished requests and closed tasks are remembered this long to drop late duplicates.
    request_retention_s: float = Field(default=300.0, gt=0)
    task_retention_s: float = Field(default=600.0, gt=0)
    #: Events taken per batch and the longest wait to fill one.
    batch_max: int = Field(default=5000, ge=1)
    batch_within_s: float = Field(default=0.1, gt=0)
    #: Serve Prometheus metrics on 127.0.0.1 at this port; 0: off.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    #: Tenants and models with Prometheus series of their own (the first published; the others
    #: are folded into ``key="~other"``, additive values summed: ``streams.metrics``).
    metrics_max_keys: int = Field(default=100, ge=0, le=10_000)
    #: A worker whose recovery of its tables (the changelogs read back before it processes
    #: anything) has read nothing for this long logs an ERROR naming the changelog partitions
    #: it waits on and exits non-zero, for its supervisor to start it again
    #: (``streams.recovery``). A recovery that reads on is never cut short, however long.
    #: The default is above Faust's own wait for one step of it, ``broker_request_timeout``
    #: (90 s); a step the broker does not answer in that time ends the worker on its own.
    recovery_stall_s: float = Field(default=300.0, gt=0, le=86_400)
    #: Partitions of the internal repartition topics: the telemetry topic's, so that they are
    #: co-partitioned with it (Faust assigns equal partition numbers to one worker).
    partitions: int = Field(default=4, ge=1)

    @model_validator(mode="after")
    def _windows(self) -> "StreamsSettings":
        if not self.windows_s or any(w <= 0 or w > 86_400 for w in self.windows_s):
            raise ValueError("windows_s must name windows of 1 to 86,400 seconds")
        return self

    @property
    def replay_s(self) -> float:
        """How far behind its partition's event time a crash's replay may read: the allowed
        lateness (an idle partition's event time moves on with the clock, that far behind it)
        plus the commit interval."""
        return self.allowed_lateness_s + COMMIT_INTERVAL_S

    @property
    def policy(self) -> WindowPolicy:
        return WindowPolicy(self.windows_s, self.allowed_lateness_s, self.scope_retention_s)


class Taken(NamedTuple):
    """What the streams take from a configuration."""

    prices_usd_per_hour: dict[str, float]
    slo: SloConfig
    heartbeat_timeout_s: float

    @classmethod
    def of(cls, config: GovernorConfig) -> "Taken":
        return cls(dict(config.gpu_prices_usd_per_hour), config.slo,
                   config.worker_heartbeat_timeout_s)
