"""``python -m benchmarks.vllm_contact --json FILE`` with a stdout whose reader has gone
(``... | head -1``): before 7 Dec it printed the checks first, the print ended it, and FILE,
written after them, was never written. Now FILE is written first, as ``sim`` and ``demo`` write
their reports. (The checks themselves: ``tests/integration/test_vllm_contact_check.py``.)"""

import io
import json
import sys

import pytest

import benchmarks.vllm_contact as contact
from benchmarks.vllm_contact import Check


class ReaderGone(io.StringIO):
    """A stdout whose reader has gone: each write fails, as a pipe's does then."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_the_checks_file_is_written_though_stdout_is_closed(tmp_path, monkeypatch):
    checks = [Check("model card", "PASS", "m, max_model_len 4096"), Check("abort", "FAIL", "x")]

    async def run_checks(*args, **kwargs):
        return checks

    out = tmp_path / "checks.json"
    monkeypatch.setattr(contact, "run_checks", run_checks)
    monkeypatch.setattr(sys, "argv", ["vllm_contact", "--url", "http://h:1", "--json", str(out)])
    monkeypatch.setattr(sys, "stdout", ReaderGone())
    with pytest.raises(BrokenPipeError):
        contact.main()
    assert json.loads(out.read_text()) == [
        {"name": "model card", "status": "PASS", "detail": "m, max_model_len 4096"},
        {"name": "abort", "status": "FAIL", "detail": "x"}]
