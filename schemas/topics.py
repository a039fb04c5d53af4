"""The topic catalog: the one place that names topics, their keys, models and settings.

Names are ``<namespace>.<suffix>``; the default namespace is ``governor``. Tests and demos use a
namespace of their own so that runs never read each other's records.
"""

from dataclasses import dataclass
from typing import Annotated, Literal, Union, get_args

from pydantic import Field, TypeAdapter

from schemas import commands, events
from schemas.base import Message
from schemas.config import ConfigSet
from schemas.limits import MAX_ID_CHARS
from schemas.requests import CancelRequest, Dispatch, InferenceRequest, ResponseChunk

DAY_MS = 86_400_000

LIFECYCLE_EVENTS = (
    events.Queued,
    events.Started,
    events.FirstToken,
    events.Preempted,
    events.Requeued,
    events.Completed,
    events.Failed,
    events.Rejected,
    events.Cancelled,
)
COMMANDS = (
    commands.SetRoutingWeights,
    commands.SetAdmissionLimits,
    commands.SetLoadShedLevel,
    commands.SetBreakerState,
    commands.SetRetryBudget,
    commands.ScalePool,
    commands.DrainWorker,
    commands.LoadModel,
    commands.SleepWorker,
    commands.InjectFault,
)


def _union(*models: type[Message]) -> TypeAdapter:
    if len(models) == 1:
        return TypeAdapter(models[0])
    return TypeAdapter(Annotated[Union[models], Field(discriminator="type")])  # noqa: UP007


@dataclass(frozen=True)
class TopicSpec:
    """What a topic carries and how it is kept."""

    suffix: str
    key: str
    models: tuple[type[Message], ...]
    partitions: int
    cleanup: Literal["delete", "compact"] = "delete"
    retention_ms: int | None = 7 * DAY_MS
    doc: str = ""
    #: Its records are stamped by the broker as it appends them (``LogAppendTime``), not by
    #: their producers: a reader judges a record's own stamp against that time, the same for
    #: every reader whenever it reads the record (``controllers.overrides``).
    append_time: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "adapter", _union(*self.models))

    @property
    def types(self) -> frozenset[str]:
        return frozenset(get_args(m.model_fields["type"].annotation)[0] for m in self.models)

    def config(self) -> dict[str, str]:
        """Kafka topic configs."""
        out = {"cleanup.policy": self.cleanup}
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        if self.append_time:
            out["message.timestamp.type"] = "LogAppendTime"
        return out


SPECS: tuple[TopicSpec, ...] = (
    TopicSpec("requests", "request_id", (InferenceRequest, CancelRequest), 4,
              doc="client requests and cancellations"),
    TopicSpec("dispatch", "request_id", (Dispatch, CancelRequest), 32,
              doc="placements; partition N is worker slot N"),
    TopicSpec("responses", "request_id", (ResponseChunk,), 4, retention_ms=DAY_MS,
              doc="streamed tokens with offsets"),
    TopicSpec("telemetry", "request_id, worker_id or setting key",
              (*LIFECYCLE_EVENTS, events.WorkerStatus, events.ConfigApplied, events.ConfigRejected), 4,
              doc="request lifecycle events (key request_id), worker status (key worker_id), "
                  "config applied/rejected (key: the setting)"),
    TopicSpec("kv", "worker_id", (events.KvBlocksStored, events.KvBlocksEvicted,
                                  events.KvCacheCleared), 2, retention_ms=DAY_MS,
              doc="prefix-cache block events"),
    TopicSpec("signals", "scope:key", (events.SignalSnapshot,), 2, retention_ms=DAY_MS,
              doc="live signal snapshots (the sink keeps them longer)"),
    TopicSpec("control", "target", COMMANDS, 1, doc="controller commands (desired state)",
              append_time=True),
    TopicSpec("config", "setting key", (ConfigSet,), 1, cleanup="compact", retention_ms=None,
              doc="live settings, compacted", append_time=True),
    TopicSpec("deadletter", "source topic", (events.DeadLetter,), 1, retention_ms=30 * DAY_MS,
              doc="records no consumer could use, with the reason"),
)

#: The streams app's topics in each namespace, after ``<namespace>.`` (``streams.app``): its
#: repartition topics, one a route, its tables' changelogs (Faust names them after its app id,
#: ``<namespace>.streams``) and Faust's leader election topic.
STREAMS_ROUTES = ("worker", "task", "scope")
#: ``times``: each telemetry and by-task partition's event time (``streams.stages``).
STREAMS_TABLES = ("requests", "workers", "tasks", "windows", "times")
STREAMS_SUFFIXES = (*(f"streams.by-{route}" for route in STREAMS_ROUTES),
                    *(f"streams-{table}-changelog" for table in STREAMS_TABLES),
                    "streams-__assignor-__leader")
#: What the name of a topic of any namespace's components ends with, after a ``.``.
INTERNAL_SUFFIXES = (*(spec.suffix for spec in SPECS), *STREAMS_SUFFIXES)


class TopicCatalog:
    """Topic names for one namespace, and the spec of each."""

    def __init__(self, namespace: str = "governor") -> None:
        # isascii: str.isalnum() also accepts letters and digits Kafka refuses in topic names.
        if not namespace or len(namespace) > 200 or not namespace.isascii() or not namespace.replace(
            "-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"namespace must be 1-200 letters, digits, '.', '_' or '-': {namespace!r}")
        self.namespace = namespace
        self._by_name = {self.name(spec.suffix): spec for spec in SPECS}

    def name(self, suffix: str) -> str:
        return f"{self.namespace}.{suffix}"

    def spec(self, topic: str) -> TopicSpec:
        try:
            return self._by_name[topic]
        except KeyError:
            raise KeyError(f"{topic!r} is not a topic of namespace {self.namespace!r}") from None

    def topics(self) -> dict[str, TopicSpec]:
        return dict(self._by_name)

    def internal_reply_topic(self, reply_to: str | None) -> str | None:
        """Why a request may not have its chunks sent to ``reply_to``, an internal topic (None:
        it may): one of this namespace's topics other than its responses topic; one named as a
        topic of any namespace's components is (``<namespace>.<suffix>``, ``INTERNAL_SUFFIXES``,
        another namespace's responses topic too, whose readers would take the chunks for their
        own requests'); or one whose name begins with ``_``, as Kafka's own (``__consumer_offsets``)
        and its tools' (``_schemas``) do. Router and worker both refuse such a request."""
        if reply_to is None or reply_to == self.responses:
            return None
        if reply_to in self._by_name:
            why = "one of Governor's own topics"
        elif reply_to.startswith("_"):
            why = "a name beginning with '_' is Kafka's or its tools', as '__consumer_offsets' is"
        else:
            suffix = next((s for s in INTERNAL_SUFFIXES if reply_to.endswith(f".{s}")), None)
            if suffix is None:
                return None
            why = f"named as a Governor namespace's own topic is, '<namespace>.{suffix}'"
        return (f"reply_to {reply_to!r} is an internal topic ({why}); send chunks to a topic of "
                "your own")

    def misplaced(self, topic: str, partition: int, message: Message,
                  key: bytes | None = None) -> str | None:
        """Why a valid ``message`` read from ``partition`` of ``topic`` under ``key`` is not where
        its kind is written (None: it is): a dispatch is on its slot's partition, where that
        slot's worker runs it and the router recalls it; a request or cancellation is keyed by
        its ``request_id``: keyed otherwise, or not at all, it lands on a partition its id does
        not choose, where another router may hold a request under its id (a request sent under
        two keys, or twice without one, was placed once by each router of the group)."""
        if topic == self.dispatch and isinstance(message, Dispatch) and \
                message.slot != partition:
            return (f"slot: {message.slot} is not the partition it was read from ({partition}); "
                    "a dispatch is written to its slot's partition")
        if topic == self.requests and isinstance(message, InferenceRequest | CancelRequest) and \
                key != message.request_id.encode():
            rid = message.request_id
            if key is None:
                return (f"key: none; a request and its cancellation are keyed by their request_id "
                        f"{rid!r} (without a key each record of it may land on another partition, "
                        "and be placed by another router)")
            return (f"key: {key[:MAX_ID_CHARS + 2].decode(errors='replace')!r} is not the "
                    f"request_id {rid!r}; a request and its cancellation are keyed by their "
                    "request_id")
        return None

    requests = property(lambda self: self.name("requests"))
    dispatch = property(lambda self: self.name("dispatch"))
    responses = property(lambda self: self.name("responses"))
    telemetry = property(lambda self: self.name("telemetry"))
    kv = property(lambda self: self.name("kv"))
    signals = property(lambda self: self.name("signals"))
    control = property(lambda self: self.name("control"))
    config = property(lambda self: self.name("config"))
    deadletter = property(lambda self: self.name("deadletter"))


def all_models() -> list[type[Message]]:
    """Every message model, once, in catalog order."""
    seen: dict[type[Message], None] = {}
    for spec in SPECS:
        for model in spec.models:
            seen.setdefault(model)
    return list(seen)
