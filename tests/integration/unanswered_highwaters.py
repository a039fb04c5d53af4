"""``python tests/integration/unanswered_highwaters.py STEP_TIMEOUT_S <governor options>``:
the streams worker (``python -m infra.cli``) whose broker never answers the recovery's request
for the changelogs' highwaters, and whose recovery waits ``STEP_TIMEOUT_S`` for each of its steps
(Faust's ``broker_request_timeout``, 90 s in the worker).

A stand-in for a broker that does not answer in time, which no real broker can be made to do on
cue: the consumer's ``highwaters`` waits for ever."""

import asyncio
import sys

import streams.app
from infra.cli import app as cli


async def _unanswered(self, *partitions):
    await asyncio.Event().wait()


def _with_step_timeout(init, step_timeout_s: float):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.app.conf.broker_request_timeout = step_timeout_s
    return __init__


if __name__ == "__main__":
    streams.app.StreamsConsumer.highwaters = _unanswered
    streams.app.StreamsApp.__init__ = _with_step_timeout(streams.app.StreamsApp.__init__,
                                                         float(sys.argv[1]))
    cli(sys.argv[2:])
