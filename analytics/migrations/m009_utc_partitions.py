"""Version 9: every table's partition and sorting key is computed in UTC, whatever the host's
time zone.

The time columns of the keyed tables had no time zone of their own (``DateTime64(3)``,
``DateTime``): their keys (``toYYYYMMDD(time)``, ``toStartOfHour(time)``, ``toYYYYMM(minute)``)
followed the engine's default zone. The process that created a store computed them in UTC (its
session's zone); every later one, or any server, in its own. An insert's dedup block id includes
its partition, so a flush written again after a restart on a host east or west of UTC (the
journal's replay, with the same tokens) could land in another day's partition, not be dropped,
and be counted twice by ``FINAL`` and the rollups. The columns now carry ``'UTC'``: a change of
their metadata only (values are instants either way), so no row is rewritten.

Rows already written stay in the parts they are in. (A part written on a host a half-hour off
UTC stays sorted by that zone's hours; whole-hour zones share UTC's hours.)
"""

#: The base tables (one row per Kafka record) as version 1 made them, and the per-minute rollups.
_BASE = ("request_events", "dispatches", "response_chunks", "worker_status", "kv_events",
         "signals", "control_commands", "config_changes", "dead_letters")
_ROLLUPS = ("request_minute", "worker_minute", "kv_minute")


def _utc(table: str, column: str, kind: str) -> str:
    return f"ALTER TABLE {table} MODIFY COLUMN {column} {kind}"


STATEMENTS = [
    *(_utc(table, "time", "DateTime64(3, 'UTC')") for table in _BASE),
    *(_utc(table, "minute", "DateTime('UTC')") for table in _ROLLUPS),
]
