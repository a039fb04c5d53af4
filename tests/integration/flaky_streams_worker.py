"""``python tests/integration/flaky_streams_worker.py <governor options>``: the streams worker
(``python -m infra.cli``) whose first send of observations fails half-way, as a broker that stops
answering does."""

import sys

from aiokafka.errors import KafkaTimeoutError

import streams.app
from infra.cli import app as cli

_send = streams.app.StreamsApp._send


async def _fails_once_half_way(self, sends) -> None:
    if not getattr(self, "failed", False) and any(send.route == "scope" for send in sends):
        self.failed = True
        await _send(self, sends[: len(sends) // 2])
        raise KafkaTimeoutError("the broker did not answer (injected)")
    await _send(self, sends)


if __name__ == "__main__":
    streams.app.StreamsApp._send = _fails_once_half_way
    cli(sys.argv[1:])
