"""Where ``governor sql`` and ``governor report`` send their queries, and how results print.

In order of preference:

1. ``--clickhouse-url``: a ClickHouse server, queried directly (server mode);
2. ``--endpoint URL``: a running sink's SQL endpoint;
3. ``--data-dir DIR``: the endpoint a sink running on that directory announced in
   ``DIR/sql-endpoint.json`` (refused if that sink stores another namespace); if that sink is
   gone, the directory itself, opened read-only.
"""

import contextlib
import csv
import io
import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal, Protocol

from analytics.endpoint import announced, guarded_query
from analytics.schema import database_for
from analytics.store import READ_SETTINGS, QueryResult, Store, StoreError, StoreLocation
from schemas.errors import TerminalError

logger = logging.getLogger(__name__)

OutputFormat = Literal["table", "csv", "json"]
SINK_OPENING_WAIT_S = 60.0  # how long sql and report wait for a sink to open its store


class QueryError(TerminalError):
    """The query failed; the message is the store's or the endpoint's."""


class SqlSource(Protocol):
    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult: ...

    def close(self) -> None: ...


class EndpointSource:
    """A sink's SQL endpoint over HTTP. It runs one query at a time, each for up to
    ``READ_SETTINGS["max_execution_time"]`` (120 s), so a query queued behind others may wait
    past ``timeout_s``: the error then says it is busy (before 7 Dec, that no endpoint answers
    there, as if no sink ran)."""

    def __init__(self, url: str, timeout_s: float = 130.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        body = json.dumps({"sql": sql, "parameters": parameters or {}}).encode()
        request = urllib.request.Request(f"{self.url}/query", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = json.load(response)
        except urllib.error.HTTPError as exc:
            raise QueryError(_error_of(exc)) from None
        except TimeoutError:  # (sent, then no answer: a connection's timeout is a URLError)
            raise QueryError(
                f"the analytics SQL endpoint at {self.url} gave no answer within "
                f"{self.timeout_s:g} s: it runs one query at a time, each for up to "
                f"{READ_SETTINGS['max_execution_time']} s, so it is busy (others' queries, or "
                "this one); try again, or ask for less") from None
        except (urllib.error.URLError, OSError) as exc:
            raise QueryError(f"no analytics SQL endpoint answers at {self.url}: {exc}") from None
        return QueryResult(data["columns"], data["types"], data["rows"])

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
            return json.load(response)

    def close(self) -> None:
        pass


class StoreSource:
    """A store opened read-only in this process: a server, or a data directory no sink holds."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
        try:
            return guarded_query(self.store, sql, parameters)
        except StoreError as exc:
            raise QueryError(str(exc)) from None

    def close(self) -> None:
        self.store.close()


def open_source(namespace: str, clickhouse_url: str | None = None, endpoint: str | None = None,
                data_dir: Path = Path(".governor/analytics"), waiting=lambda url, wait_s: None,
                opening_wait_s: float = SINK_OPENING_WAIT_S,
                namespace_given: bool = True) -> SqlSource:
    """Where the queries go (the module's docstring says in which order). A sink found on
    ``data_dir`` that is still opening its store is waited for, up to ``opening_wait_s``;
    ``waiting(url, wait_s)`` is called once when a wait begins. An ``endpoint`` answers for its
    own sink's namespace: one that stores another than a ``namespace_given`` is an error (before
    7 Dec ``--namespace`` was dropped there without a word, and the other's rows answered)."""
    if clickhouse_url:
        location = StoreLocation.for_namespace(namespace, data_dir, clickhouse_url)
        return StoreSource(Store.open(location, readonly=True))
    if endpoint:
        source = EndpointSource(endpoint)
        with contextlib.suppress(OSError, ValueError):  # (no sink answers: the query says so)
            health = source.health()
            wanted = database_for(namespace)
            if namespace_given and health.get("database", wanted) != wanted:
                raise QueryError(
                    f"the sink at {source.url} stores database {health['database']!r}, not the "
                    f"database of namespace {namespace!r} ({wanted!r}): give --namespace of "
                    f"that sink, or the {namespace!r} sink's --endpoint or --data-dir")
            _once_open(source, health, opening_wait_s, waiting)
        return source
    sink = announced(data_dir)
    if sink is not None:
        source = EndpointSource(sink["url"])
        try:
            health = source.health()
        except OSError:
            logger.info("the sink that announced %s is gone; opening the directory", source.url)
        else:
            wanted = database_for(namespace)
            if sink.get("database", wanted) != wanted:
                raise QueryError(
                    f"the sink running on {data_dir} ({source.url}) stores database "
                    f"{sink['database']!r}, not the database of namespace {namespace!r} ({wanted!r}): give "
                    f"--namespace of that sink, or the {namespace!r} sink's --data-dir or "
                    "--endpoint")
            _once_open(source, health, opening_wait_s, waiting)
            return source
    if not (data_dir / "chdb").exists():
        raise QueryError(f"no analytics data in {data_dir}: start `governor sink` first, or pass "
                         "--endpoint, --data-dir or --clickhouse-url")
    try:
        location = StoreLocation.for_namespace(namespace, data_dir)
        return StoreSource(Store.open(location, readonly=True))
    except StoreError as exc:
        if "UNKNOWN_DATABASE" in str(exc):
            raise QueryError(f"{data_dir} holds no analytics of namespace {namespace!r} (database "
                             f"{database_for(namespace)!r}): give the --namespace its sink ran "
                             f"with{_held_hint(location)}") from None
        raise QueryError(f"{exc} (is a sink running on {data_dir}? query its endpoint)") from None


def _once_open(source: EndpointSource, health: dict[str, Any], wait_s: float, waiting) -> None:
    """Return once the sink behind ``source`` has opened its store, or raise after ``wait_s``.
    A sink announces its endpoint before its store is open (opening, migrating and recovering
    it takes seconds), and before 7 Dec a query sent meanwhile, as `governor sql` run right
    after `governor sink`, failed: `error: the sink is still opening the store`."""
    deadline = time.monotonic() + wait_s
    if not health.get("ready", True):
        waiting(source.url, wait_s)
    while not health.get("ready", True):
        if time.monotonic() > deadline:
            error = health.get("last_error")
            raise QueryError(f"the sink at {source.url} has not opened its store within "
                             f"{wait_s:g} s{f' ({error})' if error else ''}: see its log")
        time.sleep(0.2)  # (polling the sink's health until the deadline)
        try:
            health = source.health()
        except OSError:
            raise QueryError(f"the sink at {source.url} stopped before it opened its store"
                             ) from None


def _held_hint(location: StoreLocation) -> str:
    """The namespaces whose analytics a data directory holds, for the error that it holds none
    of the one asked for (a database's name works as its namespace: ``database_for``)."""
    held = location.analytics_databases()
    return f" (it holds those of {' or '.join(f'--namespace {name}' for name in held)})" \
        if held else ""


def render(result: QueryResult, fmt: OutputFormat) -> str:
    """The result as an aligned text table, CSV with a header, or a JSON array of objects."""
    if fmt == "json":
        return json.dumps(result.dicts(), indent=1)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([_cell(v, exact=True) for v in row] for row in result.rows)
        return out.getvalue().rstrip("\n")
    cells = [[_printable(_cell(v)) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(result.columns)]
    numeric = [bool(cells) and all(isinstance(row[i], int | float) for row in result.rows
                                   if row[i] is not None) for i in range(len(result.columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(result.columns), rule, *(line(row) for row in cells),
                      f"({len(cells)} row{'s' if len(cells) != 1 else ''})"])


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on (control characters, format characters such as
    a bidi override, line separators) written as escapes (``\\x1b``, ``\\u202e``, ``\\n``): a
    cell stays one line, and a value any producer wrote (a dead letter's record key) cannot
    recolour or retitle the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _cell(value: Any, exact: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not exact:
        return f"{value:.6g}"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read())["error"]
    except (ValueError, KeyError):
        return f"HTTP {exc.code} {exc.reason}"
