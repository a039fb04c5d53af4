"""Models declared in the configuration (``GovernorConfig.models``): the router and the
controllers predict them by their own shape; a built-in name or a bad shape is refused."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from controllers.live_config import LiveConfig
from controllers.router.candidates import perf_model
from controllers.router.core import RouterCore
from controllers.service import ControllersService
from schemas.config import ConfigSet, GovernorConfig, ModelShape
from schemas.events import ConfigApplied, ConfigRejected
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000
#: Llama-2-13B's config.json.
SHAPE = dict(params_b=13.0, n_layers=40, n_heads=40, n_kv_heads=40, head_dim=128,
             hidden_size=5120, intermediate_size=13824, vocab_size=32000)


@pytest.fixture(autouse=True)
def _no_models_declared_after():
    yield
    RouterCore(GovernorConfig())  # (the declared models are the process's: reset them)


def test_the_router_predicts_a_declared_model_by_its_shape_and_forgets_it_when_undeclared(caplog):
    RouterCore(GovernorConfig(models={"Llama-2-13B": ModelShape(**SHAPE)}))
    declared = perf_model("h100", "llama-2-13b")
    assert declared.model.name == "llama-2-13b" and declared.model.n_layers == 40
    assert declared.prefill_s(4000) > 1.3 * perf_model("h100", "llama-3-8b").prefill_s(4000)
    RouterCore(GovernorConfig())
    with caplog.at_level(logging.WARNING, logger="controllers.router.candidates"):
        fallback = perf_model("h100", "llama-2-13b")
    assert fallback.model.name == "llama-3-8b"  # an unknown model, said in the log
    assert "unknown model 'llama-2-13b'" in caplog.text and "predicted as llama-3-8b" in caplog.text


def test_a_built_in_name_is_refused_and_the_models_declared_stay():
    core = RouterCore(GovernorConfig(models={"llama-2-13b": ModelShape(**SHAPE)}))
    with pytest.raises(ValueError, match="models.llama-3-8b: llama-3-8b is built in"):
        core.apply_config(GovernorConfig(models={"llama-3-8b": ModelShape(**SHAPE)}))
    assert perf_model("h100", "llama-2-13b").model.name == "llama-2-13b"


def test_a_shape_whose_kv_heads_do_not_divide_its_heads_names_them():
    with pytest.raises(ValidationError, match=r"n_kv_heads \(3\) must divide n_heads \(40\)"):
        ModelShape(**{**SHAPE, "n_kv_heads": 3})
    with pytest.raises(ValidationError, match="n_layers"):
        GovernorConfig().with_setting("models.m", {**SHAPE, "n_layers": 0})
    one_field = GovernorConfig().with_setting("models.m", SHAPE).with_setting("models.m.n_layers", 48)
    assert one_field.models["m"].n_layers == 48


@pytest.mark.parametrize("component", ["router", "controllers"])
def test_live_config_rejects_a_built_in_name_with_its_reason(component: str):
    if component == "router":
        live = LiveConfig("router-0", check=RouterCore(GovernorConfig()).apply_config)
    else:
        live = ControllersService("127.0.0.1:1", TopicCatalog("t")).live_config
    bad = live.apply(ConfigSet(event_time_ms=T0, key="models.llama-2-7b", value=SHAPE), 1, T0)
    assert isinstance(bad, ConfigRejected) and "llama-2-7b is built in" in bad.reason
    good = live.apply(ConfigSet(event_time_ms=T0, key="models.my-13b", value=SHAPE), 2, T0)
    assert isinstance(good, ConfigApplied) and live.config.models["my-13b"].n_heads == 40


def test_a_model_too_large_for_one_gpu_is_predicted_at_the_least_tensor_parallelism_that_holds_it():
    big = {**SHAPE, "params_b": 60.0, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
           "hidden_size": 8192, "intermediate_size": 28672}
    RouterCore(GovernorConfig(models={"my-70b": ModelShape(**big)}))
    perf = perf_model("h100", "my-70b")  # 120 GB of weights: not on one 80 GB H100
    assert (perf.model.name, perf.tp) == ("my-70b", 2) and perf.kv_capacity_tokens() > 0
    assert perf_model("h200", "my-70b").tp == 1  # one 141 GB H200 holds it
    built_in = perf_model("h100", "llama-2-70b")
    assert (built_in.model.name, built_in.tp) == ("llama-2-70b", 2)


def test_a_model_no_gpu_holds_even_at_the_largest_tensor_parallelism_is_refused():
    huge = {**SHAPE, "params_b": 900.0}
    with pytest.raises(ValueError, match=r"models.huge: its weights \(1,800 GB\) leave no room "
                                         r"for KV cache on 8 of any GPU known"):
        RouterCore(GovernorConfig()).apply_config(
            GovernorConfig(models={"huge": ModelShape(**huge)}))
    live = LiveConfig("router-0", check=RouterCore(GovernorConfig()).apply_config)
    bad = live.apply(ConfigSet(event_time_ms=T0, key="models.huge", value=huge), 1, T0)
    assert isinstance(bad, ConfigRejected) and "leave no room for KV cache" in bad.reason


def test_a_declared_model_may_give_its_context_and_its_engines_serve_up_to_it():
    from workers.sim.engine import SimEngine, SimEngineConfig

    RouterCore(GovernorConfig(models={"my-32k": ModelShape(**SHAPE, max_model_len=32_768),
                                      "my-open": ModelShape(**SHAPE)}))
    assert SimEngine(perf_model("h100", "my-32k"), SimEngineConfig()).max_model_len == 32_768
    assert SimEngine(perf_model("h100", "my-open"), SimEngineConfig()).max_model_len is None
    with pytest.raises(ValueError, match="max_model_len"):
        ModelShape(**SHAPE, max_model_len=8)  # (at least 16)
