"""What a ``governor up`` or ``demo`` killed outright leaves behind is taken over by the next one:
the broker it started (``owner.json``, ``EmbeddedKafka._found_running``), which the next one
stops as it exits, and the components still stopping (``stack.json``, ``left_running``), which
the next ``up`` waits for. Processes are named by pid and start time (``infra.owners``).
The whole of it, on a real broker: ``tests/integration/test_up_killed.py``."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import infra.kafka.broker as broker_module
from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports
from infra.owners import Owned, read_json, started_at, write_atomically
from infra.stack import STACK_RECORD, PoolSpec, Stack, left_running, wait_for_left_running
from schemas.errors import GovernorError
from tests.unit.infra.test_kafka import _sleeper


def _gone(command: str = "governor up") -> Owned:
    """A process that ran and is gone (exited and reaped), as an owner file named it."""
    process = _sleeper()
    owned = Owned.of(process.pid, command)
    process.kill()
    process.wait()
    assert owned is not None
    return owned


def test_a_process_is_told_by_its_pid_and_its_start_time() -> None:
    assert Owned.this().alive()
    assert not _gone().alive()
    assert not Owned(os.getpid(), "0").alive()  # (another process under its pid since)
    zombie = _sleeper()
    zombie.kill()
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # (exited, not reaped)
    try:
        assert started_at(zombie.pid) is None
    finally:
        zombie.wait()


@pytest.mark.parametrize("value", [None, [], {"pid": "12", "started": "1"},
                                   {"pid": True, "started": "1"}, {"pid": 0, "started": "1"},
                                   {"pid": 12}, {"pid": 12, "started": "1", "command": 3}])
def test_an_owner_file_that_names_no_process_names_no_owner(value) -> None:
    assert Owned.from_json(value) is None


def test_an_owner_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "owner.json"
    path.write_text('{"pid": 1, "started": "1", "command": "governor demo"}\n')
    write_atomically(path, Owned.this("governor up").as_json())
    assert Owned.from_json(read_json(path)) == Owned.this("governor up")
    assert [file.name for file in tmp_path.iterdir()] == ["owner.json"]  # (no partial left)
    path.write_text('{"pid": 1, "sta')  # (cut short: by hand, or a disk full)
    assert read_json(path) is None


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An embedded broker of ``tmp_path`` whose JVM runs (a stand-in, answering at once), and
    what its start says."""
    said: list[str] = []
    port, controller_port = free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                         home=tmp_path), progress=said.append)
    jvm = _sleeper("kafka.Kafka", str(kafka.server_properties))
    kafka.pid_file.write_text(f"{jvm.pid}\n")

    async def answers(bootstrap: str, timeout_s: float) -> None:
        return None

    monkeypatch.setattr(broker_module, "wait_until_answers", answers)
    try:
        yield kafka, said, jvm.pid
    finally:
        jvm.kill()
        jvm.wait()


def test_up_takes_over_a_broker_whose_owner_is_gone(running) -> None:
    """Before 7 Dec it took it for one the user runs, and left it running at its exit."""
    kafka, said, jvm = running
    gone = _gone()
    write_atomically(kafka.owner_file, gone.as_json())
    kafka.start(owner="governor up")
    assert (kafka.adopted, kafka.spawned) == (True, False)
    assert kafka.owner() == Owned.this("governor up")
    assert said == [f"Kafka is already running (pid {jvm}) at {kafka.bootstrap}, started by "
                    f"governor up (pid {gone.pid}), which is gone: this governor up stops it "
                    "as it exits"]
    assert kafka.status().owner == Owned.this("governor up")
    assert kafka.stop() is True
    assert not kafka.owner_file.exists() and not kafka.pid_file.exists()


def test_up_leaves_a_broker_whose_owner_runs_to_it(running) -> None:
    kafka, said, jvm = running
    owner = _sleeper()
    try:
        other = Owned.of(owner.pid, "governor demo")
        write_atomically(kafka.owner_file, other.as_json())
        kafka.start(owner="governor up")
        assert kafka.adopted is False and kafka.owner() == other
        assert said == [f"Kafka is already running (pid {jvm}) at {kafka.bootstrap}, started by "
                        f"governor demo (pid {owner.pid}), which stops it as it exits"]
    finally:
        owner.kill()
        owner.wait()


def test_up_leaves_a_broker_of_the_users_to_them(running) -> None:
    """`governor broker start`'s: no owner file; it runs until `governor broker stop`."""
    kafka, said, jvm = running
    kafka.start(owner="governor up")
    assert kafka.adopted is False and not kafka.owner_file.exists()
    assert said == [f"Kafka is already running (pid {jvm}) at {kafka.bootstrap}"]


def test_broker_start_makes_a_broker_whose_owner_is_gone_the_users(running) -> None:
    kafka, said, jvm = running
    gone = _gone("governor demo")
    write_atomically(kafka.owner_file, gone.as_json())
    kafka.start()
    assert kafka.adopted is False and not kafka.owner_file.exists()
    assert said == [f"Kafka is already running (pid {jvm}) at {kafka.bootstrap}, started by "
                    f"governor demo (pid {gone.pid}), which is gone: it runs on until "
                    f"`governor broker stop --port {kafka.settings.port}`"]


class _SleepingStack(Stack):
    """A stack whose components are processes that sleep."""

    def _start_process(self, name: str, args: list[str]) -> subprocess.Popen:
        return _sleeper(name)


def test_a_stack_records_its_supervisor_and_each_component_it_starts(tmp_path: Path) -> None:
    stack = _SleepingStack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path,
                           record="governor up", finish_s=0.1)
    try:
        stack.start()
        record = read_json(tmp_path / STACK_RECORD)
        assert Owned.from_json(record["supervisor"]) == Owned.this("governor up")
        assert {name: Owned.from_json(value).pid
                for name, value in record["components"].items()} == {
            name: process.pid for name, process in stack.processes.items()}
        assert left_running(tmp_path) == (None, {})  # (its supervisor runs)
    finally:
        stack.stop(timeout_s=5)
    assert not (tmp_path / STACK_RECORD).exists()


def _left_by_a_killed_up(log_dir: Path, components: dict[str, subprocess.Popen]) -> Owned:
    """``log_dir``'s record of a stack whose supervisor is gone, of ``components``."""
    supervisor = _gone()
    write_atomically(log_dir / STACK_RECORD, {
        "supervisor": supervisor.as_json(),
        "components": {name: Owned.of(process.pid, name).as_json()
                       for name, process in components.items()}})
    return supervisor


def test_up_waits_for_the_components_a_killed_up_left_running(tmp_path: Path) -> None:
    """They stop by themselves (``infra.supervised``); before 7 Dec the next ``up`` started its
    stack beside them, and its worker or sink, refused the slot or the store of one still
    stopping, stopped it."""
    stopping = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"],
                                stdin=subprocess.PIPE, text=True)
    stopped = _gone("worker-0")
    said: list[str] = []
    try:
        supervisor = _left_by_a_killed_up(tmp_path, {"sink": stopping})
        record = read_json(tmp_path / STACK_RECORD)
        record["components"]["worker-0"] = stopped.as_json()
        write_atomically(tmp_path / STACK_RECORD, record)

        def say(line: str) -> None:
            said.append(line)
            stopping.stdin.close()  # (it stops once told it waits)

        assert wait_for_left_running(tmp_path, say, timeout_s=60) == []
        assert stopping.wait(timeout=10) == 0  # (it exited by itself: not killed)
    finally:
        stopping.kill()
        stopping.wait()
    assert said == [f"{supervisor}, whose logs are in {tmp_path}, is gone; its components stop "
                    f"by themselves: waiting for sink (pid {stopping.pid})", "they have stopped"]


def test_up_kills_the_components_a_killed_up_left_that_do_not_stop(tmp_path: Path) -> None:
    """Paused or hung past as long as ``Stack.stop`` gives a component to exit."""
    hung = _sleeper()
    said: list[str] = []
    try:
        os.kill(hung.pid, signal.SIGSTOP)
        _left_by_a_killed_up(tmp_path, {"router": hung})
        assert wait_for_left_running(tmp_path, said.append, timeout_s=0.5) == ["router"]
        assert hung.wait(timeout=10) == -signal.SIGKILL
    finally:
        hung.kill()
        hung.wait()
    assert said[1:] == [f"killing router (pid {hung.pid}): still running 0.5 s on"]


def test_nothing_is_waited_for_where_no_component_was_left(tmp_path: Path) -> None:
    said: list[str] = []
    assert wait_for_left_running(tmp_path, said.append) == []  # (no record)
    _left_by_a_killed_up(tmp_path, {})  # (each stopped, as after a stop of its own)
    assert wait_for_left_running(tmp_path, said.append) == []
    (tmp_path / STACK_RECORD).write_text(json.dumps({"supervisor": _gone().as_json()}))
    assert wait_for_left_running(tmp_path, said.append) == []
    (tmp_path / STACK_RECORD).write_text("{")
    assert wait_for_left_running(tmp_path, said.append) == []
    assert said == []


def test_a_second_up_on_a_log_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    """An ``up`` holds its log dir while it runs: a second one there is an error naming the
    first (from the lock it holds, from its start on), before it starts or reaches any broker
    (before 7 Dec both ran, writing each other's logs and record); once the first lets go, it
    may run."""
    from typer.testing import CliRunner

    import infra.cli as cli
    from infra.stack import hold_log_dir

    log_dir = tmp_path / "up"
    log_dir.mkdir()
    first = hold_log_dir(log_dir)
    try:
        with pytest.raises(GovernorError, match=r"governor up \(pid \d+\) runs on --log-dir"):
            hold_log_dir(log_dir)
        said = CliRunner().invoke(cli.app, [
            "up", "--log-dir", str(log_dir), "--data-dir", str(tmp_path / "data"),
            "--bootstrap", "127.0.0.1:1"])
        assert isinstance(said.exception, GovernorError), said.output
        assert f"governor up (pid {os.getpid()}) runs on --log-dir {log_dir}" in str(
            said.exception)
    finally:
        first.close()
    hold_log_dir(log_dir).close()  # (let go: the next one holds it)


def test_a_log_dir_whose_lock_cannot_be_taken_is_an_error_naming_it(tmp_path: Path) -> None:
    """A lock that cannot be opened (here a folder in its place; a file of another user's) is
    an error naming ``--log-dir``, not a traceback."""
    from infra.stack import UP_LOCK, hold_log_dir

    (tmp_path / UP_LOCK).mkdir()
    with pytest.raises(GovernorError, match=rf"--log-dir {tmp_path}: cannot open {UP_LOCK}"):
        hold_log_dir(tmp_path)
