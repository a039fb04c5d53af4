"""A pool's tensor parallelism as the configuration declares it (``autoscaler.pools.<pool>.gpus``):
validated against its model, and what the autoscaler plans a pool at when its workers are not
alive to say, or say several degrees."""

import logging
import math

import pytest
from pydantic import ValidationError

from controllers.autoscaler import Autoscaler
from controllers.router.fleet import FleetView
from schemas.config import AutoscalerConfig, GovernorConfig, PoolBounds
from schemas.errors import one_line
from schemas.events import WorkerStatus

T = 1_800_000_000_000
POOL = "h100@llama-2-70b"


@pytest.mark.parametrize("gpus, says", [
    (0, f"autoscaler.pools.{POOL}.gpus: Input should be greater than or equal to 1"),
    (9, f"autoscaler.pools.{POOL}.gpus: Input should be less than or equal to 8"),
    (1, f"autoscaler.pools.{POOL}.gpus: tp 1: llama-2-70b does not fit on 1 h100 GPU (it needs "
        "tp 2 at least)"),
    (3, f"autoscaler.pools.{POOL}.gpus: tp 3 does not divide llama-2-70b's 64 attention heads"),
    (True, f"autoscaler.pools.{POOL}.gpus: Input should be a valid integer"),
])
def test_a_degree_out_of_range_or_one_its_model_cannot_run_at_is_refused_naming_it(gpus, says):
    with pytest.raises(ValidationError) as refused:
        GovernorConfig().with_setting(f"autoscaler.pools.{POOL}", {"gpus": gpus})
    assert says in one_line(refused.value)


def test_a_degree_is_checked_against_a_model_declared_beside_it_and_not_an_unknown_one():
    shape = {"params_b": 7, "n_layers": 32, "n_heads": 12, "n_kv_heads": 4, "head_dim": 128,
             "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256}
    config = GovernorConfig().with_setting("models.acme-7b", shape)
    with pytest.raises(ValidationError) as refused:
        config.with_setting("autoscaler.pools.h100@acme-7b", {"gpus": 8})
    assert "autoscaler.pools.h100@acme-7b.gpus: tp 8 does not divide acme-7b's 12 attention " \
        "heads" in one_line(refused.value)
    tp4 = config.with_setting("autoscaler.pools.h100@acme-7b", {"gpus": 4})
    assert tp4.autoscaler.pools["h100@acme-7b"].gpus == 4
    with pytest.raises(ValidationError, match="autoscaler.pools.h100@acme-7b.gpus: tp 4 does "
                                              "not divide acme-7b's 6 attention heads"):
        tp4.with_setting("models.acme-7b", {**shape, "n_heads": 6, "n_kv_heads": 2})
    # a model nobody declared yet: any degree from 1 to 8 (its name may be declared later)
    assert GovernorConfig().with_setting("autoscaler.pools.h100@someday-9b", {"gpus": 2}) \
        .autoscaler.pools["h100@someday-9b"].gpus == 2


def test_a_pool_without_a_degree_is_written_without_the_field():
    """An older reader forbids fields it does not know: a pool's bounds with no ``gpus`` are
    written (a restoring record of ``autoscaler.pools`` too) as before the field."""
    config = GovernorConfig().with_setting(f"autoscaler.pools.{POOL}", {"max_replicas": 4})
    assert config.setting(f"autoscaler.pools.{POOL}") == {"min_replicas": None, "max_replicas": 4}
    tp4 = config.with_setting(f"autoscaler.pools.{POOL}.gpus", 4)
    assert tp4.setting(f"autoscaler.pools.{POOL}") == {"min_replicas": None, "max_replicas": 4,
                                                        "gpus": 4}


def _configured(gpus: int | None, **degrees: int) -> Autoscaler:
    config = AutoscalerConfig(enabled=True, pools={POOL: PoolBounds(gpus=gpus)})
    return Autoscaler(config, prices={"h100": 3.0}, degrees={POOL: v for v in degrees.values()})


def _workers(*gpus: int, running: int = 0) -> FleetView:
    fleet = FleetView()
    for slot, n in enumerate(gpus):
        fleet.observe(WorkerStatus(event_time_ms=T, worker_id=f"w{slot}", slot=slot, pool=POOL,
                                   gpu_type="h100", gpus=n, models_loaded=["llama-2-70b"],
                                   running=running, started_ms=T))
    return fleet


def test_a_pool_with_no_worker_is_planned_at_the_degree_the_configuration_declares():
    """Production: the controllers run with no ``--pool-gpus``, an orchestrator starts TP-4
    workers as ``ScalePool`` asks. The pool at zero, woken by held requests, is sized, priced
    and cold-started at TP 4 (without the setting: TP 2, the least that holds the model)."""
    a = _configured(4)
    a.add_pool("h100", "llama-2-70b", 0)
    cap4 = a.capacity("h100", "llama-2-70b", 4)
    assert cap4 != a.capacity("h100", "llama-2-70b", 2)
    [command] = a.tick(T, FleetView(), held={"llama-2-70b": math.ceil(1.5 * cap4)})
    assert command.replicas == 2 and f"{cap4:.0f} sequences per h100 worker" in command.reason
    assert a._cost(a.pools[POOL]) == pytest.approx(4 * 3.0 / cap4)


def test_the_configured_degree_overrides_the_one_given_at_start_up_and_may_change_live():
    a = _configured(4, at_start=8)
    a.add_pool("h100", "llama-2-70b", 0)
    a.tick(T, FleetView())
    assert a.pools[POOL].gpus == 4
    a.config = AutoscalerConfig(enabled=True, pools={POOL: PoolBounds(max_replicas=3)})
    a.tick(T + 250, FleetView())
    assert a.pools[POOL].gpus == 8  # the setting removed: the fleet's at start-up


def test_live_workers_that_agree_override_the_declared_degree_warned_once(caplog):
    a = _configured(4)
    a.add_pool("h100", "llama-2-70b", 1)
    with caplog.at_level(logging.WARNING, logger="controllers.autoscaler"):
        for k in range(3):
            a.tick(T + k, _workers(2, 2))
    assert a.pools[POOL].gpus == 2
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == (f"autoscaler: pool {POOL}: its live workers run on 2 GPUs a worker (w0 2, "
                       "w1 2), declared 4: planned at 2")
    # gone: the next worker is the declared one's
    a.tick(T + 10_000, FleetView())
    assert a.pools[POOL].gpus == 4


def test_workers_of_several_degrees_are_planned_at_the_declared_one_else_the_largest(caplog):
    """Workers started by hand with ``--tp 2`` and ``--tp 4`` join one pool: planned at the
    degree declared for the workers the autoscaler asks for, else at the largest reported, and
    said once, naming each worker's degree."""
    declared, undeclared = _configured(2), Autoscaler(AutoscalerConfig(enabled=True),
                                                      prices={"h100": 3.0})
    with caplog.at_level(logging.WARNING, logger="controllers.autoscaler"):
        for a in (declared, undeclared):
            a.add_pool("h100", "llama-2-70b", 2)
            for k in range(3):
                a.tick(T + k, _workers(4, 2))
    assert (declared.pools[POOL].gpus, undeclared.pools[POOL].gpus) == (2, 4)
    assert [r.getMessage() for r in caplog.records] == [
        f"autoscaler: pool {POOL}: its live workers run on 2 and 4 GPUs a worker (w1 2, w0 4), "
        "declared 2: planned at 2",
        f"autoscaler: pool {POOL}: its live workers run on 2 and 4 GPUs a worker (w1 2, w0 4), "
        f"none declared (autoscaler.pools.{POOL}.gpus): planned at 4"]
