"""The replay of one pending flush into a table without views that holds millions of rows.

    python -m benchmarks.flush_replay [--millions 2] [--records 20000] [--runs 3] [--keep DIR]

Fills ``dispatches`` of a fresh embedded store with ``--millions`` million rows over the last 25
days (ClickHouse's ``numbers()``, as ``benchmarks.analytics_queries`` fills its tables; 8
partitions of one topic), and lets its merges settle. Then, ``--runs`` times: a flush of
``--records`` dispatches of the last minute (the next offsets of each partition) is begun by a
run that dies after half of its rows are inserted; the flush is written again as a sink given
its partitions writes it (``Journal.commit`` under the dead run's id), and the benchmark prints
how long that took and, of it, the lookup of the rows the table already holds
(``Journal._not_held``), with the best and the median, and what the store reads for the
first lookup (``EXPLAIN ESTIMATE``). Each replay must leave every record of its flush in the
table once; the benchmark fails if not. On 7 Dec, 20 million rows, a loaded 2-core machine:
before, the lookup read the whole table, 5.4-6.6 s; after, 46,627 rows (6 granules of 3
parts), 0.12-0.32 s, the replay 0.20-0.67 s.
"""

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from analytics.batch import Batch
from analytics.journal import Flush, Journal
from analytics.schema import TABLES
from analytics.store import Store, StoreLocation

TOPIC = "bench.dispatch"
PARTITIONS = 8
DAY_S = 86_400


def fill(store: Store, rows: int, now_s: int) -> None:
    """``rows`` dispatches, offsets 0.. of each partition, their times spread over 25 days."""
    store.command(f"""
INSERT INTO dispatches (kafka_topic, kafka_partition, kafka_offset, time, type, request_id,
                        tenant, model, worker_id, slot)
SELECT '{TOPIC}', number % {PARTITIONS}, intDiv(number, {PARTITIONS}),
       toDateTime64({now_s - 25 * DAY_S} + intDiv(number * {25 * DAY_S - 120}, {rows}), 3, 'UTC'),
       'dispatch', concat('r-', toString(number)), concat('t-', toString(number % 40)),
       'llama-3-8b', concat('w-', toString(number % 64)), number % 4
FROM numbers({rows})""")


def pending_batch(first: int, records: int, now_ms: int) -> Batch:
    """``records`` dispatches of the last minute, from offset ``first`` of each partition."""
    batch, spec, each = Batch(), TABLES["dispatches"], records // PARTITIONS
    for partition in range(PARTITIONS):
        rows = [(TOPIC, partition, offset, now_ms - 60_000 + offset % 60_000, "dispatch",
                 f"p-{partition}-{offset}", "", "t-1", "llama-3-8b", f"w-{offset % 64}",
                 offset % 4, 0, 0, "router-0")
                for offset in range(first, first + each)]
        batch.add_partition(TOPIC, partition, first, first + each - 1,
                            {"dispatches": spec.to_arrow(rows)})
    return batch


def replay_once(store: Store, flush_id: int, first: int, records: int) -> tuple[float, float]:
    """Begin a flush, insert half its rows as a run cut short would, write it again; return the
    seconds of the replay and of its lookup of the rows held."""
    batch = pending_batch(first, records, int(time.time() * 1000))
    flush = Flush("dead-run", flush_id, tuple(batch.ranges()))
    Journal(store, "dead-run").begin(flush)
    [insert] = batch.inserts(flush.token)
    store.insert("dispatches", insert.data.slice(0, insert.data.num_rows // 2), token=insert.token)
    journal, lookup = Journal(store, "bench-run"), []
    looked_up = journal._not_held

    def timed(*args):
        began = time.perf_counter()
        try:
            return looked_up(*args)
        finally:
            lookup.append(time.perf_counter() - began)

    journal._not_held = timed
    [pending] = journal.state().pending
    lookups, query = [], store.query

    def noting_lookups(sql, parameters=None, settings=None):
        if "arrayExists" in sql:
            lookups.append((sql, parameters))
        return query(sql, parameters, settings)

    store.query = noting_lookups
    began = time.perf_counter()
    try:
        journal.commit(pending.flush_id, batch, list(pending.ranges), run=pending.run,
                       written=pending.written)
    finally:
        elapsed = time.perf_counter() - began
        del store.query
    if flush_id == 1:  # what the store reads for the lookup, as it estimates it
        for sql, parameters in lookups:
            [[_, table, parts, rows, marks]] = store.query(f"EXPLAIN ESTIMATE {sql}",
                                                           parameters).rows
            print(f"the lookup reads {rows:,} rows of {table} ({marks} granules in {parts} "
                  f"parts)", flush=True)
    held = store.query(
        f"SELECT count(), uniqExact(kafka_partition, kafka_offset) FROM dispatches "
        f"WHERE kafka_topic = '{TOPIC}' AND kafka_offset >= {first}").rows[0]
    if held != [batch.records, batch.records]:
        raise SystemExit(f"flush {flush_id}: {held[0]} rows of {held[1]} records, "
                         f"not {batch.records} once each")
    store.command(f"DELETE FROM dispatches WHERE kafka_topic = '{TOPIC}' "
                  f"AND kafka_offset >= {first}")
    return elapsed, sum(lookup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--millions", type=float, default=2.0,
                        help="rows of dispatches already in the store, in millions")
    parser.add_argument("--records", type=int, default=20_000,
                        help="records of the pending flush")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path,
                        help="the store's directory, kept (else a temporary one)")
    args = parser.parse_args()
    directory = args.keep or Path(tempfile.mkdtemp(prefix="governor-flush-replay-"))
    store = Store.open(StoreLocation("bench", data_dir=directory / "chdb"))
    try:
        rows, now_s = int(args.millions * 1_000_000), int(time.time())
        began = time.perf_counter()
        fill(store, rows, now_s)
        store.command("OPTIMIZE TABLE dispatches")  # (one merge, as a live store's would)
        parts = store.query("SELECT count() FROM system.parts WHERE active "
                            "AND table = 'dispatches' AND database = currentDatabase()").rows
        print(f"dispatches: {rows:,} rows in {parts[0][0]} parts, "
              f"{time.perf_counter() - began:.1f} s to fill", flush=True)
        first = rows // PARTITIONS + 1
        replays, lookups = [], []
        for run in range(args.runs):
            elapsed, lookup = replay_once(store, run + 1, first, args.records)
            replays.append(elapsed)
            lookups.append(lookup)
            print(f"replay {run + 1}: {elapsed * 1000:.0f} ms, of which the lookup of the rows "
                  f"held {lookup * 1000:.0f} ms", flush=True)
        print(f"one pending flush of {args.records:,} records on {rows:,} rows: replay best "
              f"{min(replays) * 1000:.0f} ms, median {statistics.median(replays) * 1000:.0f} ms; "
              f"lookup best {min(lookups) * 1000:.0f} ms, median "
              f"{statistics.median(lookups) * 1000:.0f} ms")
    finally:
        store.close()
        if args.keep is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
