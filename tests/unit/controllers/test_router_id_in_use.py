"""Two routers under one id in the group, as each lists its members after a rebalance (no
broker: the listings are given). The newcomer stops; a router listed alone under its id before
serves on; two that never were (started at once) both stop. Before 6 Dec every router that
listed two members under its id stopped, the running one with the newcomer."""

import asyncio

from controllers.router.service import RouterService
from schemas.topics import TopicCatalog

CATALOG = TopicCatalog("unit")
ALONE = [("m1", "router-x", "/10.0.0.1")]
TWO = ALONE + [("m2", "router-x", "/10.0.0.2"), ("m3", "router-z", "/10.0.0.3")]


def _router(*listings: list[tuple]) -> RouterService:
    """A router whose group is listed as ``listings``, one after another."""
    router = RouterService("127.0.0.1:1", CATALOG, router_id="router-x")
    answers = iter(listings)

    async def members():
        return next(answers)

    router._members = members
    return router


def _listed(router: RouterService, times: int) -> RouterService:
    for _ in range(times):
        asyncio.run(router._check_id())
    return router


def test_a_router_listed_alone_before_serves_on_when_another_joins_under_its_id() -> None:
    router = _listed(_router(ALONE, TWO), 2)
    assert router._id_in_use == "" and router._listed
    assert router.core._routers == {"router-x", "router-z"}


def test_a_router_that_finds_its_id_in_use_at_its_first_listing_stops() -> None:
    router = _listed(_router(TWO), 1)
    assert router._id_in_use.startswith("2 routers run under the id 'router-x' (from "
                                        "/10.0.0.1, /10.0.0.2)")
    assert "give each router an id of its own (--router-id)" in router._id_in_use
    assert not router._settled  # it resumes nothing on its way out


def test_an_unusable_listing_decides_nothing() -> None:
    router = _listed(_router(None, [("m3", "router-z", "/10.0.0.3")], TWO), 3)
    assert router._id_in_use != ""  # (the first two told it nothing: not listed alone)
