"""A restored ``tenants`` record (the value in force written again, ``LiveConfig.to_restore``
or ``kept_otherwise``) says when each tenant's limit was last set, so that a router that reads
it (live, or restarted on the compacted topic) ends an operator's command only for the tenants
the configuration set again after it. Before, the record carried one time for the whole map, its
newest tenant's: a command for ``a`` ended when only ``b`` had been set since, for every router
that read the record."""

import random

import pytest

from controllers.live_config import RESTORED_BY, LiveConfig
from controllers.overrides import CommandRefused, OperatorOverrides
from schemas.codec import decode, encode
from schemas.commands import SetAdmissionLimits, SetRetryBudget, TenantLimit
from schemas.config import ConfigSet
from schemas.limits import MAX_MAP_ENTRIES
from schemas.topics import TopicCatalog

T0 = 1_700_000_000_000
ONE, MANY = (TenantLimit(requests_per_s=r, tokens_per_s=1e6) for r in (1, 100))


class _Router:
    """The configuration and the operator's overrides as a router keeps them."""

    def __init__(self) -> None:
        self.live = LiveConfig("router")
        self.overrides = OperatorOverrides()
        self.offset = 0

    def read(self, record: ConfigSet | SetAdmissionLimits | SetRetryBudget, now: int,
             written: int | None = None) -> None:
        """``written``: when the record was written, its Kafka timestamp (None: ``now``)."""
        written = now if written is None else written
        if isinstance(record, SetAdmissionLimits | SetRetryBudget):
            try:
                self.overrides.take(record, written)
            except CommandRefused:
                pass
            return
        before = self.live.config
        self.offset += 1
        verdict = self.live.apply(record, self.offset, now, record.key.encode(),
                                  written_ms=written)
        if verdict.type == "config_applied":
            self.overrides.configured(before, self.live.config, record)

    @property
    def limits(self) -> dict[str, float]:
        return {tenant: limit.requests_per_s
                for tenant, limit in self.overrides.tenant_limits(self.live.config).items()}

    @property
    def budget(self) -> tuple[float, float]:
        return self.overrides.retry_budget(self.live.config)


def _set(key: str, value, at: int) -> ConfigSet:
    return ConfigSet(event_time_ms=at, key=key, value=value)


def _history() -> tuple[_Router, list[ConfigSet], SetAdmissionLimits]:
    """Tenants a and b set at T0; a command for a at T0+10; b's limit set at T0+20; a bad
    ``tenants`` record at T0+30, which the running router restores. Returns the running router,
    the records compaction keeps (each key's newest, in offset order) and the command."""
    command = SetAdmissionLimits(event_time_ms=T0 + 10, command_id="incident-42",
                                 limits={"a": MANY})
    running = _Router()
    history = [_set("tenants", {"a": ONE.model_dump(), "b": ONE.model_dump()}, T0), command,
               _set("tenants.b", MANY.model_dump(), T0 + 20),
               _set("tenants", {"a": {"requests_per_s": -1, "tokens_per_s": 1}}, T0 + 30)]
    for record in history:
        running.read(record, T0 + 40)
    restored = running.live.to_restore(T0 + 40)
    assert [r.key for r in restored] == ["tenants"] and restored[0].set_by == RESTORED_BY
    for record in restored:
        running.read(record, T0 + 40)
    return running, [history[2], *restored], command


@pytest.mark.parametrize("command_first", [True, False])
def test_a_router_reading_the_restored_tenants_keeps_a_command_whose_tenant_was_not_set_again(
        command_first: bool) -> None:
    running, kept, command = _history()
    assert running.limits == {"a": 100, "b": 100}  # a's command holds; b is the configuration's
    restarted = _Router()
    for record in [command, *kept] if command_first else [*kept, command]:
        restarted.read(record, T0 + 50)
    assert restarted.limits == running.limits


def test_a_command_for_the_tenant_set_after_it_ends_on_the_restored_record_too() -> None:
    """b's limit set after a command for b: the restored record ends that command, as the
    record of b did for the running router."""
    command = SetAdmissionLimits(event_time_ms=T0 + 10, command_id="incident-43",
                                 limits={"a": MANY, "b": ONE})
    running, kept, _ = _history()
    restarted = _Router()
    for record in [command, *kept]:
        restarted.read(record, T0 + 50)
    assert restarted.limits == {"a": 100, "b": 100}


def test_a_restored_record_names_only_the_tenants_set_after_the_map_and_reads_back_alike(
) -> None:
    """Written again by a router that read it (compaction having kept it), it says the same
    times: the per-tenant times survive a second restore."""
    _, kept, _ = _history()
    restored = kept[-1]
    assert (restored.in_force_since_ms, restored.entries_since_ms) == (T0, {"b": T0 + 20})
    spec = TopicCatalog("t").spec(TopicCatalog("t").config)
    assert decode(spec, encode(restored)) == restored
    reader = _Router()
    for record in kept:
        reader.read(record, T0 + 50)
    reader.read(_set("tenants", "not a map", T0 + 60), T0 + 60)
    again = reader.live.to_restore(T0 + 60)
    assert [(r.in_force_since_ms, r.entries_since_ms) for r in again] == [
        (T0, {"b": T0 + 20})]


def test_a_restored_record_of_a_map_set_whole_last_is_written_as_before() -> None:
    """No tenant set since the map: no per-tenant times, so a reader older than them reads it."""
    live = LiveConfig("router")
    live.apply(_set("tenants", {"a": ONE.model_dump()}, T0), 1, T0, b"tenants")
    live.apply(_set("tenants", "bad", T0 + 5), 2, T0 + 5, b"tenants")
    (restored,) = live.to_restore(T0 + 6)
    assert (restored.in_force_since_ms, restored.entries_since_ms) == (T0, None)
    assert b"entries_since_ms" not in encode(restored)


def test_a_tenant_removed_after_the_command_ends_it_on_the_restored_record() -> None:
    command = SetAdmissionLimits(event_time_ms=T0 + 10, command_id="incident-44",
                                 limits={"a": MANY, "b": MANY})
    running = _Router()
    for record in [_set("tenants", {"a": ONE.model_dump(), "b": ONE.model_dump()}, T0),
                   command, _set("tenants.b", None, T0 + 20), _set("tenants", 5, T0 + 30)]:
        running.read(record, T0 + 40)
    (restored,) = running.live.to_restore(T0 + 40)
    assert restored.entries_since_ms == {"b": T0 + 20}
    restarted = _Router()
    for record in [command, _set("tenants.b", None, T0 + 20), restored]:
        restarted.read(record, T0 + 50)
    running.read(restored, T0 + 50)
    assert restarted.limits == running.limits == {"a": 100}


def test_a_restored_entry_says_its_own_time_not_that_of_a_tenant_whose_name_it_begins() -> None:
    """Tenants ``b`` and ``b.x`` (names may hold dots): a restored ``tenants.b`` says when b's
    limit was set, not when b.x's was. Before, it said b.x's, newer than a command for b, which
    ended for every router that read it."""
    command = SetAdmissionLimits(event_time_ms=T0 + 10, command_id="incident-45",
                                 limits={"b": MANY})
    running = _Router()
    for record in [_set("tenants.b", ONE.model_dump(), T0),
                   _set("tenants.b.x", ONE.model_dump(), T0), command,
                   _set("tenants.b.x", MANY.model_dump(), T0 + 20),
                   _set("tenants.b", {"requests_per_s": -1}, T0 + 30)]:
        running.read(record, T0 + 40)
    (restored,) = running.live.to_restore(T0 + 40)
    assert (restored.key, restored.in_force_since_ms) == ("tenants.b", T0)
    running.read(restored, T0 + 40)
    restarted = _Router()
    for record in [command, _set("tenants.b.x", MANY.model_dump(), T0 + 20), restored]:
        restarted.read(record, T0 + 50)
    assert restarted.limits == running.limits == {"b": 100, "b.x": 100}


def test_a_restored_map_of_pools_names_each_pool_however_long_its_name() -> None:
    """Entries are named as their map names them: a pool's name (GPU@MODEL) may be longer than
    a tenant's."""
    pool = f"h100@{'m' * 64}"
    bounds = {"min_replicas": 0, "max_replicas": 4}
    live = LiveConfig("router")
    live.apply(_set("autoscaler.pools", {}, T0), 1, T0, b"autoscaler.pools")
    live.apply(_set(f"autoscaler.pools.{pool}", bounds, T0 + 10), 2, T0,
               f"autoscaler.pools.{pool}".encode())
    live.apply(_set("autoscaler.pools", 5, T0 + 20), 3, T0, b"autoscaler.pools")
    (restored,) = live.to_restore(T0 + 30)
    assert restored.entries_since_ms == {pool: T0 + 10}


def _random_history(rng: random.Random) -> list[tuple[ConfigSet | SetAdmissionLimits
                                                       | SetRetryBudget, int]]:
    """Records of tenants' limits (every tenant's, one's, a field of one's, removals, rejected
    ones) and of the retry budget, and commands of both, in the order they are written, 10 ms
    apart (with when each was written), one in four stamped 25 ms behind (its writer's clock),
    one in eight 5 s ahead (taken) and one in eight a minute ahead (refused)."""
    names = ["a", "b", "b.x", "c"]

    def limit() -> dict:
        return {"requests_per_s": rng.choice([1, 2, 3]), "tokens_per_s": 1e6}

    history: list = []
    for step in range(rng.randint(3, 14)):
        written, kind = T0 + 10 * step, rng.randrange(9)
        at = written + rng.choice([0, 0, 0, -25]) + rng.choice([0] * 6 + [5_000, 60_000])
        name = rng.choice(names)
        if kind == 0:
            record = _set("tenants", {n: limit() for n in names if rng.random() < 0.6}, at)
        elif kind == 1:
            record = _set(f"tenants.{name}", limit() if rng.random() < 0.8 else None, at)
        elif kind == 2:
            record = _set(f"tenants.{name}.requests_per_s", rng.choice([4, 5]), at)
        elif kind == 3:
            record = _set(rng.choice(["tenants", f"tenants.{name}"]), "bad", at)
        elif kind == 6:
            record = _set(rng.choice(["retry_budget_ratio", "retry_budget_min_per_s"]),
                          rng.choice([0.2, 0.3, "bad"]), at)
        elif kind == 7:
            record = SetRetryBudget(event_time_ms=at, command_id=f"r{step}",
                                    ratio=rng.choice([0.5, 0.6]), min_per_s=0.0)
        else:
            record = SetAdmissionLimits(
                event_time_ms=at, command_id=f"c{step}", limits={
                    n: TenantLimit(requests_per_s=100 + step, tokens_per_s=1e6)
                    for n in names if rng.random() < 0.5})
        history.append((record, written))
    return history


@pytest.mark.parametrize("seed", range(600))
def test_a_router_on_the_compacted_topic_runs_by_the_limits_a_running_router_does(
        seed: int) -> None:
    """A running router, which writes what it restores (``governor config set`` the settings
    compaction would change after its own), and one started afterwards on what
    compaction keeps of the topic (each key's newest record) with the commands read back
    (before the configuration, or after it): the same tenant limits and retry budget in
    force."""
    rng = random.Random(seed)
    running, log, commands, written_at = _Router(), [], [], {}
    for record, written in _random_history(rng):
        if isinstance(record, ConfigSet) and record.value != "bad":  # as `governor config set`
            try:  # writes it: refused where the router would refuse it, stamped after the
                running.live.config.with_setting(record.key, record.value)  # record it
            except (KeyError, ValueError):  # supersedes (the bad ones: --no-validate)
                continue
            record = running.live.after_superseded(record)
        written_at[id(record)] = written
        running.read(record, T0 + 1_000, written)
        if isinstance(record, SetAdmissionLimits | SetRetryBudget):
            commands.append(record)
            continue
        log.append(record)
        restores = running.live.to_restore(T0 + 1_000)  # (the router's)
        if record.value != "bad":  # (and `governor config set`'s, after its change)
            restores += running.live.kept_otherwise(T0 + 1_000)
        for restored in restores:
            written_at[id(restored)] = written
            running.read(restored, T0 + 1_000, written)
            log.append(restored)
    kept = list({record.key: record for record in log}.values())  # (each key's newest...)
    kept.sort(key=lambda record: max(i for i, r in enumerate(log) if r is record))  # (in order)
    for command_first in (True, False):  # (started ten minutes on: its clock is not the
        restarted = _Router()  # running router's, nor the records' writers')
        for record in ([*commands, *kept] if command_first else [*kept, *commands]):
            restarted.read(record, T0 + 600_000, written_at[id(record)])
        assert (restarted.limits, restarted.budget) == (running.limits, running.budget), (
            command_first, log, commands)


def test_a_record_stamped_behind_one_read_before_it_keeps_the_later_set_time() -> None:
    """b's limit set at T0+50, then every tenant's by a writer whose clock is behind (T0+20):
    an operator's command is weighed against the later (``OperatorOverrides``), and so is what
    a restored record says. Before, it said T0+20 for b, and a router reading it after
    compaction held a command of T0+30 for b that the running ones had ended."""
    live = LiveConfig("router")
    for offset, record in enumerate([_set("tenants.b", ONE.model_dump(), T0 + 50),
                                      _set("tenants", {"b": ONE.model_dump()}, T0 + 20),
                                      _set("tenants", "bad", T0 + 60)]):
        live.apply(record, offset, T0 + 70, record.key.encode())
    (restored,) = live.to_restore(T0 + 70)
    assert (restored.in_force_since_ms, restored.entries_since_ms) == (T0 + 20, {"b": T0 + 50})


def test_a_change_is_stamped_after_what_it_supersedes() -> None:
    """``governor config set`` from a clock behind the last change under its key: stamped just
    after it, so compaction, which keeps only the newer record, loses no later time."""
    live = LiveConfig("governor-config-cli")
    live.apply(_set("tenants.b", ONE.model_dump(), T0 + 50), 0, T0, b"tenants.b")
    behind = _set("tenants", {"b": MANY.model_dump()}, T0 + 20)
    assert live.after_superseded(behind).event_time_ms == T0 + 51
    assert live.after_superseded(_set("tenants.a", ONE.model_dump(), T0 + 20)) \
        .event_time_ms == T0 + 20  # (nothing under tenants.a set later)
    ahead = _set("tenants", {}, T0 + 90)
    assert live.after_superseded(ahead) is ahead


def test_a_restored_map_names_the_newest_entries_set_after_it_up_to_the_limit() -> None:
    """More entries set (and removed) since the map than a record may name: the newest
    ``MAX_MAP_ENTRIES``, so that the record is one its readers take."""
    live = LiveConfig("router")
    live.apply(_set("tenants", {}, T0), 0, T0, b"tenants")
    for i in range(MAX_MAP_ENTRIES + 2):
        for offset, value in ((2 * i + 1, ONE.model_dump()), (2 * i + 2, None)):
            key = f"tenants.t{i}"
            live.apply(_set(key, value, T0 + 1 + i), offset, T0, key.encode())
    live.apply(_set("tenants", "bad", T0 + 5000), 5000, T0, b"tenants")
    (restored,) = live.to_restore(T0 + 5001)
    spec = TopicCatalog("t").spec(TopicCatalog("t").config)
    assert decode(spec, encode(restored)) == restored
    assert restored.entries_since_ms == {f"t{i}": T0 + 1 + i
                                         for i in range(2, MAX_MAP_ENTRIES + 2)}


def test_a_restored_map_names_every_entry_in_force_however_many_were_removed_since() -> None:
    """A tenant set after the map, then more tenants set and removed since than a record may
    name: the restored record still says when the tenant in force was set, and a reader of it
    ends a command for that tenant made before then, as the running router did. Before, the
    newest 1,024 entries named were all removed ones, and the tenant counted as set with the
    map, before the command."""
    command = SetAdmissionLimits(event_time_ms=T0 + 1, command_id="incident-46",
                                 limits={"keep": MANY})
    running = _Router()
    running.read(_set("tenants", {}, T0), T0)
    running.read(command, T0 + 1)
    running.read(_set("tenants.keep", ONE.model_dump(), T0 + 2), T0 + 2)
    for i in range(MAX_MAP_ENTRIES + 2):
        for value in (ONE.model_dump(), None):
            running.read(_set(f"tenants.gone-{i}", value, T0 + 3 + i), T0 + 3 + i)
    running.read(_set("tenants", "bad", T0 + 5_000), T0 + 5_000)
    (restored,) = running.live.to_restore(T0 + 5_001)
    assert restored.entries_since_ms == {"keep": T0 + 2} | {
        f"gone-{i}": T0 + 3 + i for i in range(3, MAX_MAP_ENTRIES + 2)}
    reader = _Router()
    for record in (command, restored):
        reader.read(record, T0 + 6_000)
    assert reader.limits == running.limits == {"keep": 1}
