"""Reading an unfinished flush's records back from the real broker (``read_ranges``): its
timeout bounds a stall, not the whole read, so a flush of any size can be written again."""

import asyncio
import time

import pytest

from analytics.batch import OffsetRange
from analytics.ranges import read_ranges
from analytics.synthetic import Record, produce
from schemas.codec import encode
from schemas.events import Queued

pytestmark = pytest.mark.integration

#: Records of one partition: a fetch brings at most 1 MiB of them (some 3,500), so the read
#: delivers in many short steps and lasts about a second.
RECORDS = 80_000


async def _read_back(bootstrap, catalog) -> tuple[float, int, bool]:
    """How long a whole read of the records takes, the records read again with a timeout of a
    third of that, and whether that read gave back their range."""
    topic, now = catalog.name("telemetry"), int(time.time() * 1000)
    await produce(bootstrap, [Record(topic, b"k", encode(Queued(
        event_time_ms=now, request_id=f"r-{i}", tenant="t", model="m", created_ms=now,
        prompt_tokens=1, max_tokens=1)), 0) for i in range(RECORDS)])
    ranges = [OffsetRange(topic, 0, 0, RECORDS - 1)]
    started = time.monotonic()
    await read_ranges(bootstrap, catalog, ranges)
    whole_s = time.monotonic() - started
    batch, readable = await read_ranges(bootstrap, catalog, ranges, timeout_s=whole_s / 3)
    return whole_s, len(batch), readable == ranges


def test_a_read_back_that_keeps_delivering_is_not_cut_off_by_its_timeout(kafka_bootstrap,
                                                                          catalog):
    whole_s, read, whole = asyncio.run(_read_back(kafka_bootstrap, catalog))
    assert whole_s > 0.6, "too few records to read for longer than a stall: produce more"
    assert (read, whole) == (RECORDS, True)
