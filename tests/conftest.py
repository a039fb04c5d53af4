"""Shared fixtures: one real Kafka broker for the whole session, fresh topic names per test.

Where the broker comes from, in order:
1. ``GOVERNOR_TEST_BOOTSTRAP=host:port``: an existing cluster;
2. ``GOVERNOR_TESTCONTAINERS=1``: the official Apache Kafka image through testcontainers (needs a
   Docker engine and the ``testcontainers`` package; skipped cleanly where either is missing);
3. otherwise the embedded broker (``infra.kafka``) on its own ports with a fresh data directory.
"""

import asyncio
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from schemas.topics import TopicCatalog

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_sessionstart(session) -> None:
    """Tests that read ../shared/data skip where it is absent; CI (``.ci/run``) sets
    ``GOVERNOR_REQUIRE_SHARED_DATA=1`` so that a runner without it fails at once, saying so,
    rather than passing with the calibration, workload and replay tests unrun."""
    if os.environ.get("GOVERNOR_REQUIRE_SHARED_DATA") == "1" and not (SHARED_DATA / "traces").is_dir():
        raise pytest.UsageError(
            f"GOVERNOR_REQUIRE_SHARED_DATA=1 and there are no traces under {SHARED_DATA}: "
            "the shared data (../shared/data beside the repository) is needed")


#: The stop signals ``up``, ``demo`` and ``sim`` take while they run (``infra.stop_signals``)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def stop_signal_handlers_kept():
    """Each test leaves the process's stop-signal handlers as it found them. ``demo`` or ``up``
    run in process (``CliRunner``) takes them for its cleanup and, as in a process of its own,
    leaves them taken as it returns: a later test's real Ctrl-C (``tests.terminals.ctrl_c_after``)
    was then ignored, and passed or failed by the order the tests ran in."""
    before = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        if handler is not None:  # (None: not set from Python; nothing to put back)
            signal.signal(sig, handler)


def _docker_engine_available() -> bool:
    if shutil.which("docker") is None:
        return False
    import subprocess

    result = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    return result.returncode == 0


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    external = os.environ.get("GOVERNOR_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    if os.environ.get("GOVERNOR_TESTCONTAINERS") == "1":
        if not _docker_engine_available():
            pytest.skip("GOVERNOR_TESTCONTAINERS=1 but no Docker engine runs here")
        kafka_module = pytest.importorskip("testcontainers.kafka")
        with kafka_module.KafkaContainer("apache/kafka:4.1.0").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from infra.kafka import BrokerSettings, EmbeddedKafka, free_ports

    home = tmp_path_factory.mktemp("kafka")
    fixed = os.environ.get("GOVERNOR_TEST_PORT")
    port, controller_port = (int(fixed), int(fixed) + 1) if fixed else free_ports(2)
    kafka = EmbeddedKafka(BrokerSettings(port=port, controller_port=controller_port, home=home))
    bootstrap = kafka.start(timeout_s=120)
    yield bootstrap
    kafka.stop()


@pytest.fixture
def catalog(kafka_bootstrap):
    """A namespace of this test's own, with every topic of the catalog created."""
    from infra.bus import create_topics

    catalog = TopicCatalog(f"t-{uuid.uuid4().hex[:10]}")
    asyncio.run(create_topics(kafka_bootstrap, catalog))
    yield catalog
    asyncio.run(_delete_namespace(kafka_bootstrap, catalog.namespace))


@pytest.fixture
def namespaces_to_delete(kafka_bootstrap):
    """Namespaces a test adds once it knows them (a demo's run id): their topics are deleted
    after the test, as ``catalog``'s are."""
    namespaces: list[str] = []
    yield namespaces
    for namespace in namespaces:
        asyncio.run(_delete_namespace(kafka_bootstrap, namespace))


async def _delete_namespace(bootstrap: str, namespace: str) -> None:
    """Delete every topic of a test's namespace (the catalog's, and those the streams app or a
    test made), so that a broker kept across runs (``GOVERNOR_TEST_BOOTSTRAP``) does not pile up
    partitions: with about 16,000 of them a local broker timed requests out."""
    from infra.bus import delete_topics, namespace_topics

    mine = await namespace_topics(bootstrap, namespace)
    if mine:
        await delete_topics(bootstrap, mine)


@pytest.fixture
def azure_trace() -> Path:
    path = SHARED_DATA / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return path
