"""``LiveConfig._set`` notes when each leaf a record sets was set by looking at the leaves under
the record's key and at those it changed, not at every leaf of the configuration: with 1,000
tenants configured that made each record cost 10 ms in every router and controllers process
(``python -m benchmarks.live_config_apply``). Its results are those of comparing every leaf."""

import random

import pytest

from controllers import live_config
from controllers.live_config import RESTORED_BY, LiveConfig, _leaves, _note, _sets
from schemas.config import MAP_KEYS, ConfigSet, map_entry

T0 = 1_700_000_000_000


class _EveryLeaf(LiveConfig):
    """The reference: ``_set`` comparing every leaf of the configuration before and after."""

    def _set(self, candidate, record, offset) -> None:
        key, leaves = record.key, _leaves(candidate.model_dump(mode="json"))
        before = _leaves(self._data)
        for path in leaves.keys() | before.keys():
            if _sets(key, path) or leaves.get(path, before) != before.get(path, before):
                located = map_entry(path)
                at = record.value_since_ms if located is None else \
                    record.entry_since_ms(located[1])
                _note(self._changed_ms, path, at)
                if record.set_by != RESTORED_BY:
                    self._set_offset[path] = offset
                if located is not None:
                    _note(self._entry_set_ms.setdefault(located[0], {}), located[1], at)
        for entry in record.entries_since_ms or {}:
            _note(self._entry_set_ms.setdefault(key, {}), entry, record.entry_since_ms(entry))
        for map_key in MAP_KEYS:
            if map_key == key or map_key.startswith(f"{key}."):
                _note(self._map_set_ms, map_key, record.value_since_ms)
        self._data = candidate.model_dump(mode="json")


def _record(rng: random.Random, at: int) -> ConfigSet:
    names = ["a", "b", "b.x", "c"]
    name = rng.choice(names)

    def limit() -> dict:
        return {"requests_per_s": rng.choice([1, 2]), "tokens_per_s": 1e6,
                "priority": rng.choice([0, 3])}
    key, value = rng.choice([
        ("tenants", {n: limit() for n in names if rng.random() < 0.6}),
        (f"tenants.{name}", limit() if rng.random() < 0.8 else None),
        (f"tenants.{name}.requests_per_s", rng.choice([4, 5])),
        ("shedding", {"high": rng.choice([0.5, 0.6]), "low": 0.3}),
        ("shedding.low", rng.choice([0.2, 0.3])),
        ("autoscaler", {"max_replicas": rng.choice([8, 16]),
                        "pools": {"h100@llama-3-8b": {"min_replicas": 0, "max_replicas": 2}}}),
        ("autoscaler.pools", rng.choice([{}, {"h100@llama-3-8b": {"min_replicas": 0,
                                                          "max_replicas": 4}}])),
        ("autoscaler.pools.a100@llama-3-8b", {"min_replicas": 0,
                                              "max_replicas": rng.choice([1, 2])}),
        ("gpu_prices_usd_per_hour.h100", rng.choice([3.0, 2.5])),
        ("retry_budget_ratio", rng.choice([0.1, 0.2])),
        ("tenants", "bad"),
    ])
    return ConfigSet(event_time_ms=at + rng.choice([0, -25]), key=key, value=value,
                     set_by=rng.choice(["operator", RESTORED_BY]))


@pytest.mark.parametrize("seed", range(200))
def test_random_histories_note_the_same_times_as_comparing_every_leaf(seed: int) -> None:
    rng = random.Random(seed)
    fast, reference = LiveConfig("router"), _EveryLeaf("router")
    for offset in range(rng.randint(3, 20)):
        record = _record(rng, T0 + 10 * offset)
        key = record.key.encode()
        verdicts = [live.apply(record, offset, T0, key).type for live in (fast, reference)]
        assert verdicts[0] == verdicts[1]
        for name in ("_changed_ms", "_entry_set_ms", "_map_set_ms", "_set_offset"):
            assert getattr(fast, name) == getattr(reference, name), (name, record)
        assert fast.to_restore(T0) == reference.to_restore(T0)


def test_one_tenant_s_record_looks_at_its_own_leaves_not_at_every_tenant_s(monkeypatch):
    live = LiveConfig("router")
    for n in range(200):
        live.apply(ConfigSet(event_time_ms=T0 + n, key=f"tenants.t-{n}", value={
            "requests_per_s": 10.0, "tokens_per_s": 1e4}), n, T0, f"tenants.t-{n}".encode())
    looked_at = []
    monkeypatch.setattr(live_config, "_leaves", lambda data, path="": looked_at.append(path) or
                        _leaves(data, path))
    live.apply(ConfigSet(event_time_ms=T0 + 300, key="tenants.t-7.requests_per_s", value=20.0),
               300, T0, b"tenants.t-7.requests_per_s")
    assert live.config.tenants["t-7"].requests_per_s == 20.0
    assert live._changed_ms["tenants.t-7.requests_per_s"] == T0 + 300
    assert len(looked_at) <= 10, f"{len(looked_at)} subtrees looked at, of 200 tenants"
