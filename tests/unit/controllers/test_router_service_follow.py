"""What the router service makes of the live events it follows (no broker: the adapter's rule)."""

from controllers.router.service import RouterService
from schemas.events import Queued, Rejected
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000


def test_a_request_another_router_answered_is_not_placed_again_if_redelivered_here() -> None:
    router = RouterService("127.0.0.1:1", TopicCatalog("unit"))
    router._followed(Queued(event_time_ms=T0, request_id="by-b", created_ms=T0, prompt_tokens=1,
                            max_tokens=1))
    router._followed(Rejected(event_time_ms=T0, request_id="refused-by-b", reason="load_shed"))
    assert "by-b" in router._seen and "refused-by-b" in router._seen  # _on_request drops them
    assert "other" not in router._seen
