"""A worker starting on a slot first listens for another worker heart-beating there.

Two workers on one slot both read its dispatch partition (each assigns it by hand) and both run
every dispatch: every request is answered twice, two streams and two terminal events, and the
router takes the two heartbeats for one worker restarting over and over. So a worker listens to
the telemetry topic for ``SLOT_CHECK_S`` before it takes its slot, and refuses it
(``SlotInUse``: ``governor worker`` exits 2) if a worker under its id from another start
(``started_ms``) heart-beats meanwhile, other than to say it stopped. It listens from now on
only: a predecessor that died says nothing more, and its slot is taken over as before. Two
workers that start together are not told apart (neither heart-beats while it listens).
"""

import time

from infra.bus import from_now
from schemas.codec import DecodeError, decode
from schemas.errors import TerminalError
from schemas.events import WorkerStatus
from schemas.topics import TopicCatalog

#: How long a starting worker listens for another on its slot: three heartbeats of the
#: default interval (``WorkerService.status_interval_s``, 0.5 s).
SLOT_CHECK_S = 1.5


class SlotInUse(TerminalError):
    """Another worker runs on this worker's slot."""


def other_worker(status: WorkerStatus, worker_id: str, started_ms: int) -> bool:
    """``status`` is a live worker's under ``worker_id`` that is not the one started at
    ``started_ms``."""
    return (status.worker_id == worker_id and status.started_ms != started_ms
            and status.state != "stopped")


async def check_slot_free(bootstrap: str, catalog: TopicCatalog, worker_id: str, slot: int,
                          started_ms: int, listen_s: float = SLOT_CHECK_S) -> None:
    """Raise ``SlotInUse`` if another worker under ``worker_id`` heart-beats in the next
    ``listen_s`` seconds."""
    topic, key = catalog.telemetry, worker_id.encode()
    spec = catalog.spec(topic)
    async with from_now(bootstrap, catalog, topic) as consumer:
        deadline = time.monotonic() + listen_s
        while (left_s := deadline - time.monotonic()) > 0:
            fetched = await consumer.getmany(timeout_ms=max(1, int(left_s * 1000)))
            for record in (r for records in fetched.values() for r in records if r.key == key):
                try:
                    status = decode(spec, record.value)
                except DecodeError:
                    continue
                if isinstance(status, WorkerStatus) and other_worker(status, worker_id,
                                                                     started_ms):
                    raise SlotInUse(
                        f"{worker_id} already runs on --slot {slot} ({status.pool}, "
                        f"{status.state}, heard just now on {topic}): two workers on one slot "
                        "both run each of its dispatches, answering every request twice; stop "
                        "that worker first, or give this one a free --slot")
