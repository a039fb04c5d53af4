"""A second Ctrl-C while ``governor up`` stops its stack does not cut the stop short. The first
cancels ``up``'s loop, whose cleanup stops the stack (up to 50 s); asyncio turns a second into
``KeyboardInterrupt``, raised in the main thread. Before 6 Dec the stop ran there, inside the
loop, and the interrupt ended it partway: the components not stopped yet were left running, in
process groups of their own that no Ctrl-C reaches. It now runs in a thread of its own, which
the interrupt does not reach, and asyncio waits for it before ``up`` exits. (A stop signal after
a SIGTERM or SIGHUP is ignored: ``tests/unit/infra/test_cli_signals.py``.)

The real loop of ``run_up`` on the real broker, in a process of its own (signals go to it alone);
its stack is a stand-in whose stop lasts until the test has sent the second Ctrl-C."""

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROGRAM = """
import asyncio, sys
from pathlib import Path
from rich.console import Console
import infra.up
from infra.cli import _sigterm_as_interrupt

class SlowStop:
    '''The stack ``up`` runs, without processes: its stop lasts until stdin has a line.'''
    slots, log_dir, looped = [0], Path("."), False

    def __init__(self, bootstrap, namespace, *args, **kwargs):
        self.namespace = namespace

    def start(self): ...
    def refused(self): return {}
    def dead(self): return []
    def running_workers(self): return {}
    def rotate_logs(self): ...

    def revive(self):
        if not self.looped:  # (the first pass of up's loop)
            self.looped = True
            print("looping", flush=True)
        return {}

    def stop(self):
        print("stopping", flush=True)
        sys.stdin.readline()
        print("stopped all", flush=True)

async def no_supervisor(stack, bootstrap, catalog, stopping):
    await stopping.wait()

infra.up.Stack, infra.up.supervise = SlowStop, no_supervisor
bootstrap, namespace, where = sys.argv[1:]
_sigterm_as_interrupt()  # (the stop signals handled as `governor up` has them)
try:
    asyncio.run(infra.up.run_up(bootstrap, namespace, "h100:1", Path(where), Path(where),
                                Console(file=sys.stderr)))
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.strip())


def _until(lines: queue.Queue, expected: str, seen: list[str], timeout_s: float = 60) -> None:
    """Read ``lines`` into ``seen`` until ``expected`` comes (``queue.Empty`` after
    ``timeout_s`` without a line)."""
    while expected not in seen:
        seen.append(lines.get(timeout=timeout_s))


def test_a_second_ctrl_c_while_up_stops_lets_the_stop_finish(kafka_bootstrap, catalog,
                                                             tmp_path):
    up = subprocess.Popen([sys.executable, "-c", PROGRAM, kafka_bootstrap, catalog.namespace,
                           str(tmp_path)], cwd=REPO, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_lines, args=(up.stdout, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        _until(lines, "looping", seen)
        up.send_signal(signal.SIGINT)  # Ctrl-C: up stops its stack
        _until(lines, "stopping", seen)
        up.send_signal(signal.SIGINT)  # a second, while the stop goes on
        up.stdin.write("the stop ends\n")
        up.stdin.flush()
        up.wait(timeout=60)
    finally:
        up.kill()  # (the test failed first: nothing is left running)
    reader.join(timeout=10)  # (to the end of up's output)
    seen += list(lines.queue)
    assert seen == ["looping", "stopping", "stopped all", "interrupted"]


def test_a_stop_signal_while_up_starts_its_stack_stops_what_started(kafka_bootstrap, catalog,
                                                                   tmp_path, monkeypatch):
    """An interrupt while ``up`` starts its components (a second Ctrl-C; a SIGTERM or SIGHUP
    cancels ``up``'s task at its next ``await`` since 7 Dec: ``infra.stop_signals``): those
    started are stopped. Before 6 Dec (evening)
    the stack was started before the ``try`` whose cleanup stops it, and the components started
    were left running."""
    import asyncio

    from rich.console import Console

    import infra.up

    calls: list[str] = []

    class InterruptedStart:
        slots, log_dir = [0], Path(".")

        def __init__(self, bootstrap, namespace, *args, **kwargs) -> None:
            self.namespace = namespace

        def start(self) -> None:
            calls.append("started some")
            raise KeyboardInterrupt  # (a SIGTERM partway through)

        def stop(self) -> None:
            calls.append("stopped")

    async def no_supervisor(stack, bootstrap, catalog, stopping) -> None:
        await stopping.wait()

    monkeypatch.setattr(infra.up, "Stack", InterruptedStart)
    monkeypatch.setattr(infra.up, "supervise", no_supervisor)
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(infra.up.run_up(kafka_bootstrap, catalog.namespace, "h100:1", tmp_path,
                                    tmp_path, Console(file=sys.stderr)))
    assert calls == ["started some", "stopped"]
