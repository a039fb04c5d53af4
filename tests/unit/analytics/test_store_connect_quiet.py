"""``governor report --clickhouse-url`` to a server that does not answer says the store's own
error alone. Before 7 Dec two warnings of the HTTP client libraries came first (urllib3's
``Retrying (...) after connection broken``, clickhouse_connect's ``Unexpected Http Driver
Exception``), each a timestamped log line."""

import logging
import socket
import subprocess
import sys
import threading

import pytest

from analytics.store import _client_warnings_folded


def test_a_server_that_does_not_answer_is_one_error_line():
    with socket.socket() as bound:  # (bound, not listening: a connect to it is refused)
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-m", "infra.cli", "report", "--clickhouse-url",
                               url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: cannot open the analytics store at {url}")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_only_the_failed_calls_client_records_are_left_out(caplog):
    """Another thread's (a sink's flush, say) and those after the call are kept."""
    pool = logging.getLogger("urllib3.connectionpool")
    with caplog.at_level(logging.WARNING):
        with pytest.raises(OSError), _client_warnings_folded():
            pool.warning("connecting")
            other = threading.Thread(target=pool.warning, args=("another thread",))
            other.start()
            other.join()
            raise ConnectionRefusedError  # (the call failed)
        pool.warning("after")
    assert [r.getMessage() for r in caplog.records] == ["another thread", "after"]
