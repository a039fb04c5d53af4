"""Every option and argument of every `governor` command says what it is in its `--help`, and
README's synopsis of each component gives its options."""

import re
from pathlib import Path

import typer

import infra.cli as cli


def _commands(command, path=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_option_and_argument_has_a_help_text() -> None:
    """Before 6 Dec 18 had none (`governor up --log-dir`, `controllers --tick-s`, `router
    --router-id`, `worker --model`, `broker start --heap-mb`, ...): their `--help` showed a
    default alone."""
    silent = [f"governor {name} {param.name}"
              for name, command in _commands(typer.main.get_command(cli.app))
              for param in command.params if not param.help]
    assert silent == []


#: The long-running components, whose synopsis in README's "Commands" is their usage.
COMPONENTS = ("router", "worker", "controllers", "streams", "sink", "sim-server")


def _readme_synopsis() -> dict[str, set[str]]:
    """The options README's "Commands" block gives each command: a line ``governor A|B ...``
    and the lines indented under it, their comments aside."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    start = readme.index("```bash", readme.index("## Commands"))
    options: dict[str, set[str]] = {}
    names: list[str] = []
    for line in readme[start:readme.index("```", start + 3)].splitlines()[1:]:
        if line.startswith("governor "):
            names = re.findall(r"[a-z][a-z-]*", line.split()[1])
        elif not line.startswith(" "):
            names = []
        for name in names:
            options.setdefault(name, set()).update(
                re.findall(r"--[a-z][a-z0-9-]*", line.split("#")[0]))
    return options


def test_the_readme_synopsis_of_each_component_gives_every_option() -> None:
    """Before 7 Dec it lacked `controllers --fleet-started-ms`, `worker --metrics-port`, and
    `sink --data-dir`, `--clickhouse-url` and `--metrics-port`, and named no component's
    `--bootstrap` or `--namespace`; and none it gives is unknown to the command."""
    commands = typer.main.get_command(cli.app).commands
    synopsis = _readme_synopsis()
    for name in COMPONENTS:
        options = {option for param in commands[name].params for option in param.opts
                   if option.startswith("--")} - {"--help"}
        assert synopsis.get(name, set()) == options, name


def _helps(columns: str | None) -> dict[str, tuple[object, str]]:
    """Each command's ``--help`` (the groups' too) as written to no terminal (a pipe), with
    ``COLUMNS`` set to ``columns`` (None: unset), each with its command."""
    from typer.testing import CliRunner

    runner = CliRunner()
    root = typer.main.get_command(cli.app)
    commands = [("", root), *((name, group) for name, group in root.commands.items()
                              if hasattr(group, "commands")),
                *_commands(root)]
    return {name: (command, runner.invoke(
        cli.app, [*name.split(), "--help"],
        env={"COLUMNS": columns, "TERMINAL_WIDTH": None}).output) for name, command in commands}


def test_help_to_no_terminal_gives_every_option_name_whole() -> None:
    """Piped (``governor worker --help | cat``, CI's log), the help was 80 columns wide, and
    its table cut the longest names: ``--max-num-batched…``, ``--decode-tokens-p…``; and in
    the help texts ``GOVERNOR_BOOTSTRA…`` and demo's ``restart:router|co…``."""
    for name, (command, said) in _helps(None).items():
        options = [option for param in command.params
                   for option in (*param.opts, *param.secondary_opts) if option.startswith("-")]
        assert [option for option in options if option not in said] == [], name
        assert "…" not in said, f"governor {name} --help:\n{said}"


def test_a_narrow_help_folds_what_it_cannot_fit() -> None:
    """At 80 columns (``COLUMNS``, or a terminal that wide) a name or word wider than its
    column is broken across lines, not cut short: nothing of it is lost."""
    for name, (_, said) in _helps("80").items():
        assert "…" not in said, f"governor {name} --help:\n{said}"
    worker = _helps("80")["worker"][1]
    assert "--max-num-batched-" in worker and "--max-num-batched-tokens" not in worker


def test_up_and_demo_say_their_embedded_broker_is_on_their_broker_port() -> None:
    """`up` and `demo` start (or find) the embedded broker on `--broker-port`: before 7 Dec
    their `--bootstrap` help said the default was the embedded broker on 127.0.0.1:9092, as
    the commands that only reach a broker say, whatever `--broker-port` was given."""
    commands = typer.main.get_command(cli.app).commands
    for name in ("up", "demo"):
        said = next(param.help for param in commands[name].params if param.name == "bootstrap")
        assert said == ("An existing Kafka cluster; default: the embedded broker on "
                        "127.0.0.1:--broker-port, started unless it runs."), name
