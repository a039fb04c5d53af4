"""Run one Faust worker of the streams app: ``governor streams`` calls ``run_worker``."""

import asyncio
import logging
import os
import signal
import tempfile
from functools import partial
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from infra.bus import BusError, create_topics, wait_for_leaders
from infra.hangup import terminal_output_guard
from infra.runtime import tune_gc
from infra.serving import say_serving
from infra.supervised import stop_when_unsupervised
from schemas.topics import DAY_MS, STREAMS_TABLES, TopicCatalog
from streams.metrics import SignalMetrics
from streams.settings import StreamsSettings

logger = logging.getLogger(__name__)

#: Faust gives a table's changelog (a plain ``Table``'s) this cleanup policy.
CHANGELOG_CONFIG = {"cleanup.policy": "compact"}


def streams_topics(settings: StreamsSettings) -> dict[str, dict[str, str]]:
    """The topics the streams app adds to the catalog's, with their configs: the repartition
    topics and the tables' changelogs, all of the telemetry topic's partition count."""
    from streams.app import internal_topics

    repartition = {"retention.ms": str(DAY_MS)}
    changelogs = {f"{settings.namespace}.streams-{table}-changelog": CHANGELOG_CONFIG
                  for table in STREAMS_TABLES}
    return {**{name: repartition for name in internal_topics(settings.namespace).values()},
            **changelogs}


async def ensure_topics(settings: StreamsSettings) -> None:
    """The catalog's topics and the streams app's (``streams_topics``), each with its leader,
    before Faust starts.

    Faust creates a table's changelog itself and subscribes to it at once. Two workers starting
    together both created them: the second's consumer fetched its metadata before the broker's
    held the one the first had just created, and aiokafka fetches metadata again only every 5
    minutes when a topic is missing. Every assignment meanwhile left that changelog out: a
    worker taking over the partitions of a killed one recovered nothing of that table and its
    running totals started again from zero (``tests/integration/test_streams.py`` timed out on
    the whole stream's signals, 2 runs of 27 beside a CPU burner, the windows' changelog
    missing)."""
    await create_topics(settings.bootstrap, TopicCatalog(settings.namespace))
    topics = streams_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [NewTopic(name, settings.partitions, 1, topic_configs=config)
                  for name, config in topics.items() if name not in existing]
        if wanted:
            response = await admin.create_topics(wanted, timeout_ms=15_000)
            for topic, code, *message in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise BusError(f"could not create topic {topic}: error {code} {message}")
        await wait_for_leaders(admin, list(topics))
    finally:
        await admin.close()


def settings_for(namespace: str, bootstrap: str, **overrides) -> StreamsSettings:
    """Settings whose partition count matches the namespace's telemetry topic."""
    catalog = TopicCatalog(namespace)
    telemetry = catalog.spec(catalog.telemetry).partitions
    requests = catalog.spec(catalog.requests).partitions
    if telemetry != requests:
        raise ValueError("the telemetry and requests topics must have equal partition counts")
    return StreamsSettings(namespace=namespace, bootstrap=bootstrap, partitions=telemetry,
                           **overrides)


def use_uvloop() -> bool:
    """Run the worker's event loops (Faust's and its consumer thread's) on uvloop when it is
    installed (a dependency on Linux and macOS). Faust, aiokafka and mode schedule many small
    callbacks, tasks and futures per batch, and the asyncio machinery around them (the loop,
    selector and socket transports in Python) was about a fifth of the worker's CPU
    (``benchmarks.streams_throughput`` under py-spy). ``GOVERNOR_STREAMS_LOOP=asyncio`` keeps
    asyncio's own loop, to compare."""
    if os.environ.get("GOVERNOR_STREAMS_LOOP", "uvloop") == "asyncio":
        return False
    try:
        import uvloop
    except ImportError:  # not on this platform
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def sighup_as_sigterm(off_a_hung_up_terminal) -> None:
    """SIGHUP (the terminal closed, ``infra.hangup``) stops the worker as SIGTERM does, which
    Faust handles (SIGHUP it does not: the worker died at once). Its terminal's output goes to
    /dev/null first: the stop's log lines would fail on it (EIO)."""
    off_a_hung_up_terminal()
    os.kill(os.getpid(), signal.SIGTERM)


def run_worker(settings: StreamsSettings, loglevel: str = "WARNING") -> None:
    """Create the topics, read the configuration topic (``streams.config_feed``: prices, SLO,
    heartbeat timeout; followed while it runs), serve metrics if asked, then run a Faust worker
    until SIGTERM, SIGINT or SIGHUP."""
    import faust
    from prometheus_client import start_http_server

    from streams.app import StreamsApp
    from infra.config_cli import current_config
    from streams.config_feed import ConfigFeed
    from streams.crash import tell_crashes_once
    from streams.settings import Taken

    use_uvloop()
    asyncio.run(ensure_topics(settings))
    catalog = TopicCatalog(settings.namespace)
    taken = Taken.of(asyncio.run(current_config(settings.bootstrap, catalog)))
    settings = settings.model_copy(update={
        "gpu_prices_usd_per_hour": taken.prices_usd_per_hour, "slo": taken.slo,
        "heartbeat_timeout_s": taken.heartbeat_timeout_s})
    metrics = SignalMetrics(windows_s=settings.windows_s, max_keys=settings.metrics_max_keys)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr="127.0.0.1", registry=metrics.registry)
    # Faust wants a data directory even for memory tables (nothing in it outlives the worker):
    # one of its own in the temporary directory, removed when the worker exits.
    datadir = tempfile.TemporaryDirectory(prefix=f"{settings.namespace}.streams-")
    streams = StreamsApp(settings, metrics, datadir=Path(datadir.name))
    level = logging.getLevelName(loglevel.upper()) if isinstance(loglevel, str) else loglevel

    async def set_log_level() -> None:
        # The worker's logging setup leaves the root logger at DEBUG whatever loglevel says,
        # and aiokafka's debug records then cost a fifth of the CPU: set it once started.
        logging.getLogger().setLevel(level)

    streams.app.task(set_log_level)

    async def say_started() -> None:
        say_serving("streams", catalog.telemetry, settings.bootstrap,
                    f"signals to {catalog.signals}")

    streams.app.task(say_started)
    feed = ConfigFeed(streams.stages.use_config, in_force=taken,
                      seen=metrics.config_partitions.set)

    async def follow_config() -> None:
        await feed.follow(settings.bootstrap, catalog)

    streams.app.task(follow_config)
    tune_gc()
    tell_crashes_once()
    worker = faust.Worker(streams.app, loglevel=loglevel, redirect_stdouts=False, quiet=True)
    worker.spinner = None  # its start-up spinner wrote cursor codes into the log (it logs Ready)
    worker.add_future(streams.watch_recovery())
    worker.add_future(stop_when_unsupervised())  # (started by ``up``: stops at its end)
    worker.loop.add_signal_handler(signal.SIGHUP, partial(sighup_as_sigterm,
                                                          terminal_output_guard()))
    logger.info("streams worker for %s on %s", settings.namespace, settings.bootstrap)
    try:
        worker.execute_from_commandline()
    finally:
        datadir.cleanup()
