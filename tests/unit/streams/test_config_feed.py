"""The streams' configuration feed: GPU prices, the SLO and the heartbeat timeout from the
config topic's records."""

import asyncio

from aiokafka.structs import ConsumerRecord

from infra.bus import Decoded
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR, ConfigSet, SloConfig
from schemas.events import WorkerStatus
from schemas.topics import TopicCatalog
from streams import config_feed
from streams.config_feed import ConfigFeed
from streams.settings import StreamsSettings, Taken
from streams.stages import Stages

T0 = 1_700_000_000_000


def _item(key, value, offset=0) -> Decoded:
    record = ConsumerRecord("governor.config", 0, offset, T0, 0, key.encode(), b"", None, 0, 0, [])
    return Decoded(record, ConfigSet(event_time_ms=T0, key=key, value=value))


def _feed(in_force=None):
    used: list[Taken] = []
    return ConfigFeed(used.append, in_force), used


def test_what_the_streams_take_is_used_at_once_and_other_settings_are_not_passed_on():
    feed, used = _feed()
    feed.configured(_item("gpu_prices_usd_per_hour.h100", 6.0))
    feed.configured(_item("shedding.kv_high", 0.9, offset=1))   # not the streams'
    feed.configured(_item("slo.ttft_slo_s", 1.5, offset=2))
    feed.configured(_item("worker_heartbeat_timeout_s", 10.0, offset=3))
    assert [t.prices_usd_per_hour["h100"] for t in used] == [6.0, 6.0, 6.0]
    assert used[0].prices_usd_per_hour["a100"] == DEFAULT_GPU_PRICES_USD_PER_HOUR["a100"]
    assert [t.slo.ttft_slo_s for t in used] == [SloConfig().ttft_slo_s, 1.5, 1.5]
    assert [t.heartbeat_timeout_s for t in used] == [3.0, 3.0, 10.0]


def test_a_rejected_record_changes_nothing():
    feed, used = _feed()
    feed.configured(_item("gpu_prices_usd_per_hour.h100", -1.0))
    feed.configured(_item("slo.nosuch", 1.0, offset=1))
    assert used == [] and feed.taken.prices_usd_per_hour == dict(DEFAULT_GPU_PRICES_USD_PER_HOUR)


def test_the_history_read_at_start_is_used_once_as_it_ends(monkeypatch):
    """The topic's history up to its end is the configuration in force: its intermediate
    prices are never charged."""
    history = [_item("gpu_prices_usd_per_hour.h100", p, offset=i) for i, p in
               enumerate((5.0, 9.0, 4.0))]

    async def read_to_end(_typed, _topic, handle):
        for item in history:
            handle(item)
        return True

    monkeypatch.setattr(config_feed, "read_to_end", read_to_end)

    class Typed:
        class catalog:  # noqa: N801 - stands for a TopicCatalog's attribute
            config = "governor.config"

    feed, used = _feed()
    asyncio.run(feed.read(Typed()))
    assert [t.prices_usd_per_hour["h100"] for t in used] == [4.0]
    feed.configured(_item("gpu_prices_usd_per_hour.h100", 8.0, offset=3))
    assert [t.prices_usd_per_hour["h100"] for t in used] == [4.0, 8.0]
    # The follower of a worker that read the topic at its start uses nothing it uses already.
    follower, again = _feed(in_force=used[0])
    asyncio.run(follower.read(Typed()))
    assert again == []


def test_stages_take_the_prices_the_slo_and_the_timeout_for_what_comes_next():
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.worker_book.heartbeat(WorkerStatus(
        event_time_ms=T0, worker_id="w0", slot=0, pool="h100@m", gpu_type="h100",
        models_loaded=["m"], started_ms=T0))
    live = lambda: stages.fleet_view(None, T0 + 5_000)[0].values["live"]  # noqa: E731
    assert live() == 0.0  # silent for 5 s: past the default 3 s
    stages.use_config(Taken({"h100": 6.0}, SloConfig(ttft_slo_s=1.5, deadline_s=30.0), 10.0))
    assert live() == 1.0
    assert stages.fleet_view(None, T0 + 5_000)[0].values["price_usd_per_hour"] == 6.0
    assert stages.request_book.slo.ttft_slo_s == 1.5


def test_a_broker_error_while_following_starts_the_reading_again(monkeypatch):
    """An error would otherwise end the task, and with it the Faust worker that runs it."""
    from contextlib import asynccontextmanager

    from aiokafka.errors import KafkaConnectionError

    attempts = []

    @asynccontextmanager
    async def reading(*_args, **_kwargs):
        attempts.append(len(attempts))
        if len(attempts) == 1:
            raise KafkaConnectionError("no broker")
        raise asyncio.CancelledError  # (the second attempt: the test is done)
        yield

    monkeypatch.setattr(config_feed, "reading_config", reading)
    monkeypatch.setattr(config_feed, "RETRY_S", 0.0)
    feed, _ = _feed()
    try:
        asyncio.run(feed.follow("127.0.0.1:1", TopicCatalog("t")))
    except asyncio.CancelledError:
        pass
    assert attempts == [0, 1]
