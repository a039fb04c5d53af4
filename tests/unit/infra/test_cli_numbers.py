"""Float options of the `governor` command line: ``nan``, and ``inf`` past a bound, are refused
naming the option and its range (before 5 Dec ``--rate-scale nan`` was "Input should be less
than or equal to 1000000")."""

import math
import re

import pytest
import typer
from typer.testing import CliRunner

import infra.cli as cli
from infra.cli_numbers import _Number


def _no_broker(*args, **kwargs):
    raise AssertionError("reached for a broker before the input was checked")


def _said(output: str) -> str:
    """The output's words, without the error box's frame and line breaks."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


@pytest.mark.parametrize(("low", "high", "text", "message"), [
    (0, 10, "nan", "must be a number from 0 to 10, got nan"),
    (0, 10, "NaN", "must be a number from 0 to 10, got NaN"),
    (0, 10, "inf", "must be a number from 0 to 10, got inf"),
    (0, 10, "-inf", "must be a number from 0 to 10, got -inf"),
    (0, 10, "1e400", "must be a number from 0 to 10, got 1e400"),
    (0, 10, "ten", "must be a number from 0 to 10, got ten"),
    (1e-6, 1e6, "0", "must be a number from 1e-06 to 1,000,000, got 0"),
    (0.05, 60, "60.5", "must be a number from 0.05 to 60, got 60.5"),
    (0, None, "nan", "must be a number >= 0, got nan"),
    (None, 5, "nan", "must be a number <= 5, got nan"),
    (None, None, "nan", "must be a number, got nan"),
    (0, 10, "9" * 100, "got 9999999999999999999999999999999999999..."),
])
def test_a_number_outside_the_range_is_refused_with_the_range(low, high, text, message) -> None:
    with pytest.raises(typer.BadParameter) as info:
        _Number(low, high)(text)
    assert info.value.message.endswith(message)


@pytest.mark.parametrize(("low", "high", "given", "expected"), [
    (0.05, 60, "0.05", 0.05), (0.05, 60, "60", 60.0), (0, 10, 3.0, 3.0),  # (a default: a float)
    (0, None, "inf", math.inf), (None, None, "-inf", -math.inf),  # inf where no bound is
])
def test_a_number_within_the_range_is_taken(low, high, given, expected) -> None:
    assert _Number(low, high)(given) == expected


def _float_options(command, path=()):
    """``(command path, option)`` for every float option of ``command`` and its subcommands."""
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _float_options(sub, (*path, name))
    for param in command.params:
        if param.type_descriptor.annotation is float:
            yield path, param.opts[0]


FLOAT_OPTIONS = list(_float_options(typer.main.get_command(cli.app)))


def test_the_float_options_are_found() -> None:
    found = {(" ".join(path), option) for path, option in FLOAT_OPTIONS}
    assert {("sim", "--rate-scale"), ("workload build", "--mean-rps"), ("demo", "--speedup"),
            ("sink", "--max-batch-age-s"), ("broker start", "--timeout-s")} <= found
    assert len(found) >= 25


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize(("path", "option"), FLOAT_OPTIONS,
                         ids=[" ".join((*path, option)) for path, option in FLOAT_OPTIONS])
def test_every_float_option_refuses_nan_and_inf_naming_itself(monkeypatch, path, option,
                                                              value) -> None:
    """Every float option, whichever command it is on (a float option declared with
    ``typer.Option`` rather than ``number_option`` fails here)."""
    monkeypatch.setattr(cli, "_reachable", _no_broker)
    monkeypatch.setattr(cli, "_kafka", _no_broker)
    result = CliRunner().invoke(cli.app, [*path, option, value])
    said = _said(result.output)
    assert result.exit_code == 2, result.output
    assert re.search(rf"Invalid value for '{option}': must be a number from \S+ to \S+, "
                     rf"got {value}\b", said), said


def test_sim_rate_scale_nan_says_what_it_must_be(tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n')
    result = CliRunner().invoke(cli.app, ["sim", str(trace), "--rate-scale", "nan"])
    assert result.exit_code == 2
    assert ("Invalid value for '--rate-scale': must be a number from 1e-06 to 1,000,000, got nan"
            in _said(result.output)), result.output
