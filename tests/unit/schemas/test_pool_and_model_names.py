"""A pool's and a model's names are ones a configuration key can address, as a tenant's are
(``test_tenant_names.py``): ``autoscaler.pools.h100@foo.gpus`` is pool ``h100@foo``'s ``gpus``
and ``models.foo.n_heads`` model ``foo``'s ``n_heads``, so a pool named ``h100@foo.gpus`` or a
model named ``foo.n_heads`` could be set only whole. Such a name is refused where pools and
models are given settings: ``autoscaler.pools``, and ``models`` (a model there named as a field
of a pool's bounds, ``foo.gpus``, too: its pools' key would read so). Before 6 Dec (evening)
both took it. ``router_weights`` and ``gpu_prices_usd_per_hour`` map names to plain numbers:
their entries have no fields, so every key under them names an entry, dots and all."""

import pytest
from pydantic import ValidationError

from schemas.config import GovernorConfig, ModelShape, PoolBounds

SHAPE = {"params_b": 8, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128,
         "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}
POOL_FIELDS = list(PoolBounds.model_fields)


@pytest.mark.parametrize("field", POOL_FIELDS)
def test_a_pool_named_as_a_field_of_another_is_refused(field) -> None:
    name = f"h100@foo.{field}"
    with pytest.raises(ValidationError) as info:
        GovernorConfig().with_setting("autoscaler.pools", {name: {"max_replicas": 2}})
    said = str(info.value)
    assert f"pool name {name!r} ends in '.{field}', a field of a pool's bounds: the key " \
           f"autoscaler.pools.{name} names the {field} of pool 'h100@foo'" in said, said


@pytest.mark.parametrize("name", [f"foo.{field}" for field in POOL_FIELDS + ["n_heads"]]
                         + ["org.team.max_model_len"])
def test_a_model_named_as_a_field_of_a_pool_or_a_model_is_refused(name) -> None:
    entry, _, field = name.rpartition(".")
    with pytest.raises(ValidationError) as info:
        GovernorConfig().with_setting("models", {name: SHAPE})
    said = str(info.value)
    assert f"model name {name!r} ends in '.{field}', a field of" in said, said
    key = (f"autoscaler.pools.GPU@{name} names the {field} of pool 'GPU@{entry}'"
           if field in POOL_FIELDS else f"models.{name} names the {field} of model {entry!r}")
    assert key in said, said


@pytest.mark.parametrize("model", ["llama-3.1-8b", "foo.gpus2", "gpus", "foo.n_head",
                                   "org/foo.min"])
def test_other_dotted_names_are_taken_and_addressed_by_their_key(model) -> None:
    config = GovernorConfig().with_setting(f"models.{model}", SHAPE)
    pool = f"h100@{model}"
    config = config.with_setting(f"autoscaler.pools.{pool}", {"max_replicas": 4})
    config = config.with_setting(f"autoscaler.pools.{pool}.min_replicas", 1)
    assert config.autoscaler.pools[pool] == PoolBounds(min_replicas=1, max_replicas=4)
    assert config.with_setting(f"models.{model}.n_layers", 40).models[model].n_layers == 40


@pytest.mark.parametrize("key", ["router_weights", "gpu_prices_usd_per_hour"])
def test_a_map_of_numbers_names_an_entry_dots_and_all(key) -> None:
    """No ambiguity to refuse: a number has no fields, so ``KEY.a.gpus`` is entry ``a.gpus``."""
    config = GovernorConfig().with_setting(f"{key}.a.gpus", 2.0)
    assert config.setting(key)["a.gpus"] == 2.0 and "a" not in config.setting(key)


def test_a_model_shape_has_no_field_named_as_a_pool_bound() -> None:
    """(Else ``models.foo.gpus`` and ``autoscaler.pools.GPU@foo.gpus`` would read alike.)"""
    assert not set(ModelShape.model_fields) & set(POOL_FIELDS)
