"""Streaming loaders for the request-trace formats Governor accepts, and a Governor JSONL writer.

Formats (detected from the first non-empty line of the file, see ``DESIGN.md`` "Trace formats"):

* ``azure``: Azure LLM inference trace CSV, header ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  TIMESTAMP like ``2023-11-16 18:15:46.6805900`` (7 fractional digits, parsed exactly to the ns).
* ``mooncake``: Mooncake JSONL, ``timestamp`` in ms, ``input_length``, ``output_length`` and
  ``hash_ids`` (one id per 512-token block); unknown fields are ignored, each named once in a
  warning as Governor JSONL's are.
* ``governor``: Governor JSONL, one :class:`~infra.traces.model.TraceRequest` per line
  (``arrival_s``, ``prompt_tokens``, ``output_tokens`` and the optional fields); unknown fields
  are ignored so the format can grow, each named once in a warning (a typo such as ``deadline``
  for ``deadline_s`` would otherwise drop the deadline unseen). A JSONL row that gives a field
  twice is refused (JSON parsers keep the last value).

Files are read line by line, never whole (``infra.traces.files``: a regular file, not
compressed, UTF-8, lines of at most ``MAX_LINE_CHARS``). Rows must be sorted by arrival (non-decreasing); a row
that goes back in time, a malformed row, a bad value or a row whose task an earlier row gave
another ``steps_total`` raises :class:`TraceError` naming the file, the line number, the field
and the (bounded) value. (The loader keeps one entry per task seen, for that last check.)
"""

from __future__ import annotations

import csv
import difflib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Any, Literal, TextIO

import orjson

from infra.paths import temp_beside
from infra.traces.files import csv_rows, open_trace, text_lines
from infra.traces.model import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MODEL,
    DEFAULT_TENANT,
    MAX_ARRIVAL_S,
    TraceError,
    TraceRequest,
)
from infra.wording import TO_USER

logger = logging.getLogger(__name__)

TraceFormat = Literal["azure", "mooncake", "governor"]
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# (ASCII: ``\d`` would take other scripts' digits too, which ``int`` reads: '١٠٠' as 100)
_AZURE_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?",
                       re.ASCII)
_INTEGER = re.compile(r"-?\d{1,18}", re.ASCII)
_MISSING: Any = object()
# Governor JSONL fields: name -> (kind, default). _MISSING marks a required field.
_GOVERNOR_FIELDS: dict[str, tuple[str, Any]] = {
    "arrival_s": ("time", _MISSING), "prompt_tokens": ("count", _MISSING),
    "output_tokens": ("count", _MISSING), "hash_ids": ("ids", ()),
    "block_size": ("positive", DEFAULT_BLOCK_SIZE), "tenant": ("str", DEFAULT_TENANT),
    "priority": ("int", 0), "model": ("str", DEFAULT_MODEL), "task_id": ("str", None),
    "step": ("positive", 1), "steps_total": ("positive", 1),
    "ttft_slo_s": ("duration", None), "deadline_s": ("duration", None),
}


_UNKNOWN_SAID = 20  # unknown fields of a JSONL trace named in a warning, at most


def _show(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, so one huge bad value cannot flood a log."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: Files of the shared data (``shared/data/traces``) that are no trace, by name: what
#: ``governor workload build KIND`` builds a trace from.
_WORKLOAD_DATA = {
    "servegen": re.compile(r"chunk-\d+-(trace\.csv|dataset\.json\.gz)"
                           r"|aggregate_rate_language_.+\.csv"),
    "sharegpt": re.compile(r"sharegpt_.*turn_lengths.*\.csv"),
}


def _workload_data(path: Path) -> TraceError | None:
    """The error for a file named as ServeGen or ShareGPT data, which is no trace but what
    ``workload build`` builds one from (before 7 Dec: "cannot tell the format", or for
    ServeGen's length tables "decompress it first", which gave no trace either); else None."""
    kind = next((kind for kind, name in _WORKLOAD_DATA.items() if name.fullmatch(path.name)),
                None)
    if kind is None:
        return None
    return TraceError(f"{path} is {'ServeGen' if kind == 'servegen' else 'ShareGPT'} data, not "
                      f"a trace: build a trace from it with `governor workload build {kind} "
                      "--out FILE`")


def detect_format(path: Path) -> TraceFormat:
    """Tell which trace format ``path`` holds from its first non-empty line.

    Raises:
        TraceError: the file is missing, empty, not text, or in none of the known formats.
    """
    path = Path(path)
    try:
        with open_trace(path) as fh:
            first = next((line.strip() for _, line in text_lines(path, fh) if line.strip()), "")
    except TraceError:
        data = _workload_data(path) if path.is_file() else None  # (compressed, not text)
        if data is None:
            raise
        raise data from None
    if not first:
        raise TraceError(f"trace file {path} is empty")
    columns = {column.strip() for column in next(csv.reader([first]))}
    if set(AZURE_COLUMNS) <= columns:
        return "azure"  # (its cells as the csv module reads them: quoted, as by QUOTE_ALL)
    if first.startswith("{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError as exc:
            if '"arrival_s"' in first or '"input_length"' in first:  # a row, but not valid JSON
                raise TraceError(f"{path} line 1: malformed JSON ({exc}; NaN, Infinity and "
                                 f"numbers past 1.8e308 are not JSON): {_show(first[:200], 200)}"
                                 ) from None
            obj = None
        if isinstance(obj, dict):  # a row of either with a field of its own: its loader names
            # what the row lacks (before 5 Dec a first row missing one could not be told apart)
            if obj.keys() & {"arrival_s", "prompt_tokens", "output_tokens"}:
                return "governor"
            if obj.keys() & set(MOONCAKE_FIELDS):
                return "mooncake"
    elif columns & set(AZURE_COLUMNS):  # (one of its columns: an Azure header, others misnamed)
        lacks = ", ".join(name for name in AZURE_COLUMNS if name not in columns)
        raise TraceError(f"{path} line 1: an Azure CSV header lacks {lacks} (it needs "
                         f"{','.join(AZURE_COLUMNS)}): {_show(first[:200], 200)}")
    raise _workload_data(path) or TraceError(
        f"cannot tell the format of trace file {path}: expected an Azure CSV header "
        f"{','.join(AZURE_COLUMNS)!r}, or a Mooncake or Governor JSON object; first line is "
        f"{_show(first[:200], 200)}"
    )


def _value(where: str, obj: dict[str, Any], name: str, kind: str, default: Any = _MISSING) -> Any:
    """Fetch and check field ``name`` of a JSON row; ``kind`` says which values are allowed."""
    value = obj.get(name)
    if value is None:
        if default is _MISSING:
            raise TraceError(f"{where}: field {name!r} is missing or null")
        return default
    bad = f"{where}: field {name!r} has value {_show(value)}"
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise TraceError(f"{bad}; expected a non-empty string")
        return value
    if kind == "ids":
        if not isinstance(value, list) or any(type(h) is not int for h in value):
            raise TraceError(f"{bad}; expected a list of integers, each from -2**63 to "
                             "2**64 - 1 (a JSON number past them is read as a float)")
        return tuple(value)
    timed = kind in ("time", "duration")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{bad}; expected {'a number' if timed else 'an integer'}")
    if timed:
        if value < 0 or (kind == "duration" and value == 0):
            raise TraceError(f"{bad}; expected a number {'>=' if kind == 'time' else '>'} 0")
        return float(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise TraceError(f"{bad}; expected an integer")
        value = int(value)
    if (kind == "count" and value < 0) or (kind == "positive" and value < 1):
        raise TraceError(f"{bad}; expected an integer >= {0 if kind == 'count' else 1}")
    return value


def _json_rows(path: Path, fh: TextIO) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Yield ``(line_no, where, object)`` for each non-empty line of a JSONL file."""
    for line_no, line in text_lines(path, fh):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            obj = orjson.loads(line.strip())
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{where}: malformed JSON at column {exc.colno} ({exc.msg}): "
                             f"{_show(line.strip())}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object, got {_show(obj)}")
        if line.count(":") != len(obj):  # (each key has its colon: a row with as many as keys
            _no_key_twice(where, line)   # has none twice; others are parsed again to tell)
        yield line_no, where, obj


def _no_key_twice(where: str, line: str) -> None:
    """A ``TraceError`` naming the first key that an object of ``line`` (valid JSON) holds
    twice: orjson keeps the last value without a word (``{"prompt_tokens": 10,
    "prompt_tokens": 20}`` read as 20)."""
    def pairs(items: list[tuple[str, Any]]) -> None:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise TraceError(f"{where}: field {_show(key)} is given twice; a row gives each "
                                 "field once")
            seen.add(key)

    try:  # (numbers not read: only keys matter, and int() limits digits)
        json.loads(line, object_pairs_hook=pairs, parse_int=len, parse_float=len)
    except RecursionError:
        raise TraceError(f"{where}: nested too deep to read") from None


def _past_a_year(where: str, field: str, raw: object, arrival_s: float) -> None:
    """An error naming the row's own field and value if it comes more than ``MAX_ARRIVAL_S``
    after the trace's first (``TraceRequest`` refuses it too, in seconds as ``arrival_s``)."""
    if arrival_s > MAX_ARRIVAL_S:
        raise TraceError(f"{where}: field {field!r} has value {_show(raw)}, {arrival_s:,.0f} s "
                         f"after the first row: past the {MAX_ARRIVAL_S:,.0f} s (a year) a "
                         "trace may span")


def _unsorted(where: str, field: str, raw: object) -> TraceError:
    return TraceError(f"{where}: field {field!r} has value {_show(raw)}, earlier than the row "
                      "before; traces must be sorted by arrival")


def _azure_ns(where: str, text: str) -> int:
    """Parse an Azure TIMESTAMP into integer nanoseconds (exact: floats would lose the 7th digit)."""
    match = _AZURE_TS.fullmatch(text.strip())
    try:
        if match is None:
            raise ValueError("not YYYY-MM-DD HH:MM:SS[.fraction]")
        day, hour, minute, second, fraction = match.groups()
        hms = int(hour) * 3600 + int(minute) * 60 + int(second)
        if int(hour) > 23 or int(minute) > 59 or int(second) > 59:
            raise ValueError("time of day out of range")
        seconds = date.fromisoformat(day).toordinal() * 86_400 + hms
    except ValueError as exc:
        raise TraceError(f"{where}: field 'TIMESTAMP' has value {_show(text)}; {exc}") from None
    return seconds * 1_000_000_000 + int((fraction or "0").ljust(9, "0"))


def count_cell(where: str, field: str, text: str | None) -> int:
    """A CSV cell of a count (tokens, a turn): an integer >= 0 in ASCII digits, else a
    ``TraceError`` naming ``where`` (the file and line), the field and the value."""
    if text is None or not _INTEGER.fullmatch(text.strip()) or int(text) < 0:
        raise TraceError(f"{where}: field {field!r} has value {_show(text)}; expected an integer >= 0")
    return int(text)


def _read_azure(path: Path, fh: TextIO) -> Iterator[TraceRequest]:
    rows = csv_rows(path, fh)
    _, header = next(rows, (0, []))
    columns = [cell.strip() for cell in header]
    twice = next((name for name in AZURE_COLUMNS if columns.count(name) > 1), None)
    if twice:  # (which of the two is meant is unknown)
        raise TraceError(f"{path} line 1: column {twice!r} is given twice in the header")
    ts_i, prompt_i, output_i = (columns.index(name) for name in AZURE_COLUMNS)
    first_ns = previous_ns = None
    for line_no, row in rows:
        where = f"{path} line {line_no}"
        if len(row) != len(columns):  # one more is a stray comma: which column moved is unknown
            raise TraceError(f"{where}: {len(row)} columns, expected {len(columns)} as in the header: "
                             f"{_show(row)}")
        ns = _azure_ns(where, row[ts_i])
        if previous_ns is not None and ns < previous_ns:
            raise _unsorted(where, "TIMESTAMP", row[ts_i])
        first_ns = ns if first_ns is None else first_ns
        previous_ns = ns
        _past_a_year(where, "TIMESTAMP", row[ts_i], (ns - first_ns) / 1e9)
        yield TraceRequest(arrival_s=(ns - first_ns) / 1e9,
                           prompt_tokens=count_cell(where, "ContextTokens", row[prompt_i]),
                           output_tokens=count_cell(where, "GeneratedTokens", row[output_i]))


#: A Mooncake row's fields.
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _read_mooncake(path: Path, fh: TextIO) -> Iterator[TraceRequest]:
    first_ms = previous_ms = None
    unknown: set[str] = set()
    for _, where, obj in _json_rows(path, fh):
        _say_unknown(where, obj, MOONCAKE_FIELDS, "Mooncake", unknown)  # (hash_id: no prefixes)
        ms = _value(where, obj, "timestamp", "time")
        if previous_ms is not None and ms < previous_ms:
            raise _unsorted(where, "timestamp", obj["timestamp"])
        first_ms = ms if first_ms is None else first_ms
        previous_ms = ms
        _past_a_year(where, "timestamp", obj["timestamp"], (ms - first_ms) / 1000.0)
        try:
            yield TraceRequest(arrival_s=(ms - first_ms) / 1000.0,
                               prompt_tokens=_value(where, obj, "input_length", "count"),
                               output_tokens=_value(where, obj, "output_length", "count"),
                               hash_ids=_value(where, obj, "hash_ids", "ids", ()),
                               block_size=DEFAULT_BLOCK_SIZE)
        except TraceError as exc:
            raise _located(where, exc) from None


#: Each task's ``steps_total`` and the row that first gave it, by ``(tenant, task_id)``.
_TaskSteps = dict[tuple[str, str], tuple[int, str]]


def _steps_clash(tasks: _TaskSteps, request: TraceRequest, row: str) -> str | None:
    """Why ``request`` (called ``row``) disagrees with an earlier row of its task on
    ``steps_total``, else None (its task's first row is recorded in ``tasks``). The simulator
    counts a task done after its ``steps_total`` steps and the router's task admission sizes a
    task by it: with two values, which one counts depends on the row read. A task is a
    tenant's, as the router and the streams key tasks: two tenants may use one ``task_id``."""
    if request.task_id is None:
        return None
    key = (request.tenant, request.task_id)
    steps_total, first = tasks.setdefault(key, (request.steps_total, row))
    if steps_total == request.steps_total:
        return None
    return (f"field 'steps_total' has value {request.steps_total}, but {first} gives task "
            f"{_show(request.task_id)} (tenant {_show(request.tenant)}) steps_total "
            f"{steps_total}; the rows of a task must agree on its number of steps")


def _say_unknown(where: str, obj: dict[str, Any], fields: Iterable[str], fmt: str,
                 unknown: set[str]) -> None:
    """Warn, once each (the first ``_UNKNOWN_SAID``), of the fields of ``obj`` that are not
    ``fields`` of format ``fmt``, which are ignored; ``unknown`` holds those said already."""
    for name in sorted(obj.keys() - set(fields) - unknown)[:_UNKNOWN_SAID - len(unknown)]:
        unknown.add(name)
        close = difflib.get_close_matches(name, fields, n=1)
        logger.warning("%s: field %s is not a %s field and is ignored%s", where, _show(name),
                       fmt, f" (did you mean {close[0]!r}?)" if close else "", extra=TO_USER)


def _read_governor(path: Path, fh: TextIO) -> Iterator[TraceRequest]:
    previous, unknown, tasks = -math.inf, set(), {}
    for line_no, where, obj in _json_rows(path, fh):
        _say_unknown(where, obj, _GOVERNOR_FIELDS, "Governor JSONL", unknown)
        values = {name: _value(where, obj, name, kind, default)
                  for name, (kind, default) in _GOVERNOR_FIELDS.items()}
        if values["arrival_s"] < previous:
            raise _unsorted(where, "arrival_s", obj["arrival_s"])
        previous = values["arrival_s"]
        try:
            request = TraceRequest(**values)
        except TraceError as exc:  # cross-field checks, e.g. step > steps_total
            raise _located(where, exc) from None
        clash = _steps_clash(tasks, request, f"line {line_no}")
        if clash:
            raise TraceError(f"{where}: {clash}")
        yield request


def _located(where: str, exc: TraceError) -> TraceError:
    """``exc`` with the file and line in front, once."""
    text = str(exc)
    return exc if text.startswith(where) else TraceError(f"{where}: {text}")


_READERS = {"azure": _read_azure, "mooncake": _read_mooncake, "governor": _read_governor}


def load_trace(path: str | Path, *, limit: int | None = None,
               max_duration_s: float | None = None) -> Iterator[TraceRequest]:
    """Stream the requests of a trace file in arrival order.

    The file is opened and its format detected at once (so a missing file fails here, not at the
    first ``next``); rows are then parsed lazily, one line at a time.

    Args:
        path: An Azure CSV, Mooncake JSONL or Governor JSONL file.
        limit: Stop after this many requests.
        max_duration_s: Stop at the first request with ``arrival_s >= max_duration_s``.

    Raises:
        TraceError: missing or unrecognised file, malformed or unsorted row, bad argument.
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise TraceError(f"limit must be >= 0, got {limit!r}")
    if max_duration_s is not None and not max_duration_s >= 0:
        raise TraceError(f"max_duration_s must be >= 0, got {max_duration_s!r}")
    fmt = detect_format(path)
    logger.debug("loading %s trace %s (limit=%s, max_duration_s=%s)", fmt, path, limit, max_duration_s)
    return _stream(path, fmt, limit, max_duration_s)


def _stream(path: Path, fmt: TraceFormat, limit: int | None,
            max_duration_s: float | None) -> Iterator[TraceRequest]:
    count = 0
    if limit == 0:
        return
    with open_trace(path) as fh:
        for request in _READERS[fmt](path, fh):
            if max_duration_s is not None and request.arrival_s >= max_duration_s:
                break
            count += 1
            yield request
            if limit is not None and count >= limit:
                break
    logger.debug("loaded %d requests from %s", count, path)


#: What each format calls a request's fields (Governor JSONL: by their own names).
FILE_FIELDS: dict[str, dict[str, str]] = {
    "azure": {"arrival_s": "TIMESTAMP", "prompt_tokens": "ContextTokens",
              "output_tokens": "GeneratedTokens"},
    "mooncake": {"arrival_s": "timestamp", "prompt_tokens": "input_length",
                 "output_tokens": "output_length"},
    "governor": {},
}


def request_row(path: str | Path, index: int) -> tuple[str, dict[str, str]]:
    """Where request ``index`` (0-based, in ``load_trace``'s order) stands in the trace at
    ``path``, as the loaders' errors say it (``PATH line N``), and what its format calls each
    field (``FILE_FIELDS``): for an error found in a request after it was loaded (a value past
    a request's limits), so that it names the line and the column the file has, not an index
    that blank lines and the header put off. Only the file's name if it no longer holds the
    row."""
    path = Path(path)
    try:
        fmt = detect_format(path)
        with open_trace(path) as fh:
            if fmt == "azure":
                filled = (n for n, _ in csv_rows(path, fh))
                next(filled, None)  # the header
            else:
                filled = (n for n, line in text_lines(path, fh) if line.strip())
            line = next((n for i, n in enumerate(filled) if i == index), None)
    except TraceError:
        fmt, line = "governor", None
    where = f"{path} line {line}" if line is not None else str(path)
    return where, FILE_FIELDS[fmt]


def write_governor_jsonl(requests: Iterable[TraceRequest], path: str | Path) -> int:
    """Write ``requests`` as Governor JSONL; return how many were written.

    Fields equal to their default (and ``None`` SLOs) are left out; ``load_trace`` reads the file
    back to equal requests. The file is written to a temporary name of its own beside it
    (``infra.paths.temp_beside``) and renamed into place.

    Raises:
        TraceError: the requests are not sorted by arrival, or rows of one task disagree on
            its ``steps_total`` (``load_trace`` would reject the file), or the file cannot be
            written there.
    """
    path = Path(path)
    if path.is_dir():
        raise TraceError(f"{path} is a folder; give a file name")
    tmp = temp_beside(path)
    count, previous, tasks = 0, -math.inf, {}
    try:
        with tmp.open("xb") as fh:
            for request in requests:
                if request.arrival_s < previous:
                    raise TraceError(f"request {count} arrives at {request.arrival_s} s, before "
                                     f"the one before it ({previous} s); sort requests by arrival")
                previous = request.arrival_s
                clash = _steps_clash(tasks, request, f"request {count}")
                if clash:
                    raise TraceError(f"request {count}: {clash}")
                row: dict[str, Any] = {"arrival_s": request.arrival_s,
                                       "prompt_tokens": request.prompt_tokens,
                                       "output_tokens": request.output_tokens}
                for name, (_, default) in _GOVERNOR_FIELDS.items():
                    value = getattr(request, name)
                    if name not in row and value != default:
                        row[name] = list(value) if name == "hash_ids" else value
                try:
                    fh.write(orjson.dumps(row) + b"\n")
                except orjson.JSONEncodeError as exc:
                    raise TraceError(f"request {count} cannot be written as JSON: {exc}") from None
                count += 1
        os.replace(tmp, path)
    except OSError as exc:
        raise TraceError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # (its folder is no folder: nothing was written to clean up)
            pass
    logger.debug("wrote %d requests to %s", count, path)
    return count
