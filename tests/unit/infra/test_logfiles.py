"""Rotation of the stack's component logs (``infra.logfiles``, ``Stack.rotate_logs``): a real
child process holding its log open in append mode, as ``Stack`` starts every component."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.logfiles import rotate
from infra.stack import Stack

#: Echoes each line of its stdin to its stdout (the log), flushed at once.
ECHO = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n    sys.stdout.flush()\n"


def _wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


@pytest.fixture
def writer(tmp_path: Path):
    """A child writing what it is sent to ``tmp_path / "c.log"``, opened as ``Stack`` opens it."""
    path = tmp_path / "c.log"
    with open(path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE,
                                stdout=log, stderr=subprocess.STDOUT, text=True)

    def write(text: str) -> None:
        before = path.stat().st_size
        proc.stdin.write(text)
        proc.stdin.flush()
        _wait_for(lambda: path.stat().st_size >= before + len(text))

    yield path, write
    proc.stdin.close()
    proc.wait(timeout=20)


def test_a_log_past_its_size_is_copied_and_cut_and_the_writer_goes_on_at_its_start(writer):
    path, write = writer
    write("a" * 99 + "\n")
    assert not rotate(path, max_bytes=100, keep=2)  # at the limit: kept
    write("b\n")
    assert rotate(path, max_bytes=100, keep=2)
    assert path.with_name("c.log.1").read_text() == "a" * 99 + "\nb\n"
    assert path.read_bytes() == b""
    write("after\n")
    # appended at the new end: no hole of the old length before it
    assert path.read_bytes() == b"after\n"


def test_older_copies_shift_up_and_the_oldest_is_dropped(writer):
    path, write = writer
    for text in ("first\n", "second\n", "third\n"):
        write(text * 3)
        assert rotate(path, max_bytes=10, keep=2)
    assert path.with_name("c.log.1").read_text() == "third\n" * 3
    assert path.with_name("c.log.2").read_text() == "second\n" * 3
    assert not path.with_name("c.log.3").exists()
    assert path.read_text() == ""


def test_a_missing_log_is_not_rotated(tmp_path: Path):
    assert not rotate(tmp_path / "none.log", max_bytes=0)
    assert list(tmp_path.iterdir()) == []


def test_the_stack_rotates_the_logs_of_its_components(tmp_path: Path):
    stack = Stack("127.0.0.1:1", "t", [], tmp_path, log_max_bytes=100, log_backups=1)
    stack.log_dir.mkdir(exist_ok=True)
    stack._spawn("router", ["--help"])  # a real component process: prints its usage, exits
    assert stack.processes["router"].wait(timeout=60) == 0
    assert (tmp_path / "router.log").stat().st_size > 100
    assert stack.rotate_logs() == ["router"]
    assert "Usage" in (tmp_path / "router.log.1").read_text()
    assert (tmp_path / "router.log").stat().st_size == 0
    assert stack.rotate_logs() == []  # nothing written since
