"""The long-running commands refuse a wrong setup with a clear message and exit status 2: a
namespace whose topics do not exist (not a 40 s timeout and a traceback), and two routers run
under one id (each would take the other's placements for its own: one that finds the other in
the group stops, usually both). Real CLI
processes on the real broker."""

import signal
import subprocess
import sys
import time
import uuid

import pytest

from cli_support import output_until

pytestmark = pytest.mark.integration


def _governor(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "infra.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", [["router"], ["controllers"], ["worker", "--slot", "0"],
                                     ["sink", "--no-sql"], ["streams"]])
def test_a_service_on_a_namespace_without_topics_says_how_to_create_them(kafka_bootstrap,
                                                                           command):
    namespace = f"none-{uuid.uuid4().hex[:8]}"
    proc = _governor(*command, "--bootstrap", kafka_bootstrap, "--namespace", namespace)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # not left running for the rest of the session
        proc.communicate()
        raise
    assert proc.returncode == 2, out[-2000:]
    assert f"of the topics of namespace '{namespace}' do not exist" in " ".join(out.split())
    assert (f"governor topics create --bootstrap {kafka_bootstrap} --namespace {namespace}"
            in " ".join(out.split()))


@pytest.mark.parametrize(("command", "line"), [
    (["router"], "router router-0: serving {ns}.requests on {bootstrap} (partitions [0, 1, 2, 3])"),
    (["worker", "--slot", "1"],
     "worker worker-1 (h100@llama-3-8b): serving {ns}.dispatch on {bootstrap} (slot 1)"),
    (["controllers"], "controllers: serving {ns}.telemetry on {bootstrap} (tick 0.25 s)"),
    (["streams"], "streams: serving {ns}.telemetry on {bootstrap} (signals to {ns}.signals)"),
    (["sink", "--no-sql"], "sink: serving namespace {ns} on {bootstrap} (into "),
], ids=["router", "worker", "controllers", "streams", "sink"])
def test_a_service_says_once_it_serves_at_the_default_log_level(kafka_bootstrap, catalog,
                                                                 tmp_path, command, line):
    """Before, a router or a worker started by hand printed nothing at WARNING: no sign it
    was up."""
    expected = line.format(ns=catalog.namespace, bootstrap=kafka_bootstrap)
    lines = output_until(["--log-level", "WARNING", *command, "--bootstrap", kafka_bootstrap,
                          "--namespace", catalog.namespace],
                         lambda lines: any(expected in said for said in lines),
                         cwd=tmp_path)  # (the sink's data directory: under it)
    assert sum(": serving " in said for said in lines) == 1, "".join(lines)[-3000:]
    assert not any(": connecting to " in said for said in lines)  # (a server's sink only)


def test_two_routers_under_one_id_do_not_both_run_on(kafka_bootstrap, catalog):
    args = ("router", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
            "--router-id", "router-0", "--recovery-window-s", "0")
    procs = [_governor(*args), _governor(*args)]
    try:
        deadline = time.monotonic() + 90
        while all(proc.poll() is None for proc in procs):  # one stops (both, usually)
            assert time.monotonic() < deadline, "neither router stopped"
            time.sleep(0.1)  # polls the processes with a deadline
        for proc in procs:  # the other stops too (usually), or is left alone under the id
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:  # alone: the only router under the id, it runs on
                proc.send_signal(signal.SIGTERM)
        outs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    said = ["2 routers run under the id 'router-0'" in " ".join(out.split()) for out in outs]
    assert 2 in [proc.returncode for proc in procs], outs
    for proc, out, told in zip(procs, outs, said, strict=True):
        assert proc.returncode == (2 if told else 0), out[-2000:]


def test_a_second_worker_on_a_slot_in_use_is_refused_and_says_nothing(kafka_bootstrap, catalog):
    """Both would read the slot's partition and run each dispatch: every request answered
    twice. The second refuses the slot before it heart-beats (a "stopped" status of its own
    would have the router take the first one's requests for lost)."""
    import asyncio

    from tests.integration.worker_support import Observer

    args = ("worker", "--slot", "0", "--bootstrap", kafka_bootstrap, "--namespace",
            catalog.namespace)
    first = _governor(*args, "--gpu", "h100")
    second = None
    try:
        async def first_heard() -> Observer:
            async with Observer(kafka_bootstrap, catalog) as observer:
                await observer.until(lambda: observer.statuses, timeout_s=60)
                return observer

        started_ms = asyncio.run(first_heard()).statuses[0].started_ms
        second = _governor(*args, "--gpu", "a100")
        out, _ = second.communicate(timeout=60)
        assert second.returncode == 2, out[-2000:]
        assert "worker-0 already runs on --slot 0 (h100@llama-3-8b" in " ".join(out.split())
        assert first.poll() is None  # the first serves on

        async def statuses() -> list:
            async with Observer(kafka_bootstrap, catalog) as observer:
                await observer.until(lambda: len(observer.statuses) >= 10, timeout_s=60)
                return observer.statuses

        assert {s.started_ms for s in asyncio.run(statuses())} == {started_ms}
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_the_hint_to_create_missing_topics_names_the_broker_it_was_given(kafka_bootstrap):
    """Before, `config get --bootstrap H:P --namespace ns` on a namespace without topics said
    `create them with governor topics create --namespace ns`: run as printed, that went to the
    default broker, 127.0.0.1:9092, not the one the user named."""
    namespace = f"none-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([sys.executable, "-m", "infra.cli", "config", "get", "--bootstrap",
                           kafka_bootstrap, "--namespace", namespace], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said[-2000:]
    assert "Traceback" not in said
    assert (f"`governor topics create --bootstrap {kafka_bootstrap} --namespace {namespace}`"
            in said), said[-2000:]
