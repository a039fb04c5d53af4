"""A Faust worker of the streams app whose first send of observations fails half-way, as a
broker that stops answering does: ``python flaky_streams_worker.py BOOTSTRAP NAMESPACE``."""

import asyncio
import sys
import tempfile
from pathlib import Path

import faust
from aiokafka.errors import KafkaTimeoutError

from streams.app import StreamsApp
from streams.worker import ensure_topics, settings_for


class FlakyStreamsApp(StreamsApp):
    failed = False

    async def _send(self, sends) -> None:
        if not self.failed and any(send.route == "scope" for send in sends):
            self.failed = True
            await super()._send(sends[: len(sends) // 2])
            raise KafkaTimeoutError("the broker did not answer (injected)")
        await super()._send(sends)


def main() -> None:
    bootstrap, namespace = sys.argv[1:3]
    settings = settings_for(namespace, bootstrap, tick_s=0.5)
    asyncio.run(ensure_topics(settings))
    with tempfile.TemporaryDirectory() as datadir:
        streams = FlakyStreamsApp(settings, datadir=Path(datadir))
        faust.Worker(streams.app, loglevel="INFO", redirect_stdouts=False,
                     quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
