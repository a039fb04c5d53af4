"""The migrations create what the sink inserts into, once, and record their versions."""

import pytest

from analytics.migrations import LATEST_VERSION, MIGRATIONS
from analytics.schema import TABLES, database_for
from analytics.store import Store

# ClickHouse column types each Arrow type of the insert contract may land in.
COMPATIBLE = {
    "string": {"String", "LowCardinality(String)"}, "binary": {"String"},
    "uint8": {"UInt8"}, "uint16": {"UInt16"}, "uint32": {"UInt32"}, "uint64": {"UInt64"},
    "double": {"Float64"}, "timestamp[ms]": {"DateTime64(3)", "DateTime64(3, 'UTC')"},
    "list<item: string>": {"Array(LowCardinality(String))"},
    "map<string, double>": {"Map(LowCardinality(String), Float64)"},
}


def _bare(ch_type: str) -> str:
    return ch_type[len("Nullable("):-1] if ch_type.startswith("Nullable(") else ch_type


def test_the_insert_contract_matches_the_migrated_tables(store):
    for name, spec in TABLES.items():
        described = {row[0]: row[1] for row in store.query(f"DESCRIBE TABLE {name}").rows}
        for column, arrow_type in spec.columns:
            assert column in described, f"{name}.{column} missing"
            assert _bare(described[column]) in COMPATIBLE[str(arrow_type)], (name, column)
        assert set(described) - {c for c, _ in spec.columns} == {"ingested"}, name


def test_migrations_are_recorded_and_applied_once(store, location):
    versions = store.query("SELECT version, name FROM schema_migrations ORDER BY version").rows
    assert [v for v, _ in versions] == [m.version for m in MIGRATIONS]
    assert versions[-1][0] == LATEST_VERSION
    again = Store.open(location)  # a restart: nothing left to apply
    try:
        assert again.migrate() == []
        assert again.query("SELECT count() FROM schema_migrations").rows == [[len(MIGRATIONS)]]
    finally:
        again.close()


def test_rollups_and_ttls_exist(store):
    engines = dict(store.query("SELECT name, engine FROM system.tables "
                               "WHERE database = currentDatabase()").rows)
    for rollup in ("request_minute", "request_outcomes", "response_summaries", "worker_minute",
                   "kv_minute"):
        assert engines[rollup] == "AggregatingMergeTree"
        assert engines[f"{rollup}_mv"] == "MaterializedView"
    assert engines["requests"] == "View"
    for table in TABLES:
        assert engines[table] == "ReplacingMergeTree"
        ddl = store.query(f"SHOW CREATE TABLE {table}").rows[0][0]
        assert "TTL " in ddl and "LowCardinality" in ddl and "DateTime64(3)" in ddl


@pytest.mark.parametrize(("namespace", "database"), [
    ("governor", "governor"), ("demo-20260101-000000-ab12cd", "demo_20260101_000000_ab12cd"),
    ("t.a_b", "t_a_b")])
def test_a_namespace_gets_a_database_of_its_own(namespace, database):
    assert database_for(namespace) == database


def test_a_store_behind_this_governors_schema_is_refused_read_only_with_what_to_do(location):
    """A read-only open applies no migration: reports read tables the store lacks (``governor
    report`` on a version 7 store failed on 'Unknown table expression identifier
    config_settings')."""
    import pytest

    from analytics.migrations import LATEST_VERSION
    from analytics.store import Store, StoreError

    store = Store.open(location)
    store.command(f"DELETE FROM schema_migrations WHERE version = {LATEST_VERSION}")
    store.close()
    with pytest.raises(StoreError, match=f"schema version {LATEST_VERSION - 1}; this Governor "
                                         f"reads version {LATEST_VERSION}: start `governor sink`"):
        Store.open(location, readonly=True)
    Store.open(location).close()  # a sink's open migrates it
    Store.open(location, readonly=True).close()


def test_a_failed_read_of_the_schema_version_is_told_as_it_is(location, monkeypatch):
    """Only a store without the migrations table is at version 0: another failure (no access to
    it, a timeout) was taken for version 0, and a current store refused as behind."""
    import pytest

    from analytics.store import Store, StoreError

    Store.open(location).close()
    opened = Store.open(location, readonly=True)
    try:
        def denied(*args, **kwargs):  # as a server's read-only account without the grant
            raise RuntimeError("Code: 497. DB::Exception: Not enough privileges. (ACCESS_DENIED)")

        monkeypatch.setattr(opened.client, "query", denied)
        with pytest.raises(StoreError, match="reading the analytics store's schema version "
                                             "failed: .*ACCESS_DENIED"):
            opened.schema_version()
    finally:
        monkeypatch.undo()
        opened.close()
