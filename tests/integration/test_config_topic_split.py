"""A configuration topic of more than one partition, on a real broker (``infra.bus.
ConfigPartition``): its records on two partitions have no order between them, so every reader
refuses to start on one, naming the topic, its partitions and the fix, and one running when a
partition is added reads the first alone and says so as an error."""

import asyncio
import io
import logging

import pytest
from typer.testing import CliRunner

from infra.bus import make_producer, now_ms
from schemas.codec import encode
from schemas.config import ConfigSet
from schemas.errors import GovernorError
from tests.integration.test_partitions_added import add_partition

SAID_WITHIN_S = 30.0  # the readers ask for the topic's partitions every 10 s
APPLIED_WITHIN_S = 20.0


async def add_config_partition(bootstrap: str, catalog) -> None:
    """A second partition, once the broker lists it (as a reader starting then finds it)."""
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await add_partition(bootstrap, catalog, producer, catalog.config)
    finally:
        await producer.stop()


def split_told(text: str, catalog, bootstrap: str) -> bool:
    """The topic, its partitions, and how to make it again on ``bootstrap`` (the broker of the
    command or component that says it)."""
    on = f" --bootstrap {bootstrap}"
    return (f"topic {catalog.config} has 2 partitions, not 1" in text
            and f"governor topics delete{on} --namespace {catalog.namespace} config" in text
            and f"governor config get{on} --namespace {catalog.namespace}" in text)


def component(kind: str, bootstrap: str, catalog):
    """A reader of the configuration topic, the configuration it has in force, and its
    metrics registry."""
    if kind == "router":
        from controllers.router.service import RouterService

        router = RouterService(bootstrap, catalog, recovery_window_s=0)
        return router.run, lambda: router.live_config.config, router.metrics.registry
    if kind == "controllers":
        from controllers.service import ControllersService

        controllers = ControllersService(bootstrap, catalog)
        return controllers.run, lambda: controllers.live_config.config, controllers.metrics.registry
    from streams.config_feed import ConfigFeed
    from streams.metrics import SignalMetrics

    metrics = SignalMetrics()  # (the streams worker's: ``streams.worker``)
    feed = ConfigFeed(lambda taken: None, seen=metrics.config_partitions.set)

    async def follow(stop: asyncio.Event) -> None:  # (the feed follows until cancelled)
        following = asyncio.create_task(feed.follow(bootstrap, catalog))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([following, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if following.done():
            following.result()
        following.cancel()

    return follow, lambda: feed.live.config, metrics.registry


@pytest.mark.parametrize("kind", ["router", "controllers", "streams"])
def test_a_reader_refuses_to_start_on_a_config_topic_of_two_partitions(kafka_bootstrap, catalog,
                                                                        kind):
    asyncio.run(add_config_partition(kafka_bootstrap, catalog))
    run, _, _ = component(kind, kafka_bootstrap, catalog)

    async def started() -> None:
        async with asyncio.timeout(30):  # (one that does not refuse runs on)
            await run(asyncio.Event())

    with pytest.raises(GovernorError) as refused:
        asyncio.run(started())
    assert split_told(str(refused.value), catalog, kafka_bootstrap), refused.value


def test_up_refuses_before_it_starts_the_stack(kafka_bootstrap, catalog, tmp_path):
    from rich.console import Console

    from infra.up import run_up

    async def up() -> None:
        async with asyncio.timeout(60):  # (one that does not refuse runs the stack on)
            await run_up(kafka_bootstrap, catalog.namespace, "h100:1", tmp_path / "logs",
                         tmp_path / "data", Console(file=io.StringIO()))

    asyncio.run(add_config_partition(kafka_bootstrap, catalog))
    with pytest.raises(GovernorError) as refused:
        asyncio.run(up())
    assert split_told(str(refused.value), catalog, kafka_bootstrap), refused.value
    assert not (tmp_path / "logs").exists()  # (no component started)


def test_config_set_refuses_and_config_get_says_it(kafka_bootstrap, catalog):
    """`config set` would add a record of no order with the others; `config get` shows what
    the running components have in force, and says why the topic must be made again; `topics
    create` says it too."""
    import infra.cli as cli
    from infra.config_cli import current_config, set_setting

    asyncio.run(set_setting(kafka_bootstrap, catalog, "slo.ttft_slo_s", 7.0))
    asyncio.run(add_config_partition(kafka_bootstrap, catalog))
    with pytest.raises(GovernorError) as refused:
        asyncio.run(set_setting(kafka_bootstrap, catalog, "slo.ttft_slo_s", 9.0))
    assert split_told(str(refused.value), catalog, kafka_bootstrap), refused.value
    with pytest.raises(GovernorError) as refused:  # (the streams worker's, at its start)
        asyncio.run(current_config(kafka_bootstrap, catalog))
    assert split_told(str(refused.value), catalog, kafka_bootstrap), refused.value
    common = ["--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace]
    got = CliRunner().invoke(cli.app, ["config", "get", "slo", *common])
    assert got.exit_code == 0, got.output
    assert '"ttft_slo_s": 7.0' in got.stdout
    assert split_told(got.stderr, catalog, kafka_bootstrap), got.stderr
    created = CliRunner().invoke(cli.app, ["topics", "create", *common])
    assert isinstance(created.exception, GovernorError), created.output
    assert split_told(str(created.exception), catalog, kafka_bootstrap), created.exception


@pytest.mark.parametrize("kind", ["router", "controllers", "streams"])
def test_a_running_reader_reads_the_first_partition_alone_and_says_one_added(
        kafka_bootstrap, catalog, kind, caplog):
    run, in_force, registry = component(kind, kafka_bootstrap, catalog)

    def partitions() -> float | None:
        return registry.get_sample_value("governor_config_topic_partitions")

    async def scenario() -> None:
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        stop = asyncio.Event()
        task = asyncio.create_task(run(stop))

        async def until(condition, timeout_s: float) -> None:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    assert not task.done(), task.exception()
                    await asyncio.sleep(0.05)  # (polling the reader's state: a condition)

        async def write(key: str, value, partition: int) -> None:
            record = ConfigSet(event_time_ms=now_ms(), key=key, value=value)
            await producer.send_and_wait(catalog.config, encode(record), key=key.encode(),
                                         partition=partition)

        try:
            await write("slo.ttft_slo_s", 7.0, 0)
            await until(lambda: in_force().slo.ttft_slo_s == 7.0, APPLIED_WITHIN_S)
            assert partitions() == 1
            await add_config_partition(kafka_bootstrap, catalog)
            await until(lambda: split_told(caplog.text, catalog, kafka_bootstrap),
                        SAID_WITHIN_S)
            assert partitions() == 2  # (what operators alert on: > 1)
            await write("slo.ttft_slo_s", 9.0, 1)  # (no order with partition 0's records)
            await write("slo.deadline_s", 90.0, 0)
            await until(lambda: in_force().slo.deadline_s == 90.0, APPLIED_WITHIN_S)
            assert in_force().slo.ttft_slo_s == 7.0
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
            await producer.stop()

    with caplog.at_level(logging.ERROR, logger="infra.bus"):
        asyncio.run(scenario())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "infra.bus"]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # (said once)


@pytest.mark.parametrize("how", ["fails", "is cancelled"])
def test_a_reader_whose_start_fails_or_is_cancelled_stops_its_consumer(kafka_bootstrap, catalog,
                                                                        monkeypatch, how):
    """A start that cannot finish (a broker error while it finds the topic's start; a caller's
    time limit, a worker's bounded read of the declared models) stops the consumer it started:
    it was left open, with its connections to the broker."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaConnectionError

    from infra.bus import ConfigPartition

    stopped = []
    real_stop = AIOKafkaConsumer.stop

    async def stop(consumer):
        stopped.append(consumer)
        await real_stop(consumer)

    limits: list[asyncio.Timeout] = []

    async def seek_to_beginning(consumer, *partitions):
        await asyncio.sleep(0)  # (as a request to the broker would: the consumer's tasks run)
        if how == "fails":
            raise KafkaConnectionError("the leader went away")
        # the caller's time runs out here, where a broker that does not answer holds the start
        limits[0].reschedule(asyncio.get_running_loop().time())
        await asyncio.Event().wait()  # (until the caller's time limit cancels it)

    monkeypatch.setattr(AIOKafkaConsumer, "stop", stop)
    monkeypatch.setattr(AIOKafkaConsumer, "seek_to_beginning", seek_to_beginning)

    async def start() -> None:
        # (ample for the consumer's own start: a loaded broker can take seconds to answer)
        async with asyncio.timeout(60) as limit:
            limits.append(limit)
            await ConfigPartition.start(kafka_bootstrap, catalog, "a reader")

    with pytest.raises(KafkaConnectionError if how == "fails" else TimeoutError):
        asyncio.run(start())
    assert len(stopped) == 1 and stopped[0]._closed
