"""Process-wide tuning for Governor's long-running services (a streams worker, the sink)."""

import gc


def tune_gc() -> None:
    """Make CPython's cycle collector cheap for a process that allocates a container per event.

    With the default thresholds (700, 10, 10) the young generation is collected every 700 net
    allocations, and every 70,000 a full collection can walk every live object. A streams worker
    holds hundreds of thousands of long-lived table entries: collections took 11 of its 24 CPU
    seconds (``benchmarks.streams_throughput``; 0.4 s with this tuning), and
    ``benchmarks.streams_hotpath`` halves with it. The analytics sink keeps a fetch's records
    alive (aiokafka's record objects, then the row tuples) while it decodes them: collections took
    3.7 of its 18 to 20 CPU seconds for a million records (0.35 s with this tuning;
    ``benchmarks.analytics_sink --default-gc`` shows the difference).

    Objects from start-up (modules, the app) are frozen out of collection; the young generation
    is collected every 50,000 allocations and the older ones far less often. What these processes
    hold is acyclic (dicts, lists, tuples, Arrow buffers): reference counting frees it, not the
    collector. Call it once, after start-up, in the service's own process.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
