"""The sink's read-only SQL endpoint: how other processes query a store one process owns.

An embedded (chdb) data directory can be open in one process only, the sink's; ``governor sql``,
``governor report`` and the demo query it here. It listens on 127.0.0.1 only.

- ``POST /query`` with ``{"sql": "...", "parameters": {...}}`` (``application/json``) answers
  ``{"columns": [...], "types": [...], "rows": [[...], ...]}``, or ``{"error": "..."}`` with
  status 400 (a bad or forbidden query) or 503 (the store is unavailable).
- ``GET /health`` answers whether the sink is ready (store open, migrated, recovered) and its
  counters (records, rows written, store state, last error).

Queries run on a read-only connection of their own, one at a time, in a worker thread, after
``analytics.guard`` has checked that they only read; the connection's limits
(``analytics.store.READ_SETTINGS``) bound each, and no query can change them.
"""

import asyncio
import json
import logging
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from analytics.guard import (LINE_COMMENT, BadQuery, block_comment_end, check_ast,
                             check_first_word, check_no_format)
from analytics.store import QueryResult, Store, StoreError, StoreLocation, UnreadableValue
from infra.paths import write_atomically

logger = logging.getLogger(__name__)

ENDPOINT_FILE = "sql-endpoint.json"
MAX_BODY_BYTES = 1 << 20


#: Quoted strings and identifiers, and line comments (``# `` and ``#!`` ones too), where a ``;``
#: separates nothing; and the opening of a block comment, which ends where ``block_comment_end``
#: says (they nest).
_QUOTED = re.compile(rf"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|`[^`]*`|{LINE_COMMENT}|/\*""",
                     re.DOTALL)
_EXPLAIN = "EXPLAIN AST "
_PLACE = re.compile(r"\b(position|col) (\d+)")


def guarded_query(store: Store, sql: str, parameters: dict[str, Any] | None = None) -> QueryResult:
    """Run ``sql`` if the engine's parse of it shows a pure read (see ``analytics.guard``)."""
    sql = _one_statement(sql.strip().rstrip(";"))
    if not sql:
        raise BadQuery("empty statement")
    check_first_word(sql)
    check_no_format(" ".join(sql[s:e] for s, e in _unquoted(sql)))
    try:
        ast = store.query(f"{_EXPLAIN}{sql}", parameters=parameters)
    except StoreError as exc:
        if "(READONLY)" in str(exc):  # a SETTINGS clause: the read-only connection refuses it
            raise BadQuery("a query here cannot change settings (they bound what it may take): "
                           f"{_as_written(str(exc))}") from None
        raise BadQuery(f"not one valid statement: {_as_written(str(exc))}") from None
    check_ast([row[0] for row in ast.rows])
    return store.query(sql, parameters=parameters)


def _one_statement(sql: str) -> str:
    """``sql`` up to a ``;`` that ends it, followed by blanks and comments alone (``SELECT 1; --
    a note``: before 7 Dec refused as two statements); ``BadQuery`` where a ``;`` separates two."""
    end = next((sql.index(";", s, e) for s, e in _unquoted(sql) if ";" in sql[s:e]), None)
    if end is None:
        return sql
    if any(sql[s:e].strip() for s, e in _unquoted(sql, end + 1)):
        raise BadQuery("one statement at a time: this one has a ';' inside it")
    return sql[:end].rstrip()


def _unquoted(sql: str, start: int = 0) -> Iterator[tuple[int, int]]:
    """The spans of ``sql`` from ``start`` outside its quoted strings and identifiers and its
    comments, a nested block comment whole (before 7 Dec it was cut at its first ``*/``: a
    ``;`` inside it was taken for a second statement, and a quote after that hid one that was;
    and a ``# `` or ``#!`` line comment was kept, so a ``;`` in one was taken for a second
    statement too)."""
    at = start
    while (found := _QUOTED.search(sql, at)) is not None:
        yield at, found.start()
        at = block_comment_end(sql, found.start()) if found[0] == "/*" else found.end()
    yield at, len(sql)


def _as_written(error: str) -> str:
    """The engine's error about ``EXPLAIN AST <sql>``, with its positions in ``<sql>``."""
    shift = len(_EXPLAIN)
    return _PLACE.sub(lambda m: f"{m[1]} {max(int(m[2]) - shift, 1)}", error)


def announced(directory: Path) -> dict[str, Any] | None:
    """What the sink running on ``directory`` announces (``url``, ``database``): None where no
    sink does (no file, or not one a sink wrote)."""
    try:
        sink = json.loads((directory / ENDPOINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return sink if isinstance(sink, dict) and isinstance(sink.get("url"), str) else None


def _answers(url: str) -> bool:
    """Whether a sink's SQL endpoint answers at ``url``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return "database" in json.load(response)
    except (OSError, ValueError, TypeError):
        return False


class SqlEndpoint:
    def __init__(self, location: StoreLocation, health: Callable[[], dict[str, Any]],
                 host: str = "127.0.0.1", port: int = 8124) -> None:
        self.location = location
        self.health = health
        self.host = host
        self.port = port
        self.url = ""
        self._store: Store | None = None
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen; return the endpoint's URL (the port is chosen when ``port`` is 0)."""
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/query", self._query)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        logger.info("analytics SQL endpoint at %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._store is not None:
            self._store.close()

    def write_discovery_file(self, directory: Path) -> bool:
        """Tell ``governor sql`` where this endpoint listens (``directory``'s ``ENDPOINT_FILE``);
        False, writing nothing, where the file names another sink's endpoint that answers: that
        sink holds the directory's store, which this one's will be refused (before 5 Dec a
        second sink wrote its own file, then deleted it as it stopped, and the running sink
        could no longer be found)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / ENDPOINT_FILE
        other = (announced(directory) or {}).get("url")
        if other not in (None, self.url) and _answers(other):
            return False
        write_atomically(path, json.dumps({"url": self.url, "database": self.location.database})
                         + "\n")  # readers never see half a file
        return True

    def remove_discovery_file(self, directory: Path) -> None:
        """Take back what ``write_discovery_file`` wrote, if the file still names this endpoint."""
        if (announced(directory) or {}).get("url") == self.url:
            (directory / ENDPOINT_FILE).unlink(missing_ok=True)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"database": self.location.database, **self.health()})

    async def _query(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":  # a browser page cannot send one unasked
            return web.json_response({"error": "send Content-Type: application/json"}, status=415)
        try:
            body = await request.json()
            sql, parameters = body["sql"], body.get("parameters") or None
            if not isinstance(sql, str) or not isinstance(parameters, dict | None):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response(
                {"error": 'send JSON: {"sql": "SELECT ...", "parameters": {...}}'}, status=400)
        if not self.health().get("ready", True):
            return web.json_response({"error": "the sink is still opening the store"}, status=503)
        async with self._lock:
            try:
                if self._store is None:
                    self._store = await asyncio.to_thread(Store.open, self.location, readonly=True)
                result = await asyncio.to_thread(guarded_query, self._store, sql, parameters)
            except BadQuery as exc:
                return web.json_response({"error": str(exc)}, status=400)
            except StoreError as exc:
                # a connection whose query failed is not used again: one cut off by a limit
                # left the embedded client's stream unreadable, failing the next caller's query
                self._store, failed = None, self._store
                if failed is not None:
                    await asyncio.to_thread(failed.close)
                bad = "DB::Exception" in str(exc) or isinstance(exc, UnreadableValue)
                status = 400 if bad else 503
                return web.json_response({"error": str(exc)}, status=status)
        return web.json_response(result.to_json())
