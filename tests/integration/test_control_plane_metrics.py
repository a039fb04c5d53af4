"""``governor router``, ``controllers`` and ``sink`` serve Prometheus metrics of what they do
(``--metrics-port``): real CLI processes on the real broker, scraped over HTTP."""

import asyncio
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from infra.bus import now_ms
from schemas.codec import encode
from schemas.requests import InferenceRequest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _families(port: int) -> list:
    """The metric families the endpoint serves; none while it does not answer (within 5 s: a
    component stalled by a loaded machine is asked again)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return []
    return list(text_string_to_metric_families(text))


def _samples(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample the endpoint serves, by name and labels; empty while it does not answer."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in _families(port) for s in family.samples}


def _until(condition, what: str, procs: list[subprocess.Popen], timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[3]} exited: {proc.communicate()[0][-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # polls the endpoint until a deadline
    return found


async def _send(bootstrap: str, topic: str, request: InferenceRequest | bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        if isinstance(request, bytes):  # (a bad record)
            await producer.send_and_wait(topic, request, key=b"bad")
        else:
            await producer.send_and_wait(topic, encode(request), key=request.request_id.encode())
    finally:
        await producer.stop()


def test_router_controllers_and_sink_serve_metrics_of_what_they_do(kafka_bootstrap, catalog,
                                                                   tmp_path):
    router_port, controllers_port, sink_port = _free_port(), _free_port(), _free_port()
    common = ["--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "infra.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL) for args in (
            ["router", *common, "--metrics-port", str(router_port), "--no-worker-wait-s", "0",
             "--recovery-window-s", "0"],
            ["controllers", *common, "--metrics-port", str(controllers_port)],
            ["sink", *common, "--metrics-port", str(sink_port), "--no-sql", "--data-dir",
             str(tmp_path / "analytics")])]
    try:
        # No model is served: once the controllers have ticked, the only load-shed level is
        # every model's 0, sent as they start (each model's level is its own), and nothing is
        # shed. (Before the first tick the family is listed with no sample.)
        served = _until(lambda: _families(controllers_port), "the controllers' metrics", procs)
        assert "governor_load_shed_level" in {f.name for f in served}
        levels = _until(lambda: {key: value for key, value in _samples(controllers_port).items()
                                 if key[0] == "governor_load_shed_level"},
                        "the controllers' first load-shed level", procs)
        assert levels == {("governor_load_shed_level", (("model", "*"),)): 0.0}
        # A bad record on the telemetry topic, which the controllers read: dead-lettered, and
        # counted by topic and reason (until 6 Dec only logged)
        asyncio.run(_send(kafka_bootstrap, catalog.telemetry, b"{bad"))
        dead = ("governor_dead_letters_total", (("reason", "undecodable"),
                                                ("topic", catalog.telemetry)))
        assert _until(lambda: _samples(controllers_port).get(dead), "the controllers' dead letter",
                      procs) == 1.0
        # No worker serves the model: the router refuses the request at once (no wait).
        idle = _until(lambda: (s := _samples(router_port)) and ("governor_router_in_flight", ())
                      in s and s, "the router's metrics", procs)  # (it may start after them)
        assert idle[("governor_router_in_flight", ())] == 0.0
        t = now_ms()
        asyncio.run(_send(kafka_bootstrap, catalog.requests, InferenceRequest(
            event_time_ms=t, created_ms=t, request_id="metrics-1", prompt_tokens=16,
            max_tokens=4)))
        router = _until(
            lambda: (s := _samples(router_port)).get(
                ("governor_requests_ended_total", (("reason", "no_capacity"),
                                                   ("type", "rejected")))) and s,
            "the router's rejection", procs)
        assert router[("governor_requests_ended_total", (("reason", "no_capacity"),
                                                         ("type", "rejected")))] == 1.0
        assert ("governor_router_dispatches_total", (("attempt", "first"),)) not in router
        # the sink lands the request and its rejection (and the controllers' commands)
        sink = _until(lambda: (s := _samples(sink_port)).get(
            ("governor_sink_rows_written_total", ())) and s, "the sink's rows", procs)
        assert sink[("governor_sink_records_total", ())] >= 2
        assert sink[("governor_sink_partitions", ())] > 0
        assert sink[("governor_sink_store_ok", ())] == 1.0
        assert sink[("governor_sink_last_flush_timestamp_seconds", ())] > 0
        assert ("governor_sink_pending_records", ()) in sink
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
