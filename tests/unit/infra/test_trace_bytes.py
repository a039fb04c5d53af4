"""Trace files as bytes: encodings, line endings, compression and line length, for the three
formats alike (``infra.traces.loaders``)."""

import bz2
import gzip
import lzma
from pathlib import Path

import pytest

from infra.traces import TraceError, load_trace
from infra.traces import files

ROWS = {
    "azure.csv": ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.0,100,10",
                  "2023-11-16 18:15:47.0,200,20", "2023-11-16 18:15:48.0,300,30"],
    "mooncake.jsonl": ['{"timestamp": 0, "input_length": 100, "output_length": 10}',
                       '{"timestamp": 1000, "input_length": 200, "output_length": 20}',
                       '{"timestamp": 2000, "input_length": 300, "output_length": 30}'],
    "governor.jsonl": ['{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 10}',
                       '{"arrival_s": 1, "prompt_tokens": 200, "output_tokens": 20}',
                       '{"arrival_s": 2, "prompt_tokens": 300, "output_tokens": 30}'],
}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ROWS)
def test_a_line_that_is_not_utf8_is_named(tmp_path: Path, name: str):
    """Before, the file's first 8 KiB were decoded as its format was told, and a bad byte on
    line 3 was only ``trace file ... is not UTF-8 text: 'utf-8' codec can't decode byte 0xff in
    position 191``: no line, a position in a buffer."""
    lines = [line.encode() for line in ROWS[name]]
    lines[-1] = lines[-1].replace(b"0", b"\xff", 1)
    path = _write(tmp_path, name, b"\n".join(lines) + b"\n")
    with pytest.raises(TraceError, match=rf"^{path} line {len(lines)}: not UTF-8 text "
                                         r"\(byte 0xff at column \d+\)$"):
        list(load_trace(path))


@pytest.mark.parametrize(("compress", "kind"), [(gzip.compress, "gzip"), (bz2.compress, "bzip2"),
                                                 (lzma.compress, "xz")])
def test_a_compressed_trace_is_named_so(tmp_path: Path, compress, kind: str):
    """Before: ``is not UTF-8 text: 'utf-8' codec can't decode byte 0x8b in position 1``."""
    data = compress(("\n".join(ROWS["governor.jsonl"]) + "\n").encode())
    path = _write(tmp_path, "trace.jsonl.gz", data)
    with pytest.raises(TraceError, match=rf"^trace file {path} is {kind}-compressed; "
                                         "decompress it first"):
        load_trace(path)


@pytest.mark.parametrize("name", ROWS)
def test_a_line_past_the_length_limit_is_refused_before_it_is_read_whole(
        tmp_path: Path, name: str, monkeypatch):
    """A file of one huge line (a JSON array dumped whole, say) was read whole into memory
    before it was judged; a line is now read at most ``MAX_LINE_CHARS`` + 1 characters."""
    monkeypatch.setattr(files, "MAX_LINE_CHARS", 200)
    lines = list(ROWS[name])
    lines.insert(2, " " * 300 + lines[1])
    path = _write(tmp_path, name, ("\n".join(lines) + "\n").encode())
    with pytest.raises(TraceError, match=rf"^{path} line 3: longer than 200 characters"):
        list(load_trace(path))
    one_line = _write(tmp_path, "array.json", b"[" + b"{}, " * 10_000 + b"{}]")
    with pytest.raises(TraceError, match=rf"^{one_line} line 1: longer than 200 characters"):
        load_trace(one_line)


@pytest.mark.parametrize("name", ROWS)
def test_a_bom_and_crlf_line_ends_read_as_plain_text(tmp_path: Path, name: str):
    plain = _write(tmp_path, "plain-" + name, ("\n".join(ROWS[name]) + "\n").encode())
    windows = _write(tmp_path, "windows-" + name,
                     b"\xef\xbb\xbf" + ("\r\n".join(ROWS[name]) + "\r\n").encode())
    assert list(load_trace(windows)) == list(load_trace(plain))
    assert len(list(load_trace(plain))) == 3


def test_an_azure_csv_with_every_cell_quoted_is_read(tmp_path: Path):
    """As pandas' ``to_csv(quoting=QUOTE_ALL)`` writes it: before, its header was split on
    commas with the quotes kept, and the file was ``cannot tell the format``."""
    quoted = "\n".join(",".join(f'"{cell}"' for cell in line.split(","))
                       for line in ROWS["azure.csv"]) + "\n"
    plain = _write(tmp_path, "plain.csv", ("\n".join(ROWS["azure.csv"]) + "\n").encode())
    assert list(load_trace(_write(tmp_path, "quoted.csv", quoted.encode()))) == \
        list(load_trace(plain))


@pytest.mark.parametrize(("row", "field"), [
    ("2023-11-16 18:15:47.0,١٠٠,10", "ContextTokens"),  # Arabic-Indic 100
    ("2023-11-16 18:15:47.0,100,１０", "GeneratedTokens"),  # fullwidth 10
    ("2023-11-16 18:15:4٧.0,100,10", "TIMESTAMP")])
def test_an_azure_cell_of_other_digits_than_ascii_is_refused(tmp_path: Path, row: str,
                                                             field: str):
    """Before, ``١٠٠`` was read as 100 tokens (``\\d`` matches any script's digits, which
    ``int`` reads), where a JSON trace's numbers are ASCII."""
    path = _write(tmp_path, "a.csv", (ROWS["azure.csv"][0] + "\n" + ROWS["azure.csv"][1] + "\n"
                                      + row + "\n").encode())
    with pytest.raises(TraceError, match=rf"^{path} line 3: field '{field}' has value"):
        list(load_trace(path))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="no /proc/self/fd")
@pytest.mark.parametrize("name", ROWS)
def test_a_trace_from_a_pipe_is_refused_not_read_in_part(tmp_path: Path, name: str):
    """``governor sim <(zcat trace.jsonl.gz)`` or ``... | governor sim /dev/stdin``: the file
    is opened once to tell its format, then again for its rows, and a pipe opened again goes on
    where the first read stopped. Before, the rows began mid-line (``line 1: malformed JSON``)
    or, where a buffer ended on a line's end, the first rows were lost without a word."""
    import os
    import threading

    text = ("\n".join(ROWS[name][:1] + ROWS[name][1:] * 2000) + "\n").encode()
    read_end, write_end = os.pipe()

    def write() -> None:
        try:
            os.write(write_end, text)  # (blocks while the pipe is full and read)
        except BrokenPipeError:
            pass
        finally:
            os.close(write_end)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        path = Path(f"/proc/self/fd/{read_end}")
        with pytest.raises(TraceError, match=rf"^trace file {path} is no regular file \(a pipe"):
            list(load_trace(path))
    finally:
        os.close(read_end)
        writer.join(timeout=10)
    assert not writer.is_alive()


def test_an_unknown_mooncake_field_is_named_once(tmp_path: Path, caplog):
    """``hash_id`` for ``hash_ids``: before, ignored without a word, and the trace simulated
    with no prefix sharing at all (Governor JSONL warned of such a field already)."""
    import logging

    text = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_id": [1, 2]}\n'
            '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_id": [1, 3]}\n')
    with caplog.at_level(logging.WARNING, logger="infra.traces.loaders"):
        rows = list(load_trace(_write(tmp_path, "m.jsonl", text.encode())))
    assert [r.hash_ids for r in rows] == [(), ()]  # ignored, as unknown fields are
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}/m.jsonl line 1: field 'hash_id' is not a Mooncake field and is ignored "
        "(did you mean 'hash_ids'?)"]


@pytest.mark.parametrize("name,row,key", [
    ("mooncake.jsonl", '{"timestamp": 3000, "input_length": 10, "input_length": 20, '
                       '"output_length": 5}', "input_length"),
    ("governor.jsonl", '{"arrival_s": 3, "prompt_tokens": 10, "prompt_tokens": 20, '
                       '"output_tokens": 5}', "prompt_tokens"),
    ("governor.jsonl", '{"arrival_s": 3, "prompt_tokens": 10, "tenant": "a:b", '
                       '"output_tokens" : 5, "tenant": "c"}', "tenant"),  # (a colon in a value)
])
def test_a_field_given_twice_in_a_row_is_refused(tmp_path: Path, name: str, row: str, key: str):
    """Before, the last value was taken without a word (orjson, as Python's json, keeps it):
    ``"prompt_tokens": 10, "prompt_tokens": 20`` read as 20."""
    path = _write(tmp_path, name, "\n".join([*ROWS[name], row]).encode() + b"\n")
    with pytest.raises(TraceError, match=rf"^{path} line 4: field '{key}' is given twice"):
        list(load_trace(path))


def test_a_colon_in_a_value_is_no_field_given_twice(tmp_path: Path):
    """Rows with more colons than fields are parsed again to tell; a colon in a string
    value is no field given twice."""
    row = '{"arrival_s": 3, "prompt_tokens": 10, "output_tokens": 5, "task_id": "t:1:2"}'
    path = _write(tmp_path, "governor.jsonl",
                  "\n".join([*ROWS["governor.jsonl"], row]).encode() + b"\n")
    assert [r.task_id for r in load_trace(path)] == [None, None, None, "t:1:2"]
