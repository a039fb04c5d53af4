"""Ctrl-C or SIGTERM during ``governor bench`` (minutes in full) stops its runs with it and says
how far it got, exit 130. Before 7 Dec SIGTERM ended the bench alone: its runs in flight ran on
and each printed a ``BrokenPipeError`` traceback as it found the bench gone; Ctrl-C at a
terminal (sent to the whole process group) left a stray ``Process ForkPoolWorker-N:`` line and
no word of what was done."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.workloads import default_traces_dir

ROOT = Path(__file__).resolve().parents[3]


#: The bench with its runs stubbed: each misses the SIGTERM that would stop it (it ignores it, as a
#: process forked just before the SIGTERM came does: Python, setting itself up there, drops it)
#: and sends the bench a Ctrl-C.
PROGRAM_RUNS_MISS_THEIR_SIGTERM = """
import os, signal, sys, threading
from pathlib import Path
import benchmarks.policy_bench as bench

def run_missing_its_sigterm(case):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.kill(os.getppid(), signal.SIGINT)
    threading.Event().wait()  # (the run goes on until it is killed)

bench.run_case = run_missing_its_sigterm
signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job's is ignored)
try:
    bench.run_bench(Path(sys.argv[1]), quick=True, jobs=2)
except bench.BenchInterrupted as exc:
    print(exc)
"""


def _read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """What ``proc`` wrote on stderr until a line holding ``text`` (an error after
    ``timeout_s``)."""
    seen, deadline = "", time.monotonic() + timeout_s
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {text!r} within {timeout_s} s: {seen!r}"
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if ready:
            line = proc.stderr.readline()
            assert line, f"the bench ended before {text!r}: {seen!r}"
            seen += line
    return seen


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.skipif(not (default_traces_dir() / "mooncake_fast25").is_dir(),
                    reason="no shared data")
@pytest.mark.parametrize("stop", ["sigterm to the bench", "ctrl-c at its terminal"])
def test_an_interrupted_bench_stops_its_runs_and_says_how_far_it_got(tmp_path: Path, stop):
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "bench", "--quick", "--jobs", "2",
         "--out", str(tmp_path / "bench")], cwd=ROOT, stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    try:
        _read_until(proc, "1/47 ", timeout_s=120)  # runs in flight: the next ones
        if stop == "sigterm to the bench":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=60)  # (all its stderr: its runs' too)
        assert proc.returncode == 130, rest
        assert _group_gone(proc.pid), "a run of the bench is still running"
    finally:
        if not _group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    last = rest.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and last.endswith(" of 47 runs done; no report "
                                                               "written"), rest
    assert "Traceback" not in rest and "ForkPoolWorker" not in rest, rest
    assert not (tmp_path / "bench" / "REPORT.md").exists()


def test_a_ctrl_c_stops_the_bench_whose_runs_missed_their_sigterm(tmp_path: Path):
    """Before 7 Dec the bench's pool sent its runs SIGTERM and waited for ever on one forked
    just before it, which Python had dropped: the bench hung on a Ctrl-C. It kills them now."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM_RUNS_MISS_THEIR_SIGTERM,
                             str(tmp_path / "bench")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if not _group_gone(proc.pid):  # (its runs too)
            os.killpg(proc.pid, signal.SIGKILL)
    assert out.strip() == "interrupted: 0 of 47 runs done; no report written", out + err
    assert "Traceback" not in err, err
