"""A ClickHouse server not reached, or not answering, is said in one short line: why (urllib3's
innermost reason, without the request it names: a new ``query_id`` each time), and without the
HTTP client libraries' own warnings. Before 7 Dec a sink waiting for its server logged each
retry as the client's whole message (some 500 characters), and a store call failing after the
open came with urllib3's ``Retrying (...)`` and clickhouse_connect's ``Unexpected Http Driver
Exception`` warnings."""

import http.server
import logging
import socket
import threading

import pytest
from clickhouse_connect.driver.exceptions import OperationalError
from urllib3 import HTTPConnectionPool
from urllib3.connection import HTTPConnection
from urllib3.exceptions import (MaxRetryError, NameResolutionError, NewConnectionError,
                                ReadTimeoutError)

from analytics.store import Store, StoreError, StoreLocation, _first_line, _query_error

URL = "http://127.0.0.1:8123"
QUERY = "/?session_id=5e2c&database=db&query_id=597c52f6-f97f-4953-baa6-61448600b537"
#: The pool and connection urllib3 names at the head of its errors.
POOL, CONNECTION = HTTPConnectionPool("127.0.0.1", 8123), HTTPConnection("127.0.0.1", 8123)


def _client_error(cause: Exception) -> OperationalError:
    """The client's error for a request that failed so, chained as clickhouse_connect chains it."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise OperationalError(f"Error {exc} executing HTTP request attempt 1 ({URL})") from exc
    except OperationalError as error:
        return error


def _retries_exhausted(reason: Exception) -> MaxRetryError:
    return MaxRetryError(POOL, QUERY, reason)


@pytest.mark.parametrize(("cause", "said"), [
    (_retries_exhausted(NewConnectionError(
        CONNECTION, "Failed to establish a new connection: [Errno 111] Connection refused")),
     "Failed to establish a new connection: [Errno 111] Connection refused"),
    (_retries_exhausted(NameResolutionError("ch.invalid", CONNECTION, socket.gaierror(
        -2, "Name or service not known"))),
     "Failed to resolve 'ch.invalid' ([Errno -2] Name or service not known)"),
    (ReadTimeoutError(POOL, QUERY, "Read timed out. (read timeout=10)"),
     "Read timed out. (read timeout=10)"),
], ids=["refused", "unresolved", "silent"])
def test_a_server_not_reached_is_said_by_its_cause_alone(cause: Exception, said: str) -> None:
    error = _client_error(cause)
    assert _first_line(error) == said
    assert _query_error(error) == said


def test_another_failure_keeps_its_first_line() -> None:
    error = OperationalError("Code: 60. DB::Exception: Unknown table expression identifier 'x'."
                             "\n(UNKNOWN_TABLE) (version 24.8.1.1)")
    assert _first_line(error) == "Code: 60. DB::Exception: Unknown table expression identifier 'x'."


class _ClientStart(http.server.BaseHTTPRequestHandler):
    """Answers a client's first request (the server's version and zone) and every other with
    nothing (its settings: none): enough for clickhouse_connect to make a client."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = b"24.8.1.1\tUTC\n" if b"version()" in body + self.path.encode() else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST

    def log_message(self, *args) -> None:
        pass


def _store_of_a_server_gone_since() -> Store:
    """A store whose server answered the client's start, then went away."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ClientStart)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    location = StoreLocation("db", url=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        client = location.client("db")
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=10)
    return Store(client, location)


def test_a_call_to_a_server_gone_since_fails_in_one_line_without_the_clients_warnings(caplog):
    store = _store_of_a_server_gone_since()
    calls = {"query": lambda: store.query("SELECT 1"),
             "insert": lambda: store.insert_rows("t", [[1]], ["a"]),
             "command": lambda: store.command("SELECT 1")}
    said = {}
    with caplog.at_level(logging.WARNING):
        for name, call in calls.items():
            with pytest.raises(StoreError) as failed:
                call()
            said[name] = str(failed.value)
    store.close()
    refused = "Failed to establish a new connection: [Errno 111] Connection refused"
    assert said == {"query": refused, "insert": f"insert into t failed: {refused}",
                    "command": refused}
    assert [r.name for r in caplog.records] == []


def test_a_calls_client_warnings_are_kept_when_it_succeeds(caplog):
    """Only a failed call's are left out (its error says what failed)."""
    store = Store(None, StoreLocation("db", url=URL))
    pool = logging.getLogger("urllib3.connectionpool")
    store.client = type("Client", (), {"command": lambda self, *a, **k: pool.warning("kept")})()
    with caplog.at_level(logging.WARNING):
        store.command("SELECT 1")
    assert [r.getMessage() for r in caplog.records] == ["kept"]
