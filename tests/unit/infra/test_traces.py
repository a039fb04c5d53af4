"""Tests of infra.traces: format detection, the three loaders, the Governor JSONL writer and the
built-in Azure-like synthetic workload (plus the real traces in ../shared/data when present)."""

from __future__ import annotations

import gzip
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.traces import (
    TraceError,
    TraceRequest,
    azure_like_workload,
    detect_format,
    load_trace,
    lognormal_from_quantiles,
    write_governor_jsonl,
)
from infra.traces.model import MAX_ARRIVAL_S
from schemas.errors import TerminalError

REPO_ROOT = Path(__file__).resolve().parents[3]
SHARED_TRACES = REPO_ROOT.parent / "shared" / "data" / "traces"
AZURE_FILE = SHARED_TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE_FILE = SHARED_TRACES / "mooncake_fast25" / "conversation_trace.jsonl"

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_SMALL = AZURE_HEADER + (
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:47.0000001,396,109\n"
    "\n"
    "2023-11-16 23:59:59.5000000,1000,0\n"
    "2023-11-17 00:00:00.2500000,7,8\n"
)
MOONCAKE_SMALL = (
    '{"timestamp": 1000, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
    '{"timestamp": 2500, "input_length": 512, "output_length": 50, "hash_ids": [0]}\n'
    '{"timestamp": 2500, "input_length": 10, "output_length": 1}\n'
)
GOVERNOR_SMALL = (
    '{"arrival_s": 2.5, "prompt_tokens": 100, "output_tokens": 10}\n'
    '{"arrival_s": 3.0, "prompt_tokens": 200, "output_tokens": 20, "hash_ids": [7, 8],'
    ' "block_size": 128, "tenant": "acme", "priority": 2, "model": "llama-3-70b",'
    ' "task_id": "t1", "step": 2, "steps_total": 3, "ttft_slo_s": 0.5, "deadline_s": 30,'
    ' "comment": "unknown fields are ignored"}\n'
    '{"arrival_s": 4, "prompt_tokens": 300.0, "output_tokens": 30, "task_id": null}\n'
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- format detection --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (AZURE_SMALL, "azure"),
        ("\n\n" + AZURE_SMALL, "azure"),
        ("\ufeff" + AZURE_SMALL, "azure"),
        (MOONCAKE_SMALL, "mooncake"),
        (GOVERNOR_SMALL, "governor"),
    ],
)
def test_detect_format(tmp_path: Path, text: str, expected: str) -> None:
    assert detect_format(write(tmp_path, "trace.txt", text)) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("\n  \n", "empty"),
        ("a,b,c\n1,2,3\n", "'a,b,c'"),
        ('{"foo": 1}\n', "foo"),
        ("[1, 2, 3]\n", "[1, 2, 3]"),
        ("{not json\n", "{not json"),
    ],
)
def test_detect_format_rejects_unknown(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, "odd.txt", text)
    with pytest.raises(TraceError) as info:
        detect_format(path)
    assert str(path) in str(info.value) and needle in str(info.value)


@pytest.mark.parametrize(("header", "says"), [
    ("TIMESTAMP,Context,Generated", "line 1: an Azure CSV header lacks ContextTokens, "
     "GeneratedTokens (it needs TIMESTAMP,ContextTokens,GeneratedTokens): "
     "'TIMESTAMP,Context,Generated'"),
    ("TIMESTAMP,ContextTokens", "line 1: an Azure CSV header lacks GeneratedTokens (it needs "
     "TIMESTAMP,ContextTokens,GeneratedTokens): 'TIMESTAMP,ContextTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens",
     "line 1: column 'ContextTokens' is given twice in the header"),
])
def test_an_azure_header_with_a_column_misnamed_or_twice_is_named(tmp_path: Path, header: str,
                                                                 says: str) -> None:
    """Before, a misnamed column was "cannot tell the format", and a column given twice was
    read from its first place without a word."""
    path = write(tmp_path, "a.csv", f"{header}\n2023-11-16 18:15:46.6805900,374,44,7\n")
    with pytest.raises(TraceError) as info:
        list(load_trace(path))
    assert str(info.value) == f"{path} {says}"


@pytest.mark.parametrize(("name", "content", "kind"), [
    ("sharegpt_v3_turn_lengths_cl100k.csv",
     b"conversation_id,turn,user_tokens_cl100k,assistant_tokens_cl100k\nc1,0,40,60\n", "sharegpt"),
    ("aggregate_rate_language_m-mid.csv", b"window_start_s,total_rate_rps\n0,1.5\n", "servegen"),
    ("chunk-7-trace.csv", b"0,0.5,1.2,Gamma,0.7,2.8\n", "servegen"),
    ("chunk-7-dataset.json.gz", gzip.compress(b'{"0": {"input_tokens": "{1: 1.0}"}}'), "servegen"),
])
def test_workload_data_given_as_a_trace_says_how_to_build_one(tmp_path: Path, name: str,
                                                              content: bytes, kind: str) -> None:
    """The shared data's ServeGen and ShareGPT files are no traces: before, the error was the
    format's, or for ServeGen's length tables "decompress it first", which gave no trace
    either."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    said = "ServeGen" if kind == "servegen" else "ShareGPT"
    assert str(info.value) == (f"{path} is {said} data, not a trace: build a trace from it "
                               f"with `governor workload build {kind} --out FILE`")


def test_a_trace_named_as_workload_data_is_read_as_a_trace(tmp_path: Path) -> None:
    path = write(tmp_path, "chunk-7-trace.csv", AZURE_SMALL)
    assert len(list(load_trace(path))) == 4
    with pytest.raises(TraceError, match="trace file not found"):
        load_trace(tmp_path / "chunk-8-trace.csv")


@pytest.mark.parametrize("ids", ["[100000000000000000000000]", "[1.5]", '"1,2"'])
def test_hash_ids_that_are_no_64_bit_integers_are_named_with_the_range(tmp_path: Path,
                                                                       ids: str) -> None:
    """An id past 64 bits is read as a float (shown ``1e+23``): before, the error said only
    "expected a list of integers", of an integer as written."""
    path = write(tmp_path, "t.jsonl", '{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 1, '
                                      f'"hash_ids": {ids}}}\n')
    with pytest.raises(TraceError, match=r"line 1: field 'hash_ids' has value .*; expected a list "
                                         r"of integers, each from -2\*\*63 to 2\*\*64 - 1 \(a JSON "
                                         r"number past them is read as a float\)$"):
        list(load_trace(path))


def test_detect_format_bounds_what_it_shows(tmp_path: Path) -> None:
    path = write(tmp_path, "long.txt", "x" * 10_000 + "\n")
    with pytest.raises(TraceError) as info:
        detect_format(path)
    assert len(str(info.value)) < 600


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found"):
        load_trace(tmp_path / "nope.csv")  # eager: fails before the first next()
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 100)
    with pytest.raises(TraceError, match="not UTF-8"):
        detect_format(binary)
    with pytest.raises(TraceError) as info:
        detect_format(tmp_path)  # a folder: said so once (before, with its errno and path again)
    assert str(info.value) == f"trace file {tmp_path} is a folder; give a trace file"
    assert issubclass(TraceError, TerminalError)


# --- the three formats -------------------------------------------------------------------------


def test_azure_small_file(tmp_path: Path) -> None:
    requests = list(load_trace(write(tmp_path, "a.csv", AZURE_SMALL)))
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [
        (374, 44), (396, 109), (1000, 0), (7, 8)]
    # Relative to the first row, exact to the 7th fractional digit, across midnight.
    expected = [0.0, 0.3194101, 20652.8194100, 20653.5694100]
    assert [r.arrival_s for r in requests] == pytest.approx(expected, abs=1e-9)
    assert all(r.hash_ids == () and r.tenant == "default" for r in requests)


def test_azure_columns_found_by_name(tmp_path: Path) -> None:
    text = "GeneratedTokens,TIMESTAMP,ContextTokens,Extra\n5,2023-11-16 18:15:46,7,x\n"
    (request,) = load_trace(write(tmp_path, "a.csv", text))
    assert (request.arrival_s, request.prompt_tokens, request.output_tokens) == (0.0, 7, 5)


def test_mooncake_small_file(tmp_path: Path) -> None:
    requests = list(load_trace(write(tmp_path, "m.jsonl", MOONCAKE_SMALL)))
    assert [r.arrival_s for r in requests] == [0.0, 1.5, 1.5]
    assert [r.hash_ids for r in requests] == [(0, 1, 2), (0,), ()]
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(1025, 5), (512, 50), (10, 1)]
    assert all(r.block_size == 512 for r in requests)


def test_governor_small_file(tmp_path: Path) -> None:
    first, second, third = load_trace(write(tmp_path, "g.jsonl", GOVERNOR_SMALL))
    assert first == TraceRequest(arrival_s=2.5, prompt_tokens=100, output_tokens=10)  # kept as written
    assert second == TraceRequest(
        arrival_s=3.0, prompt_tokens=200, output_tokens=20, hash_ids=(7, 8), block_size=128,
        tenant="acme", priority=2, model="llama-3-70b", task_id="t1", step=2, steps_total=3,
        ttft_slo_s=0.5, deadline_s=30.0)
    assert third.prompt_tokens == 300 and type(third.prompt_tokens) is int
    assert type(third.arrival_s) is float and third.task_id is None


LIMIT_CASES = [
    ({}, 5),
    ({"limit": 2}, 2),
    ({"limit": 0}, 0),
    ({"limit": 99}, 5),
    ({"max_duration_s": 2.5}, 3),
    ({"max_duration_s": 2.0}, 2),  # arrival_s >= max_duration_s stops
    ({"max_duration_s": 0.0}, 0),
    ({"limit": 1, "max_duration_s": 10.0}, 1),
]


@pytest.mark.parametrize(("kwargs", "expected"), LIMIT_CASES)
def test_limit_and_max_duration(tmp_path: Path, kwargs: dict, expected: int) -> None:
    lines = [f'{{"arrival_s": {t}, "prompt_tokens": 1, "output_tokens": 1}}\n' for t in range(5)]
    path = write(tmp_path, "g.jsonl", "".join(lines))
    assert len(list(load_trace(path, **kwargs))) == expected


def test_limit_stops_before_a_later_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:46.1,1,1\n"
                 "2023-11-16 18:15:47.1,1,1\ngarbage\n")
    assert len(list(load_trace(path, limit=2))) == 2
    with pytest.raises(TraceError, match="line 4"):
        list(load_trace(path))


@pytest.mark.parametrize("kwargs", [{"limit": -1}, {"max_duration_s": -1.0},
                                    {"max_duration_s": math.nan}])
def test_bad_arguments(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(TraceError):
        load_trace(write(tmp_path, "m.jsonl", MOONCAKE_SMALL), **kwargs)


# --- bad rows ----------------------------------------------------------------------------------

TS = "2023-11-16 18:15:46.6805900"
M_OK = '{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
G_OK = '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1}\n'
TASK_T1_OF_3 = ('{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1, "task_id": "t1",'
                ' "steps_total": 3}\n')
BAD_ROWS = [
    # (file name, content, line number, words the message must hold)
    ("a.csv", AZURE_HEADER + f"{TS},12x,4\n", 2, ["ContextTokens", "12x"]),
    ("a.csv", AZURE_HEADER + f"{TS},1,4\n{TS},1,-4\n", 3, ["GeneratedTokens", "-4"]),
    ("a.csv", AZURE_HEADER + f"{TS},1,2.5\n", 2, ["GeneratedTokens", "2.5"]),
    ("a.csv", AZURE_HEADER + "2023-13-16 18:15:46.1,1,1\n", 2, ["TIMESTAMP", "2023-13-16"]),
    ("a.csv", AZURE_HEADER + "yesterday,1,1\n", 2, ["TIMESTAMP", "yesterday"]),
    ("a.csv", AZURE_HEADER + f"{TS},1,1\n2023-11-16 18:15:46.5,1,1\n", 3, ["TIMESTAMP", "sorted"]),
    ("a.csv", AZURE_HEADER + f"{TS},1\n", 2, ["columns"]),
    ("a.csv", AZURE_HEADER + f"{TS},1,1\n{TS},1,2,3\n", 3, ["4 columns, expected 3"]),
    ("a.csv", AZURE_HEADER + f"{TS},{'9' * 5000},1\n", 2, ["ContextTokens", "999..."]),
    ("m.jsonl", M_OK + '{"timestamp": 5, "input_length": 1\n', 2, ["malformed JSON"]),
    ("m.jsonl", M_OK + '{"timestamp": 5, "input_length": "abc", "output_length": 1}\n', 2,
     ["input_length", "abc"]),
    ("m.jsonl", M_OK + '{"timestamp": 5, "input_length": 1, "output_length": -1}\n', 2,
     ["output_length", "-1"]),
    ("m.jsonl", M_OK + '{"timestamp": 5, "output_length": 1}\n', 2, ["input_length", "missing"]),
    ("m.jsonl", '{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1, "x"]}\n',
     1, ["hash_ids", "'x'"]),
    ("m.jsonl", '{"timestamp": 5000, "input_length": 1, "output_length": 1}\n' + M_OK, 2,
     ["timestamp", "sorted"]),
    ("m.jsonl", M_OK + "[1, 2]\n", 2, ["JSON object"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": -5, "output_tokens": 1}\n', 2,
     ["prompt_tokens", "-5"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1.5}\n', 2,
     ["output_tokens", "1.5"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": true, "output_tokens": 1}\n', 2,
     ["prompt_tokens", "True"]),
    ("g.jsonl", G_OK + '{"arrival_s": "soon", "prompt_tokens": 5, "output_tokens": 1}\n', 2,
     ["arrival_s", "soon"]),
    ("g.jsonl", G_OK + '{"arrival_s": 0.5, "prompt_tokens": 5, "output_tokens": 1}\n', 2,
     ["arrival_s", "sorted"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1, "tenant": 3}\n',
     2, ["tenant", "3"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1, "step": 3,'
     ' "steps_total": 2}\n', 2, ["step", "steps_total"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1,'
     ' "deadline_s": 0}\n', 2, ["deadline_s", "0"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1,'
     ' "block_size": 0}\n', 2, ["block_size", "0"]),
    ("g.jsonl", G_OK + '{"arrival_s": NaN, "prompt_tokens": 5, "output_tokens": 1}\n', 2,
     ["malformed JSON"]),
    # on the first line too (before 5 Dec: "cannot tell the format")
    ("g.jsonl", '{"arrival_s": NaN, "prompt_tokens": 5, "output_tokens": 1}\n', 1,
     ["malformed JSON", "NaN"]),
    ("m.jsonl", '{"timestamp": 0, "input_length": 1e400, "output_length": 1}\n', 1,
     ["malformed JSON"]),
    # a first row missing a field its format needs (before 5 Dec: "cannot tell the format")
    ("g.jsonl", '{"prompt_tokens": 5, "output_tokens": 1}\n', 1, ["arrival_s", "missing"]),
    ("g.jsonl", '{"arrival_s": 0, "output_tokens": 1}\n', 1, ["prompt_tokens", "missing"]),
    ("m.jsonl", '{"timestamp": 0, "output_length": 1}\n', 1, ["input_length", "missing"]),
    # more prefix blocks than the prompt has (the live schema refuses such a request)
    ("m.jsonl", M_OK + '{"timestamp": 5, "input_length": 100, "output_length": 1,'
     ' "hash_ids": [1, 2, 3, 4]}\n', 2, ["hash_ids", "4 ids", "at most 1 blocks of 512"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 100, "output_tokens": 1,'
     ' "block_size": 64, "hash_ids": [1, 2, 3]}\n', 2, ["hash_ids", "at most 2 blocks of 64"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1,'
     ' "block_size": 100000}\n', 2, ["block_size", "at most 4096"]),
    # a row more than a year after the first, named in the file's own field and unit (before
    # 6 Dec an Azure row's error named no file or line, and both said 'arrival_s' in seconds)
    ("a.csv", AZURE_HEADER + f"{TS},1,1\n2025-11-16 18:15:46.6805900,1,1\n", 3,
     ["'TIMESTAMP'", "'2025-11-16 18:15:46.6805900'", "63,158,400 s after the first row",
      "a year"]),
    ("m.jsonl", M_OK + '{"timestamp": 40000000000, "input_length": 1, "output_length": 1}\n', 2,
     ["'timestamp'", "40000000000", "40,000,000 s after the first row", "a year"]),
    # task rows that contradict themselves or each other (before 5 Dec all were loaded)
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1, "step": 2,'
     ' "steps_total": 3}\n', 2, ["field 'step' is 2", "'task_id' is missing"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1,'
     ' "steps_total": 3}\n', 2, ["field 'steps_total' is 3", "'task_id' is missing"]),
    ("g.jsonl", G_OK + '{"arrival_s": 2, "prompt_tokens": 5, "output_tokens": 1,'
     ' "ttft_slo_s": 5, "deadline_s": 2.5}\n', 2, ["'ttft_slo_s' (5) exceeds 'deadline_s' (2.5)"]),
    ("g.jsonl", G_OK + TASK_T1_OF_3 + '{"arrival_s": 3, "prompt_tokens": 5, "output_tokens": 1,'
     ' "task_id": "t1", "step": 2, "steps_total": 4}\n', 3,
     ["field 'steps_total' has value 4", "line 2 gives task 't1'", "steps_total 3"]),
]


@pytest.mark.parametrize(("name", "text", "line", "words"), BAD_ROWS)
def test_bad_rows(tmp_path: Path, name: str, text: str, line: int, words: list[str]) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(TraceError) as info:
        list(load_trace(path))
    message = str(info.value)
    assert str(path) in message and f"line {line}" in message
    for word in words:
        assert word in message


def test_bad_value_is_bounded_in_message(tmp_path: Path) -> None:
    text = G_OK + '{"arrival_s": 2, "prompt_tokens": "' + "9" * 5000 + 'z", "output_tokens": 1}\n'
    with pytest.raises(TraceError) as info:
        list(load_trace(write(tmp_path, "g.jsonl", text)))
    assert "prompt_tokens" in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("kwargs", [
    {"arrival_s": -1.0}, {"arrival_s": math.inf}, {"arrival_s": 1e300},  # (replay waited for ever)
    {"arrival_s": 365 * 86_400.0 + 1}, {"prompt_tokens": -1}, {"output_tokens": 1.0},
    {"hash_ids": [1]}, {"block_size": 0}, {"step": 0}, {"step": 2}, {"priority": True},
    {"tenant": ""}, {"model": None}, {"task_id": ""}, {"ttft_slo_s": 0.0}, {"deadline_s": -2.0},
    {"steps_total": 2}, {"step": 2, "steps_total": 2}, {"ttft_slo_s": 2.0, "deadline_s": 1.5},
])
def test_trace_request_validates(kwargs: dict) -> None:
    fields = {"arrival_s": 0.0, "prompt_tokens": 1, "output_tokens": 1} | kwargs
    with pytest.raises(TraceError):
        TraceRequest(**fields)


def test_task_rows_that_agree_load(tmp_path: Path) -> None:
    """A task is a tenant's: another tenant's task of the same id may have other steps; a TTFT
    target may equal the deadline."""
    text = (TASK_T1_OF_3 + '{"arrival_s": 3, "prompt_tokens": 5, "output_tokens": 1,'
            ' "task_id": "t1", "tenant": "acme", "steps_total": 5}\n'
            '{"arrival_s": 4, "prompt_tokens": 5, "output_tokens": 1, "task_id": "t1",'
            ' "step": 3, "steps_total": 3, "ttft_slo_s": 2, "deadline_s": 2}\n')
    rows = list(load_trace(write(tmp_path, "g.jsonl", text)))
    assert [(r.tenant, r.step, r.steps_total) for r in rows] == [
        ("default", 1, 3), ("acme", 1, 5), ("default", 3, 3)]


# --- Governor JSONL writer -----------------------------------------------------------------------


def test_writer_omits_defaults_and_rejects_unsorted(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    assert write_governor_jsonl([TraceRequest(arrival_s=0.0, prompt_tokens=1, output_tokens=2)], path) == 1
    assert path.read_text() == '{"arrival_s":0.0,"prompt_tokens":1,"output_tokens":2}\n'
    unsorted = [TraceRequest(arrival_s=t, prompt_tokens=1, output_tokens=1) for t in (1.0, 0.5)]
    with pytest.raises(TraceError, match="sort"):
        write_governor_jsonl(unsorted, tmp_path / "bad.jsonl")
    assert not (tmp_path / "bad.jsonl").exists() and not list(tmp_path.glob("*.tmp"))


def test_writer_rejects_a_task_whose_rows_disagree_on_its_steps(tmp_path: Path) -> None:
    """The writer refuses what ``load_trace`` would: ``workload build`` writes no such file."""
    rows = [TraceRequest(arrival_s=t, prompt_tokens=1, output_tokens=1, task_id="t9", step=1,
                         steps_total=n) for t, n in ((0.0, 2), (1.0, 2), (2.0, 3))]
    with pytest.raises(TraceError, match=r"request 2: field 'steps_total' has value 3, but "
                                         r"request 0 gives task 't9' .* steps_total 2"):
        write_governor_jsonl(rows, tmp_path / "bad.jsonl")
    assert not (tmp_path / "bad.jsonl").exists()


_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_slo = st.none() | st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def _requests(draw: st.DrawFn) -> list[TraceRequest]:
    times = sorted(draw(st.lists(st.floats(0, MAX_ARRIVAL_S, allow_nan=False, allow_infinity=False), max_size=8)))
    out, tasks = [], {}
    for t in times:
        tenant, task_id = draw(_names), draw(st.none() | _names)
        steps_total = 1 if task_id is None else tasks.setdefault(
            (tenant, task_id), draw(st.integers(1, 10)))  # one value per task
        prompt, block = draw(st.integers(0, 10**6)), draw(st.integers(1, 4096))
        blocks = min(5, math.ceil(prompt / block))  # at most one id per block
        ttft, deadline = draw(_slo), draw(_slo)
        if ttft is not None and deadline is not None:
            ttft, deadline = sorted((ttft, deadline))  # the first token is due first
        out.append(TraceRequest(
            arrival_s=t, prompt_tokens=prompt,
            output_tokens=draw(st.integers(0, 10**5)),
            hash_ids=tuple(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=blocks))),
            block_size=block, tenant=tenant,
            priority=draw(st.integers(-100, 100)), model=draw(_names),
            task_id=task_id, step=draw(st.integers(1, steps_total)),
            steps_total=steps_total, ttft_slo_s=ttft, deadline_s=deadline))
    return out


@settings(max_examples=60, deadline=None)
@given(_requests())
def test_governor_jsonl_round_trip(requests: list[TraceRequest]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        assert write_governor_jsonl(requests, path) == len(requests)
        if requests:
            assert detect_format(path) == "governor"
            assert list(load_trace(path)) == requests


def test_round_trip_of_a_converted_trace(tmp_path: Path) -> None:
    source = list(load_trace(write(tmp_path, "m.jsonl", MOONCAKE_SMALL)))
    write_governor_jsonl(source, tmp_path / "g.jsonl")
    assert list(load_trace(tmp_path / "g.jsonl")) == source


# --- the real traces (../shared/data) ------------------------------------------------------------


def _need(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"shared trace data not present at {path}")


def test_real_azure_trace() -> None:
    _need(AZURE_FILE)
    assert detect_format(AZURE_FILE) == "azure"
    requests = list(load_trace(AZURE_FILE))
    assert len(requests) == 19_366
    arrivals = np.array([r.arrival_s for r in requests])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    assert 3400 < arrivals[-1] < 3600  # ~58 minutes
    mean_prompt = np.mean([r.prompt_tokens for r in requests])
    assert abs(mean_prompt - 1155) / 1155 < 0.01
    assert len(list(load_trace(AZURE_FILE, max_duration_s=60.0))) < 19_366 // 30


def test_real_mooncake_trace() -> None:
    _need(MOONCAKE_FILE)
    assert detect_format(MOONCAKE_FILE) == "mooncake"
    requests = list(load_trace(MOONCAKE_FILE))
    assert len(requests) == 12_031
    assert all(len(r.hash_ids) == math.ceil(r.prompt_tokens / 512) for r in requests)
    assert all(r.hash_ids[0] == 0 for r in requests)  # a shared system prompt
    assert requests[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(requests, requests[1:]))


# --- synthetic workload --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_workload() -> list[TraceRequest]:
    return azure_like_workload(duration_s=20_000, rate_rps=5.5, seed=7)


def test_synthetic_matches_azure_statistics(long_workload: list[TraceRequest]) -> None:
    arrivals = np.array([r.arrival_s for r in long_workload])
    assert abs(len(long_workload) / 20_000 - 5.5) / 5.5 < 0.05
    assert 0 <= arrivals[0] and arrivals[-1] < 20_000 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    assert abs(gaps.std() / gaps.mean() - 1.09) / 1.09 < 0.10
    for values, p50, p99 in (([r.prompt_tokens for r in long_workload], 1020, 4142),
                             ([r.output_tokens for r in long_workload], 129, 601)):
        got50, got99 = np.percentile(values, [50, 99])
        assert abs(got50 - p50) / p50 < 0.10 and abs(got99 - p99) / p99 < 0.10
    assert min(r.prompt_tokens for r in long_workload) >= 1
    assert max(r.output_tokens for r in long_workload) <= 4096


def test_synthetic_is_deterministic_per_seed() -> None:
    a = azure_like_workload(duration_s=300, seed=3)
    assert a == azure_like_workload(duration_s=300, seed=3)
    assert a != azure_like_workload(duration_s=300, seed=4)
    longer = azure_like_workload(duration_s=600, seed=3)
    assert longer[: len(a)] == a  # a shorter run is a prefix of a longer one


@pytest.mark.parametrize("rate", [0.5, 20.0])
def test_synthetic_rate_parameter(rate: float) -> None:
    requests = azure_like_workload(duration_s=4000 / rate, rate_rps=rate, seed=1)
    assert abs(len(requests) - 4000) < 4000 * 0.08


@pytest.mark.parametrize("kwargs", [{"duration_s": -1.0}, {"duration_s": math.inf},
                                    {"duration_s": 10.0, "rate_rps": 0.0}])
def test_synthetic_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(TraceError):
        azure_like_workload(**kwargs)


def test_synthetic_zero_duration_and_fit() -> None:
    assert azure_like_workload(duration_s=0) == []
    mu, sigma = lognormal_from_quantiles(1020, 4142)
    assert mu == pytest.approx(math.log(1020)) and sigma == pytest.approx(0.6024, abs=1e-4)


def test_writing_where_no_file_can_be_is_a_clear_error(tmp_path: Path) -> None:
    request = [TraceRequest(arrival_s=0.0, prompt_tokens=1, output_tokens=1)]
    with pytest.raises(TraceError, match="is a folder"):
        write_governor_jsonl(request, tmp_path)
    with pytest.raises(TraceError, match="cannot write .*missing.*No such file or directory"):
        write_governor_jsonl(request, tmp_path / "missing" / "w.jsonl")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TraceError, match="cannot write .*a-file/w.jsonl: Not a directory"):
        write_governor_jsonl(request, tmp_path / "a-file" / "w.jsonl")  # (no traceback)


def test_unknown_governor_fields_are_ignored_and_each_named_once(tmp_path: Path, caplog) -> None:
    """A typo (``deadline`` for ``deadline_s``) would drop the deadline unseen."""
    import logging

    text = ('{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "deadline": 5}\n'
            '{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 1, "deadline": 5, "note": 1}\n')
    with caplog.at_level(logging.WARNING, logger="infra.traces.loaders"):
        rows = list(load_trace(write(tmp_path, "t.jsonl", text)))
    assert [r.deadline_s for r in rows] == [None, None]  # ignored, as the format allows
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert "line 1: field 'deadline' is not a Governor JSONL field and is ignored (did you " \
           "mean 'deadline_s'?)" in warned[0]
    assert "line 2: field 'note'" in warned[1]
