"""Two Faust workers on the real broker compute the signals of a known synthetic telemetry stream
exactly as the in-memory pipeline does; SIGKILLing one of them mid-stream loses no window or task
state (the other takes its partitions over from the changelogs) and counts nothing twice."""

import asyncio
import time
from pathlib import Path

import pytest

from schemas.events import ConfigApplied, ConfigRejected
from streams.pipeline import Pipeline
from streams.synthetic import synthetic_telemetry
from streams_support import (
    SignalsReader, differences, matches, produce, rebalance_lines, start_streams_worker, stop,
    wait_for_members,
)

pytestmark = pytest.mark.integration

REQUESTS = 240


async def _scenario(bootstrap, catalog, procs, tmp_path):
    start_ms = int(time.time() * 1000) - 20_000
    messages, counts = synthetic_telemetry(start_ms, REQUESTS, workers=4, spacing_ms=40)
    half = len(messages) // 2
    # The router's and the controllers' word on a config record share the telemetry topic: no
    # signal of their own, and no crash (the ingest agent failed on the first before 5 Dec).
    messages[half // 2:half // 2] = [
        ConfigApplied(event_time_ms=start_ms + 1, key="slo.ttft_slo_s", component="router-0",
                      config_offset=3),
        ConfigRejected(event_time_ms=start_ms + 2, key="shedding.high", component="controllers",
                       config_offset=4, reason="high must be above low")]
    first = Pipeline()
    first.send(*messages[:half])
    whole = Pipeline()
    whole.send(*messages)
    keys = ["fleet:all", "tenant:tenant-0", "tenant:tenant-1", "pool:h100@llama-3-8b",
            "pool:a100@llama-3-8b", "model:llama-3-8b"] + [f"worker:worker-{w}" for w in range(4)]
    group = f"{catalog.namespace}.streams"
    async with SignalsReader(bootstrap, catalog) as signals:
        await wait_for_members(bootstrap, group, 2, 90, procs)
        await produce(bootstrap, catalog, messages[:half])
        expected = first.values("fleet:all")
        await signals.wait_until(lambda: matches(signals.total("fleet:all"), expected), 60,
                                 "the first half's signals", procs,
                                 lambda: differences(signals.total("fleet:all"), expected))
        procs[1].kill()  # SIGKILL: no goodbye, no commit
        procs[1].wait()
        await produce(bootstrap, catalog, messages[half:])
        # The takeover and the replay are waited for apart, so that a failure says which of the
        # two did not happen: the broker drops the killed worker after its 6 s session timeout
        # and the survivor, alone in the group, recovers its tables from the changelogs (7 to
        # 11 s after the kill, under a CPU burner beside it); then it reads what the killed
        # worker had not committed and the second half.
        survivor = [tmp_path / "s0.log"]
        await wait_for_members(bootstrap, group, 1, 90, procs[:1], survivor)
        await signals.wait_until(
            lambda: all(matches(signals.total(k), whole.values(k)) for k in keys), 90,
            "the whole stream's signals after the takeover", procs[:1],
            lambda: str({k: differences(signals.total(k), whole.values(k)) for k in keys})
            + rebalance_lines(*survivor))
        windowed = signals.latest[("fleet", "all", "60")]
        return counts, whole, keys, signals.latest, windowed


def test_two_workers_then_a_takeover_yield_the_expected_signals(kafka_bootstrap, catalog, tmp_path):
    procs = [start_streams_worker(kafka_bootstrap, catalog.namespace, tmp_path / f"s{i}.log")
             for i in range(2)]
    try:
        counts, whole, keys, latest, windowed = asyncio.run(
            _scenario(kafka_bootstrap, catalog, procs, tmp_path))
    finally:
        for proc in procs:
            stop(proc)
    fleet = latest[("fleet", "all", "total")]
    # The known contents of the stream, counted once each despite the kill and the replay.
    assert fleet["completed"] == counts.completed
    assert fleet["rejected"] == fleet["sheds"] == counts.rejected
    assert fleet["retries"] == counts.retried
    assert fleet["events"] == counts.lifecycle_events
    assert fleet["tasks_succeeded"] == counts.completed  # every task state survived
    assert fleet["ttft_p50_s"] == pytest.approx(0.2, rel=0.01)
    assert fleet["e2e_p99_s"] == pytest.approx(0.8, rel=0.01)
    for tenant, completed in counts.per_tenant_completed.items():
        assert latest[("tenant", tenant, "total")]["completed"] == completed
    workers = sum(latest[("worker", f"worker-{w}", "total")]["completed"] for w in range(4))
    assert workers == counts.completed
    # The 60 s window covers the whole stream: the same counts, from the bucket state.
    assert windowed["completed"] == counts.completed
    assert windowed["events"] == counts.lifecycle_events
    # The fleet view: each worker's last status and its age (the reader files it as "total").
    for w in range(4):
        view = latest[("fleet", f"worker-{w}", "total")]
        assert view["slot"] == w and view["age_s"] >= 0 and view["state_code"] == 2
    # Faust's data directory is the worker's own temporary one (in the test's tmp for the killed
    # worker, whose clean-up never ran), never Faust's default in the current directory.
    assert not Path(f"{catalog.namespace}.streams-data").exists()
    # Every topic the workers subscribe to exists before Faust starts (``ensure_topics``): two
    # workers starting together log no topic missing from the broker's metadata (aiokafka logs
    # it as an ERROR, which before 7 Dec the worker showed as INFO for its tables' changelogs).
    for log in (tmp_path / "s0.log", tmp_path / "s1.log"):
        assert "not found in cluster metadata" not in log.read_text(errors="replace"), log.name
