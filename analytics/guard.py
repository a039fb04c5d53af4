"""Read-only SQL: what the SQL endpoint lets through.

The store's read-only setting (``readonly=1``) refuses writes, DDL and setting changes (so no
query lifts the limits of ``analytics.store.READ_SETTINGS``), but an embedded engine has
no users or grants, so table functions and ``INTO OUTFILE`` would still reach the file system and
the network (``file('/etc/passwd')``, ``url(...)``). So before a query runs, the engine parses it
(``EXPLAIN AST``, which executes nothing) and ``check_ast`` accepts only:

- one statement that reads: SELECT (with UNION, INTERSECT, EXCEPT), SHOW TABLES, DESCRIBE,
  SHOW CREATE TABLE, EXISTS, EXPLAIN;
- table functions that make data up (``numbers``, ``zeros``, ``generateRandom``, ``values``,
  ``view``, ...), never ones that read files, URLs or other servers;
- no ``file()`` scalar function, no ``INTO OUTFILE`` and no ``FORMAT`` (``--format`` chooses;
  ``FORMAT Native``, the client's own, is found in the text: ``check_no_format``).
"""

import re

from schemas.errors import TerminalError

READING_STATEMENTS = frozenset({
    "SelectWithUnionQuery", "SelectIntersectExceptQuery", "ShowTables", "DescribeQuery",
    "ShowCreateTableQuery", "ExistsTableQuery", "Explain",
})
SAFE_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "generate_series", "generateSeries",
    "generateRandom", "values", "null", "view", "merge",
})
IO_FUNCTIONS = frozenset({"file"})
#: Statements refused by their first word, before the engine parses them (an INSERT ... SELECT
#: ... LIMIT 0 made the parse fail with a client library's message rather than this one).
WRITING_KEYWORDS = frozenset({
    "INSERT", "ALTER", "CREATE", "DROP", "DELETE", "UPDATE", "TRUNCATE", "RENAME", "OPTIMIZE",
    "ATTACH", "DETACH", "GRANT", "REVOKE", "SET", "SYSTEM", "KILL", "USE", "BACKUP", "RESTORE",
    "EXCHANGE", "UNDROP", "MOVE",
})


#: A line comment, to its line's end: ``--``, and ClickHouse's ``# `` and ``#!`` (anywhere in a
#: statement, as ``--``; a ``#`` followed by anything else is no comment to its parser).
LINE_COMMENT = r"--[^\n]*|#[ !][^\n]*"
#: Blanks and line comments before a statement's first word.
_BLANKS_AND_LINE_COMMENTS = re.compile(rf"(?:\s+|{LINE_COMMENT})*")
#: What opens and closes a block comment, as ClickHouse's lexer reads them: from left to right,
#: each mark's two characters its own (``/*/`` opens one; its last ``/`` closes nothing).
_BLOCK_COMMENT_MARKS = re.compile(r"/\*|\*/")


def check_first_word(sql: str) -> None:
    """Raise BadQuery for a statement that begins as a write, DDL or setting change does, after
    any comments (a comment before an INSERT made it one for the engine's parse to refuse, with
    a client library's message)."""
    words = sql[_first_word_at(sql):].split(None, 1)
    first = words[0].upper() if words else ""
    if first in WRITING_KEYWORDS:
        raise BadQuery(f"only reads are allowed here, not {first}")


def _first_word_at(sql: str) -> int:
    """Where ``sql``'s first word begins, after blanks and comments (``governor report
    --show-sql`` heads each report's SQL with a ``/* ... */`` one)."""
    at = _BLANKS_AND_LINE_COMMENTS.match(sql).end()
    while sql.startswith("/*", at):
        at = _BLANKS_AND_LINE_COMMENTS.match(sql, block_comment_end(sql, at)).end()
    return at


def block_comment_end(sql: str, start: int) -> int:
    """Where the block comment opened at ``start`` ends, past the ``*/`` that closes it; the end
    of ``sql`` where none does (the engine's parse refuses it). Nested ones end inside it, as
    ClickHouse nests them: ``/* a /* b */ c */`` is one comment (before 7 Dec the guard ended it
    at the first ``*/`` and judged ``c``)."""
    depth = 0
    for mark in _BLOCK_COMMENT_MARKS.finditer(sql, start):
        depth += 1 if mark[0] == "/*" else -1
        if depth == 0:
            return mark.end()
    return len(sql)


class BadQuery(TerminalError):
    """A query the endpoint does not run: malformed, or not a pure read; the message says why."""


#: A FORMAT clause at a statement's end (its text outside quotes and comments).
_FORMAT_AT_END = re.compile(r"\bFORMAT\s+(\w+)\s*$", re.IGNORECASE)


def check_no_format(unquoted: str) -> None:
    """Raise BadQuery for a statement whose text outside quotes and comments (``unquoted``)
    ends in a FORMAT clause: ``FORMAT Native``, the client's own, which the engine's parse
    shows as it shows none (``check_ast`` tells the others; before 7 Dec the query then failed
    on a syntax error about a second ``FORMAT Native``)."""
    if (found := _FORMAT_AT_END.search(unquoted)) is not None:
        raise _format_refused(found[1])


def _format_refused(name: str) -> BadQuery:
    return BadQuery(f"FORMAT {name} is not allowed here: the output's format is --format's "
                    "(table, csv or json)")


def check_ast(lines: list[str]) -> None:
    """Raise BadQuery unless the ``EXPLAIN AST`` output ``lines`` describe a pure read."""
    if not lines:
        raise BadQuery("empty statement")
    nodes = [(len(line) - len(line.lstrip(" ")), line.strip()) for line in lines if line.strip()]
    statement = nodes[0][1].split()[0]
    if statement not in READING_STATEMENTS:
        raise BadQuery(f"only reads are allowed here, not {statement}")
    # (The client asks for its own format, FORMAT Native: a FORMAT written in the query is a
    # last top-level identifier of another name, and then the query fails on the two FORMATs
    # with a syntax error about one the user never wrote.)
    last_top = [text for depth, text in nodes if depth == 1][-1:]
    if last_top and last_top[0].split()[0] == "Identifier" and last_top[0].split()[1:] != [
            "Native"]:
        raise _format_refused(" ".join(last_top[0].split()[1:]))
    parents: list[str] = []
    for depth, text in nodes:
        del parents[depth:]
        kind = text.split()[0]
        if depth == 1 and kind == "Literal":  # (SHOW, DESCRIBE, EXPLAIN... take one too)
            raise BadQuery("INTO OUTFILE is not allowed")
        if kind == "Function":
            name = text.split()[1]
            if name in IO_FUNCTIONS:
                raise BadQuery(f"the function {name}() reads files and is not allowed")
            if parents and parents[-1] == "TableExpression" and name not in SAFE_TABLE_FUNCTIONS:
                raise BadQuery(f"the table function {name}() is not allowed; allowed: "
                                     f"{', '.join(sorted(SAFE_TABLE_FUNCTIONS))}")
        parents.append(kind)
