"""Which topics of a DeleteTopics answer the broker did not delete (``deletion_refusals``)."""

import pytest

from infra.bus import deletion_refusals


@pytest.mark.parametrize("code, refused", [
    (0, None),
    (3, None),  # no such topic: gone already
    (7, None),  # timed out: the broker deletes it a moment later
    (73, "TOPIC_DELETION_DISABLED (the broker's delete.topic.enable is false)"),
    (29, "TopicAuthorizationFailedError (error code 29)"),
])
def test_a_topic_is_refused_unless_deleted_or_on_its_way(code, refused):
    answer = deletion_refusals([("ns.requests", code), ("ns.kv", 0)])
    assert answer == ({} if refused is None else {"ns.requests": refused})
