"""A setting's latest value is kept however long ago it was made (schema version 8).

The config topic is compacted: a GPU price set more than a year ago and not set since is still
in force. ``config_changes`` expires rows a year after their event time; the cost report reads
prices from ``config_settings``, which keeps each setting's latest value without TTL. The
history is ``test_midnight``'s: one H100 for 4 GPU-seconds on the first day, all ``r-late``'s.
"""

import datetime as dt

import pytest

from analytics.cost import PRICE_SETTINGS_SQL, gpu_prices
from analytics.query import StoreSource
from analytics.reports import run_report
from analytics.store import Store
from schemas.config import DEFAULT_GPU_PRICES_USD_PER_HOUR, ConfigSet
from tests.unit.analytics.test_last_attempt import _write
from tests.unit.analytics.test_midnight import _history, ms

NOW = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
DAY_MS = 86_400_000


def _price(gpu: str, usd: float, at_ms: int) -> tuple[str, ConfigSet]:
    return ("config", ConfigSet(event_time_ms=at_ms, key=f"gpu_prices_usd_per_hour.{gpu}",
                                value=usd, set_by="ops"))


def test_a_price_set_400_days_ago_is_still_the_price(store):
    _write(store, 1, [*_history(), _price("h100", 9.99, NOW - 400 * DAY_MS)])
    assert store.query("SELECT count() FROM config_changes").rows == [[0]]  # past its TTL
    first_day = run_report(StoreSource(store), "cost").dicts()[0]
    assert first_day["tenant"] == "acme"
    assert first_day["cost_usd"] == pytest.approx(4 * 9.99 / 3600, abs=1e-6)


def test_each_settings_latest_value_counts_in_the_order_they_were_made(store):
    """As applying every setting in order: the whole table (ms 2) overrides h100's own setting
    before it, and a100's own setting after it overrides the table."""
    _write(store, 1, [_price("h100", 9.99, NOW - 400 * DAY_MS), _price("a100", 7.0, ms(0)),
                      _price("h100", 4.5, ms(1)),
                      ("config", ConfigSet(event_time_ms=ms(2), key="gpu_prices_usd_per_hour",
                                           value={"a100": 2.0, "h100": 4.0}, set_by="ops")),
                      _price("a100", 2.5, ms(3))])
    prices = gpu_prices(store.query(PRICE_SETTINGS_SQL).rows)
    assert (prices["h100"], prices["a100"]) == (4.0, 2.5)


def test_version_8_keeps_the_settings_config_changes_held(location, monkeypatch):
    import analytics.migrations as migrations

    with monkeypatch.context() as patched:  # a store as version 7 left it
        patched.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:7])
        old = Store.open(location)
        _write(old, 1, [_price("h100", 6.25, NOW - 300 * DAY_MS)])
        old.close()
    store = Store.open(location)  # version 8 is applied
    try:
        prices = gpu_prices(store.query(PRICE_SETTINGS_SQL).rows)
        assert prices == {**DEFAULT_GPU_PRICES_USD_PER_HOUR, "h100": 6.25}
        for statement in migrations.MIGRATIONS[7].statements:  # run again, as if interrupted
            store.command(statement)
        assert gpu_prices(store.query(PRICE_SETTINGS_SQL).rows) == prices
    finally:
        store.close()
