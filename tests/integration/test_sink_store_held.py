"""A second ``governor sink`` on a running sink's data directory is refused (exit 2), and the
running sink can still be found: its endpoint's discovery file is left as it was (before 5 Dec
the second wrote its own and deleted it as it stopped, and `governor sql` then failed)."""

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


def test_a_second_sink_on_the_directory_leaves_the_first_one_found(kafka_bootstrap, catalog,
                                                                    tmp_path):
    sink = ["sink", "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace,
            "--data-dir", str(tmp_path), "--sql-port", "0"]
    first = _cli(*sink)
    try:
        url = asyncio.run(wait_for_endpoint(tmp_path, 120, alive=lambda: first.poll() is None)).url
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
