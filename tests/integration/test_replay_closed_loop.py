"""A closed-loop replay (``governor replay --closed-loop``) sends a task's later step only once
the step before it has ended, as ``governor sim`` does: open loop, a conversation's next turn
went before the answer it re-sends existed. The real broker; the test plays the router, ending
the requests on the telemetry topic."""

import asyncio
import json
import logging
import time

import pytest
from aiokafka import AIOKafkaConsumer
from typer.testing import CliRunner

from infra import cli
from infra.bus import Outbox, make_producer, now_ms
from infra.replay import replay
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.events import Completed, about

pytestmark = pytest.mark.integration

#: a two-step task whose second step is due before a lone request that comes after it
ROWS = [TraceRequest(0.0, 64, 8, task_id="t1", steps_total=2),
        TraceRequest(0.1, 96, 8, task_id="t1", step=2, steps_total=2),
        TraceRequest(0.3, 32, 8)]


async def _end(bootstrap, catalog, request) -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox = Outbox(producer)
        outbox.emit(catalog.telemetry, Completed(
            event_time_ms=now_ms(), **about(request), worker_id="worker-0",
            prompt_tokens=request.prompt_tokens, output_tokens=8, e2e_s=0.5),
            request.request_id)
        await outbox.flush()
    finally:
        await producer.stop()


async def records_on(bootstrap, topic, count) -> list:
    """The first ``count`` records on ``topic`` (60 s at most)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest")
    await consumer.start()
    out: list = []
    try:
        async with asyncio.timeout(60):
            while len(out) < count:
                fetched = await consumer.getmany(timeout_ms=500)
                out += [r for records in fetched.values() for r in records]
    finally:
        await consumer.stop()
    return out


def test_a_later_step_is_sent_once_the_step_before_it_has_ended(kafka_bootstrap, catalog):
    async def scenario():
        sent: list[tuple[str, float]] = []  # (request id, when sent)
        requests = {}

        def on_sent(request):
            sent.append((request.request_id, time.monotonic()))
            requests[request.request_id] = request

        replaying = asyncio.create_task(replay(
            ROWS, kafka_bootstrap, catalog, run_id="cl", closed_loop=True, step_wait_s=60,
            on_sent=on_sent))
        async with asyncio.timeout(60):
            while len(sent) < 2:  # step 1 and the lone request (due after step 2)
                await asyncio.wait({replaying}, timeout=0.05)
        ended_at = time.monotonic()
        await _end(kafka_bootstrap, catalog, requests["cl-000000"])
        count = await asyncio.wait_for(replaying, timeout=60)
        return sent, ended_at, count, [r.key for r in await records_on(kafka_bootstrap,
                                                                        catalog.requests, 3)]

    sent, ended_at, count, keys = asyncio.run(scenario())
    assert [rid for rid, _ in sent] == ["cl-000000", "cl-000002", "cl-000001"]
    assert sent[2][1] >= ended_at  # step 2 went once step 1 had ended, not at its own time
    assert count == 3 and sorted(keys) == [b"cl-000000", b"cl-000001", b"cl-000002"]


def test_a_step_whose_previous_never_ends_is_not_sent_and_the_replay_says_so(
        kafka_bootstrap, catalog, tmp_path, caplog):
    trace = tmp_path / "steps.jsonl"
    write_governor_jsonl(ROWS, trace)
    caplog.set_level(logging.WARNING, logger="infra.replay")
    started = time.monotonic()
    result = CliRunner().invoke(cli.app, [
        "replay", str(trace), "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
        "--run-id", "never", "--closed-loop", "--step-wait-s", "1"])
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "sent 2 requests" in out
    assert "1 of the trace's steps were not sent: the steps before them did not end within " \
           "--step-wait-s 1" in out
    assert "1 steps not sent" in caplog.text and took < 30


def test_a_step_sent_late_in_the_replay_has_the_whole_step_wait_to_end(kafka_bootstrap,
                                                                          catalog):
    """The step wait counts from the step's own send: a task whose first step is sent after
    --step-wait-s of replay (and of no end) still gets its second step sent once the first
    ends. It was measured from the last end heard (or the start): the replay gave up at once."""
    # Ample for the first step's end, which comes back through the broker (seconds where a
    # loaded machine stalls it); the task arrives after as long.
    step_wait_s = 10.0
    rows = [TraceRequest(step_wait_s + 1, 64, 8, task_id="late", steps_total=2),
            TraceRequest(step_wait_s + 1, 96, 8, task_id="late", step=2, steps_total=2)]

    async def scenario():
        sent = []
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        outbox = Outbox(producer)
        ending = []

        def on_sent(request):
            sent.append(request.request_id)
            if len(sent) == 1:  # the first step ends at once (the test plays the router)
                outbox.emit(catalog.telemetry, Completed(
                    event_time_ms=now_ms(), **about(request), worker_id="worker-0",
                    prompt_tokens=request.prompt_tokens, output_tokens=8, e2e_s=0.5),
                    request.request_id)
                ending.append(asyncio.ensure_future(outbox.flush()))

        try:
            count = await asyncio.wait_for(replay(
                rows, kafka_bootstrap, catalog, run_id="late", closed_loop=True,
                step_wait_s=step_wait_s, on_sent=on_sent), timeout=60)
            await asyncio.gather(*ending)
        finally:
            await producer.stop()
        return sent, count

    sent, count = asyncio.run(scenario())
    assert sent == ["late-000000", "late-000001"] and count == 2


def test_a_demo_counts_the_steps_it_did_not_send_and_fails(kafka_bootstrap, tmp_path,
                                                          monkeypatch):
    """Step 1 generates for longer than ``--drain-timeout``: step 2 is not sent, and the demo
    says so (report ``steps_not_sent``, exit 1). Before 6 Dec it said nothing of it."""
    trace = tmp_path / "long.jsonl"
    write_governor_jsonl([TraceRequest(0.0, 64, 3000, task_id="t1", steps_total=2),
                          TraceRequest(0.1, 64, 8, task_id="t1", step=2, steps_total=2)], trace)
    monkeypatch.chdir(tmp_path)  # (the demo's logs)
    result = CliRunner().invoke(cli.app, [
        "demo", "--trace", str(trace), "--bootstrap", kafka_bootstrap, "--fleet", "h100:1",
        "--duration", "5", "--drain-timeout", "3", "--closed-loop", "--no-analytics",
        "--json", str(tmp_path / "report.json")])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["requests_sent"] == 1 and report["steps_not_sent"] == 1
    assert "1 of the trace's steps were not sent: the steps before them did not end within " \
           "--drain-timeout 3" in " ".join(result.output.split())
