"""``Stack.stop`` (what ``governor up`` and ``demo`` run on Ctrl-C or SIGTERM) leaves the analytics
store holding every worker's final heartbeat, ``state = 'stopped'``: the workers stop first, and
the sink last, once it has read the telemetry to its end as of their exit. Before 6 Dec every
component had SIGTERM at once, and the sink could exit before it stored them (the last moments
of a worker's time missing from ``governor report cost`` until a later sink run)."""

import time

import pytest

from analytics.endpoint import announced
from analytics.query import EndpointSource, QueryError, open_source
from infra.stack import PoolSpec, Stack

pytestmark = pytest.mark.integration


def _workers_stored(data_dir, timeout_s: float = 120.0) -> set[str]:
    """The workers whose heartbeats the running sink has stored, once both have some."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sink = announced(data_dir)
        if sink is not None:
            try:
                rows = EndpointSource(sink["url"], timeout_s=10).query(
                    "SELECT DISTINCT worker_id FROM worker_status").rows
            except QueryError:
                rows = []  # (its endpoint not serving yet)
            if len(rows) == 2:
                return {row[0] for row in rows}
        time.sleep(0.2)  # polling the sink's store under a deadline
    raise AssertionError(f"the sink stored no heartbeats of both workers in {timeout_s:g} s")


def test_a_stopped_stack_has_stored_each_workers_stopped_heartbeat(kafka_bootstrap, catalog,
                                                                   tmp_path):
    data_dir = tmp_path / "analytics"
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 2)], tmp_path / "logs",
                  speedup=20, sink_data_dir=data_dir)
    stack.start()
    try:
        workers = _workers_stored(data_dir)
    finally:
        stack.stop()
    assert stack.processes["sink"].returncode == 0
    source = open_source(catalog.namespace, data_dir=data_dir)  # (the sink's store, it gone)
    try:
        last = source.query("SELECT worker_id, argMax(state, time) FROM worker_status "
                            "GROUP BY worker_id").rows
    finally:
        source.close()
    assert {worker: state for worker, state in last} == dict.fromkeys(workers, "stopped")
