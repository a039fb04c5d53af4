"""Server-sent events from a stream's bytes, however they arrive (``SseEvents``). Pure."""


class SseEvents:
    """Splits a stream of server-sent events into the events, each ending at a blank line
    (``\\n\\n``), as its bytes arrive. A long event (vLLM's first chunk echoes the prompt's
    token ids: megabytes for a long prompt) comes in many pieces: each piece is scanned once
    for the blank line (with the byte before it) and each event joined once, so an event costs
    its size, not its size times its pieces (the whole buffer scanned and copied again at
    each: 0.5-1.8 s for a 1M-token prompt). A line may end in CRLF or CR as well as LF, as the
    format allows (sse-starlette's default is CRLF): each line end is read as an LF."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the pieces of the event not ended yet
        self._cr = False  # the last piece ended in a CR, held back: an LF may follow it

    def feed(self, data: bytes) -> list[bytes]:
        """The events that ``data`` ends, without their blank lines."""
        if self._cr:
            data, self._cr = b"\r" + data, False
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, self._cr = data[:-1], True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events, start = [], 0
        if self._pending and self._pending[-1].endswith(b"\n") and data.startswith(b"\n"):
            self._pending[-1] = self._pending[-1][:-1]  # (a blank line across two pieces)
            events.append(self._take(b""))
            start = 1
        while (end := data.find(b"\n\n", start)) >= 0:
            events.append(self._take(data[start:end]))
            start = end + 2
        if start < len(data):
            self._pending.append(data[start:])
        return events

    def _take(self, last: bytes) -> bytes:
        event = b"".join([*self._pending, last])
        self._pending = []
        return event
