"""Fixtures of the analytics tests: a real chdb store on a fresh directory, migrated."""

import pytest

from analytics.store import Store, StoreLocation


@pytest.fixture
def location(tmp_path) -> StoreLocation:
    return StoreLocation("t_analytics", data_dir=tmp_path / "chdb")


@pytest.fixture
def store(location):
    """A migrated embedded store; closed after the test (one chdb path per process at a time)."""
    opened = Store.open(location)
    yield opened
    opened.close()
