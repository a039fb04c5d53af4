"""The streams' configuration feed: GPU prices and the SLO from the config topic's records."""

import asyncio

from aiokafka.structs import ConsumerRecord

from infra.bus import Decoded
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR, ConfigSet, SloConfig
from streams import config_feed
from streams.config_feed import ConfigFeed
from streams.settings import StreamsSettings
from streams.stages import Stages

T0 = 1_700_000_000_000


def _item(key, value, offset=0) -> Decoded:
    record = ConsumerRecord("governor.config", 0, offset, T0, 0, key.encode(), b"", None, 0, 0, [])
    return Decoded(record, ConfigSet(event_time_ms=T0, key=key, value=value))


def _feed():
    used = []
    return ConfigFeed(lambda prices, slo: used.append((prices, slo))), used


def test_a_price_or_an_slo_set_is_used_at_once_and_other_settings_are_not_passed_on():
    feed, used = _feed()
    feed.configured(_item("gpu_prices_usd_per_hour.h100", 6.0))
    feed.configured(_item("shedding.kv_high", 0.9, offset=1))   # not the streams'
    feed.configured(_item("slo.ttft_slo_s", 1.5, offset=2))
    assert [prices["h100"] for prices, _ in used] == [6.0, 6.0]
    assert used[0][0]["a100"] == DEFAULT_GPU_PRICES_USD_PER_HOUR["a100"]
    assert [slo.ttft_slo_s for _, slo in used] == [SloConfig().ttft_slo_s, 1.5]


def test_a_rejected_record_changes_nothing():
    feed, used = _feed()
    feed.configured(_item("gpu_prices_usd_per_hour.h100", -1.0))
    feed.configured(_item("slo.nosuch", 1.0, offset=1))
    assert used == [] and feed.prices == dict(DEFAULT_GPU_PRICES_USD_PER_HOUR)


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
    assert [prices["h100"] for prices, _ in used] == [4.0]
    feed.configured(_item("gpu_prices_usd_per_hour.h100", 8.0, offset=3))
    assert [prices["h100"] for prices, _ in used] == [4.0, 8.0]
    # The follower of a worker that read the topic at its start uses nothing it uses already.
    again = []
    follower = ConfigFeed(lambda prices, slo: again.append(prices), in_force=used[0])
    asyncio.run(follower.read(Typed()))
    assert again == []


def test_stages_take_the_prices_and_the_slo_for_what_comes_next():
    stages = Stages(StreamsSettings(), {}, {}, {}, {})
    stages.use_config({"h100": 6.0}, SloConfig(ttft_slo_s=1.5, deadline_s=30.0))
    assert stages.worker_book.prices == {"h100": 6.0}
    assert stages.request_book.slo.ttft_slo_s == 1.5
