"""StagedTable: reads see staged writes; flush writes the store and returns changelog records."""

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
