"""StagedTable: reads see staged writes; flush writes the store and returns changelog records."""

from streams.expiry import ExpiryIndex
from streams.staging import StagedTable


class FakeStore(dict):
    def __init__(self):
        super().__init__()
        self._key_partition = {}

    @property
    def data(self):
        return self


class FakeTopic:
    def get_topic_name(self):
        return "ns.streams-t-changelog"


class FakeTable:
    def __init__(self):
        self.data = FakeStore()
        self.changelog_topic = FakeTopic()


def test_writes_are_held_until_flush_then_changelogged_with_their_partition():
    table = FakeTable()
    table.data["old"] = 1
    staged = StagedTable(table)
    staged.partition = 3
    staged["a"] = {"n": 1}
    staged.partition = 1
    del staged["old"]
    assert staged["a"] == {"n": 1} and "old" not in staged and set(staged) == {"a"}
    assert "a" not in table.data
    records = staged.flush()
    # JSON keys and values, as the table's json serializers read them back on recovery.
    assert records == [("ns.streams-t-changelog", b'"a"', b'{"n":1}', 3),
                       ("ns.streams-t-changelog", b'"old"', None, 1)]
    assert dict(table.data) == {"a": {"n": 1}}
    assert table.data._key_partition == {"a": 3}
    assert staged.flush() == []


def test_a_unit_rolled_back_leaves_the_store_and_the_staged_writes_as_they_were():
    """The books change what they read in place before assigning it back: a record that failed
    half-way through left its changes in the store's own dicts (written to the changelog with
    the key's next write) and in the writes of the records before it."""
    table = FakeTable()
    table.data["task"] = {"last": 1, "ok": {"1": 1}}
    staged = StagedTable(table)
    staged.begin()  # a record that goes through
    st = staged["task"]
    st["ok"]["2"] = 1
    staged["task"] = st
    staged["new"] = {"n": 1}
    staged.commit()
    staged.begin()  # one that fails half-way
    st = staged["task"]
    st["last"] = 9
    st["ok"]["3"] = 1
    assert staged["task"] is st  # the unit sees its own changes
    staged["task"] = st
    del staged["new"]
    staged["other"] = {"n": 2}
    staged.rollback()
    assert table.data["task"] == {"last": 1, "ok": {"1": 1}}
    assert staged["task"] == {"last": 1, "ok": {"1": 1, "2": 1}}
    assert staged["new"] == {"n": 1} and "other" not in staged
    assert {key for _topic, key, _value, _p in staged.flush()} == {b'"task"', b'"new"'}


def test_discard_drops_every_staged_write():
    table = FakeTable()
    table.data["a"] = {"n": 1}
    staged = StagedTable(table)
    staged["a"] = {"n": 2}
    staged["b"] = {"n": 3}
    staged.discard()
    assert staged["a"] == {"n": 1} and "b" not in staged and staged.flush() == []


def test_an_entry_is_filed_for_its_sweep_as_it_is_staged_and_again_as_rolled_back():
    """The sweep that ends a batch looks at the entries due in the index: one staged by that
    batch was filed only as it was written back, after the sweep."""
    table = FakeTable()
    table.data["kept"] = {"due": 5_000}
    staged = StagedTable(table)
    staged.expiry = ExpiryIndex(lambda value: value["due"])
    staged.partition = 1
    staged["a"] = {"due": 10_000}
    assert staged.expiry.due(1, 10_001) == ["a"]  # before any write-back
    staged.begin()
    staged["kept"] = {"due": 50_000}
    staged["b"] = {"due": 10_000}
    staged.rollback()  # back to the stored entry, and to none
    assert staged.expiry.due(1, 10_001) == ["kept"]


def test_a_flush_of_the_keys_picked_leaves_the_others_staged_and_tags_each_by_its_key():
    """The times table, which two agents write (``t|p`` the ingest agent, ``k|p`` the tasks
    agent): each writes back its own keys after its own entries, and a key's partition is the
    one it names, whatever record moved it."""
    table = FakeTable()
    staged = StagedTable(table)
    staged.partition_of_key = lambda key: int(key.rpartition("|")[2])
    staged.partition = 0
    staged["t|2"], staged["k|3"] = 10, 20
    assert staged.flush(lambda key: key.startswith("t|")) == [
        ("ns.streams-t-changelog", b'"t|2"', b"10", 2)]
    assert dict(table.data) == {"t|2": 10} and staged["k|3"] == 20
    assert staged.flush() == [("ns.streams-t-changelog", b'"k|3"', b"20", 3)]
