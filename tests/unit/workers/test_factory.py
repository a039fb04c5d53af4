"""Building an engine by name: what a worker refuses to start with, and how it says so."""

import pytest

from schemas.config import ModelShape
from schemas.errors import TerminalError
from workers.factory import build_engine
from workers.sim import models

SHAPE = ModelShape(params_b=13.0, n_layers=40, n_heads=40, n_kv_heads=40, head_dim=128,
                   hidden_size=5120, intermediate_size=13824, vocab_size=32000)


def test_a_sim_engine_of_an_unknown_model_says_how_to_declare_one():
    with pytest.raises(TerminalError, match=r"unknown model 'nosuch-13b'.*config set "
                                            r"'models\.NAME=\{\.\.\.\}'"):
        build_engine("sim", model="nosuch-13b")


def test_a_sim_engine_runs_a_declared_model_and_a_too_large_one_gets_no_declaring_hint():
    models.configure_models({"nosuch-13b": SHAPE})
    try:
        engine = build_engine("sim", model="nosuch-13b")
        assert engine.perf.model.name == "nosuch-13b"
    finally:
        models.configure_models({})
    with pytest.raises(TerminalError) as too_large:
        build_engine("sim", model="llama-2-70b")
    assert "does not fit on 1 x h100" in str(too_large.value)
    assert "config set" not in str(too_large.value)
