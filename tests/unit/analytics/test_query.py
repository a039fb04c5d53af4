"""Query results print as an aligned table, CSV or JSON; GPU prices follow the config topic."""

import json

import pytest

from analytics.cost import gpu_prices
from analytics.query import EndpointSource, QueryError, open_source, render
from analytics.store import QueryResult, plain
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR

RESULT = QueryResult(["tenant", "requests", "p99_s", "tags"],
                     ["String", "UInt64", "Float64", "Array"],
                     [["acme", 1200, 0.123456789, ["a", "b"]], ["b", 7, None, []]])


def test_table_is_aligned_with_numbers_on_the_right():
    lines = render(RESULT, "table").splitlines()
    assert lines[0].split() == ["tenant", "requests", "p99_s", "tags"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].startswith("acme") and "    1200" in lines[2] and "0.123457" in lines[2]
    assert lines[3].split()[:2] == ["b", "7"] and lines[-1] == "(2 rows)"



def test_a_table_writes_control_and_format_characters_as_escapes():
    """A record key or raw head stored from any producer reached the operator's terminal as it
    was: 'esc\\x1b[31mRED\\x1b]0;pwned\\x07' (a dead letter's record_key) coloured the table
    and retitled the terminal, and a newline in a value broke its row in two."""
    hostile = QueryResult(["record_key", "n"], ["String", "UInt64"],
                          [["esc\x1b[31mRED\x1b]0;pwned\x07", 1], ["ev\x00il\nx\u202e", 2]])
    lines = render(hostile, "table").splitlines()
    assert lines[2].split() == ["esc\\x1b[31mRED\\x1b]0;pwned\\x07", "1"]
    assert lines[3].split() == ["ev\\x00il\\nx\\u202e", "2"] and lines[-1] == "(2 rows)"
    assert json.loads(render(hostile, "json"))[1]["record_key"] == "ev\x00il\nx\u202e"

def test_csv_keeps_full_precision_and_json_is_one_object_per_row():
    assert render(RESULT, "csv").splitlines() == [
        "tenant,requests,p99_s,tags", 'acme,1200,0.123456789,"[""a"", ""b""]"', "b,7,,[]"]
    assert json.loads(render(RESULT, "json")) == [
        {"tenant": "acme", "requests": 1200, "p99_s": 0.123456789, "tags": ["a", "b"]},
        {"tenant": "b", "requests": 7, "p99_s": None, "tags": []}]


def test_values_become_plain_json():
    import datetime as dt
    from decimal import Decimal

    assert plain(dt.datetime(2026, 1, 2, 3, 4, 5, 6000)) == "2026-01-02T03:04:05.006000"
    assert plain(float("nan")) is None and plain(Decimal("1.5")) == 1.5
    assert plain({"k": [b"\xff"]}) == {"k": ["\ufffd"]}


def test_an_endpoint_that_is_not_there_is_a_clear_error():
    with pytest.raises(QueryError, match="no analytics SQL endpoint answers at http://127.0.0.1:9"):
        EndpointSource("http://127.0.0.1:9", timeout_s=2).query("SELECT 1")


@pytest.mark.parametrize(("settings", "expected"), [
    ([], DEFAULT_GPU_PRICES_USD_PER_HOUR),
    ([["gpu_prices_usd_per_hour.h100", "2.5"]], {**DEFAULT_GPU_PRICES_USD_PER_HOUR, "h100": 2.5}),
    ([["gpu_prices_usd_per_hour.h100", "-1"]], DEFAULT_GPU_PRICES_USD_PER_HOUR),  # rejected
    ([["gpu_prices_usd_per_hour.h100", '"cheap"']], DEFAULT_GPU_PRICES_USD_PER_HOUR),
    ([["gpu_prices_usd_per_hour", '{"b200": 6.0}'], ["gpu_prices_usd_per_hour.h100", "3.5"]],
     {"b200": 6.0, "h100": 3.5}),
])
def test_gpu_prices_apply_settings_in_order_and_skip_invalid_ones(settings, expected):
    assert gpu_prices(settings) == expected


@pytest.mark.parametrize("option,value,limit", [("--days", "4294967296", "36500"),
                                                ("--limit", "4294967296", "1000000")])
def test_report_refuses_a_window_past_its_bound_naming_it(option, value, limit):
    # (a UInt32 query parameter would wrap a larger value round to a small one, silently)
    from typer.testing import CliRunner

    from infra.cli import app

    result = CliRunner().invoke(app, ["report", "cost", option, value])
    assert result.exit_code == 2 and option in result.output and limit in result.output


def test_report_refuses_more_days_than_a_chosen_reports_tables_keep_before_it_opens_a_store(
        tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from schemas.errors import GovernorError

    result = CliRunner().invoke(app, ["report", "--days", "40", "--data-dir", str(tmp_path)])
    assert isinstance(result.exception, GovernorError)  # (`governor` says it as error:, exit 2)
    assert "the cost report reads worker_status" in str(result.exception)
    assert "at most --days 29, not 40" in str(result.exception)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_the_namespaces_analytics_says_so(store, location, tmp_path):
    """No sink runs: the directory is opened, and it holds another namespace's database."""
    store.close()  # (one chdb path per process at a time: open_source opens it again)
    with pytest.raises(QueryError) as raised:
        open_source("nosuch", data_dir=tmp_path)
    # (before, without the namespace it holds: a demo's store is its run's, not `governor`'s)
    assert str(raised.value) == (f"{tmp_path} holds no analytics of namespace 'nosuch' (database "
                                 "'nosuch'): give the --namespace its sink ran with (it holds "
                                 "those of --namespace t_analytics)")


def test_a_syntax_error_names_a_place_in_the_query_written(store):
    """Not the format clause the client appends to it ("position 26 (Native) (line 2, col 1):
    Native.")."""
    import pytest

    from analytics.store import StoreError

    with pytest.raises(StoreError) as raised:
        store.query("SELECT nonsense(")
    message = str(raised.value)
    assert "Native" not in message
    assert "failed at the end of the query: Unmatched parentheses: '(' at position 16" in message
    with pytest.raises(StoreError) as raised:
        store.query("SELECT count( FROM request_events")
    assert str(raised.value).endswith("(line 1, col 20): request_events. Unmatched parentheses: "
                                      "'(' at position 13 (line 1, col 13) is never closed. "
                                      "(SYNTAX_ERROR)")
