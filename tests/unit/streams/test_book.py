"""Event-time windows: which seconds a window covers, lateness, duplicates, expiry."""

import pytest

from streams.signals.book import WindowBook, WindowPolicy, window_end_ms

T = 1_700_000_000_000  # a whole second


def _q(t):
    return {"k": "q", "t": t}


def _values(book, key, watermark):
    return {w: v for w, _end, v in book.snapshots(key, watermark)}


def test_sliding_windows_cover_the_seconds_before_the_watermark_second():
    book = WindowBook({}, WindowPolicy(windows_s=(10, 60), allowed_lateness_s=30))
    for i, t in enumerate([T, T + 5_000, T + 20_500, T + 29_999]):
        book.observe("tenant:a", "t0", i, 0, _q(t), T + 29_999)
    assert window_end_ms(T + 29_999) == T + 30_000
    windows = _values(book, "tenant:a", T + 29_999)
    assert windows[10.0]["queued"] == 2     # 20.5 s and 29.999 s
    assert windows[60.0]["queued"] == 4
    assert windows[30.0]["queued"] == 4     # the running total: from the first event to the end


def test_late_observations_count_in_the_total_only_and_are_reported():
    book = WindowBook({}, WindowPolicy(windows_s=(10,), allowed_lateness_s=5))
    book.observe("fleet:all", "t0", 0, 0, _q(T + 60_000), T + 60_000)
    book.observe("fleet:all", "t0", 1, 0, _q(T + 56_000), T + 60_000)  # 4 s late: allowed
    book.observe("fleet:all", "t0", 2, 0, _q(T + 50_000), T + 60_000)  # 10 s late: too late
    snapshots = book.snapshots("fleet:all", T + 60_000)
    windowed, total = snapshots[0][2], snapshots[-1][2]
    assert windowed["queued"] == 2
    assert total["queued"] == 3 and total["late_events"] == 1


def test_a_late_observation_moves_the_running_totals_start_back_to_the_horizon_at_most():
    """An event stamped at 0 (an unset clock) made the running total's span 1.7e9 s, and its
    rates about nothing, for ever."""
    book = WindowBook({}, WindowPolicy(windows_s=(10,), allowed_lateness_s=30))
    for i in range(100):
        book.observe("tenant:a", "t0", i, 0, _q(T + i * 1000), T + i * 1000)
    watermark = T + 99_000
    assert book.snapshots("tenant:a", watermark)[-1][:1] == (100.0,)
    book.observe("tenant:a", "t0", 100, 0, _q(0), watermark)
    span, _end, total = book.snapshots("tenant:a", watermark)[-1]
    assert span == 100.0 and total["queued"] == 101 and total["late_events"] == 1
    assert total["arrivals_per_s"] == pytest.approx(101 / 100)
    book.observe("tenant:new", "t0", 0, 0, _q(0), watermark)  # the first of its key, late
    span, _end, total = book.snapshots("tenant:new", watermark)[-1]
    assert span == 31.0 and total["queued"] == 1  # from the horizon, 30 s before the watermark


def test_duplicates_by_source_identity_are_dropped_per_bucket_and_total():
    book = WindowBook({})
    assert book.observe("tenant:a", "t1", 10, 0, _q(T), T)
    assert book.observe("tenant:a", "t1", 10, 1, _q(T), T)
    assert not book.observe("tenant:a", "t1", 10, 0, _q(T), T)   # replayed
    assert not book.observe("tenant:a", "t1", 9, 5, _q(T), T)    # older record of that source
    assert book.observe("tenant:a", "t2", 3, 0, _q(T), T)        # another source
    assert _values(book, "tenant:a", T)[10.0]["queued"] == 3


def test_a_crash_between_the_total_and_the_bucket_write_loses_nothing_on_replay():
    table = {}
    book = WindowBook(table)
    book.observe("tenant:a", "t0", 0, 0, _q(T), T)
    del table[f"tenant:a|{T // 1000}"]           # the bucket's changelog record never landed
    assert book.observe("tenant:a", "t0", 0, 0, _q(T), T)   # the replay fills the bucket only
    values = _values(book, "tenant:a", T)
    assert values[10.0]["queued"] == 1 and values[60.0]["queued"] == 1
    assert book.snapshots("tenant:a", T)[-1][2]["queued"] == 1


def test_buckets_older_than_the_longest_window_plus_lateness_are_deleted():
    table = {}
    book = WindowBook(table, WindowPolicy(windows_s=(10, 60), allowed_lateness_s=30))
    book.observe("tenant:a", "t0", 0, 0, _q(T), T)
    assert book.expire("tenant:a", T + 90_000) == []
    assert book.expire("tenant:a", T + 92_000) == [f"tenant:a|{T // 1000}"]
    assert f"tenant:a|{T // 1000}" not in table
    assert book.snapshots("tenant:a", T + 92_000)[-1][2]["queued"] == 1  # the total stays


@pytest.mark.parametrize("watermark,end",
                         [(T, T + 1000), (T + 999, T + 1000), (T + 1000, T + 2000)])
def test_window_end_includes_the_watermark_second(watermark, end):
    assert window_end_ms(watermark) == end


def test_the_running_total_rates_over_its_whole_span_past_a_day():
    book = WindowBook({}, WindowPolicy(windows_s=(10,), allowed_lateness_s=30))
    for i in range(0, 2 * 86_400, 100):  # one request queued every 100 s for two days
        t = T + i * 1000
        book.observe("fleet:all", "t0", i, 0, _q(t), t)
        book.expire("fleet:all", t)
    span, _end, total = book.snapshots("fleet:all", t)[-1]
    assert span == 86_400.0  # the label is capped; the rate is not
    assert total["queued"] == 1_728 and total["arrivals_per_s"] == pytest.approx(0.01, rel=0.01)


def test_a_key_without_observations_for_its_retention_is_idle_and_forgotten_whole():
    table = {}
    book = WindowBook(table, WindowPolicy(windows_s=(10, 60), allowed_lateness_s=30,
                                          idle_retention_s=600))
    book.observe("tenant:a", "t0", 0, 0, _q(T), T)
    book.observe("tenant:a", "t0", 1, 0, _q(T + 5_000), T + 5_000)
    book.observe("tenant:a", "t0", 2, 0, _q(0), T + 5_000)  # late: not its last observation
    assert not book.idle("tenant:a", T + 605_000)
    assert book.idle("tenant:a", T + 605_001)
    assert sorted(book.forget("tenant:a")) == sorted(
        [f"tenant:a|{T // 1000}", f"tenant:a|{T // 1000 + 5}", "tenant:a|total"])
    assert table == {} and book.idle("tenant:a", T) and book.forget("tenant:a") == []


def test_a_key_is_kept_at_least_as_long_as_its_buckets():
    policy = WindowPolicy(windows_s=(60,), allowed_lateness_s=30, idle_retention_s=1)
    assert policy.idle_retention_ms == policy.retention_ms == 91_000
    book = WindowBook({}, policy)
    book.observe("tenant:a", "t0", 0, 0, _q(T), T)
    assert not book.idle("tenant:a", T + 91_000)
    book.observe("tenant:late", "t0", 0, 0, _q(T), T + 700_000)  # its first, 700 s late
    assert book.idle("tenant:late", T + 700_000)  # its start is the horizon, its last is its own


def test_a_running_total_written_before_5_dec_is_idle_from_its_newest_bucket():
    book = WindowBook({"tenant:a|total": {"b": {}, "hw": {}, "first": T, "secs": [T // 1000 + 9]}},
                      WindowPolicy(idle_retention_s=600))
    assert not book.idle("tenant:a", T + 609_999) and book.idle("tenant:a", T + 610_000)


def _heartbeat(t, worker, running):
    return {"k": "h", "t": t, "w": worker, "run": running, "wait": 1, "kvu": 10, "kvf": 90,
            "dt": 0.5, "busy": running > 0, "usd": 0.0, "pq": 0, "ph": 0}


def test_the_running_totals_gauges_are_those_of_the_workers_heard_in_the_longest_window():
    """w1 was SIGKILLed 90 s ago with 19 requests running (the router moved them on): before
    6 Dec the running total kept its last heartbeat among each worker's latest for good, so
    ``governor_running{scope="fleet",key="all",window_s="total"}`` said 22 where 3 ran, and
    ``workers`` counted every worker ever heard of."""
    book = WindowBook({}, WindowPolicy(windows_s=(10, 60), allowed_lateness_s=30))
    offset = 0
    for t in range(T, T + 120_000, 500):
        for worker, running, until in (("w0", 3, T + 120_000), ("w1", 19, T + 30_000)):
            if t < until:
                book.observe("fleet:all", "t0", offset, 0, _heartbeat(t, worker, running), t)
                offset += 1
    values = _values(book, "fleet:all", T + 119_500)
    total = values[max(values)]  # (labelled with its span, 120 s)
    assert (total["running"], total["queue_depth"], total["workers"]) == (3, 1, 1)
    assert total["provisioned_s"] == 0.5 * offset  # (its counts are of the whole span still)
    assert values[60.0]["running"] == 3


def test_the_running_total_forgets_the_gauges_of_workers_gone_with_their_buckets():
    """A worker id a run (a pod named anew at each restart): the total keeps the gauges of those
    heard within its buckets' retention, not of every one ever heard (a changelog record)."""
    table = {}
    book = WindowBook(table, WindowPolicy(windows_s=(10, 60), allowed_lateness_s=30))
    for i in range(1_000):  # one worker a minute, each heard for 30 s
        for t in range(T + i * 60_000, T + i * 60_000 + 30_000, 500):
            book.observe("fleet:all", "t0", t, 0, _heartbeat(t, f"pod-{i}", 1), t)
            book.expire("fleet:all", t)
    assert sorted(table["fleet:all|total"]["b"]["g"]) == ["pod-998", "pod-999"]
    total = _values(book, "fleet:all", T + 999 * 60_000 + 29_500)
    assert total[max(total)]["workers"] == 1 and total[max(total)]["running"] == 1
