"""Report queries on 10M rows: how long each ``governor report`` query and the audit take.

    python -m benchmarks.analytics_queries [--events 10000000] [--runs 3] [--keep DIR]

Generates a day of history with ClickHouse's own generators (``numbers()``, ``rand()``) straight
into the base tables of a fresh embedded store, so the materialized views fill the rollups as the
sink's inserts would: ``--events`` rows of ``request_events`` (5 per request: the client's request,
queued, started, first token, and completed or, for 2%, failed; 3-step tasks, each of one
tenant; each with the request's ``created_ms``, as Governor's producers write them), a heartbeat
every 0.5 s from each of 16 workers (2.8M rows), a controller command every 5 s. It lets the
store's background merges settle (as they would between inserts of a live sink; at most
``--settle-s``), then runs each report ``--runs`` times and prints the best and the median time,
with the CPU time it took. Then it merges the tables completely (``OPTIMIZE ... FINAL``) and runs
them again: a live store is in between (recent parts not yet merged), so the first table is the
one the target is about. Target: each under 1 s. Every report must give the same rows in both
states (merging changes how the rows are stored, not what they say); the benchmark fails if not.
"""

import argparse
import math
import os
import re
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from analytics.audit import run_audit
from analytics.query import StoreSource
from analytics.reports import REPORTS, run_report
from analytics.store import Store, StoreLocation

DAY_S = 86_400
WORKERS = 16


def generate(store: Store, events: int) -> dict[str, int]:
    requests = events // 5
    start = f"toDateTime64(now() - {DAY_S + 3600}, 3)"
    spacing = DAY_S / requests
    r, kind = "intDiv(number, 5)", "number % 5"
    at = f"{start} + toIntervalMillisecond(toUInt64({r} * {spacing * 1000:.3f}))"
    statements = {
        "request_events": f"""
INSERT INTO request_events (kafka_topic, kafka_partition, kafka_offset, time, type, request_id,
    task_id, tenant, model, worker_id, attempt, priority, step, steps_total, prompt_tokens,
    max_tokens, output_tokens, cached_tokens, ttft_s, e2e_s, created, deadline, reason, ttft_slo_s,
    prefix_blocks, block_size)
SELECT if({kind} = 0, 'bench.requests', 'bench.telemetry'), {r} % 4, number,
    {at} + toIntervalMillisecond(({kind}) * 300),
    multiIf({kind} = 0, 'inference_request', {kind} = 1, 'queued', {kind} = 2, 'started',
            {kind} = 3, 'first_token', {r} % 50 = 0, 'failed', 'completed'),
    concat('r-', toString({r})), concat('task-', toString(intDiv({r}, 3))),
    concat('tenant-', toString(intDiv({r}, 3) % 20)), if({r} % 7 = 0, 'llama-3-70b', 'llama-3-8b'),
    if({kind} < 2, '', concat('worker-', toString({r} % {WORKERS}))), 1, {r} % 4,
    if({kind} < 2, {r} % 3 + 1, 0), if({kind} < 2, 3, 0), 100 + {r} % 4000, 256,
    if({kind} = 4, 200, 0), if({kind} = 4, ({r} % 4000) / 2, 0),
    if({kind} = 3, 0.05 + (rand() % 3000) / 1000, NULL),
    if({kind} = 4, 1 + (rand() % 20000) / 1000, NULL),
    {at},
    if({kind} < 2, {at} + toIntervalSecond(if({r} % 40 = 0, 1, 60)), NULL),
    if({kind} = 4 AND {r} % 50 = 0, 'engine_error', ''),
    if({kind} < 2, 2.0, NULL), if({kind} = 0, 10, 0), if({kind} = 0, 16, 0)
FROM numbers({events})""",
        "worker_status": f"""
INSERT INTO worker_status (kafka_topic, kafka_partition, kafka_offset, time, worker_id, slot,
    pool, gpu_type, models_loaded, state, kv_blocks_used, kv_blocks_free, running, waiting,
    prefix_cache_queries, prefix_cache_hits, preemptions, requests_completed, started)
SELECT 'bench.telemetry', number % 4, {events} + number,
    {start} + toIntervalMillisecond(intDiv(number, {WORKERS}) * 500),
    concat('worker-', toString(number % {WORKERS})), number % {WORKERS},
    if(number % {WORKERS} < 8, 'h100@llama-3-8b', 'a100@llama-3-8b'),
    if(number % {WORKERS} < 8, 'h100', 'a100'), ['llama-3-8b'], 'warm',
    rand() % 8000, 8000, rand() % 64, rand() % 16,
    intDiv(number, {WORKERS}) * 40, intDiv(number, {WORKERS}) * 25, 0, intDiv(number, {WORKERS}),
    {start}
FROM numbers({WORKERS * DAY_S * 2})""",
        "control_commands": f"""
INSERT INTO control_commands (kafka_topic, kafka_partition, kafka_offset, time, type, command_id,
    issued_by, target, reason, params)
SELECT 'bench.control', 0, number, {start} + toIntervalSecond(number * 5), 'set_load_shed_level',
    concat('c-', toString(number)), 'shedding', '', 'pressure low', '{{"min_value":0.0}}'
FROM numbers({DAY_S // 5})""",
    }
    counts = {}
    for table, sql in statements.items():
        began = time.perf_counter()
        store.command(sql)
        counts[table] = store.query(f"SELECT count() FROM {table}").rows[0][0]
        print(f"generated {counts[table]:>11,} rows of {table:17} in "
              f"{time.perf_counter() - began:6.1f} s", flush=True)
    return counts


def settle(store: Store, timeout_s: float) -> None:
    """Wait until no merge has run for 5 s and the part count held still (at most ``timeout_s``)."""
    parts_sql = "SELECT count() FROM system.parts WHERE database = currentDatabase() AND active"
    merges_sql = "SELECT count() FROM system.merges WHERE database = currentDatabase()"
    began, last, quiet = time.monotonic(), None, 0
    while time.monotonic() - began < timeout_s and quiet < 5:
        parts, merging = store.query(parts_sql).rows[0][0], store.query(merges_sql).rows[0][0]
        quiet = quiet + 1 if merging == 0 and parts == last else 0
        last = parts
        time.sleep(1.0)  # polling the engine's merge state, bounded by timeout_s
    print(f"settled after {time.monotonic() - began:.0f} s: {last} active parts", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("--keep", type=Path, help="keep the generated store in this directory")
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="governor-bench-"))
    location = StoreLocation("bench", data_dir=directory / "chdb")
    store = Store.open(location)  # kept open: its engine runs the background merges
    generate(store, args.events)
    settle(store, args.settle_s)
    source = StoreSource(Store.open(location, readonly=True))
    try:
        as_inserted = measure(source, args.runs, "as inserted, background merges settled")
        began = time.perf_counter()
        for table in ("request_outcomes", "request_events", "worker_status"):
            store.command(f"OPTIMIZE TABLE {table} FINAL")
        print(f"\nmerged every table completely in {time.perf_counter() - began:.0f} s")
        merged = measure(source, args.runs, "fully merged")
    finally:
        source.close()
        store.close()
        if args.keep is None:
            shutil.rmtree(directory, ignore_errors=True)
    differ = [name for name in as_inserted if not _same(as_inserted[name], merged[name])]
    for name in differ:
        pairs = zip(as_inserted[name], merged[name])
        first = next(((x, y) for x, y in pairs if not _same(x, y)), "a row count")
        print(f"\n{name}: first difference (as inserted, fully merged): {first}")
    if differ:
        raise SystemExit(f"\nFAILED: rows differ as inserted and fully merged: {', '.join(differ)}")
    print(f"\nevery query gave the same rows as inserted and fully merged ({len(merged)} queries)")


def measure(source: StoreSource, runs: int, state: str) -> dict[str, object]:
    """Time every query; return what each answered."""
    jobs = {f"report {name}": (lambda n=name: run_report(source, n)) for name in REPORTS}
    jobs["report --audit"] = lambda: run_audit(source)
    answers: dict[str, object] = {}
    print(f"\n{state} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):\n"
          f"{'query':24} {'best s':>8} {'median s':>9} {'cpu s':>7}  rows  (target < 1 s)")
    for name, job in jobs.items():
        times, cpu, result = [], [], None
        for _ in range(runs):
            began, cpu_began = time.perf_counter(), _cpu_s()
            result = job()
            times.append(time.perf_counter() - began)
            cpu.append(_cpu_s() - cpu_began)
        rows = len(result.rows) if hasattr(result, "rows") else 1
        verdict = "ok" if min(times) < 1 else "SLOW"
        print(f"{name:24} {min(times):8.3f} {statistics.median(times):9.3f} {min(cpu):7.2f} "
              f"{rows:>5}  {verdict}", flush=True)
        answers[name] = result.dicts() if hasattr(result, "dicts") else result
    return answers


def _same(a: object, b: object, rel_tol: float = 1e-6) -> bool:
    """Equal, but for floats within ``rel_tol``: sums add in another order once merged, and a
    t-digest's percentiles (columns ``*_p50_s`` ...) depend on the order it saw its values in,
    so those are within 1%."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(
            _same(a[k], b[k], 1e-2 if re.fullmatch(r".*_p\d+_s", k) else rel_tol) for k in a)
    return a == b


def _cpu_s() -> float:
    """CPU seconds of this process (the embedded engine's threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
