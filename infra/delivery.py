"""A one-shot send of the command line (``governor command``, ``config set``, ``demo --fault``):
the broker acknowledges it within ``DELIVERY_S``, or an error says what it did not take.

aiokafka's idempotent producer retries a batch for as long as its broker is away, and its stop
waits for that batch. Before 7 Dec such a send whose broker went away after its producer had
started waited for ever, its Ctrl-C too (a replay did so before: ``infra.replay``, which waits
and stops its producer the same way).
"""

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from infra.bus import Outbox, Undelivered, make_producer
from schemas.base import Message
from schemas.errors import GovernorError

logger = logging.getLogger(__name__)

#: How long a send waits for the broker to acknowledge it: the producer's request timeout
#: (``make_producer``).
DELIVERY_S = 15.0
#: How long the producer may take to stop once what it sent is acknowledged, or given up.
STOP_S = 2.0


class NotAcknowledged(GovernorError):
    """The broker did not take what a command sent: refused it, or did not acknowledge it
    within ``DELIVERY_S`` (it may be on the broker or not)."""


#: A record to send: its topic, message, key and partition (None: the key's).
Record = tuple[str, Message, str, int | None]


async def stop_within(producer: AIOKafkaProducer) -> None:
    """Stop ``producer``, for at most ``STOP_S``: where the broker went away, aiokafka's stop
    waits for ever for what it could not send."""
    try:
        await asyncio.wait_for(producer.stop(), STOP_S)
    except TimeoutError:
        logger.warning("the producer did not stop within %g s; left", STOP_S)


async def deliver(producer: AIOKafkaProducer, bootstrap: str, records: Sequence[Record],
                  what: str) -> None:
    """Send ``records`` (``what`` names them: ``the command X``) with the started ``producer``
    and wait for the broker at ``bootstrap`` to acknowledge them, then stop the producer.
    ``NotAcknowledged`` if it refuses one, or acknowledges them not all within ``DELIVERY_S``."""
    try:
        outbox = Outbox(producer)
        for topic, message, key, partition in records:
            outbox.emit(topic, message, key, partition)
        try:
            await asyncio.wait_for(outbox.flush(), DELIVERY_S)
        except Undelivered as exc:
            raise NotAcknowledged(f"the broker at {bootstrap} did not take {what}: "
                                  f"{exc.failed[0][2]!r}") from None
        except (KafkaError, TimeoutError) as exc:
            why = f"none within {DELIVERY_S:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            topics = ", ".join(sorted({topic for topic, *_ in records}))
            raise NotAcknowledged(f"the broker at {bootstrap} did not acknowledge {what} ({why}): "
                                  f"it may be on {topics} or not") from None
    finally:
        await stop_within(producer)


async def send_once(bootstrap: str, records: Sequence[Record], what: str) -> None:
    """``deliver`` with a producer of its own; ``NotAcknowledged`` too where it cannot reach
    the broker (gone since the command's checks: before 7 Dec a traceback)."""
    producer = make_producer(bootstrap)
    try:
        await producer.start()
    except KafkaError as exc:
        await stop_within(producer)
        raise NotAcknowledged(f"the broker at {bootstrap} could not be reached: {what} was not "
                              f"sent ({exc})") from None
    await deliver(producer, bootstrap, records, what)
