"""``python -m benchmarks.vllm_contact --json FILE`` with a stdout whose reader has gone
(``... | head -1``): before 7 Dec it printed the checks first, the print ended it, and FILE,
written after them, was never written. Now FILE is written first, as ``sim`` and ``demo`` write
their reports, and the check ends quietly, exit 1, as a ``governor`` command does there (before
7 Dec, late, with a ``BrokenPipeError`` traceback). (The checks themselves:
``tests/integration/test_vllm_contact_check.py``.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: The check, its checks stubbed (all passing: it would exit 0), writing to ``argv[1]``.
CHECK_WITH_STUB_CHECKS = """
import sys
import benchmarks.vllm_contact as contact
from benchmarks.vllm_contact import Check

async def run_checks(*args, **kwargs):
    return [Check("model card", "PASS", "m, max_model_len 4096"), Check("abort", "PASS", "x")]

contact.run_checks = run_checks
sys.argv = ["vllm_contact", "--url", "http://h:1", "--json", sys.argv[1]]
contact.main()
"""


@pytest.mark.parametrize("unbuffered", ["1", ""])  # (buffered: the write fails at the exit)
def test_the_checks_file_is_written_and_the_check_ends_quietly_though_stdout_is_closed(
        tmp_path, unbuffered):
    out = tmp_path / "checks.json"
    read, write = os.pipe()
    os.close(read)  # (no reader at all: the first write to stdout fails)
    try:
        done = subprocess.run([sys.executable, "-c", CHECK_WITH_STUB_CHECKS, str(out)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                              "PYTHONUNBUFFERED": unbuffered})
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (1, "")  # (click's answer to a closed stdout)
    assert json.loads(out.read_text()) == [
        {"name": "model card", "status": "PASS", "detail": "m, max_model_len 4096"},
        {"name": "abort", "status": "PASS", "detail": "x"}]
