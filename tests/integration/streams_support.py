"""Helpers of the streams integration tests: Faust worker processes and a signals reader."""

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from infra.bus import Outbox, make_producer
from schemas.codec import decode
from schemas.events import WorkerStatus
from schemas.requests import InferenceRequest
from schemas.topics import TopicCatalog

#: Counters and quantiles that must match the in-memory pipeline exactly (nothing lost, nothing
#: counted twice); rates depend on window spans and are left out.
COMPARED = ("queued", "started", "first_tokens", "completed", "succeeded", "slo_met", "failed",
            "rejected", "sheds", "retries", "requeued", "events", "tokens_in", "tokens_out",
            "provisioned_s", "spend_usd", "attributed_usd", "tasks_closed", "tasks_succeeded",
            "tasks_failed", "task_cost_usd", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "itl_p50_s")


def start_streams_worker(bootstrap: str, namespace: str, log: Path, *options: str,
                         launcher: tuple[str, ...] = ("-m", "infra.cli")) -> subprocess.Popen:
    """``options``: more of ``governor streams``'s. ``launcher``: how Python runs the command
    line (a script that alters the worker first and then runs ``infra.cli``, say)."""
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, *launcher, "--log-level", "INFO", "streams", "--bootstrap",
         bootstrap, "--namespace", namespace, "--tick-s", "0.5", *options],
        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        # A worker killed with SIGKILL leaves its data directory behind: in the test's tmp.
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(log.parent)})
    out.close()
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def the_one_error(log_text: str) -> str:
    """The only ERROR of a crashed worker's log: why it stops. Its stop logged two more before
    7 Dec, each with a traceback: mode's "Crashed reason=..." saying it again, and "Error while
    stopping child <AIOKafkaConsumerThread...>: RuntimeError('Event loop is closed')", a false
    second fault (``streams.crash``)."""
    errors = [line for line in log_text.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "[ERROR] the streams worker stops: " in errors[0], log_text[-3000:]
    assert "Traceback" not in log_text, log_text[-3000:]
    return errors[0]


async def group_state(bootstrap: str, group: str) -> tuple[str, int]:
    """A consumer group's state (``Stable``, ``PreparingRebalance``...) and its member count;
    ``("NoCoordinator", 0)`` while no coordinator answers (a fresh broker)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
    except KafkaError:
        return "NoCoordinator", 0
    finally:
        await admin.close()
    _error, _gid, state, _ptype, _proto, members = described[0].groups[0][:6]
    return state, len(members)


async def group_members(bootstrap: str, group: str) -> int:
    """Members of a consumer group that is stable (0 while it rebalances)."""
    state, members = await group_state(bootstrap, group)
    return members if state == "Stable" else 0


async def wait_for_members(bootstrap: str, group: str, count: int, timeout_s: float,
                           procs: list[subprocess.Popen], logs: list[Path] = ()) -> None:
    """Until ``group`` is stable with ``count`` members. A failure says what the group was
    last seen as and ends with the rebalance lines of ``logs`` (``rebalance_lines``)."""
    deadline = time.monotonic() + timeout_s
    while (seen := await group_state(bootstrap, group)) != ("Stable", count):
        assert all(p.poll() is None for p in procs), "a streams worker exited"
        assert time.monotonic() < deadline, (
            f"{group} was not stable with {count} streams workers within {timeout_s:g} s; "
            f"last seen {seen[0]} with {seen[1]} members{rebalance_lines(*logs)}")
        await asyncio.sleep(0.5)  # polling the broker's group state until the condition holds


#: What a streams worker logs of its group membership and of its tables' recovery.
REBALANCE_LINE = re.compile(r"generation|Heartbeat|Recovery|Restor|rewound|Worker ready|"
                            r"WARNING|ERROR|CRITICAL")


def rebalance_lines(*logs: Path, last: int = 15) -> str:
    """The last rebalance and recovery lines of each worker log, for a failure message: the
    test's temporary directory, and the logs with it, may be gone by the time it is read (a
    takeover timed out once in CI and its logs were lost)."""
    out = []
    for log in logs:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if REBALANCE_LINE.search(line)]
        out.append(f"\n--- the last lines of {log.name} on its rebalances:\n"
                   + "\n".join(lines[-last:]))
    return "".join(out)


async def produce(bootstrap: str, catalog: TopicCatalog, messages) -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        outbox = Outbox(producer)
        for m in messages:
            key = (m.worker_id if isinstance(m, WorkerStatus)
                   else getattr(m, "request_id", None) or m.key)  # (a config's word: its key)
            # (a client's request goes where clients send it; every other record is telemetry)
            topic = catalog.requests if isinstance(m, InferenceRequest) else catalog.telemetry
            outbox.emit(topic, m, key)
        await outbox.flush()
    finally:
        await producer.stop()


class SignalsReader:
    """The newest snapshot of every (scope, key, window) on the namespace's signals topic."""

    def __init__(self, bootstrap: str, catalog: TopicCatalog, windows_s=(10.0, 60.0)) -> None:
        self.bootstrap, self.catalog, self.windows_s = bootstrap, catalog, windows_s
        self.latest: dict[tuple[str, str, str], dict[str, float]] = {}

    async def __aenter__(self) -> "SignalsReader":
        """Reads every partition from offset 0, set directly: no offset lookup, which a broker
        still taking leadership of a new topic's partition can refuse (NotLeaderForPartition),
        leaving the partition unread for a while."""
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await self.consumer.start()
        topic = self.catalog.signals
        partitions = [TopicPartition(topic, p)
                      for p in range(self.catalog.spec(topic).partitions)]
        self.consumer.assign(partitions)
        for partition in partitions:
            self.consumer.seek(partition, 0)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.consumer.stop()

    def total(self, scope_key: str) -> dict[str, float]:
        return self.window(scope_key, "total")

    def window(self, scope_key: str, window: str) -> dict[str, float]:
        """The newest values of ``scope_key``'s ``window`` ("10", "60" or "total")."""
        scope, _, key = scope_key.partition(":")
        return self.latest.get((scope, key, window), {})

    async def poll(self) -> None:
        spec = self.catalog.spec(self.catalog.signals)
        for records in (await self.consumer.getmany(timeout_ms=200)).values():
            for record in records:
                s = decode(spec, record.value)
                window = f"{s.window_s:g}" if s.window_s in self.windows_s else "total"
                self.latest[(s.scope, s.key, window)] = s.values

    async def wait_until(self, condition, timeout_s: float, what: str,
                         procs: list[subprocess.Popen] = (), explain=lambda: "") -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert all(p.poll() is None for p in procs), f"a streams worker exited ({what})"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {explain()}"
            await self.poll()


def differences(actual: dict[str, float], expected: dict[str, float]) -> dict:
    """The compared values that differ, as name: (actual, expected)."""
    out = {}
    for name in COMPARED:
        if name not in expected:
            continue
        have, want = actual.get(name), expected[name]
        if have is None or abs(have - want) > 1e-9 * max(1.0, abs(want)):
            out[name] = (have, want)
    return out


def matches(actual: dict[str, float], expected: dict[str, float]) -> bool:
    return not differences(actual, expected)
