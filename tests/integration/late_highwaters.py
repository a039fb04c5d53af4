"""``python tests/integration/late_highwaters.py LATE_S <governor options>``: the streams worker
(``python -m infra.cli``) whose broker answers each of the recovery's requests for the changelogs'
highwaters ``LATE_S`` late, within the recovery's bound for a step (``broker_request_timeout``,
90 s).

A stand-in for a slow broker, which no real broker can be made to be on cue: the consumer's
``highwaters`` sleeps first."""

import asyncio
import sys

import streams.app
from infra.cli import app as cli


def _late(highwaters, late_s: float):
    async def late_highwaters(self, *partitions):
        await asyncio.sleep(late_s)
        return await highwaters(self, *partitions)
    return late_highwaters


if __name__ == "__main__":
    streams.app.StreamsConsumer.highwaters = _late(streams.app.StreamsConsumer.highwaters,
                                                   float(sys.argv[1]))
    cli(sys.argv[2:])
