"""``governor report --show-sql`` gives "the SQL behind a report, to adapt": with the values of
its query parameters, as ``governor sql --param`` takes them, so the SQL shown runs as shown and
gives the report's rows. Before 7 Dec it showed the SQL alone: ``governor sql`` had no way to
give a ``{days:UInt32}`` (``Substitution `default_ttft_slo_s` is not set``)."""

import json
import shlex

import pytest
from typer.testing import CliRunner

from analytics.batch import Batch
from analytics.journal import Journal
from analytics.reports import REPORTS
from analytics.rows import message_row
from analytics.store import Store, StoreLocation
from infra.cli import app
from schemas.errors import GovernorError
from tests.unit.analytics.test_reports import _history

NAMESPACE = "t_show"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A sink's directory holding ``test_reports``' history (yesterday's), its store closed."""
    folder = tmp_path_factory.mktemp("analytics")
    store = Store.open(StoreLocation.for_namespace(NAMESPACE, folder))
    batch, offsets = Batch(), {}
    for suffix, message in _history():
        offset = offsets[suffix] = offsets.get(suffix, -1) + 1
        table, columns = message_row(message, suffix)
        batch.add(table, (f"t.{suffix}", 0, offset, message.event_time_ms, *columns))
    Journal(store).commit(1, batch)
    store.close()
    return folder


def _governor(data_dir, *args: str):
    result = CliRunner().invoke(app, [args[0], "--data-dir", str(data_dir), "--namespace",
                                      NAMESPACE, *args[1:]])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _shown(data_dir, *args: str) -> tuple[list[str], str]:
    """The ``--param`` options and the SQL ``--show-sql`` gives for ``args``."""
    sql = _governor(data_dir, "report", "--show-sql", *args).stdout
    header = sql.splitlines()[0]
    assert header.startswith("/* ") and header.endswith(" */") and ": governor sql " in header
    words = shlex.split(header.split(": governor sql ", 1)[1].split(' "SQL"', 1)[0])
    assert words[::2] == ["--param"] * (len(words) // 2)
    return words, sql


@pytest.mark.parametrize("name", [n for n in REPORTS if n != "cost"])
def test_the_sql_shown_with_its_params_gives_the_reports_rows(data_dir, name):
    """As one argument, with no ``--`` before it: its header is a ``/* ... */`` comment. Before
    7 Dec it was a ``-- slo: ...`` line, and ``governor sql`` took the SQL for an option."""
    params, sql = _shown(data_dir, name, "--days", "2")
    by_sql = _governor(data_dir, "sql", *params, "--format", "json", sql).stdout
    by_report = json.loads(_governor(data_dir, "report", name, "--days", "2",
                                     "--format", "json").stdout)[name]
    assert json.loads(by_sql) == by_report and by_report


def test_the_audits_sql_shown_gives_its_counts(data_dir):
    params, sql = _shown(data_dir, "--audit")
    row = json.loads(_governor(data_dir, "sql", *params, "--format", "json", sql).stdout)[0]
    audit = json.loads(_governor(data_dir, "report", "--audit", "--json").stdout)
    assert (row["accepted"], row["terminal"]) == (audit["accepted"], audit["terminal"]) == (6, 5)


def test_the_cost_sql_names_the_prices_it_gives_as_the_defaults(data_dir):
    """The cost report takes the prices the store holds (h100 at 3.60 $/h in this history):
    ``--show-sql`` opens no store, and says that its prices are the defaults."""
    params, sql = _shown(data_dir, "cost", "--days", "2")
    assert "price_gpus, price_usd: the defaults of the slo and GPU price settings" in \
        sql.splitlines()[0]
    rows = json.loads(_governor(data_dir, "sql", *params, "--format", "json", sql).stdout)
    assert {r["pool"] for r in rows} == {"h100@m", "a100@m", "h200@m"}


def test_a_parameter_left_out_is_named_with_the_option_that_gives_it(data_dir):
    _, sql = _shown(data_dir, "slo")
    with pytest.raises(GovernorError, match="Substitution `.*` is not set.*: give each "
                                            r"\{NAME:Type\} of the query its value with --param"):
        _governor(data_dir, "sql", sql)
    with pytest.raises(GovernorError, match="bad --param 'days': expected NAME=VALUE"):
        _governor(data_dir, "sql", "--param", "days", "SELECT 1")
