"""Version 14: the sink's journal keeps a flush it did not finish, however old.

``sink_flushes`` expired every row 30 days after it was written, unfinished ones too. A sink
that crashed mid-flush and was started again more than a month later (its topics retaining
their records: ``governor.config`` is compacted, never expired) found no flush pending, read
the flush's records again from the offset marks below them and wrote them with new dedup
tokens: the rollups counted twice what the flush's data inserts had stored before the crash.
Only finished flushes expire now. A finished flush's row gone while an older, unfinished row of
it is not yet merged away (merges are eventual) makes the flush pending again; writing it again
adds nothing, its offset marks being past its ranges (``AnalyticsSink._write_pending``).
"""

STATEMENTS = [
    """
ALTER TABLE sink_flushes
    MODIFY TTL toDateTime(time) + INTERVAL 30 DAY WHERE finished = 1""",
]
