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
