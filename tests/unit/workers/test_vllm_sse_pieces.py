"""The vLLM adapter's splitting of a completion stream into its events, however its bytes arrive.

With ``return_token_ids`` vLLM echoes the prompt's token ids in the first chunk: one event of
megabytes for a long prompt, which the connection delivers in pieces of some kilobytes. Each
piece must cost the adapter its own size, not the size of everything received before it."""

import asyncio
import json
import random

from aiohttp import web

from benchmarks.vllm_adapter import long_first_event, read_stream
from tests.http_stand_ins import finished_batches, serving, vllm_app
from workers.engine import EngineRequest
from workers.sse import SseEvents
from workers.vllm_engine import VllmHttpEngine


class _Work:
    """Bytes the adapter scanned or copied, counted by the pieces it was given."""

    bytes = 0


class _Piece(bytes):
    """A piece of the stream that counts the bytes each operation on it scans or copies (and on
    what it gives back: a concatenation or a split of pieces stays a piece)."""

    def __add__(self, other):
        joined = _Piece(bytes.__add__(self, other))
        _Work.bytes += len(joined)
        return joined

    def __radd__(self, other):
        joined = _Piece(bytes(other) + bytes(self))
        _Work.bytes += len(joined)
        return joined

    def __getitem__(self, index):
        part = bytes.__getitem__(self, index)
        if isinstance(part, bytes):
            _Work.bytes += len(part)
            return _Piece(part)
        return part

    def split(self, *args, **kwargs):
        _Work.bytes += len(self)
        return [_Piece(part) for part in bytes.split(self, *args, **kwargs)]

    def find(self, sub, start=0, *args):
        _Work.bytes += len(self) - min(start, len(self))
        return bytes.find(self, sub, start, *args)

    def index(self, sub, start=0, *args):
        _Work.bytes += len(self) - min(start, len(self))
        return bytes.index(self, sub, start, *args)

    def partition(self, sep):
        _Work.bytes += len(self)
        return tuple(_Piece(part) for part in bytes.partition(self, sep))


def _read(pieces: list[bytes]):
    return read_stream([_Piece(piece) for piece in pieces])


def test_a_long_first_event_in_small_pieces_costs_the_adapter_its_size_not_its_size_squared():
    data = long_first_event(300_000)  # (about 2.3 MB: 141 pieces of 16 KiB)
    size = 16 * 1024
    _Work.bytes = 0
    stream = _read([data[at:at + size] for at in range(0, len(data), size)])
    assert stream.done and stream.finish_reason == "length" and stream.ids == [7]
    assert _Work.bytes <= 4 * len(data), f"{_Work.bytes:,} bytes of work for {len(data):,}"


def test_an_event_ending_across_two_pieces_and_pieces_of_one_byte_split_as_one_piece_does():
    data = long_first_event(50)
    boundary = data.index(b"\n\n") + 1  # (the blank line's two bytes in two pieces)
    for pieces in ([data], [data[:boundary], data[boundary:]], [bytes([b]) for b in data],
                   [data[:5], b"", data[5:]]):
        stream = _read(pieces)
        assert stream.done and stream.finish_reason == "length" and stream.ids == [7], pieces[:2]


def _random_pieces(rng: random.Random, alphabet: bytes) -> tuple[bytes, list[int], list[bytes]]:
    """A random stream of ``alphabet``'s bytes, where it is cut, and the events ``SseEvents``
    splits from its pieces."""
    data = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
    cuts = sorted(rng.sample(range(len(data) + 1), rng.randrange(0, min(8, len(data) + 1))))
    splitter, events = SseEvents(), []
    for start, end in zip([0, *cuts], [*cuts, len(data)]):
        events += splitter.feed(data[start:end])
    return data, cuts, events


def test_random_streams_in_random_pieces_split_as_the_whole_stream_does():
    rng = random.Random(7)
    for _ in range(300):
        data, cuts, events = _random_pieces(rng, b"ab\n")
        assert events == data.split(b"\n\n")[:-1], (data, cuts)


def _lf(data: bytes) -> bytes:
    """A stream's bytes with each line ending (CRLF, LF or CR, as the SSE format allows) an LF."""
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def test_random_streams_of_crlf_and_cr_line_ends_split_as_their_lf_stream_does():
    """Server-sent events may end their lines in CRLF or CR as well as LF (the WHATWG format;
    sse-starlette's default is CRLF, as served by llama-cpp-python): a blank line of ``\\r\\n``
    was not taken for an event's end."""
    rng = random.Random(11)
    for _ in range(500):
        data, cuts, events = _random_pieces(rng, b"ab\r\n")
        # (a CR that ends the stream may be the first half of a CRLF: its line is not over)
        whole = _lf(data[:-1] if data.endswith(b"\r") else data)
        assert events == whole.split(b"\n\n")[:-1], (data, cuts)


def test_a_server_that_ends_its_lines_in_crlf_streams_every_token():
    """Before, the adapter found no event's end in such a stream, and each request was handed
    back (``the engine's server closed the stream``) with no token, on every worker."""
    async def completions(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, reason in ((0, None), (1, None), (2, "length")):
            chunk = {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [100 + i],
                                  "finish_reason": reason}]}
            await response.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        await response.write(b"data: [DONE]\r\n\r\n")
        return response

    async def scenario():
        async with serving(vllm_app(completions)) as url:
            engine = VllmHttpEngine(url, sim_extensions=False, connect_timeout_s=5)
            await engine.start()
            try:
                return await finished_batches(
                    engine, EngineRequest("crlf", prompt_tokens=8, max_tokens=3))
            finally:
                await engine.close()

    batches = asyncio.run(scenario())
    assert [t for b in batches for t in b.tokens] == [100, 101, 102]
    assert (batches[-1].finish_reason, batches[-1].failure) == ("length", None)
