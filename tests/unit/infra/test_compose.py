"""Static checks of docker-compose.yml (and the Dockerfile it builds) against the code it deploys.

No Docker needed: the compose file is parsed with PyYAML, every Governor service's command is
resolved by the real ``governor`` click/typer parser (without running it) with the service's
environment in place, and topic names, worker slots and the Kafka listeners are checked against the
topic catalog and each other.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from infra import cli
from schemas.topics import TopicCatalog

try:  # recent typer (0.29 here) parses with its own copy of click, not the click package
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # pragma: no cover - older typer parses with click itself
    from click import ClickException, UsageError

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
GOVERNOR_ENV_PREFIX = "GOVERNOR_"
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


# --- helpers -----------------------------------------------------------------------------------

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
                       r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str) -> str:
    """Compose's variable substitution, as on a host where none of the variables is set.

    The file must work without a .env file: ``${VAR:-default}`` gives the default, ``$$`` a dollar;
    a variable without a default (or a required ``${VAR:?msg}``) is an error here.
    """
    parts = value.split("$$")

    def substitute(match: re.Match) -> str:
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op"), match.group("arg")
        if op in (":-", "-"):
            return arg
        if op in (":+", "+"):
            return ""
        raise AssertionError(f"${{{name}}} has no default; the compose file must work without it")

    return "$".join(_VARIABLE.sub(substitute, part) for part in parts)


def interpolate_all(node):
    if isinstance(node, str):
        return interpolate(node)
    if isinstance(node, dict):
        return {key: interpolate_all(value) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_all(item) for item in node]
    return node


def environment(service: dict) -> dict[str, str]:
    """A service's ``environment`` (mapping or list form) as strings."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def command_args(service: dict) -> list[str]:
    command = service.get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _is_group(command) -> bool:
    return hasattr(command, "resolve_command") and hasattr(command, "commands")


def _remaining_args(ctx) -> list[str]:
    # A group's parse_args keeps the subcommand name in ``_protected_args`` (click >= 8.2 and
    # typer's copy; older click names it ``protected_args``) and its arguments in ``args``.
    protected = ctx.__dict__.get("_protected_args")
    if protected is None:  # pragma: no cover - click < 8.2
        protected = ctx.protected_args
    return [*protected, *ctx.args]


def resolve_cli(args: list[str]) -> list:
    """Parse ``governor ARGS`` with the real parser down to the leaf command, running nothing.

    Returns the chain of contexts (root group, subgroups, leaf command); ``chain[-1].params`` holds
    the leaf's parsed parameters. Raises ``UsageError`` (NoSuchOption, BadParameter,
    MissingParameter, "No such command", ...) exactly where ``governor ARGS`` would refuse to start.
    Options that name an ``envvar`` are resolved from ``os.environ``, as in the real process.
    """
    command = typer.main.get_command(cli.app)
    ctx = command.make_context("governor", list(args), resilient_parsing=False)
    chain = [ctx]
    while _is_group(ctx.command):
        rest = _remaining_args(ctx)
        if not rest:
            raise UsageError("Missing command.", ctx)
        name, sub, sub_args = ctx.command.resolve_command(ctx, rest)
        if sub is None:  # pragma: no cover - resolve_command fails first
            raise UsageError(f"No such command {rest[0]!r}.", ctx)
        ctx = sub.make_context(name, list(sub_args), parent=ctx, resilient_parsing=False)
        chain.append(ctx)
    if ctx.args:
        raise UsageError(f"Got unexpected extra argument(s) {ctx.args}", ctx)
    return chain


def cli_envvars() -> set[str]:
    """Every environment variable any ``governor`` command or group reads."""
    found: set[str] = set()

    def walk(command) -> None:
        for param in command.params:
            envvar = param.envvar
            if envvar:
                found.update([envvar] if isinstance(envvar, str) else envvar)
        if _is_group(command):
            for sub in command.commands.values():
                walk(sub)

    walk(typer.main.get_command(cli.app))
    return found


def topic_references(node, namespace: str) -> set[str]:
    """Every ``<namespace>.<name>`` token in the string values of a parsed YAML document."""
    pattern = re.compile(rf"(?<![\w.-]){re.escape(namespace)}\.[A-Za-z0-9_-]+")
    found: set[str] = set()
    if isinstance(node, str):
        found.update(pattern.findall(node))
    elif isinstance(node, dict):
        for key, value in node.items():
            found |= topic_references(key, namespace) | topic_references(value, namespace)
    elif isinstance(node, list):
        for item in node:
            found |= topic_references(item, namespace)
    return found


def parse_listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(raw, dict), "docker-compose.yml must be a mapping"
    return interpolate_all(raw)


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    services = compose.get("services")
    assert isinstance(services, dict) and services, "docker-compose.yml needs a `services` mapping"
    return services


@pytest.fixture(scope="module")
def governor_image(compose) -> str:
    shared = compose.get("x-governor")
    assert isinstance(shared, dict) and shared.get("image"), "x-governor must give the Governor image"
    return shared["image"]


@pytest.fixture(scope="module")
def governor_services(services, governor_image) -> dict[str, dict]:
    found = {name: svc for name, svc in services.items() if svc.get("image") == governor_image}
    assert found, "no service runs the Governor image"
    return found


def resolve_service(service: dict, monkeypatch):
    """The leaf context of a Governor service's command, parsed with that service's environment only."""
    with monkeypatch.context() as patch:
        for key in list(os.environ):
            if key.startswith(GOVERNOR_ENV_PREFIX):
                patch.delenv(key)
        for key, value in environment(service).items():
            patch.setenv(key, value)
        return resolve_cli(command_args(service))[-1]


@pytest.fixture
def resolved(governor_services, monkeypatch) -> dict:
    """Each Governor service's parsed command (errors here: see test_governor_commands_are_accepted)."""
    out = {}
    for name, service in governor_services.items():
        try:
            out[name] = resolve_service(service, monkeypatch)
        except ClickException as exc:
            pytest.fail(f"service {name!r}: `governor {shlex.join(command_args(service))}` "
                        f"is refused by the CLI: {exc.format_message()}")
    return out


@pytest.fixture(scope="module")
def kafka_env(services) -> dict[str, str]:
    return environment(services["kafka"])


# --- the checker itself must have teeth ---------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["worker", "--slot", "0", "--no-such-option", "1"],
    ["worker", "--gpu", "h100"],                       # --slot is required
    ["worker", "--slot", "-1"],                        # below min=0
    ["router", "surplus-argument"],
    ["no-such-command"],
    ["topics"],                                        # a group without its subcommand
    ["topics", "delete-everything"],
    [],
])
def test_resolver_rejects_what_the_cli_rejects(args):
    with pytest.raises(UsageError):
        resolve_cli(args)


def test_resolver_accepts_real_commands_and_reads_env(monkeypatch):
    monkeypatch.setenv("GOVERNOR_BOOTSTRAP", "somewhere:9092")
    monkeypatch.delenv("GOVERNOR_NAMESPACE", raising=False)
    chain = resolve_cli(["--log-level", "INFO", "topics", "create"])
    assert [ctx.info_name for ctx in chain] == ["governor", "topics", "create"]
    assert chain[-1].params == {"bootstrap": "somewhere:9092", "namespace": "governor",
                                "align_configs": False}
    assert resolve_cli(["worker", "--slot", "3", "--gpu", "a100"])[-1].params["slot"] == 3


def test_helpers():
    assert interpolate("${A:-x}/${B-y}/$${C}") == "x/y/${C}"
    with pytest.raises(AssertionError):
        interpolate("${NO_DEFAULT}")
    assert topic_references({"a": ["governor.requests", "x governor.nope y"], "b": "notgovernor.x"},
                            "governor") == {"governor.requests", "governor.nope"}
    assert {"GOVERNOR_BOOTSTRAP", "GOVERNOR_NAMESPACE"} <= cli_envvars()


# --- the compose file ---------------------------------------------------------------------------

def test_infrastructure_services_exist(services):
    for name in ("kafka", "clickhouse"):
        assert name in services, f"service {name!r} missing"
        assert services[name].get("image"), f"service {name!r} needs an image"
    assert services["kafka"]["image"].startswith("apache/kafka:4.")
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server")
    for name in ("kafka", "clickhouse"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} needs a healthcheck"


def test_expected_governor_services(governor_services):
    assert {"topics", "router", "worker-0", "worker-1"} <= set(governor_services)


def test_depends_on_targets_exist(services):
    for name, service in services.items():
        for target, condition in depends_on(service).items():
            assert target in services, f"{name} depends on unknown service {target!r}"
            assert target != name
            assert condition in DEPENDS_ON_CONDITIONS, f"{name}: bad condition {condition!r}"
            if condition == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target}'s health"


def test_governor_services_wait_for_kafka(services, resolved):
    def reaches_healthy_kafka(name: str, seen: frozenset = frozenset()) -> bool:
        deps = depends_on(services[name])
        if deps.get("kafka") == "service_healthy":
            return True
        return any(dep not in seen and reaches_healthy_kafka(dep, seen | {name}) for dep in deps)

    for name, ctx in resolved.items():
        if "bootstrap" in ctx.params:
            assert reaches_healthy_kafka(name), f"{name} does not wait for a healthy kafka"


def test_governor_services_use_the_cli_entrypoint(governor_services):
    for name, service in governor_services.items():
        entrypoint = service.get("entrypoint")
        assert entrypoint in (None, ["governor"], "governor"), f"{name} overrides the entrypoint"
        assert command_args(service), f"{name} needs a command"


def test_governor_commands_are_accepted_by_the_cli(governor_services, monkeypatch):
    refused = []
    for name, service in governor_services.items():
        try:
            resolve_service(service, monkeypatch)
        except ClickException as exc:
            refused.append(f"{name}: `governor {shlex.join(command_args(service))}`: "
                           f"{exc.format_message()}")
    assert not refused, "the CLI refuses:\n" + "\n".join(refused)


def test_governor_env_vars_are_read_by_the_cli(governor_services):
    known = cli_envvars()
    for name, service in governor_services.items():
        unknown = {key for key in environment(service)
                   if key.startswith(GOVERNOR_ENV_PREFIX) and key not in known}
        assert not unknown, f"{name} sets {sorted(unknown)}, which no governor command reads"


def test_namespace_and_topic_names(compose, resolved):
    namespaces = {ctx.params["namespace"] for ctx in resolved.values() if "namespace" in ctx.params}
    assert len(namespaces) == 1, f"Governor services disagree on the namespace: {namespaces}"
    catalog = TopicCatalog(namespaces.pop())  # raises on an invalid namespace
    unknown = topic_references(compose, catalog.namespace) - set(catalog.topics())
    assert not unknown, f"docker-compose.yml names topics outside the catalog: {sorted(unknown)}"


def test_worker_slots_fit_the_dispatch_topic(resolved):
    slots = {}
    for name, ctx in resolved.items():
        if ctx.info_name == "worker":
            catalog = TopicCatalog(ctx.params["namespace"])
            partitions = catalog.spec(catalog.dispatch).partitions
            slot = ctx.params["slot"]
            assert 0 <= slot < partitions, f"{name}: --slot {slot} but {catalog.dispatch} has {partitions}"
            assert slot not in slots, f"{name} and {slots.get(slot)} both serve slot {slot}"
            slots[slot] = name
    assert len(slots) >= 2


def test_kafka_listeners_are_consistent(kafka_env):
    listeners = parse_listeners(kafka_env["KAFKA_LISTENERS"])
    advertised = parse_listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"])
    protocol_map = kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    protocols = dict(item.split(":", 1) for item in protocol_map.split(","))
    controller = kafka_env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert set(kafka_env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert set(listeners) <= set(protocols) and controller in listeners
    assert controller not in advertised
    for name, (_host, port) in advertised.items():
        assert name in listeners and listeners[name][1] == port, f"advertised {name} has no listener"
    node_id = str(kafka_env["KAFKA_NODE_ID"])
    assert kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node_id}@kafka:{listeners[controller][1]}"
    assert kafka_env.get("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT") in advertised
    assert kafka_env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_bootstrap_is_the_advertised_kafka_listener(services, kafka_env, resolved):
    advertised = parse_listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"])
    in_network = {f"{host}:{port}" for host, port in advertised.values()
                  if host in {"kafka", services["kafka"].get("hostname")}}
    assert in_network, "kafka advertises no listener reachable as `kafka` inside the compose network"
    users = {name: ctx.params["bootstrap"] for name, ctx in resolved.items() if "bootstrap" in ctx.params}
    assert users
    for name, bootstrap in users.items():
        assert bootstrap in in_network, (f"{name} bootstraps from {bootstrap!r}; kafka advertises "
                                         f"{sorted(in_network)} inside the network")


def test_published_ports_are_local_only(services):
    for name, service in services.items():
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond localhost"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond localhost"


def test_named_volumes_are_declared(compose, services):
    declared = set(compose.get("volumes") or {})
    for name in ("kafka", "clickhouse"):
        assert services[name].get("volumes"), f"{name} keeps its data in a volume"
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume.get("source") if isinstance(volume, dict) else volume.split(":", 1)[0]
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"


def test_dockerfile_builds_the_cli_image():
    text = DOCKERFILE.read_text()
    instructions = [line.strip() for line in text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    assert instructions[0].startswith("FROM python:3.11-slim")
    assert 'ENTRYPOINT ["governor"]' in instructions
    users = [line.split(None, 1)[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert re.search(r"pip install (\S+ )*\.(\s|$)", text), "the image installs the project"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'governor = "infra.cli:run"' in pyproject
    for package in ("schemas", "streams", "controllers", "workers", "analytics", "infra"):
        assert re.search(rf"^COPY {package} ", text, re.M), f"the image lacks the {package} package"
