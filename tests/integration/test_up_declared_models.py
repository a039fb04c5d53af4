"""``governor up`` serves a model the configuration declares (the setting ``models``): before
6 Dec it refused every model not built in before reading the configuration, though the workers
and the router it starts take a declared one. The real CLI on the real broker; the stack's
start (``run_up``) is recorded instead of run."""

import json

import pytest
from typer.testing import CliRunner

import infra.up
from infra import cli
from infra.stack import PoolSpec, parse_fleet
from schemas.errors import GovernorError
from workers.sim import models

pytestmark = pytest.mark.integration

SHAPE = {"params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40, "head_dim": 128,
         "hidden_size": 5120, "intermediate_size": 13824, "vocab_size": 32000}


@pytest.fixture
def started(monkeypatch, tmp_path):
    """The fleets ``up`` would have started."""
    fleets = []

    async def run_up(address, namespace, fleet, *args, **kwargs):
        fleets.append(fleet)

    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.up, "run_up", run_up)
    monkeypatch.chdir(tmp_path)
    yield fleets
    models.configure_models({})  # (the declared shape is process-wide)


def _up(kafka_bootstrap, catalog, fleet, *more):
    return CliRunner().invoke(cli.app, ["up", "--bootstrap", kafka_bootstrap, "--namespace",
                                        catalog.namespace, "--fleet", fleet, *more])


def test_up_serves_a_model_once_the_configuration_declares_it(kafka_bootstrap, catalog,
                                                                started):
    refused = _up(kafka_bootstrap, catalog, "h100:1@nosuch-13b")
    assert isinstance(refused.exception, GovernorError) and started == []
    assert str(refused.exception).startswith("unknown model 'nosuch-13b'")
    assert "governor config set models.NAME" in str(refused.exception)

    declared = CliRunner().invoke(cli.app, [
        "config", "set", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
        "models.nosuch-13b", json.dumps(SHAPE)])
    assert declared.exit_code == 0, declared.output
    result = _up(kafka_bootstrap, catalog, "h100:1@nosuch-13b,a100:1")
    assert result.exit_code == 0, result.output
    assert started == ["h100:1@nosuch-13b,a100:1"]


def test_up_runs_a_declared_model_on_the_gpus_a_worker_of_it_needs(kafka_bootstrap, catalog,
                                                                   started):
    """A declared 200B model holds on eight H100s at the least: a pool of one H100 is refused,
    naming the degree (before 6 Dec, every worker was one GPU and the model was refused as not
    fitting one), and a pool of eight is one worker of eight GPUs."""
    huge = SHAPE | {"params_b": 200.0}
    declared = CliRunner().invoke(cli.app, [
        "config", "set", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
        "models.nosuch-200b", json.dumps(huge)])
    assert declared.exit_code == 0, declared.output
    refused = _up(kafka_bootstrap, catalog, "h100:1@nosuch-200b")
    assert isinstance(refused.exception, GovernorError) and started == []
    assert str(refused.exception) == (
        "pool h100@nosuch-200b: nosuch-200b runs on 8 h100 GPUs a worker (the least tensor "
        "parallelism that holds it), and 1 GPU is not a multiple of 8")
    result = _up(kafka_bootstrap, catalog, "h100:8@nosuch-200b")
    assert result.exit_code == 0, result.output
    assert started == ["h100:8@nosuch-200b"]
    assert parse_fleet("h100:8@nosuch-200b") == [PoolSpec("h100", 1, "nosuch-200b", tp=8)]


SEVENTY_B = {"params_b": 69.0, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "head_dim": 128,
             "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 32000}


def test_up_counts_the_workers_of_a_declared_model_at_its_degree(kafka_bootstrap, catalog,
                                                                  started):
    """A declared 70B-class model holds on two H100s: 64 H100s of it are 32 workers, which a
    local stack has room for (before 6 Dec ``up`` counted them as 64 workers, one GPU each,
    before reading the configuration, and refused the fleet); 66 are 33, one too many. A
    degree the fleet names for it is checked against its shape once it is read."""
    declared = CliRunner().invoke(cli.app, [
        "config", "set", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
        "models.nosuch-70b", json.dumps(SEVENTY_B)])
    assert declared.exit_code == 0, declared.output
    models.configure_models({})  # (as a new ``governor up`` process knows it: not yet)
    result = _up(kafka_bootstrap, catalog, "h100:64@nosuch-70b")
    assert result.exit_code == 0, result.output
    assert started == ["h100:64@nosuch-70b"]
    models.configure_models({})
    too_many = _up(kafka_bootstrap, catalog, "h100:66@nosuch-70b")
    assert isinstance(too_many.exception, GovernorError), too_many.output
    assert str(too_many.exception) == ("--fleet h100:66@nosuch-70b has 33 workers; a local "
                                       "stack has at most 32, one per partition of the "
                                       "dispatch topic")
    models.configure_models({})
    named = _up(kafka_bootstrap, catalog, "h100:128/tp4@nosuch-70b")
    assert named.exit_code == 0, named.output
    models.configure_models({})
    bad = _up(kafka_bootstrap, catalog, "h100:6/tp6@nosuch-70b")
    assert str(bad.exception) == ("pool h100@nosuch-70b: tp 6 does not divide nosuch-70b's 64 "
                                  "attention heads (vLLM refuses it)")
    assert started == ["h100:64@nosuch-70b", "h100:128/tp4@nosuch-70b"]
