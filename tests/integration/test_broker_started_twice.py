"""Two starts of one embedded broker at once (two `governor broker start`, `up` or `demo` of one
GOVERNOR_HOME and port): the one starts it, the other finds it running. Before 7 Dec both passed
the port check (the first JVM binds its ports seconds after it is spawned) and spawned a JVM;
the second's exited on the data directory's lock, and its start failed removing the pid file
the first had written: that broker ran on with none, `broker stop` said it was another home's,
and only a `kill` stopped it (on a fresh home the second failed formatting the data instead)."""

import threading
from pathlib import Path

import pytest

from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports, install_kafka

pytestmark = pytest.mark.integration


def _running_on(server_properties: Path) -> list[int]:
    """The pids whose command line names ``server_properties`` (a broker's JVM)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and str(server_properties).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def _started_at_once(brokers: list[EmbeddedKafka]) -> list:
    """Each broker's ``start`` run at the same moment, in a thread of its own: what each
    returned, or raised."""
    together = threading.Barrier(len(brokers))
    outcomes: list = [None] * len(brokers)

    def start(n: int) -> None:
        together.wait()
        try:
            outcomes[n] = brokers[n].start(timeout_s=120)
        except Exception as exc:  # noqa: BLE001 - the test's to say
            outcomes[n] = exc

    threads = [threading.Thread(target=start, args=(n,)) for n in range(len(brokers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return outcomes


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="reads /proc")
def test_two_starts_at_once_run_one_broker_that_stop_stops(tmp_path):
    port, controller_port = free_ports(2)
    settings = BrokerSettings(port=port, controller_port=controller_port, home=tmp_path / "k")
    install_kafka(settings.version)  # (not downloaded by both at once)
    brokers = [EmbeddedKafka(settings, progress=lambda _: None) for _ in range(2)]
    try:
        assert _started_at_once(brokers) == [f"127.0.0.1:{port}"] * 2
        running = _running_on(brokers[0].server_properties)
        assert running == [brokers[0].status().pid], running
    finally:
        brokers[0].stop()
        for pid in _running_on(brokers[0].server_properties):  # (left over: the test failed)
            EmbeddedKafka._kill(brokers[0], pid, grace_s=5.0)
    assert _running_on(brokers[0].server_properties) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="reads /proc")
def test_two_homes_started_at_once_on_one_port_run_one_broker_and_the_other_start_fails(
        tmp_path):
    """Two homes on one port, started at once: both pass the port check, and one JVM binds it.
    The other start fails (its JVM exited) instead of taking the first's broker for its own:
    before 7 Dec it said "Kafka is up" where its JVM had exited, and its `stop` stopped none."""
    port, controller_port = free_ports(2)
    brokers = [EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port,
                                            home=tmp_path / f"k{n}"), progress=lambda _: None)
               for n in range(2)]
    install_kafka(brokers[0].settings.version)
    try:
        outcomes = _started_at_once(brokers)
        started = [n for n in range(2) if outcomes[n] == f"127.0.0.1:{port}"]
        assert len(started) == 1, outcomes
        failed = brokers[1 - started[0]]
        assert "exited" in str(outcomes[1 - started[0]]), outcomes
        assert _running_on(failed.server_properties) == []
        assert _running_on(brokers[started[0]].server_properties) == [
            brokers[started[0]].status().pid]
    finally:
        for broker in brokers:
            broker.stop()
            for pid in _running_on(broker.server_properties):  # (left over: the test failed)
                EmbeddedKafka._kill(broker, pid, grace_s=5.0)
