"""The analytics store: one clickhouse-connect client on one namespace's database.

Two places the store can live, same code above this module:

- embedded (default): chdb through clickhouse-connect (``get_client(interface='chdb', path=...)``)
  on a local data directory. One process owns a directory; others query through the sink's SQL
  endpoint (``analytics/endpoint.py``).
- server: a ClickHouse server over HTTP (``--clickhouse-url http://user:pass@host:8123``).

``Store.open`` creates the database and applies the schema migrations; ``Store.open(...,
readonly=True)`` only reads, within ``READ_SETTINGS``' limits (``readonly=1``: no writes, no DDL,
and no query changes a setting, so none lifts a limit). Every client error becomes a
``StoreError``, which callers treat as retryable: the store may come back.
"""

import datetime as dt
import fcntl
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import clickhouse_connect
import pyarrow as pa
from clickhouse_connect.driver.exceptions import ClickHouseError
from urllib3.exceptions import HTTPError, MaxRetryError

from analytics.migrations import LATEST_VERSION, Migration, apply_migrations
from analytics.schema import database_for
from schemas.errors import RetryableError, TerminalError

logger = logging.getLogger(__name__)

#: What a read-only connection allows one query: the limits, and the settings the reports' own
#: SETTINGS clauses name (with ``readonly=1`` a query may name a setting only at its current
#: value). ``readonly`` comes last: the embedded client applies them one by one. (Before 5 Dec it
#: was ``readonly=2``, under which ``SELECT ... SETTINGS max_result_rows = 0,
#: max_execution_time = 0`` ran unbounded in the sink's process.)
READ_SETTINGS = {"max_execution_time": 120, "max_result_rows": 1_000_000,
                 "max_result_bytes": 256 << 20, "result_overflow_mode": "throw",
                 "max_memory_usage": 4 << 30,
                 "do_not_merge_across_partitions_select_final": 1, "readonly": 1}
_DEDUP_SETTINGS = {"deduplicate_blocks_in_dependent_materialized_views": 1}
#: Every insert of the sink's: a flush whose records are stamped on many days (partitions are
#: days) is written, however many (ClickHouse refuses more than 100 in one insert by default,
#: and the sink then tried the same flush again for ever: 150 valid heartbeats stamped a day
#: apart stopped every table's history).
_INSERT_SETTINGS = {"max_partitions_per_insert_block": 0}
#: What a client raises when the store fails (chdb's engine raises RuntimeError of its own).
_FAILURES = (ClickHouseError, OSError, RuntimeError)


class StoreError(RetryableError):
    """The store refused a statement or could not be reached."""


class UnreadableValue(StoreError):
    """A query's result holds a value the client has no Python value for (a time before year 1
    or after 9999): the query's doing, not the store's."""


class StoreNotOpened(StoreError):
    """The store could not be opened; ``cause``: why, in one line (a sink that waits for the
    store says it with where the store is, ``StoreLocation.named``)."""

    def __init__(self, location: "StoreLocation", cause: str) -> None:
        super().__init__(f"cannot open the analytics store at {location.describe()}: {cause}")
        self.cause = cause


class StoreHeld(TerminalError):
    """Another process runs the embedded engine on the data directory (a sink, usually): no
    retry opens it while that one runs."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows}


@dataclass(frozen=True)
class StoreLocation:
    """Where the store lives: a chdb data directory or a server URL, and the database."""

    database: str
    data_dir: Path | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        if (self.data_dir is None) == (self.url is None):
            raise ValueError("give exactly one of data_dir (embedded chdb) or url (server)")

    @classmethod
    def for_namespace(cls, namespace: str, data_dir: Path,
                      url: str | None = None) -> "StoreLocation":
        """A namespace's store: on ``url`` if given, else embedded in ``data_dir/chdb``."""
        database = database_for(namespace)
        return cls(database, url=url) if url else cls(database, data_dir=data_dir / "chdb")

    def describe(self) -> str:
        where = str(self.data_dir) if self.data_dir is not None else _without_password(self.url)
        return f"{where} (database {self.database})"

    def named(self) -> str:
        """``ClickHouse at URL (database D)``, or ``the analytics store at DIR (database D)``."""
        what = "the analytics store" if self.data_dir is not None else "ClickHouse"
        return f"{what} at {self.describe()}"

    def analytics_databases(self) -> list[str]:
        """The databases here that hold Governor's analytics (a ``schema_migrations`` table):
        one a namespace, named as ``analytics.schema.database_for`` names it."""
        client = self.client(None)
        try:
            return [row[0] for row in client.query(
                "SELECT DISTINCT database FROM system.tables WHERE name = 'schema_migrations' "
                "ORDER BY database").result_rows]
        finally:
            client.close()

    def client(self, database: str | None, settings: dict[str, Any] | None = None, *,
               answer_s: int | None = None):
        """A client of the store; ``answer_s``: a server's answer to each of its requests (the
        first at once, as the client asks the server's version) waited for at most so long, not
        clickhouse_connect's 300 s."""
        # Days and buckets are UTC's, whatever the host's or the server's time zone.
        settings = {"session_timezone": "UTC", **(settings or {})}
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            here = self.data_dir.resolve()
            with _OPENING:  # (two threads of this process opening it: the second finds the
                # first's lock, its own process's)
                if here not in _OPENED_HERE:
                    if _held_elsewhere(self.data_dir):  # (the engine, tried, would print its
                        raise StoreHeld(_held_message(self.data_dir))  # own failure first)
                    _OPENED_HERE.add(here)
            with _engine_in_utc():
                return clickhouse_connect.get_client(interface="chdb", path=str(self.data_dir),
                                                     database=database, settings=settings)
        waited = {} if answer_s is None else {"send_receive_timeout": answer_s}
        return clickhouse_connect.get_client(dsn=self.url, database=database or "default",
                                             settings=settings, **waited)


#: The embedded stores this process has opened (or begun to open) an engine on: it may hold
#: them still.
_OPENED_HERE: set[Path] = set()
_OPENING = threading.Lock()


def _held_elsewhere(data_dir: Path) -> bool:
    """Whether an engine in another process holds ``data_dir``: it keeps an exclusive ``flock``
    on its ``status`` file while it runs. Asked before this process first opens it, and after
    an open failed (this process, had it the engine open, would find its own lock too)."""
    try:
        with open(data_dir / "status", "rb") as status:
            try:
                fcntl.flock(status, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(status, fcntl.LOCK_UN)
    except OSError:  # no status file: no engine ever ran there
        return False
    return False


def _held_message(data_dir: Path) -> str:
    return (f"another process holds the analytics store at {data_dir} (a sink running on the "
            "same --data-dir?): stop it first, or query it through the SQL endpoint it serves "
            "unless started with --no-sql (`governor sql` finds it)")


@contextmanager
def _engine_in_utc() -> Iterator[None]:
    """The embedded engine starts in UTC, whatever the host's zone, which this process keeps.

    The engine takes its default zone once, from ``TZ``, as it starts; a table's time columns
    without a zone of their own take it each time the table is loaded (``session_timezone`` does
    not reach them). In the host's zone, a store reopened on a host off UTC put its requests on
    the host's days (``toDate(first_seen)``), and before schema version 9 its inserts in the host's
    day partitions."""
    host = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    try:
        yield
    finally:
        if host is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = host
        time.tzset()  # (the engine's start set the C library's zone from TZ: the host's again)


#: The HTTP client libraries that log a failed request's retries as warnings (urllib3's
#: ``Retrying (...) after connection broken``, clickhouse_connect's ``Unexpected Http Driver
#: Exception``): the ``StoreError`` the failed call raises says what failed.
_CLIENT_LIBRARIES = ("urllib3", "clickhouse_connect")


@contextmanager
def _client_warnings_folded() -> Iterator[None]:
    """Hold back the HTTP client libraries' log records of this thread during a call of the
    client: left out if the call fails (its ``StoreError`` says what failed), logged once it
    succeeds. Before 7 Dec a ``--clickhouse-url`` that did not answer printed two of their
    warnings before the store's own error, and a sink whose server went away after its store
    opened printed them at each retry. Other threads' records are kept."""
    caller = threading.get_ident()
    held: list[logging.LogRecord] = []

    def hold_the_callers(record: logging.LogRecord) -> bool:
        if record.thread != caller:
            return True
        held.append(record)
        return False

    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.split(".")[0] in _CLIENT_LIBRARIES]
    for client_logger in loggers:
        client_logger.addFilter(hold_the_callers)
    try:
        yield
    except _FAILURES:
        held.clear()
        raise
    finally:
        for client_logger in loggers:
            client_logger.removeFilter(hold_the_callers)
        for record in held:
            logging.getLogger(record.name).handle(record)


#: How long opening a store waits for a server's first answer: a server that takes the
#: connection and says nothing (hung, or not ClickHouse) fails the open in this time. Before
#: 7 Dec the open waited clickhouse_connect's 300 s in silence: a sink said nothing, and a stop
#: signal waited with it; ``governor sql``/``report`` gave their error only then.
FIRST_ANSWER_S = 10


def _first_answer(location: StoreLocation, create_database: bool) -> None:
    """Ask a server for its first answer within ``FIRST_ANSWER_S``, on a client of its own (the
    store's client waits on a long query's answer as long as the query runs); creating the
    store's database, for a store opened to write."""
    admin = location.client(None, answer_s=FIRST_ANSWER_S)
    try:
        if create_database:
            admin.command(f"CREATE DATABASE IF NOT EXISTS `{location.database}`")
    finally:
        admin.close()


class Store:
    def __init__(self, client, location: StoreLocation) -> None:
        self.client = client
        self.location = location

    @classmethod
    def open(cls, location: StoreLocation, *, readonly: bool = False) -> "Store":
        """Connect; unless ``readonly``, create the database and apply pending migrations."""
        try:
            with _client_warnings_folded():
                if not readonly or location.url is not None:  # (an embedded engine: at once)
                    _first_answer(location, create_database=not readonly)
                client = location.client(location.database, READ_SETTINGS if readonly else None)
        except _FAILURES as exc:
            if location.data_dir is not None and _held_elsewhere(location.data_dir):
                raise StoreHeld(_held_message(location.data_dir)) from None
            raise StoreNotOpened(location, _first_line(exc)) from exc
        store = cls(client, location)
        try:
            store._check_zone()
            if not readonly:
                store.migrate()
            elif (version := store.schema_version()) < LATEST_VERSION:
                raise StoreError(
                    f"the analytics store at {location.describe()} is at schema version "
                    f"{version}; this Governor reads version {LATEST_VERSION}: start `governor "
                    "sink` on it once (it migrates the store), then query it again")
        except StoreError:
            store.close()  # an open client holds the engine (and, embedded, its directory)
            raise
        return store

    def _check_zone(self) -> None:
        """Say so when the engine's zone is not UTC (a server's own; the embedded engine started
        before this module could pin it): the days of time columns without a zone follow it."""
        try:
            with _client_warnings_folded():
                zone = self.client.query("SELECT serverTimezone()").result_rows[0][0]
        except _FAILURES as exc:
            raise StoreError(f"reading the analytics store's time zone failed: "
                             f"{_first_line(exc)}") from exc
        if zone != "UTC":
            logger.warning("the analytics store at %s runs in the time zone %s, not UTC: report "
                           "days and hours of its rows may follow it", self.location.describe(),
                           zone)

    def schema_version(self) -> int:
        """The latest migration applied (0: none, or no store here)."""
        try:
            with _client_warnings_folded():
                rows = self.client.query("SELECT max(version) FROM schema_migrations").result_rows
        except _FAILURES as exc:
            if "UNKNOWN_TABLE" in str(exc):
                return 0  # no schema_migrations table: nothing applied
            raise StoreError(f"reading the analytics store's schema version failed: "
                             f"{_first_line(exc)}") from exc
        return int(rows[0][0] or 0) if rows else 0

    def migrate(self) -> list[int]:
        def record(migration: Migration) -> None:
            self.client.insert("schema_migrations", [[migration.version, migration.name]],
                               column_names=["version", "name"])

        def applied() -> set[int]:
            return {row[0] for row in self.client.query(
                "SELECT version FROM schema_migrations FINAL").result_rows}

        try:
            with _client_warnings_folded():
                return apply_migrations(self.client.command, applied, record)
        except _FAILURES as exc:
            raise StoreError(f"migrating the analytics store failed: {_first_line(exc)}") from exc

    def insert(self, table: str, data: pa.Table, token: str | None = None) -> None:
        """Insert an Arrow table; with ``token``, inserting it again is a no-op."""
        settings = dict(_INSERT_SETTINGS, **_DEDUP_SETTINGS, insert_deduplication_token=token) \
            if token else _INSERT_SETTINGS
        try:
            with _client_warnings_folded():
                self.client.insert_arrow(table, data, settings=settings)
        except _FAILURES as exc:
            raise StoreError(f"insert into {table} failed: {_first_line(exc)}") from exc

    def insert_rows(self, table: str, rows: list[list[Any]], column_names: list[str]) -> None:
        """Insert a few rows given as lists (the journal's bookkeeping)."""
        try:
            with _client_warnings_folded():
                self.client.insert(table, rows, column_names=column_names)
        except _FAILURES as exc:
            raise StoreError(f"insert into {table} failed: {_first_line(exc)}") from exc

    def query(self, sql: str, parameters: dict[str, Any] | None = None,
              settings: dict[str, Any] | None = None) -> QueryResult:
        try:
            with _client_warnings_folded():
                result = self.client.query(sql, parameters=parameters, settings=settings)
                rows = [[plain(v) for v in row] for row in result.result_rows]  # may fail midstream
        except _FAILURES as exc:
            raise StoreError(_query_error(exc)) from exc
        except (ValueError, OverflowError) as exc:  # (a time before year 1 or after 9999)
            raise UnreadableValue(f"the result holds a value out of the range this client "
                                  f"reads: {exc}") from exc
        columns, types = list(result.column_names), [t.name for t in result.column_types]
        if not rows and not columns:
            columns, types = self._describe(sql, parameters)
        return QueryResult(columns, types, rows)

    def _describe(self, sql: str, parameters: dict[str, Any] | None) -> tuple[list[str], list[str]]:
        """The columns of a query that returned no rows (the embedded engine then sends none)."""
        try:
            with _client_warnings_folded():
                described = self.client.query(f"DESCRIBE ({sql})",
                                              parameters=parameters).result_rows
        except _FAILURES:
            return [], []  # not a SELECT (SHOW, EXPLAIN, ...): no columns to show
        return [row[0] for row in described], [row[1] for row in described]

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> None:
        try:
            with _client_warnings_folded():
                self.client.command(sql, parameters=parameters)
        except _FAILURES as exc:
            raise StoreError(_first_line(exc)) from exc

    def close(self) -> None:
        self.client.close()


def plain(value: Any) -> Any:
    """A query result value as JSON can carry it: one of a type JSON has no form for (a UUID, an
    IPv4 or IPv6 address, a Time's ``timedelta``) as its text, as ``governor sql`` prints it from a
    directory. (Before 7 Dec the sink's SQL endpoint answered such a value `500 Internal Server
    Error`.)"""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime) and value.tzinfo is not None:  # UTC, as every time here
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value if value is None or isinstance(value, str | int) else str(value)


#: Where the engine names the format clause its client appends to a query ("failed at position
#: 26 (Native) (line 2, col 1): Native."), not a place in the query the user wrote.
_CLIENT_FORMAT = re.compile(r"failed at position \d+ \(Native\) \(line \d+, col \d+\): Native\. ?")


def _query_error(exc: BaseException) -> str:
    """The engine's message on a query, on one line, without the format clause the client
    appends to the query (it quotes it on a line of its own after the place it failed at)."""
    text = _unreached(exc) or str(exc).strip().replace("\n FORMAT Native", "")
    return _CLIENT_FORMAT.sub("failed at the end of the query: ", _first_line(text) if text
                              else type(exc).__name__)


def _first_line(exc: BaseException | str) -> str:
    """A failure in one line: its first, or, where the server was not reached or did not
    answer, why (``_unreached``)."""
    unreached = _unreached(exc) if isinstance(exc, BaseException) else None
    text = unreached or str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


#: How urllib3 begins a connection's error: its host and port, which the store's URL says.
_CONNECTION = re.compile(r"^HTTPS?Connection(Pool)?\([^)]*\): ")


def _unreached(exc: BaseException) -> str | None:
    """Why an HTTP request of the client did not reach the server or get its answer (``Failed to
    establish a new connection: [Errno 111] Connection refused``, ``Read timed out. (read
    timeout=10)``); None for another failure. The client's whole message names the request, a
    new ``query_id`` each time: a sink waiting for its server said each retry in some 500
    characters, each line different (before 7 Dec)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, HTTPError):
        cause = cause.__cause__
    if isinstance(cause, MaxRetryError) and cause.reason is not None:
        cause = cause.reason
    return None if cause is None else _CONNECTION.sub("", str(cause).strip())


def _without_password(url: str | None) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url or "")
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urlunsplit(parts)
