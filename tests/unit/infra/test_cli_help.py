"""Every option and argument of every `governor` command says what it is in its `--help`."""

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
