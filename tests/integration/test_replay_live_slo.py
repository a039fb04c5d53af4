"""``governor replay --deadlines MODE`` stamps a row that states no targets from the ``slo``
settings in force on its namespace (``governor config set slo...``), as ``governor sim --set
slo... --deadlines MODE`` gives them, and says which it stamps. Before 6 Dec it stamped the
default settings whatever the live configuration held (60 s after ``config set slo.deadline_s
30``). The real broker."""

import asyncio
import json

import pytest
from typer.testing import CliRunner

from analytics.progress import end_offsets
from infra import cli
from infra.sim import SimOptions
from infra.traces import TraceRequest, write_governor_jsonl
from schemas.config import GovernorConfig
from schemas.errors import GovernorError
from tests.integration.test_replay_closed_loop import records_on

pytestmark = pytest.mark.integration

ROWS = [TraceRequest(0.0, 500, 20),
        TraceRequest(0.1, 500, 20, ttft_slo_s=0.5),
        TraceRequest(0.2, 500, 20, deadline_s=9.0)]
SAYS = {"rule": "--deadlines rule: TTFT SLO = 3 s + 0.1 s per 1k prompt tokens; deadline = "
                "TTFT SLO + 0.1 s per output token",
        "config": "--deadlines config: TTFT SLO = 3 s + 0.1 s per 1k prompt tokens; deadline = "
                  "30 s after arrival (slo.deadline_s)",
        "none": "--deadlines none: only the targets a request states are sent; one that "
                "states none is judged by TTFT SLO 3 s (slo.ttft_slo_s) and deadline 30 s after "
                "arrival (slo.deadline_s)"}


def live_slo(bootstrap, catalog, **settings: str) -> list[str]:
    """Set ``slo.<name>`` to each of ``settings`` (in their order) on ``catalog``'s namespace
    with ``governor config set``; the options that name the namespace."""
    where = ["--bootstrap", bootstrap, "--namespace", catalog.namespace]
    for name, value in settings.items():
        result = CliRunner().invoke(cli.app, ["config", "set", *where, f"slo.{name}", value])
        assert result.exit_code == 0, result.output
    return where


@pytest.mark.parametrize("mode", ["rule", "config", "none"])
def test_replay_stamps_the_live_slo_settings(kafka_bootstrap, catalog, tmp_path, mode):
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl(ROWS, trace)
    where = live_slo(kafka_bootstrap, catalog, deadline_s="30", ttft_slo_s="3")
    result = CliRunner().invoke(cli.app, ["replay", str(trace), *where, "--run-id", "slo",
                                          "--speedup", "10", "--deadlines", mode])
    assert result.exit_code == 0, result.output
    assert SAYS[mode] in result.output.replace("\n", " ")
    produced = sorted((json.loads(r.value) for r in asyncio.run(
        records_on(kafka_bootstrap, catalog.requests, len(ROWS)))), key=lambda r: r["request_id"])

    # what `sim --set slo.deadline_s=30 --set slo.ttft_slo_s=3 --deadlines MODE` gives the router
    config = GovernorConfig().with_setting("slo", {"ttft_slo_s": 3.0, "deadline_s": 30.0})
    rule = SimOptions(config=config, deadlines=mode).slo_rule
    for row, sent in zip(ROWS, produced):
        deadline_s = (None if sent["deadline_ms"] is None
                      else (sent["deadline_ms"] - sent["created_ms"]) / 1000)
        if rule.stated_only:
            assert (sent["ttft_slo_s"], deadline_s) == (row.ttft_slo_s, row.deadline_s)
        else:
            ttft, deadline = rule.targets(row.prompt_tokens, row.output_tokens, row.ttft_slo_s,
                                          row.deadline_s)
            assert sent["ttft_slo_s"] == pytest.approx(ttft)
            assert deadline_s == pytest.approx(deadline, abs=0.001)
    if mode == "config":  # the operator's 30 s, not the default 60 s
        assert [(r["deadline_ms"] - r["created_ms"]) / 1000 for r in produced] == [30.0, 30.0, 9.0]


def test_replay_refuses_a_row_the_live_slo_settings_make_invalid(kafka_bootstrap, catalog,
                                                                  tmp_path):
    """A row valid with the default ``slo`` settings but not with the live ones (a TTFT target
    of ``slo.ttft_slo_s`` 86,400 s plus its prompt's share, past the day a target may be) is
    refused before anything is sent, naming the row, the field and the limit. Before 6 Dec
    (evening) the rows were checked with the default settings only: the row before it was
    sent, then the replay stopped partway on it."""
    rows = [TraceRequest(0.0, 500, 20, ttft_slo_s=1.0, deadline_s=9.0),  # valid, whatever slo
            TraceRequest(1.0, 500, 20)]
    trace = tmp_path / "t.jsonl"
    write_governor_jsonl(rows, trace)
    where = live_slo(kafka_bootstrap, catalog, deadline_s="86400", ttft_slo_s="86400")

    result = CliRunner().invoke(cli.app, ["replay", str(trace), *where, "--run-id", "slo",
                                          "--speedup", "10"])

    said = " ".join(f"{result.output} {result.exception}".split())
    assert isinstance(result.exception, GovernorError), said  # (exit 2 under `governor`)
    ends = asyncio.run(end_offsets(kafka_bootstrap, [catalog.requests]))
    assert sum(ends.values()) == 0, ends
    assert "sending" not in result.output, said
    assert f"{trace} line 2: trace request 1 " in said, said
    assert "ttft_slo_s: Input should be less than or equal to 86400" in said, said
    assert f"slo settings of {catalog.config}" in said, said
