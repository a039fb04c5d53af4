"""The SQL endpoint runs reads only: the engine's own parse decides what a statement is."""

import pytest

from analytics.endpoint import guarded_query
from analytics.guard import BadQuery
from analytics.store import Store, StoreError, StoreLocation

READS = [
    "SELECT count() FROM request_events",
    "SELECT tenant, count() FROM request_events WHERE request_id IN "
    "(SELECT request_id FROM requests) GROUP BY tenant",  # requests is a view
    "WITH x AS (SELECT number FROM numbers(3)) SELECT sum(number) FROM x",
    "SELECT * FROM request_events AS a LEFT JOIN requests AS b USING request_id LIMIT 1",
    "SHOW TABLES",
    "SHOW TABLES LIKE 'worker%'",
    "SHOW TABLES FROM t_guard",
    "SELECT 1 AS format",
    "SELECT 'FORMAT Native' AS x -- FORMAT Native",  # (quoted, or in a comment: no FORMAT)
    "SELECT format('{}', 'x') AS Native",
    "DESCRIBE (SELECT 'a' AS x)",
    "EXISTS TABLE worker_status",
    "SHOW CREATE TABLE worker_status",
    "EXPLAIN SYNTAX SELECT 'x'",
    "DESCRIBE TABLE worker_status",
    "EXPLAIN SELECT 1",
    "SELECT 1 UNION ALL SELECT 2",
    "SELECT * FROM generateRandom('a UInt8', 1) LIMIT 5",
    "SELECT 1 SETTINGS do_not_merge_across_partitions_select_final = 1",  # (as set: the reports)
    "SELECT 1;",
    "SELECT ';' AS semicolon, `a;b` FROM (SELECT 1 AS `a;b`)",  # quoted: one statement
    "SELECT 1 -- a comment; not a second statement\n, 2 /* nor; this */",
    "/* slo: governor sql --param days=7 \"SQL\" (as report --show-sql heads it) */\nSELECT 1",
    "#!/usr/bin/env governor-sql\n# ClickHouse's own comments\n#!and this\nSELECT 1",
    # a nested comment is one comment to ClickHouse: before 7 Dec the guard read "drop" after
    # the inner one's end and refused the query
    "/* a note /* nested */ drop the old table first? no */ SELECT 1",
    # nor is a ';' in one a second statement: before 7 Dec "one statement at a time"
    "SELECT 1 /* a /* b */ ; */",
    # nor in ClickHouse's "# " and "#!" line comments, anywhere in a statement: before 7 Dec
    # "one statement at a time"
    "# a; note\nSELECT 1",
    "#!/usr/bin/env governor-sql; note\nSELECT 1",
    "SELECT 1 # a; not a second statement\n, 2 #! nor; this",
    # a ';' that ends the statement, followed by blanks and comments alone: before 7 Dec "one
    # statement at a time"
    "SELECT 1; -- a note",
    "SELECT 1 ; # a note\n  /* and /* another */ */ \n",
]
REFUSED = [
    # refused by their first word (the engine's parse is the backstop: check_ast)
    ("INSERT INTO request_events (request_id) VALUES ('x')",
     "only reads are allowed here, not INSERT"),
    ("insert into request_events SELECT * FROM request_events LIMIT 0", "not INSERT"),  # (a
    # client library's "LIMIT 0 metadata probe" error, before 5 Dec)
    ("DROP TABLE request_events", "not DROP"),
    # after a comment (report --show-sql heads its SQL with one): before 7 Dec the client
    # library's "LIMIT 0 metadata probe" error again
    ("/* slo: adapted */\ninsert into request_events SELECT * FROM request_events LIMIT 0",
     "not INSERT"),
    ("-- a note\n/* and another */ DROP TABLE request_events", "not DROP"),
    # after ClickHouse's "# " and "#!" comments: before 7 Dec the client library's message
    ("# a note\ninsert into request_events SELECT * FROM request_events LIMIT 0", "not INSERT"),
    ("#!/usr/bin/env governor-sql\n#!x\n-- y\nINSERT INTO request_events SELECT * FROM "
     "request_events LIMIT 0", "not INSERT"),
    # after a nested comment: before 7 Dec the client library's message, and "not DropQuery"
    ("/* a /* b */ c */ insert into request_events SELECT * FROM request_events LIMIT 0",
     "not INSERT"),
    ("/* a /* b /* c */ d */ e */\n-- f\nDROP TABLE request_events", "not DROP"),
    ("ALTER TABLE request_events DELETE WHERE 1", "not ALTER"),
    ("CREATE TABLE x (a UInt8) ENGINE = Memory", "not CREATE"),
    ("OPTIMIZE TABLE request_events FINAL", "not OPTIMIZE"),
    ("SET readonly = 0", "not SET"),
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file"),
    ("SELECT * FROM requests AS r JOIN url('http://127.0.0.1:1/x', CSV) AS u ON 1", "url"),
    ("SELECT length(file('/etc/hostname'))", "function file"),
    ("SELECT 1 INTO OUTFILE '/tmp/governor-guard-test.txt'", "INTO OUTFILE"),
    ("SHOW TABLES INTO OUTFILE '/tmp/governor-guard-test.txt' TRUNCATE", "INTO OUTFILE"),
    ("DESCRIBE TABLE worker_status INTO OUTFILE '/tmp/governor-guard-test.txt'", "INTO OUTFILE"),
    ("EXPLAIN SYNTAX SELECT 'x' INTO OUTFILE '/tmp/governor-guard-test.txt' APPEND",
     "INTO OUTFILE"),
    ("EXISTS TABLE worker_status INTO OUTFILE '/tmp/governor-guard-test.txt'", "INTO OUTFILE"),
    ("SHOW CREATE TABLE worker_status INTO OUTFILE '/tmp/governor-guard-test.txt'",
     "INTO OUTFILE"),
    ("INSERT INTO FUNCTION file('/tmp/governor-guard-test.csv', 'CSV') SELECT 1", "not INSERT"),
    # a FORMAT of its own: before 6 Dec a syntax error on "FORMAT Native", never written
    ("SELECT 1 FORMAT CSV", "FORMAT CSV is not allowed here: the output's format is --format's"),
    ("SELECT 1 UNION ALL SELECT 2 FORMAT JSONEachRow", "FORMAT JSONEachRow is not allowed"),
    ("SHOW TABLES FORMAT TSV", "FORMAT TSV is not allowed"),
    ("EXPLAIN SELECT 1 FORMAT CSV", "FORMAT CSV is not allowed"),
    # the client's own: before 7 Dec the guard could not tell it from the client's in the
    # engine's parse, and the query failed on a syntax error about a second FORMAT Native
    ("SELECT 1 FORMAT Native", "FORMAT Native is not allowed here: the output's format is"),
    ("SHOW TABLES format native -- a note", "FORMAT native is not allowed"),
    ("EXPLAIN SELECT 1 FORMAT Native /* a note */", "FORMAT Native is not allowed"),
    ("SELECT 1; SELECT 2", "one statement at a time"),
    ("SELECT 1; DROP TABLE request_events", "one statement at a time"),
    # the end of a nested comment's inner one is no end of it: before 7 Dec the quote after it
    # hid the ';' from the guard, and the engine's parse said "explainString!..."
    ("SELECT 1 /* a /* b */ ' */; SELECT 2 -- '", "one statement at a time"),
    # a "# " comment ends at its line's end, and a quote in it opens nothing: before 7 Dec the
    # quote hid the ';' from the guard, and the engine's parse said "explainString!..."
    ("# it's\nSELECT 1; SELECT 2 -- '", "one statement at a time"),
    ("SELECT 1 # a note\n; SELECT 2", "one statement at a time"),
    ("SELECT 1 #a; SELECT 2", "one statement at a time"),  # ("#a" is no comment)
    ("SELECT 1; -- a note\nSELECT 2", "one statement at a time"),
    ("SELECT 1; /* a note */ SELECT 2", "one statement at a time"),
    ("SELECT nonsense(", "not one valid statement"),
    ("", "empty"),
]


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    """One migrated store for the module, opened read-only as the endpoint opens it."""
    location = StoreLocation("t_guard", data_dir=tmp_path_factory.mktemp("guard") / "chdb")
    Store.open(location).close()
    opened = Store.open(location, readonly=True)
    yield opened
    opened.close()


@pytest.mark.parametrize("sql", READS)
def test_reads_run(reader, sql):
    assert isinstance(guarded_query(reader, sql).rows, list)


@pytest.mark.parametrize(("sql", "why"), REFUSED)
def test_anything_else_is_refused_before_it_runs(reader, sql, why):
    with pytest.raises(BadQuery, match=why):
        guarded_query(reader, sql)
    assert reader.query("SELECT count() FROM request_events").rows == [[0]]  # nothing written


def test_the_read_only_connection_refuses_writes_even_without_the_guard(reader):
    with pytest.raises(StoreError, match="readonly"):
        reader.command("INSERT INTO request_events (request_id) VALUES ('x')")


def test_a_syntax_error_is_placed_in_the_statement_as_written(reader):
    with pytest.raises(BadQuery, match=r"position 7 .*col 7"):
        guarded_query(reader, "SELEC 1")


LIFTING_A_LIMIT = [
    "SELECT number FROM numbers(10) SETTINGS max_result_rows = 0, max_execution_time = 0",
    "SELECT 1 SETTINGS max_memory_usage = 0",
    "SELECT 1 SETTINGS max_result_bytes = 0, result_overflow_mode = 'break'",
    "SELECT 1 SETTINGS readonly = 2",
    "EXPLAIN SYNTAX SELECT 'x' SETTINGS max_threads = 1",
]


@pytest.mark.parametrize("sql", LIFTING_A_LIMIT)
def test_no_query_changes_a_setting(reader, sql):
    """Under ``readonly=2`` a query's SETTINGS clause lifted the endpoint's limits: it ran
    unbounded in the sink's process."""
    with pytest.raises(BadQuery, match="cannot change settings"):
        guarded_query(reader, sql)


def test_a_read_is_bounded_in_time_rows_bytes_and_memory(reader):
    limits = guarded_query(reader, "SELECT getSetting('max_execution_time'), "
                                   "getSetting('max_result_rows'), getSetting('max_result_bytes'), "
                                   "getSetting('max_memory_usage')").rows[0]
    assert all(limit > 0 for limit in limits), limits
    bounded = Store.open(reader.location, readonly=True)  # (an overflow spoils its connection)
    try:
        with pytest.raises(StoreError, match="TOO_MANY_ROWS_OR_BYTES"):
            guarded_query(bounded, "SELECT number FROM numbers(1500000)")
    finally:
        bounded.close()


def test_the_parsed_statement_is_checked_too_whatever_its_first_word() -> None:
    """The first word is a quick, clear refusal; the engine's parse decides (a statement may
    begin with a comment or a parenthesis)."""
    from analytics.guard import check_ast

    with pytest.raises(BadQuery, match="only reads are allowed here, not InsertQuery"):
        check_ast(["InsertQuery (children 1)", " Identifier request_events"])


FIRST_WORDS = [  # (sql, the writing word the guard refuses, or None)
    ("/* a /* b */ c */ SELECT 1", None),
    ("/* a /* b */ DROP */ SELECT 1", None),
    ("/* a /* b */ c */ DROP TABLE t", "DROP"),
    ("/* a /* b /* c */ d */ e */ SET readonly = 0", "SET"),
    ("/*/ INSERT */ SELECT 1", None),  # ("/*/" opens a comment and goes on)
    ("/**/INSERT INTO t VALUES (1)", "INSERT"),
    ("/* a /*/ b */ c */ INSERT INTO t VALUES (1)", "INSERT"),  # ("/*/" nests one more)
    ("/* -- */ DROP TABLE t", "DROP"),  # (a "--" inside a block comment ends nothing)
    ("-- /* not a block comment\nDROP TABLE t", "DROP"),
    ("/* a /* b */ DROP TABLE t", None),  # (not closed: the engine's parse refuses it)
]


@pytest.mark.parametrize(("sql", "word"), FIRST_WORDS)
def test_the_first_word_follows_block_comments_nested_as_clickhouse_nests_them(
        sql: str, word: str | None) -> None:
    """ClickHouse's lexer counts each ``/*`` and ``*/`` inside a block comment: ``/* a /* b */
    c */`` is one comment. Before 7 Dec the guard ended it at the first ``*/`` and judged ``c``:
    a write after a nested comment was refused by the engine's parse, with another message
    (or a client library's), and a read whose comment held a writing word was refused."""
    from analytics.guard import check_first_word

    if word is None:
        check_first_word(sql)
    else:
        with pytest.raises(BadQuery, match=f"^only reads are allowed here, not {word}$"):
            check_first_word(sql)
