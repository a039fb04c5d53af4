"""``governor replay --rate-scale X --limit N`` sends the requests ``governor sim --rate-scale X
--limit N`` simulates, when the simulator has them arrive: a workload tuned in ``sim`` is
replayed live as it was simulated. The real broker; the sim in-process on the same rows."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

from infra import cli
from infra.sim import SimOptions, Simulation
from infra.sim.requests import inference_request
from infra.traces import TraceRequest, load_trace, write_governor_jsonl
from tests.integration.test_replay_closed_loop import records_on

pytestmark = pytest.mark.integration

#: trace seconds; at --rate-scale 2 the task's step 2 (offset 6 s from its start at 2 s, kept)
#: is due at 7 s, after the lone rows at 10 and 12 s (due at 5 and 6 s); --limit 6 drops 20 s
ROWS = [TraceRequest(0.0, 64, 4),
        TraceRequest(2.0, 96, 4, task_id="t", steps_total=2, hash_ids=(1, 2), block_size=64),
        TraceRequest(4.0, 32, 4, tenant="b", priority=3),
        TraceRequest(8.0, 160, 4, task_id="t", step=2, steps_total=2, hash_ids=(1, 2, 3),
                     block_size=64),
        TraceRequest(10.0, 48, 4),
        TraceRequest(12.0, 80, 4, model="llama-3-8b"),
        TraceRequest(20.0, 16, 4)]
SPEEDUP = 2.0
#: how late a send may be, in the simulation's seconds (300 ms of wall clock on a loaded
#: machine; the rows' times are 1 s apart or more); never earlier than 20 ms of wall clock
LATE_S, EARLY_S = 0.6, 0.04


def test_replay_sends_what_sim_simulates_at_its_arrival_times(kafka_bootstrap, catalog,
                                                               tmp_path):
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl(ROWS, trace)
    result = CliRunner().invoke(cli.app, [
        "replay", str(trace), "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
        "--run-id", "rs", "--rate-scale", "2", "--limit", "6", "--speedup", str(SPEEDUP)])
    assert result.exit_code == 0, result.output
    produced = [json.loads(r.value)
                for r in asyncio.run(records_on(kafka_bootstrap, catalog.requests, 6))]
    produced.sort(key=lambda r: r["created_ms"])
    first_ms = produced[0]["created_ms"]

    items = list(load_trace(trace, limit=6))  # sim --limit 6 --rate-scale 2
    sim = Simulation(items, SimOptions(policy="round_robin", fleet="h100:1", rate_scale=2.0))
    sim.run()
    arrivals = [spec.arrival_s for spec in sim.outcomes.specs]  # when each arrived
    order = sorted(range(len(items)), key=lambda i: (arrivals[i], i))
    assert order == [0, 1, 2, 4, 5, 3]  # the task's step 2 after two rows below it

    assert [int(r["request_id"].removeprefix("rs-")) for r in produced] == order
    for r in produced:
        i = int(r["request_id"].removeprefix("rs-"))
        sent_s = (r["created_ms"] - first_ms) / 1000 * SPEEDUP
        assert -EARLY_S <= sent_s - arrivals[i] <= LATE_S, (i, sent_s, arrivals[i])
        simulated = inference_request(i, items[i], sim.outcomes.specs[i], 0)
        for name in ("prompt_tokens", "prefix_hashes", "block_size", "tenant", "priority",
                     "model", "step", "steps_total"):
            assert r[name] == getattr(simulated, name), (i, name)
        assert (r["task_id"] or "").removeprefix("rs-") == (simulated.task_id or "")
