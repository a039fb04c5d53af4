"""Versioned schema of the analytics store, applied in order at start.

``schema_migrations`` records each version applied. A migration is a list of statements that are
each idempotent (``IF NOT EXISTS``), because one interrupted half-way runs again from its first
statement. A step that cannot be written so (an exchange of two tables) is a pair ``(done,
statement)``: the statement is skipped when the query ``done`` answers a nonzero number. Never
edit a released migration: add the next version (an ``ALTER``, a new table or view) and update
the insert contract in ``analytics/schema.py`` alongside it.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from analytics.migrations import (
    m001_tables,
    m002_rollups,
    m003_last_attempt,
    m004_created_order,
    m005_first_completion,
    m006_completing_attempt,
    m007_sink_runs,
    m008_config_settings,
    m009_utc_partitions,
    m010_attempt_times,
    m011_request_facts,
    m012_continuation_ttft,
    m013_worker_gpus,
    m014_unfinished_flushes_kept,
    m015_named_attempt_ends,
    m016_request_ttft,
    m017_failed_attempts,
    m018_flush_tables_written,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str | tuple[str, str], ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "base tables, sink journal and offsets", tuple(m001_tables.STATEMENTS)),
    Migration(2, "per-minute and per-request rollups", tuple(m002_rollups.STATEMENTS)),
    Migration(3, "the worker of a request's latest attempt", tuple(m003_last_attempt.STATEMENTS)),
    Migration(4, "request outcomes ordered by creation", tuple(m004_created_order.STATEMENTS)),
    Migration(5, "when a request first completed", tuple(m005_first_completion.STATEMENTS)),
    Migration(6, "the worker of a request's newest completing attempt",
              tuple(m006_completing_attempt.STATEMENTS)),
    Migration(7, "flushes named by their sink run", tuple(m007_sink_runs.STATEMENTS)),
    Migration(8, "the latest value of every setting, without TTL",
              tuple(m008_config_settings.STATEMENTS)),
    Migration(9, "partitions and sorting keys in UTC", tuple(m009_utc_partitions.STATEMENTS)),
    Migration(10, "when each attempt of a request started and ended",
              tuple(m010_attempt_times.STATEMENTS)),
    Migration(11, "what a request asked for, from its Queued or its first record",
              tuple(m011_request_facts.STATEMENTS)),
    Migration(12, "a continuation's first token is no TTFT sample",
              tuple(m012_continuation_ttft.STATEMENTS)),
    Migration(13, "the GPUs of each heartbeat's worker", tuple(m013_worker_gpus.STATEMENTS)),
    Migration(14, "unfinished flushes kept, however old",
              tuple(m014_unfinished_flushes_kept.STATEMENTS)),
    Migration(15, "a failure or cancellation that names its attempt ends that attempt only",
              tuple(m015_named_attempt_ends.STATEMENTS)),
    Migration(16, "a request's TTFT is its first token's, no continuation's",
              tuple(m016_request_ttft.STATEMENTS)),
    Migration(17, "the attempts a request's failures name", tuple(m017_failed_attempts.STATEMENTS)),
    Migration(18, "the tables of a flush written", tuple(m018_flush_tables_written.STATEMENTS)),
)
LATEST_VERSION = MIGRATIONS[-1].version

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version UInt32,
    name String,
    applied_at DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree ORDER BY version"""


def apply_migrations(
    command: Callable[[str], object],
    applied_versions: Callable[[], set[int]],
    record: Callable[[Migration], None],
) -> list[int]:
    """Apply every migration not yet recorded, in order; return the versions applied now.

    The three callables keep this module free of any client: ``command`` runs one statement,
    ``applied_versions`` reads ``schema_migrations`` and ``record`` adds a row to it.
    """
    command(MIGRATIONS_TABLE)
    done = applied_versions()
    applied = []
    for migration in MIGRATIONS:
        if migration.version in done:
            continue
        logger.info("applying analytics migration %d: %s", migration.version, migration.name)
        for statement in migration.statements:
            if isinstance(statement, tuple):
                already_done, statement = statement
                if command(already_done):
                    continue
            command(statement)
        record(migration)
        applied.append(migration.version)
    return applied
