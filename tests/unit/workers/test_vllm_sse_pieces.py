"""The vLLM adapter's splitting of a completion stream into its events, however its bytes arrive.

With ``return_token_ids`` vLLM echoes the prompt's token ids in the first chunk: one event of
megabytes for a long prompt, which the connection delivers in pieces of some kilobytes. Each
piece must cost the adapter its own size, not the size of everything received before it."""

import random

from benchmarks.vllm_adapter import long_first_event, read_stream
from workers.sse import SseEvents


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


def test_random_streams_in_random_pieces_split_as_the_whole_stream_does():
    rng = random.Random(7)
    for _ in range(300):
        data = bytes(rng.choice(b"ab\n") for _ in range(rng.randrange(0, 40)))
        cuts = sorted(rng.sample(range(len(data) + 1), rng.randrange(0, min(8, len(data) + 1))))
        splitter, events = SseEvents(), []
        for start, end in zip([0, *cuts], [*cuts, len(data)]):
            events += splitter.feed(data[start:end])
        assert events == data.split(b"\n\n")[:-1], (data, cuts)
