"""``governor sink --clickhouse-url`` to a server nothing listens on: a real sink process on the
real broker says, one short line each retry, that it waits for ClickHouse at that URL and why,
and it does not say it serves. Before 7 Dec it said ``sink: serving ... (into URL ...)`` at once,
then each retry as urllib3's whole message (some 500 characters, a new ``query_id`` in each)."""

import socket

import pytest

from cli_support import output_until

pytestmark = pytest.mark.integration

#: Retry lines the test waits for (the sink backs off 0.2 s, then 0.4 s, ...).
RETRIES = 3


def test_a_sink_says_it_waits_for_an_unreachable_clickhouse_in_one_short_line_a_retry(
        kafka_bootstrap, catalog, tmp_path):
    with socket.socket() as bound:  # (bound, not listening: a connect to it is refused)
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        lines = output_until(["sink", "--bootstrap", kafka_bootstrap, "--namespace",
                              catalog.namespace, "--clickhouse-url", url, "--no-sql"],
                             lambda lines: sum("retrying in" in s for s in lines) >= RETRIES,
                             cwd=tmp_path, timeout_s=60)
    said = "".join(lines)
    assert ": serving " not in said, said
    retries = [line for line in lines if "retrying in" in line]
    waiting = f"analytics sink: waiting for ClickHouse at {url} (database "
    for line in retries:
        assert waiting in line and "Connection refused" in line, line
        assert "query_id" not in line and len(line) < 250, line
    assert lines == retries, said  # (no urllib3 or clickhouse_connect warning among them)
