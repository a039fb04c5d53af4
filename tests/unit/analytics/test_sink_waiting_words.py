"""How a sink's retry line says a failed attempt: a store it could not open yet as the store it
waits for, where and why; before 7 Dec ``opening the store failed: cannot open the analytics store
at URL ...:`` and the HTTP client's whole message, a new ``query_id`` in each."""

import pytest

from analytics.sink import failure_said
from analytics.store import StoreError, StoreLocation, StoreNotOpened

URL = "http://127.0.0.1:8123"


@pytest.mark.parametrize(("url", "named"), [
    (URL, f"ClickHouse at {URL} (database d)"),
    ("http://user:secret@ch:8123", "ClickHouse at http://user:***@ch:8123 (database d)"),
], ids=["url", "password"])
def test_a_sink_waiting_for_its_store_names_it_and_says_why(url: str, named: str) -> None:
    location = StoreLocation("d", url=url)
    not_opened = StoreNotOpened(location, "Read timed out. (read timeout=10)")
    assert failure_said("opening the store", not_opened, location) == \
        f"waiting for {named}: Read timed out. (read timeout=10)"
    assert str(not_opened).startswith("cannot open the analytics store at ")


def test_a_sink_says_another_failure_as_what_failed(tmp_path) -> None:
    location = StoreLocation.for_namespace("d", tmp_path)
    assert failure_said("writing flush 3", StoreError("insert into requests failed: x"),
                        location) == "writing flush 3 failed: insert into requests failed: x"
    assert location.named() == f"the analytics store at {tmp_path / 'chdb'} (database d)"
