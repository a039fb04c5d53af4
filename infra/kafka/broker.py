"""One Apache Kafka node in KRaft combined mode (broker and controller), run as a detached JVM.

Layout under the broker's home (``<cache root>/broker-<port>`` unless set):

* ``config/server.properties`` and ``config/log4j2.properties``, rewritten on every start;
* ``data/``, the log dir, formatted once (its ``meta.properties`` marks it formatted);
* ``logs/server.log`` (Log4j, INFO and above) and ``logs/kafka.out`` (the JVM's own output);
* ``kafka.pid``, the id of the running JVM;
* ``owner.json``, where ``governor up`` or ``demo`` started it: the command that stops it as
  it exits (``EmbeddedKafka.owner``), which a later one takes over once that one is gone;
* ``start.lock``, held while a process starts the broker (one start at a time).

The JVM outlives the Python process that started it; ``stop`` finds it again through the pid
file and only ever signals a process whose command line names ``kafka.Kafka`` and the home's
``config/server.properties``.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from infra.kafka import BrokerError
from infra.kafka.provision import KAFKA_VERSION, cache_root, install_kafka, require_java
from infra.owners import Owned, read_json, write_atomically

logger = logging.getLogger(__name__)

POLL_S = 0.2
PROBE_TIMEOUT_MS = 2000
#: How long ``wait_until_answers`` waits before it says that it is waiting.
QUIET_WAIT_S = 2.0


def free_ports(n: int) -> list[int]:
    """``n`` ports nobody listens on now on 127.0.0.1 (another broker may hold any fixed one)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class BrokerSettings:
    """Where the embedded broker listens and keeps its files."""

    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    heap_mb: int = 512
    home: Path | None = None
    version: str = KAFKA_VERSION
    #: whether a metadata request or a send for a missing topic creates it (Faust relies on it;
    #: many managed clusters turn it off, which tests of that case need)
    auto_create_topics: bool = True
    #: whether the broker deletes a topic asked to (``delete.topic.enable``; some clusters turn
    #: it off, which tests of that case need)
    delete_topics: bool = True

    def __post_init__(self) -> None:
        for name in ("port", "controller_port"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= 65535:
                raise BrokerError(f"{name} must be a TCP port in 1..65535, got {value!r}")
        if self.port == self.controller_port:
            raise BrokerError(f"port and controller_port must differ, both are {self.port}")
        if self.heap_mb < 128:
            raise BrokerError(f"heap_mb must be at least 128, got {self.heap_mb}")
        if not self.host:
            raise BrokerError("host must not be empty")

    @property
    def home_dir(self) -> Path:
        """``home``, or ``<cache root>/broker-<port>`` when it is not set."""
        return self.home if self.home is not None else cache_root() / f"broker-{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class BrokerStatus:
    """What :meth:`EmbeddedKafka.status` found."""

    running: bool
    pid: int | None
    bootstrap: str
    home: Path
    answers: bool
    #: the ``up`` or ``demo`` that stops it as it exits (None: one of the user's, left running)
    owner: Owned | None = None


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID as 22 characters of URL-safe base64 without padding.

    Never one that starts with ``-`` (1 in 64 of them): the storage tool's command line would
    read it as an option and refuse to format (``--cluster-id/-t: expected one argument``)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def render_server_properties(settings: BrokerSettings, log_dir: Path) -> str:
    """``server.properties`` of a single combined broker+controller sized for one small machine."""
    host, port, cport = settings.host, settings.port, settings.controller_port
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{cport}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "auto.create.topics.enable": str(settings.auto_create_topics).lower(),
        "delete.topic.enable": str(settings.delete_topics).lower(),
        "log.retention.hours": "24",
        "log.segment.bytes": "67108864",
    }
    lines = ["# Written by Governor (infra/kafka/broker.py) on every start; edits are lost."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _run_sync(make_coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to completion, also when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


async def _tcp_reachable(bootstrap: str, timeout_s: float) -> bool:
    """True when some ``host:port`` of ``bootstrap`` accepts a TCP connection.

    Checked before asking aiokafka, which logs an ERROR for every refused connection.
    """
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
        except (OSError, ValueError, asyncio.TimeoutError):
            continue
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return True
    return False


async def _answers_once(bootstrap: str, timeout_ms: int = PROBE_TIMEOUT_MS,
                        cluster_id: str | None = None) -> bool:
    """True when a broker at ``bootstrap`` returns metadata that lists at least one broker (of
    the cluster ``cluster_id``, where given)."""
    if not await _tcp_reachable(bootstrap, timeout_ms / 1000):
        return False
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms)
    quiet = _ProbeErrors(bootstrap)
    logging.getLogger("aiokafka").addFilter(quiet)
    try:
        async with asyncio.timeout(timeout_ms / 1000 * 2):
            await admin.start()
            cluster = await admin.describe_cluster()
        return bool(cluster.get("brokers")) and cluster_id in (None, cluster.get("cluster_id"))
    except Exception:  # noqa: BLE001 - any failure means "does not answer yet"
        return False
    finally:
        try:
            await admin.close()
        except Exception:  # noqa: BLE001
            pass
        logging.getLogger("aiokafka").removeFilter(quiet)


class _ProbeErrors(logging.Filter):
    """Leaves out aiokafka's errors of a probe's bootstrap address (`Unable connect to
    "127.0.0.1:8000": `): a probe expects to fail, and says so itself. Before 7 Dec a port
    that takes connections but speaks no Kafka (a web server, a broker's controller port) gave
    one such ERROR line a probe, before the command's own error."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.addresses = {address.strip() for address in bootstrap.split(",")}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith(("Unable connect to", "Unable to request metadata"))
                    and len(args) >= 2 and f"{args[0]}:{args[1]}" in self.addresses)


async def _what_listens(bootstrap: str) -> str:
    """A note for the error that no broker answers: where something takes connections at
    ``bootstrap`` all the same, it is no Kafka broker (a wrong port), not one still starting."""
    if await _tcp_reachable(bootstrap, PROBE_TIMEOUT_MS / 1000):
        return (": something there takes connections but does not answer as a Kafka broker "
                "(another service on that port?)")
    return ""


async def wait_until_answers(bootstrap: str, timeout_s: float,
                             waiting: Callable[[], None] | None = None) -> None:
    """Wait until a Kafka broker at ``bootstrap`` answers a metadata request, or raise BrokerError.
    ``waiting`` is called once where none has answered within ``QUIET_WAIT_S``: a command that
    waits its whole ``timeout_s`` in silence looks hung."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if await _answers_once(bootstrap):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"no Kafka broker answers at {bootstrap} within {timeout_s}s"
                              f"{await _what_listens(bootstrap)}")
        if waiting is not None and time.monotonic() >= started + QUIET_WAIT_S:
            waiting()
            waiting = None
        await asyncio.sleep(POLL_S)


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the JVM does
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise BrokerError(f"cannot bind {host}:{port}: {exc}") from exc
    return True


def _is_kafka_process(pid: int, server_properties: Path | None = None) -> bool:
    """True when ``pid`` is alive (not a zombie) and its command line runs ``kafka.Kafka``;
    given ``server_properties``, on that file (a broker of that home, not another's)."""
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child
    except ChildProcessError:
        pass
    if Path("/proc/self").is_dir():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            return False
        return state != "Z" and b"kafka.Kafka" in cmdline and (
            server_properties is None or os.fsencode(server_properties) in cmdline)
    result = subprocess.run(["ps", "-o", "stat=,command=", "-p", str(pid)], capture_output=True, text=True)
    said = result.stdout
    return result.returncode == 0 and not said.lstrip().startswith("Z") and " kafka.Kafka" in said \
        and (server_properties is None or f" {server_properties}" in said)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail_file(path: Path, offset: int = 0, lines: int = 25) -> str:
    """The last ``lines`` lines of ``path`` after byte ``offset``."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class EmbeddedKafka:
    """Starts, checks and stops the single-node Kafka described by a :class:`BrokerSettings`."""

    def __init__(self, settings: BrokerSettings = BrokerSettings(), *, progress: Callable[[str], None] = logger.info):
        self.settings = settings
        self.progress = progress
        self.home = settings.home_dir
        self.data_dir = self.home / "data"
        self.logs_dir = self.home / "logs"
        self.config_dir = self.home / "config"
        self.pid_file = self.home / "kafka.pid"
        self.owner_file = self.home / "owner.json"
        #: the JVM's last argument: what tells this home's broker from another's
        self.server_properties = self.config_dir / "server.properties"
        self._log_offsets: dict[Path, int] = {}
        #: whether ``start`` spawned the JVM (not found it running)
        self.spawned = False
        #: whether ``start`` found it running, its owner gone, and took it over (``owner``)
        self.adopted = False

    @property
    def bootstrap(self) -> str:
        """``host:port`` for clients, e.g. ``"127.0.0.1:9092"``."""
        return self.settings.bootstrap

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _running_pid(self) -> int | None:
        """The pid from the pid file if that process is our Kafka JVM and still alive."""
        pid = self._read_pid()
        return pid if pid is not None and self._is_ours(pid) else None

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live Kafka JVM run on this home's ``server.properties``: a pid
        file outlives a crash or a reboot, and its pid may run another home's broker since
        (before 7 Dec ``stop`` killed it, and ``start`` took it for this one)."""
        return _is_kafka_process(pid, self.server_properties)

    def owner(self) -> Owned | None:
        """The ``governor up`` or ``demo`` that started the broker for its run and stops it as
        it exits (``owner.json``); None: a broker of the user's (``governor broker start``),
        which runs until ``governor broker stop``."""
        return Owned.from_json(read_json(self.owner_file))

    def status(self) -> BrokerStatus:
        """Whether our JVM runs and whether a broker answers at :attr:`bootstrap`."""
        pid = self._running_pid()
        answers = _run_sync(lambda: _answers_once(self.bootstrap))
        return BrokerStatus(running=pid is not None, pid=pid, bootstrap=self.bootstrap,
                            home=self.home, answers=answers,
                            owner=self.owner() if pid is not None else None)

    def start(self, timeout_s: float = 90.0,
              port_options: tuple[str, str] = ("--port", "--controller-port"),
              owner: str | None = None) -> str:
        """Start the broker (or find it running) and return :attr:`bootstrap` once it answers.
        ``port_options``: the command line's options for the port and the controller port, which
        an error for a port in use names. One start of a home at a time (``_starting``).
        ``owner``: the command that starts the broker for its own run and stops it as it exits
        (``governor up``), recorded as its owner (``owner.json``), or that finds it running
        with its owner gone and takes it over (``adopted``); None: a broker that runs on."""
        with self._starting():
            return self._start(timeout_s, port_options, owner)

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """Hold the home's start lock (``start.lock``), waiting for another process's start of
        it to end first: before 7 Dec two starts at once (the JVM binds its ports seconds after
        it is spawned) each spawned a JVM, the second's exited on the data directory's lock,
        and its start removed the pid file of the first, which ran on, stopped by no
        ``governor broker stop``."""
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "start.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.progress(f"another start of the broker of {self.home} is under way; "
                              "waiting for it")
                fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self, timeout_s: float, port_options: tuple[str, str], owner: str | None) -> str:
        settings = self.settings
        pid = self._running_pid()
        if pid is not None:
            self.progress(self._found_running(pid, owner))
            _run_sync(lambda: wait_until_answers(self.bootstrap, timeout_s))
            return self.bootstrap
        self.pid_file.unlink(missing_ok=True)
        # (how to stop an embedded broker in the way: `governor broker stop` alone stops the
        # one on 9092, which may be another's)
        stop = {"port": f"`governor broker stop --port {settings.port}`",
                "controller port": "`governor broker stop --port P`, P its own port"}
        for name, port, option in (("port", settings.port, port_options[0]),
                                   ("controller port", settings.controller_port,
                                    port_options[1])):
            if not _port_is_free(settings.host, port):
                raise BrokerError(
                    f"{name} {settings.host}:{port} is already in use; pick another with {option} "
                    f"or stop what holds it (an embedded broker: {stop[name]}, with the "
                    "GOVERNOR_HOME it was started with)")

        libs = install_kafka(settings.version, progress=self.progress)
        java = require_java()
        server_properties, log4j_properties = self._write_config()
        if not (self.data_dir / "meta.properties").is_file():
            self._format(java, libs, server_properties)

        started = time.monotonic()
        self.progress(f"starting Kafka {settings.version} at {self.bootstrap} (home {self.home}) ...")
        command = [
            java, f"-Xmx{settings.heap_mb}m", f"-Xms{settings.heap_mb}m", "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20", f"-XX:ErrorFile={self.logs_dir}/hs_err_pid%p.log", "-Djava.awt.headless=true",
            # Keep Log4j up until the JVM exits so Kafka's own shutdown hook can still log.
            "-Dlog4j2.shutdownHookEnabled=false",
            f"-Dlog4j2.configurationFile={log4j_properties}", f"-Dkafka.logs.dir={self.logs_dir}",
            "-cp", f"{libs}/*", "kafka.Kafka", str(server_properties),
        ]  # fmt: skip
        out_path = self.logs_dir / "kafka.out"
        self._log_offsets = {path: _file_size(path) for path in (out_path, self.logs_dir / "server.log")}
        if owner is not None:  # (before the JVM: a process killed after its spawn owns it)
            write_atomically(self.owner_file, Owned.this(owner).as_json())
        else:
            self.owner_file.unlink(missing_ok=True)
        with out_path.open("ab") as out:
            proc = subprocess.Popen(
                command, cwd=self.home, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.spawned = True
        self.pid_file.write_text(f"{proc.pid}\n")
        self._wait_ready(proc, timeout_s)
        # The JVM is meant to outlive this Popen: mark it handled so Python does not warn about a
        # running child at exit. stop() (through _is_kafka_process) reaps it if it is our child.
        proc.returncode = 0
        self.progress(f"Kafka is up at {self.bootstrap} (pid {proc.pid}, {time.monotonic() - started:.1f}s)")
        return self.bootstrap

    def _found_running(self, pid: int, owner: str | None) -> str:
        """What ``start`` says of the broker it finds running (JVM ``pid``), having taken it
        over where the ``up`` or ``demo`` that started it is gone (killed outright: none of its
        handlers ran). Before 7 Dec such a broker was taken for one the user runs, and left
        running by every later ``up``: stopped by no one."""
        said = f"Kafka is already running (pid {pid}) at {self.bootstrap}"
        found = self.owner()
        if found is None:
            return said
        if found.alive():
            return f"{said}, started by {found}, which stops it as it exits"
        if owner is None:
            self.owner_file.unlink(missing_ok=True)
            return (f"{said}, started by {found}, which is gone: it runs on until `governor "
                    f"broker stop --port {self.settings.port}`")
        write_atomically(self.owner_file, Owned.this(owner).as_json())
        self.adopted = True
        return f"{said}, started by {found}, which is gone: this {owner} stops it as it exits"

    def _write_config(self) -> tuple[Path, Path]:
        for path in (self.config_dir, self.data_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)
        server_properties = self.server_properties
        server_properties.write_text(render_server_properties(self.settings, self.data_dir))
        log4j_properties = self.config_dir / "log4j2.properties"
        shutil.copyfile(Path(__file__).with_name("log4j2.properties"), log4j_properties)
        return server_properties, log4j_properties

    def _format(self, java: str, libs: Path, server_properties: Path) -> None:
        """Format the empty log dir with a fresh cluster id (static quorum: no --standalone)."""
        cluster_id = new_cluster_id()
        self.progress(f"formatting {self.data_dir} (cluster id {cluster_id})")
        command = [
            java, f"-Dlog4j2.configurationFile={self.config_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.logs_dir}", "-cp", f"{libs}/*", "kafka.tools.StorageTool",
            "format", "-t", cluster_id, "-c", str(server_properties),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            output = "\n".join(f"{result.stdout}\n{result.stderr}".strip().splitlines()[-25:])
            raise BrokerError(f"formatting {self.data_dir} failed (exit {result.returncode}):\n{output}")

    def _wait_ready(self, proc: subprocess.Popen, timeout_s: float) -> None:
        """Poll until the broker answers; raise with the logs if the JVM exits or time runs out.
        The broker of this home's data (its cluster id): before 7 Dec one of another home,
        started on the same port at the same time, answered for it while this one's JVM failed
        to bind, and the start said "Kafka is up" of a broker its ``stop`` could not stop."""
        deadline = time.monotonic() + timeout_s
        cluster_id = self._cluster_id()
        while not _run_sync(lambda: _answers_once(self.bootstrap, cluster_id=cluster_id)):
            if proc.poll() is not None:
                self._forget()
                raise BrokerError(f"Kafka exited with code {proc.returncode} while starting.\n{self._log_tails()}")
            if time.monotonic() >= deadline:
                self._kill(proc.pid, grace_s=5.0)
                proc.poll()  # _kill reaped it; let Popen know
                self._forget()
                raise BrokerError(f"Kafka did not answer at {self.bootstrap} within {timeout_s}s.\n{self._log_tails()}")
            time.sleep(POLL_S)

    def _cluster_id(self) -> str | None:
        """The cluster id this home's data was formatted with (``meta.properties``)."""
        try:
            lines = (self.data_dir / "meta.properties").read_text().splitlines()
        except OSError:
            return None
        return next((line.partition("=")[2].strip() for line in lines
                     if line.startswith("cluster.id=")), None)

    def _log_tails(self) -> str:
        """The last lines each log got since this start (for error messages)."""
        parts = []
        for path, offset in self._log_offsets.items():
            tail = _tail_file(path, offset)
            if tail:
                parts.append(f"--- last lines of {path} ---\n{tail}")
        return "\n".join(parts) or f"(nothing logged in {self.logs_dir})"

    def _kill(self, pid: int, grace_s: float) -> None:
        """SIGTERM ``pid``, wait up to ``grace_s`` for it to go, then SIGKILL it."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not _is_kafka_process(pid):
                    return
                time.sleep(0.1)
            if sig == signal.SIGTERM:
                logger.warning("Kafka (pid %d) ignored SIGTERM for %.0fs; killing it", pid, grace_s)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop our broker if it runs; True when a process was stopped."""
        pid = self._read_pid()
        if pid is None:
            return False
        if not self._is_ours(pid):
            logger.info("removing stale pid file %s (pid %d is not a running Kafka of %s)",
                        self.pid_file, pid, self.home)
            self._forget()
            return False
        self.progress(f"stopping Kafka (pid {pid}) ...")
        self._kill(pid, grace_s=timeout_s)
        self._forget()
        return True

    def _forget(self) -> None:
        """Remove the pid file and the owner file of a broker that no longer runs."""
        self.pid_file.unlink(missing_ok=True)
        self.owner_file.unlink(missing_ok=True)

    def wipe(self) -> None:
        """Stop the broker and delete its data, so the next start formats a fresh cluster."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def running_ports() -> list[int]:
    """The ports of the embedded brokers this ``GOVERNOR_HOME`` runs (each ``broker-<port>/``
    whose pid file names its live Kafka JVM), lowest first: where a command finds no broker
    at the default port, the one the operator started on another ``--port`` to point it at."""
    ports = []
    for home in cache_root().glob("broker-*"):
        port = home.name.removeprefix("broker-")
        if not (port.isdigit() and 1 <= int(port) <= 65535):
            continue
        kafka = EmbeddedKafka(BrokerSettings(port=int(port), controller_port=int(port) % 65535 + 1,
                                             home=home))
        if kafka._running_pid() is not None:
            ports.append(int(port))
    return sorted(ports)
