"""Trace files as lines of text, for the loaders (``infra.traces.loaders``): a regular file,
not compressed, read as UTF-8 one line at a time, each line at most ``MAX_LINE_CHARS``; what
breaks one of these is a ``TraceError`` naming the file and, where it is in one, the line."""

from __future__ import annotations

import csv
import itertools
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from infra.traces.model import TraceError

#: The longest line a trace may have, in characters: a valid request's row is far shorter
#: (a request record is at most 1,000,000 bytes), and a file of one huge line (a JSON array
#: rather than JSON Lines) is refused before it is read whole into memory.
MAX_LINE_CHARS = 16 * 1024 * 1024
#: How compressed files begin, and what to call them.
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz",
               b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
_UNDECODABLE = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of a byte not UTF-8


def open_trace(path: Path) -> TextIO:
    """Open a trace for reading text, with clear errors for a missing, unreadable or compressed
    file. Bytes that are not UTF-8 are kept as escapes (``surrogateescape``), for ``text_lines`` to
    name the line that holds them."""
    try:
        fh = path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    except IsADirectoryError:
        raise TraceError(f"trace file {path} is a folder; give a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror or exc}") from None
    try:
        regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
        head = fh.buffer.peek(8)[:8] if regular else b""
    except OSError as exc:
        fh.close()
        raise TraceError(f"cannot read trace file {path}: {exc.strerror or exc}") from None
    if not regular:  # (read again from its start, a pipe would go on where the first read
        fh.close()   # stopped: rows lost, or a row cut in two)
        raise TraceError(f"trace file {path} is no regular file (a pipe, such as <(zcat ...), "
                         "or a device): a trace is read more than once, for its format, then "
                         "its rows; write it to a file first")
    kind = next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)
    if kind:
        fh.close()
        raise TraceError(f"trace file {path} is {kind}-compressed; decompress it first "
                         "(traces are read as text)")
    return fh


def text_lines(path: Path, fh: TextIO) -> Iterator[tuple[int, str]]:
    """``(line_no, line)`` for each line of a trace opened by ``open_trace``; a line that is not
    UTF-8 text or longer than ``MAX_LINE_CHARS`` is a ``TraceError`` naming it."""
    for line_no in itertools.count(1):
        line = fh.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_LINE_CHARS:
            raise TraceError(f"{path} line {line_no}: longer than {MAX_LINE_CHARS:,} characters, "
                             "which no request's row needs (a trace holds one request a line)")
        bad = None if line.isascii() else _UNDECODABLE.search(line)
        if bad:
            raise TraceError(f"{path} line {line_no}: not UTF-8 text (byte "
                             f"0x{ord(bad.group()) - 0xdc00:02x} at column {bad.start() + 1})")
        yield line_no, line


def csv_rows(path: Path, fh: TextIO) -> Iterator[tuple[int, list[str]]]:
    """``(line_no, cells)`` for each row of a CSV file with a cell that is not blank; a row
    the csv module cannot read (a NUL byte, a cell past its field size limit) is a
    ``TraceError`` naming its line."""
    reader = csv.reader(line for _, line in text_lines(path, fh))
    while True:
        try:
            row = next(reader, None)
        except csv.Error as exc:
            raise TraceError(f"{path} line {reader.line_num}: not a CSV row: {exc}") from None
        if row is None:
            return
        if any(cell.strip() for cell in row):
            yield reader.line_num, row
