"""The ``governor`` command line."""

import asyncio
import json
import logging
import os
import re
import signal
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import typer.rich_utils as rich_help
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from infra.sim.cli import (DEADLINES_HELP, MAX_WORKLOAD_S, Deadlines, Limit, RateScale,
                           TraceArgument, check_span, no_request_in_window,
                           rows_with_progress, said_if_interrupted, warn_of_cut_tasks)
from infra.cli_numbers import number_option
from infra.hangup import terminal_output_guard
from infra.stop_signals import StopSignals
from infra.supervised import stop_when_unsupervised
from infra.paths import not_the_trace, print_report, writable_dir, writable_report
from infra.stack import STOP_FINISH_S, WORKER_METRICS_OFFSET, unserved_warning
from infra.wording import OF_TOTAL_COLUMN, counted, of_total
from schemas.errors import GovernorError, one_line

logger = logging.getLogger(__name__)
console = Console(stderr=True)

app = typer.Typer(help="Governor: an inference control plane on Kafka.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
broker_app = typer.Typer(help="The embedded Apache Kafka broker.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics of the catalog.", no_args_is_help=True)
schemas_app = typer.Typer(help="Message schemas.", no_args_is_help=True)
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")

DEFAULT_PORT = 9092

#: The width of ``--help`` written to no terminal (a pipe, a file, CI's log) where neither
#: ``COLUMNS`` nor ``TERMINAL_WIDTH`` gives one.
HELP_WIDTH = 120


def _help_console(stderr: bool = False) -> Console:
    """typer's console for ``--help``, at ``HELP_WIDTH`` where the help goes to no terminal and
    no width is given: rich takes 80 columns there, and the options' table cut the longest
    option names (``governor worker --help | cat``: ``--max-num-batched…``)."""
    help_console = _typer_console(stderr)
    if not help_console.is_terminal and not (os.environ.get("COLUMNS")
                                             or os.environ.get("TERMINAL_WIDTH")):
        help_console.width = HELP_WIDTH
    return help_console


def _folded(text: Text) -> Text:
    """``text`` broken across lines where a word is wider than its column, not cut: at any
    width (a narrow terminal's too) an option's name, the syntax of ``demo --fault`` and an
    environment variable's name are shown whole, if on two lines (rich cut them short: ``…``)."""
    text.overflow = "fold"
    return text


class _FoldedOptions(type(rich_help.highlighter)):
    """typer's highlighter of option names, whose names fold (``_folded``)."""

    def __call__(self, text: str | Text) -> Text:
        return _folded(super().__call__(text))


def _parameter_help(**given: Any) -> Any:
    """typer's help of a parameter, each of its pieces folded (``_folded``)."""
    shown = _typer_parameter_help(**given)
    for piece in getattr(shown, "renderables", ()):
        if isinstance(piece, Text):
            _folded(piece)
    return shown


_typer_console, _typer_parameter_help = rich_help._get_rich_console, rich_help._get_parameter_help
rich_help._get_rich_console, rich_help._get_parameter_help = _help_console, _parameter_help
rich_help.highlighter = _FoldedOptions()


def _check_bootstrap(value: str | None) -> str | None:
    """Each HOST:PORT of ``--bootstrap`` has a host and a port from 1 to 65535."""
    for entry in value.split(",") if value is not None else []:
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise GovernorError(f"--bootstrap (or GOVERNOR_BOOTSTRAP) {value!r}: expected "
                                "HOST:PORT[,HOST:PORT...] with ports from 1 to 65535")
    return value


def _check_namespace(value: str) -> str:
    """A namespace Kafka takes as a topic-name prefix, checked before anything starts."""
    from schemas.topics import TopicCatalog

    try:
        TopicCatalog(value)
    except ValueError as exc:
        raise GovernorError(f"--namespace (or GOVERNOR_NAMESPACE): {exc}") from None
    return value


Bootstrap = Annotated[str | None, typer.Option(
    "--bootstrap", envvar="GOVERNOR_BOOTSTRAP", metavar="HOST:PORT", callback=_check_bootstrap,
    help="An existing Kafka cluster; default: the embedded broker on 127.0.0.1:9092.")]
#: ``up``'s and ``demo``'s: they start the embedded broker on their ``--broker-port``.
StackBootstrap = Annotated[str | None, typer.Option(
    "--bootstrap", envvar="GOVERNOR_BOOTSTRAP", metavar="HOST:PORT", callback=_check_bootstrap,
    help="An existing Kafka cluster; default: the embedded broker on 127.0.0.1:--broker-port, "
         "started unless it runs.")]
Namespace = Annotated[str, typer.Option(
    "--namespace", envvar="GOVERNOR_NAMESPACE", callback=_check_namespace,
    help="Topic name prefix.")]
DataDir = Annotated[Path, typer.Option(
    "--data-dir", envvar="GOVERNOR_ANALYTICS_DIR",
    help="The sink's directory: the embedded store (chdb/) and sql-endpoint.json.")]
ANALYTICS_DIR = Path(".governor/analytics")
MetricsPort = Annotated[int, typer.Option(
    min=0, max=65535, help="Serve Prometheus /metrics on 127.0.0.1 at this port; 0: off.")]
Speedup = Annotated[float, number_option("--speedup", min=0.01, max=1000.0,
                                         help="Run engine time and trace time this much faster.")]


class _RetriedLeaderErrors(logging.Filter):
    """aiokafka logs a leader change (as right after topic creation) as an ERROR, then retries
    and succeeds; show it only at DEBUG so that real errors stand out."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "NotLeaderForPartitionError" not in record.getMessage() or logger.isEnabledFor(
            logging.DEBUG)


class _RetriedCoordinatorErrors(logging.Filter):
    """aiokafka logs a consumer group's coordinator not found yet (as on a fresh broker, while it
    creates its offsets topic) as an ERROR, then retries: a WARNING, saying it is retried."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.msg == "Group Coordinator Request failed: %s" \
                and record.args and getattr(record.args[0], "retriable", False):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg += " (retried)"
        return True


class _RepeatedKafkaErrors(logging.Filter):
    """While a broker is away aiokafka logs every failed attempt, thousands a second (a worker
    logged 76,000 lines through a 40 s restart): one record of a kind (its logger and message
    template) every ``EVERY_S``, saying how many like it were left out."""

    EVERY_S = 10.0

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[tuple[str, str], list] = {}  # kind -> [when shown, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka") or record.levelno < logging.WARNING:
            return True
        kind = (record.name, str(record.msg))
        shown = self._last.get(kind)
        if shown is not None and record.created - shown[0] < self.EVERY_S:
            shown[1] += 1
            return False
        if shown is not None and shown[1]:
            record.msg = (f"{record.msg} ({shown[1]:,} more like it in the last "
                          f"{record.created - shown[0]:.0f} s left out)")
        if len(self._last) >= 1_000:
            self._last.clear()
        self._last[kind] = [record.created, 0]
        return True


class _LogLines(logging.Formatter):
    """Log lines, timestamped; a record that tells the user something of their own input
    (``infra.wording.TO_USER``: a trace's unknown field) as the command line's other warnings,
    ``warning: ...`` (it was a timestamped ``WARNING infra.traces.loaders:`` line)."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "to_user", False):
            return f"{record.levelname.lower()}: {record.getMessage()}"
        return super().format(record)


@app.callback()
def main(log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], typer.Option(
        envvar="GOVERNOR_LOG_LEVEL", case_sensitive=False,
        help="DEBUG, INFO, WARNING or ERROR; the components `up` and `demo` start take it too.")]
         = "WARNING"):
    printed = logging.StreamHandler(sys.stderr)
    printed.setFormatter(_LogLines("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[printed])
    for name in ("aiokafka.consumer.fetcher", "aiokafka.producer.sender"):
        logging.getLogger(name).addFilter(_RetriedLeaderErrors())
    logging.getLogger("aiokafka.consumer.group_coordinator").addFilter(_RetriedCoordinatorErrors())
    repeated = _RepeatedKafkaErrors()
    for handler in logging.getLogger().handlers:  # (a logger's filter misses its children's)
        handler.addFilter(repeated)


#: Engine limits a worker takes at most (vLLM's own defaults are 256 and 8,192).
MAX_NUM_SEQS, MAX_BATCHED_TOKENS = 65_536, 10_000_000
MaxNumSeqs = Annotated[int, typer.Option(
    min=1, max=MAX_NUM_SEQS, help="Sequences the engine runs at once (vLLM's --max-num-seqs).")]
MaxBatchedTokens = Annotated[int, typer.Option(
    min=16, max=MAX_BATCHED_TOKENS, help="Tokens one engine step takes at most (vLLM's "
                                         "--max-num-batched-tokens).")]
BrokerPort = Annotated[int, typer.Option(min=1, max=65535, help="The embedded broker's port.")]
ControllerPort = Annotated[int | None, typer.Option(
    min=1, max=65535, help="The embedded broker's KRaft controller port; default: its port + 1.")]


def _kafka_home() -> None:
    """Where the embedded broker's downloads and data go (``GOVERNOR_HOME``) is a folder that
    can be written, or an error saying so (not a traceback once the broker is under way)."""
    from infra.kafka.provision import cache_root

    writable_dir("GOVERNOR_HOME", cache_root())


def _controller_port(port: int, controller_port: int | None, port_option: str) -> int:
    """The embedded broker's controller port: ``--controller-port``, or the port + 1; an error
    naming the options where that is the port itself or above 65535."""
    if (controller_port or port + 1) == port:
        raise GovernorError(f"--controller-port {port} is {port_option} too: give them two ports")
    if controller_port is None and port == 65535:
        raise GovernorError(f"{port_option} 65535 leaves no port above it for the controller: "
                            "give --controller-port")
    return controller_port or port + 1


def _embedded_ports(ctx: typer.Context, bootstrap: str | None, broker_port: int,
                    controller_port: int | None) -> tuple[int, int] | None:
    """The ports of the embedded broker ``up`` and ``demo`` start when no ``--bootstrap`` is
    given (``--broker-port`` and ``--controller-port``), checked before anything starts;
    ``None`` with ``--bootstrap``, where either option is an error (it would be dropped)."""
    if bootstrap is not None:
        for name in ("broker_port", "controller_port"):
            if _given(ctx, name):
                option = "--" + name.replace("_", "-")
                raise GovernorError(f"{option} is the embedded broker's; --bootstrap {bootstrap} "
                                    f"names a cluster of your own (leave out one of them)")
        return None
    return broker_port, _controller_port(broker_port, controller_port, "--broker-port")


def _start_embedded(ports: tuple[int, int], command: str) -> tuple[object, str, bool]:
    """The embedded broker on ``ports``, started unless a broker answers there already (left
    running then); a port in use is an error naming ``up``'s and ``demo``'s option for it.
    Returns the broker, its address and whether this call started it, or took it over: one
    running, started by an ``up`` or ``demo`` that is gone (killed outright: none of its
    handlers ran; ``EmbeddedKafka.owner``). ``command`` (``governor up``) is recorded as its
    owner, which stops it as it exits, and a later one takes it over should it be killed so.
    Before 7 Dec such a broker was taken for the user's, and left running by every later
    ``up``, stopped by no one. Interrupted while it starts (Ctrl-C, a stop signal), it stops
    the broker it started: the broker runs in a session of its own, which no Ctrl-C reaches,
    and before 7 Dec it was left running (the next ``up`` took it for one running already, and
    left it so); stop signals are ignored from then on (``StopSignals.finishing``). Started:
    its JVM spawned by this call (``spawned``), not one found running, another process's start
    under way among them: before 7 Dec a broker that did not answer yet counted as started,
    and a second ``up`` stopped the first's."""
    kafka = _kafka(*ports)
    try:
        address = kafka.start(port_options=("--broker-port", "--controller-port"),
                              owner=command)
        return kafka, address, kafka.spawned or kafka.adopted
    except KeyboardInterrupt:
        _stop_signals.finishing()  # (a second Ctrl-C, or the terminal closing, cut it short)
        if kafka.spawned or kafka.adopted:
            kafka.stop()
        raise


def _kafka(port: int = DEFAULT_PORT, controller_port: int | None = None, heap_mb: int = 512):
    from infra.kafka import BrokerSettings, EmbeddedKafka

    _kafka_home()
    settings = BrokerSettings(port=port, controller_port=controller_port or port + 1, heap_mb=heap_mb)
    return EmbeddedKafka(settings, progress=lambda msg: console.print(
        msg, style="dim", markup=False, soft_wrap=True))


def _check_fleet(fleet: str, models: str = "all") -> list:
    """The pools of ``--fleet``; a bad one is an error before anything starts: its syntax, each
    pool's model fitting its GPU, and more workers than a local stack has slots. ``models``:
    ``all`` checks every pool's model; ``built-in`` those built in (the others are the
    configuration's, read once a broker answers: ``_check_declared_models``, which counts the
    workers then, once their pools' degrees are known); ``none`` only the GPU names (vLLM
    servers serve what they serve: a model the simulator does not know is one GPU a server
    unless its pool names a degree)."""
    from infra.stack import parse_fleet
    from workers.sim.models import gpu_spec, is_known

    try:
        pools = parse_fleet(fleet)
        for pool in pools:
            gpu_spec(pool.gpu_type)
        _check_models([pool for pool in pools if models == "all"
                       or models == "built-in" and is_known(pool.model)])
    except ValueError as exc:
        raise GovernorError(str(exc)) from None
    if models != "built-in" or all(is_known(pool.model) for pool in pools):
        _check_slots(fleet, pools)
    return pools


def _check_slots(fleet: str, pools: list) -> None:
    """No more workers than a local stack has slots (counted once each pool's degree is
    known: a model not declared yet counts one GPU a worker)."""
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog()
    partitions = catalog.spec(catalog.dispatch).partitions
    if sum(pool.count for pool in pools) > partitions:
        raise GovernorError(f"--fleet {fleet} has {sum(pool.count for pool in pools)} workers; "
                            f"a local stack has at most {partitions}, one per partition of the "
                            "dispatch topic")


def _model_spelt_exactly(model: str) -> None:
    """``--model`` names a built-in model, or one the configuration declares once it is read
    (``_declare_models``), as requests name it (an error otherwise)."""
    from workers.sim.models import check_spelling

    try:
        check_spelling(model)
    except ValueError as exc:
        raise GovernorError(f"--model: {exc}") from None


def _check_models(pools: list) -> None:
    """Each pool's model is one the simulated engine knows, spelt as requests name it, and fits
    its workers' GPUs."""
    from workers.sim.models import check_spelling
    from workers.sim.perf import PerfModel

    for pool in pools:
        check_spelling(pool.model)
        PerfModel.load(pool.gpu_type, pool.model, pool.tp)


def _check_declared_models(bootstrap: str, namespace: str, fleet: str, pools: list) -> None:
    """The pools' models not built in are declared by the configuration in force (the setting
    ``models``), and fit their GPUs at their pools' degrees: before 6 Dec ``governor up``
    refused them unread. Their pools' GPUs a worker are known once they are declared
    (``parse_fleet`` took one), and so the workers ``_check_slots`` counts."""
    from infra.bus import create_topics
    from infra.stack import parse_fleet
    from schemas.topics import TopicCatalog
    from workers.factory import HOW_TO_DECLARE
    from workers.sim.models import is_known

    unknown = {pool.model for pool in pools if not is_known(pool.model)}
    if not unknown:
        return
    catalog = TopicCatalog(namespace)
    asyncio.run(create_topics(bootstrap, catalog))  # (as run_up does next: a config to read)
    _declare_models(bootstrap, catalog, *sorted(unknown))
    try:
        pools = parse_fleet(fleet)  # (each pool's degree, now that its model is known)
        _check_models([pool for pool in pools if pool.model in unknown])
    except ValueError as exc:
        hint = HOW_TO_DECLARE if str(exc).startswith("unknown model") else ""
        raise GovernorError(f"{exc}{hint}") from None
    _check_slots(fleet, pools)


def _faults_before_the_end(given: list[str], faults: tuple, end_s: float, why: str) -> None:
    """An error naming the first fault (as ``given``) due after the replay ends at ``end_s``
    (``why`` says whence): it would not be injected, and the demo would exit 1 once run."""
    for text, fault in zip(given, faults):
        if fault.at_s > end_s:
            raise GovernorError(f"--fault {text}: the replay ends after {round(end_s, 2):g} s "
                                f"({why})")


def _reachable(bootstrap: str | None, timeout_s: float = 15.0) -> str:
    """The bootstrap address, once a broker answers there."""
    from infra.kafka import running_ports, wait_until_answers

    address = bootstrap or f"127.0.0.1:{DEFAULT_PORT}"

    def waiting() -> None:
        console.print(f"waiting for a Kafka broker to answer at {address} (at most "
                      f"{timeout_s:g} s) ...", markup=False, soft_wrap=True)

    try:
        asyncio.run(wait_until_answers(address, timeout_s, waiting))
    except GovernorError as exc:
        hint = "" if bootstrap else " (start the embedded one with `governor broker start`)"
        elsewhere = [] if bootstrap else [f"127.0.0.1:{port}" for port in running_ports()
                                          if port != DEFAULT_PORT]
        if elsewhere:  # (before 7 Dec: told to start one, which already ran on its --port)
            hint = (f" (the embedded broker of this GOVERNOR_HOME runs at {' and '.join(elsewhere)}"
                    f": give --bootstrap {elsewhere[0]}, or set GOVERNOR_BOOTSTRAP)")
        raise GovernorError(f"{exc}{hint}") from None
    return address


def _with_topics(bootstrap: str | None, catalog,
                 refuse: Callable[[dict[str, int]], str | None] = lambda _counts: None) -> str:
    """The bootstrap address, once a broker answers there and holds the namespace's topics.
    ``refuse``: what is wrong with the topics' partition counts (topic -> count) for the
    component, as an error; None where nothing is."""
    from infra.bus import (config_topic_split, make_again, misshapen_topics, on_broker,
                           topic_partitions)

    address = _reachable(bootstrap)
    partitions = asyncio.run(topic_partitions(address, catalog))
    missing = [name for name in catalog.topics() if name not in partitions]
    if missing:
        raise GovernorError(
            f"{len(missing)} of the topics of namespace {catalog.namespace!r} do not exist on "
            f"{address} ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); create "
            f"them with `governor topics create{on_broker(bootstrap)} --namespace "
            f"{catalog.namespace}`")
    refused = refuse(partitions)
    if refused is not None:
        raise GovernorError(refused)
    split = config_topic_split(catalog, partitions.get(catalog.config), bootstrap)
    if split is not None:  # (`config set` refuses it, `config get` says what is in force)
        console.print(f"warning: {split}", markup=False, soft_wrap=True)
    for name, problem in misshapen_topics(catalog, partitions).items():
        if name == catalog.config:
            continue
        console.print(f"warning: topic {problem}: not made by `governor topics create` (a "
                      "broker auto-creates topics of 1 partition); make it again: "
                      f"{make_again(catalog.namespace, [name], bootstrap)}", markup=False,
                      soft_wrap=True)
    return address


def _port_free(option: str, host: str, port: int) -> None:
    """An error naming ``option`` unless ``port`` (not 0: any) can be listened on now."""
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM):  # (IPv4 or IPv6, as the host names)
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
                probe.bind(address)
    except OSError as exc:
        raise GovernorError(f"{option} {port}: cannot listen on {host}:{port}: "
                            f"{exc.strerror or exc}") from None


#: What stops ``up``, ``demo`` and a component started by hand as Ctrl-C does: an
#: orchestrator's, ``kill``'s or a test's timeout's SIGTERM, and the SIGHUP of the terminal they
#: run in closing (the components ``up`` starts run in process groups of their own,
#: ``infra.stack``, which the hangup does not reach: ``up`` stops them).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


#: The process's handling of the stop signals (one, as signal handlers are the process's).
_stop_signals = StopSignals()


def _sigterm_as_interrupt() -> Callable[[], None]:
    """SIGTERM and SIGHUP (``STOP_SIGNALS``) stop the command as Ctrl-C does, through its
    cleanup (``StopSignals``); returns ``off_a_hung_up_terminal``, for a handler of the
    command's own (``demo``'s, in its loop)."""
    return _stop_signals.install()


def _serve_metrics(port: int):
    """A registry for a process's Prometheus metrics, served on 127.0.0.1:``port`` (0: not
    served)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    if port:
        _port_free("--metrics-port", "127.0.0.1", port)
        start_http_server(port, addr="127.0.0.1", registry=registry)
    return registry


def _run_until_signalled(make_service) -> None:
    """Run ``service.run(stop)`` until a stop signal (``STOP_SIGNALS``: SIGHUP too, its
    terminal closed, after ``off_a_hung_up_terminal``; ``infra.hangup``). A second one, while
    the service stops, calls its ``hand_back_now`` where it has one: a worker finishing what it
    runs hands it back at once (``governor up`` and ``demo`` stop their workers so,
    ``Stack.stop``)."""
    off_a_hung_up_terminal = terminal_output_guard()

    async def runner() -> None:
        stop = asyncio.Event()
        service = make_service()

        def stop_or_hurry() -> None:
            if stop.is_set() and hasattr(service, "hand_back_now"):
                service.hand_back_now()
            stop.set()

        def hung_up() -> None:
            off_a_hung_up_terminal()
            stop_or_hurry()

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, hung_up if sig == signal.SIGHUP else stop_or_hurry)
        # (started by ``up``: stopped at its end as its own stop would, a worker given
        # ``Stack.finish_s`` to finish what it runs)
        watch = asyncio.create_task(stop_when_unsupervised(hurry_after_s=STOP_FINISH_S))
        try:
            await service.run(stop)
        finally:
            watch.cancel()

    from aiokafka.errors import KafkaError

    try:
        asyncio.run(runner())
    except KafkaError as exc:  # the broker away past the producer's timeouts: a restart (as
        # `governor up` and an orchestrator make) takes it from there; no traceback
        console.print(f"[red]error:[/] {escape(one_line(exc))} (exiting: the broker did not "
                      "answer in time; start this component again)", soft_wrap=True)
        sys.exit(1)


@broker_app.command("install")
def broker_install():
    """Download Apache Kafka and its dependencies from Maven Central (once)."""
    from infra.kafka import install_kafka

    _kafka_home()
    say = partial(console.print, markup=False, soft_wrap=True)  # (paths: no markup)
    say(f"Kafka jars in {install_kafka(progress=say)}")


@broker_app.command("start")
def broker_start(port: BrokerPort = DEFAULT_PORT, controller_port: ControllerPort = None,
                 heap_mb: Annotated[int, typer.Option(
                     min=128, max=65_536, help="The broker JVM's heap, MiB.")] = 512,
                 timeout_s: Annotated[float, number_option(
                     min=1, max=3600, help="Seconds to wait for it to answer.")] = 90.0):
    """Start one KRaft node on 127.0.0.1; returns once it answers metadata requests."""
    controller_port = _controller_port(port, controller_port, "--port")
    bootstrap = _kafka(port, controller_port, heap_mb).start(timeout_s)
    console.print(f"Kafka answers at [bold]{bootstrap}[/]", soft_wrap=True)


@broker_app.command("stop")
def broker_stop(port: BrokerPort = DEFAULT_PORT):
    """Stop the embedded broker started by `governor broker start`."""
    kafka = _kafka(port)
    if kafka.stop():
        console.print("stopped", soft_wrap=True)
    elif kafka.status().answers:  # (one started under another home: its pid file is there)
        console.print(f"no broker of {kafka.home} runs on port {port}, but one answers at "
                      f"{kafka.bootstrap}: stop it with the GOVERNOR_HOME it was started with",
                      markup=False, soft_wrap=True)
        raise typer.Exit(1)  # (a script that stops a broker to free its port finds it held)
    else:
        console.print("no embedded broker was running", soft_wrap=True)


@broker_app.command("status")
def broker_status(port: BrokerPort = DEFAULT_PORT):
    """Whether the embedded broker runs and answers, and who owns it: null where it is the
    user's (`governor broker start`), or the `governor up` or `demo` that stops it as it exits
    (`alive` false: that one was killed, and the next `up` or `demo` on it takes it over)."""
    status = _kafka(port).status()
    owner = status.owner and {"pid": status.owner.pid, "command": status.owner.command,
                              "alive": status.owner.alive()}
    print(json.dumps({"running": status.running, "answers": status.answers, "pid": status.pid,
                      "bootstrap": status.bootstrap, "home": str(status.home),
                      "owner": owner}))
    raise typer.Exit(0 if status.answers else 1)


@topics_app.command("create")
def topics_create(bootstrap: Bootstrap = None, namespace: Namespace = "governor",
                  align_configs: Annotated[bool, typer.Option(
                      "--align-configs", help="Give existing topics the catalog's cleanup policy, "
                      "retention and timestamp type (their other topic-level settings are kept).")] = False):
    """Create every topic of the catalog that does not exist yet (idempotent), and say which
    existing topics' configs differ from the catalog's."""
    from aiokafka.errors import KafkaError

    from infra.bus import (align_configs as align, config_drift, config_topic_split,
                           create_topics, make_again, misshapen_topics, on_broker,
                           topic_partitions)
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog(namespace)
    address = _reachable(bootstrap)
    created = asyncio.run(create_topics(address, catalog))
    partitions = asyncio.run(topic_partitions(address, catalog))
    try:
        drift = asyncio.run(config_drift(address, catalog))
    except (GovernorError, KafkaError) as exc:  # (a cluster that does not let us read them)
        if align_configs:
            raise GovernorError(f"could not read the topics' configs: {one_line(exc)}") from exc
        console.print(f"(the topics' configs were not compared: {one_line(exc)})", markup=False,
                      soft_wrap=True)
        drift = {}
    if align_configs and drift:
        asyncio.run(align(address, catalog, sorted(drift)))
    for name, spec in catalog.topics().items():
        state = "created" if name in created else "exists"
        count = partitions.get(name, spec.partitions)  # (a topic just made may not be listed yet)
        if count != spec.partitions:
            state = f"exists, with {count} partitions instead of {spec.partitions}"
        if name in drift:
            state += ("; set " if align_configs else "; the catalog's ") + ", ".join(
                f"{key} {want} (was {has})" if align_configs else f"{key} is {want}, it has {has}"
                for key, (has, want) in sorted(drift[name].items()))
        console.print(f"{name:40} {count:>3} partition{'s' if count != 1 else ' '}  "
                      f"{spec.cleanup:8} {state}",
                      markup=False, soft_wrap=True)
    if drift and not align_configs:
        console.print(f"{len(drift)} existing topics' configs differ from the catalog's (made by "
                      "an earlier release, or set by hand): `governor topics create"
                      f"{on_broker(bootstrap)} --namespace {namespace} --align-configs` sets "
                      "them", markup=False,
                      soft_wrap=True)
    misshapen = misshapen_topics(catalog, partitions)
    if misshapen:
        split = config_topic_split(catalog, partitions.get(catalog.config),  # (its settings)
                                   bootstrap)
        raise GovernorError(
            f"{len(misshapen)} of the topics of namespace {namespace!r} do not have the catalog's "
            f"partitions ({'; '.join(list(misshapen.values())[:3])}): make them again with "
            f"{make_again(namespace, misshapen, bootstrap)}" + (f"; {split}" if split else ""))


@topics_app.command("delete")
def topics_delete(topics: Annotated[list[str], typer.Argument(
                      help="Topics of the namespace's catalog: full names (NS.requests) or the "
                           "part after the namespace (requests).", show_default=False)],
                  bootstrap: Bootstrap = None, namespace: Namespace = "governor"):
    """Delete topics of the namespace's catalog, their records with them (one a broker created
    with other partitions than the catalog's, before `governor topics create` makes it again)."""
    from infra.bus import delete_topics, topic_partitions
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog(namespace)
    names = [t if t in catalog.topics() else f"{namespace}.{t}" for t in topics]
    unknown = [t for t, name in zip(topics, names) if name not in catalog.topics()]
    if unknown:
        raise GovernorError(f"not a topic of namespace {namespace!r}: {', '.join(unknown)} (its "
                            f"topics: {', '.join(catalog.topics())})")
    address = _reachable(bootstrap)
    present = [name for name in dict.fromkeys(names)
               if name in asyncio.run(topic_partitions(address, catalog))]
    if present:
        asyncio.run(delete_topics(address, present, wait=True))
    for name in dict.fromkeys(names):
        console.print(f"{name:40} {'deleted' if name in present else 'absent'}", markup=False,
                      soft_wrap=True)


@schemas_app.command("export")
def schemas_export(directory: Annotated[Path, typer.Argument(
        help="Folder to write them to (made if missing).")]):
    """Write a JSON schema per message model, for producers in other languages."""
    from schemas.export import export_json_schemas

    writable_dir("DIR", directory)  # (a file there: said so, not mkdir's "File exists")
    try:
        paths = export_json_schemas(directory)
    except OSError as exc:
        raise GovernorError(f"cannot write schemas to {directory}: {exc.strerror or exc}") from None
    for path in paths:
        console.print(str(path), markup=False, soft_wrap=True)


def _check_run_id(value: str | None) -> str | None:
    """``--run-id``: request ids are ``<run id>-NNNNNN``, so the id's characters and at most
    ``MAX_ID_CHARS`` less the suffix."""
    from schemas.limits import MAX_ID_CHARS

    longest = MAX_ID_CHARS - len("-NNNNNN")
    if value is not None and (len(value) > longest or not re.fullmatch(r"[A-Za-z0-9._:/@+=-]+", value)):
        raise GovernorError(f"--run-id {value[:40]!r}{'...' if len(value) > 40 else ''}: expected 1 "
                            f"to {longest} letters, digits or ._:/@+=- (the request ids append "
                            "-NNNNNN)")
    return value


async def _show_progress(done, total: int, what: str, every_s: float = 5.0) -> None:
    """``done()`` of ``total`` on stderr until cancelled: a bar on a terminal, else a plain line
    every ``every_s`` (a CI log shows rich's bars only at the end), its numbers written as the
    command's other lines write them (``sent 1,234/12,345``)."""
    if not console.is_terminal:
        while True:
            await asyncio.sleep(every_s)
            console.print(f"{what} {of_total(done(), total)}", markup=False, soft_wrap=True)
    with Progress(TextColumn(what), BarColumn(), TextColumn(OF_TOTAL_COLUMN),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(what, total=total)
        try:
            while True:
                progress.update(bar, completed=done())
                await asyncio.sleep(0.25)
        finally:
            progress.update(bar, completed=done())


async def _replay_until_signalled(items, address: str, catalog, run_id: str, speedup: float,
                                  total: int, **pacing) -> tuple[object, bool]:
    """Replay with progress; SIGINT or SIGTERM stops it after what was sent is flushed. Returns
    the trace rows sent (``infra.replay.SentRows``) and whether it was stopped. ``pacing``:
    ``replay``'s ``closed_loop``, ``step_wait_s`` and ``rate_scale``."""
    from infra.replay import NotDelivered, SentRows, replay as run_replay, request_index

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sent = SentRows()
    progress = asyncio.create_task(_show_progress(lambda: len(sent), total, "sent"))
    try:
        await run_replay(items, address, catalog, run_id=run_id, speedup=speedup, stop=stop,
                         on_sent=lambda request: sent.add(request_index(request.request_id)),
                         **pacing)
    except NotDelivered as exc:
        raise GovernorError(f"replay stopped: {exc}; {exc.delivered:,} of the {total:,} "
                            f"requests were delivered to {catalog.requests}, "
                            f"{total - len(sent):,} not sent") from None
    finally:
        progress.cancel()
        await asyncio.gather(progress, return_exceptions=True)
    return sent, stop.is_set()


ClosedLoop = Annotated[bool, typer.Option(
    "--closed-loop/--open-loop", help="Send a task's later step only once the step before it "
    "has ended (at its own time at the earliest), as governor sim does; open loop: every row at "
    "its time.")]


LiveDeadlines = Annotated[Deadlines, typer.Option(
    "--deadlines", help="The TTFT target and deadline a row that states none is sent with, as "
    "governor sim --deadlines gives them (the slo settings: replay's from the namespace's live "
    "configuration, demo's the default configuration its own stack runs). " + DEADLINES_HELP)]


def _live_slo(address: str, catalog):
    """The ``slo`` settings in force on ``catalog``'s namespace, as ``governor config get slo``
    reads them: what ``replay`` stamps a row's targets from."""
    from infra.config_cli import current_config

    return asyncio.run(current_config(address, catalog)).slo


def _check_with_live_slo(items, run_id: str, trace, catalog) -> None:
    """Check ``replay``'s rows again, stamped from the live ``slo`` settings (``items``), before
    any is sent: a row valid with the default targets can be invalid with the live ones (a TTFT
    target past a day), and would stop the replay partway. The error says where the targets
    came from (the rows were first checked with the defaults, before the broker was asked)."""
    from infra.replay import check_requests
    from infra.traces import TraceError

    try:
        check_requests(rows_with_progress("checked", items, "replay"), run_id, trace)
    except TraceError as exc:
        raise TraceError(f"{exc} (with its targets from the slo settings of {catalog.config}, "
                         "the live configuration)") from None


def _say_deadlines(deadlines: Deadlines, slo, source: str) -> None:
    """The line that says which targets a live run stamps on a row that states none, from the
    ``slo`` settings of ``source``."""
    from infra.sim.slo import SloRule

    rule = SloRule.configured(slo, deadlines.value)
    console.print(f"--deadlines {deadlines.value}: {rule.describe()} ({source})", markup=False,
                  soft_wrap=True)


@app.command()
def replay(ctx: typer.Context, trace: TraceArgument, bootstrap: Bootstrap = None,
           namespace: Namespace = "governor",
           speedup: Annotated[float, number_option(
               min=0.01, max=1000.0, help="Produce the requests this much faster than the "
                                          "trace's arrival times.")] = 1.0,
           limit: Limit = None, rate_scale: RateScale = 1.0,
           run_id: Annotated[str | None, typer.Option(
               callback=_check_run_id,
               help="Prefix of the request ids (default: replay-<time>-<random>, new each run: "
                    "a router serves one request per request id).")] = None,
           deadlines: LiveDeadlines = Deadlines.rule,
           closed_loop: ClosedLoop = False,
           step_wait_s: Annotated[float, number_option(
               min=1, max=86_400, help="Closed loop: once nothing else is left to send, how "
                                       "long to wait for the end of a step that a later one "
                                       "waits for.")] = 900.0):
    """Produce a trace's requests (Azure CSV, Mooncake or Governor JSONL) to <namespace>.requests;
    Ctrl-C or SIGTERM stops it and says how many were sent (exit 130)."""
    from infra.replay import as_simulated, checked
    from infra.sim.outcomes import TaskCoverage
    from infra.traces import load_trace
    from infra.sim.slo import SloRule
    from schemas.config import SloConfig
    from schemas.topics import TopicCatalog

    if not closed_loop and _given(ctx, "step_wait_s"):
        raise GovernorError("--step-wait-s applies to --closed-loop only: an open-loop replay "
                            "waits for no step (add --closed-loop)")

    def rows(slo=None):  # read again, streamed: checked whole, then sent (with sim's targets)
        return as_simulated(load_trace(trace, limit=limit), deadlines.value, slo)

    catalog = TopicCatalog(namespace)
    run_id = run_id or f"replay-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    console.print(f"replay {run_id}: checking {trace}", markup=False, soft_wrap=True)
    total, coverage = 0, TaskCoverage()

    def tallied(items):
        nonlocal total
        for total, item in enumerate(items, 1):
            yield coverage.note(item)

    # every row, and when the last arrives (as sim refuses a run past 14 days), before the
    # broker is asked
    with said_if_interrupted(f"interrupted while checking {trace}: nothing was sent"):
        check_span(tallied(rows_with_progress("checked", checked(rows(), run_id, trace),
                                              "replay")), rate_scale, trace, "--limit")
    if not total:  # (as sim and demo refuse it)
        raise GovernorError(f"{trace} has no request to replay")
    warn_of_cut_tasks(console, coverage, "--limit")
    loader = logging.getLogger("infra.traces.loaders")  # its warnings: said by the check
    level = loader.level
    loader.setLevel(logging.ERROR)
    try:
        address = _with_topics(bootstrap, catalog)  # a misspelt namespace is no new one
        slo = _live_slo(address, catalog)
        _say_deadlines(deadlines, slo, f"slo of {catalog.config}, the live configuration")
        live, checked_by = (SloRule.configured(s, deadlines.value) for s in (slo, SloConfig()))
        if not live.stated_only and live != checked_by:  # (stamped otherwise than checked above)
            _check_with_live_slo(rows(slo), run_id, trace, catalog)
        console.print(f"sending {counted(total, 'request')} to {catalog.requests} as "
                      f"{run_id}-NNNNNN",
                      markup=False, soft_wrap=True)
        rows_sent, stopped = asyncio.run(_replay_until_signalled(
            rows(slo), address, catalog, run_id, speedup, total, closed_loop=closed_loop,
            step_wait_s=step_wait_s, rate_scale=rate_scale))
    finally:
        loader.setLevel(level)
    sent = len(rows_sent)
    if stopped:
        console.print(f"interrupted: sent {sent:,} of {total:,} requests to {catalog.requests} "
                      f"(ids {rows_sent.said(run_id)})", markup=False, soft_wrap=True)
        raise typer.Exit(130)
    console.print(f"sent {counted(sent, 'request')} to {catalog.requests} (ids {run_id}-NNNNNN)",
                  markup=False, soft_wrap=True)
    if sent < total:  # (closed loop: steps whose previous step did not end in time)
        console.print(f"{total - sent:,} of the trace's steps were not sent: the steps before "
                      f"them did not end within --step-wait-s {step_wait_s:g}", markup=False,
                      soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def router(bootstrap: Bootstrap = None, namespace: Namespace = "governor",
           router_id: Annotated[str, typer.Option(
               help="This router's id in the router group, the same at each restart (it takes "
                    "back its own requests); each running router needs its own.")] = "router-0",
           no_worker_wait_s: Annotated[float, number_option(
               min=0, max=86_400, help="How long a request waits for a live worker of its "
                                       "model before it is rejected (out of line: the "
                                       "requests behind it are served meanwhile).")
           ] = 60.0,  # (controllers.router.core.NO_WORKER_WAIT_S: not imported at start)
           recovery_window_s: Annotated[float, number_option(
               min=0, max=86_400,
               help="On start, read back this many seconds of dispatches and lifecycle events "
                    "to take over the requests in flight (0: none).")] = 600.0,
           orphan_after_s: Annotated[float, number_option(
               min=0, max=86_400,
               help="Resume the requests of a router missing from the router group this long "
                    "(removed, or replaced under another id); the live routers share them out "
                    "by a hash of each request's id.")] = 60.0,
           metrics_port: MetricsPort = 0):
    """Run a router: admission and placement of requests on workers."""
    from controllers.router.service import RouterService
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog(namespace)
    registry = _serve_metrics(metrics_port)
    address = _with_topics(bootstrap, catalog)
    _run_until_signalled(lambda: RouterService(
        address, catalog, router_id=router_id, no_worker_wait_s=no_worker_wait_s,
        recovery_window_s=recovery_window_s, orphan_after_s=orphan_after_s, registry=registry))


#: The engines each engine-specific option of ``governor worker`` applies to.
ENGINE_OPTIONS = {"tp": ("sim", "fixed-rate", "vllm"), "max_num_batched_tokens": ("sim",),
                  "max_num_seqs": ("sim", "fixed-rate"), "cold": ("sim", "fixed-rate"),
                  "decode_tokens_per_s": ("fixed-rate",)}


def _check_gpu(gpu: str) -> None:
    """``--gpu`` names a GPU type the fleet knows (its performance and price), whatever the
    engine, as a pool of ``up`` and ``demo`` must (an error otherwise)."""
    from workers.sim.models import gpu_spec

    try:
        gpu_spec(gpu)
    except ValueError as exc:
        raise GovernorError(f"--gpu: {exc}") from None


def _check_worker_engine(engine: str, gpu: str, model: str, tp: int) -> None:
    """A worker's ``--engine``, ``--gpu`` and, for a simulated built-in model, ``--tp``, checked
    before a broker is reached (a declared model's shape is read from the broker, and its
    ``--tp`` checked as the engine is built)."""
    from workers.factory import ENGINES, check_tp
    from workers.sim.models import gpu_spec, is_known, model_spec

    if engine not in ENGINES:
        raise GovernorError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    _check_gpu(gpu)
    if engine == "sim" and is_known(model):
        check_tp(model_spec(model), tp, gpu_spec(gpu))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` was given (on the command line or by its environment
    variable), not defaulted."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _options_for_engine(ctx: typer.Context, engine: str) -> None:
    """An error for an option given (not defaulted) that ``engine`` would not use."""
    for name, engines in ENGINE_OPTIONS.items():
        if engine not in engines and _given(ctx, name):
            raise GovernorError(f"--{name.replace('_', '-')} does not apply to --engine {engine}, "
                                f"which would not use it (it is for --engine "
                                f"{' or '.join(engines)})")


@app.command()
def worker(ctx: typer.Context,
           slot: Annotated[int, typer.Option(min=0, help="Dispatch partition to serve.")],
           bootstrap: Bootstrap = None, namespace: Namespace = "governor",
           gpu: Annotated[str, typer.Option(help="a100, h100 or h200.")] = "h100",
           model: Annotated[str, typer.Option(
               help="The model it serves, as requests name it (sim: built in, or declared by "
                    "`governor config set models.NAME`).")] = "llama-3-8b",
           tp: Annotated[int, typer.Option(
               min=1, max=8, help="GPUs it serves on, each billed: sim simulates that tensor "
                                  "parallelism; vllm: its server's --tensor-parallel-size, "
                                  "which the worker cannot see; fixed-rate, which models no "
                                  "GPU: only billed.")] = 1,
           engine: Annotated[str, typer.Option(help="sim (calibrated), fixed-rate or vllm.")] = "sim",
           vllm_url: Annotated[str | None, typer.Option(
               help="vllm engine only: a vLLM (or `governor sim-server`) base URL.")] = None,
           speedup: Speedup = 1.0,  # (sim and fixed-rate engines only)
           max_num_seqs: MaxNumSeqs = 256, max_num_batched_tokens: MaxBatchedTokens = 8192,
           cold: Annotated[bool, typer.Option(help="Start by loading the weights.")] = False,
           decode_tokens_per_s: Annotated[float, number_option(
               min=0.01, max=1e6, help="fixed-rate engine only")] = 100.0,
           metrics_port: MetricsPort = 0,
           drain_timeout_s: Annotated[float, number_option(
               min=0, max=86_400, help="On SIGTERM, how long to finish what it holds before "
                                       "handing the rest back.")] = 30.0):
    """Run one worker (one GPU slot): the calibrated simulated engine, the fixed-rate one, or a
    vLLM server over HTTP."""
    from schemas.limits import pool_name
    from schemas.topics import TopicCatalog
    from workers.factory import build_engine, check_server_url
    from workers.metrics import EngineMetrics
    from workers.service import WorkerIdentity, WorkerService

    catalog = TopicCatalog(namespace)
    partitions = catalog.spec(catalog.dispatch).partitions
    if slot >= partitions:
        raise GovernorError(f"--slot must be below {partitions}, the dispatch topic's partitions")
    _check_worker_engine(engine, gpu, model, tp)
    gpu = gpu.lower()  # (the GPU type as a fleet names it: its pool, and its price, by it)
    if engine == "vllm" and vllm_url:  # (at once: not after waiting for a broker)
        check_server_url(vllm_url)
    if engine in ("sim", "fixed-rate"):  # (a vLLM server's model is named as it serves it)
        _model_spelt_exactly(model)
    if engine in ("sim", "fixed-rate", "vllm"):
        _options_for_engine(ctx, engine)
    if engine in ("sim", "fixed-rate") and vllm_url is not None:  # (no server used)
        raise GovernorError(f"--vllm-url is for --engine vllm; this worker runs --engine {engine}, "
                            "which would not use it (add --engine vllm)")
    if engine == "vllm" and speedup != 1.0:  # (its times are the server's: wall seconds)
        raise GovernorError(f"--speedup {speedup:g}: a vLLM server runs in real time; --speedup "
                            "is for the simulated and fixed-rate engines")
    registry = _serve_metrics(metrics_port)
    address = _with_topics(bootstrap, catalog)
    if engine == "sim":
        _declare_models(address, catalog, model)
        _model_spelt_exactly(model)  # (again: a declared model's name is known now)
    identity = WorkerIdentity(slot, f"worker-{slot}", pool_name(gpu, model), gpu, model)
    built = build_engine(engine, gpu=gpu, model=model, tp=tp, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, cold=cold,
                         decode_tokens_per_s=decode_tokens_per_s, vllm_url=vllm_url,
                         vllm_api_key=os.environ.get("VLLM_API_KEY") or None)
    metrics = EngineMetrics(model, registry)
    _run_until_signalled(lambda: WorkerService(address, catalog, identity, built, speedup=speedup,
                                               metrics=metrics, drain_timeout_s=drain_timeout_s))


def _declare_models(bootstrap: str, catalog, *names: str) -> None:
    """A simulated worker of a model not built in runs the shape that the configuration in
    force declares for it (the setting ``models``), as the router predicts it: read where one
    of ``names`` is not built in."""
    from infra.config_cli import current_config
    from workers.sim import models

    if not all(models.is_known(name) for name in names):
        models.configure_models(asyncio.run(current_config(bootstrap, catalog)).models)


# -- live signals (streams/) -------------------------------------------------------------------

@app.command()
def streams(bootstrap: Bootstrap = None, namespace: Namespace = "governor",
            metrics_port: MetricsPort = 0,
            tick_s: Annotated[float, number_option(
                min=0.05, max=60, help="Publish every this often.")] = 0.5,
            allowed_lateness_s: Annotated[float, number_option(
                min=0, max=3600, help="How far behind its partition's newest event an event "
                                      "still counts in its windows.")] = 30.0,
            max_event_ahead_s: Annotated[float, number_option(
                min=0, max=3600, help="Dead-letter events stamped further ahead of this "
                                      "process's clock.")] = 10.0,
            recovery_stall_s: Annotated[float, number_option(
                min=1, max=86_400, help="Exit non-zero (logging an ERROR naming the changelogs "
                                        "waited on) when the tables' recovery has read nothing "
                                        "for this long.")] = 300.0):
    """Run one Faust worker computing live signals from telemetry into NS.signals (run several
    for more throughput; they split the partitions and take over from each other)."""
    from schemas.topics import TopicCatalog
    from streams.sources import sources_problem
    from streams.worker import run_worker, settings_for

    if metrics_port:
        _port_free("--metrics-port", "127.0.0.1", metrics_port)
    catalog = TopicCatalog(namespace)
    partitions = catalog.spec(catalog.telemetry).partitions  # the streams' (``settings_for``)
    address = _with_topics(bootstrap, catalog, partial(sources_problem, catalog, partitions,
                                                       bootstrap=bootstrap))
    settings = settings_for(namespace, address, metrics_port=metrics_port, tick_s=tick_s,
                            allowed_lateness_s=allowed_lateness_s,
                            max_event_ahead_s=max_event_ahead_s,
                            recovery_stall_s=recovery_stall_s)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    run_worker(settings, loglevel=level if isinstance(level, str) else "WARNING")


@app.command("sim-server")
def sim_server(port: Annotated[int, typer.Option(
                   min=0, max=65535, help="0: any free one (the URL printed says which).")] = 8000,
               host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
               gpu: Annotated[str, typer.Option(help="a100, h100 or h200.")] = "h100",
               model: Annotated[str, typer.Option(
                   help="A built-in model: llama-3-8b, llama-2-7b or llama-2-70b.")] = "llama-3-8b",
               tp: Annotated[int, typer.Option(
                   min=1, max=8, help="The tensor parallelism simulated: the GPUs it runs on, "
                                      "as vLLM's --tensor-parallel-size.")] = 1,
               speedup: Speedup = 1.0,
               max_num_seqs: MaxNumSeqs = 256, max_num_batched_tokens: MaxBatchedTokens = 8192,
               max_model_len: Annotated[int | None, typer.Option(
                   min=16, help="The longest prompt and output served (at most the model's "
                                "context); default: the model's.")] = None):
    """Serve one simulated engine behind vLLM's OpenAI-compatible API and vLLM's /metrics."""
    from workers.sim.models import MODELS, is_known
    from workers.sim_server import serve

    if not is_known(model):  # (it reads no configuration: a declared model is not served)
        raise GovernorError(f"--model {model!r}: sim-server serves a built-in model: "
                            f"{', '.join(sorted(MODELS))}")
    _model_spelt_exactly(model)  # (it serves the model under the name given)
    _check_gpu(gpu)
    if port:
        _port_free("--port", host, port)
    serve(host, port, gpu=gpu, model=model, tp=tp, speedup=speedup, max_num_seqs=max_num_seqs,
          max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
          listening=lambda url: console.print(
              f"sim-server: {model} on {gpu} (speedup {speedup:g}) at {url}", markup=False,
              soft_wrap=True))


@app.command()
def demo(ctx: typer.Context,
         trace: Annotated[Path | None, typer.Option(help="Trace file; default: built-in workload.")] = None,
         duration: Annotated[float, number_option(
             min=1, max=MAX_WORKLOAD_S, help="Seconds of trace to replay (at most 14 days).")] = 30.0,
         limit: Limit = None, rate_scale: RateScale = 1.0,
         speedup: Speedup = 1.0, json_out: Annotated[Path | None, typer.Option(
             "--json", help="Also write the report here.")] = None,
         bootstrap: StackBootstrap = None,
         fleet: Annotated[str, typer.Option(
             help="Pools as GPU:COUNT\\[/tpN]\\[@MODEL], comma-separated (COUNT is GPUs; at "
                  "most 32 workers).")]
         = "h100:2,a100:2",
         seed: Annotated[int, typer.Option(
             min=0, help="Seed of the built-in workload (a --trace is replayed as it is).")] = 0,
         drain_timeout: Annotated[float, number_option(
             min=0, max=86_400, help="Seconds to wait, after the replay, for every request "
                                     "to finish.")] = 120.0,
         engine: Annotated[str, typer.Option(help="Workers' engine: sim or fixed-rate.")] = "sim",
         analytics: Annotated[bool, typer.Option(help="Run the analytics sink; report "
                                                 "analytics_rows.")] = True,
         fault: Annotated[list[str] | None, typer.Option(
             help="kill:SLOT@S, start:SLOT@S, slow:SLOT:FACTOR@S, stall:SLOT:SECONDS@S, "
                  "restart:router|controllers|streams|sink@S or "
                  "pause:router|controllers|streams|sink|SLOT:SECONDS@S; repeatable.")] = None,
         autoscale: Annotated[bool, typer.Option(
             help="Enable the autoscaler; a supervisor starts and stops workers.")] = False,
         deadlines: LiveDeadlines = Deadlines.rule,
         closed_loop: ClosedLoop = False,
         broker_port: BrokerPort = DEFAULT_PORT, controller_port: ControllerPort = None):
    """Bring up the stack, replay a workload through it, and report what happened."""
    from infra.demo import DemoOptions, run_demo, workload_rows
    from infra.faults import check_sequence, parse_fault
    from infra.replay import as_simulated, check_requests
    from infra.traces import TraceError
    from schemas.config import SloConfig

    pools = _check_fleet(fleet)
    ports = _embedded_ports(ctx, bootstrap, broker_port, controller_port)
    try:
        faults = tuple(parse_fault(f, sum(pool.count for pool in pools)) for f in fault or ())
        if not autoscale:  # (the supervisor starts and stops workers of its own)
            check_sequence(list(zip(fault or (), faults)))
    except ValueError as exc:
        raise GovernorError(str(exc)) from None
    if trace is not None and _given(ctx, "seed"):
        raise GovernorError("--seed draws the built-in workload; a --trace is replayed as it is "
                            "(leave out one of them)")
    for given, parsed in zip(fault or (), faults):
        if parsed.component == "sink" and not analytics:
            raise GovernorError(f"--fault {given}: --no-analytics runs no sink to {parsed.kind}")
    scaled = f" / --rate-scale {rate_scale:g}" if rate_scale != 1 else ""
    _faults_before_the_end(fault or [], faults, duration / rate_scale / speedup,
                           f"--duration {duration:g}{scaled} / --speedup {speedup:g}")
    if engine not in ("sim", "fixed-rate"):
        raise GovernorError(f"--engine {engine!r}: expected sim or fixed-rate")
    if json_out is not None:
        writable_report("--json", json_out)
        not_the_trace("--json", json_out, trace)
    if trace is not None:  # (a trace of millions of rows takes a while: said as it goes)
        console.print(f"demo: reading {trace}", markup=False, soft_wrap=True)
    try:  # before anything starts: a missing, empty or invalid trace is found now
        items = workload_rows(DemoOptions(bootstrap="", trace=trace, duration_s=duration,
                                          seed=seed, limit=limit))
        items = list(as_simulated(rows_with_progress("read", items, "demo"), deadlines.value))
        check_requests(rows_with_progress(f"checked of {len(items):,}", items, "demo"), "demo",
                       trace)
        span_s = check_span(items, rate_scale, trace, "--duration or --limit")
    except (TraceError, ValueError) as exc:
        raise GovernorError(one_line(exc)) from None
    if limit is not None and len(items) == limit and not closed_loop:  # (cut short by --limit)
        _faults_before_the_end(fault or [], faults, span_s / speedup,
                               f"the last of --limit {limit} requests arrives "
                               f"{round(span_s, 2):g} s in / --speedup {speedup:g}")
    if not items:
        raise no_request_in_window(trace, duration)
    warning = unserved_warning(fleet, {pool.model for pool in pools}, [i.model for i in items])
    if warning:
        console.print(warning, markup=False, soft_wrap=True)
    _say_deadlines(deadlines, SloConfig(), "slo of the default configuration the demo's stack runs")

    off_a_hung_up_terminal = _sigterm_as_interrupt()
    kafka = started_kafka = None
    if ports is not None:
        kafka, bootstrap, started_kafka = _start_embedded(ports, "governor demo")
    else:
        _reachable(bootstrap)
    options = DemoOptions(bootstrap=bootstrap, trace=trace, duration_s=duration, speedup=speedup,
                          limit=limit, rate_scale=rate_scale, fleet=fleet, seed=seed, drain_timeout_s=drain_timeout, engine=engine,
                          faults=faults, autoscale=autoscale, closed_loop=closed_loop,
                          analytics=analytics)
    async def demo_until_stopped() -> dict:
        stop = asyncio.Event()  # Ctrl-C, SIGTERM or SIGHUP: the run ends, reported as it stands

        def hung_up() -> None:
            off_a_hung_up_terminal()
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, hung_up if sig == signal.SIGHUP else stop.set)
        return await run_demo(options, console, items, stop=stop)

    try:
        report = asyncio.run(demo_until_stopped())
    finally:
        _stop_signals.finishing()  # (the loop's handlers are gone with it)
        if started_kafka:
            kafka.stop()
    print_report(json.dumps(report, indent=2), json_out)
    if report.get("interrupted"):
        console.print(f"interrupted: the report covers {report['duration_s']:g} s, "
                      f"{report['requests_sent']:,} of {len(items):,} requests sent", markup=False,
                      soft_wrap=True)
        raise typer.Exit(130)
    failed = [what for what, bad in (
        ("some accepted requests did not reach exactly one terminal state",
         report["unfinished"] or report["multiple_terminal_states"]),
        ("some response streams broke (a gap, a repeat or a wrong token)",
         report.get("streams_broken")),
        ("some completed requests' response streams never ended (no final chunk)",
         report.get("streams_unfinished")),
        (f"faults not injected: {', '.join(report.get('faults_not_injected', []))}",
         report.get("faults_not_injected")),
        (f"{report.get('steps_not_sent')} of the trace's steps were not sent: the steps before "
         f"them did not end within --drain-timeout {drain_timeout:g}",
         report.get("steps_not_sent"))) if bad]
    for what in failed:
        console.print(what, style="red", markup=False, soft_wrap=True)
    if failed:
        raise typer.Exit(1)


@app.command()
def up(ctx: typer.Context, bootstrap: StackBootstrap = None, namespace: Namespace = "governor",
       fleet: Annotated[str, typer.Option(help="Pools as GPU:COUNT\\[/tpN]\\[@MODEL], comma-separated (COUNT is GPUs).")] = "h100:2,a100:2",
       log_dir: Annotated[Path, typer.Option(
           help="The components' logs, one <component>.log each.")] = Path(".governor/up"),
       data_dir: DataDir = ANALYTICS_DIR,
       metrics_port: Annotated[int, typer.Option(
           min=0, max=65_535 - WORKER_METRICS_OFFSET - 1024, help="Serve each component's "
           "Prometheus /metrics on 127.0.0.1: the router here, the controllers one above, the "
           "streams worker two above, the sink three, the worker on slot N 10+N above; 0: off.")]
       = 0,
       no_worker_wait_s: Annotated[float, number_option(
           min=0, max=86_400, help="The router's: how long a request waits for a live worker "
                                   "of its model (a pool at zero loading one) before it is "
                                   "rejected.")] = 60.0,
       vllm_url: Annotated[list[str] | None, typer.Option(
           help="A vLLM (or `governor sim-server`) server's base URL for each worker of --fleet "
                "(a pool of N GPUs at tp d is N/d servers of d GPUs), in its order "
                "(repeatable): the workers run --engine vllm, one a server, and "
                "the autoscaler does not scale them.")] = None,
       broker_port: BrokerPort = DEFAULT_PORT, controller_port: ControllerPort = None):
    """Start the local stack (embedded Kafka unless --bootstrap) with a live view; Ctrl-C stops it.
    Its analytics sink stores in --data-dir, where `governor sql` and `governor report` look."""
    from infra.stack import hold_log_dir, metrics_ports, wait_for_left_running
    from infra.up import run_up
    from workers.factory import check_server_url

    pools = _check_fleet(fleet, models="none" if vllm_url else "built-in")
    ports = _embedded_ports(ctx, bootstrap, broker_port, controller_port)
    for url in vllm_url or []:
        check_server_url(url)
    slots = sum(pool.count for pool in pools)
    if vllm_url and len(vllm_url) != slots:
        given = "once" if len(vllm_url) == 1 else f"{len(vllm_url)} times"
        each = ", ".join(f"{pool.name}: {pool.gpus} GPU{'s' if pool.gpus > 1 else ''} at "
                         f"{pool.tp} a worker" for pool in pools)
        raise GovernorError(f"--vllm-url is given {given}, but --fleet {fleet} has {slots} "
                            f"worker{'s' if slots > 1 else ''} ({each}): give each worker a "
                            "server")
    writable_dir("--log-dir", log_dir)
    writable_dir("--data-dir", data_dir)
    # (the ports of workers the autoscaler adds: when they are added)
    for name, port in metrics_ports(metrics_port, sum(pool.count for pool in pools)).items():
        whose = name if name.startswith("worker-") else f"the {name}"
        _port_free(f"--metrics-port (for {whose})", "127.0.0.1", port)
    held = hold_log_dir(log_dir)  # (one `up` a log dir, until this one exits)
    try:
        _sigterm_as_interrupt()
        kafka = started_kafka = None
        if ports is not None:  # (a broker already running there is left running)
            kafka, address, started_kafka = _start_embedded(ports, "governor up")
        else:
            address = _reachable(bootstrap)
        try:  # (the components a killed `up` on the log dir left running stop first)
            wait_for_left_running(log_dir, partial(console.print, markup=False, soft_wrap=True))
            if not vllm_url:
                _check_declared_models(address, namespace, fleet, pools)
            asyncio.run(_stop_signals.cancelling(run_up(
                address, namespace, fleet, log_dir, data_dir, console, metrics_port=metrics_port,
                router_args=("--no-worker-wait-s", f"{no_worker_wait_s:g}"),
                vllm_urls=tuple(vllm_url or ()))))
        except KeyboardInterrupt:
            console.print("stopped", soft_wrap=True)
        finally:
            _stop_signals.finishing()  # (its broker stopped whatever comes: it runs on otherwise)
            if started_kafka:
                kafka.stop()
    finally:
        held.close()


# --- analytics: the sink, SQL and reports (analytics/) -------------------------------------------

def _http_url(value: str | None) -> str | None:
    """An http(s) URL with a host, or a usage error naming what it is not."""
    from workers.factory import is_http_url

    if value is None:
        return None
    if not is_http_url(value):
        raise typer.BadParameter(f"{value!r} is no http:// or https:// URL with a host")
    return value


ClickHouseUrl = Annotated[str | None, typer.Option(
    "--clickhouse-url", envvar="GOVERNOR_CLICKHOUSE_URL", metavar="URL", callback=_http_url,
    help="A ClickHouse server (http://user:password@host:8123) instead of the embedded store.")]
SqlEndpointUrl = Annotated[str | None, typer.Option(
    "--endpoint", envvar="GOVERNOR_SQL_URL", metavar="URL", callback=_http_url,
    help="A running sink's SQL endpoint; default: the one the sink on --data-dir announced.")]
OutputFormatOption = Annotated[Literal["table", "csv", "json"], typer.Option(
    "--format", help="table, csv or json.")]


@app.command()
def sink(ctx: typer.Context, bootstrap: Bootstrap = None, namespace: Namespace = "governor",
         data_dir: DataDir = ANALYTICS_DIR, clickhouse_url: ClickHouseUrl = None,
         sql_port: Annotated[int, typer.Option(
             min=0, max=65535, help="SQL endpoint port on 127.0.0.1; 0: any free one.")] = 8124,
         no_sql: Annotated[bool, typer.Option("--no-sql", help="Serve no SQL endpoint.")] = False,
         max_batch_records: Annotated[int | None, typer.Option(
             min=1, max=10_000_000,
             help="Records a flush takes at most (default 200,000).")] = None,
         max_batch_age_s: Annotated[float | None, number_option(
             min=0.01, max=3600, help="Flush a batch this old (default 0.5 s).")] = None,
         metrics_port: MetricsPort = 0):
    """Land every topic of the namespace in ClickHouse, each record once, and serve read-only SQL."""
    from analytics.service import SinkService
    from analytics.sink import SinkSettings
    from schemas.topics import TopicCatalog

    if no_sql and _given(ctx, "sql_port"):
        raise GovernorError("--sql-port does not apply with --no-sql, which serves no SQL "
                            "endpoint: give one or the other")
    writable_dir("--data-dir", data_dir)  # (its store or, with a server, its endpoint's file)
    registry = _serve_metrics(metrics_port)
    address = _with_topics(bootstrap, TopicCatalog(namespace))
    given = {"max_batch_records": max_batch_records, "max_batch_age_s": max_batch_age_s}
    settings = SinkSettings(**{name: value for name, value in given.items()
                               if value is not None})
    _run_until_signalled(lambda: SinkService(address, namespace, data_dir, clickhouse_url,
                                             None if no_sql else sql_port, settings, registry))


@app.command()
def sql(ctx: typer.Context,
        query: Annotated[str, typer.Argument(help="One read-only statement (SELECT, SHOW, ...).")],
        fmt: OutputFormatOption = "table", namespace: Namespace = "governor",
        data_dir: DataDir = ANALYTICS_DIR, clickhouse_url: ClickHouseUrl = None,
        endpoint: SqlEndpointUrl = None,
        param: Annotated[list[str] | None, typer.Option(
            "--param", help="NAME=VALUE: the value of the query's {NAME:Type} (a number, a JSON "
                            "array, or text; repeatable), as governor report --show-sql lists "
                            "a report's.")] = None):
    """Query the analytics store; tables: SHOW TABLES, columns: DESCRIBE TABLE name."""
    from analytics.query import open_source, render

    parameters = _query_parameters(param or [])
    source = open_source(namespace, clickhouse_url, endpoint, data_dir, _waiting_for_sink,
                         namespace_given=_given(ctx, "namespace"))
    try:
        print(render(source.query(query, parameters or None), fmt))
    except GovernorError as exc:  # (the store's, the endpoint's or the guard's)
        if "UNKNOWN_QUERY_PARAMETER" not in str(exc):
            raise
        raise GovernorError(f"{exc}: give each {{NAME:Type}} of the query its value with --param "
                            "NAME=VALUE (governor report --show-sql lists a report's)") from None
    finally:
        source.close()


def _waiting_for_sink(url: str, wait_s: float) -> None:
    console.print(f"waiting for the sink at {url} to open its store (at most {wait_s:g} s) ...",
                  markup=False, soft_wrap=True)


def _query_parameters(items: list[str]) -> dict[str, Any]:
    """``--param NAME=VALUE`` of ``governor sql``: each value read as JSON (a number, an
    array), else taken as text."""
    parameters: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.isidentifier():
            raise GovernorError(f"bad --param {item!r}: expected NAME=VALUE, e.g. days=7")
        try:
            parameters[name] = json.loads(raw)
        except ValueError:
            parameters[name] = raw
    return parameters


def _settings_note(parameters: dict[str, Any]) -> str:
    """What ``--show-sql`` says of the parameters it gives the settings' defaults."""
    from_settings = [name for name in parameters if name.startswith(("default_", "price_"))]
    if not from_settings:
        return ""
    return (f" ({', '.join(from_settings)}: the defaults of the slo and GPU price settings, "
            "where a report takes those in force)")


def _shown_sql(name: str, sql: str, parameters: dict[str, Any]) -> str:
    """A report's SQL as ``--show-sql`` gives it: headed by a ``/* ... */`` comment naming the
    ``governor sql --param`` options it runs with. (A ``--`` line comment made the SQL begin with
    ``-``, which ``governor sql`` took for an option unless it came after ``--``.)"""
    return (f"/* {name}: governor sql {_as_params(parameters)} \"SQL\""
            f"{_settings_note(parameters)} */\n{sql.strip()}")


def _as_params(parameters: dict[str, Any]) -> str:
    """``parameters`` as ``governor sql``'s ``--param`` options, quoted for a shell."""
    return " ".join(f"--param {shlex.quote(f'{name}={json.dumps(value)}')}"
                    for name, value in parameters.items())


@app.command()
def report(ctx: typer.Context, names: Annotated[list[str] | None, typer.Argument(
               help="Reports to run (default: all): cost, slo, cache, actions, task-failures, "
                    "rejections.")] = None,
           audit: Annotated[bool, typer.Option("--audit", help="Check that every accepted request "
                                               "the store holds (whatever --days; sent before "
                                               "--until, if given) reached exactly one terminal "
                                               "state.")] = False,
           as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
           fmt: OutputFormatOption = "table",
           days: Annotated[int, typer.Option(min=1, max=36_500, help="Look back this many days "
                                             "(at most what a report's tables keep: cost and "
                                             "cache 29, task-failures 89, slo and rejections 90, "
                                             "actions 365).")] = 7,
           until: Annotated[str | None, typer.Option(
               metavar="TIME", help="End the window at TIME instead of now (the --days before "
                                    "it; --audit: the requests sent before it): ISO-8601 with a "
                                    "zone, 2026-12-06T00:00:00Z, or a date, its midnight UTC. "
                                    "Not ahead of this clock.")] = None,
           bucket: Annotated[Literal["minute", "hour", "day"], typer.Option(
               help="Time series resolution.")] = "hour",
           limit: Annotated[int, typer.Option(min=1, max=1_000_000, help="Rows of the actions timeline.")] = 100,
           grace_s: Annotated[float, number_option(
               min=0, max=86_400,
               help="--audit: requests active this recently before the window's end "
                    "(--until, else now) count as in flight.")] = 0.0,
           show_sql: Annotated[bool, typer.Option("--show-sql", help="Print the SQL only.")] = False,
           namespace: Namespace = "governor", data_dir: DataDir = ANALYTICS_DIR,
           clickhouse_url: ClickHouseUrl = None, endpoint: SqlEndpointUrl = None):
    """Reports on cost, SLOs, caching, controller actions and failures; --audit proves the invariant."""
    from analytics.audit import AUDIT_SQL, audit_parameters, run_audit
    from analytics.query import open_source, render
    from analytics.reports import REPORTS, report_parameters, run_report
    from analytics.store import QueryResult
    from analytics.window import parse_until, wall_clock_ms

    if _given(ctx, "grace_s") and not audit:
        raise GovernorError("--grace-s applies to --audit only (add --audit)")
    if as_json and fmt != "json" and _given(ctx, "fmt"):
        raise GovernorError(f"--json writes JSON: give it or --format {fmt}, not both")
    unknown = [n for n in names or [] if n not in REPORTS]
    if unknown:
        raise GovernorError(f"no report named {', '.join(unknown)}; choose from {', '.join(REPORTS)}")
    chosen = [] if audit and not names else list(names or REPORTS)
    for name, parameter in (("limit", "{limit:"), ("bucket", "{bucket_s:")):
        takers = [report for report in REPORTS if parameter in REPORTS[report].sql]
        if _given(ctx, name) and not set(takers) & set(chosen):
            raise GovernorError(f"--{name} applies to the {' and '.join(takers)} report"
                                f"{'s' if len(takers) > 1 else ''} only (name "
                                f"{'one' if len(takers) > 1 else 'it'}, or leave --{name} out)")
    if not chosen:  # the audit alone: every request the store holds (--until: sent before it)
        if _given(ctx, "days"):
            raise GovernorError("--days applies to the reports; --audit checks every request "
                                "the store holds (name a report, or leave --days out)")
        if _given(ctx, "fmt") and fmt != "json":
            raise GovernorError(f"--audit alone writes JSON: leave --format {fmt} out, or name a "
                                "report")
    now = wall_clock_ms()
    # (None: each report's window ends as it runs, as before --until)
    until_ms = None if until is None else parse_until(until, now)
    if show_sql:  # each with the --param values governor sql runs it with
        shown = [("audit", AUDIT_SQL, audit_parameters(grace_s, now_ms=now,
                                                       until_ms=until_ms))] * audit + [
            (n, REPORTS[n].sql, report_parameters(n, days, bucket, limit, until_ms=until_ms,
                                                  now_ms=now)) for n in chosen]
        print("\n\n".join(_shown_sql(*each) for each in shown))
        return
    for name in chosen:  # each one's limit, before any runs
        REPORTS[name].check_days(days, ended_ms_ago=0 if until_ms is None else now - until_ms)
    source = open_source(namespace, clickhouse_url, endpoint, data_dir, _waiting_for_sink,
                         namespace_given=_given(ctx, "namespace"))
    try:
        results: dict[str, object] = {}
        if audit:
            results["audit"] = run_audit(source, grace_s=grace_s,  # (its clock as it runs)
                                         until_ms=until_ms)
        for name in chosen:
            results[name] = run_report(source, name, days=days, bucket=bucket, limit=limit,
                                       until_ms=until_ms)
    finally:
        source.close()
    if as_json or fmt == "json":
        plain = {k: v.dicts() if isinstance(v, QueryResult) else v for k, v in results.items()}
        print(json.dumps(plain["audit"] if list(plain) == ["audit"] else plain, indent=1))
    else:
        for name, value in results.items():
            title = "Audit: every accepted request reaches exactly one terminal state" \
                if name == "audit" else REPORTS[name].title
            console.print(f"\n[bold]{title}[/]", soft_wrap=True)
            print(json.dumps(value, indent=1) if name == "audit" else render(value, fmt))
    if audit and not results["audit"]["ok"]:
        raise typer.Exit(1)


@app.command()
def controllers(bootstrap: Bootstrap = None, namespace: Namespace = "governor",
                tick_s: Annotated[float, number_option(
                    min=0.05, max=60, help="Recompute and publish the desired state every this "
                                           "often.")] = 0.25,
                metrics_port: MetricsPort = 0,
                pool_gpus: Annotated[list[str] | None, typer.Option(
                    help="GPU@MODEL=N (repeatable): a pool's workers run on N GPUs each, as "
                         "its fleet starts them (`governor up` gives its --fleet's): the "
                         "autoscaler plans a pool with no live worker at that degree; the "
                         "setting autoscaler.pools.GPU@MODEL.gpus overrides it, its live "
                         "workers' heartbeats override both. Default: the degree its workers "
                         "last reported, else the least that holds the model.")] = None,
                fleet_started_ms: Annotated[int, typer.Option(
                    min=0, help="When the fleet it sizes was started, in ms since the epoch "
                                "(`governor up` gives its start): a pool size, load-shed level "
                                "or routing weights commanded before then, by an earlier "
                                "stack's controllers, are not continued from. Default: every "
                                "size commanded in the last 30 s is, and every level and "
                                "weights in the last 600 s.")] = 0):
    """Run the slow controllers: circuit breakers, load shedding, routing weights and the
    autoscaler."""
    from controllers.service import ControllersService
    from infra.stack import parse_pool_gpus
    from schemas.topics import TopicCatalog

    try:
        degrees = parse_pool_gpus(pool_gpus or [])
    except ValueError as exc:
        raise GovernorError(str(exc)) from None
    _check_fleet_started(fleet_started_ms)
    catalog = TopicCatalog(namespace)
    registry = _serve_metrics(metrics_port)
    address = _with_topics(bootstrap, catalog)
    _run_until_signalled(lambda: ControllersService(address, catalog, tick_s=tick_s,
                                                    registry=registry, pool_gpus=degrees,
                                                    fleet_started_ms=fleet_started_ms))


def _check_fleet_started(fleet_started_ms: int) -> None:
    """``--fleet-started-ms`` is a time in ms, not ahead of this clock by more than a day: one
    in microseconds (or seconds' digits typed twice) would leave every size, level and weight
    read back at start uncontinued, without a word."""
    from infra.bus import now_ms

    ahead_s = (fleet_started_ms - now_ms()) / 1000
    if ahead_s > 86_400:
        raise GovernorError(f"--fleet-started-ms {fleet_started_ms} is {ahead_s / 86_400:,.0f} "
                            "days ahead of this clock: give milliseconds since the epoch")


config_app = typer.Typer(help="Live settings in the compacted config topic.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("get")
def config_get(key: Annotated[str | None, typer.Argument(help="A dotted setting; all if absent.")] = None,
               bootstrap: Bootstrap = None, namespace: Namespace = "governor"):
    """Print the configuration in force (or one setting of it) as JSON."""
    from infra.config_cli import run_get
    from schemas.topics import TopicCatalog

    config = run_get(_with_topics(bootstrap, TopicCatalog(namespace)), namespace)
    try:
        data = config.setting(key) if key else config.model_dump(mode="json")
    except KeyError as exc:  # (with the names near it, as `config set` says)
        raise GovernorError(f"config get: {one_line(exc)}") from None
    print(json.dumps(data, indent=2))


@config_app.command("set", context_settings={"ignore_unknown_options": True})
def config_set(key: Annotated[str, typer.Argument(
                   help="A setting's dotted key (slo.ttft_slo_s, tenants.acme.priority; "
                        "`governor config get` lists them).")],
               value: Annotated[str, typer.Argument(
                   help="A JSON value or a string (a negative number too: config set KEY -5).")],
               bootstrap: Bootstrap = None, namespace: Namespace = "governor",
               validate: Annotated[bool, typer.Option(help="Check the value before sending it.")] = True):
    """Change one live setting; running components apply it within about a second. `null`
    removes an entry of a map (config set tenants.acme null)."""
    from infra.config_cli import config_change, parse_value, run_set
    from schemas.config import check_key
    from schemas.topics import TopicCatalog

    config_change(key, parse_value(value, key))  # a malformed key: an error before Kafka is reached
    if validate:
        try:
            check_key(key)  # (one no configuration has, too)
        except KeyError as exc:
            raise GovernorError(f"config set: {exc.args[0]}") from None
    run_set(_with_topics(bootstrap, TopicCatalog(namespace)), namespace, key, value, validate)
    said = f"removed {key}" if parse_value(value) is None else f"set {key} = {value}"
    console.print(said, markup=False, soft_wrap=True)


@app.command("command")
def command_(kind: Annotated[str, typer.Argument(
                 help="set_admission_limits, set_retry_budget, scale_pool, drain_worker, "
                      "sleep_worker, load_model or inject_fault.")],
             fields: Annotated[str, typer.Argument(
                 help="The command's fields as a JSON object, e.g. '{\"worker_id\": \"worker-3\"}'; "
                      "- reads it from stdin (one too long for an argument).")] = "{}",
             reason: Annotated[str, typer.Option(help="Why, for the audit trail.")] = "",
             issued_by: Annotated[str, typer.Option(help="Who, for the audit trail.")] = "operator",
             bootstrap: Bootstrap = None, namespace: Namespace = "governor"):
    """Send an operator's command to the control topic, checked as the components that obey it
    check it; prints what was sent: its JSON on stdout (its command_id, for the audit report),
    where it went on stderr."""
    from infra.bus import now_ms
    from infra.command_cli import (check_model_known, commanded_model, fields_from,
                                   operator_command, send)
    from schemas.commands import target
    from schemas.topics import TopicCatalog

    if fields == "-":
        fields = fields_from(sys.stdin)
    command = operator_command(kind, fields, reason=reason, issued_by=issued_by, now_ms=now_ms())
    catalog = TopicCatalog(namespace)
    address = _with_topics(bootstrap, catalog)
    if (model := commanded_model(command)) is not None:  # (one not built in: declared?)
        _declare_models(address, catalog, model)
    check_model_known(command)
    asyncio.run(send(address, catalog, command))
    console.print(f"sent to {catalog.control} under key {target(command)}:", markup=False,
                  soft_wrap=True)
    print(command.model_dump_json(), flush=True)  # (before 7 Dec on stderr only: a script had
    # no way to the command_id it was sent under)


# --- offline simulation: governor sim, governor bench, governor workload (infra/sim/) ------------
from infra.sim.cli import register as _register_sim  # noqa: E402

_register_sim(app)
# --- end of the offline simulation block ---------------------------------------------------------


def run() -> None:
    """Entry point that turns Governor's own errors into a clear message and exit code 2."""
    try:
        app()
    except GovernorError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
