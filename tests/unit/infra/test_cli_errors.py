"""Bad input to the `governor` command line: a one-line `error:` (exit 2) naming the option and
its limit, found before anything starts, never a traceback."""

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

import infra.cli as cli
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.errors import GovernorError


def _no_broker(*args, **kwargs):
    raise AssertionError("reached for a broker before the input was checked")


def _a_broker_with_the_default_config(monkeypatch) -> None:
    """``replay`` finds its namespace's topics, and the default configuration in force there."""
    from schemas.config import SloConfig

    monkeypatch.setattr(cli, "_with_topics", lambda bootstrap, catalog: "127.0.0.1:1")
    monkeypatch.setattr(cli, "_live_slo", lambda address, catalog: SloConfig())


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.5, prompt_tokens=10, output_tokens=2)
                          for i in range(5)], path)
    return path


def _invoke(args: list[str], **kwargs):
    return CliRunner().invoke(cli.app, args, **kwargs)


@pytest.mark.parametrize("command", [
    ["replay", "t.jsonl"], ["topics", "create"], ["router"], ["controllers"],
    ["worker", "--slot", "0"], ["streams"], ["sink"], ["config", "get"], ["up"], ["sql", "SELECT 1"],
])
def test_a_bad_namespace_is_named_before_anything_starts(monkeypatch, command) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke([*command, "--namespace", "bad name!"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--namespace" in str(result.exception) and "1-200 letters" in str(result.exception)
    result = _invoke(command, env={"GOVERNOR_NAMESPACE": "a b"})
    assert "GOVERNOR_NAMESPACE" in str(result.exception), result.output


def test_no_broker_at_the_default_port_names_the_embedded_one_running_on_another(
        monkeypatch, tmp_path) -> None:
    """`governor broker start --port 19412`, then `governor config get` without --bootstrap:
    before 7 Dec the error told to start the embedded broker, which ran already, on its port."""
    from infra.kafka import BrokerError

    async def no_broker_answers(address, timeout_s, waiting=None):
        raise BrokerError(f"no Kafka broker answers at {address} within {timeout_s}s")

    monkeypatch.setattr("infra.kafka.wait_until_answers", no_broker_answers)
    monkeypatch.setenv("GOVERNOR_HOME", str(tmp_path))
    monkeypatch.delenv("GOVERNOR_BOOTSTRAP", raising=False)
    home = tmp_path / "broker-19412"
    (home / "config").mkdir(parents=True)
    properties = home / "config" / "server.properties"
    properties.write_text("")
    # (a process with the command line of this home's broker: its JVM's last arguments)
    jvm = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "kafka.Kafka",
                            str(properties)], stdin=subprocess.PIPE)
    try:
        (home / "kafka.pid").write_text(str(jvm.pid))
        result = _invoke(["config", "get"])
        assert isinstance(result.exception, GovernorError), result.output
        assert str(result.exception) == (
            "no Kafka broker answers at 127.0.0.1:9092 within 15.0s (the embedded broker of this "
            "GOVERNOR_HOME runs at 127.0.0.1:19412: give --bootstrap 127.0.0.1:19412, or set "
            "GOVERNOR_BOOTSTRAP)")
    finally:
        jvm.communicate(timeout=10)
    result = _invoke(["config", "get"])  # (its pid file left behind: none runs)
    assert str(result.exception).endswith("(start the embedded one with `governor broker start`)")
    result = _invoke(["config", "get", "--bootstrap", "127.0.0.1:9092"])  # (the address given)
    assert str(result.exception) == "no Kafka broker answers at 127.0.0.1:9092 within 15.0s"


def test_controllers_refuse_a_fleet_start_far_ahead_of_the_clock(monkeypatch) -> None:
    """``--fleet-started-ms`` in microseconds (a time far ahead) would leave every pool size,
    level and weight read back at start uncontinued without a word; it is refused before Kafka
    is reached. A time in ms, now or a second ahead (another host's clock), is taken."""
    from infra.bus import now_ms

    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["controllers", "--fleet-started-ms", str(now_ms() * 1000)])
    assert isinstance(result.exception, GovernorError), result.output
    assert "days ahead of this clock: give milliseconds since the epoch" in str(result.exception)
    result = _invoke(["controllers", "--fleet-started-ms", str(now_ms() + 1000)])
    assert "ahead of this clock" not in str(result.exception), result.output


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", ":9092",
                                       "a:9092,b:x"])
def test_a_bad_bootstrap_is_named(monkeypatch, bootstrap) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["topics", "create", "--bootstrap", bootstrap])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--bootstrap" in str(result.exception) and "1 to 65535" in str(result.exception)


def test_a_bad_bootstrap_from_the_environment_names_the_variable(monkeypatch) -> None:
    """Before 6 Dec GOVERNOR_BOOTSTRAP=localhost was named `--bootstrap 'localhost'`, an option
    the user had not given (a bad namespace names GOVERNOR_NAMESPACE)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["topics", "create"], env={"GOVERNOR_BOOTSTRAP": "localhost"})
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith("--bootstrap (or GOVERNOR_BOOTSTRAP) 'localhost': "
                                            "expected HOST:PORT"), str(result.exception)


def test_an_unknown_log_level_is_a_usage_error_naming_the_option() -> None:
    for env, args in [({}, ["--log-level", "foo", "sim", "x"]),
                      ({"GOVERNOR_LOG_LEVEL": "foo"}, ["sim", "x"])]:
        result = _invoke(args, env=env)
        assert result.exit_code == 2 and "--log-level" in result.output, result.output


def test_components_a_stack_starts_get_its_log_level(tmp_path, monkeypatch) -> None:
    import logging
    import subprocess

    from infra.stack import PoolSpec, Stack

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kw: started.append(kw["env"]))
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    Stack("127.0.0.1:1", "ns", [PoolSpec("h100", 1)], tmp_path)._start_process("router", [])
    assert started[0]["GOVERNOR_LOG_LEVEL"] == "INFO"


@pytest.mark.parametrize("run_id", ["my run", "r" * 122, ""])
def test_replay_names_a_bad_run_id(monkeypatch, trace, run_id) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["replay", str(trace), "--run-id", run_id])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--run-id" in str(result.exception) and "121" in str(result.exception)


def test_replay_refuses_a_namespace_without_its_topics(monkeypatch, trace) -> None:
    """A misspelt namespace: no request is sent (a broker would create the topic)."""
    import infra.bus

    async def no_topics(address, catalog):
        return {}

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: "127.0.0.1:1")
    monkeypatch.setattr(infra.bus, "topic_partitions", no_topics)
    monkeypatch.setattr(cli, "_replay_until_signalled", _no_broker)
    result = _invoke(["replay", str(trace), "--namespace", "typo"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "topics of namespace 'typo' do not exist" in str(result.exception)


def test_a_topic_of_other_partitions_than_the_catalog_is_reported() -> None:
    from infra.bus import misshapen_topics
    from schemas.topics import TopicCatalog

    catalog = TopicCatalog("ns")
    partitions = {name: spec.partitions for name, spec in catalog.topics().items()}
    assert misshapen_topics(catalog, partitions) == {}
    partitions["ns.requests"] = 1
    assert misshapen_topics(catalog, partitions) == {
        "ns.requests": f"ns.requests has 1 partitions, not {catalog.spec('ns.requests').partitions}"}


def _rows_sent(count: int):
    """The first ``count`` rows, as a replay that sent them reports them."""
    from infra.replay import SentRows

    sent = SentRows()
    for row in range(count):
        sent.add(row)
    return sent


def test_replay_says_its_run_id_first_and_how_many_were_sent_when_stopped(monkeypatch, trace) -> None:
    _a_broker_with_the_default_config(monkeypatch)

    async def stopped(items, address, catalog, run_id, speedup, total, **closed_loop):
        return _rows_sent(3), True

    monkeypatch.setattr(cli, "_replay_until_signalled", stopped)
    result = _invoke(["replay", str(trace), "--run-id", "r1"])
    assert result.exit_code == 130, result.output
    assert result.output.index("replay r1") < result.output.index(
        "interrupted: sent 3 of 5 requests to governor.requests (ids r1-000000 to r1-000002)")


def test_replay_stopped_writes_its_counts_with_thousands_separators(monkeypatch, tmp_path) -> None:
    # before: "interrupted: sent 1100 of 1200 requests", where its start said "1,200 requests"
    _a_broker_with_the_default_config(monkeypatch)
    trace = tmp_path / "trace.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.01, prompt_tokens=10, output_tokens=2)
                          for i in range(1200)], trace)

    async def stopped(items, address, catalog, run_id, speedup, total, **closed_loop):
        return _rows_sent(1100), True

    monkeypatch.setattr(cli, "_replay_until_signalled", stopped)
    result = _invoke(["replay", str(trace), "--run-id", "r1"])
    assert result.exit_code == 130, result.output
    assert "sending 1,200 requests" in result.output
    assert "interrupted: sent 1,100 of 1,200 requests to governor.requests " in result.output


def test_replay_names_an_unknown_field_once_though_it_reads_the_trace_twice(
        monkeypatch, tmp_path, caplog) -> None:
    _a_broker_with_the_default_config(monkeypatch)

    async def sent_all(items, address, catalog, run_id, speedup, total, **closed_loop):
        return _rows_sent(len(list(items))), False  # the second read, as the replay makes it

    monkeypatch.setattr(cli, "_replay_until_signalled", sent_all)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {i}, "prompt_tokens": 5, "output_tokens": 2, '
                             f'"deadline": 3}}\n' for i in range(3)))
    with caplog.at_level(logging.WARNING):
        result = _invoke(["replay", str(trace), "--run-id", "r1"])
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "is not a Governor JSONL field" in r.getMessage()]
    assert len(said) == 1 and "did you mean 'deadline_s'?" in said[0]
    assert logging.getLogger("infra.traces.loaders").level == logging.NOTSET  # as it was


def test_sigterm_stops_a_replay_between_requests(monkeypatch) -> None:
    """Even during a long wait for the next arrival; what was sent is counted."""
    import infra.replay

    async def fake_replay(items, address, catalog, *, run_id, speedup, on_sent, stop):
        for row in range(3):
            on_sent(infra.replay.to_request(TraceRequest(0.0, 8, 2), f"r-{row:06d}", 1))
        os.kill(os.getpid(), signal.SIGTERM)
        await infra.replay._sleep_until(asyncio.get_running_loop().time() + 3600, stop)

    monkeypatch.setattr(infra.replay, "replay", fake_replay)
    # Were the replay's handler missing, the signal would end the test session, not fail this
    # test: a do-nothing handler takes it then, and the wait below times out instead.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        sent = asyncio.run(asyncio.wait_for(
            cli._replay_until_signalled([], "127.0.0.1:1", None, "r", 1.0, 10), 10))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (len(sent[0]), sent[0].said("r"), sent[1]) == (3, "r-000000 to r-000002", True)


def test_up_puts_the_analytics_where_sql_and_report_look(monkeypatch, tmp_path) -> None:
    import inspect

    import infra.up

    seen = {}

    async def run_up(address, namespace, fleet, log_dir, data_dir, console, metrics_port=0,
                     router_args=(), vllm_urls=()):
        seen["data_dir"], seen["router_args"], seen["vllm_urls"] = data_dir, router_args, vllm_urls

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.up, "run_up", run_up)
    monkeypatch.chdir(tmp_path)
    result = _invoke(["up", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 0, result.output
    assert seen["router_args"] == ("--no-worker-wait-s", "60")  # (the router's default)
    for command in (cli.sql, cli.report):
        assert inspect.signature(command).parameters["data_dir"].default == seen["data_dir"]
    assert seen["vllm_urls"] == ()
    # a vLLM fleet: its servers, in the fleet's order, reach the stack
    urls = ("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1,a100:1",
                      "--vllm-url", urls[0], "--vllm-url", urls[1]])
    assert result.exit_code == 0, result.output
    assert seen["vllm_urls"] == urls


@contextlib.contextmanager
def _taken_above_a_free_port():
    """A port taken (listened on) whose port below is free: an ephemeral port's neighbour may be
    another process's, and the router's port, checked first, would then be the one refused."""
    for _ in range(100):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with socket.socket() as below:
                try:
                    below.bind(("127.0.0.1", port - 1))
                except OSError:
                    continue
            yield port
            return
    raise AssertionError("no port taken above a free one in 100 tries")


def test_up_refuses_a_metrics_port_in_use_before_anything_starts(monkeypatch, tmp_path) -> None:
    import infra.up

    started = []

    async def run_up(*args, **kwargs):
        started.append(kwargs)

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.up, "run_up", run_up)
    monkeypatch.chdir(tmp_path)
    with _taken_above_a_free_port() as port:  # the controllers' port (the router's below it)
        result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1",
                          "--metrics-port", str(port - 1)])
    assert isinstance(result.exception, GovernorError) and not started
    assert f"--metrics-port (for the controllers) {port}: cannot listen on 127.0.0.1:{port}" in \
        str(result.exception)


def test_up_refuses_an_unusable_log_dir_before_anything_starts(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    (tmp_path / "file").write_text("")
    for log_dir in (tmp_path / "file", tmp_path / "file" / "below"):
        result = _invoke(["up", "--log-dir", str(log_dir), "--data-dir", str(tmp_path / "a")])
        assert isinstance(result.exception, GovernorError), result.output
        where = "" if log_dir.name == "file" else f": {log_dir.parent}"
        assert f"--log-dir {log_dir}{where} is a file, not a folder" in str(result.exception)


@pytest.mark.parametrize("args", [["bad key!", "1"], ["bad key!", "1", "--no-validate"],
                                  ["k" * 300, "1"]])
def test_config_set_names_a_malformed_key_before_reaching_kafka(monkeypatch, args) -> None:
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["config", "set", *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert "key: String should" in str(result.exception)


@pytest.mark.parametrize(("key", "says"), [
    ("a..b", "'a..b' has an empty part between its dots"),
    (".x", "'.x' has an empty part"), ("x.", "'x.' has an empty part"), ("nosuch.key", "no setting named 'nosuch.key'"),
    ("slo.bogus", "no setting named 'slo.bogus'")])
def test_config_set_names_a_key_no_configuration_has_before_reaching_kafka(monkeypatch, key,
                                                                          says) -> None:
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["config", "set", key, "1"])
    assert isinstance(result.exception, GovernorError), result.output
    assert f"config set: {says}" in str(result.exception)


@pytest.mark.parametrize("key", ["tenants.acme", "tenants.acme.burst_s", "models.m.n_layers",
                                 "autoscaler.pools.h100@m.max_replicas", "slo.ttft_slo_s"])
def test_config_set_leaves_keys_the_configuration_in_force_may_have_to_it(monkeypatch,
                                                                         key) -> None:
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["config", "set", key, "1"])
    assert "no Kafka" in str(result.exception) or "broker" in str(result.exception), \
        result.exception  # it went on to the broker


def test_config_set_names_a_value_nested_past_the_json_parser(monkeypatch) -> None:
    """A value nested deeper than the parser goes was a RecursionError's traceback."""
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["config", "set", "tenants.acme", "[" * 100_000])
    assert isinstance(result.exception, GovernorError), result.output
    assert "config set tenants.acme: VALUE is nested too deep to parse as JSON" in str(
        result.exception)


def test_broker_start_names_a_controller_port_that_is_the_port(monkeypatch) -> None:
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["broker", "start", "--port", "19500", "--controller-port", "19500"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--controller-port 19500 is --port too" in str(result.exception)


@pytest.mark.parametrize("command", [["up"], ["demo", "--duration", "2"]])
def test_up_and_demo_start_the_embedded_broker_on_broker_port(monkeypatch, command) -> None:
    """``--broker-port`` (and ``--controller-port``, default one above) choose the embedded
    broker's ports: before 6 Dec it was always 9092 and 9093."""
    asked = []

    def kafka(*ports):
        asked.append(ports)
        raise GovernorError("stopped here")

    monkeypatch.setattr(cli, "_kafka", kafka)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    _invoke([*command, "--broker-port", "19650"])
    _invoke([*command, "--broker-port", "19650", "--controller-port", "19655"])
    assert asked == [(19650, 19651), (19650, 19655)]


@pytest.mark.parametrize("command", [["up", "--log-dir", "{tmp}/logs", "--data-dir", "{tmp}/data"],
                                     ["demo", "--duration", "2"]])
@pytest.mark.parametrize("taken", ["--broker-port", "--controller-port"])
def test_up_and_demo_name_the_option_of_an_embedded_port_in_use(monkeypatch, tmp_path, command,
                                                                  taken) -> None:
    monkeypatch.setenv("GOVERNOR_HOME", str(tmp_path))
    command = [arg.format(tmp=tmp_path) for arg in command]
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    with socket.socket() as holder:  # something other than Kafka listens there
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 19652 if taken == "--broker-port" else 19653))
        holder.listen()
        result = _invoke([*command, "--broker-port", "19652"])
    assert isinstance(result.exception, GovernorError), result.output
    port = 19652 if taken == "--broker-port" else 19653
    assert f"127.0.0.1:{port} is already in use; pick another with {taken} " in str(
        result.exception)


@pytest.mark.parametrize("command", [["up"], ["demo"]])
@pytest.mark.parametrize(("args", "said"), [
    (["--broker-port", "19650", "--controller-port", "19650"],
     "--controller-port 19650 is --broker-port too"),
    (["--broker-port", "65535"], "--broker-port 65535 leaves no port above it"),
    (["--bootstrap", "127.0.0.1:19650", "--broker-port", "19650"],
     "--broker-port is the embedded broker's; --bootstrap 127.0.0.1:19650"),
    (["--bootstrap", "127.0.0.1:19650", "--controller-port", "19651"],
     "--controller-port is the embedded broker's"),
])
def test_up_and_demo_refuse_embedded_ports_that_cannot_serve(monkeypatch, command, args,
                                                             said) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke([*command, *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert said in str(result.exception)


def _bad_tenants(field: str) -> str:
    """A limits map of 1,000 tenants, each with a bad ``field``."""
    return json.dumps({f"t{n}": {field: -1} for n in range(1_000)})


def test_config_set_lists_five_field_errors_then_how_many_more(monkeypatch) -> None:
    """A map of 1,000 bad tenants was an error of 32 kB: the value echoed whole, then 2 kB of
    its 3,000 errors cut in the middle of one. Dead letters' reasons count the rest so."""
    import infra.config_cli
    from infra.config_cli import _as_the_router_applies
    from schemas.config import GovernorConfig

    async def read_config(bootstrap, catalog, refuse=True):
        return _as_the_router_applies(GovernorConfig()), 0

    monkeypatch.setattr(cli, "_with_topics", lambda bootstrap, catalog: "127.0.0.1:1")
    monkeypatch.setattr(infra.config_cli, "_read_config", read_config)
    result = _invoke(["config", "set", "tenants", _bad_tenants("rate_limit_rps")])
    assert isinstance(result.exception, GovernorError), result.output
    said = str(result.exception)
    assert said.startswith('rejected tenants={"t0": {"rate_limit_rps": -1}, "t1": '), said
    assert said.count("tenants.t") == 5 and said.endswith("; and 2995 more"), said
    assert len(said) < 500


def test_command_lists_five_field_errors_then_how_many_more(monkeypatch) -> None:
    """A ``set_admission_limits`` of 1,000 bad tenants was an error of 80 kB, every tenant's."""
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    fields = f'{{"limits": {_bad_tenants("requests_per_s")}}}'
    result = _invoke(["command", "set_admission_limits", "-"], input=fields)
    assert isinstance(result.exception, GovernorError), result.output
    said = str(result.exception)
    assert said.startswith("set_admission_limits.limits.t0.requests_per_s: Input should be "
                           "greater than 0; set_admission_limits.limits.t0.tokens_per_s: "), said
    assert said.count("set_admission_limits.limits.") == 5 and said.endswith("; and 1995 more")


def test_config_set_takes_a_negative_number(monkeypatch) -> None:
    import infra.config_cli

    sent = []
    _a_broker_with_the_default_config(monkeypatch)
    monkeypatch.setattr(infra.config_cli, "run_set", lambda *args: sent.append(args))
    result = _invoke(["config", "set", "retry_budget_ratio", "-5"])
    assert result.exit_code == 0, result.output
    assert sent[0][2:4] == ("retry_budget_ratio", "-5")


@pytest.mark.parametrize(("args", "option"), [
    (["worker", "--slot", "0", "--metrics-port", "99999"], "--metrics-port"),
    (["worker", "--slot", "0", "--engine", "fixed-rate", "--decode-tokens-per-s", "-1"],
     "--decode-tokens-per-s"),
    (["worker", "--slot", "0", "--drain-timeout-s", "-1"], "--drain-timeout-s"),
    (["router", "--no-worker-wait-s", "-1"], "--no-worker-wait-s"),
    (["router", "--no-worker-wait-s", "nan"], "--no-worker-wait-s"),
    (["demo", "--duration", "1e9"], "--duration"),
    (["demo", "--drain-timeout", "nan"], "--drain-timeout"),
    (["demo", "--drain-timeout", "-1"], "--drain-timeout"),
    (["broker", "start", "--timeout-s", "-1"], "--timeout-s"),
    (["broker", "start", "--port", "70000"], "--port"),
    (["broker", "start", "--controller-port", "0"], "--controller-port"),
    (["broker", "start", "--heap-mb", "5"], "--heap-mb"),
    (["broker", "stop", "--port", "-1"], "--port"),
    (["up", "--broker-port", "0"], "--broker-port"),
    (["demo", "--controller-port", "70000"], "--controller-port"),
    (["workload", "build", "servegen", "--out", "x.jsonl", "--start-s", "-5"], "--start-s"),
    (["sql", "--endpoint", "notaurl", "SELECT 1"], "--endpoint"),
    (["sql", "--clickhouse-url", "ftp://h:21", "SELECT 1"], "--clickhouse-url"),
    (["report", "--endpoint", "http://", "cost"], "--endpoint"),
])
def test_numbers_out_of_range_are_usage_errors_naming_the_option(monkeypatch, args, option) -> None:
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(args)
    assert result.exit_code == 2 and option in result.output, result.output


@pytest.mark.parametrize("args", [["worker", "--slot", "0", "--metrics-port", "{port}"],
                                  ["streams", "--metrics-port", "{port}"],
                                  ["router", "--metrics-port", "{port}"],
                                  ["controllers", "--metrics-port", "{port}"],
                                  ["sim-server", "--port", "{port}"]])
def test_a_port_in_use_is_named_before_anything_starts(monkeypatch, args) -> None:
    import socket

    monkeypatch.setattr(cli, "_reachable", _no_broker)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _invoke([arg.format(port=port) for arg in args])
    assert isinstance(result.exception, GovernorError), result.output
    assert f"{args[-2]} {port}: cannot listen on 127.0.0.1:{port}" in str(result.exception)
    assert "sim-server:" not in result.output


def test_demo_refuses_a_fleet_serving_none_of_the_workload_and_warns_of_some(monkeypatch,
                                                                              tmp_path) -> None:
    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: (_ for _ in ()).throw(
        GovernorError("no broker here")))
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1@llama-2-7b"])
    assert "no pool of --fleet h100:1@llama-2-7b serves llama-3-8b: none of the" in str(
        result.exception), result.output
    mixed = tmp_path / "mixed.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=0, prompt_tokens=10, output_tokens=2),
                          TraceRequest(arrival_s=1, prompt_tokens=10, output_tokens=2,
                                       model="llama-2-7b")], mixed)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1",
                      "--trace", str(mixed)])
    assert "no broker here" in str(result.exception), result.output
    assert ("warning: no pool of --fleet h100:1 serves llama-2-7b (1 of 2 requests): they will "
            "be rejected") in result.output


@pytest.mark.parametrize("given", ["restart:router@1e3", "slow:0:5@40", "stall:1:2.5@6"])
def test_demo_refuses_a_fault_after_the_replay_ends(monkeypatch, given) -> None:
    """The error quotes the option as given (before, `slow:0:5@40` was named `slow:0@40`)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--duration", "10", "--speedup", "2",
                      "--fault", "kill:0@1", "--fault", given])
    assert str(result.exception) == (f"--fault {given}: the replay ends after 5 s "
                                     "(--duration 10 / --speedup 2)"), result.output


def test_demo_replays_the_first_limit_requests_rate_scaled(monkeypatch, trace) -> None:
    """``demo --limit N --rate-scale X`` cut and scale the trace as ``sim``'s do (before, demo
    had neither option); a fault after the scaled replay's end is refused naming the scale."""
    import infra.demo

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap, *a, **k: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    ran = []

    async def run_demo(options, console, items, stop=None):
        ran.append((options, items))
        return {"unfinished": 0, "multiple_terminal_states": 0}

    monkeypatch.setattr(infra.demo, "run_demo", run_demo)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--trace", str(trace), "--limit", "3",
                      "--rate-scale", "2", "--fleet", "h100:1"])
    assert result.exit_code == 0, result.output
    options, items = ran[0]
    assert [i.arrival_s for i in items] == [0.0, 0.5, 1.0]  # of 5 rows
    assert (options.limit, options.rate_scale) == (3, 2.0)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--duration", "10", "--speedup", "2",
                      "--rate-scale", "2", "--fault", "slow:0:5@3"])
    assert str(result.exception) == ("--fault slow:0:5@3: the replay ends after 2.5 s "
                                     "(--duration 10 / --rate-scale 2 / --speedup 2)")


def test_demo_refuses_a_fault_after_the_last_of_its_limit_requests(monkeypatch, trace) -> None:
    """``--limit`` ends the replay at its last request's arrival, before ``--duration``: a fault
    due later was let through, and the demo exited 1 after the whole run, not injected."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--trace", str(trace), "--limit", "3",
                      "--speedup", "2", "--fleet", "h100:1", "--fault", "kill:0@0.75"])
    assert str(result.exception) == (
        "--fault kill:0@0.75: the replay ends after 0.5 s (the last of --limit 3 requests "
        "arrives 1 s in / --speedup 2)"), result.output
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--trace", str(trace), "--limit", "3",
                      "--speedup", "2", "--fleet", "h100:1", "--fault", "kill:0@0.5"])
    assert "replay ends" not in str(result.exception), result.output  # (on to the broker)


def test_demo_says_how_long_its_requests_arrive_over(monkeypatch, trace) -> None:
    """Before, it said `3 requests over 30s` (its --duration) of rows cut by --limit to 1 s."""
    import infra.demo

    async def no_broker(*args):
        raise GovernorError("no broker here")

    monkeypatch.setattr(infra.demo, "create_topics", no_broker)
    console = Console(record=True, width=200)
    with pytest.raises(GovernorError, match="no broker here"):
        asyncio.run(infra.demo.run_demo(infra.demo.DemoOptions(
            bootstrap="127.0.0.1:1", trace=trace, limit=3, fleet="h100:1"), console))
    assert f": 3 requests over 1s of {trace}, fleet h100:1" in console.export_text()


def test_a_command_says_that_it_waits_for_a_broker(monkeypatch, capsys) -> None:
    """Before, a command with no broker to talk to was silent for 15 s, then failed."""
    import infra.kafka.broker
    from infra.kafka import free_ports

    monkeypatch.setattr(infra.kafka.broker, "QUIET_WAIT_S", 0.2)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(GovernorError, match=f"no Kafka broker answers at {address} within 1.0s"):
        cli._reachable(address, timeout_s=1.0)
    said = capsys.readouterr().err
    assert said.count(f"waiting for a Kafka broker to answer at {address} (at most 1 s) ...") == 1


@pytest.mark.parametrize("dead", [["worker-0"], []])
def test_a_stack_that_does_not_start_is_an_error_naming_the_logs(tmp_path, dead) -> None:
    from infra.demo import _wait_for

    class Stack:
        log_dir = tmp_path

        def dead(self):
            return dead

    with pytest.raises(GovernorError) as raised:
        asyncio.run(_wait_for(lambda: False, 0, Stack(), "1 worker to report"))
    says = str(raised.value)
    assert says.startswith("the stack did not start: ") and says.endswith(f"logs in {tmp_path}")
    assert ("worker-0 exited" if dead else "timed out after 0s") in says


@pytest.mark.parametrize("command", [
    ["report", "--audit", "--grace-s", "inf"],
    ["router", "--recovery-window-s", "1e300"],
    ["router", "--orphan-after-s", "inf"],
    ["streams", "--tick-s", "100"],
    ["streams", "--allowed-lateness-s", "4000"],
    ["sink", "--max-batch-age-s", "1e309"],
    ["worker", "--slot", "0", "--max-num-seqs", str(10**30)],
    ["worker", "--slot", "0", "--engine", "fixed-rate", "--decode-tokens-per-s", "inf"],
    ["sim", "t.jsonl", "--rate-scale", "1e309"],
    ["sim", "t.jsonl", "--duration", "inf"],
])
def test_a_number_past_an_options_limit_is_a_usage_error_naming_it(monkeypatch, command) -> None:
    """Before 5 Dec these options had no upper limit: infinity or a huge number went on to an
    OverflowError or a settings ValidationError, as a traceback."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(command)
    assert result.exit_code == 2, result.output
    option = next(arg for arg in command if arg.startswith("--") and arg != "--slot"
                  and arg != "--engine" and arg != "--audit")
    assert option in result.output and "Traceback" not in result.output


def test_replay_of_a_missing_file_says_so_before_it_asks_the_broker(monkeypatch, tmp_path) -> None:
    """Before 5 Dec it reported the namespace's missing topics first."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["replay", str(tmp_path / "nonexist.jsonl")])
    assert result.exit_code != 0
    assert "nonexist.jsonl" in str(result.exception) + result.output
    assert "reached for a broker" not in str(result.exception)


def test_ctrl_c_while_replay_checks_its_trace_says_nothing_was_sent(monkeypatch, trace) -> None:
    """Before, a Ctrl-C while a long trace was checked ended ``replay`` (exit 130) without a
    word."""
    from tests.terminals import ctrl_c_after

    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    monkeypatch.setattr(cli, "rows_with_progress", ctrl_c_after(3, cli.rows_with_progress))
    result = _invoke(["replay", str(trace)])
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines()[-1] == f"interrupted while checking {trace}: nothing was sent"


def test_aiokafkas_repeated_errors_are_shown_once_every_ten_seconds_with_a_count() -> None:
    """A broker away: aiokafka logs every failed attempt (76,000 lines in one worker's log
    through a 40 s restart); our own records are never held back."""
    repeated = cli._RepeatedKafkaErrors()

    def record(name: str, at: float, level: int = logging.ERROR) -> logging.LogRecord:
        made = logging.LogRecord(name, level, __file__, 1, "Unable connect to node %s: %s",
                                 (1, "refused"), None)
        made.created = at
        return made

    shown = [repeated.filter(r) for r in (record("aiokafka.conn", t) for t in (0.0, 1.0, 5.0))]
    later = record("aiokafka.conn", 12.0)
    assert shown == [True, False, False] and repeated.filter(later)
    assert later.getMessage() == ("Unable connect to node 1: refused (2 more like it in the last "
                                  "12 s left out)")
    assert repeated.filter(record("aiokafka.conn", 12.5, logging.INFO))  # below WARNING: shown
    assert all(repeated.filter(record("infra.bus", t)) for t in (0.0, 0.1))  # ours: shown


def test_a_group_coordinator_not_found_yet_is_a_warning_that_says_it_is_retried() -> None:
    """A fresh broker: aiokafka logged it at ERROR before it found the coordinator."""
    from aiokafka.errors import CoordinatorNotAvailableError, GroupAuthorizationFailedError

    def record(err: Exception) -> logging.LogRecord:
        return logging.LogRecord("aiokafka.consumer.group_coordinator", logging.ERROR, __file__,
                                 1, "Group Coordinator Request failed: %s", (err,), None)

    retried, fatal = record(CoordinatorNotAvailableError()), record(GroupAuthorizationFailedError())
    assert cli._RetriedCoordinatorErrors().filter(retried) and retried.levelname == "WARNING"
    assert retried.levelno == logging.WARNING and retried.getMessage().endswith("(retried)")
    assert cli._RetriedCoordinatorErrors().filter(fatal) and fatal.levelno == logging.ERROR


def test_a_component_the_broker_fails_exits_1_with_one_line_not_a_traceback(capsys) -> None:
    """A worker whose responses the broker did not take within the producer's timeouts (a broker
    restarted under load) printed four chained tracebacks; it exits 1 (``up`` starts it again)."""
    from aiokafka.errors import LeaderNotAvailableError

    from infra.bus import Undelivered

    class Service:
        async def run(self, stop) -> None:
            raise Undelivered([("governor.responses", "r2-000059", LeaderNotAvailableError())])

    with pytest.raises(SystemExit) as exited:
        cli._run_until_signalled(Service)
    assert exited.value.code == 1
    out = capsys.readouterr()
    said = out.out + out.err
    assert "error:" in said and "governor.responses" in said and "Traceback" not in said


def test_topics_create_on_a_cluster_that_will_not_describe_configs(monkeypatch) -> None:
    """The topics are made all the same, and the comparison's failure said in a line; asked to
    align the configs, it is an error."""
    import infra.bus as bus

    async def created(bootstrap, catalog):
        return list(catalog.topics())

    async def partitions(bootstrap, catalog):
        return {name: spec.partitions for name, spec in catalog.topics().items()}

    async def refused(bootstrap, catalog):
        raise bus.BusError("could not describe the configs of topic governor.requests: error 29 "
                           "Topic authorization failed.")

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: "127.0.0.1:1")
    for name, fake in [("create_topics", created), ("topic_partitions", partitions),
                       ("config_drift", refused)]:
        monkeypatch.setattr(bus, name, fake)
    result = _invoke(["topics", "create"])
    assert result.exit_code == 0, result.output
    assert "governor.requests" in result.output and "created" in result.output
    assert "(the topics' configs were not compared: could not describe the configs of topic " \
           "governor.requests: error 29" in result.output
    result = _invoke(["topics", "create", "--align-configs"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith("could not read the topics' configs: ")


def test_a_worker_checks_its_vllm_url_before_it_reaches_for_a_broker(monkeypatch) -> None:
    """``governor worker --engine vllm --vllm-url 127.0.0.1:8000`` is an error at once (README),
    not after 15 s waiting for a broker (which it then named instead)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["worker", "--slot", "0", "--engine", "vllm", "--vllm-url", "127.0.0.1:8000"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--vllm-url must be the server's http:// or https:// URL" in str(result.exception)


def test_a_vllm_worker_refuses_a_speedup(monkeypatch) -> None:
    """A vLLM server runs in real time: a worker told ``--speedup 4`` would divide its measured
    latencies by 4 (before 6 Dec it did, its TTFT and inter-token latencies a quarter of the
    client's)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["worker", "--slot", "0", "--engine", "vllm", "--vllm-url",
                      "http://127.0.0.1:8000", "--speedup", "4"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith("--speedup 4: a vLLM server runs in real time")


def test_up_of_vllm_servers_takes_the_model_names_they_serve(monkeypatch, tmp_path) -> None:
    # (a vLLM server serves what it serves: before 6 Dec `up --vllm-url` refused a model the
    # simulator does not know; a pool's count is GPUs, so one server of four H100s for a 70B
    # model is h100:4/tp4, as its worker bills it)
    import infra.up

    fleets = []

    async def run_up(address, namespace, fleet, *args, **kwargs):
        fleets.append(fleet)

    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.up, "run_up", run_up)
    monkeypatch.chdir(tmp_path)
    for fleet in ("h100:1@meta-llama/Llama-3.1-8B-Instruct", "h100:4/tp4@llama-2-70b"):
        result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", fleet,
                          "--vllm-url", "http://127.0.0.1:8000"])
        assert result.exit_code == 0, result.output
    assert fleets == ["h100:1@meta-llama/Llama-3.1-8B-Instruct", "h100:4/tp4@llama-2-70b"]
    # four H100s of Llama-2-70B: two workers of two (the least degree that holds it), two
    # servers (before 6 Dec, four servers of one GPU each: two URLs were refused)
    result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:4@llama-2-70b",
                      "--vllm-url", "http://127.0.0.1:8000", "--vllm-url", "http://127.0.0.1:8001"])
    assert result.exit_code == 0, result.output
    # the GPU names are still checked
    result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h999:1",
                      "--vllm-url", "http://127.0.0.1:8000"])
    assert "unknown gpu 'h999'" in str(result.exception) and len(fleets) == 3


@pytest.mark.parametrize(("args", "says"), [
    (["drain_worker"], "drain_worker.worker_id: Field required"),
    (["set_retry_budget", '{"ratio": 2}'],
     "set_retry_budget.ratio: Input should be less than or equal to 1"),
    (["set-admission-limits", '{"limits": {"acme": {"requests_per_s": 0, "tokens_per_s": 5}}}'],
     "set_admission_limits.limits.acme.requests_per_s: Input should be greater than 0"),
    (["scale_pool", '{"pool": "h100@m", "gpu_type": "h100", "model": "m", "replicas": "3"}'],
     "scale_pool.replicas: Input should be a valid integer"),
    (["drain_worker", '{"worker_id": "w", "bogus": 1}'], "drain_worker.bogus: Extra inputs"),
    (["scale_pool", '{"pool": "h100@m", "gpu_type": "a100", "model": "m", "replicas": 3}'],
     "scale_pool.pool: 'h100@m' is not gpu_type@model, a100@m"),
    # a GPU type the supervisor has no worker for, or one in another case than pools name
    # (before 7 Dec both were sent, and the supervisor refused the first)
    (["scale_pool", '{"pool": "h999@m", "gpu_type": "h999", "model": "m", "replicas": 3}'],
     "scale_pool.gpu_type: unknown gpu 'h999'; known: a100, h100, h200"),
    (["scale_pool", '{"pool": "H100@m", "gpu_type": "H100", "model": "m", "replicas": 3}'],
     "scale_pool.gpu_type: gpu 'H100' is named 'h100'"),
    (["drain_worker", "worker-3"], "drain_worker: FIELDS is not JSON"),
    (["drain_worker", '["worker-3"]'], "drain_worker: FIELDS must be a JSON object"),
    (["drain_worker", "[" * 100_000], "drain_worker: FIELDS is not JSON (nested too deep"),
    (["drain_worker", '{"worker_id": "w", "reason": "x"}'],
     "drain_worker: reason is set by governor command"),
    # a validator's own message as it wrote it (pydantic's "Value error, " before it, until 7 Dec)
    (["sleep_worker", '{"worker_id": "w", "level": true}'],
     "sleep_worker.level: Input should be an integer, not bool"),
    (["set_admission_limits",
      '{"limits": {"b.burst_s": {"requests_per_s": 1, "tokens_per_s": 1}}}'],
     "set_admission_limits.limits.b.burst_s.[key]: tenant name 'b.burst_s' ends in "),
    (["reboot"], "no command 'reboot'; an operator's is one of set_admission_limits"),
    (["set_breaker_state", '{"worker_id": "w", "state": "open"}'],
     "set_breaker_state is the controllers' own"),
    (["drain_worker", '{"worker_id": "w"}', "--issued-by", "a b"], "issued_by: String should"),
])
def test_command_names_the_field_and_its_limit_before_reaching_kafka(monkeypatch, args,
                                                                     says) -> None:
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["command", *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert says in str(result.exception)
    assert "Value error" not in str(result.exception)


@pytest.mark.parametrize(("stdin", "says"), [
    ("x" * 1_000_001, "FIELDS on stdin is over 1,000,000 characters"),
    ('{"worker_id": "w", "level": 7}', "sleep_worker.level: Input should be 0, 1 or 2")])
def test_command_reads_fields_from_stdin_checked_as_an_argument_is(monkeypatch, stdin,
                                                                  says) -> None:
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["command", "sleep_worker", "-"], input=stdin)
    assert isinstance(result.exception, GovernorError), result.output
    assert says in str(result.exception)


def test_demo_refuses_a_start_of_a_slot_whose_worker_runs(monkeypatch) -> None:
    """Before 6 Dec `--fault start:1@5` alone ran the whole demo, then exited 1 with `faults not
    injected: start:1@5` (the worker on slot 1 was running)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["demo", "--bootstrap", "127.0.0.1:1", "--duration", "10",
                      "--fault", "start:1@5"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith("bad fault 'start:1@5': the worker on slot 1 runs "
                                            "then"), result.output


def test_sim_server_names_its_models_without_a_config_it_cannot_read() -> None:
    """sim-server reads no configuration (it takes no --bootstrap): before 6 Dec an unknown
    --model told to declare it with `governor config set models.NAME`, which it never read."""
    result = _invoke(["sim-server", "--port", "0", "--model", "llama-2-13b"])
    assert isinstance(result.exception, GovernorError), result.output
    said = str(result.exception)
    assert "config set" not in said, said
    assert ("--model 'llama-2-13b': sim-server serves a built-in model: llama-2-70b, llama-2-7b, "
            "llama-3-8b") in said, said


@pytest.mark.parametrize("engine", [[], ["--engine", "fixed-rate"]])
def test_a_worker_refuses_a_vllm_url_for_another_engine(monkeypatch, engine) -> None:
    """Before 6 Dec `governor worker --slot 0 --vllm-url URL` without `--engine vllm` ran the
    simulated engine, saying nothing of the server it was given."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["worker", "--slot", "0", *engine, "--vllm-url", "http://127.0.0.1:8000"])
    assert isinstance(result.exception, GovernorError), result.output
    named = engine[1] if engine else "sim"
    assert str(result.exception) == (
        f"--vllm-url is for --engine vllm; this worker runs --engine {named}, which would not use "
        "it (add --engine vllm)")


def test_config_get_of_a_misspelt_key_names_the_settings_near_it(monkeypatch) -> None:
    """As `config set` does; before 6 Dec `config get slo.ttft` said only `no setting named
    'slo.ttft'`, the names near it dropped."""
    import infra.config_cli
    from schemas.config import GovernorConfig

    _a_broker_with_the_default_config(monkeypatch)
    monkeypatch.setattr(infra.config_cli, "run_get", lambda address, namespace: GovernorConfig())
    for key, hint in [("slo.ttft", "(slo has slo.ttft_slo_s, slo.deadline_s)"),
                      ("worker_heartbeat_timout_s", "(did you mean worker_heartbeat_timeout_s?)"),
                      ("tenants.acme", "(`governor config get` lists them)")]:
        result = _invoke(["config", "get", key])
        assert isinstance(result.exception, GovernorError), result.output
        assert str(result.exception) == f"config get: no setting named {key!r} {hint}"
    assert _invoke(["config", "get", "slo.ttft_slo_s"]).output == "2.0\n"


def test_a_sink_given_a_file_for_its_data_dir_says_so_before_it_starts(monkeypatch,
                                                                       tmp_path) -> None:
    """Before 6 Dec `governor sink --data-dir FILE` reached the broker, then stopped on a
    traceback (`FileExistsError`), exit 1; `up` said `--data-dir FILE: ...` at once."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    taken = tmp_path / "taken"
    taken.write_text("")
    result = _invoke(["sink", "--data-dir", str(taken)])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == f"--data-dir {taken} is a file, not a folder"


@pytest.mark.parametrize("command", [["broker", "install"], ["broker", "start", "--port", "1"],
                                     ["broker", "stop", "--port", "1"]])
def test_a_governor_home_that_is_a_file_is_named(tmp_path, command) -> None:
    """Before 6 Dec GOVERNOR_HOME=FILE stopped `broker start` and `install` on a traceback
    (`NotADirectoryError`, exit 1)."""
    home = tmp_path / "home"
    home.write_text("")
    result = _invoke(command, env={"GOVERNOR_HOME": str(home)})
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == f"GOVERNOR_HOME {home} is a file, not a folder"


@pytest.mark.parametrize("command", [
    ["demo", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1,h100:1@LLAMA-3-8B"],
    ["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1@Llama-3-8b"],
    ["worker", "--slot", "0", "--model", "Llama-3-8b"],
    ["sim-server", "--port", "0", "--model", "Llama-3-8b"],
])
def test_a_model_spelt_in_other_case_is_refused(monkeypatch, command) -> None:
    """Model names are matched exactly (a request's to a worker's), but the simulator's were
    looked up in any case: before 6 Dec `--fleet h100:1@Llama-3-8b` ran a pool that served no
    request of llama-3-8b, and `h100:1,h100:1@LLAMA-3-8B` made two pools of one model."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(command)
    assert isinstance(result.exception, GovernorError), result.output
    assert "is named 'llama-3-8b': a pool serves the requests that name its model exactly" in \
        str(result.exception), str(result.exception)


def test_up_names_each_component_whose_metrics_port_it_checks(monkeypatch) -> None:
    """Before 6 Dec a worker's port was named `--metrics-port (for the worker-0)`."""
    checked = []

    def taken(option, host, port):
        checked.append(option)
        if len(checked) == 5:
            raise GovernorError(f"{option} {port}: taken")

    monkeypatch.setattr(cli, "_port_free", taken)
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    result = _invoke(["up", "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1",
                      "--metrics-port", "19000"])
    assert str(result.exception) == "--metrics-port (for worker-0) 19010: taken", result.output
    assert checked == [f"--metrics-port (for the {name})" for name in
                       ("router", "controllers", "streams", "sink")] + [
                           "--metrics-port (for worker-0)"]


def test_an_unknown_gpu_of_a_fleet_names_the_entry(monkeypatch) -> None:
    """As a bad count does (`bad fleet entry 'h100:0': ...`); before 6 Dec `--fleet x:8` said
    only `unknown gpu 'x'`."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    for command in (["up"], ["demo"]):
        result = _invoke([*command, "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1,x:8"])
        assert str(result.exception) == ("bad fleet entry 'x:8': unknown gpu 'x'; known: a100, "
                                         "h100, h200"), result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--decode-tokens-per-s", "50"], "--decode-tokens-per-s does not apply to --engine sim, "
                                      "which would not use it (it is for --engine fixed-rate)"),
    (["--engine", "fixed-rate", "--max-num-batched-tokens", "512"],
     "--max-num-batched-tokens does not apply to --engine fixed-rate, which would not use it (it "
     "is for --engine sim)"),
    (["--engine", "vllm", "--vllm-url", "http://127.0.0.1:8000", "--max-num-seqs", "64"],
     "--max-num-seqs does not apply to --engine vllm, which would not use it (it is for --engine "
     "sim or fixed-rate)"),
])
def test_a_worker_refuses_an_option_its_engine_does_not_use(monkeypatch, args, says) -> None:
    """Before 6 Dec such an option was taken and silently not used (a vLLM server's batch size
    is `vllm serve`'s own)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["worker", "--slot", "0", *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == says


def _live_run_stubbed(monkeypatch, command: str, path) -> tuple[list[str], list]:
    """``replay PATH`` or ``demo --trace PATH`` with neither broker nor stack: its arguments,
    and the list that the rows it sends are put in."""
    import infra.demo

    sent = []

    async def replayed(items, *args, **kwargs):
        sent.extend(items)
        return _rows_sent(len(sent)), False

    async def demo(options, console, items, stop=None):
        sent.extend(items)
        return {"requests_sent": len(sent), "unfinished": 0, "multiple_terminal_states": 0}

    _a_broker_with_the_default_config(monkeypatch)
    monkeypatch.setattr(cli, "_replay_until_signalled", replayed)
    monkeypatch.setattr(cli, "_reachable", lambda bootstrap: bootstrap)
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", lambda: None)
    monkeypatch.setattr(infra.demo, "run_demo", demo)
    return (["replay", str(path), "--run-id", "r1"] if command == "replay" else
            ["demo", "--trace", str(path), "--bootstrap", "127.0.0.1:1", "--fleet", "h100:1"]), sent


@pytest.mark.parametrize("mode", [None, "config", "rule", "none"])
@pytest.mark.parametrize("command", ["replay", "demo"])
def test_the_router_sees_the_targets_sim_gives_it(monkeypatch, tmp_path, command, mode) -> None:
    """``replay``/``demo --deadlines MODE`` send each row with the TTFT target and deadline
    ``sim --deadlines MODE`` gives the router for it, so the router filters and admits a row
    live as it does simulated (before 6 Dec a row that stated none was sent with none under
    ``config``: no deadline filter live, the rule's TTFT target and ``slo.deadline_s`` in sim).
    ``none``: each row as it states it, in both. ``None``: no ``--deadlines`` given to any of
    the three, which agree (before 6 Dec ``sim`` defaulted to ``rule``, ``replay`` and ``demo``
    to ``config``: the same trace got other deadlines live)."""
    from controllers.router.core import RouterCore
    from infra.replay import to_request
    from infra.sim.options import SimOptions
    from infra.sim.requests import inference_request, request_specs
    from schemas.config import GovernorConfig

    rows = [TraceRequest(arrival_s=0.0, prompt_tokens=40_000, output_tokens=50),
            TraceRequest(arrival_s=0.5, prompt_tokens=800_000, output_tokens=5),
            TraceRequest(arrival_s=1.0, prompt_tokens=500, output_tokens=20, ttft_slo_s=0.5),
            TraceRequest(arrival_s=1.5, prompt_tokens=500, output_tokens=20, deadline_s=9.0)]
    path = tmp_path / "rows.jsonl"
    write_governor_jsonl(rows, path)
    args, sent = _live_run_stubbed(monkeypatch, command, path)
    result = _invoke([*args, *(["--deadlines", mode] if mode else [])])
    assert result.exit_code == 0, result.output
    assert len(sent) == len(rows)

    core, created = RouterCore(GovernorConfig()), 1_700_000_000_000
    options = SimOptions(deadlines=mode) if mode else SimOptions()  # (sim's own default)
    rule = options.slo_rule
    specs = request_specs(rows, 1.0, rule)

    def seen(request):  # what the router's admission and placement read of its targets
        context = core._context(request, created)
        return request.ttft_slo_s, request.deadline_ms, context.budget_s, context.has_deadline

    live = [seen(to_request(item, f"r1-{i}", created)) for i, item in enumerate(sent)]
    simulated = [seen(inference_request(i, row, spec, created, stated_only=rule.stated_only))
                 for i, (row, spec) in enumerate(zip(rows, specs))]
    assert live == simulated
    stated = [row.deadline_s is not None for row in rows]  # only the last states one
    assert [has_deadline for *_, has_deadline in live] == \
        (stated if mode == "none" else [True] * len(rows))


@pytest.mark.parametrize("command", ["sim", "replay"])
def test_sim_and_replay_say_how_many_tasks_and_steps_limit_cut(monkeypatch, tmp_path,
                                                               command) -> None:
    """``--limit 3`` keeps task b's first step of three: ``sim`` and ``replay`` warn alike (as
    ``demo``: ``tests/integration/test_demo_cut_tasks.py``); before 6 Dec ``replay`` said
    nothing, and ``sim`` did not say how many steps."""
    path = tmp_path / "tasks.jsonl"
    write_governor_jsonl([
        TraceRequest(0.0, 10, 2, task_id="a", step=1, steps_total=2),
        TraceRequest(0.1, 10, 2, task_id="a", step=2, steps_total=2),
        TraceRequest(0.2, 10, 2, task_id="b", step=1, steps_total=3),
        TraceRequest(0.3, 10, 2, task_id="b", step=2, steps_total=3)], path)
    args = (["sim", str(path), "--fleet", "h100:1", "--no-progress"] if command == "sim" else
            _live_run_stubbed(monkeypatch, command, path)[0])
    result = _invoke([*args, "--limit", "3"])
    assert result.exit_code == 0, result.output
    cut = "--duration, --limit" if command == "sim" else "--limit"
    assert (f"warning: 1 task has steps outside the run's rows (2 steps, cut off by {cut} or the "
            "file): it counts as not succeeded") in " ".join(result.output.split())


@pytest.mark.parametrize("command", ["replay", "demo"])
def test_replay_and_demo_show_their_progress_reading_a_long_trace(monkeypatch, tmp_path,
                                                                  command) -> None:
    """A trace of millions of rows takes a while to read and check before anything is sent:
    ``demo`` and ``replay`` count the rows as they go, as ``sim`` does (before 6 Dec ``demo``
    said nothing until its stack started, ``replay`` nothing after "checking ...")."""
    import infra.sim.cli

    path = tmp_path / "long.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=i * 0.001, prompt_tokens=10, output_tokens=2)
                          for i in range(8_200)], path)
    args, _ = _live_run_stubbed(monkeypatch, command, path)
    monkeypatch.setattr(infra.sim.cli, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(infra.sim.cli, "PROGRESS_EVERY_S", 0.0)
    result = _invoke(args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    if command == "replay":
        assert lines[:3] == [f"replay r1: checking {path}", "replay 4,096 requests checked",
                             "replay 8,192 requests checked"]
    else:
        assert lines[:5] == [f"demo: reading {path}", "demo 4,096 requests read",
                             "demo 8,192 requests read", "demo 4,096 requests checked of 8,200",
                             "demo 8,192 requests checked of 8,200"]


@pytest.mark.parametrize(("command", "cut"), [
    (["sim", "--fleet", "h100:1"], "--duration or --limit"), (["replay"], "--limit"),
    (["demo", "--bootstrap", "127.0.0.1:1", "--trace"], "--duration or --limit")])
def test_a_run_slowed_past_fourteen_days_is_refused_alike(monkeypatch, tmp_path, command,
                                                          cut) -> None:
    """``--rate-scale 1e-6`` makes 20 s of trace 231 days: ``sim`` refused it, while ``replay``
    and ``demo`` (before 6 Dec) went on to send its second request 231 days later. All three
    refuse it now, with the same words, before a broker is asked, each naming the options it
    takes that cut the run (``sim``'s named only ``--duration``: its ``--limit`` cuts it too)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    path = tmp_path / "slow.jsonl"
    write_governor_jsonl([TraceRequest(arrival_s=t, prompt_tokens=10, output_tokens=2)
                          for t in (0.0, 20.0)], path)
    name, *options = command
    args = [name, *options, str(path)] if name == "demo" else [name, str(path), *options]
    result = _invoke([*args, "--rate-scale", "1e-6"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith(
        f"{path}: its last request arrives 20,000,000 s into the run (arrival_s 20 / "
        f"--rate-scale 1e-06), past the 1,209,600 s (14 days) a run covers; cut it with {cut}, ")


#: Two requests 8 days apart, as a Mooncake and an Azure trace write them.
_EIGHT_DAYS_APART = {
    "mooncake.jsonl": "".join(f'{{"timestamp": {ms}, "input_length": 10, "output_length": 2}}\n'
                              for ms in (0, 8 * 86_400_000)),
    "azure.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.0000000,10,2\n2023-11-24 18:15:46.0000000,10,2\n",
}


@pytest.mark.parametrize("command", [["sim", "--fleet", "h100:1"], ["replay"], [
    "demo", "--bootstrap", "127.0.0.1:1", "--duration", "1209600", "--trace"]])
@pytest.mark.parametrize(("file", "field", "check"), [
    ("mooncake.jsonl", "timestamp", "check that timestamp is milliseconds"),
    ("azure.csv", "TIMESTAMP", "check that TIMESTAMP is the date and time of each arrival")])
def test_a_run_slowed_past_fourteen_days_names_the_traces_own_field(
        monkeypatch, tmp_path, command, file, field, check) -> None:
    """Before 7 Dec the error named ``arrival_s`` (Governor JSONL's) whatever the format."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    path = tmp_path / file
    path.write_text(_EIGHT_DAYS_APART[file])
    name, *options = command
    args = [name, *options, str(path)] if name == "demo" else [name, str(path), *options]
    error = str(_invoke([*args, "--rate-scale", "0.5"]).exception)
    assert error.startswith(f"{path}: its last request arrives 1,382,400 s into the run (its "
                            f"{field} 691,200 s after the first's / --rate-scale 0.5), past the "
                            "1,209,600 s (14 days)"), error
    assert error.endswith(check) and "arrival_s" not in error


@pytest.mark.parametrize(("args", "says"), [
    (["--engine", "vlm"], "--engine 'vlm': choose one of sim, fixed-rate, vllm"),
    (["--gpu", "h10"], "--gpu: unknown gpu 'h10'; known: a100, h100, h200"),
    (["--gpu", "h10", "--engine", "fixed-rate"], "--gpu: unknown gpu 'h10'"),
    (["--gpu", "h10", "--engine", "vllm", "--vllm-url", "http://127.0.0.1:8000"],
     "--gpu: unknown gpu 'h10'"),
    (["--tp", "3"], "--tp 3 does not divide llama-3-8b's 32 attention heads"),
])
def test_a_worker_names_a_bad_engine_gpu_or_tp_before_it_reaches_for_a_broker(monkeypatch, args,
                                                                             says) -> None:
    """Before 6 Dec `governor worker --engine vlm` (or `--gpu h10`, or `--tp 3`) first waited
    15 s for a broker and named that instead, or, with one, created nothing but said `unknown
    engine 'vlm'` without the option; a fixed-rate or vLLM worker took an unknown GPU, which
    `up` and `demo` refuse in a fleet."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["worker", "--slot", "0", *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception).startswith(says), str(result.exception)


@pytest.mark.parametrize("command", [["worker", "--slot", "0"], ["sim-server", "--port", "0"]])
def test_a_model_its_tp_gpus_do_not_hold_is_an_error_naming_tp_and_the_least_that_do(
        monkeypatch, command) -> None:
    """Before 7 Dec `governor worker --model llama-2-70b` (its default `--tp 1`) said
    `llama-2-70b does not fit on 1 x h100`, naming neither the option nor its fix, and a worker
    said so only once it had reached a broker (without one: 15 s of waiting, then the broker
    named instead); `sim-server` said the same."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke([*command, "--model", "llama-2-70b"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--tp 1: llama-2-70b does not fit on 1 h100 GPU (it needs "
                                     "tp 2 at least)")
    result = _invoke([*command, "--model", "llama-2-70b", "--gpu", "A100"])
    assert str(result.exception) == ("--tp 1: llama-2-70b does not fit on 1 a100 GPU (it needs "
                                     "tp 2 at least)"), result.output


def test_sim_server_names_its_max_model_len_past_the_model_context() -> None:
    """Before 7 Dec `governor sim-server --max-model-len 999999` said `max_model_len 999999 is
    greater than the model's maximum context length, 131072`, naming no option."""
    result = _invoke(["sim-server", "--port", "0", "--max-model-len", "999999"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--max-model-len 999999 is past llama-3-8b's context, "
                                     "131,072 tokens: it may only shorten it, as vLLM's flag")


def test_sim_server_names_its_gpu_option() -> None:
    result = _invoke(["sim-server", "--gpu", "a10", "--port", "0"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == "--gpu: unknown gpu 'a10'; known: a100, h100, h200"


def test_sink_refuses_a_sql_port_with_no_sql(monkeypatch, tmp_path) -> None:
    """Before 6 Dec `governor sink --sql-port 9000 --no-sql` ran with no endpoint, the port
    given dropped without a word (README: `[--sql-port 8124 | --no-sql]`, one or the other)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["sink", "--sql-port", "9000", "--no-sql", "--data-dir", str(tmp_path)])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--sql-port does not apply with --no-sql, which serves no "
                                     "SQL endpoint: give one or the other")


def test_replay_refuses_a_step_wait_without_closed_loop(monkeypatch, trace) -> None:
    """Before 6 Dec `governor replay T --step-wait-s 10` sent open loop, the wait given for
    nothing (README: `[--closed-loop [--step-wait-s 900]]`)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_with_topics", _no_broker)
    result = _invoke(["replay", str(trace), "--step-wait-s", "10"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--step-wait-s applies to --closed-loop only: an open-loop "
                                     "replay waits for no step (add --closed-loop)")
    result = _invoke(["replay", str(trace), "--step-wait-s", "10", "--open-loop"])
    assert isinstance(result.exception, GovernorError), result.output


@pytest.mark.parametrize("fault", ["restart:sink@3", "pause:sink:2@2"])
def test_demo_refuses_a_fault_of_the_sink_it_does_not_run(monkeypatch, fault) -> None:
    """Before 6 Dec `governor demo --no-analytics --fault restart:sink@3` ran the whole demo,
    logged `fault restart:sink@3 was not injected: 'sink'` and exited 1."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["demo", "--no-analytics", "--fault", fault])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == (f"--fault {fault}: --no-analytics runs no sink to "
                                     f"{fault.split(':')[0]}")


def test_demo_refuses_a_seed_with_a_trace(monkeypatch, trace) -> None:
    """Before 6 Dec `governor demo --trace T --seed 3` replayed T as it is, the seed (of the
    built-in workload) dropped without a word."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = _invoke(["demo", "--trace", str(trace), "--seed", "3"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--seed draws the built-in workload; a --trace is replayed "
                                     "as it is (leave out one of them)")


@pytest.mark.parametrize(("args", "says"), [
    (["--grace-s", "5", "cost"], "--grace-s applies to --audit only (add --audit)"),
    (["--json", "--format", "csv"], "--json writes JSON: give it or --format csv, not both"),
    (["--limit", "5", "cost", "slo"],
     "--limit applies to the actions report only (name it, or leave --limit out)"),
    (["--audit", "--limit", "5"],
     "--limit applies to the actions report only (name it, or leave --limit out)"),
    (["--bucket", "day", "cost"],
     "--bucket applies to the slo report only (name it, or leave --bucket out)"),
    (["--audit", "--days", "1"], "--days applies to the reports; --audit checks every request "
                                 "the store holds (name a report, or leave --days out)"),
    (["--audit", "--format", "csv"],
     "--audit alone writes JSON: leave --format csv out, or name a report"),
])
def test_report_refuses_an_option_it_would_drop(monkeypatch, args, says) -> None:
    """Before 6 Dec `governor report --grace-s 5 cost` ran the cost report, the grace given for
    nothing, and `--json --format csv` wrote JSON; `--limit` without the actions report and
    `--bucket` without the slo report were dropped without a word, as `--days` and `--format
    csv` given the audit alone were (it audited the whole store, and wrote JSON)."""
    import analytics.query

    monkeypatch.setattr(analytics.query, "open_source", _no_broker)
    result = _invoke(["report", *args])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == says


@pytest.mark.parametrize("args", [["--limit", "5", "actions", "cost"], ["--limit", "5"],
                                  ["--bucket", "day", "slo"], ["--bucket", "day"],
                                  ["--audit", "--days", "1", "cost"],
                                  ["--audit", "--format", "json"]])
def test_report_takes_the_options_with_a_report_that_uses_them(monkeypatch, args) -> None:
    import analytics.query

    monkeypatch.setattr(analytics.query, "open_source", _no_broker)
    result = _invoke(["report", *args, "--show-sql"])
    assert result.exit_code == 0 and "SELECT" in result.output, result.output


@pytest.mark.parametrize("below", ["", "schemas"])
def test_schemas_export_to_a_file_says_it_is_a_file(tmp_path, below) -> None:
    """Before 6 Dec `governor schemas export FILE` said only "File exists"."""
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    given = a_file / below if below else a_file
    result = _invoke(["schemas", "export", str(given)])
    assert isinstance(result.exception, GovernorError), result.output
    where = f": {a_file}" if below else ""
    assert str(result.exception) == f"DIR {given}{where} is a file, not a folder"


@pytest.mark.parametrize("command", [["up", "--log-dir", "{tmp}/logs", "--data-dir", "{tmp}/data"],
                                     ["demo", "--duration", "2"], ["sim", "{tmp}/trace.jsonl"]])
def test_a_stray_comma_in_the_fleet_is_refused_naming_its_item(monkeypatch, tmp_path,
                                                               command) -> None:
    """Before, ``--fleet h100:2,`` ran as ``h100:2``, echoed as given."""
    monkeypatch.setenv("GOVERNOR_HOME", str(tmp_path))
    write_governor_jsonl([TraceRequest(0.0, 10, 2)], tmp_path / "trace.jsonl")
    result = _invoke([*(arg.format(tmp=tmp_path) for arg in command), "--fleet", "h100:2,"])
    assert isinstance(result.exception, GovernorError), result.output
    assert "--fleet 'h100:2,': item 2 of 2 is empty" in str(result.exception)


#: A command naming a model, the JSON fields ``governor command`` takes for it.
COMMANDED_MODEL = {
    "load_model": '{{"worker_id": "w", "model": "{model}"}}',
    "scale_pool": '{{"pool": "h100@{model}", "gpu_type": "h100", "model": "{model}", '
                  '"replicas": 1}}',
}


@pytest.fixture
def commands_sent(monkeypatch):
    """The commands ``governor command`` sends (none leaves), the configuration in force
    declaring the model ``House-8B`` (read from the broker, as a worker of a model not built in
    reads it)."""
    import infra.command_cli
    import infra.config_cli
    from schemas.config import GovernorConfig, ModelShape
    from workers.sim import models

    shape = ModelShape(params_b=8.0, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                       hidden_size=4096, intermediate_size=14336, vocab_size=128256)
    sent = []

    async def send(bootstrap, catalog, command) -> None:
        sent.append(command)

    async def current_config(bootstrap, catalog, refuse=True) -> GovernorConfig:
        return GovernorConfig(models={"House-8B": shape})

    monkeypatch.setattr(cli, "_with_topics", lambda bootstrap, catalog: "127.0.0.1:1")
    monkeypatch.setattr(infra.command_cli, "send", send)
    monkeypatch.setattr(infra.config_cli, "current_config", current_config)
    yield sent
    models.configure_models({})


def _command(kind: str, model: str):
    return _invoke(["command", kind, COMMANDED_MODEL[kind].format(model=model)])


@pytest.mark.parametrize("kind", COMMANDED_MODEL)
def test_a_commanded_model_the_catalog_does_not_know_is_refused(commands_sent, kind) -> None:
    """Known is built in or declared by the setting ``models``. Before 7 Dec ``load_model`` was
    sent whatever the model (the worker only logged that it could not load it), and so was
    ``scale_pool`` until later that day (the supervisor refused it)."""
    result = _command(kind, "no-such-model")
    assert isinstance(result.exception, GovernorError), result.output
    said = str(result.exception)
    assert said.startswith(f"{kind}.model: unknown model 'no-such-model'; known: "), said
    assert "llama-3-8b" in said and "house-8b" in said and not commands_sent
    for model in ("llama-2-7b", "House-8B"):
        assert _command(kind, model).exit_code == 0
    assert [command.model for command in commands_sent] == ["llama-2-7b", "House-8B"]


@pytest.mark.parametrize("kind", COMMANDED_MODEL)
@pytest.mark.parametrize(("model", "spelt"), [("Llama-3-8B", "llama-3-8b"),
                                               ("house-8b", "House-8B")])
def test_a_commanded_model_in_another_letter_case_is_refused(commands_sent, kind, model,
                                                             spelt) -> None:
    """Models are looked up in any case, but a pool serves the requests that name its model
    exactly: ``load_model`` of ``Llama-3-8B`` passed, and the worker then reported a model no
    request names. Before 7 Dec ``scale_pool`` took any case, and both took a declared model's
    name in another case."""
    result = _command(kind, model)
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == (f"{kind}.model: model {model!r} is named {spelt!r}: a "
                                     "pool serves the requests that name its model exactly")
    assert not commands_sent


def test_a_worker_of_a_declared_model_in_another_letter_case_is_refused(commands_sent,
                                                                        monkeypatch) -> None:
    """``governor worker --model house-8b`` where the configuration declares ``House-8B``: its
    spelling was checked before the declared models were read (a built-in one's alone), so the
    worker served ``house-8b``, a pool no request names. The declared name itself is served."""
    served = []
    monkeypatch.setattr(cli, "_run_until_signalled", served.append)
    result = _invoke(["worker", "--slot", "0", "--model", "house-8b"])
    assert isinstance(result.exception, GovernorError), result.output
    assert str(result.exception) == ("--model: model 'house-8b' is named 'House-8B': a pool "
                                     "serves the requests that name its model exactly")
    assert not served
    assert _invoke(["worker", "--slot", "0", "--model", "House-8B"]).exit_code == 0
    assert len(served) == 1
