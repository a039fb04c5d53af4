"""Live settings: the validated configuration and the record that changes it.

``governor.config`` is a compacted topic keyed by the setting's dotted path; its latest records,
applied in order to the defaults, give the configuration in force. A value that fails validation
is rejected with a reason naming the field and the limit, and the last good configuration stays.
"""

import difflib
import json
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from annotated_types import MaxLen
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from schemas.base import Message
from schemas.commands import TenantLimit, TenantName
from schemas.limits import (MAX_LATENCY_S, MAX_MAP_ENTRIES, EpochMs, Id, Name, Offset, PoolName,
                            Seconds, addressable)
from workers.sim import models

#: On-demand list prices in USD per GPU-hour used when config sets none. They are round
#: figures in the range public clouds charged for one GPU of each kind in 2025; set your own.
DEFAULT_GPU_PRICES_USD_PER_HOUR = {"a100": 1.80, "h100": 3.00, "h200": 3.70}
#: The most a GPU may be priced at per hour (a bound against typos, far above any rental price).
MAX_GPU_PRICE_USD_PER_HOUR = 1_000.0
#: How often a worker sends its heartbeat (``WorkerStatus``), by default.
WORKER_HEARTBEAT_S = 0.5


def unpriced_gpu_price(prices: Mapping[str, float]) -> float:
    """What placement and the autoscaler take an hour of a GPU missing from
    ``gpu_prices_usd_per_hour`` to cost: the dearest price configured, so that a GPU nobody
    priced is never preferred for looking cheap."""
    return max(prices.values(), default=0.0)


class SloConfig(BaseModel):
    """Default latency targets for requests that state none."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ttft_slo_s: Seconds = 2.0
    deadline_s: Seconds = 60.0

    @model_validator(mode="after")
    def _first_token_within_deadline(self) -> "SloConfig":
        if self.ttft_slo_s > self.deadline_s:  # (a trace row saying so is refused too)
            raise ValueError(f"ttft_slo_s ({self.ttft_slo_s:g}) must not exceed deadline_s "
                             f"({self.deadline_s:g}): a request's first token comes before its "
                             "end")
        return self


class BreakerConfig(BaseModel):
    """When a worker's circuit breaker opens, and how it recovers."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    itl_ratio: float = Field(default=3.0, gt=1, le=1000, description="open when a worker's "
                             "inter-token latency, against what its load predicts, exceeds the "
                             "larger of 1 and its peers' median by this factor")
    consecutive: int = Field(default=2, ge=1, le=100, description="heartbeats in a row")
    error_rate: float = Field(default=0.5, gt=0, le=1)
    min_outcomes: int = Field(default=4, ge=1, le=10_000)
    cooldown_s: float = Field(default=10.0, gt=0, le=3600, description="open -> half-open")


class SheddingConfig(BaseModel):
    """Load shedding with hysteresis on fleet pressure (KV use, queue depth per worker)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    high: float = Field(default=0.5, gt=0, le=1)
    low: float = Field(default=0.3, ge=0, lt=1)
    kv_high: float = Field(default=0.8, gt=0, le=1, description="the fleet's mean KV-cache use "
                           "at which it counts as pressure ``high``: KV use counts in proportion "
                           "(the autoscaler plans for 60%, and an engine preempts only when its "
                           "cache is full)")
    queue_per_worker: float = Field(default=16.0, gt=0, le=10_000)
    step: float = Field(default=0.2, gt=0, le=1, description="how far the level moves per "
                        "second of pressure above high or below low")
    max_level: float = Field(default=0.5, ge=0, le=1, description="requests worth at least this "
                             "are never shed (worth 0.5 x priority / 9 + 0.4 x the task's "
                             "progress + 0.1 with a deadline: at 0.5, priority 9, or the last "
                             "step of a task that has a deadline)")

    @model_validator(mode="after")
    def _hysteresis(self) -> "SheddingConfig":
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high}): the level "
                             "holds between them")
        return self


class TaskAdmissionConfig(BaseModel):
    """Which new tasks start when the tasks in progress need more than the fleet can do
    (``controllers/router/task_admission.py``): the larger and lower-priority ones are refused
    first, before they spend anything."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    window_s: float = Field(default=30.0, gt=0, le=3600, description="the least span a task's "
                            "work is spread over (and all of it while no gap between steps is "
                            "measured)")
    target_load: float = Field(default=1.0, gt=0, le=100, description="offered load (the expected "
                               "work a second of the tasks in progress over what the live workers "
                               "do at best throughput) above which tasks are refused")


class PoolBounds(BaseModel):
    """One pool's own bounds, over the autoscaler's ``min_replicas`` and ``max_replicas``, and
    the GPUs each of its workers runs on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_replicas: int | None = Field(default=None, ge=0, le=4096)
    #: 0 takes the pool out of use: its model is served by its other pools
    max_replicas: int | None = Field(default=None, ge=0, le=4096)
    #: GPUs a worker of the pool runs on (its tensor parallelism), as whatever starts its
    #: workers starts them: the autoscaler plans a pool none of whose workers is alive at this
    #: degree (its workers' capacity, cold start and price), and one whose live workers report
    #: several degrees. None: the fleet's (``governor controllers --pool-gpus``), else the least
    #: that holds its model. Left out of the record then, so that a reader older than the field
    #: (which forbids fields it does not know) reads every other pool's bounds.
    gpus: int | None = Field(default=None, ge=1, le=models.TP_SIZES[-1],
                             exclude_if=lambda gpus: gpus is None)


#: A pool's name where it is given bounds (``autoscaler.pools``): ``autoscaler.pools.h100@foo.gpus``
#: is pool ``h100@foo``'s ``gpus``, so no pool is named ``h100@foo.gpus``.
AddressablePool = Annotated[PoolName, addressable("pool", "autoscaler.pools",
                                                  PoolBounds.model_fields, "a pool's bounds")]


class AutoscalerConfig(BaseModel):
    """Pool sizes from predicted load."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    enabled: bool = False
    #: Share of a worker's capacity the autoscaler plans to use: the rest absorbs a burst while a
    #: new worker loads (0.7 left too little on the Azure and Mooncake base loads of the policy
    #: benchmark: requests shed or late during a 28 s cold start; benchmarks/results/ANALYSIS.md).
    target_utilisation: float = Field(default=0.6, gt=0, le=1)
    min_replicas: int = Field(default=0, ge=0, le=4096)
    max_replicas: int = Field(default=16, ge=1, le=4096)
    scale_in_window_s: float = Field(default=60.0, ge=0, le=86_400)
    idle_to_zero_s: float = Field(default=300.0, ge=0, le=86_400)
    pools: dict[AddressablePool, PoolBounds] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES,
        description="bounds of one pool (by name, GPU@model) over min_replicas and max_replicas")

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalerConfig":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be at most max_replicas "
                             f"({self.max_replicas})")
        for name in self.pools:
            gpu_type, at, model = name.partition("@")
            if not (gpu_type and at and model):
                raise ValueError(f"pools: {name!r} is no pool name: expected GPU@MODEL, e.g. "
                                 "h100@llama-3-8b")
            if gpu_type != gpu_type.lower():  # (a worker names its GPU type so: no pool would match)
                raise ValueError(f"pools: {name!r}: a pool's GPU type is lower case, as its "
                                 f"workers report it: {gpu_type.lower()}@{model}")
            low, high = self.bounds(name)
            if low > high:
                raise ValueError(f"pool {name}: min_replicas ({low}) must be at most "
                                 f"max_replicas ({high})")
        return self

    def bounds(self, pool: str) -> tuple[int, int]:
        """The least and most workers of ``pool``: its own bounds, else the autoscaler's."""
        own = self.pools.get(pool)
        low = own.min_replicas if own is not None and own.min_replicas is not None \
            else self.min_replicas
        high = own.max_replicas if own is not None and own.max_replicas is not None \
            else self.max_replicas
        return low, high


class ModelShape(BaseModel):
    """A model's shape, as its ``config.json`` gives it: enough for the performance model's
    roofline (weights, KV bytes a token, FLOPs) where no measured tables exist. The built-in
    models (``workers/sim/models.py``) need none; declare others under ``models``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    params_b: float = Field(gt=0, le=10_000, description="parameters, billions")
    n_layers: int = Field(ge=1, le=1_000)
    n_heads: int = Field(ge=1, le=1_024)
    n_kv_heads: int = Field(ge=1, le=1_024)
    head_dim: int = Field(ge=1, le=4_096)
    hidden_size: int = Field(ge=1, le=1_000_000)
    intermediate_size: int = Field(ge=1, le=10_000_000)
    vocab_size: int = Field(ge=1, le=10_000_000)
    dtype_bytes: int = Field(default=2, ge=1, le=4, description="bytes a weight and a KV value")
    max_model_len: int | None = Field(
        default=None, ge=16, le=100_000_000,
        description="the longest prompt and output it serves (max_position_embeddings); "
                    "none: as long as the KV cache holds")

    @model_validator(mode="after")
    def _grouped_heads(self) -> "ModelShape":
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads "
                             f"({self.n_heads})")
        return self


#: A model's name where it is given a shape (``models``): addressable there, and in the key of
#: any of its pools under ``autoscaler.pools`` (no model is named ``foo.gpus`` or ``foo.n_heads``).
ModelName = Annotated[
    Name, addressable("model", "models", ModelShape.model_fields, "a model's shape"),
    addressable("model", "autoscaler.pools", PoolBounds.model_fields, "a pool's bounds",
                owner="pool", entry="GPU@{}")]


#: The settings that map names (of tenants, GPU types, scorers, pools) to values, and the
#: model of an entry (None where an entry is a number).
_ENTRIES: dict[tuple[str, ...], type[BaseModel] | None] = {
    ("tenants",): TenantLimit,
    ("gpu_prices_usd_per_hour",): None,
    ("router_weights",): None,
    ("autoscaler", "pools"): PoolBounds,
    ("models",): ModelShape,
}
#: The fields of each map's entries (none where an entry is a number).
_MAPS: dict[tuple[str, ...], frozenset[str]] = {
    path: frozenset(entry.model_fields if entry else ()) for path, entry in _ENTRIES.items()}
#: Their dotted keys.
MAP_KEYS = frozenset(".".join(path) for path in _MAPS)
#: The maps (sections of their own) no validator reads beyond one entry: no other entry's, no
#: other section's. A change under one validates only the entry it sets (with 1,000 tenants,
#: each record validated them all), and a change elsewhere validates without them: they were
#: valid, and nothing it changes is checked against them. A validator that comes to read one
#: of them so must take it out of here.
_SELF_CONTAINED = ("tenants", "gpu_prices_usd_per_hour", "router_weights")


class GovernorConfig(BaseModel):
    """Every live setting, with documented defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    slo: SloConfig = SloConfig()
    tenants: dict[TenantName, TenantLimit] = Field(default_factory=dict,
                                                   max_length=MAX_MAP_ENTRIES)
    gpu_prices_usd_per_hour: dict[Name, Annotated[float, Field(
        ge=0, le=MAX_GPU_PRICE_USD_PER_HOUR)]] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_PRICES_USD_PER_HOUR), max_length=MAX_MAP_ENTRIES,
        description="USD an hour per GPU type; placement and the autoscaler take a type missing "
                    "here at the dearest price listed")
    routing_policy: Literal["governor", "round_robin", "least_loaded", "kv_aware"] = "governor"
    #: Scorer weights of the governor policy; see controllers/router/scorers.py for the names.
    router_weights: dict[Name, Annotated[float, Field(ge=0, le=1000)]] = Field(
        default_factory=dict, max_length=64, description="overrides of the default weights")
    worker_heartbeat_timeout_s: float = Field(
        default=3.0, ge=2 * WORKER_HEARTBEAT_S, le=MAX_LATENCY_S,
        description="a worker not heard from for this long is taken for gone, and its requests "
                    "are moved; at least two of its heartbeats (every 0.5 s): under one, a "
                    "live worker is taken for gone between two, and its requests moved and "
                    "failed as their retry budget ran out")
    retry_budget_ratio: float = Field(default=0.1, ge=0, le=1)
    retry_budget_min_per_s: float = Field(default=1.0, ge=0, le=1e6)
    breaker: BreakerConfig = BreakerConfig()
    shedding: SheddingConfig = SheddingConfig()
    task_admission: TaskAdmissionConfig = TaskAdmissionConfig()
    autoscaler: AutoscalerConfig = AutoscalerConfig()
    #: Models beside the built-in ones, by the name requests and pools give them: their shapes,
    #: from which the router, the autoscaler and ``governor sim`` predict their speed.
    models: dict[ModelName, ModelShape] = Field(default_factory=dict, max_length=64)

    @model_validator(mode="after")
    def _shedding_after_scaling(self) -> "GovernorConfig":
        if self.autoscaler.enabled and \
                self.shedding.kv_high <= self.autoscaler.target_utilisation:
            raise ValueError(
                f"shedding.kv_high ({self.shedding.kv_high:g}) must be above "
                f"autoscaler.target_utilisation ({self.autoscaler.target_utilisation:g}) while "
                "the autoscaler is enabled: the fleet would shed work before a worker is added")
        return self

    @model_validator(mode="after")
    def _pool_degrees(self) -> "GovernorConfig":
        """A pool's ``gpus`` must be a degree its model runs at on its GPU type, where both are
        known (the model built in or declared under ``models``)."""
        declared = {name.lower(): shape for name, shape in self.models.items()}
        for name, own in self.autoscaler.pools.items():
            gpu_type, _, model = name.lower().partition("@")
            gpu = models.GPUS.get(gpu_type)
            spec = models.MODELS.get(model) or (
                models.ModelSpec(model, **declared[model].model_dump()) if model in declared
                else None)
            why = own.gpus and gpu and spec and models.tp_refusal(spec, gpu, own.gpus)
            if why:
                raise ValueError(f"autoscaler.pools.{name}.gpus: {why}")
        return self

    def with_setting(self, key: str, value: Any, missing_ok: bool = False) -> "GovernorConfig":
        """A copy with the dotted ``key`` set to ``value``, validated as the whole configuration
        would be (each field strictly as JSON, each section's validators and those across
        sections), but for the maps no validator reads beyond an entry (``_SELF_CONTAINED``):
        of those, only the entry it sets, so that a record's work does not grow with the tenants
        configured.

        Under a map (``tenants``, ``gpu_prices_usd_per_hour``, ``router_weights``,
        ``autoscaler.pools``) the rest of the key names an entry, dots and all
        (``autoscaler.pools.h100@llama-3.1-8b``), or, where its last part is a field of the
        map's entries, that field of an existing entry (``tenants.acme.burst_s``). ``None``
        (JSON ``null``) for an entry removes it: the tenant, pool, price, weight or model falls
        back to what holds without it.

        Raises ``pydantic.ValidationError`` (naming the field and the limit) or ``KeyError`` for
        a key that names no setting, or no entry to remove (unless ``missing_ok``: a removal
        read from the topic, which compaction may have left as its key's only record).
        """
        apart = self._apart(key)
        data = self._data_for(apart)
        node, name, entry = _locate(data, key)
        if name not in node and not entry:
            raise _no_setting(key)
        if entry and value is None:
            if name not in node and missing_ok:
                return self
            if name not in node:
                raise KeyError(f"no entry {name!r} to remove under {key.removesuffix(name)[:-1]!r}")
            del node[name]
        else:
            node[name] = value
        # Strictly, as JSON: a setting's value is JSON, and lax validation took `true` for 1,
        # "2.5" for 2.5 and 4.0 for 4 (as the topics' records are decoded strictly too)
        candidate = GovernorConfig.model_validate_json(json.dumps(data), strict=True)
        return candidate.model_copy(update={
            section: _merged(getattr(self, section), getattr(candidate, section), entry_name)
            for section, entry_name in apart.items()})

    def _apart(self, key: str) -> dict[str, str | None]:
        """The maps of ``_SELF_CONTAINED`` that a change of ``key`` validates apart from them,
        each with the one entry it validates (that ``key`` lies in; None: none). One it sets
        whole is validated whole, and so is one an entry would be added to beyond its limit
        (the error, as validating it whole gives it)."""
        section = key.partition(".")[0]
        apart: dict[str, str | None] = {name: None for name in _SELF_CONTAINED if name != section}
        located = map_entry(key)
        if section in _SELF_CONTAINED and located is not None:
            entries, name = getattr(self, section), located[1]
            if name in entries or len(entries) < _most_entries(section):
                apart[section] = name
        return apart

    def _data_for(self, apart: dict[str, str | None]) -> dict:
        """This configuration as JSON data, but of each map ``apart`` (``_apart``) only the
        entry named, if it is there."""
        data = self.model_dump(mode="json", exclude=set(apart))
        for section, name in apart.items():
            entries = getattr(self, section)
            if name is not None:
                data[section] = {name: _as_json(entries[name])} if name in entries else {}
        return data

    def data_at(self, names: list[str]) -> Any:
        """The JSON data (as ``model_dump(mode="json")`` gives it) at ``names`` from the root
        (of a section, a field, a map, a map's entry by its whole name), without the rest of the
        configuration's; ``KeyError`` where it has none."""
        node: Any = self
        for name in names[:-1]:
            node = getattr(node, name) if isinstance(node, BaseModel) else node[name]
        if isinstance(node, BaseModel):  # (as it dumps it: a field may be left out, as None)
            return node.model_dump(mode="json", include={names[-1]})[names[-1]]
        return _as_json(node[names[-1]])

    def setting(self, key: str) -> Any:
        """The value (as JSON data) of the setting the dotted ``key`` names, as ``with_setting``
        reads keys; raises ``KeyError`` for a key that names no setting."""
        node, name, _ = _locate(self._data_for(self._apart(key)), key)
        if name not in node:
            raise _no_setting(key)
        return node[name]


def _merged(before: dict, validated: dict, name: str | None) -> dict:
    """A map apart from a change's validation (``GovernorConfig._apart``): as it was (a copy:
    two configurations share no map), with the entry ``name`` as validated (added at the end,
    or removed where validation has none)."""
    if name is None:
        return dict(before)
    merged = {**before, **validated}
    if name not in validated:
        merged.pop(name, None)
    return merged


def _most_entries(section: str) -> int:
    """The most entries the map ``section`` may hold."""
    return next(limit.max_length for limit in GovernorConfig.model_fields[section].metadata
                if isinstance(limit, MaxLen))


def _as_json(value: Any) -> Any:
    """A map's entry as JSON data (a model's fields, or the number itself)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def check_key(key: str) -> None:
    """Raises ``KeyError`` for a dotted key that names no setting of any configuration: an empty
    part, or a name no section has. An entry of a map (``tenants.acme``, and its fields) passes:
    the configuration in force may hold it."""
    parts = key.split(".")
    if not all(parts):
        raise KeyError(f"{key!r} has an empty part between its dots")
    node: Any = GovernorConfig().model_dump(mode="json")
    for depth, part in enumerate(parts):
        if tuple(parts[:depth]) in _MAPS:
            return
        if not isinstance(node, dict) or part not in node:
            raise _no_setting(key)
        node = node[part]


def setting_names() -> list[str]:
    """The dotted name of every setting (a map by its own name, not its entries)."""
    def names(node: Any, prefix: tuple[str, ...]) -> list[str]:
        if not isinstance(node, dict) or prefix in _MAPS:
            return [".".join(prefix)]
        return [name for part, value in node.items() for name in names(value, (*prefix, part))]
    return names(GovernorConfig().model_dump(mode="json"), ())


def map_entry(path: str) -> tuple[str, str] | None:
    """The map (by its dotted key) and the entry that the dotted ``path`` of a setting, or of a
    leaf of the configuration's JSON data, lies in (``tenants.acme.burst_s``: ``tenants``,
    ``acme``); None where it lies in none, or names a map itself."""
    for prefix, fields in _MAPS.items():
        map_key = ".".join(prefix)
        if path.startswith(f"{map_key}."):
            rest = path.removeprefix(f"{map_key}.")
            entry, _, leaf = rest.rpartition(".")
            return map_key, entry if entry and leaf in fields else rest
    return None


def _no_setting(key: str) -> KeyError:
    """The error for a key that names no setting, with the names most like it."""
    names = setting_names()
    near = difflib.get_close_matches(key, names, n=2, cutoff=0.8)
    section = key.rpartition(".")[0]
    inside = [name for name in names if name.startswith(f"{section}.")] if section else []
    hint = (f"did you mean {' or '.join(near)}?" if near else
            f"{section} has {', '.join(inside)}" if inside else
            "`governor config get` lists them")
    return KeyError(f"no setting named {key!r} ({hint})")


class NoEntry(KeyError):
    """A field of a map's entry that does not exist yet (``tenants.acme.priority`` before
    ``tenants.acme`` is set): it is added whole, with ``fields`` (those an entry requires, and
    the one given). Its message says so in ``governor config set``'s words; ``saying`` words it
    for another command (``governor sim --set``, which before 7 Dec was told to run ``governor
    config set``: a setting of the live topic, not of the run)."""

    def __init__(self, key: str, map_key: str, entry: str, fields: str) -> None:
        self.key, self.map_key, self.entry, self.fields = key, map_key, entry, fields
        super().__init__(self.saying(f"governor config set {self.entry_key} '{fields}'"))

    @property
    def entry_key(self) -> str:
        """The entry's own dotted key, to set whole."""
        return f"{self.map_key}.{self.entry}"

    def saying(self, command: str) -> str:
        return (f"no setting named {self.key!r}: {self.map_key} has no entry {self.entry!r} (add "
                f"it whole first: {command})")


def _no_entry(key: str, path: list[str], entry: str, field: str) -> KeyError:
    """The error for a field of a map's entry that does not exist yet: ``NoEntry``."""
    model = _ENTRIES[tuple(path)]
    required = [name for name, info in model.model_fields.items() if info.is_required()]
    fields = ", ".join(f'"{name}": ...' for name in dict.fromkeys([*required, field]))
    return NoEntry(key, ".".join(path), entry, f"{{{fields}}}")


def _locate(data: dict, key: str) -> tuple[dict, str, bool]:
    """Where the dotted ``key`` points in a configuration as JSON data: the dict that holds it,
    its name there, and whether it is a map's entry (a new one may be added)."""
    node, parts = data, key.split(".")
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(node.get(part), dict):
            raise _no_setting(key)
        node = node[part]
        fields = _MAPS.get(tuple(parts[:depth + 1]))
        if fields is not None:
            rest = parts[depth + 1:]
            if len(rest) > 1 and rest[-1] in fields:  # a field of an entry
                entry = ".".join(rest[:-1])
                if not isinstance(node.get(entry), dict):
                    raise _no_entry(key, parts[:depth + 1], entry, rest[-1])
                node[entry].setdefault(rest[-1], None)  # (a field left out where None)
                return node[entry], rest[-1], False
            return node, ".".join(rest), True  # an entry, its name dots and all
    return node, parts[-1], False


class ConfigSet(Message):
    """An operator sets one live setting (``governor.config``, key ``key``)."""

    type: Literal["config_set"] = "config_set"
    key: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:@/+-]+$")
    value: JsonValue
    set_by: Id = "operator"
    #: Since when the value has been in force, where that is before the record was written: a
    #: record that writes the value in force again (``set_by`` ``governor-restore``), which a
    #: router weighs against the commands made since by this time, not by ``event_time_ms``.
    #: None: since ``event_time_ms``. Left out of the record then, so that a reader older than
    #: the field (which forbids fields it does not know) reads every other record.
    in_force_since_ms: EpochMs | None = Field(default=None, exclude_if=lambda since: since is None)
    #: Where such a record sets a map (``tenants``, ``autoscaler.pools``: entries named as the
    #: map names them): the entries set (or removed) after the map as a whole was, each with
    #: since when it has held, ``in_force_since_ms`` saying since when the map has (and every
    #: entry not named here): a router ends an operator's command for a tenant only where its
    #: own limit was set after the command. None: every entry since ``value_since_ms``; left
    #: out of the record then, as ``in_force_since_ms``. At most ``MAX_MAP_ENTRIES`` entries
    #: (a writer names every entry in force, then the newest removed ones), each named as a
    #: pool may be.
    entries_since_ms: dict[PoolName, EpochMs] | None = Field(
        default=None, max_length=MAX_MAP_ENTRIES, exclude_if=lambda since: since is None)
    #: Of a router's restoring record: the offset of the topic's record it had read last (the
    #: rejected one), so that a component that has applied a record after it setting something
    #: under the key does not take the value it restores, older (None: not checked; left out).
    restored_after_offset: Offset | None = Field(default=None,
                                                 exclude_if=lambda offset: offset is None)

    @property
    def value_since_ms(self) -> int:
        """Since when the value it sets has been in force: when the change was made."""
        return self.event_time_ms if self.in_force_since_ms is None else self.in_force_since_ms

    def entry_since_ms(self, entry: str) -> int:
        """Since when the entry ``entry`` of the map it sets has been in force (of a record
        that sets no map, or one entry: ``value_since_ms``)."""
        return max(self.value_since_ms, (self.entries_since_ms or {}).get(entry, 0))

    @field_validator("value")
    @classmethod
    def _finite(cls, value: JsonValue) -> JsonValue:
        # The JSON parser reads NaN, Infinity and 1e400 into floats that JsonValue keeps; they
        # would not survive a re-encode (JSON has no such numbers), so refuse them as every
        # other float field does.
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, float) and not math.isfinite(node):
                raise ValueError("must not contain NaN or infinity")
            if isinstance(node, dict):
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return value
