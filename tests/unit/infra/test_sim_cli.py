"""``governor sim`` and ``governor workload build`` from the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.traces import TraceRequest, write_governor_jsonl
from infra.workloads import default_traces_dir
from schemas.errors import GovernorError


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=300 + i, output_tokens=20,
                                       task_id=f"t{i // 2}", step=i % 2 + 1, steps_total=2)
                          for i in range(20)], path)
    return path


def test_sim_prints_and_writes_the_report(trace: Path, tmp_path: Path):
    out = tmp_path / "out" / "sim.json"
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "kv_aware", "--fleet", "h100:2",
                                      "--seed", "3", "--rate-scale", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == printed
    assert printed["policy"] == "kv_aware" and printed["requests"] == 20
    assert printed["tasks"] == 10 and printed["completed"] == 20 and printed["unfinished"] == 0


def test_sim_writes_its_json_report_though_stdout_is_closed(trace: Path, tmp_path: Path):
    """A stdout whose reader has gone (``... | true``): the print of the report ended ``sim``
    (exit 1), and the ``--json`` report, written after it, was lost with the run."""
    out = tmp_path / "sim.json"
    read, write = os.pipe()
    os.close(read)  # (no reader at all: the first write to stdout fails)
    try:
        done = subprocess.run([sys.executable, "-m", "infra.cli", "sim", str(trace), "--fleet",
                               "h100:1", "--no-progress", "--json", str(out)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])})
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr  # (click's answer to a closed stdout)
    assert json.loads(out.read_text())["requests"] == 20


def test_sim_refuses_an_unknown_policy(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "random"])
    assert result.exit_code != 0
    assert "unknown policy" in str(result.exception) + result.output


@pytest.mark.parametrize(("row", "field"), [
    ({"tenant": "a b"}, "tenant"), ({"priority": 99}, "priority"), ({"task_id": "t" * 200}, "task_id"),
    ({"task_id": "t", "steps_total": 100_000}, "steps_total"),
    ({"output_tokens": 10**10}, "output_tokens")])
def test_sim_refuses_the_rows_replay_and_demo_refuse(tmp_path: Path, row: dict, field: str):
    """One trace contract: a row that cannot be replayed live is not simulated either."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, **row}) + "\n")
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1"])
    assert result.exit_code != 0
    assert f"trace request 0 (arrival 0s) is not a valid request: {field}:" in \
        str(result.exception) + result.output


@pytest.mark.parametrize(("name", "text", "says"), [
    ("bad.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n\n'
                  '{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 200000}\n',
     "bad.jsonl line 3: trace request 1 (arrival 1s) is not a valid request: output_tokens: "),
    ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:15:46.6805900,374,44\n"
                "2023-11-16 18:15:47.0,374,200000\n",
     "bad.csv line 4: trace request 1 (arrival 0.31941s) is not a valid request: GeneratedTokens: "),
    ("bad.mooncake.jsonl", '{"timestamp": 0, "input_length": 2000000, "output_length": 5}\n',
     "bad.mooncake.jsonl line 1: trace request 0 (arrival 0s) is not a valid request: "
     "input_length: "),
])
def test_a_row_past_a_request_limit_is_named_by_its_line_and_column(
        tmp_path: Path, name: str, text: str, says: str):
    """A value past a request's limits names the file, the line (not the request's index,
    which the header and blank lines put off) and the field as the file calls it: before,
    only ``trace request 1 ...: output_tokens`` for the CSV's GeneratedTokens on line 4."""
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1"])
    assert result.exit_code != 0
    assert f"{path.parent}/{says}" in str(result.exception) + result.output


@pytest.mark.skipif(not (default_traces_dir() / "sharegpt_lengths").is_dir(), reason="no shared data")
def test_workload_build_writes_governor_jsonl(tmp_path: Path):
    out = tmp_path / "w.jsonl"
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(out),
                                      "--duration", "30", "--arrivals", "poisson", "--mean-rps", "0.5"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all("task_id" in r and r["tenant"] == "sharegpt" for r in rows)


@pytest.mark.skipif(not (default_traces_dir() / "servegen").is_dir(), reason="no shared data")
def test_workload_build_makes_the_folder_of_its_out_file(tmp_path: Path, monkeypatch):
    """The README's ``workload build servegen ... --out out/servegen.jsonl`` in a checkout with
    no ``out/``: before, the workload was built, then not written (``cannot write
    out/servegen.jsonl: No such file or directory``, exit 2). And an ``--out`` that cannot be
    written is an error naming the option before the workload is built."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["workload", "build", "servegen", "--out", "out/sg.jsonl",
                                      "--duration", "20", "--mean-rps", "2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "sg.jsonl").read_text().count("\n") >= 1
    (tmp_path / "a_file").write_text("")
    import infra.workloads

    monkeypatch.setattr(infra.workloads, "build_workload", lambda *a, **k: pytest.fail("built"))
    result = CliRunner().invoke(app, ["workload", "build", "servegen", "--out", "a_file/w.jsonl"])
    assert result.exit_code != 0
    assert "--out a_file/w.jsonl: a_file is a file, not a folder" in \
        str(result.exception) + result.output


@pytest.mark.parametrize("given", ["--data-dir", "GOVERNOR_DATA_DIR"])
def test_workload_build_does_not_write_over_the_data_it_is_built_from(tmp_path: Path, given: str):
    """``--out`` a file of the traces folder (here the ShareGPT lengths it reads): before, the
    workload built from that file replaced it, and the data was lost."""
    traces = tmp_path / "data" / "traces"
    lengths = traces / "sharegpt_lengths" / "sharegpt_v3_turn_lengths_cl100k.csv"
    lengths.parent.mkdir(parents=True)
    lengths.write_text("conversation_id,turn,user_tokens_cl100k,assistant_tokens_cl100k,"
                       "history_tokens_before_turn_cl100k\nc1,0,40,60,0\nc1,1,30,50,100\n")
    before = lengths.read_bytes()
    where = (["--data-dir", str(traces)] if given == "--data-dir" else [])
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(lengths),
                                      "--arrivals", "poisson", "--duration", "10", *where],
                                env={"GOVERNOR_DATA_DIR": str(tmp_path / "data")})
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == (f"--out {lengths} is a file of the data the workload is "
                                     f"built from ({traces}): it would be written over; give "
                                     "another file")
    assert lengths.read_bytes() == before
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out",
                                      str(traces / "w.jsonl"), "--arrivals", "poisson",
                                      "--duration", "10", "--data-dir", str(traces)])
    assert result.exit_code == 0, result.output  # (a new file there is no data lost)


def test_sim_settings_and_autoscaler(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:3", "--autoscale",
                                      "--set", "breaker.itl_ratio=1000", "--set", "slo.ttft_slo_s=3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["fleet_timeline"][0] == [0.0, 3, 3] and report["unfinished"] == 0
    assert report["slo_rule"].startswith("TTFT SLO = 3 s + ")  # requests are judged by it too
    bad = CliRunner().invoke(app, ["sim", str(trace), "--set", "breaker.nope=1"])
    assert bad.exit_code != 0 and "bad --set" in str(bad.exception) + bad.output


@pytest.mark.parametrize(("args", "says"), [
    (["--fleet", "h100"], "bad fleet entry 'h100'"),
    (["--fleet", "h100:0"], "COUNT must be from 1 to 1024"),
    (["--fleet", "x:2"], "bad fleet entry 'x:2': unknown gpu 'x'; known: a100, h100, h200"),
    # (it said no price, and a price set
    # for it was then refused)
    (["--fleet", "h100:1", "--set", "gpu_prices_usd_per_hour={\"a100\": 1.8}"],
     "no price for GPU type 'h100'"),
    (["--fleet", "h100:3@llama-2-70b"],  # (workers of two GPUs each; before 6 Dec, refused)
     "pool h100@llama-2-70b: llama-2-70b runs on 2 h100 GPUs a worker (the least tensor "
     "parallelism that holds it), and 3 GPUs is not a multiple of 2"),
    (["--fleet", "h100:1@Llama-3-8b"], "model 'Llama-3-8b' is named 'llama-3-8b': a pool serves "
                                       "the requests that name its model exactly"),
    (["--router-weight", "nope=4"], "bad --router-weight 'nope=4': unknown scorer 'nope'; known: "
                                    "decode_deadlines, kv_headroom, latency, load, pool_weight, "
                                    "prefix, price, priority, warmth, workflow"),
    (["--set", "router_weights.nope=4"], "bad --set 'router_weights.nope=4': unknown scorer "
                                         "'nope'; known: decode_deadlines, "),
    (["--router-weight", "prefix=-4"],
     "bad --router-weight: router_weights.prefix: Input should be greater than or equal to 0"),
    (["--set", "retry_budget_ratio=2"],
     "bad --set 'retry_budget_ratio=2': retry_budget_ratio: Input should be less than or equal to 1"),
    # (a field of an entry not set yet: it told to run `governor config set`, which sets the
    # live topic's configuration, not the run's, before 7 Dec)
    (["--set", "autoscaler.pools.h100@llama-3-8b.gpus=1"],
     "bad --set 'autoscaler.pools.h100@llama-3-8b.gpus=1': no setting named "
     "'autoscaler.pools.h100@llama-3-8b.gpus': autoscaler.pools has no entry 'h100@llama-3-8b' "
     "(add it whole first: --set autoscaler.pools.h100@llama-3-8b='{\"gpus\": ...}')"),
])
def test_sim_names_a_bad_option_in_one_line_before_it_runs(trace: Path, args: list[str],
                                                            says: str):
    result = CliRunner().invoke(app, ["sim", str(trace), *args])
    message = str(result.exception)
    assert type(result.exception).__name__ == "GovernorError" and says in message
    assert "\n" not in message and result.stdout == ""  # nothing was simulated


def test_sim_refuses_a_json_folder_before_it_runs_and_prints_the_report_if_writing_fails(
        trace: Path, tmp_path: Path, monkeypatch):
    folder = CliRunner().invoke(app, ["sim", str(trace), "--json", str(tmp_path)])
    assert "is a folder" in str(folder.exception) and folder.stdout == ""
    blocked = tmp_path / "file"
    blocked.write_text("")
    below = CliRunner().invoke(app, ["sim", str(trace), "--json", str(blocked / "sim.json")])
    assert f"--json {blocked / 'sim.json'}: {blocked} is a file, not a folder" in \
        str(below.exception) and below.stdout == ""  # before it runs

    def disk_full(path: Path, text: str):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("infra.paths.write_atomically", disk_full)
    lost = CliRunner().invoke(app, ["sim", str(trace), "--json", str(tmp_path / "sim.json")])
    assert "cannot write --json" in str(lost.exception) and "No space left" in str(lost.exception)
    assert json.loads(lost.stdout.strip().splitlines()[-1])["requests"] == 20  # not lost


def test_sim_refuses_a_fleet_serving_none_of_the_trace_and_warns_of_some(trace: Path,
                                                                         tmp_path: Path):
    """As ``demo`` does: before, ``sim`` warned and simulated a run that rejected all 20
    requests (exit 0), where ``demo`` refused the same trace and fleet."""
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:1@llama-2-7b"])
    assert isinstance(result.exception, GovernorError), result.output  # (exit 2, error:)
    assert ("no pool of --fleet h100:1@llama-2-7b serves llama-3-8b: none of the 20 requests "
            "could be served") in str(result.exception)
    assert result.stdout == ""  # no report: the run did not start
    mixed = tmp_path / "mixed.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=0, prompt_tokens=10, output_tokens=2),
                          TraceRequest(arrival_s=1, prompt_tokens=10, output_tokens=2,
                                       model="llama-2-7b")], mixed)
    result = CliRunner().invoke(app, ["sim", str(mixed), "--fleet", "h100:1"])
    assert result.exit_code == 0, result.output
    assert ("warning: no pool of --fleet h100:1 serves llama-2-7b (1 of 2 requests): they will "
            "be rejected") in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["rejected"] == 1


def test_tasks_cut_off_by_the_window_count_as_not_succeeded(trace: Path):
    # the first 5 requests: tasks t0 and t1 whole, t2 without its second step
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "round_robin", "--limit", "5"])
    assert result.exit_code == 0, result.output
    assert "1 task has steps outside the run's rows" in result.stderr
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["succeeded"] == 5 and (printed["tasks"], printed["tasks_succeeded"]) == (3, 2)


def test_a_bad_fleet_exits_2_with_one_error_line_and_no_traceback(trace: Path):
    done = subprocess.run([sys.executable, "-m", "infra.cli", "sim", str(trace), "--fleet",
                           "h100:2@m[x]"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: unknown model 'm[x]'; known: llama-2-70b, llama-2-7b, "
                                   "llama-3-8b (declare another by its shape: --set "
                                   "'models.NAME={...}')")


def test_a_traces_unknown_field_is_said_as_the_other_warnings_are(tmp_path: Path):
    """``warning: ...``, as ``sim`` says its own; before 7 Dec it was a timestamped log line
    (``2026-12-06 23:06:34,920 WARNING infra.traces.loaders: ...``)."""
    path = tmp_path / "typo.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2, "deadline": 3}\n')
    done = subprocess.run([sys.executable, "-m", "infra.cli", "sim", str(path), "--fleet",
                           "h100:1", "--no-progress"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"warning: {path} line 1: field 'deadline' is not a Governor JSONL field and is "
        "ignored (did you mean 'deadline_s'?)")


def test_sim_refuses_a_policy_set_twice(trace: Path):
    twice = CliRunner().invoke(app, ["sim", str(trace), "--set", "routing_policy=kv_aware"])
    assert "--policy, not --set routing_policy" in str(twice.exception)


def test_sim_says_a_baseline_ignores_the_governor_options(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "round_robin", "--fleet",
                                      "h100:2", "--autoscale"])
    assert result.exit_code == 0, result.output
    assert "apply to the governor policy only; round_robin runs without them" in result.stderr


def test_sim_says_a_baseline_runs_without_the_governor_policys_settings(trace: Path):
    """Before 6 Dec `--set breaker.*` (any setting of the governor policy's controllers or
    admission) under a baseline policy was dropped without a word."""
    result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "least_loaded", "--fleet",
                                      "h100:2", "--set", "breaker.itl_ratio=1000", "--set",
                                      "slo.ttft_slo_s=2", "--set", "shedding.kv_high=0.99"])
    assert result.exit_code == 0, result.output
    assert ("warning: --set breaker.itl_ratio, shedding.kv_high: these settings apply to the "
            "governor policy only (its controllers and admission); least_loaded runs without "
            "them") in result.stderr
    governor = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:2", "--set",
                                        "breaker.itl_ratio=1000"])
    assert governor.exit_code == 0 and "warning" not in governor.stderr, governor.stderr


@pytest.mark.parametrize(("arrival_s", "rate_scale"), [(1_300_000.0, "1"), (3_600.0, "1e-6")])
def test_sim_refuses_a_run_longer_than_fourteen_days_before_it_runs(
        tmp_path: Path, arrival_s: float, rate_scale: str):
    """A trace past 14 days, or one slowed down past them: idle virtual days cost CPU seconds
    each, so such a run would go for hours without a word. (Arrivals past a year, epoch seconds
    written as ``arrival_s``, are refused as the trace is read:
    ``test_an_arrival_past_a_year_...``; a 20-day trace at ``--rate-scale 2`` runs.)"""
    path = tmp_path / "long.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=2),
                          TraceRequest(arrival_s=arrival_s, prompt_tokens=10, output_tokens=2)],
                         path)
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1",
                                      "--rate-scale", rate_scale])
    message = str(result.exception)
    assert type(result.exception).__name__ == "GovernorError", result.output
    assert "past the 1,209,600 s (14 days) a run covers" in message
    # (before 7 Dec, a run slowed down past them was told only to cut it)
    assert ("raise --rate-scale (under 1 it slows the trace down)" in message) == \
        (rate_scale != "1")
    assert result.stdout == ""


def test_an_arrival_past_a_year_is_refused_as_the_trace_is_read(tmp_path: Path):
    path = tmp_path / "epoch.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n'
                    '{"arrival_s": 1700000000, "prompt_tokens": 10, "output_tokens": 2}\n')
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1"])
    assert result.exit_code != 0 and result.stdout == ""
    assert "'arrival_s' must be a number from 0 to 31,536,000 (a year)" in \
        str(result.exception) + result.output


def test_sim_counts_a_task_as_its_tenants_and_each_step_once(tmp_path: Path):
    """Two tenants' tasks of one id are two tasks; a step the trace holds twice does not make up
    for a step it lacks."""
    path = tmp_path / "tasks.jsonl"
    write_governor_jsonl([
        TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=2, tenant="a", task_id="x",
                     step=1, steps_total=2),
        TraceRequest(arrival_s=0.1, prompt_tokens=10, output_tokens=2, tenant="b", task_id="x",
                     step=1, steps_total=2),
        TraceRequest(arrival_s=0.2, prompt_tokens=10, output_tokens=2, tenant="c", task_id="y",
                     step=1, steps_total=2),
        TraceRequest(arrival_s=0.3, prompt_tokens=10, output_tokens=2, tenant="c", task_id="y",
                     step=1, steps_total=2),
    ], path)
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1"])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["tasks"], report["tasks_succeeded"], report["completed"]) == (3, 0, 4)
    assert "3 tasks have steps outside the run's rows" in result.stderr


def test_sim_refuses_autoscaler_pools_its_fleet_does_not_have(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:1", "--autoscale",
                                      "--set", 'autoscaler.pools={"b200@llama-3-8b": '
                                               '{"min_replicas": 1}}'])
    assert type(result.exception).__name__ == "GovernorError", result.output
    assert "autoscaler.pools names b200@llama-3-8b, which --fleet h100:1 has no pool of" in str(
        result.exception)


@pytest.mark.skipif(not (default_traces_dir() / "sharegpt_lengths").is_dir(), reason="no shared data")
def test_workload_build_writes_no_empty_file(tmp_path: Path):
    out = tmp_path / "w.jsonl"
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(out),
                                      "--arrivals", "poisson", "--mean-rps", "0.001",
                                      "--duration", "10"])
    assert "has no request in 10 s" in str(result.exception) and not out.exists()


def test_autoscale_bounds_each_pool_by_its_own_fleet_size():
    from infra.sim.cli import _config

    config = _config([], [], True, "h100:1,a100:6")
    assert config.autoscaler.enabled
    assert config.autoscaler.bounds("h100@llama-3-8b")[1] == 1  # (it grew to 6, the largest)
    assert config.autoscaler.bounds("a100@llama-3-8b")[1] == 6


def test_a_sparse_run_shows_its_progress_in_virtual_time(tmp_path: Path, monkeypatch):
    """Two requests 600 s apart: a few arrivals, many ticks. Progress follows the ticks (it was
    shown from 5,000 requests only, so a long sparse run printed nothing)."""
    import io

    from rich.console import Console

    from infra.sim import cli

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, force_terminal=False, width=200))
    monkeypatch.setattr(cli, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)
    path = tmp_path / "sparse.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=5),
                          TraceRequest(arrival_s=600.0, prompt_tokens=10, output_tokens=5)], path)
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1", "--policy",
                                      "round_robin"])
    assert result.exit_code == 0, result.output
    lines = [line for line in out.getvalue().splitlines() if line.startswith("sim round_robin t=")]
    assert len(lines) > 500  # one a virtual second (a tick), here where nothing is throttled
    assert "t=300s, 1/2 requests arrived" in out.getvalue()


def test_sim_judges_by_the_configured_deadline_only_when_told(trace: Path):
    """``--deadlines config`` gives each request ``slo.deadline_s`` after its arrival (as the
    live stack judges one that states none); the default rule ignores the setting, and says so."""
    def run(*args: str) -> tuple[dict, str]:
        result = CliRunner().invoke(app, ["sim", str(trace), "--policy", "round_robin", "--fleet",
                                          "h100:1", "--no-progress", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1]), result.output

    default, _ = run()
    assert default["tasks_succeeded"] == 10 and "TTFT SLO + 0.1 s per output token" in \
        default["slo_rule"]
    tight, _ = run("--deadlines", "config", "--set", "slo.ttft_slo_s=0.005", "--set",
                   "slo.deadline_s=0.01")  # (a TTFT target past the deadline is refused)
    assert tight["tasks_succeeded"] == 0 and tight["completed"] == 20  # all served, all late
    assert "deadline = 0.01 s after arrival (slo.deadline_s)" in tight["slo_rule"]
    ignored, output = run("--set", "slo.ttft_slo_s=0.005", "--set", "slo.deadline_s=0.01")
    assert ignored["tasks_succeeded"] == 10
    assert "slo.deadline_s sets the deadlines with --deadlines config or none only" in output


def test_sim_with_deadlines_none_sends_the_router_no_deadline_and_judges_as_the_streams(
        tmp_path: Path, trace: Path):
    """``--deadlines none``: a request is routed as a client's that states no deadline (the
    router never rejects it ``deadline_unreachable``, as live), and judged as the live streams
    judge one: by ``slo.ttft_slo_s`` and ``slo.deadline_s`` (before 6 Dec ``sim`` refused
    ``none``, and ``replay`` and ``demo`` could not send a row without a deadline)."""
    def run(path: Path, *args: str) -> dict:
        result = CliRunner().invoke(app, ["sim", str(path), "--no-progress", *args])
        assert result.exit_code == 0, result.output
        assert "sets the deadlines" not in result.output  # (no warning: the setting is used)
        return json.loads(result.stdout.strip().splitlines()[-1])

    long_prompts = tmp_path / "long.jsonl"  # prefills an A100 cannot keep up with
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=40_000, output_tokens=8)
                          for i in range(30)], long_prompts)
    ruled = run(long_prompts, "--fleet", "a100:1")
    assert ruled["rejected_by_reason"].get("deadline_unreachable", 0) > 0
    unstated = run(long_prompts, "--fleet", "a100:1", "--deadlines", "none")
    assert "deadline_unreachable" not in unstated["rejected_by_reason"]
    assert unstated["slo_rule"].startswith("only the targets a request states are sent; one "
                                           "that states none is judged by TTFT SLO 2 s")

    fleet = ("--fleet", "h100:1", "--policy", "round_robin")
    assert run(trace, *fleet, "--deadlines", "none")["tasks_succeeded"] == 10
    late = run(trace, *fleet, "--deadlines", "none", "--set", "slo.ttft_slo_s=0.005", "--set",
               "slo.deadline_s=0.01")
    assert late["tasks_succeeded"] == 0 and late["completed"] == 20  # all served, all late
    assert "deadline 0.01 s after arrival (slo.deadline_s)" in late["slo_rule"]


#: Llama-2-13B's config.json: a model with no built-in performance model.
LLAMA_2_13B = {"params_b": 13.0, "n_layers": 40, "n_heads": 40, "n_kv_heads": 40,
               "head_dim": 128, "hidden_size": 5120, "intermediate_size": 13824,
               "vocab_size": 32000}


def test_sim_predicts_a_model_declared_in_the_configuration(tmp_path: Path):
    """A model the configuration declares (``models``) is simulated and routed by its own shape:
    a 13B model's prefill is slower than the built-in 8B's on the same GPU."""
    def ttft_p50(model: str, *settings: str) -> float:
        path = tmp_path / f"{model}.jsonl"
        write_governor_jsonl([TraceRequest(arrival_s=i * 2.0, prompt_tokens=4000, output_tokens=8,
                                           model=model) for i in range(5)], path)
        result = CliRunner().invoke(app, ["sim", str(path), "--fleet", f"h100:1@{model}",
                                          "--no-progress", *settings])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["completed"] == 5
        return report["ttft_p50_s"]

    declared = ttft_p50("llama-2-13b", "--set", f"models.llama-2-13b={json.dumps(LLAMA_2_13B)}")
    assert declared > 1.3 * ttft_p50("llama-3-8b")
    undeclared = CliRunner().invoke(app, ["sim", str(tmp_path / "llama-2-13b.jsonl"), "--fleet",
                                          "h100:1@llama-2-13b", "--no-progress"])
    assert undeclared.exit_code != 0
    assert "unknown model 'llama-2-13b'" in str(undeclared.exception) + undeclared.output
    built_in = CliRunner().invoke(app, ["sim", str(tmp_path / "llama-2-13b.jsonl"), "--set",
                                        f"models.llama-3-8b={json.dumps(LLAMA_2_13B)}"])
    assert built_in.exit_code != 0
    assert "models.llama-3-8b: llama-3-8b is built in" in str(built_in.exception) + \
        built_in.output


@pytest.mark.parametrize(("args", "out"), [
    (["--quick"], "out/bench-quick"), ([], "benchmarks/results"),
    (["--quick", "--out", "elsewhere"], "elsewhere")])
def test_a_quick_bench_does_not_overwrite_the_committed_report(monkeypatch, tmp_path, args, out):
    import benchmarks.policy_bench

    monkeypatch.chdir(tmp_path)  # (`bench` makes its --out folder: not in the checkout)
    written = []
    monkeypatch.setattr(benchmarks.policy_bench, "run_bench",
                        lambda folder, **kwargs: written.append(folder) or folder / "REPORT.md")
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 0, result.output
    assert written == [Path(out)]


def _ctrl_c_at_100_s(tmp_path: Path, monkeypatch, presses: int):
    """A ``sim --json`` run of a sparse trace (requests at 0 and 600 s) with ``presses`` Ctrl-Cs
    at its first progress tick past 100 s of simulated time (a real SIGINT each, as at the
    terminal): its result, ``--json`` file and the tick's time. Its SIGINT handling is given
    back after it."""
    import os
    import signal

    from infra.sim import cli

    sent = []

    def update(self, arrived, total, t):
        if t >= 100 and not sent:
            sent.append(t)
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cli._Progress, "update", update)
    path, out = tmp_path / "sparse.jsonl", tmp_path / "sim.json"
    write_governor_jsonl([TraceRequest(arrival_s=0.0, prompt_tokens=10, output_tokens=5),
                          TraceRequest(arrival_s=600.0, prompt_tokens=10, output_tokens=5)], path)
    before = signal.getsignal(signal.SIGINT)
    result = CliRunner().invoke(app, ["sim", str(path), "--fleet", "h100:1", "--json", str(out)])
    assert signal.getsignal(signal.SIGINT) is before
    return result, out, sent[0]


def test_ctrl_c_stops_a_run_at_its_next_tick_with_the_report_of_what_it_simulated(
        tmp_path: Path, monkeypatch):
    """Before 5 Dec (late) Ctrl-C lost a long run's whole report. Now the first stops it at its
    next tick (its state whole there), prints and writes the report marked ``interrupted`` and
    exits 130; the signal handlers are restored after."""
    result, out, sent = _ctrl_c_at_100_s(tmp_path, monkeypatch, presses=1)
    assert result.exit_code == 130, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == report
    assert (report["interrupted"], report["arrived"], report["requests"]) == (True, 1, 2)
    assert (report["completed"], report["unfinished"]) == (1, 1)  # (the second never came)
    assert report["simulated_s"] == sent == 100.0  # the tick that saw the signal
    assert report["gpu_hours"] == pytest.approx(report["simulated_s"] / 3600, rel=1e-3)
    # (before 7 Dec "1 of 2 requests had arrived, 1 had not ended": the one not arrived, which
    # read as one that arrived and ran on)
    assert "interrupted at 100.0 s of simulated time: 1 of 2 requests had arrived and 1 had " \
           "ended; the report covers the run until then" in result.stderr


def test_a_second_ctrl_c_stops_a_run_at_once_and_says_there_is_no_report(tmp_path: Path,
                                                                         monkeypatch):
    """The second comes before the tick the first stops the run at (a user who will not wait
    for it): before 7 Dec ``sim`` exited 130 without a word, as if the report were lost to an
    error."""
    result, out, _ = _ctrl_c_at_100_s(tmp_path, monkeypatch, presses=2)
    assert result.exit_code == 130, result.output
    assert result.stderr == "interrupted again: stopped at once, with no report\n"
    assert result.stdout == "" and not out.exists()


def test_ctrl_c_while_the_trace_is_read_says_nothing_was_simulated(trace: Path, monkeypatch):
    """Before, a Ctrl-C while a long trace was read or checked ended ``sim`` (exit 130) without
    a word."""
    from infra.sim import cli
    from tests.terminals import ctrl_c_after

    monkeypatch.setattr(cli, "rows_with_progress", ctrl_c_after(3, cli.rows_with_progress))
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:1"])
    assert result.exit_code == 130, result.output
    assert result.stderr == f"interrupted while reading {trace}: nothing was simulated\n"
    assert result.stdout == ""


#: ``governor sim`` with a SIGTERM sent to it, as by ``kill``, once 3 rows of its trace are read.
SIGTERM_WHILE_READING = """
import signal, sys
from infra.cli import app
from infra.sim import cli
from tests.terminals import ctrl_c_after

cli.rows_with_progress = ctrl_c_after(3, cli.rows_with_progress, signal.SIGTERM)
app(["sim", *sys.argv[1:]], prog_name="governor")
"""


def test_sigterm_while_the_trace_is_read_says_nothing_was_simulated(trace: Path):
    """As a Ctrl-C there: before 7 Dec SIGTERM's default action ended ``sim`` without a word
    (killed by the signal). In a process of its own: that default would end the tests."""
    repo = Path(__file__).parents[3]
    done = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_READING, str(trace), "--fleet",
                           "h100:1"], capture_output=True, text=True, timeout=120, cwd=repo,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 130, done.stderr
    assert done.stderr == f"interrupted while reading {trace}: nothing was simulated\n"
    assert done.stdout == ""


def test_reading_takes_sigterm_only_while_it_lasts_and_not_where_it_is_ignored():
    """The SIGTERM handling of the reading is given back after it; a SIGTERM the process
    ignores (as a script's background job may) stays ignored there too."""
    import signal

    from infra.sim.cli import said_if_interrupted

    for before in (signal.SIG_DFL, signal.SIG_IGN):
        previous = signal.signal(signal.SIGTERM, before)
        try:
            with said_if_interrupted("unsaid"):
                assert (signal.getsignal(signal.SIGTERM) is signal.SIG_IGN) == \
                    (before is signal.SIG_IGN)
            assert signal.getsignal(signal.SIGTERM) is before
        finally:
            signal.signal(signal.SIGTERM, previous)


def test_ctrl_c_while_a_workload_is_written_leaves_the_file_as_it_was(tmp_path: Path,
                                                                     monkeypatch):
    """Before, a Ctrl-C while ``workload build`` built or wrote ended it without a word."""
    import infra.workloads
    from infra.sim import cli
    from tests.terminals import ctrl_c_after

    built = [TraceRequest(arrival_s=i, prompt_tokens=10, output_tokens=2) for i in range(5)]
    monkeypatch.setattr(infra.workloads, "build_workload", lambda *a, **k: built)
    monkeypatch.setattr(cli, "rows_with_progress", ctrl_c_after(2, cli.rows_with_progress))
    out = tmp_path / "w.jsonl"
    out.write_text("the workload before\n")
    result = CliRunner().invoke(app, ["workload", "build", "sharegpt", "--out", str(out),
                                      "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 130, result.output
    assert result.stderr == f"interrupted: nothing written to {out}\n"
    assert out.read_text() == "the workload before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl"]  # (no .tmp left)


def test_a_whole_run_says_nothing_of_interruption(trace: Path):
    result = CliRunner().invoke(app, ["sim", str(trace), "--fleet", "h100:1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "interrupted" not in report and "arrived" not in report


def test_a_run_whose_process_ignores_sigint_goes_on_ignoring_it():
    """A run started in the background of a script (``governor sim ... &``) ignores SIGINT, so
    that a Ctrl-C at the script's terminal leaves it running; the handlers of the report on
    interruption took SIGINT back, and such a run stopped at the Ctrl-C meant for the script."""
    import os
    import signal

    from infra.sim.cli import _stop_on_signals

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _stop_on_signals() as stopped:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not stopped.is_set()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_stop_handler_returns_while_the_stop_flag_is_held():
    """A signal's handler runs between two of the main thread's bytecodes, possibly inside the
    handler of the signal before it: before 7 Dec the handler set a ``threading.Event``, whose
    lock a second SIGTERM's handler then waited for, which the first held: for ever. Here the
    flag's locks (if it has any) are held while the handler runs; one that waits for them is
    let go after 5 s, and said to have waited."""
    import signal
    import threading

    from infra.sim.cli import _stop_on_signals

    with _stop_on_signals() as stopped:
        handler = signal.getsignal(signal.SIGTERM)
        locks = [value for value in vars(stopped).values() if hasattr(value, "acquire")]
        for lock in locks:
            lock.acquire()
        waited = []

        def let_go() -> None:
            waited.append(True)
            for held in locks:
                held.release()

        rescue = threading.Timer(5.0, let_go)
        rescue.start()
        try:
            handler(signal.SIGTERM, None)
        finally:
            rescue.cancel()
            rescue.join()
            if not waited:
                for lock in locks:
                    lock.release()
        assert not waited, "the handler waited for a lock its signal may have interrupted"
        assert stopped.is_set()


def test_bench_refuses_a_file_for_its_report_folder_before_it_runs(tmp_path, monkeypatch):
    """Before 6 Dec `governor bench --out FILE` stopped on a `FileExistsError` traceback."""
    import benchmarks.policy_bench

    def ran(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(benchmarks.policy_bench, "run_bench", ran)
    taken = tmp_path / "taken"
    taken.write_text("")
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(taken)])
    assert type(result.exception).__name__ == "GovernorError", result.output
    assert str(result.exception) == f"--out {taken} is a file, not a folder"


GOOD = '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,100,10\n"


@pytest.mark.parametrize(("name", "data"), [
    ("bad-bytes.jsonl", (GOOD * 2 + GOOD.replace("10", "1\xff")).encode("latin-1")),
    ("gzipped.jsonl", __import__("gzip").compress(GOOD.encode())),
    ("step.jsonl", (GOOD + GOOD.replace("}", ', "task_id": "t", "step": 3, "steps_total": 2}')
                    ).encode()),
    ("steps.jsonl", (GOOD.replace("}", ', "task_id": "t", "steps_total": 2}')
                     + GOOD.replace("}", ', "task_id": "t", "step": 2, "steps_total": 3}')
                     ).encode()),
    ("backwards.jsonl", (GOOD.replace('"arrival_s": 0', '"arrival_s": 5') + GOOD).encode()),
    ("nan.jsonl", (GOOD + GOOD.replace("10", "NaN")).encode()),
    ("negative.csv", (AZURE + "2023-11-16 18:15:47.0,-100,10\n").encode()),
    ("missing.csv", (AZURE + "2023-11-16 18:15:47.0,100\n").encode()),
    ("digits.csv", (AZURE + "2023-11-16 18:15:47.0,١٠٠,10\n").encode()),
    ("array.json", b"[" + GOOD.strip().encode() + b", " * 10_000_000 + b"]"),
    ("priority.jsonl", (GOOD + GOOD.replace("}", ', "priority": 12}')).encode()),
    ("huge.mooncake.jsonl", b'{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                            b'{"timestamp": 1, "input_length": 2000000, "output_length": 5}\n'),
])
def test_sim_and_replay_judge_a_bad_trace_alike(tmp_path: Path, name: str, data: bytes):
    """One trace contract: ``sim`` and ``replay`` (which checks every row before it asks for
    the broker) refuse the same file with the same words, naming the file and the line."""
    path = tmp_path / name
    path.write_bytes(data)
    said = []
    for command in (["sim", str(path), "--fleet", "h100:1"],
                    ["replay", str(path), "--bootstrap", "127.0.0.1:1"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code != 0 and isinstance(result.exception, GovernorError), \
            result.output
        said.append(str(result.exception))
    assert said[0] == said[1]
    assert said[0].startswith(f"{path} line ") or said[0].startswith(f"trace file {path} ")


@pytest.mark.parametrize("text", ["TIMESTAMP,ContextTokens,GeneratedTokens\n",
                                  "\n\nTIMESTAMP,ContextTokens,GeneratedTokens\r\n\n", "\n\n"])
def test_sim_and_replay_refuse_a_trace_with_no_request(tmp_path: Path, text: str):
    """A header alone, or nothing: before, ``replay`` of a header went on to the broker and,
    where one answered, sent 0 requests (exit 0)."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    for command in (["sim", str(path)], ["replay", str(path), "--bootstrap", "127.0.0.1:1"]):
        result = CliRunner().invoke(app, command)
        assert isinstance(result.exception, GovernorError), result.output
        assert str(path) in str(result.exception)
        assert "broker" not in str(result.exception)


def test_sim_and_demo_refuse_to_write_the_report_over_the_trace(trace: Path, monkeypatch):
    """``--json`` naming the trace (a slip of the shell's history): before, ``sim`` ran and
    wrote its report over the trace, which was lost; ``demo`` would have too."""
    import infra.cli as cli

    before = trace.read_bytes()
    result = CliRunner().invoke(app, ["sim", str(trace), "--json", str(trace)])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == (f"--json {trace} is the trace itself; the report would "
                                     "be written over it: give another file")
    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: pytest.fail("started"))
    result = CliRunner().invoke(app, ["demo", "--trace", str(trace), "--json",
                                      str(trace.parent / "." / trace.name), "--bootstrap",
                                      "127.0.0.1:1"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "is the trace itself" in str(result.exception)
    assert trace.read_bytes() == before


def test_reading_a_long_trace_shows_its_progress(monkeypatch):
    """A trace of millions of rows takes a minute to read and check (2,000,000 ServeGen rows:
    about 35 CPU-seconds) before the run's own progress starts: before, nothing was shown."""
    import io

    from rich.console import Console

    from infra.sim import cli

    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, force_terminal=False, width=200))
    monkeypatch.setattr(cli, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)
    assert list(cli.rows_with_progress("read", iter(range(10_000)))) == list(range(10_000))
    assert out.getvalue().splitlines() == ["sim 4,096 requests read", "sim 8,192 requests read"]
    monkeypatch.setattr(cli, "PROGRESS_AFTER_S", 3600.0)  # a short read: nothing shown
    assert len(list(cli.rows_with_progress("read", iter(range(10_000))))) == 10_000
    assert len(out.getvalue().splitlines()) == 2


@pytest.fixture
def trace_70b(tmp_path: Path) -> Path:
    """Four requests for Llama-2-70B."""
    path = tmp_path / "t70.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=300, output_tokens=20,
                                       model="llama-2-70b") for i in range(4)], path)
    return path


def test_sim_refuses_a_pool_degree_its_fleet_does_not_start_workers_at(trace_70b: Path):
    """A simulation's workers start at its fleet's degree: a pool declared at another
    (``autoscaler.pools.<pool>.gpus``) would be planned at workers it never runs. Before, the
    setting did not exist (refused as an unknown field of the pool)."""
    result = CliRunner().invoke(app, ["sim", str(trace_70b), "--fleet", "h100:8@llama-2-70b",
                                      "--autoscale", "--set",
                                      "autoscaler.pools.h100@llama-2-70b.gpus=4"])
    assert type(result.exception).__name__ == "GovernorError", result.output
    assert str(result.exception) == (
        "autoscaler.pools.h100@llama-2-70b.gpus is 4, but --fleet h100:8@llama-2-70b runs its "
        "workers on 2 GPUs each (name the degree in --fleet: h100:8/tp4@llama-2-70b)")
    agreeing = CliRunner().invoke(app, ["sim", str(trace_70b), "--fleet", "h100:8/tp4@llama-2-70b",
                                        "--autoscale", "--set",
                                        "autoscaler.pools.h100@llama-2-70b.gpus=4"])
    assert agreeing.exception is None, agreeing.output


def test_sim_autoscale_takes_a_setting_of_one_field_of_a_fleet_pool(trace_70b: Path):
    """``--autoscale --set autoscaler.pools.GPU@MODEL.max_replicas=N``, as ``--autoscale``'s
    help says to change one pool's cap. Before, it was refused (``no entry
    'h100@llama-2-70b'``): the settings were first applied, to declare their models, before
    ``--autoscale`` had added the fleet's pools."""
    result = CliRunner().invoke(app, ["sim", str(trace_70b), "--fleet", "h100:8@llama-2-70b",
                                      "--autoscale", "--set",
                                      "autoscaler.pools.h100@llama-2-70b.max_replicas=2"])
    assert result.exception is None, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["completed"] == 4


def test_sim_autoscale_keeps_the_fleet_cap_of_a_pool_whose_whole_entry_is_set():
    """``--autoscale`` caps each pool at its ``--fleet`` size; a ``--set`` of the pool's whole
    entry that names no cap keeps it (it fell back to ``autoscaler.max_replicas``, 16, and the
    simulated pool could grow past the fleet), and one that names a cap is taken."""
    from infra.sim.cli import _config

    kept = _config([], ['autoscaler.pools.h100@llama-3-8b={"min_replicas": 1}'], True, "h100:4")
    assert kept.autoscaler.bounds("h100@llama-3-8b") == (1, 4)
    named = _config([], ['autoscaler.pools.h100@llama-3-8b={"max_replicas": 2}'], True, "h100:4")
    assert named.autoscaler.bounds("h100@llama-3-8b") == (0, 2)
