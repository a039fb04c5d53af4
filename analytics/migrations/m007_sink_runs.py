"""Version 7: flushes named by the sink run that wrote them, and marked when finished.

Two sinks on one store (the sink's consumer group splits the partitions among them) both took
the next flush id from the store at start and wrote flush ``N`` with the dedup tokens
``N:<table>``: the store dropped one sink's inserts as repeats of the other's, and their rows
were lost. Each run of a sink now has an id of its own (``run``), in its flushes' journal rows
and their tokens (``<run>:N:<table>``). A flush's end was "its id is below the greatest id in
``sink_offsets``", which only one writer makes true; a flush is now finished when its journal
row is written again with ``finished = 1`` (the table keeps a key's last row). Rows of earlier
versions are finished (the default), except the one flush a crash may have left unfinished,
which this version marks so.
"""

#: Nonzero once ``sink_flushes`` has its ``run`` column (the key can only take it as it is added).
HAS_RUN = """
SELECT count() FROM system.columns
WHERE database = currentDatabase() AND table = 'sink_flushes' AND name = 'run'"""

STATEMENTS = [
    (HAS_RUN, """
ALTER TABLE sink_flushes
    ADD COLUMN run String AFTER flush_id,
    ADD COLUMN finished UInt8 DEFAULT 1 AFTER ranges,
    MODIFY ORDER BY (flush_id, run)"""),
    # The flush an earlier version's crash left unfinished, if any: unfinished now too.
    """
INSERT INTO sink_flushes (flush_id, run, ranges, finished, time)
SELECT flush_id, '', ranges, 0, time FROM sink_flushes FINAL
WHERE run = '' AND finished = 1 AND flush_id > (SELECT max(flush_id) FROM sink_offsets)""",
]
