"""Workload builders: ServeGen multi-tenant arrivals and ShareGPT workflows (shared data)."""

import re
from pathlib import Path

import numpy as np
import pytest

from infra.traces import load_trace, write_governor_jsonl
from infra.workloads import build_workload, default_traces_dir
from infra.workloads.arrivals import renewal_arrivals

TRACES = default_traces_dir()
needs_data = pytest.mark.skipif(not (TRACES / "servegen").is_dir(), reason="no shared data")


@pytest.mark.parametrize("dist,shape", [("Gamma", 0.5), ("Weibull", 0.6), ("", 0.0)])
def test_renewal_arrivals_keep_the_rate(dist, shape):
    times = renewal_arrivals(0.0, 20_000.0, dist, shape, 2.0, np.random.default_rng(0))
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 20_000
    assert len(times) / 20_000 == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("dist,shape", [("Gamma", 0.2), ("Weibull", 0.4), ("", 0.0)])
def test_renewal_arrivals_start_in_steady_state_not_at_the_window_start(dist, shape):
    # many short windows of a bursty process: arrivals in each window's first 1% stay near 1%
    rng, first, total = np.random.default_rng(1), 0, 0
    for w in range(2_000):
        times = renewal_arrivals(w * 600.0, (w + 1) * 600.0, dist, shape, 0.05, rng)
        first += sum(t < w * 600.0 + 6.0 for t in times)
        total += len(times)
    assert total / (2_000 * 600) == pytest.approx(0.05, rel=0.1)
    assert first / total < 0.02


def test_a_rate_far_below_one_arrival_per_window_gives_almost_none():
    rng = np.random.default_rng(2)
    counts = [len(renewal_arrivals(0.0, 2.0, "Weibull", 0.4, 1e-5, rng)) for _ in range(1_000)]
    assert sum(counts) <= 2  # about 2e-5 expected per window


@needs_data
def test_servegen_is_deterministic_multi_tenant_and_scaled():
    a = build_workload("servegen", traces_dir=TRACES, duration_s=120, mean_rps=5.0, seed=4)
    b = build_workload("servegen", traces_dir=TRACES, duration_s=120, mean_rps=5.0, seed=4)
    assert a == b
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)
    assert all(0 <= r.arrival_s < 120 for r in a)
    assert len(a) / 120 == pytest.approx(5.0, rel=0.5)  # bursty tenants: loose
    tenants = {r.tenant for r in a}
    assert len(tenants) > 5 and all(t.startswith("m-mid-t") for t in tenants)
    assert {r.priority for r in a} <= {2, 5, 8}
    assert all(r.prompt_tokens >= 0 and r.output_tokens >= 1 for r in a)


@needs_data
def test_sharegpt_turns_resend_the_history_as_a_prefix(tmp_path: Path):
    items = build_workload("sharegpt", traces_dir=TRACES, duration_s=60, rate_scale=0.2, seed=2)
    tasks: dict[str, list] = {}
    for r in items:
        tasks.setdefault(r.task_id, []).append(r)
    assert len(tasks) > 10
    for steps in tasks.values():
        steps.sort(key=lambda r: r.step)
        assert [r.step for r in steps] == list(range(1, len(steps) + 1))
        assert all(r.steps_total == len(steps) for r in steps)
        for before, after in zip(steps, steps[1:]):
            assert after.arrival_s > before.arrival_s
            assert after.prompt_tokens > before.prompt_tokens
            assert after.hash_ids[:len(before.hash_ids)] == before.hash_ids
    path = tmp_path / "w.jsonl"
    assert write_governor_jsonl(items, path) == len(items)
    assert list(load_trace(path)) == items


@needs_data
def test_a_servegen_workload_too_large_to_hold_is_refused_before_it_is_built():
    """A day at the published rates is tens of millions of requests: refused at once, naming
    the options that shrink it, rather than filling the machine's memory without a word."""
    from infra.traces import TraceError

    with pytest.raises(TraceError, match=r"over the 2,000,000 a workload holds; shorten "
                                         r"--duration or set a lower --mean-rps"):
        build_workload("servegen", duration_s=86_400)


@needs_data
@pytest.mark.parametrize(("kwargs", "says"), [
    (dict(duration_s=7_200), "the Azure conversation trace ends 3,502 s in"),
    (dict(duration_s=60, mean_rps=3.0), "azure arrivals keep the trace's"),
])
def test_sharegpt_refuses_what_its_arrivals_cannot_give(kwargs: dict, says: str):
    from infra.traces import TraceError

    with pytest.raises(TraceError, match=re.escape(says)):
        build_workload("sharegpt", traces_dir=TRACES, **kwargs)


@needs_data
@pytest.mark.parametrize(("kind", "kwargs", "says"), [
    # a window running past day 14 was cut short, its rate averaged over the empty part (a
    # --mean-rps of 1 gave 18.5 requests/s in its first 100 s, then none)
    ("servegen", dict(start_s=1_209_500, duration_s=1_200, mean_rps=1.0),
     "ServeGen covers 1,209,600 s (14 days): --start-s 1209500 and --duration 1200 end at "
     "1,210,700 s, past it"),
    # an option the workload ignores: before 5 Dec the same file was written without it
    ("servegen", dict(duration_s=10, mean_rps=5.0, arrivals="poisson"),
     "--arrivals sets how sharegpt tasks start"),
    ("sharegpt", dict(duration_s=30, start_s=100.0), "--start-s applies to ServeGen arrivals "
                                                     "only (servegen, or sharegpt --arrivals "
                                                     "servegen), not to azure arrivals"),
    ("sharegpt", dict(duration_s=30, arrivals="poisson", model="m-small"),
     "--model applies to ServeGen arrivals only"),
])
def test_a_workload_refuses_what_it_cannot_honour(kind: str, kwargs: dict, says: str):
    from infra.traces import TraceError

    with pytest.raises(TraceError, match=re.escape(says)):
        build_workload(kind, traces_dir=TRACES, **kwargs)


def test_a_servegen_model_or_folder_it_has_no_data_of_names_the_option(tmp_path: Path):
    """Before 6 Dec `workload build servegen --model m-big` said `no ServeGen data for model
    'm-big' in .../servegen/m-big`, naming neither `--model` nor the models there are, and a
    missing data folder named neither `--data-dir` nor `GOVERNOR_DATA_DIR`."""
    from infra.traces import TraceError

    for name in ("m-small", "m-mid"):
        (tmp_path / "servegen" / name).mkdir(parents=True)
    (tmp_path / "servegen" / "aggregate_rate_language_m-mid.csv").write_text("")
    with pytest.raises(TraceError) as refused:
        build_workload("servegen", traces_dir=tmp_path, model="m-big", duration_s=10)
    assert str(refused.value) == (f"--model 'm-big': no ServeGen data of it in "
                                  f"{tmp_path / 'servegen'}; choose m-mid or m-small")
    with pytest.raises(TraceError) as refused:
        build_workload("servegen", traces_dir=tmp_path / "none", duration_s=10)
    assert str(refused.value) == (f"no ServeGen data in {tmp_path / 'none' / 'servegen'}: give "
                                  "--data-dir the traces folder that holds servegen/ (default: "
                                  "$GOVERNOR_DATA_DIR/traces, else ../shared/data/traces next "
                                  "to the checkout)")


@pytest.mark.parametrize(("arrivals", "needed"), [
    ("azure", "sharegpt_lengths/sharegpt_v3_turn_lengths_cl100k.csv and "
              "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"),
    ("poisson", "sharegpt_lengths/sharegpt_v3_turn_lengths_cl100k.csv")])
def test_a_folder_without_sharegpt_data_names_the_option_and_what_it_holds(tmp_path: Path,
                                                                           arrivals, needed):
    """Before 7 Dec `workload build sharegpt --data-dir WRONG` named the first file it missed
    (`trace file not found: WRONG/azure_llm_2023/AzureLLMInferenceTrace_conv.csv`), not the
    option that points there."""
    from infra.traces import TraceError

    with pytest.raises(TraceError) as refused:
        build_workload("sharegpt", traces_dir=tmp_path, arrivals=arrivals, duration_s=10)
    assert str(refused.value).endswith(
        f": give --data-dir the traces folder that holds {needed} (default: "
        "$GOVERNOR_DATA_DIR/traces, else ../shared/data/traces next to the checkout)")
    assert str(refused.value).startswith(f"no ShareGPT data in {tmp_path} (no ")


@needs_data
def test_sharegpt_with_servegen_arrivals_takes_servegens_options():
    starts = build_workload("sharegpt", traces_dir=TRACES, duration_s=30, arrivals="servegen",
                            model="m-small", start_s=200_000.0, mean_rps=0.5, seed=1)
    assert starts and starts == build_workload(
        "sharegpt", traces_dir=TRACES, duration_s=30, arrivals="servegen", model="m-small",
        start_s=200_000.0, mean_rps=0.5, seed=1)


@needs_data
def test_sharegpt_tasks_past_the_last_conversation_share_no_prefix_with_the_first_pass():
    from infra.workloads.sharegpt import load_conversations, sharegpt_workflows

    count = len(load_conversations(TRACES))
    starts = [float(i) for i in range(count + 50)]
    tasks: dict[str, set[int]] = {}
    for r in sharegpt_workflows(TRACES, starts, seed=1):
        tasks.setdefault(r.task_id, set()).update(r.hash_ids[:1])
    first = {h for task, hs in tasks.items() if int(task.rsplit("-", 1)[1]) < count for h in hs}
    again = {h for task, hs in tasks.items() if int(task.rsplit("-", 1)[1]) >= count for h in hs}
    assert again and not first & again


@needs_data
@pytest.mark.parametrize(("kind", "options"), [
    ("servegen", {"duration_s": 20.0, "mean_rps": 3.0, "seed": 4}),
    ("sharegpt", {"duration_s": 15.0, "arrivals": "servegen", "mean_rps": 0.5, "seed": 4,
                  "rate_scale": 1.5})])
def test_a_built_workload_simulates_alike_from_its_file_in_another_process(
        tmp_path: Path, kind: str, options: dict):
    """One workload, two ways: built and simulated here (as ``governor bench`` does), and
    ``governor workload build`` then ``governor sim`` in processes of another hash seed. The
    files are the same bytes and the reports the same, but for the trace's name and the
    fields that measure the run."""
    import json
    import os
    import subprocess
    import sys

    from infra.sim import SimOptions, simulate

    items = build_workload(kind, **options)
    flags = [f"--{name.removesuffix('_s').replace('_', '-')}={value}"
             for name, value in options.items()]  # (duration_s: --duration)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    governor = [sys.executable, "-m", "infra.cli"]
    written = tmp_path / "w.jsonl"
    subprocess.run([*governor, "workload", "build", kind, "--out", str(written), *flags],
                   check=True, env=env, capture_output=True)
    here = tmp_path / "here.jsonl"
    write_governor_jsonl(items, here)
    assert written.read_bytes() == here.read_bytes()
    run = subprocess.run([*governor, "sim", str(written), "--fleet", "h100:1,a100:1",
                          "--seed", "3", "--no-progress"],
                         check=True, env=env, capture_output=True, text=True)
    report, _ = simulate(items, SimOptions(fleet="h100:1,a100:1", seed=3), "w.jsonl")
    printed = json.loads(run.stdout.strip().splitlines()[-1])
    measured = {"wall_s", "cpu_s", "requests_per_wall_s", "requests_per_cpu_s", "peak_rss_mib"}
    for name in [n for n in report if n in measured or n.startswith("wall_s_")]:
        report.pop(name), printed.pop(name)
    assert printed == report and report["requests"] == len(items) > 10


@pytest.mark.parametrize(("row", "says"), [
    ("c9,1,x,2,3", "line 4: field 'user_tokens_cl100k' has value 'x'; expected an integer >= 0"),
    ("c9,1,5,-2,3", "line 4: field 'assistant_tokens_cl100k' has value '-2'"),
    ("c9,1,5", "line 4: field 'history_tokens_before_turn_cl100k' has value None")])
def test_a_bad_row_of_sharegpt_lengths_is_named(tmp_path: Path, row: str, says: str):
    """``workload build sharegpt --data-dir`` of lengths of one's own: before, a bad cell
    stopped it with a Python traceback (``ValueError: invalid literal for int() with base 10:
    'x'``)."""
    from infra.traces import TraceError
    from infra.workloads.sharegpt import FILE, load_conversations

    path = tmp_path / FILE
    path.parent.mkdir()
    path.write_text("conversation_id,turn,user_tokens_cl100k,assistant_tokens_cl100k,"
                    "history_tokens_before_turn_cl100k\nc1,0,10,20,0\nc1,1,5,7,30\n"
                    f"{row}\n")
    with pytest.raises(TraceError, match=re.escape(f"{path} {says}")):
        load_conversations(tmp_path)
    path.write_text("conversation_id,turn,user_tokens\nc1,0,10\n")
    with pytest.raises(TraceError, match=re.escape(
            f"{path} line 1: the header lacks history_tokens_before_turn_cl100k, "
            "user_tokens_cl100k, assistant_tokens_cl100k")):
        load_conversations(tmp_path)


def test_a_sharegpt_workload_too_large_to_hold_is_refused_before_it_is_built(tmp_path: Path,
                                                                             monkeypatch):
    """ShareGPT workloads had no bound (ServeGen's had, ``MAX_REQUESTS``): ``sharegpt
    --arrivals poisson --mean-rps 1e6 --duration 60`` drew 60 million task starts, then built
    their steps, until the machine had no memory left. Here the bound is 50 requests."""
    import infra.workloads.sharegpt as sharegpt
    from infra.traces import TraceError

    monkeypatch.setattr(sharegpt, "MAX_REQUESTS", 50)
    lengths = tmp_path / sharegpt.FILE
    lengths.parent.mkdir()
    lengths.write_text("conversation_id,turn,user_tokens_cl100k,assistant_tokens_cl100k,"
                       "history_tokens_before_turn_cl100k\nc1,0,10,20,0\nc1,1,5,7,30\n"
                       "c2,0,8,9,0\n")  # (tasks of 2 and 1 steps, taken in turn)
    built = build_workload("sharegpt", traces_dir=tmp_path, arrivals="poisson", mean_rps=3,
                           duration_s=10, seed=1)
    assert 0 < len(built) <= 50
    with pytest.raises(TraceError) as info:  # (too many starts: not drawn)
        build_workload("sharegpt", traces_dir=tmp_path, arrivals="poisson", mean_rps=6,
                       duration_s=10)
    assert str(info.value) == (
        "ShareGPT with poisson arrivals: 10 s at 6.0 task starts/s is about 60 tasks, over the "
        "50 requests a workload holds; shorten --duration or set a lower --mean-rps (or "
        "--rate-scale)")
    with pytest.raises(TraceError, match=r"^ShareGPT: 34 tasks make 51 requests, over the 50 a "
                                         r"workload holds; shorten --duration or lower the task "
                                         r"start rate \(--mean-rps, --rate-scale\)$"):
        sharegpt.sharegpt_workflows(tmp_path, [float(t) for t in range(34)])


def test_a_sharegpt_build_works_out_each_conversations_steps_once(tmp_path: Path,
                                                                  monkeypatch):
    """The size check worked out every conversation's steps, then the build each task's
    again (before 7 Dec): now once a conversation, for both, whatever the tasks taken of it,
    and the workload is the same."""
    import infra.workloads.sharegpt as sharegpt

    lengths = tmp_path / sharegpt.FILE
    lengths.parent.mkdir()
    lengths.write_text("conversation_id,turn,user_tokens_cl100k,assistant_tokens_cl100k,"
                       "history_tokens_before_turn_cl100k\nc1,0,10,20,0\nc1,1,5,7,30\n"
                       "c2,0,8,9,0\n")
    starts = [float(t) for t in range(5)]  # (5 tasks of 2 conversations: each taken again)
    built = sharegpt.sharegpt_workflows(tmp_path, starts, seed=1)
    worked_out = []

    def steps(turns, max_turns, max_prompt_tokens):
        worked_out.append(turns)
        return sharegpt_steps(turns, max_turns, max_prompt_tokens)

    sharegpt_steps = sharegpt._steps
    monkeypatch.setattr(sharegpt, "_steps", steps)
    assert sharegpt.sharegpt_workflows(tmp_path, starts, seed=1) == built
    assert len({r.task_id for r in built}) == 5
    assert sorted(worked_out) == sorted([[(0, 10, 20), (30, 5, 7)], [(0, 8, 9)]])


@pytest.mark.parametrize(("trace_row", "dataset", "says"), [
    ("0,1.5,x", b"", r"chunk-7-trace\.csv line 2: not a ServeGen rate row \(window_start_s, "
                     r"rate_rps, cv, dist, p1, p2\): list index out of range"),
    ("0,fast,1,Gamma,0.5,1", b"", r"chunk-7-trace\.csv line 2: not a ServeGen rate row"),
    ("0,1.5,1,Gamma,0.5,1", b"not gzip", r"chunk-7-dataset\.json\.gz: not ServeGen length "
                                          r"distributions \(block 0\): "),
    ("0,1.5,1,Gamma,0.5,1", __import__("gzip").compress(b'{"0": {"input_tokens": "{1: ",'
                                                        b' "output_tokens": "{}"}}'),
     r"chunk-7-dataset\.json\.gz: not ServeGen length distributions \(block 0\): ")])
def test_servegen_data_of_ones_own_that_is_malformed_is_named(tmp_path: Path, trace_row: str,
                                                              dataset: bytes, says: str):
    """``workload build servegen --data-dir DIR``: before, a bad row or length file stopped
    it with a Python traceback (``IndexError``, ``ValueError``, ``gzip.BadGzipFile``,
    ``SyntaxError``)."""
    from infra.traces import TraceError
    from infra.workloads import servegen_workload

    folder = tmp_path / "servegen" / "m-x"
    folder.mkdir(parents=True)
    (folder / "chunk-7-trace.csv").write_text(f"600,0,0,,0,0\n{trace_row}\n")
    if dataset:
        (folder / "chunk-7-dataset.json.gz").write_bytes(dataset)
    with pytest.raises(TraceError, match=says):
        servegen_workload(tmp_path / "servegen", "m-x", start_s=0, duration_s=600)


@pytest.mark.parametrize(("pmf", "says"), [
    ("{100: -0.1, 200: 1.1}", "input_tokens: length 100 has probability -0.1; expected a finite "
                              "number >= 0"),
    ("{100: 0, 200: 0.0}", "input_tokens: its probabilities sum to 0; expected a finite sum "
                           "above 0"),
    ("{100: 1e999}", "input_tokens: length 100 has probability inf; expected a finite number >= 0"),
    ("{100: 1e308, 200: 1e308}", "input_tokens: its probabilities sum to inf"),
    ("{-5: 1.0}", "input_tokens: length -5 is not an integer >= 0"),
])
def test_servegen_lengths_of_ones_own_with_bad_probabilities_are_named(tmp_path: Path, pmf: str,
                                                                       says: str):
    """Before, a PMF with a negative probability, or probabilities summing to 0 (then NaN once
    normalised), failed inside numpy (``ValueError: probabilities are not non-negative``,
    ``probabilities contain NaN``) naming no file, block or field."""
    import gzip
    import json

    from infra.traces import TraceError
    from infra.workloads import servegen_workload

    folder = tmp_path / "servegen" / "m-x"
    folder.mkdir(parents=True)
    (folder / "chunk-7-trace.csv").write_text("0,1.5,1,Gamma,0.5,1\n")
    (folder / "chunk-7-dataset.json.gz").write_bytes(gzip.compress(json.dumps(
        {"0": {"input_tokens": pmf, "output_tokens": "{10: 1.0}"}}).encode()))
    path = folder / "chunk-7-dataset.json.gz"
    with pytest.raises(TraceError, match=re.escape(
            f"{path}: not ServeGen length distributions (block 0): {says}")):
        servegen_workload(tmp_path / "servegen", "m-x", start_s=0, duration_s=600)


@needs_data
def test_a_sharegpt_workload_built_faster_simulates_as_sim_rate_scale_runs_it():
    """``--rate-scale`` means one thing in ``workload build sharegpt`` and in ``sim``: task
    starts come that many times faster, each step keeping its offset from its task's start.
    Built at 2x over 20 s, or built over 40 s and simulated at 2x: the same report (but for a
    TTFT quantile's last digit, from the arrival times' rounding to the microsecond)."""
    from infra.sim import SimOptions, simulate

    faster = build_workload("sharegpt", duration_s=20.0, rate_scale=2.0)
    slower = build_workload("sharegpt", duration_s=40.0)
    assert len(faster) == len(slower) > 50
    a, _ = simulate(faster, SimOptions(fleet="h100:1", policy="kv_aware"), "w")
    b, _ = simulate(slower, SimOptions(fleet="h100:1", policy="kv_aware", rate_scale=2.0), "w")
    differ = {name for name in a if a[name] != b[name]}
    assert differ <= {"rate_scale", "ttft_cdf_s", "wall_s", "cpu_s", "requests_per_wall_s",
                      "requests_per_cpu_s", "peak_rss_mib", "wall_s_router", "wall_s_engines",
                      "wall_s_controllers"}, {name: (a[name], b[name]) for name in differ}
    assert a["ttft_cdf_s"] == pytest.approx(b["ttft_cdf_s"], abs=2e-4)
