"""What the batching property (``test_batching_property``) found, each as the smallest run of the
app's agents that shows it: a crash's replay that counts differently from the run it replays."""

import orjson

from streams.signals.workers import UNHEARD_S, WorkerBook
from test_app_failures import T


def test_an_observation_relayed_again_to_a_worker_not_heard_from_is_held_once():
    """A replay relayed an observation again to a worker whose first heartbeat was not read yet
    (its entry, written back, held the observation already): it was held twice, and the worker,
    forgotten unheard, counted both in ``pool_observations_dropped`` (the property: 5 for 3)."""
    table: dict = {}
    book = WorkerBook(table, {"h100": 3.6})
    relayed = {"k": "obs", "obs": {"k": "s", "t": T, "a": 1}, "org": ["r0:w-0", 1, 3]}
    book.relay("w-0", relayed)
    table["w-0"] = orjson.loads(orjson.dumps(table["w-0"]))  # as the changelog restores it
    book.relay("w-0", orjson.loads(orjson.dumps(relayed)))  # the replay's
    lost = book.expire("w-0", T + int(UNHEARD_S * 1000) + 1)
    assert [(out.key, out.payload["held"]) for out in lost] == [("worker:w-0", 1),
                                                                 ("fleet:all", 1)]
