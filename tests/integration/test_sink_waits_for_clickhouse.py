"""``governor sink --clickhouse-url`` to a server nothing listens on: a real sink process on the
real broker says, one short line each retry, that it waits for ClickHouse at that URL and why,
and it does not say it serves. Before 7 Dec it said ``sink: serving ... (into URL ...)`` at once,
then each retry as urllib3's whole message (some 500 characters, a new ``query_id`` in each).
To a server that takes the connection and says nothing, it says at once that it connects."""

import socket
import time

import pytest

from analytics.schema import database_for
from analytics.store import FIRST_ANSWER_S
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
    # (no urllib3 or clickhouse_connect warning among them)
    assert lines == [f"sink: connecting to ClickHouse at {url} (database "
                     f"{database_for(catalog.namespace)})\n", *retries], said


def test_a_sink_says_at_once_that_it_connects_to_a_clickhouse_that_says_nothing(
        kafka_bootstrap, catalog, tmp_path):
    """Its first open waits ``FIRST_ANSWER_S`` (10 s) for such a server's answer: before 7 Dec
    the sink printed nothing at all until that open failed. The line's bound runs from the
    sink's connection, not from its start: a process started on a loaded machine took 11 s to
    its first line (its imports, the topics' check), past a bound of 8 s from its start."""
    with socket.socket() as silent:  # (takes connections and says nothing)
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.setblocking(False)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        held: list[tuple[socket.socket, float]] = []  # (each connection, when it was taken)

        def said_something(lines: list[str]) -> bool:
            try:
                held.append((silent.accept()[0], time.monotonic()))
            except BlockingIOError:
                pass  # (no connection yet)
            if held:  # (within less than the first open's wait: the line must not wait for it)
                assert lines or time.monotonic() - held[0][1] < FIRST_ANSWER_S - 2, \
                    "no line within the first open's wait"
            if lines:  # (the waiting connect is reset: the sink stops at once when told)
                for connection, _ in held:
                    connection.close()
                silent.close()
            return bool(lines)

        lines = output_until(["sink", "--bootstrap", kafka_bootstrap, "--namespace",
                              catalog.namespace, "--clickhouse-url", url, "--no-sql"],
                             said_something, cwd=tmp_path, timeout_s=90)
    database = database_for(catalog.namespace)
    assert lines[0] == f"sink: connecting to ClickHouse at {url} (database {database})\n", \
        "".join(lines)
