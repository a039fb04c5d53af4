"""`governor config set` changes a tenant limit in a running router within 2 s; an invalid value
is rejected (by the CLI before sending, and by the router if sent anyway) and the last good
configuration stays in force. Under the new limit a step of a task is told when to retry, and its
retry gets in (a rate limit fails no task)."""

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

from infra.bus import Outbox, missing_topics, now_ms, reading
from infra.config_cli import current_config
from infra.stack import PoolSpec, Stack
from schemas.config import ConfigSet
from schemas.events import ConfigApplied, ConfigRejected, Queued, Rejected, WorkerStatus
from schemas.requests import InferenceRequest
from schemas.topics import TopicCatalog
from tests.integration.router_following import every_record

pytestmark = pytest.mark.integration


def _cli(bootstrap, namespace, command, *args):
    # `--` so that a negative value is not taken for an option
    return subprocess.run([sys.executable, "-m", "infra.cli", "config", command, "--bootstrap",
                           bootstrap, "--namespace", namespace, "--", *args],
                          capture_output=True, text=True, timeout=60)


def _request(i: int) -> InferenceRequest:
    """Priority 9: never shed (``shedding.max_level``), so that what refuses the bursts is the
    tenant's rate limit alone (on a loaded machine the one worker's queue raised the shed level
    and one request of the second burst was shed, where the test wants rate_limited)."""
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=t, request_id=f"cfg-{i}", tenant="acme",
                            prompt_tokens=32, max_tokens=2, priority=9)


def _step(step: int, *, task: str = "job", tenant: str = "other", request_id: str = "",
          **fields) -> InferenceRequest:
    t = now_ms()
    return InferenceRequest(event_time_ms=t, created_ms=fields.pop("created_ms", t),
                            request_id=request_id or f"{task}-{step}", task_id=task, step=step,
                            steps_total=2, tenant=tenant, prompt_tokens=32, max_tokens=2, **fields)


async def _scenario(bootstrap, catalog):
    async with reading(bootstrap, catalog, [catalog.telemetry], "config-test",
                       offset_reset="earliest") as typed:
        seen: list = []

        async def until(condition, timeout_s=60):
            async with asyncio.timeout(timeout_s):
                while not condition():
                    seen.extend(item.message for item in await typed.fetch(200))

        await until(lambda: any(isinstance(m, WorkerStatus) for m in seen))
        outbox = Outbox(typed.producer)

        async def send_burst(start: int, n: int):
            for i in range(start, start + n):
                outbox.emit(catalog.requests, _request(i), f"cfg-{i}")
            await outbox.flush()

        await send_burst(0, 10)  # no limit yet: all queued
        await until(lambda: sum(isinstance(m, Queued) for m in seen) == 10)
        result = await asyncio.to_thread(
            _cli, bootstrap, catalog.namespace, "set", "tenants.acme",
            json.dumps({"requests_per_s": 0.5, "tokens_per_s": 1e6, "burst_s": 2}))
        assert result.returncode == 0, result.stderr
        set_ms = now_ms()

        def applied() -> ConfigApplied | None:
            return next((m for m in seen if isinstance(m, ConfigApplied)
                         and m.component == "router-0" and m.key == "tenants.acme"), None)

        await until(applied)
        # to the router's stamp of it, not to when this test read it (later, where the test's
        # process stalled)
        applied_after_s = (applied().event_time_ms - set_ms) / 1000
        await send_burst(10, 10)  # one token in the bucket: the rest are rate limited
        await until(lambda: sum(isinstance(m, (Queued, Rejected)) for m in seen) >= 20)

        def answered(request_id):
            return any(isinstance(m, Rejected) and m.request_id == request_id for m in seen)

        # A step of a task refused (its deadline passed): the task fails, and its next step too.
        t = now_ms()
        late = _step(1, created_ms=t - 5_000, deadline_ms=t - 1_000)
        outbox.emit(catalog.requests, late, "job-1")
        await outbox.flush()
        await until(lambda: answered("job-1"))
        outbox.emit(catalog.requests, _step(2), "job-2")
        await outbox.flush()
        await until(lambda: answered("job-2"))
        # A step of a task over its tenant's rate is told when to retry, and its retry gets in.
        async def answer(request: InferenceRequest):
            outbox.emit(catalog.requests, request, request.request_id)
            await outbox.flush()
            await until(lambda: answered(request.request_id)
                        or any(isinstance(m, Queued) and m.request_id == request.request_id
                               for m in seen))
            return next(m for m in seen if isinstance(m, (Queued, Rejected))
                        and m.request_id == request.request_id)

        reply = await answer(_step(1, task="agent", tenant="acme"))
        for attempt in range(3):  # the bucket may refill a little after the hint
            if not (isinstance(reply, Rejected) and reply.retry_after_s):
                break
            await asyncio.sleep(reply.retry_after_s)  # as a client honouring the hint does
            reply = await answer(_step(1, task="agent", tenant="acme",
                                       request_id=f"agent-1-retry{attempt}"))
        # An invalid value sent past the CLI's check is rejected by the router.
        outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(), key="slo.ttft_slo_s",
                                              value=-3), "slo.ttft_slo_s")
        await outbox.flush()
        await until(lambda: any(isinstance(m, ConfigRejected) and m.component == "router-0"
                                for m in seen))
        return seen, applied_after_s


def test_config_set_changes_a_tenant_limit_live_and_invalid_values_are_rejected(
        kafka_bootstrap, catalog, tmp_path):
    bad = _cli(kafka_bootstrap, catalog.namespace, "set", "slo.ttft_slo_s", "-1")
    assert bad.returncode == 2
    assert "slo.ttft_slo_s" in bad.stderr and "greater than 0" in bad.stderr
    weight = _cli(kafka_bootstrap, catalog.namespace, "set", "router_weights.nope", "4")
    assert weight.returncode == 2  # as the router refuses it:
    assert "unknown scorer 'nope'; known: decode_deadlines, " in weight.stderr
    stack = Stack(kafka_bootstrap, catalog.namespace, [PoolSpec("h100", 1)], tmp_path)
    stack.start()
    try:
        seen, applied_after_s = asyncio.run(_scenario(kafka_bootstrap, catalog))
    finally:
        stack.stop()
    assert applied_after_s < 2.0
    after = [m for m in seen if getattr(m, "request_id", "").startswith("cfg-")
             and int(m.request_id.split("-")[1]) >= 10 and isinstance(m, (Queued, Rejected))]
    rejected = [m for m in after if isinstance(m, Rejected)]
    assert len(rejected) >= 8 and all(m.reason == "rate_limited" for m in rejected)
    assert all(m.retry_after_s and m.retry_after_s > 0 for m in rejected)
    steps = {m.request_id: m for m in seen
             if isinstance(m, Rejected) and m.request_id.startswith("job-")}
    assert steps["job-1"].reason == "deadline_unreachable" and steps["job-1"].retry_after_s is None
    assert steps["job-1"].detail.endswith("; task job fails with it")
    assert steps["job-2"].reason == "task_failed" and "job-1 rejected" in steps["job-2"].detail
    agent = [m for m in seen if isinstance(m, (Queued, Rejected))
             and m.request_id.startswith("agent-1")]
    assert isinstance(agent[0], Rejected) and agent[0].reason == "rate_limited"
    assert (agent[0].retry_after_s or 0) > 0, agent[0].detail
    assert "fails with it" not in agent[0].detail
    assert isinstance(agent[-1], Queued) and agent[-1].request_id.startswith("agent-1-retry")
    verdict = next(m for m in seen if isinstance(m, ConfigRejected) and m.component == "router-0")
    assert "slo.ttft_slo_s" in verdict.reason
    config = asyncio.run(current_config(kafka_bootstrap, catalog))
    assert config.slo.ttft_slo_s == 2.0  # the last good value stays
    assert config.tenants["acme"].requests_per_s == 0.5


def test_config_get_of_a_namespace_without_topics_says_so_and_creates_none(kafka_bootstrap):
    typo = TopicCatalog(f"govenror-{uuid.uuid4().hex[:8]}")
    result = _cli(kafka_bootstrap, typo.namespace, "get")
    assert result.returncode != 0
    assert "do not exist" in result.stderr and "governor topics create" in result.stderr
    assert len(asyncio.run(missing_topics(kafka_bootstrap, typo))) == len(typo.topics())


def test_a_component_reads_the_configuration_to_its_end_before_it_starts_working(
        kafka_bootstrap, catalog):
    """The router and the controllers apply the configuration topic's history before their first
    request or tick (``read_to_end``), not each step of it while requests come in."""
    from aiokafka import AIOKafkaConsumer

    from infra.bus import TypedConsumer, make_producer, read_to_end

    async def scenario() -> tuple[bool, list[float]]:
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        consumer = AIOKafkaConsumer(catalog.config, bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest")
        try:
            outbox = Outbox(producer)
            for i in range(1, 1_201):  # more than one fetch's worth (500 records)
                outbox.emit(catalog.config, ConfigSet(event_time_ms=now_ms(),
                                                      key="slo.ttft_slo_s", value=i / 100),
                            f"k{i % 7}")
            await outbox.flush()
            await consumer.start()
            seen: list[float] = []
            done = await read_to_end(TypedConsumer(consumer, catalog, producer, "test"),
                                     catalog.config, lambda item: seen.append(item.message.value))
            return done, seen
        finally:
            await consumer.stop()
            await producer.stop()

    done, seen = asyncio.run(scenario())
    assert done and len(seen) == 1_200 and seen[-1] == 12.0


def test_the_router_writes_a_good_setting_again_where_a_rejected_record_would_take_its_place(
        kafka_bootstrap, catalog):
    """The topic is compacted: it keeps each key's newest record, a rejected one too. The router
    writes the good record before it again, at its start (the history it reads) and live, so that
    what compaction keeps is the configuration in force. Compaction itself is done here as the
    log cleaner does it: the newest record of each key, in offset order."""
    from controllers.router.service import RouterService

    def setting(key, value, record_key=None):
        return ConfigSet(event_time_ms=now_ms(), key=key, value=value), record_key or key

    async def scenario() -> list:
        async with reading(kafka_bootstrap, catalog, [catalog.config], "restore-test",
                           offset_reset="earliest") as typed:
            outbox = Outbox(typed.producer)
            for message, key in (setting("breaker.itl_ratio", 4.0),
                                 setting("breaker.itl_ratio", -1),       # rejected
                                 setting("slo.ttft_slo_s", 1.5)):
                outbox.emit(catalog.config, message, key)
            await outbox.flush()
            records = []

            async def until(condition, timeout_s=60):
                async with asyncio.timeout(timeout_s):
                    while not condition():
                        for batch in (await typed.consumer.getmany(timeout_ms=200)).values():
                            records.extend(batch)

            def restored(key):
                return any(r.key == key.encode() and b'"set_by":"governor-restore"' in r.value
                           for r in records)

            stop = asyncio.Event()
            router = RouterService(kafka_bootstrap, catalog, recovery_window_s=0)
            running = asyncio.create_task(router.run(stop))
            try:
                await until(lambda: restored("breaker.itl_ratio"))  # from the history, at start
                # live: a record under one key that sets another
                message, key = setting("slo.deadline_s", 45, record_key="slo.ttft_slo_s")
                outbox.emit(catalog.config, message, key)
                await outbox.flush()
                await until(lambda: restored("slo.ttft_slo_s"))
            finally:
                stop.set()
                await running
            return records

    records = asyncio.run(scenario())
    compacted = {r.key: r for r in records}  # the newest of each key
    from controllers.live_config import LiveConfig
    from schemas.codec import decode

    live = LiveConfig("after-compaction")
    for record in sorted(compacted.values(), key=lambda r: r.offset):
        live.apply(decode(catalog.spec(catalog.config), record.value), record.offset, 0, record.key)
    assert live.config.breaker.itl_ratio == 4.0
    assert (live.config.slo.ttft_slo_s, live.config.slo.deadline_s) == (1.5, 60.0)


def test_config_set_writes_again_a_setting_that_compaction_would_drop_the_reason_for(
        kafka_bootstrap, catalog):
    """``shedding.high`` 0.2 held only above ``shedding.low`` 0.1, which the next change of the
    low supersedes: the compacted topic (each key's newest record, in offset order) had the high
    first, refused above the default low (0.3), and gave the default high, 0.5, to a component
    started after the log cleaner ran, and to ``config get`` (seen on ``governor up`` with the
    topic's ``segment.ms`` at 1 s). Compaction is done here as the log cleaner does it."""
    from controllers.live_config import LiveConfig
    from schemas.codec import decode

    for key, value in (("shedding.low", "0.1"), ("shedding.high", "0.2"),
                       ("shedding.low", "0.05")):
        result = _cli(kafka_bootstrap, catalog.namespace, "set", key, value)
        assert result.returncode == 0, result.stderr

    async def records():
        async with reading(kafka_bootstrap, catalog, [catalog.config], "compaction-test",
                           offset_reset="earliest") as typed:
            return await every_record(typed, catalog, catalog.config)

    newest = {record.key: record for record in asyncio.run(records())}
    compacted = LiveConfig("started-after-compaction")
    for record in sorted(newest.values(), key=lambda r: r.offset):
        compacted.apply(decode(catalog.spec(catalog.config), record.value), record.offset, 0,
                        record.key)
    assert (compacted.config.shedding.low, compacted.config.shedding.high) == (0.05, 0.2)


def test_a_restarted_router_keeps_a_commanded_limit_newer_than_the_configurations(
        kafka_bootstrap, catalog):
    """A ``SetAdmissionLimits`` (and a ``SetRetryBudget``) holds over the configuration until
    the configuration sets that tenant's limit (the budget) again. A router reads the commands
    back before the configuration: before, each configuration record of the tenant, older than
    the command, replaced the commanded limit at every restart."""
    from controllers.router.service import RouterService
    from schemas.commands import SetAdmissionLimits, SetRetryBudget, TenantLimit

    async def scenario() -> RouterService:
        async with reading(kafka_bootstrap, catalog, [catalog.telemetry], "commanded-test",
                           offset_reset="earliest") as typed:
            outbox = Outbox(typed.producer)
            t = now_ms()
            for key, value in (("tenants.acme", {"requests_per_s": 1, "tokens_per_s": 1e6}),
                               ("retry_budget_ratio", 0.2)):
                outbox.emit(catalog.config, ConfigSet(event_time_ms=t - 2_000, key=key,
                                                      value=value), key)
            limit = TenantLimit(requests_per_s=100, tokens_per_s=1e6)
            outbox.emit(catalog.control, SetAdmissionLimits(
                event_time_ms=t - 1_000, command_id="c1", limits={"acme": limit}),
                "set_admission_limits")
            outbox.emit(catalog.control, SetRetryBudget(
                event_time_ms=t - 1_000, command_id="c2", ratio=0.0, min_per_s=0.0),
                "set_retry_budget")
            await outbox.flush()
            stop = asyncio.Event()
            router = RouterService(kafka_bootstrap, catalog)
            running = asyncio.create_task(router.run(stop))
            applied: set[str] = set()
            try:
                async with asyncio.timeout(60):
                    while applied != {"tenants.acme", "retry_budget_ratio"}:
                        applied |= {item.message.key for item in await typed.fetch(200)
                                    if isinstance(item.message, ConfigApplied)}
                        assert not running.done(), running.exception()
            finally:
                stop.set()
                await running
            return router

    router = asyncio.run(scenario())
    assert router.core.admission.limits["acme"].requests_per_s == 100
    assert (router.core.retry_budget.ratio, router.core.retry_budget.min_per_s) == (0.0, 0.0)


def test_config_set_refuses_to_remove_an_entry_that_is_not_there(kafka_bootstrap, catalog):
    """Read from the topic, such a removal is nothing to do (compaction may leave it alone
    under its key); asked for, it is a typo to say."""
    from infra.config_cli import set_setting
    from schemas.errors import TerminalError

    asyncio.run(set_setting(kafka_bootstrap, catalog, "tenants.acme",
                            {"requests_per_s": 1, "tokens_per_s": 1000}))
    with pytest.raises(TerminalError, match="rejected tenants.acmee=null: .*no entry 'acmee'"):
        asyncio.run(set_setting(kafka_bootstrap, catalog, "tenants.acmee", None))
    asyncio.run(set_setting(kafka_bootstrap, catalog, "tenants.acme", None))
    assert asyncio.run(current_config(kafka_bootstrap, catalog)).tenants == {}


def test_a_router_restarted_after_compaction_keeps_a_command_newer_than_a_restored_setting(
        kafka_bootstrap, catalog, namespaces_to_delete):
    """``tenants.acme`` at 1 request/s (and ``retry_budget_ratio`` 0.2), then commands giving
    acme 100 (and a budget of 0), then a rejected record of each key: the router writes the
    value in force again (``governor-restore``), and compaction keeps that record alone. It
    restates a setting older than the commands, written after them: a router started on the
    compacted topic took it for a change made after the commands (by its ``event_time_ms``)
    and ran acme at 1 request/s, where the router that saw it written kept 100. Compaction is
    done as the log cleaner does it: each key's newest record, in offset order, on a topic of
    their own (another namespace, with the commands)."""
    from controllers.router.service import RouterService
    from schemas.commands import SetAdmissionLimits, SetRetryBudget, TenantLimit

    compacted = TopicCatalog(f"{catalog.namespace}-compacted")
    namespaces_to_delete.append(compacted.namespace)
    settings = {"tenants.acme": ({"requests_per_s": 1, "tokens_per_s": 1e6},
                                 {"requests_per_s": -1, "tokens_per_s": 1e6}),
                "retry_budget_ratio": (0.2, -1)}

    def commands(t: int) -> list:
        limit = TenantLimit(requests_per_s=100, tokens_per_s=1e6)
        return [(SetAdmissionLimits(event_time_ms=t, command_id="c1", limits={"acme": limit}),
                 "set_admission_limits"),
                (SetRetryBudget(event_time_ms=t, command_id="c2", ratio=0.0, min_per_s=0.0),
                 "set_retry_budget")]

    async def router_until(on: TopicCatalog, done, typed) -> RouterService:
        stop = asyncio.Event()
        router = RouterService(kafka_bootstrap, on)
        running = asyncio.create_task(router.run(stop))
        try:
            async with asyncio.timeout(60):
                while not done(await typed.consumer.getmany(timeout_ms=200)):
                    assert not running.done(), running.exception()
        finally:
            stop.set()
            await running
        return router

    async def scenario() -> tuple[RouterService, RouterService]:
        from infra.bus import create_topics

        await create_topics(kafka_bootstrap, compacted)
        async with reading(kafka_bootstrap, catalog, [catalog.config], "compaction-test",
                           offset_reset="earliest") as typed:
            outbox = Outbox(typed.producer)
            t = now_ms()
            for key, (good, _) in settings.items():
                outbox.emit(catalog.config, ConfigSet(event_time_ms=t - 3_000, key=key,
                                                      value=good), key)
            for command, key in commands(t - 2_000):
                outbox.emit(catalog.control, command, key)
            for key, (_, bad) in settings.items():
                outbox.emit(catalog.config, ConfigSet(event_time_ms=t - 1_000, key=key,
                                                      value=bad), key)
            await outbox.flush()
            records = []

            def restored(batches) -> bool:
                for batch in batches.values():
                    records.extend(batch)
                return {r.key.decode() for r in records
                        if b'"set_by":"governor-restore"' in r.value} == set(settings)

            seen = await router_until(catalog, restored, typed)
            for record in sorted({r.key: r for r in records}.values(), key=lambda r: r.offset):
                await typed.producer.send_and_wait(compacted.config, record.value, record.key)
            for command, key in commands(t - 2_000):
                outbox.emit(compacted.control, command, key)
            await outbox.flush()
        async with reading(kafka_bootstrap, compacted, [compacted.telemetry], "restart-test",
                           offset_reset="earliest") as typed:
            applied: set[str] = set()

            def all_applied(batches) -> bool:
                applied.update(item.message.key for item in typed.split(batches)[0]
                               if isinstance(item.message, ConfigApplied))
                return applied == set(settings)

            restarted = await router_until(compacted, all_applied, typed)
        return seen, restarted

    seen, restarted = asyncio.run(scenario())
    for name, router in (("the router that saw it all", seen), ("the restarted", restarted)):
        assert (router.core.admission.limits["acme"].requests_per_s, router.core.retry_budget.ratio,
                router.core.retry_budget.min_per_s) == (100, 0, 0), name
