"""Unit tests of infra.kafka: configuration, provisioning error paths, port checks. No broker needed."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from infra.kafka import (
    KAFKA_VERSION,
    BrokerError,
    BrokerSettings,
    EmbeddedKafka,
    cache_root,
    install_kafka,
    new_cluster_id,
    render_server_properties,
    wait_until_answers,
)
from infra.kafka import broker as broker_module
from infra.kafka.provision import MARKER, parse_java_major, render_pom
from schemas.errors import TerminalError

JAVA_17 = 'openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6)\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


# --- settings and server.properties ---------------------------------------------------------------


def test_server_properties_has_kraft_combined_mode_for_one_node(tmp_path: Path) -> None:
    settings = BrokerSettings(port=19092, controller_port=19093, home=tmp_path)
    props = parse_properties(render_server_properties(settings, tmp_path / "data"))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "num.partitions",
    ):
        assert props[key] == "1", key
    assert props["offsets.topic.num.partitions"] == "4"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "true"
    assert props["delete.topic.enable"] == "true"
    assert "message.max.bytes" not in props  # the 1 MB default stays
    strict = BrokerSettings(port=19092, controller_port=19093, auto_create_topics=False)
    assert parse_properties(render_server_properties(strict, tmp_path))[
        "auto.create.topics.enable"] == "false"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"controller_port": 0}, "controller_port"),
        ({"controller_port": 70000}, "controller_port"),
        ({"port": 19092, "controller_port": 19092}, "controller_port"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(BrokerError, match=field):
        BrokerSettings(**kwargs)


def test_broker_error_is_terminal() -> None:
    assert issubclass(BrokerError, TerminalError)


def test_home_defaults_under_the_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GOVERNOR_HOME", str(tmp_path))
    assert cache_root() == tmp_path
    assert BrokerSettings(port=19092).home_dir == tmp_path / "broker-19092"
    assert EmbeddedKafka(BrokerSettings(port=19092, controller_port=19093)).bootstrap == "127.0.0.1:19092"
    monkeypatch.delenv("GOVERNOR_HOME")
    assert cache_root() == Path.home() / ".cache" / "governor"


def test_cluster_id_is_22_chars_of_url_safe_base64() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id)
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    """The storage tool would take it for an option (one make test run in 64 failed so)."""
    assert not any(new_cluster_id().startswith("-") for _ in range(2_000))


# --- install_kafka --------------------------------------------------------------------------------


class FakeTools:
    """Stands in for shutil.which and subprocess.run; records what was run."""

    def __init__(
        self,
        *,
        java: str | None = "/usr/bin/java",
        mvn: str | None = "/usr/bin/mvn",
        java_version: str = JAVA_17,
        mvn_rc: int = 0,
        mvn_output: str = "",
        make_jar: bool = True,
    ) -> None:
        self.paths = {"java": java, "mvn": mvn}
        self.java_version, self.mvn_rc, self.mvn_output, self.make_jar = java_version, mvn_rc, mvn_output, make_jar
        self.calls: list[list[str]] = []

    def which(self, name: str) -> str | None:
        return self.paths.get(name)

    def run(self, command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.calls.append(command)
        if command[1:] == ["-version"]:
            return subprocess.CompletedProcess(command, 0, stdout="", stderr=self.java_version)
        out_dir = next(Path(arg.split("=", 1)[1]) for arg in command if arg.startswith("-DoutputDirectory="))
        if self.mvn_rc == 0 and self.make_jar:
            out_dir.mkdir(parents=True)
            (out_dir / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"PK")
        return subprocess.CompletedProcess(command, self.mvn_rc, stdout=self.mvn_output, stderr="")


def install(tmp_path: Path, tools: FakeTools) -> Path:
    return install_kafka(root=tmp_path, progress=lambda _: None, which=tools.which, run=tools.run)


def test_install_without_java_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=r"Java 17\+ is required.*openjdk-17-jre-headless"):
        install(tmp_path, FakeTools(java=None))


def test_install_without_maven_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=r"mvn.*apt-get install maven"):
        install(tmp_path, FakeTools(mvn=None))


@pytest.mark.parametrize(
    ("version_output", "major"),
    [('openjdk version "11.0.2" 2019-01-15', 11), ('java version "1.8.0_292"', 8)],
)
def test_install_refuses_old_java(tmp_path: Path, version_output: str, major: int) -> None:
    with pytest.raises(BrokerError, match=rf"Java {major}, too old.*Java 17\+"):
        install(tmp_path, FakeTools(java_version=version_output))


def test_parse_java_major() -> None:
    assert parse_java_major(JAVA_17) == 17
    assert parse_java_major('openjdk version "21" 2023-09-19') == 21
    assert parse_java_major('java version "1.8.0_292"') == 8
    assert parse_java_major("no version here") is None


def test_maven_failure_shows_the_tail_of_its_output(tmp_path: Path) -> None:
    output = "\n".join(f"line {i}" for i in range(100)) + "\n\x1b[1;31m[ERROR]\x1b[m Could not transfer artifact"
    tools = FakeTools(mvn_rc=1, mvn_output=output)
    with pytest.raises(BrokerError) as caught:
        install(tmp_path, tools)
    message = str(caught.value)
    assert "Maven Central" in message and "[ERROR] Could not transfer artifact" in message
    assert "line 99" in message and "line 5\n" not in message
    assert not (tmp_path / "kafka" / KAFKA_VERSION).exists()
    assert os.listdir(tmp_path / "kafka") == []  # the temporary download is gone


def test_maven_success_without_the_kafka_jar_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="kafka_2.13"):
        install(tmp_path, FakeTools(make_jar=False))
    assert not (tmp_path / "kafka" / KAFKA_VERSION).exists()


def test_install_is_idempotent(tmp_path: Path) -> None:
    tools = FakeTools()
    libs = install(tmp_path, tools)
    assert libs == tmp_path / "kafka" / KAFKA_VERSION / "libs"
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()
    assert (libs.parent / MARKER).is_file()
    mvn_command = tools.calls[-1]
    assert "dependency:copy-dependencies" in mvn_command and "-DincludeScope=runtime" in mvn_command

    again = FakeTools(java=None, mvn=None)  # would fail if it looked for Java or Maven
    assert install(tmp_path, again) == libs
    assert again.calls == []


def test_install_replaces_an_incomplete_download(tmp_path: Path) -> None:
    leftover = tmp_path / "kafka" / KAFKA_VERSION / "libs"
    leftover.mkdir(parents=True)
    (leftover / "half.jar").write_bytes(b"")
    libs = install(tmp_path, FakeTools())
    assert sorted(p.name for p in libs.iterdir()) == [f"kafka_2.13-{KAFKA_VERSION}.jar"]


def test_pom_pins_kafka_log4j_and_slf4j() -> None:
    pom = render_pom("4.4.0")
    assert "${kafka.version}" not in pom
    assert "<artifactId>kafka_2.13</artifactId>\n      <version>4.4.0</version>" in pom
    for artifact in ("log4j-core", "log4j-slf4j2-impl", "slf4j-api"):
        assert f"<artifactId>{artifact}</artifactId>" in pom
    assert "<slf4j.version>2.0.17</slf4j.version>" in pom and "<log4j.version>2.24.3</log4j.version>" in pom


# --- EmbeddedKafka without a broker ---------------------------------------------------------------


def _no_install(*args: object, **kwargs: object) -> Path:
    raise AssertionError("install_kafka must not run when a port is taken")


@pytest.mark.parametrize("taken", ["port", "controller_port"])
def test_start_refuses_a_taken_port_before_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: str
) -> None:
    monkeypatch.setattr(broker_module, "install_kafka", _no_install)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        ports = {"port": free_port(), "controller_port": free_port(), taken: busy}
        kafka = EmbeddedKafka(BrokerSettings(home=tmp_path, **ports), progress=lambda _: None)
        option = "--port" if taken == "port" else "--controller-port"
        with pytest.raises(BrokerError, match=rf"127\.0\.0\.1:{busy} is already in use.* "
                                              rf"{option} or") as raised:
            kafka.start()
    # (before, `governor broker stop`: that stops the broker on 9092, perhaps another's)
    stop = (f"`governor broker stop --port {busy}`" if taken == "port"
            else "`governor broker stop --port P`, P its own port")
    assert str(raised.value).endswith(
        f"stop what holds it (an embedded broker: {stop}, with the GOVERNOR_HOME it was started "
        "with)")


def test_stop_never_signals_a_process_that_is_not_kafka(tmp_path: Path) -> None:
    kafka = EmbeddedKafka(BrokerSettings(port=free_port(), controller_port=free_port(), home=tmp_path))
    kafka.pid_file.parent.mkdir(parents=True, exist_ok=True)
    kafka.pid_file.write_text(f"{os.getpid()}\n")  # this pytest process: alive, but not kafka.Kafka
    assert kafka.stop() is False
    assert not kafka.pid_file.exists()


def test_status_of_a_broker_that_is_not_running(tmp_path: Path) -> None:
    kafka = EmbeddedKafka(BrokerSettings(port=free_port(), controller_port=free_port(), home=tmp_path))
    status = kafka.status()
    assert (status.running, status.pid, status.answers) == (False, None, False)
    assert status.bootstrap == kafka.bootstrap and status.home == tmp_path
    assert kafka.stop() is False


def test_wait_until_answers_gives_up_with_the_address() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError, match=rf"no Kafka broker answers at {bootstrap} within 0.5s"):
        asyncio.run(wait_until_answers(bootstrap, 0.5))


def _sleeper(*args: str) -> subprocess.Popen:
    """A process that sleeps a minute, ``args`` in its command line as a JVM's; returned once it
    runs (its first line read): until the fork has run the new program, its command line is
    this process's (``stop`` and ``status`` read it)."""
    process = subprocess.Popen([sys.executable, "-c",
                                "import time; print('up', flush=True); time.sleep(60)", *args],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "up\n"
    process.stdout.close()
    return process


def test_stop_never_signals_the_kafka_of_another_home(tmp_path: Path) -> None:
    """A stale pid file whose pid now runs another home's broker (a pid used again after a
    crash or a reboot): before 7 Dec `stop` took any `kafka.Kafka` command line for its own and
    killed that broker, and `start` said `Kafka is already running` and waited for its own
    port to answer."""
    elsewhere = tmp_path / "elsewhere" / "config" / "server.properties"
    other = _sleeper("kafka.Kafka", str(elsewhere))
    try:
        kafka = EmbeddedKafka(BrokerSettings(port=free_port(), controller_port=free_port(),
                                             home=tmp_path / "mine"), progress=lambda _: None)
        kafka.pid_file.parent.mkdir(parents=True)
        kafka.pid_file.write_text(f"{other.pid}\n")
        assert kafka.status().running is False
        assert kafka.stop() is False
        assert other.poll() is None  # (left running)
        assert not kafka.pid_file.exists()
    finally:
        other.kill()
        other.wait()


def test_stop_signals_its_own_kafka(tmp_path: Path) -> None:
    """The pid file's process runs this home's ``server.properties``: it is stopped."""
    kafka = EmbeddedKafka(BrokerSettings(port=free_port(), controller_port=free_port(),
                                         home=tmp_path), progress=lambda _: None)
    ours = _sleeper("kafka.Kafka", str(kafka.config_dir / "server.properties"))
    try:
        kafka.pid_file.write_text(f"{ours.pid}\n")
        assert kafka.status().running is True
        assert kafka.stop() is True
        ours.wait(timeout=10)  # (gone: stop reaped its own child, so Popen sees status 0)
    finally:
        ours.kill()
        ours.wait()
