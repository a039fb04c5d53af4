"""The controllers process's pure part (``ControllersService.observe`` and ``tick``, what the
simulator drives too): what it keeps between ticks, and what it knows after a restart."""

from controllers.service import ControllersService
from schemas.config import GovernorConfig
from schemas.events import Rejected
from schemas.topics import TopicCatalog

T = 1_800_000_000_000


def _no_capacity(n: int, model: str) -> Rejected:
    return Rejected(event_time_ms=T, request_id=f"r{n}", model=model, reason="no_capacity",
                    retry_after_s=1.0)


def test_requests_held_for_want_of_a_worker_are_forgotten_without_the_autoscaler_too() -> None:
    service = ControllersService("unused:9092", TopicCatalog("t"))
    assert not service.autoscaler.config.enabled
    for n in range(1_000):  # clients choose the model names
        service.observe(_no_capacity(n, f"model-{n}"), T)
    service.tick(T + 1_000, restate=False)
    assert len(service._held) == 1_000
    service.tick(T + 31_000, restate=False)
    assert service._held == {}


def test_a_configured_pool_at_zero_is_woken_after_a_restart() -> None:
    """No worker of it heart-beats (it was scaled to zero before the restart): only the
    configuration names it."""
    config = GovernorConfig.model_validate({"autoscaler": {
        "enabled": True, "pools": {"h100@llama-3-8b": {"min_replicas": 0}}}})
    service = ControllersService("unused:9092", TopicCatalog("t"), config=config)
    scaled = []
    for k in range(20):  # 5 s of ticks, a request held for want of a worker each
        now = T + k * 250
        service.observe(_no_capacity(k, "llama-3-8b"), now)
        scaled += [(c.pool, c.replicas) for c in service.tick(now, restate=False)
                   if c.type == "scale_pool"]
    assert scaled and scaled[0] == ("h100@llama-3-8b", 1), scaled


def test_a_heartbeat_stamped_far_ahead_freezes_the_controllers_view_a_bounded_time() -> None:
    """One heartbeat an hour ahead of the controllers' clock (its host's clock stepped, then set
    right) made every later one look old, for the hour: a restart and a stop went unseen, so
    the breakers, shedding and the autoscaler kept the worker as it was. It counts as heard at
    most ``MAX_AHEAD_MS`` ahead."""
    from controllers.router.fleet import MAX_AHEAD_MS
    from schemas.events import WorkerStatus

    def status(at: int, started_ms: int = T, state: str = "warm") -> WorkerStatus:
        return WorkerStatus(event_time_ms=at, worker_id="w0", slot=0, pool="h100@llama-3-8b",
                            gpu_type="h100", models_loaded=["llama-3-8b"], started_ms=started_ms,
                            state=state, running=5)

    service = ControllersService("unused:9092", TopicCatalog("t"))
    service.observe(status(T), T)
    service.observe(status(T + 3_600_000), T + 1)
    t = T + 1 + MAX_AHEAD_MS + 1
    service.observe(status(t, started_ms=t - 100), t)  # started again
    assert service.breakers._workers["w0"].started_ms == t - 100
    service.observe(status(t + 500, started_ms=t - 100, state="stopped"), t + 500)
    assert service.fleet.alive(t + 500) == []
