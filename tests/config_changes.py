"""Configuration changes for the tests of applying them: random ones (hypothesis strategies),
and what one costs in tenants' limits, counted (not timed: each tenant dumped or validated),
for the tests that a record's work does not grow with the tenants configured."""

import json
from typing import Any

from hypothesis import strategies as st

from schemas.config import GovernorConfig, TenantLimit

SHAPE = {"params_b": 1.0, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2, "head_dim": 64,
         "hidden_size": 512, "intermediate_size": 1024, "vocab_size": 1000}
LIMIT = {"requests_per_s": 5, "tokens_per_s": 100}
#: Where the changes start: an entry in each map (tenants with dotted names; two declared models
#: whose names differ in case only, the later one taken for the pool of that name), the
#: autoscaler on, its target close under ``shedding.kv_high``.
BASE = GovernorConfig.model_validate({
    "tenants": {"a": LIMIT, "b": LIMIT, "b.x": {**LIMIT, "priority": 3}},
    "gpu_prices_usd_per_hour": {"h100": 3.0, "x.y": 2.0},
    "router_weights": {"recency": 1.0},
    "autoscaler": {"enabled": True, "target_utilisation": 0.7,
                   "pools": {"h100@llama-3-8b": {"max_replicas": 2}, "h100@tiny": {"gpus": 4}}},
    "models": {"tiny": {**SHAPE, "n_heads": 6, "n_kv_heads": 3}, "Tiny": SHAPE}})

#: Names of entries: those there, new ones, and awkward ones (dotted, ending in a field's name,
#: upper case, empty, too long, of no pool).
names = st.sampled_from(["a", "b", "b.x", "c", "h100", "x.y", "recency", "h100@llama-3-8b",
                         "h100@tiny", "a100@tiny", "tiny", "Tiny"]) | st.sampled_from(
    ["a.burst_s", "b.gpus", "", "Z", "x" * 70, "H100@tiny", "nopool", "h100@big", "b.x.y"])
numbers = st.sampled_from([1, 2, 4, 0.5, 0.6, 0.75, 0.9, 2.5]) | st.sampled_from(
    [0, 3, 6, 9, 10, 0.0, 0.3, -1, 1e7, 4096, 5000])
scalars = numbers | st.sampled_from([None, True, "2.5", "kv_aware", [], {}])
limits = st.fixed_dictionaries({"requests_per_s": numbers, "tokens_per_s": numbers},
                               optional={"burst_s": numbers, "priority": numbers,
                                         "nope": numbers})
pools = st.fixed_dictionaries({}, optional={"min_replicas": numbers, "max_replicas": numbers,
                                            "gpus": st.sampled_from([1, 2, 3, 4, 6, 9, None])})
shapes = st.fixed_dictionaries({}, optional={"n_heads": st.sampled_from([8, 6, 12, 1]),
                                             "n_kv_heads": st.sampled_from([2, 3, 8]),
                                             "nope": numbers}).map(lambda over: {**SHAPE, **over})


def _entry(map_key: str, fields: list[str], entries: Any) -> Any:
    """A key of an entry of ``map_key`` (or of one of its fields) and a value for it."""
    return st.one_of(
        st.tuples(names.map(lambda name: f"{map_key}.{name}"), entries | st.none()),
        st.tuples(names.map(lambda name: f"{map_key}.{name}"), scalars),
        st.tuples(st.tuples(names, st.sampled_from(fields or ["x"])).map(
            lambda named: f"{map_key}.{named[0]}.{named[1]}"), scalars),
        st.tuples(st.just(map_key), st.dictionaries(names, entries, max_size=3) | scalars))


changes = st.one_of(
    _entry("tenants", ["requests_per_s", "burst_s", "priority", "nope"], limits),
    _entry("gpu_prices_usd_per_hour", [], numbers),
    _entry("router_weights", [], numbers),
    _entry("autoscaler.pools", ["min_replicas", "max_replicas", "gpus"], pools),
    _entry("models", ["n_heads", "n_kv_heads"], shapes),
    st.tuples(st.sampled_from(["autoscaler.enabled", "autoscaler.target_utilisation",
                               "autoscaler.min_replicas", "autoscaler.max_replicas",
                               "shedding.kv_high", "shedding.low", "shedding.high",
                               "slo.ttft_slo_s", "slo.deadline_s", "routing_policy",
                               "retry_budget_ratio", "nope", "slo.nope", "tenants..burst_s",
                               "tenants.a.", "autoscaler", "shedding", "slo"]),
              scalars | st.booleans()),
)


def many_tenants(count: int) -> GovernorConfig:
    """A configuration of ``count`` tenants (``t-0``...)."""
    return GovernorConfig.model_validate({"tenants": {
        f"t-{n}": {"requests_per_s": 10.0, "tokens_per_s": 1e4} for n in range(count)}})


def tenants_looked_at(monkeypatch) -> list[str]:
    """Each tenant's limits dumped or validated from here on (the names; ``?`` for one dumped
    on its own)."""
    looked_at: list[str] = []
    validate, dump, dump_one = (GovernorConfig.model_validate_json, GovernorConfig.model_dump,
                                TenantLimit.model_dump)

    def validating(cls, data, **kwargs):
        looked_at.extend(json.loads(data).get("tenants", {}))
        return validate(data, **kwargs)

    def dumping(self, **kwargs):
        data = dump(self, **kwargs)
        looked_at.extend(data.get("tenants", {}))
        return data

    monkeypatch.setattr(GovernorConfig, "model_validate_json", classmethod(validating))
    monkeypatch.setattr(GovernorConfig, "model_dump", dumping)
    monkeypatch.setattr(TenantLimit, "model_dump",
                        lambda self, **kwargs: looked_at.append("?") or dump_one(self, **kwargs))
    return looked_at
