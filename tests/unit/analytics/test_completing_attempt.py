"""Where a request two attempts completed is charged: the worker of the newest attempt.

``r-twice`` starts on ``w-a`` (pool a100@m, attempt 1); its worker is slow to heart-beat, the
router resumes it on ``w-z`` (pool h100@m, attempt 2), and both complete, the replaced attempt
last. A reader takes attempt 2's answer. The greater of the completing workers' ids (what the
reports took before schema version 6) is ``w-z``; here the newest attempt runs on ``w-a``.
"""

import analytics.migrations as migrations
from analytics.store import Store
from schemas import events
from schemas.requests import InferenceRequest
from tests.unit.analytics.test_last_attempt import _ran_on, _write, ms, old_store


def _completed_twice(rid: str) -> list[tuple[str, object]]:
    common = dict(request_id=rid, tenant="acme", model="m", created_ms=ms(0))
    done = dict(prompt_tokens=10, output_tokens=10, e2e_s=5.0, **common)
    telemetry = [
        events.Queued(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10, **common),
        events.Started(event_time_ms=ms(1), worker_id="w-z", attempt=1, **common),
        events.Started(event_time_ms=ms(4), worker_id="w-a", attempt=2, **common),
        events.Completed(event_time_ms=ms(5), worker_id="w-a", attempt=2, **done),
        events.Completed(event_time_ms=ms(6), worker_id="w-z", attempt=1, **done),
    ]
    heartbeats = [events.WorkerStatus(event_time_ms=ms(at), worker_id=worker, slot=0, pool=pool,
                                      gpu_type=gpu, state="warm", started_ms=ms(0))
                  for at in (0, 1, 2, 3, 4, 5, 6) for worker, pool, gpu in (
                      ("w-z", "h100@m", "h100"), ("w-a", "a100@m", "a100"))]
    return [("requests", InferenceRequest(event_time_ms=ms(0), prompt_tokens=10, max_tokens=10,
                                          **common)),
            *(("telemetry", m) for m in [*telemetry, *heartbeats])]


def test_a_request_two_attempts_completed_is_charged_to_the_newest(store):
    _write(store, 1, _completed_twice("r-twice"))
    assert _ran_on(store) == {"r-twice": "w-a"}


def test_version_6_applies_to_a_store_with_history_and_keeps_its_old_rows(location, monkeypatch):
    with monkeypatch.context() as patched:  # a store as version 5 left it, with a request in it
        old = old_store(location, 5, patched)
        _write(old, 1, _completed_twice("r-before"))
        old.close()
    store = Store.open(location)  # the sink's start: version 6 is applied
    try:
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [
            [migrations.LATEST_VERSION]]
        _write(store, 2, _completed_twice("r-after"))
        # Rows written before version 6 have no completing attempt: the greater id, as before.
        assert _ran_on(store) == {"r-after": "w-a", "r-before": "w-z"}
    finally:
        store.close()
