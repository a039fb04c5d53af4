"""A batch of records on its way to the store, and the inserts that write it. Pure.

Rows are kept per table and, inside a table, per Kafka partition in offset order, so the same
records always give the same inserts in the same order, however the fetches that brought them
were interleaved. That is what lets the sink write a batch again after a crash with the same
insert dedup tokens (``<flush_id>:<table>``) and have the store drop what it already holds.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from analytics.schema import TABLES


@dataclass(frozen=True, order=True)
class OffsetRange:
    """The records ``first..last`` (inclusive) of one partition."""

    topic: str
    partition: int
    first: int
    last: int

    def as_list(self) -> list:
        return [self.topic, self.partition, self.first, self.last]

    @classmethod
    def from_list(cls, item: list) -> "OffsetRange":
        topic, partition, first, last = item
        return cls(str(topic), int(partition), int(first), int(last))


@dataclass(frozen=True)
class Insert:
    table: str
    data: pa.Table
    token: str


@dataclass
class Batch:
    """Rows of consecutive records of some partitions, grouped by table, as Arrow tables."""

    records: int = 0
    _pieces: dict[str, dict[tuple[str, int], list[pa.Table]]] = field(default_factory=dict)
    _ranges: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, table: str, row: tuple) -> None:
        """Add one row; rows of a partition must come in offset order (as Kafka delivers them)."""
        topic, partition, offset = row[0], row[1], row[2]
        self.add_partition(topic, partition, offset, offset, {table: TABLES[table].to_arrow([row])})

    def add_partition(self, topic: str, partition: int, first: int, last: int,
                      tables: dict[str, pa.Table]) -> None:
        """Add the rows of the consecutive records ``first..last`` of one partition (hot path)."""
        tp = (topic, partition)
        span = self._ranges.get(tp)
        if span is None:
            self._ranges[tp] = [first, last]
        elif first <= span[1] or last < first:
            raise ValueError(f"{topic}[{partition}]@{first} is not after {span[1]}")
        else:
            span[1] = last
        for table, data in tables.items():
            self._pieces.setdefault(table, {}).setdefault(tp, []).append(data)
            self.records += data.num_rows

    def last_offset(self, topic: str, partition: int) -> int:
        """The offset of the partition's last record in the batch; -1 if it has none."""
        span = self._ranges.get((topic, partition))
        return -1 if span is None else span[1]

    def gapless(self) -> bool:
        """Whether each partition's records run from its first to its last with no offset
        missing (each record is one row): none that compaction or a transaction's markers took
        out from between them."""
        return self.records == sum(last - first + 1 for first, last in self._ranges.values())

    def ranges(self) -> list[OffsetRange]:
        return sorted(OffsetRange(t, p, first, last)
                      for (t, p), (first, last) in self._ranges.items())

    def data(self, table: str) -> pa.Table:
        """The rows of ``table``, partition by partition in a fixed order, in one Arrow chunk."""
        by_partition = self._pieces[table]
        pieces = [piece for tp in sorted(by_partition) for piece in by_partition[tp]]
        return pa.concat_tables(pieces).combine_chunks()

    def tables(self) -> list[str]:
        return sorted(self._pieces)

    def inserts(self, flush: int | str) -> list[Insert]:
        """The inserts that write this batch as ``flush`` (its id, or the prefix of its dedup
        tokens: ``analytics.journal.Flush.token``), one per table."""
        return [Insert(table, self.data(table), f"{flush}:{table}") for table in self.tables()]

    def __len__(self) -> int:
        return self.records


def covers(ranges: Iterable[OffsetRange], topic: str, partition: int, offset: int) -> bool:
    """Whether ``offset`` of ``topic[partition]`` lies in one of ``ranges``."""
    return any(r.topic == topic and r.partition == partition and r.first <= offset <= r.last
               for r in ranges)
