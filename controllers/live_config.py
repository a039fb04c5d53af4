"""The configuration in force, from the records of the compacted ``governor.config`` topic. Pure.

Records apply in offset order, each on top of the last good configuration. A record whose key
names no setting, whose value fails validation, or that the component cannot apply (for example
an unknown scorer name) is rejected with the reason, and the last good configuration stays. So
is a record whose Kafka key is not the setting it sets: the topic is compacted by key, and such
a record would take the place of the setting its key names. And so is one that says its value
has held since more than ``AHEAD_MS`` after its record was
written (its Kafka timestamp, the broker's as it appended it: every reader judges it alike),
as an operator's command is (``controllers.overrides``): taken, it would stand for a change
made after every command of the next hours, which could not end it, nor hold over it.

Compaction keeps the newest record of each key, a rejected one too: left alone, a rejected
record would take the place of the good one before it, and a component started after the log
cleaner ran would not have that setting. Nor would it have a setting that held only after an
older record of another key, which compaction drops: ``shedding.low`` 0.1, ``shedding.high``
0.2, ``shedding.low`` 0.05 keeps the last two, and the high, first of them, is refused above the
default low (0.3). ``to_restore`` lists the records to write (the router does) where a key's
newest record was rejected, and ``kept_otherwise`` (``governor config set`` writes them after
its change) where the records compaction keeps would give a key another value than the one in
force: each sets the value in force under its key, and says since when that value has been in
force (``in_force_since_ms``): a router weighs a setting against the commands made since by it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from controllers.overrides import AHEAD_MS
from schemas.config import MAP_KEYS, ConfigSet, GovernorConfig, map_entry
from schemas.errors import one_line
from schemas.events import ConfigApplied, ConfigRejected
from schemas.limits import MAX_MAP_ENTRIES


#: Who sets a good record written again (``to_restore``), whichever router writes it.
RESTORED_BY = "governor-restore"


class StaleRestore(ValueError):
    """A record restoring a value older than a setting made since under its key."""


@dataclass
class LiveConfig:
    component: str
    config: GovernorConfig = GovernorConfig()
    #: Called with each candidate configuration; raises ValueError if the component cannot use it.
    check: Callable[[GovernorConfig], None] = lambda _config: None
    #: The keys a record was applied under.
    _applied: set[str] = field(default_factory=set)
    #: Keys whose newest record was rejected after a good one: ``to_restore``.
    _shadowed: set[str] = field(default_factory=set)
    #: The newest record of each Kafka key, with its offset and timestamp: what compaction keeps.
    _newest: dict[bytes, tuple[int, ConfigSet, int | None]] = field(default_factory=dict)
    #: When each leaf of the configuration (by its dotted path in the JSON data) was last set,
    #: as the records applied say: what a record of the value in force says it holds since.
    _changed_ms: dict[str, int] = field(default_factory=dict)
    #: When each entry of a map (``tenants``: each tenant's limit) was last set or removed, by
    #: the map's key and the entry's name; and when each map as a whole was last set (by a
    #: record of its key or of a section holding it): what a record of a map's value in force
    #: says of each entry (``ConfigSet.entries_since_ms``).
    _entry_set_ms: dict[str, dict[str, int]] = field(default_factory=dict)
    _map_set_ms: dict[str, int] = field(default_factory=dict)
    #: The offset of the record (not a restoring one) that last set each leaf, and the last
    #: offset read from the topic: a restoring record written before a newer setting under its
    #: key is refused.
    _set_offset: dict[str, int] = field(default_factory=dict)
    _read_to: int = -1

    def __post_init__(self) -> None:
        self._base = self.config  # what the records apply to
        self._data = self.config.model_dump(mode="json")  # the config in force, as JSON data

    def apply(self, record: ConfigSet, offset: int, now_ms: int,
              record_key: bytes | None = None, asked: bool = False,
              written_ms: int | None = None) -> ConfigApplied | ConfigRejected:
        """``record_key``: the Kafka key of the record (None: not from the topic). ``asked``: a
        change a user asks for (``governor config set``), not yet on the topic: a removal of an
        entry that is not there is refused, where one read from the topic changes nothing.
        ``written_ms``: the record's Kafka timestamp (None: not checked)."""
        if record_key is not None:
            self._newest[record_key] = (offset, record, written_ms)
            self._read_to = max(self._read_to, offset)
        try:
            if written_ms is not None:
                _check_not_ahead(record, written_ms)
            if record_key is not None and record_key != record.key.encode():
                raise ValueError(
                    f"the record's key {record_key.decode(errors='replace')[:80]!r} is not the "
                    f"setting it sets, {record.key!r}: the topic is compacted by key, so a "
                    "record's key must be its setting")
            if record.set_by == RESTORED_BY:
                self._check_not_stale(record)
            # (a removal read from the topic may be its key's only record, compaction having
            # dropped the entry's: there is nothing to remove, and nothing wrong)
            candidate = self.config.with_setting(record.key, record.value,
                                                 missing_ok=record_key is not None and not asked)
            self.check(candidate)
        except (KeyError, ValueError, ValidationError) as exc:
            if record_key is not None and (record.set_by != RESTORED_BY or
                                           isinstance(exc, StaleRestore)):  # (a restoring
                # record rejected in turn is not restored again, routers could go on for ever;
                # but one older than the value in force is: it would be compaction's)
                key = record_key.decode(errors="replace")
                if key in self._applied:
                    self._shadowed.add(key)
            return ConfigRejected(event_time_ms=now_ms, key=record.key, component=self.component,
                                  config_offset=offset, reason=one_line(exc)[:2048])
        self._set(candidate, record, offset)
        self.config = candidate
        self._applied.add(record.key)
        self._shadowed.discard(record.key)
        return ConfigApplied(event_time_ms=now_ms, key=record.key, component=self.component,
                             config_offset=offset)

    def _check_not_stale(self, record: ConfigSet) -> None:
        """Raises ``StaleRestore`` where a router's record restoring a value was written
        before it read a record, applied here, that set something under its key since the
        record it restores after: taken, it would undo that."""
        if record.restored_after_offset is None:
            return
        newer = [path for path, offset in self._set_offset.items()
                 if _sets(record.key, path) and offset > record.restored_after_offset]
        if newer:
            raise StaleRestore(f"restores the value of {record.key} as read to offset "
                               f"{record.restored_after_offset}, but {min(newer)} was set "
                               "after it")

    def after_superseded(self, change: ConfigSet) -> ConfigSet:
        """``change``, stamped after every time the records applied so far say something under
        its key was set (its writer's clock behind theirs): once compaction has dropped the
        records it supersedes, a component started afterwards weighs an operator's command
        against this one alone, as the running ones, which read them all, weigh it against the
        latest (``governor config set``)."""
        key = change.key
        times = [at for path, at in self._changed_ms.items() if _sets(key, path)]
        located = map_entry(key)
        if located is not None:
            times.append(self._entry_set_ms.get(located[0], {}).get(located[1], 0))
        if key in MAP_KEYS:
            times += [self._map_set_ms.get(key, 0), *self._entry_set_ms.get(key, {}).values()]
        latest = max(times, default=0)
        if change.event_time_ms > latest:
            return change
        return change.model_copy(update={"event_time_ms": latest + 1})

    def to_restore(self, now_ms: int) -> list[ConfigSet]:
        """The records to write, once each, under the keys whose newest record so far was
        rejected and that had a good one before: each sets the value in force under its key
        (not the good record's own, which a later record of a whole section may have changed
        since), so it applies as it stands (``set_by`` ``RESTORED_BY``)."""
        restore = self._in_force(self._shadowed, now_ms, self._read_to)
        self._shadowed.clear()
        return restore

    def kept_otherwise(self, now_ms: int) -> list[ConfigSet]:
        """The records to write under the keys whose value, from the records compaction keeps
        (each key's newest, in offset order, applied as this component applies them), is not
        the one in force, in the order of their newest records: each sets the value in force
        under its key (``set_by`` ``RESTORED_BY``). It replays every key, each record as a
        reader applies it: for the writer of a change, not for every reader of it (CPU: 10 ms
        with 100 tenants set, 29 ms with 300, 0.11 s with 1,000, each tenant's record
        validating that tenant alone; ``python -m benchmarks.live_config_apply``)."""
        kept = LiveConfig(self.component, self._base, check=self.check)
        newest = sorted(self._newest.items(), key=lambda item: item[1][0])
        for key, (offset, record, written_ms) in newest:
            kept.apply(record, offset, 0, key, written_ms=written_ms)
        names = [key.decode(errors="replace") for key, _ in newest]
        return self._in_force([name for name in names
                               if _value(self.config, name) != _value(kept.config, name)], now_ms)

    def _set(self, candidate: GovernorConfig, record: ConfigSet, offset: int) -> None:
        """Note when each leaf that ``record`` sets (to ``candidate``'s value) was set: since
        the record says its value (or, in a map, that leaf's entry) has held, unless a record
        read before said later (its writer's clock ahead), as an operator's command is weighed
        against the latest (``controllers.overrides``); a leaf under its
        key counts though its value did not change (the configuration's word on it: it ends an
        operator's command about it, as one changed does), one elsewhere only if it changed.
        And when each map's entries and each map as a whole were set."""
        key = record.key
        leaves, data = self._leaves_set(key, candidate)
        for path in leaves:
            located = map_entry(path)
            at = record.value_since_ms if located is None else record.entry_since_ms(located[1])
            _note(self._changed_ms, path, at)
            if record.set_by != RESTORED_BY:  # (one restoring what was in force sets
                self._set_offset[path] = offset  # nothing new: routers' alike all apply)
            if located is not None:
                _note(self._entry_set_ms.setdefault(located[0], {}), located[1], at)
        for entry in record.entries_since_ms or {}:  # (those removed too)
            _note(self._entry_set_ms.setdefault(key, {}), entry, record.entry_since_ms(entry))
        for map_key in MAP_KEYS:
            if map_key == key or map_key.startswith(f"{key}."):
                _note(self._map_set_ms, map_key, record.value_since_ms)
        self._data = data

    def _leaves_set(self, key: str, candidate: GovernorConfig) -> tuple[set[str], dict]:
        """The leaves a record of ``key`` sets (``_set_by``) or changes, giving ``candidate``,
        and ``candidate`` as JSON data. Its work is that of the leaves under ``key`` and of
        those changed, not of every leaf of the configuration (with 1,000 tenants set, each of
        a few leaves): a record changes nothing but the node it reaches (``_reach``), whose data
        alone is read from ``candidate``."""
        reach = _reach(key)
        try:
            node = candidate.data_at(reach)
        except KeyError:  # (an entry removed)
            node = _MISSING
        data = _replaced(self._data, reach, node)
        where = ".".join(reach)
        set_by = {path for data_there in (_at(self._data, reach), node)
                  if data_there is not _MISSING for path in _set_by(key, data_there, where)}
        if not set_by and not _whole_entry(key):  # a field the data leave out, as a pool's
            set_by = {key}  # gpus when null: set all the same (a missing entry removed is not)
        return _changed_toward(self._data, data, reach) | set_by, data

    def _in_force(self, keys, now_ms: int,
                  read_to: int | None = None) -> list[ConfigSet]:
        """A record of the value in force under each of ``keys`` that names one (written having
        read the topic to ``read_to``), with since when it has held (0: since before any
        record, the default's); of a map, since when the map as a whole has, and since when
        each entry set after it has; of a map's entry a record removed, its removal (None)."""
        restore = []
        for key in keys:
            try:
                value = self.config.setting(key)
            except KeyError:  # a map entry a later record removed: its removal is in force,
                located = map_entry(key)  # (a field of it has nothing in force to keep)
                if located is None or located[1] != key.removeprefix(f"{located[0]}."):
                    continue
                value = None
            if key in MAP_KEYS:  # a map: since when as a whole, and its entries set after
                since = self._map_set_ms.get(key, 0)  # (every one in force, at most as many
                # as a record may name, then the newest removed ones: past the limit, an entry
                # not named counts as of the map, and one in force must not)
                after = sorted(((entry in value, at, entry) for entry, at
                                in self._entry_set_ms.get(key, {}).items() if at > since),
                               reverse=True)[:MAX_MAP_ENTRIES]
                entries = {entry: at for _, at, entry in after} or None
            else:
                since = max((at for path, at in self._changed_ms.items()
                             if _sets(key, path)), default=0)
                entries = None
            restore.append(ConfigSet(event_time_ms=now_ms, key=key, value=value,
                                     set_by=RESTORED_BY, in_force_since_ms=since,
                                     entries_since_ms=entries, restored_after_offset=read_to))
        return restore


_MISSING = object()


def _check_not_ahead(record: ConfigSet, written_ms: int) -> None:
    """Raises ValueError where ``record`` says its value, or an entry of its map, has held
    since more than ``AHEAD_MS`` after ``written_ms``, when its record was written (a record
    restoring a value says since when by ``in_force_since_ms``: its own stamp, its router's
    clock, says nothing)."""
    stamped = max([record.value_since_ms, *(record.entries_since_ms or {}).values()])
    if stamped - written_ms > AHEAD_MS:
        raise ValueError(
            f"future_event_time: stamped {(stamped - written_ms) / 1000:.3f}s after its record "
            f"was written (at most {AHEAD_MS / 1000:g}s; its writer's clock runs fast?): set it "
            "again from a host whose clock is right")


def _note(times: dict[str, int], name: str, at_ms: int) -> None:
    """``name`` was set at ``at_ms``: kept if later than what ``times`` has."""
    times[name] = max(times.get(name, at_ms), at_ms)


def _sets(key: str, path: str) -> bool:
    """Whether a record of ``key`` sets the leaf ``path``: one under it, and in a map's entry
    (``tenants.b``) only that entry's (not ``tenants.b.x``'s: a tenant whose name begins so)."""
    if path != key and not path.startswith(f"{key}."):
        return False
    entry = map_entry(key)
    return entry is None or map_entry(path) == entry


def _changed(old: object, new: object, path: str = "") -> set[str]:
    """The leaves (``_leaves``) whose value differs between two configurations as JSON data, or
    that one has and the other has not: under ``path``, looked for only where they differ."""
    if old == new:
        return set()
    if not (isinstance(old, dict) and old and isinstance(new, dict) and new):
        return {leaf for data in (old, new) if data is not _MISSING for leaf in _leaves(data, path)}
    changed: set[str] = set()
    for name in old.keys() | new.keys():
        before, after = old.get(name, _MISSING), new.get(name, _MISSING)
        if before != after:
            changed |= _changed(before, after, f"{path}.{name}" if path else name)
    return changed


def _whole_entry(key: str) -> bool:
    """Whether ``key`` names a map's entry as a whole (``tenants.acme``), not a field of it."""
    located = map_entry(key)
    return located is not None and key == f"{located[0]}.{located[1]}"


def _reach(key: str) -> list[str]:
    """The names, from the root of a configuration's JSON data, of the node a record of ``key``
    may change, all else staying as it was: the map's entry that ``key`` lies in (a field of
    it too), else the node ``key`` names."""
    located = map_entry(key)
    if located is None:
        return key.split(".")
    return [*located[0].split("."), located[1]]


def _at(data: dict, names: list[str]) -> object:
    """The node at ``names`` in JSON data, or ``_MISSING``."""
    node: object = data
    for name in names:
        node = node.get(name, _MISSING) if isinstance(node, dict) else _MISSING
    return node


def _replaced(data: dict, names: list[str], node: object) -> dict:
    """JSON data with the node at ``names`` replaced by ``node`` (``_MISSING``: removed),
    copying only the dicts on the way to it (the others are shared)."""
    name, copy = names[0], dict(data)
    if len(names) > 1:
        copy[name] = _replaced(data[name], names[1:], node)
    elif node is _MISSING:
        copy.pop(name, None)
    else:
        copy[name] = node
    return copy


def _changed_toward(old: object, new: object, names: list[str], path: str = "") -> set[str]:
    """``_changed(old, new, path)`` where the two differ at most at the node ``names`` leads to
    (the other names at each step the same): looked for on the way to it alone."""
    if names and isinstance(old, dict) and old and isinstance(new, dict) and new:
        name = names[0]
        return _changed_toward(old.get(name, _MISSING), new.get(name, _MISSING), names[1:],
                               f"{path}.{name}" if path else name)
    return _changed(old, new, path)


def _set_by(key: str, data: object, path: str = "") -> set[str]:
    """The leaves of a configuration as JSON data that a record of ``key`` sets (``_sets``):
    under ``path``, looked for only on the way to ``key`` (a name may hold a dot)."""
    if path == key or path.startswith(f"{key}."):
        return {leaf for leaf in _leaves(data, path) if _sets(key, leaf)}
    if not isinstance(data, dict):
        return set()
    found: set[str] = set()
    for name, node in data.items():
        child = f"{path}.{name}" if path else name
        if key.startswith(f"{child}.") or child == key or child.startswith(f"{key}."):
            found |= _set_by(key, node, child)
    return found


def _leaves(data: object, path: str = "") -> dict[str, object]:
    """Each leaf of a configuration as JSON data (an empty map too), by its dotted path."""
    if not isinstance(data, dict) or not data:
        return {path: data}
    return {leaf: value for name, node in data.items()
            for leaf, value in _leaves(node, f"{path}.{name}" if path else name).items()}


def _value(config: GovernorConfig, key: str) -> object:
    """The setting ``key`` names in ``config`` (JSON data), or None where it names none."""
    try:
        return config.setting(key)
    except KeyError:
        return None
