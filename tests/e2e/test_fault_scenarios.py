"""Fault scenarios through `governor demo --fault ...` on the real broker, the whole stack up."""

import asyncio
import json
import subprocess
import sys

import pytest

from infra.bus import namespace_topics
from infra.traces.loaders import write_governor_jsonl
from tests.workloads import mixed_value_burst

pytestmark = pytest.mark.e2e


def _demo(bootstrap: str, tmp_path, *args: str) -> dict:
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--duration", "20", "--bootstrap", bootstrap,
         "--no-analytics", "--json", str(out), *args],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert asyncio.run(_topics_left(bootstrap, report["run_id"])) == []
    return report


async def _topics_left(bootstrap: str, run_id: str, timeout_s: float = 15.0) -> list[str]:
    """The run's topics still on the broker once the demo's deletion has gone through (the
    broker deletes asynchronously), or after ``timeout_s``."""
    left = ["(the broker did not list its topics)"]
    try:
        async with asyncio.timeout(timeout_s):
            while left := await namespace_topics(bootstrap, run_id):
                await asyncio.sleep(0.2)  # polling the broker's metadata until they are gone
    except TimeoutError:
        pass
    return left


def _each_request_completed_once_with_its_stream_intact(report: dict) -> None:
    """Every request sent ended once, completed, and every stream (resumed ones too) checks out
    token by token."""
    assert report["unfinished"] == 0 and report["multiple_terminal_states"] == 0
    assert report["completed"] == report["requests_sent"]
    assert report["resumed_streams_verified"] == report["resumed_streams"]
    assert report["streams_broken"] == 0


def test_a_worker_slowed_5x_has_its_breaker_opened_and_its_traffic_moved(kafka_bootstrap, tmp_path):
    report = _demo(kafka_bootstrap, tmp_path, "--fault", "slow:0:5@5")
    assert report["faults_injected"] == ["slow:0@5"]
    assert report["breaker_opened_after_s"] is not None
    assert 0 < report["breaker_opened_after_s"] <= 3.0
    # Its in-flight requests moved to other workers and continued token by token.
    assert report["resumed_streams"] == report["resumed_streams_verified"]
    assert report["unfinished"] == 0 and report["multiple_terminal_states"] == 0
    assert report["streams_broken"] == 0


def test_a_worker_killed_mid_stream_has_its_requests_finished_elsewhere_exactly(kafka_bootstrap,
                                                                                tmp_path):
    report = _demo(kafka_bootstrap, tmp_path, "--fault", "kill:1@8")
    assert report["components_exited"] == ["worker-1"]
    assert report["resumed_streams"] > 0
    _each_request_completed_once_with_its_stream_intact(report)


def _long_answers(tmp_path):
    """Long answers (500-700 tokens: several seconds each) at 4 requests/s for 16 s, so that a
    worker killed mid-run is streaming requests when it dies."""
    import random

    rng = random.Random(3)
    rows, t = [], 0.0
    while t < 16:
        t += rng.expovariate(4.0)
        rows.append(json.dumps({"arrival_s": round(t, 3), "prompt_tokens": rng.randint(300, 800),
                                "output_tokens": rng.randint(500, 700)}))
    trace = tmp_path / "long.jsonl"
    trace.write_text("\n".join(rows) + "\n")
    return trace


def _long_answers_with(bootstrap: str, tmp_path, *faults: str) -> dict:
    """The demo of ``_long_answers`` with ``faults``, each of them injected."""
    report = _demo(bootstrap, tmp_path, "--trace", str(_long_answers(tmp_path)),
                   "--duration", "16", *(arg for fault in faults for arg in ("--fault", fault)))
    assert len(report["faults_injected"]) == len(faults) and report["faults_not_injected"] == []
    return report


def test_a_router_restarted_mid_run_finishes_the_streams_it_had_placed(kafka_bootstrap, tmp_path):
    # worker-1 is killed 2 s after the router's restart, streaming requests placed before it.
    report = _long_answers_with(kafka_bootstrap, tmp_path, "restart:router@6", "kill:1@8")
    assert report["components_exited"] == ["worker-1"]
    _each_request_completed_once_with_its_stream_intact(report)
    assert report["resumed_streams"] > 0


def test_a_router_and_a_worker_frozen_past_their_timeouts_end_each_request_once(
        kafka_bootstrap, tmp_path):
    # The router, SIGSTOPped past its 6 s session, is dropped from its group and rejoins with a
    # batch in hand; worker-1, SIGSTOPped past the router's heartbeat timeout while streaming,
    # has its requests continued elsewhere and superseded on its slot. (Before 6 Dec, demo runs
    # with such a worker pause ended 3 of 106 requests twice in one run and 1 in another; a run
    # does not hit those windows every time: tests/unit/workers/test_worker_stall.py does.)
    report = _long_answers_with(kafka_bootstrap, tmp_path, "pause:1:8@5", "pause:router:8@9")
    assert report["resumed_streams"] > 0
    _each_request_completed_once_with_its_stream_intact(report)


def test_a_worker_started_again_on_a_crashed_slot_does_not_serve_what_was_resumed(
        kafka_bootstrap, tmp_path):
    # The new worker on slot 1 reads the dispatches its predecessor never finished; those the
    # router resumed elsewhere come with a cancellation behind them, so each request completes
    # once (before the router sent them, 5 of 53 requests completed twice in one run).
    report = _long_answers_with(kafka_bootstrap, tmp_path, "kill:1@6", "start:1@11")
    assert report["resumed_streams"] > 0
    _each_request_completed_once_with_its_stream_intact(report)


def test_a_worker_started_again_at_once_on_its_slot_finishes_what_its_predecessor_had(
        kafka_bootstrap, tmp_path):
    # The new worker-1 may heartbeat before the router's 3 s timeout notices the old one gone
    # (then it serves the unfinished dispatches again from their start, as no resumption was
    # placed) or after it (then the router resumes them elsewhere and cancels them on slot 1).
    # Either way every request ends once, and every stream checks out token by token.
    report = _long_answers_with(kafka_bootstrap, tmp_path, "kill:1@6", "start:1@6.1")
    _each_request_completed_once_with_its_stream_intact(report)


def test_a_burst_at_3x_capacity_sheds_low_value_work_and_keeps_high_value_within_slo(
        kafka_bootstrap, tmp_path):
    # One simulated H100 serves about 33 of these requests a second; the burst offers 100/s.
    trace = tmp_path / "burst.jsonl"
    write_governor_jsonl(mixed_value_burst(rate_rps=100, duration_s=12), trace)
    report = _demo(kafka_bootstrap, tmp_path, "--trace", str(trace), "--fleet", "h100:1",
                   "--duration", "12")
    sent = report["requests_sent"]
    assert sent > 1000
    assert report["unfinished"] == 0 and report["multiple_terminal_states"] == 0
    assert report["completed"] + report["rejected"] == sent
    # Low-value work is turned away early, each rejection with a machine-readable reason.
    reasons = report["rejected_by_reason"]
    assert report["rejected"] > sent / 2
    assert reasons.get("load_shed", 0) > 0
    assert set(reasons) <= {"load_shed", "deadline_unreachable", "rate_limited"}
    # High-priority and late-step requests are mostly admitted, and meet their SLO.
    assert report["high_value_accepted"] >= 0.7 * report["high_value_sent"]
    assert report["slo_attainment_high_value_accepted"] >= 0.95
