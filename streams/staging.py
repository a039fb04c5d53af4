"""A Faust table seen as a mapping whose writes are held, then written back with their partition.

Faust changelogs only what is assigned to a table, and by default to the partition of the event
being processed. An agent that takes events in batches (many partitions at once) and keeps its
state in plain dicts therefore stages its writes here, tagged with the partition of the record that
caused them (which is the partition of the key, since every table is keyed like its source topic),
and writes them back in one go after what they caused downstream has been acknowledged: a state
that says "seen" is never on the changelog before the outputs it stands for.

The books change the values they read in place before they assign them back. Within a unit of
work (``begin``: one record) a read hands out a copy, so a record that fails half-way is undone
whole by ``rollback`` (and dead-lettered), leaving neither the store nor the staged writes of
the records before it changed. ``discard`` drops a failed batch's staged writes.
"""

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import orjson

from streams.expiry import ExpiryIndex

_DELETED = object()
_ABSENT = object()


def _copy(value: Any) -> Any:
    """A deep copy, as the changelog would give the value back (tuples come back as lists); a
    number as it is (the times table's: read once a record)."""
    if isinstance(value, int | float):
        return value
    return orjson.loads(orjson.dumps(value))


class StagedTable(MutableMapping):
    def __init__(self, table: Any) -> None:
        self.table = table
        #: Files each entry under the time a sweep must look at it (when set), as it is staged:
        #: the sweep that ends a batch sees the entries that batch wrote (filed only as written
        #: back, they were looked at one batch later, so a task due by the batch's end timed
        #: out or not by where the batches ended, before 7 Dec).
        self.expiry: ExpiryIndex | None = None
        #: The partition of the record being processed; writes are tagged with it.
        self.partition: int | None = None
        #: Whether a key's entry covers the others' (the windows' watermark ``~wm|p``): it is
        #: written back after them, so that a write-back cut short never leaves it ahead of them.
        self.written_last: Callable[[Any], bool] = lambda _key: False
        #: The partition a key's entry belongs to whatever record wrote it (the times' ``t|2``:
        #: a partition's sweeps run at its time); ``None``: the record's (``partition``).
        self.partition_of_key: Callable[[Any], int] | None = None
        self._writes: dict[Any, tuple[int | None, Any]] = {}
        #: In a unit of work: the staged entry each key had before the unit wrote it, and the
        #: value each key read or written in the unit is seen as (``None``: no unit).
        self._undo: dict[Any, Any] | None = None
        self._seen: dict[Any, Any] | None = None

    @property
    def _store(self) -> Any:
        return self.table.data

    def __getitem__(self, key: Any) -> Any:
        seen = self._seen
        if seen is not None and key in seen:
            value = seen[key]
        elif key in self._writes:
            value = self._writes[key][1]
        else:
            value = self._store[key]
        if value is _DELETED:
            raise KeyError(key)
        if seen is not None and key not in seen:
            value = seen[key] = _copy(value)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._stage(key, value)

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self._stage(key, _DELETED)

    def _stage(self, key: Any, value: Any) -> None:
        if self._undo is not None:
            if key not in self._undo:
                self._undo[key] = self._writes.get(key, _ABSENT)
            self._seen[key] = value
        by_key = self.partition_of_key
        self._writes[key] = (self.partition if by_key is None else by_key(key), value)
        if self.expiry is not None:
            self._file(key, value)

    def _file(self, key: Any, value: Any) -> None:
        if value is _DELETED:
            self.expiry.forget(key)
        else:
            self.expiry.note(key, self.partition, value)

    # -- units of work ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a unit of work: until ``commit`` or ``rollback``, reads hand out copies (the
        first read of a key in the unit copies it; later ones see that copy)."""
        self._undo, self._seen = {}, {}

    def commit(self) -> None:
        """Keep what the unit staged."""
        self._undo = self._seen = None

    def rollback(self) -> None:
        """Undo what the unit staged: the staged writes are as they were at ``begin``."""
        for key, entry in (self._undo or {}).items():
            if entry is _ABSENT:
                self._writes.pop(key, None)
            else:
                self._writes[key] = entry
            if self.expiry is not None:  # filed again as it is back to
                self._file(key, entry[1] if entry is not _ABSENT else
                           self._store.get(key, _DELETED))
        self._undo = self._seen = None

    def discard(self) -> None:
        """Drop every staged write (a batch whose outputs were not all sent)."""
        self._writes.clear()
        self._undo = self._seen = None

    def __contains__(self, key: object) -> bool:
        if key in self._writes:
            return self._writes[key][1] is not _DELETED
        return key in self._store

    def __iter__(self) -> Iterator[Any]:
        keys = {k for k, (_p, v) in self._writes.items() if v is not _DELETED}
        gone = {k for k, (_p, v) in self._writes.items() if v is _DELETED}
        yield from keys
        yield from (k for k in list(self._store.keys()) if k not in keys and k not in gone)

    def keys_in(self, partition: int, stored: list) -> list:
        """The keys of ``partition``, given those the store holds there (``stored``), as the
        staged writes leave them: without those staged deleted, with those staged new to it
        (after the others, in the order they were staged, as a write-back would add them)."""
        writes = self._writes
        kept = [k for k in stored if k not in writes or writes[k][1] is not _DELETED]
        held = set(stored)
        return kept + [k for k, (p, value) in writes.items()
                       if p == partition and value is not _DELETED and k not in held]

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def flush(self, only: Callable[[Any], bool] | None = None
              ) -> list[tuple[str, bytes, bytes | None, int]]:
        """Write the staged values (those of the keys ``only`` picks: an agent's own, in a table
        two agents write) to the store; return the changelog records to send, as
        ``(topic, key, value, partition)`` in the table's JSON encoding (``None``: a deletion).

        They are sent by the caller straight to the producer rather than through Faust's
        ``send_changelog``, whose one-at-a-time buffer throttles the consumer (Faust flushes the
        producer before it commits offsets either way).

        In the order staged, but the entries ``written_last`` picks after the others: the
        producer sends a partition's records in order, and a worker that crashes in the middle
        leaves a prefix of them on the changelog. Before 7 Dec the windows' watermark, staged
        first, could land without the keys it covers, and the replay judged their observations
        late against it."""
        store = self._store
        key_partition = getattr(store, "_key_partition", None)  # memory store: revocation map
        topic = self.table.changelog_topic.get_topic_name()
        records = []
        writes = sorted(((key, write) for key, write in self._writes.items()
                         if only is None or only(key)),
                        key=lambda write: self.written_last(write[0]))
        for key, (partition, value) in writes:
            if value is _DELETED:
                store.pop(key, None)
                records.append((topic, orjson.dumps(key), None, partition))
                if key_partition is not None:
                    key_partition.pop(key, None)
            else:
                store[key] = value
                records.append((topic, orjson.dumps(key), orjson.dumps(value), partition))
                if key_partition is not None and partition is not None:
                    key_partition[key] = partition
            del self._writes[key]
        return records
