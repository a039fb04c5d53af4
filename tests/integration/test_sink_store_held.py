"""A second ``governor sink`` on a running sink's data directory is refused (exit 2), and the
running sink can still be found: its endpoint's discovery file is left as it was (before 5 Dec
the second wrote its own and deleted it as it stopped, and `governor sql` then failed). A
``governor up`` whose sink is so refused stops, saying why, rather than start it again and
again."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analytics.endpoint import ENDPOINT_FILE
from analytics.progress import wait_for_endpoint

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "infra.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, **options)


def _first_sink(bootstrap: str, namespace: str, data_dir: Path) -> tuple[subprocess.Popen, str]:
    """A sink on ``data_dir`` and the URL of its SQL endpoint, once it answers."""
    first = _cli("sink", "--bootstrap", bootstrap, "--namespace", namespace, "--data-dir",
                 str(data_dir), "--sql-port", "0")
    try:
        return first, asyncio.run(wait_for_endpoint(data_dir, 120,
                                                    alive=lambda: first.poll() is None)).url
    except BaseException:
        first.kill()
        first.communicate()
        raise


def test_a_second_sink_on_the_directory_leaves_the_first_one_found(kafka_bootstrap, catalog,
                                                                    tmp_path):
    sink = ["sink", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
            "--data-dir", str(tmp_path), "--sql-port", "0"]
    first, url = _first_sink(kafka_bootstrap, catalog.namespace, tmp_path)
    try:
        second = _cli(*sink)
        said = second.communicate(timeout=120)[0]
        assert second.returncode == 2, said[-2000:]
        assert "another process holds the analytics store" in said
        assert json.loads((tmp_path / ENDPOINT_FILE).read_text())["url"] == url
        query = subprocess.run(
            [sys.executable, "-m", "infra.cli", "sql", "--data-dir", str(tmp_path),
             "--namespace", catalog.namespace, "SELECT count() FROM request_events"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert query.returncode == 0, query.stdout + query.stderr
        assert first.poll() is None
    finally:
        first.terminate()
        first.communicate(timeout=120)
    assert not (tmp_path / ENDPOINT_FILE).exists()  # the first one's, taken back as it stopped


def test_up_stops_when_its_sink_is_refused_the_store_naming_why(kafka_bootstrap, catalog,
                                                                tmp_path):
    """Before 5 Dec `up` started such a sink again and again (a backoff up to 60 s, for ever),
    saying only `sink exited; started it again`, and served on with no analytics."""
    data_dir = tmp_path / "analytics"
    first, url = _first_sink(kafka_bootstrap, catalog.namespace, data_dir)
    try:
        up = _cli("up", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
                  "--fleet", "h100:1", "--log-dir", str(tmp_path / "up"), "--data-dir",
                  str(data_dir))
        try:
            said = " ".join(up.communicate(timeout=180)[0].split())
        finally:
            up.kill()  # (if the wait above timed out)
        assert up.returncode == 2, said[-3000:]
        assert "error: sink stopped: error: another process holds the analytics store" in said
        assert f"(its log: {tmp_path / 'up' / 'sink.log'})" in said
        assert said.count("started it again") == 0
        assert json.loads((data_dir / ENDPOINT_FILE).read_text())["url"] == url
    finally:
        first.terminate()
        first.communicate(timeout=120)
