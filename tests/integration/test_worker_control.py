"""A worker process obeys its commands (drain, wake, load a model), dead-letters one it cannot
carry out (a model it does not know), exports vLLM-named metrics, and on SIGTERM hands back what
it could not finish without committing it."""

import asyncio
import signal
import socket
import urllib.request

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import now_ms
from infra.stack import PoolSpec, Stack
from schemas import commands
from schemas.codec import decode
from schemas.events import Completed, RequestEvent, Requeued, Started
from schemas.requests import Dispatch, InferenceRequest
from tests.integration.worker_support import Observer, command

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dispatch(rid: str, max_tokens: int) -> Dispatch:
    t = now_ms()
    request = InferenceRequest(event_time_ms=t, created_ms=t, request_id=rid, prompt_tokens=512,
                               max_tokens=max_tokens)
    return Dispatch(event_time_ms=t, request=request, worker_id="worker-0", slot=0)


async def _dead_lettered_by(bootstrap, catalog, consumer: str, timeout_s: float = 30):
    """The first dead letter ``consumer`` sent."""
    reader = AIOKafkaConsumer(catalog.deadletter, bootstrap_servers=bootstrap,
                              auto_offset_reset="earliest")
    await reader.start()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                for records in (await reader.getmany(timeout_ms=200)).values():
                    for record in records:
                        letter = decode(catalog.spec(catalog.deadletter), record.value)
                        if letter.consumer == consumer:
                            return letter
    finally:
        await reader.stop()


async def _commands_scenario(bootstrap, catalog, metrics_port):
    async with Observer(bootstrap, catalog) as obs:
        await obs.until(lambda: obs.state() == "warm")
        await obs.command(command(commands.DrainWorker, reason="test drain"))
        await obs.until(lambda: obs.state() == "draining")
        await obs.dispatch(_dispatch("held", 8))
        seen = len(obs.statuses)
        # Three more heartbeats while draining: the dispatch waits in the partition, untouched.
        await obs.until(lambda: len(obs.statuses) >= seen + 3)
        started_while_draining = obs.has(Started, "held")
        await obs.command(command(commands.SleepWorker, level=0, reason="wake"))
        await obs.until(lambda: obs.has(Completed, "held"))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
        await obs.command(command(commands.LoadModel, model="no-such-model", reason="typo"))
        refused = await _dead_lettered_by(bootstrap, catalog, "worker-0")
        await obs.command(command(commands.LoadModel, model="llama-2-7b", reason="switch"))
        await obs.until(lambda: obs.statuses[-1].models_loaded == ["llama-2-7b"])
        states_after_load = [s.state for s in obs.statuses if s.models_loaded == ["llama-2-7b"]]
        await obs.until(lambda: obs.state() == "warm" and obs.statuses[-1].models_loaded == ["llama-2-7b"])
        return started_while_draining, metrics, states_after_load, refused


def test_drain_wake_and_model_load_commands_and_metrics(kafka_bootstrap, catalog, tmp_path):
    port = _free_port()
    # Speedup 10 makes the cold start of the model switch (about 27 s of engine time) quick.
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  speedup=10, with_router=False, extra_worker_args=("--metrics-port", str(port)))
    stack.start()
    try:
        started_while_draining, metrics, states, refused = asyncio.run(
            _commands_scenario(kafka_bootstrap, catalog, port))
    finally:
        stack.stop()
    assert not started_while_draining
    assert 'vllm:request_success_total{finished_reason="length",model_name="llama-3-8b"} 1.0' in metrics
    # (one inter-token latency a token after the first of the 8)
    assert 'vllm:inter_token_latency_seconds_count{model_name="llama-3-8b"} 7.0' in metrics
    # Governor's own: what it emitted, its terminal events by reason (until 6 Dec a worker
    # served vLLM's names alone, and the requests it failed were counted by reason nowhere)
    assert 'governor_requests_ended_total{reason="length",type="completed"} 1.0' in metrics
    assert 'governor_messages_emitted_total{type="started"} 1.0' in metrics
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count"):
        assert name in metrics
    assert states[0] == "loading"
    # (before 7 Dec only the worker's log said so: `report actions` showed it as held)
    assert (refused.source_topic, refused.reason) == (catalog.control, "unprocessable")
    assert refused.error.startswith("worker worker-0 cannot load no-such-model: unknown model")


async def _sigterm_scenario(bootstrap, catalog, stack):
    async with Observer(bootstrap, catalog) as obs:
        await obs.until(lambda: obs.state() == "warm")
        dispatches = [_dispatch("short", 4), _dispatch("long", 20_000)]
        for dispatch in dispatches:
            await obs.dispatch(dispatch)
        await obs.until(lambda: obs.has(Completed, "short") and obs.has(Started, "long"))
        await obs.until(lambda: obs.statuses[-1].running == 1)
        stack.processes["worker-0"].send_signal(signal.SIGTERM)
        await obs.until(lambda: obs.state() == "stopped")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{catalog.namespace}.worker-0")
    await consumer.start()
    try:
        committed = await consumer.committed(TopicPartition(catalog.dispatch, 0))
    finally:
        await consumer.stop()
    created = {d.request.request_id: d.request.created_ms for d in dispatches}
    return obs.events, committed, created, [status.state for status in obs.statuses]


def test_sigterm_hands_back_unfinished_requests_uncommitted(kafka_bootstrap, catalog, tmp_path):
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  with_router=False, extra_worker_args=("--drain-timeout-s", "1"))
    stack.start()
    try:
        events, committed, created, states = asyncio.run(
            _sigterm_scenario(kafka_bootstrap, catalog, stack))
        assert stack.processes["worker-0"].wait(timeout=30) == 0
    finally:
        stack.stop()
    # It heart-beats while it drains (else the router would take it for dead after 3 s).
    assert "draining" in states and states[-1] == "stopped"
    requeued = [e for e in events if isinstance(e, Requeued)]
    assert [e.request_id for e in requeued] == ["long"]
    assert 0 < requeued[0].tokens_done < 20_000
    # Each lifecycle event carries its request's created_ms (the analytics rollup's key).
    lifecycle = [e for e in events if isinstance(e, RequestEvent)]
    assert {type(e).__name__ for e in lifecycle} >= {"Started", "Completed", "Requeued"}
    assert {(e.request_id, e.created_ms) for e in lifecycle} == set(created.items())
    # "short" (offset 0) is committed; "long" (offset 1) is not, so it will be read again.
    assert committed == 1


async def _declared_model_scenario(bootstrap, catalog):
    from infra.config_cli import set_setting

    async with Observer(bootstrap, catalog) as obs:
        await obs.until(lambda: obs.state() == "warm")
        await set_setting(bootstrap, catalog, "models.mine-13b", {
            "params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40, "head_dim": 128,
            "hidden_size": 5120, "intermediate_size": 13824, "vocab_size": 32000})
        await obs.command(command(commands.LoadModel, model="mine-13b", reason="declared"))
        await obs.until(lambda: obs.statuses[-1].models_loaded == ["mine-13b"])
        return obs.statuses[-1]


def test_a_worker_of_a_built_in_model_loads_a_model_declared_since_it_started(
        kafka_bootstrap, catalog, tmp_path):
    """It read the configuration only for a model of its own not built in: one declared while
    it ran (``governor config set models.NAME``), which ``governor command load_model`` lets
    pass, it refused as unknown, dead-lettered (until 7 Dec)."""
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path,
                  speedup=10, with_router=False)
    stack.start()
    try:
        status = asyncio.run(_declared_model_scenario(kafka_bootstrap, catalog))
    finally:
        stack.stop()
    assert status.pool == "h100@mine-13b"
