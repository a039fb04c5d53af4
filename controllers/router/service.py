"""The router process: a thin Kafka adapter around ``RouterCore``.

It consumes ``governor.requests`` in a consumer group (several routers split the partitions) and
follows everything the core needs to see: worker heartbeats and lifecycle events (telemetry),
every router's dispatches, response offsets, KV block events, controller commands, and the live
configuration. For each request it publishes ``Queued`` and a ``Dispatch`` to the chosen worker's
partition, or ``Rejected`` with a reason; it commits a request only after that is acknowledged.
A request no live worker can take yet waits for one, out of line (``controllers.router.waiting``:
the requests read after it are answered meanwhile, each model's placed in the order they were
read, and its partition is committed no further than it), up to ``no_worker_wait_s``; then it is
rejected. After one such wait in vain with no live worker of the model at all, its requests are
rejected at once until one of them is placed. A request for a model no worker of the fleet is of
(loading, draining or gone silent alike) and no autoscaler pool names (a typo) is rejected at
once: no worker of it is coming. Every ``tick_s`` it re-dispatches lost requests.

When the group rebalances (a router joins or leaves) the router hands its partitions over
cleanly: the rebalance waits for the batch in hand, which stops at the request it is on; the
requests still waiting for a worker are sent again to the end of their partitions (as when the
router stops); what was answered is sent and committed, the rest is read again by whoever takes
the partition. So a request is placed once, not by the
old owner from a stale batch and again by the new one from the last commit. (A request another
router answered, followed live, is not placed again either if it is redelivered here.) After
each rebalance it lists the group's members, and before it joins: a router started under the
id of one running refuses to start (``RouterIdInUse``), and the running one serves on; of two
that joined under one id, one listed alone under it before serves on and the other stops
(both, where both started at once). A request whose ``reply_to`` names a topic the broker does not list is
refused (``invalid_request``).

On start it reads back the last ``recovery_window_s`` of what it follows before it takes a
request: restarted after a crash, it knows again the requests it had placed (and resumes them if
their worker dies) and does not place twice a request redelivered because its commit was lost.
The requests of a router missing from the group for ``orphan_after_s`` are resumed by the live
routers, spread over them by a hash of each request's id (``RouterCore.adopter``).
"""

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import CollectorRegistry

from controllers.live_config import LiveConfig
from controllers.metrics import RouterMetrics
from controllers.overrides import CommandRefused
from controllers.router.admission import Denial
from controllers.router.core import (NO_CAPACITY_RETRY_S, NO_WORKER_WAIT_S, ORPHAN_AFTER_S, Emit,
                                    RouterCore)
from controllers.router.waiting import Waiting, WaitingRoom
from infra.bus import (CONFIG_PARTITION, FETCH_RECORDS, GROUP_METADATA_MS, ConfigPartition,
                       Decoded, HeardUntil, Outbox, StreamPartition, TopicList, TypedConsumer,
                       background, handle_each, listed_partition_count, make_producer, now_ms,
                       partitions, partitions_of, read_back, read_to_end, stream_partition,
                       take_on_added, track_topics)
from infra.bus import follower as make_follower
from infra.serving import say_serving
from schemas.base import Message
from schemas.codec import DecodeError, EncodeError, decode
from schemas.commands import ScalePool
from schemas.config import ConfigSet, GovernorConfig
from schemas.errors import TerminalError
from schemas.events import Cancelled, Queued, Rejected, WorkerStatus, about, waiting_for_worker
from schemas.limits import MAX_REASON_CHARS
from schemas.requests import (CancelRequest, Dispatch, FinishReason, InferenceRequest,
                              UNUSABLE_REPLY_TO, ResponseChunk, salvage_identity, stream_end)
from schemas.topics import TopicCatalog

logger = logging.getLogger(__name__)

_REMEMBERED = 200_000  # request ids kept to drop redelivered requests (and reused ids)
#: What ``_seen`` holds for an id whose record was no valid request (no digest is this long)
_MALFORMED = b"malformed"
#: How the detail of the ``Rejected`` of such a record begins (``_refuse_malformed``).
_NOT_A_REQUEST = "not a valid request ("
_UNSERVED_MODELS = 1_024  # model names remembered as served by no live worker
_EARLY_CANCELS = 10_000  # cancels kept for requests not read yet
_UNQUEUED_ELSEWHERE = 100_000  # other routers' placements kept until their Queued is read
#: A cancel read before its request is handed on with the partition if sent this recently.
_EARLY_CANCEL_KEEP_MS = 300_000
#: How long after the autoscaler's last command for a pool of a model (it restates them every
#: few seconds) a worker of the model counts as one that may come.
COMMANDED_FOR_MS = 60_000
#: Requests waiting for a worker at most: past it the router reads no more until some are answered.
_WAITING_MAX = 10_000
#: How long a router newly assigned partitions waits to have read the answers sent before.
_HEAR_UP_S = 5.0
#: How long a router stopping or handing its partitions over waits to send its waiting requests
#: back (a rebalance allows it 15 s in all).
_RELEASE_S = 10.0
_LIST_RETRY_S = 5.0  # how often a router asks again for its group's members until it has them
#: How long a starting router waits for a member of its group under its id to leave before it
#: refuses to start: longer than the group's session timeout (6 s), after which the broker
#: drops the member of a router that crashed under the id (restarted at once, by ``governor up``).
_ID_FREE_WAIT_S = 10.0
_FAILURES_IN_A_ROW = 100  # followed events failed one after another: the router stops


class RouterService:
    def __init__(
        self,
        bootstrap: str,
        catalog: TopicCatalog,
        *,
        router_id: str = "router-0",
        no_worker_wait_s: float = NO_WORKER_WAIT_S,
        tick_s: float = 0.25,
        recovery_window_s: float = 600.0,
        orphan_after_s: float = ORPHAN_AFTER_S,
        config: GovernorConfig = GovernorConfig(),
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where its Prometheus metrics go (``controllers.metrics``)."""
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.router_id = router_id
        self.no_worker_wait_s = no_worker_wait_s
        self.tick_s = tick_s
        self.recovery_window_s = recovery_window_s
        self.read_back = 0  # events the last take_over decoded and observed
        self.core = RouterCore(config, router_id)
        self.core.orphan_after_s = orphan_after_s
        self.metrics = RouterMetrics(lambda: self.core.answerable(now_ms()), registry,
                                     waiting=lambda: len(self.waiting),
                                     continuations_waiting=lambda: self.core.continuations_waiting(
                                         now_ms()))
        self.live_config = LiveConfig(router_id, config, check=RouterCore(config).apply_config)
        #: Request ids answered (or waiting) -> the request's ``_body``, where known: a request
        #: read again under its id is dropped, another request under it dead-lettered
        self._seen: OrderedDict[str, bytes | None] = OrderedDict()
        self._changed = asyncio.Event()
        #: Models a request last waited ``no_worker_wait_s`` for in vain: until one is placed
        #: again, their requests are refused at once instead of each holding up the ones behind.
        self._unserved: set[str] = set()
        #: Models of the autoscaler's ``ScalePool`` commands (it restates every pool's every few
        #: seconds, one at zero too) -> the time of the latest: a worker of one may come
        self._commanded: OrderedDict[str, int] = OrderedDict()
        self._sized: OrderedDict[str, int] = OrderedDict()  # pool -> replicas last commanded
        #: Until when the follower has read every heartbeat: not yet (``take_over`` says since
        #: when it has read them)
        self._heard = HeardUntil(partitions(catalog, [catalog.telemetry]), since_ms=0)
        #: Requests waiting for a worker of their model, out of line (``_retry_waiting``)
        self.waiting = WaitingRoom()
        self._began_waiting: dict[str, int] = {}  # model -> requests, since last told
        #: clients' cancels read before their requests: request id -> (cancel, its partition)
        self._early_cancels: OrderedDict[str, tuple[CancelRequest, int | None]] = OrderedDict()
        #: Each request-topic partition's offset past the records handled (answered, waiting or
        #: dead-lettered), and its offset last committed (``_commit_points``)
        self._read_to: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._assigned_ms = 0  # when the partitions were last assigned
        self._requests: AIOKafkaConsumer | None = None  # (the request topic's, once running)
        self._bad_slots: set[str] = set()  # workers said to claim a slot past the partitions
        #: Held while a batch of requests is handled, answered and committed; a rebalance takes
        #: it before the partitions move, so no batch is half done when they do.
        self._batch = asyncio.Lock()
        self._ticking = asyncio.Lock()  # held by a resumption tick until its messages are sent
        self._rebalances = 0  # rebalances begun (a listing made across one is stale)
        self._settled = False  # given its partitions since the last rebalance began
        self._said_serving = False  # (``say_serving``, at its first partitions)
        #: the group's members are listed since the last rebalance (else asked again, each 5 s)
        self._listed = False
        self._list_tried = -math.inf
        self._handing_over = False  # a rebalance waits for the batch: stop it where it is
        self._revocations = 0  # a batch fetched before a revocation is read again, not handled
        #: The request topic's partitions this router consumes (those of its last assignment).
        self.assigned: frozenset[int] = frozenset()
        self._reply_topics = TopicList(None)  # asked of the broker once the router runs
        self._id_in_use = ""  # why this router must stop: another runs under its id
        self._alone = False  # listed as the only member under its id since it started
        #: the read-back's own first dispatches whose Queued it has not read (yet)
        self._unqueued: dict[str, Dispatch] = {}
        #: clients' cancels other routers forwarded, read while not assigned (``_forwarded``)
        self._deferred: list[tuple[CancelRequest, int | None]] = []
        #: the Queued of the requests placed in the batch in hand, sent after their Dispatch
        self._placed: list[Queued] = []
        #: Other routers' first placements whose Queued this router has not read, by request
        #: id: one read again here (its partition moved) is sent its Queued (``_reused``)
        self._unqueued_elsewhere: OrderedDict[str, Dispatch] = OrderedDict()

    async def run(self, stop: asyncio.Event) -> None:
        await self._refuse_if_id_in_use()
        self.producer = make_producer(self.bootstrap)
        own = set(self.catalog.topics())  # (the others: clients' reply topics, ends of streams)
        self.outbox = Outbox(self.producer, observe=self.metrics.emitted,
                             detached=lambda topic: topic not in own,
                             vanished=lambda topics: self._vanished(topics - own))
        self._reply_topics = TopicList(self.producer.client, max_age_s=60.0)  # (deletions too)
        requests = self._requests = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=f"{self.catalog.namespace}.router",
            enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6_000,
            heartbeat_interval_ms=1_000,
            rebalance_timeout_ms=15_000,  # time to finish the request in hand and commit
            metadata_max_age_ms=GROUP_METADATA_MS,  # (partitions added: taken on this soon)
            client_id=self.router_id,  # how the group lists it: two routers of one id show
        )
        c = self.catalog
        self._config_partition = await ConfigPartition.start(
            self.bootstrap, c, f"router {self.router_id}", seen=self.metrics.config_partitions.set)
        config = self._config_partition.consumer
        await self.producer.start()
        # every topic it writes, known from the start: its first send to a client's reply topic
        # created after a refresh of every topic would otherwise have it track that one alone,
        # and its own lose their leaders (``track_topics``)
        track_topics(self.producer, own)
        follower = await self.take_over()
        await requests.start()
        settings = self._typed(config)
        # The configuration in force before the first request is routed (not each intermediate
        # one of the topic's history, applied while requests come in).
        if not await read_to_end(settings, c.config, self._configured):
            logger.warning("router %s: the configuration topic was not read to its end in 30 s; "
                           "routing meanwhile", self.router_id)
        self._restore_config()
        await self.outbox.flush()
        requests.subscribe([c.requests], listener=_HandOver(self))
        tasks = [
            background(self._follow(self._typed(follower)), stop),
            background(self._follow_config(settings), stop),
            background(self._resume_loop(stop), stop),
        ]
        typed = self._typed(requests)
        logger.info("router %s consuming %s", self.router_id, c.requests)
        try:
            while not stop.is_set():
                if self._id_in_use:
                    raise RouterIdInUse(self._id_in_use)
                full = len(self.waiting) >= _WAITING_MAX  # read no more until some are answered
                if full != bool(requests.paused()):
                    if full:
                        requests.pause(*requests.assignment())
                    else:
                        requests.resume(*requests.paused())
                fetched = await requests.getmany(timeout_ms=200, max_records=FETCH_RECORDS)
                # getmany returns records of the assignment in force only, and nothing ran
                # since: a revocation counted after this one makes the batch stale
                revocations = self._revocations
                if not fetched and not self.waiting:
                    continue
                if fetched:
                    await self._heard_since_assigned()
                async with self._batch:
                    if self._revocations != revocations:
                        continue  # the partitions moved since: their owners read these again
                    # decoded only now: a stale batch's bad records are dead-lettered once, by
                    # the partition's next owner, not also here
                    items, bad = typed.split(fetched)
                    if bad:
                        await typed.dead_letter(bad)
                        await self._refuse_malformed(bad, items)
                    self._retry_waiting()  # (before the requests read after them)
                    handled, reused = 0, []
                    for item in items:
                        if stop.is_set() or self._handing_over:
                            break
                        error = await self._on_request(item.message, item.record.partition,
                                                       item.record.offset)
                        if error is not None:
                            reused.append((item.record, error))
                        handled += 1
                    if reused:
                        await typed.dead_letter(reused)
                    dead = typed.take_dead_lettered()  # done with, like a request answered
                    for tp, offset in _done_with(c.requests, items, handled, dead).items():
                        self._read_to[tp] = max(self._read_to.get(tp, 0), offset)
                    self._tell_waiting()
                    await self.outbox.flush()
                    await self._send_queued()
                    await self._commit(requests, self._commit_points())
        finally:
            async with self._batch:
                await self._release_waiting()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for consumer in (requests, follower, config):
                await consumer.stop()
            await self.producer.stop()
        failed = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()]
        if failed:
            raise failed[0]

    def _typed(self, consumer: AIOKafkaConsumer) -> TypedConsumer:
        """``consumer``'s typed reader, whose dead letters the metrics count."""
        return TypedConsumer(consumer, self.catalog, self.producer, self.router_id,
                             counted=self.metrics.dead_lettered)

    async def take_over(self) -> AIOKafkaConsumer:
        """Observe what the followed topics hold from ``recovery_window_s`` ago to now; return
        the started follower, positioned where this read-back ended. Topics are read one after
        another: dispatches before the lifecycle events that end them and the chunks that
        advance them, so a request that ended is not taken for one in flight."""
        c = self.catalog
        topics = (c.control, c.dispatch, c.telemetry, c.kv, c.responses)
        # (its fetches wait 0.1 s, not 0.5 s: an offset lookup of the read-back waits behind
        # a fetch waiting for data, 0.5 s per topic)
        follower = make_follower(self.bootstrap)
        await follower.start()
        followed = partitions_of(follower, c, topics)  # (the broker's; added ones: ``_follow``)
        asked_ms = now_ms()
        now = await follower.end_offsets(followed)
        # read back to these ends, so heard until when they were asked for
        self._heard = HeardUntil([tp for tp in followed if tp.topic == c.telemetry],
                                 since_ms=asked_ms)
        started, since = time.monotonic(), now_ms() - int(self.recovery_window_s * 1000)
        self.read_back, self._unqueued = 0, {}
        for topic in topics if self.recovery_window_s > 0 else ():
            spec = c.spec(topic)
            async for record in read_back(follower, topic, since, now):
                if topic == c.responses and not self._in_flight_key(record.key):
                    continue  # a chunk of a request that ended: most of the topic, not decoded
                try:
                    message = decode(spec, record.value)
                except DecodeError:
                    continue  # dead-lettered when it was first read
                if c.misplaced(topic, record.partition, message) is not None:
                    continue  # (so too)
                try:
                    self._recovered(message, record.partition, record.timestamp)
                except CommandRefused as exc:  # (dead-lettered when it was first read)
                    logger.warning("router %s: %s", self.router_id, exc)
                except Exception:  # dead-lettered as unprocessable when it was first read
                    logger.exception("router %s failed on %s[%d]@%d read back", self.router_id,
                                     topic, record.partition, record.offset)
        for dispatch in self._unqueued.values():  # its Queued lost in the crash: sent now, as
            # of its placement (the audit counts a request that ends without one a violation)
            self.outbox.emit(c.telemetry, _queued(dispatch.request, dispatch.event_time_ms),
                             dispatch.request.request_id)
        if self._unqueued:
            logger.info("router %s sends the Queued of %d requests it placed before it stopped",
                        self.router_id, len(self._unqueued))
            await self.outbox.flush()
        mine = sum(f.dispatch.router_id == self.router_id for f in self.core.in_flight.values())
        logger.info("router %s read back %d events of the last %gs in %.1fs: %d requests in "
                    "flight, %d of them placed by this router", self.router_id, self.read_back,
                    self.recovery_window_s, time.monotonic() - started, len(self.core.in_flight),
                    mine)
        follower.assign(followed)
        for partition in followed:
            follower.seek(partition, now[partition])  # live from where the read-back ended
        return follower

    async def _vanished(self, topics: set[str]) -> set[str]:
        """The clients' reply topics among ``topics`` that the broker no longer has: an end of
        stream to one is given up, and the topic forgotten by the producer (the outbox's)."""
        return {t for t in topics if not await self._reply_topics.exist(t, fresh=True)}

    async def _send_queued(self) -> None:
        """The ``Queued`` of the requests placed since the last call, sent once their
        ``Dispatch`` is on the broker (the caller has flushed it): a Queued must never be there
        without its Dispatch. A router that reads another's Queued takes its request as placed
        and drops it when it is delivered again, so a router stopped between the two (killed,
        or its Dispatch refused) lost the request. (The read-back takes a Queued only with its
        Dispatch; the restarted router sends a Queued its crash lost: ``take_over``.)"""
        placed, self._placed = self._placed, []
        for queued in placed:
            self.outbox.emit(self.catalog.telemetry, queued, queued.request_id)
        if placed:
            await self.outbox.flush()

    def _commit_points(self) -> dict[TopicPartition, int]:
        """The request topic's offsets to commit now: past every request answered and every
        record dead-lettered, but in each partition no further than its first request still
        waiting for a worker (or left unanswered), which is read again after a rebalance."""
        first_waiting = self.waiting.first_offsets()
        points = {}
        for tp, read_to in self._read_to.items():
            point = min(read_to, first_waiting.get(tp.partition, read_to))
            if point != self._committed.get(tp):
                points[tp] = point
        return points

    async def _commit(self, requests: AIOKafkaConsumer, points: dict[TopicPartition, int]) -> None:
        if not points:
            return
        try:
            await requests.commit(points)
            self._committed.update(points)
        except (CommitFailedError, IllegalStateError):
            # Out of the group before the commit (a rebalance that outlasted its timeout), or
            # the partitions moved: their next owner reads these requests again and places
            # those whose answer it has not followed yet.
            logger.warning("router %s: the group rebalanced before this batch was committed; "
                           "its requests are read again by their partitions' new owners",
                           self.router_id)

    async def _release_waiting(self) -> None:
        """Leave what this router holds of its partitions to whoever reads them next (this
        router too, after a rebalance): the requests still waiting for a worker, and the cancels
        read before their requests (sent in the last ``_EARLY_CANCEL_KEEP_MS``), each sent again
        to the end of its partition; then commit all that was read. A commit cannot skip a
        record: stopped at the first request waiting, it would have the next owner read again
        the requests answered after it, and only a router that has read those answers could
        tell. (A commit that failed before is tried again here too.) Raises nothing: what it
        could not send or commit is read again from the last commit (it runs in a rebalance,
        and as the router stops, where an error would hide what stopped it)."""
        left = self.waiting.clear()
        recent = now_ms() - _EARLY_CANCEL_KEEP_MS
        cancels = [(cancel, partition) for cancel, partition in self._early_cancels.values()
                   if cancel.event_time_ms >= recent]
        self._early_cancels.clear()
        for waiting in left:
            rid = waiting.request.request_id
            self._seen.pop(rid, None)  # read again, it is new
            self.outbox.emit(self.catalog.requests, waiting.request, rid, waiting.partition)
        for cancel, partition in cancels:
            self.outbox.emit(self.catalog.requests, cancel, cancel.request_id, partition)
        # Flushed whatever it holds: it raises for every message refused so far, and the
        # requests a refused answer was for must not be committed (a router stopping because
        # the broker refused a batch's Dispatch committed that batch, and its requests were lost)
        try:
            await asyncio.wait_for(self.outbox.flush(), timeout=_RELEASE_S)
        except Exception as exc:  # not sent: committed no further than the first of them
            logger.warning("router %s could not send back the %d requests waiting for a "
                           "worker and %d cancels, or an answer was refused (%s); the requests "
                           "are read again from the last commit", self.router_id, len(left),
                           len(cancels), exc)
            return
        if left or cancels:
            logger.info("router %s left %d requests waiting for a worker and %d cancels read "
                        "before their requests to the next to read their partitions",
                        self.router_id, len(left), len(cancels))
        if self._requests is not None:
            try:
                await self._commit(self._requests, self._commit_points())
            except Exception:
                logger.exception("router %s could not commit what it read before letting its "
                                 "partitions go", self.router_id)

    async def _heard_since_assigned(self) -> None:
        """Before the first requests of a new assignment: wait (up to ``_HEAR_UP_S``) until the
        follower has read what was sent before it. A router that crashed had committed no
        further than its batch in hand, or its first request waiting for a worker: the answers
        it sent to the requests read here again are then known, and not sent twice."""
        deadline = time.monotonic() + _HEAR_UP_S
        while (self.core.fleet.heard_until_ms or 0) < self._assigned_ms \
                and time.monotonic() < deadline:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=0.1)
            except TimeoutError:
                pass

    async def _hand_over(self) -> None:
        """The group rebalances: stop the batch in hand where it is and wait until what it
        answered is sent and committed; batches fetched before now are not handled."""
        self._handing_over = True
        # Another router's placements are resumed here only while the group is settled: a
        # router rejoining under its id resumes its own once assigned, after this returns, and
        # by then the continuations of a tick in progress here are on the broker.
        self.core.routers_listed(None, now_ms())
        self._rebalances += 1
        self._settled = self._listed = False
        async with self._batch, self._ticking:
            self._revocations += 1
            self._handing_over = False
            await self._release_waiting()
            self._read_to.clear()  # (not the revoked partitions': none commits again)
            self._committed.clear()

    async def _members(self) -> list[tuple] | None:
        """The router group's members as the broker lists them (member id, client id: the
        router's id, host, ...); None where it cannot answer now, or answers with an error (a
        coordinator loading or moved: no members listed)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5_000)
        try:
            await admin.start()
            described = await admin.describe_consumer_groups([f"{self.catalog.namespace}.router"])
            error, members = described[0].groups[0][0], described[0].groups[0][5]
        except (KafkaError, TimeoutError, IndexError) as exc:
            logger.warning("router %s could not list its group's members: %s", self.router_id, exc)
            return None
        finally:
            await admin.close()
        if error:
            logger.warning("router %s: its group's listing is unusable (error code %d)",
                           self.router_id, error)
            return None
        return list(members)

    async def _refuse_if_id_in_use(self) -> None:
        """Before it joins its group: a router under this one's id that stays in the group for
        ``_ID_FREE_WAIT_S`` is running, and this one refuses to start (``RouterIdInUse``)
        instead of joining (joined, each would take the other's placements for its own, and
        the running one would stop with it). One that leaves meanwhile (it crashed, or is
        stopping) is let go. A group the broker cannot list now is joined: the listing after
        the rebalance tells."""
        deadline = time.monotonic() + _ID_FREE_WAIT_S
        while True:
            members = await self._members()
            hosts = sorted(m[2] for m in members or () if m[1] == self.router_id)
            if not hosts:
                return
            if time.monotonic() >= deadline:
                raise RouterIdInUse(
                    f"a router already runs under the id {self.router_id!r} (from "
                    f"{', '.join(hosts)}) in group {self.catalog.namespace}.router: this one "
                    f"does not start; give it an id of its own (--router-id), or stop that "
                    f"router first")
            await asyncio.sleep(0.5)  # the next listing (the member may leave meanwhile)

    async def _check_id(self) -> None:
        """After a rebalance, the group's members as the broker lists them (asked again every
        5 s until it answers): for the requests of routers gone from the group, and another
        router under this one's id (both placing requests as their own, each ignoring the
        other's). One that joined the group under an id in use (started while the router under
        it was joining: ``_refuse_if_id_in_use`` did not see it) stops; one that was listed
        alone under its id before serves on (the newcomer stops); two that never were (started
        at once) both stop."""
        rebalances, self._list_tried = self._rebalances, time.monotonic()
        # (bounded: the partitions are not read until this returns)
        members = await self._members()
        # A listing without this router is as unusable as an error. Taken as they are, every
        # other router would count as gone and its requests as this one's to continue.
        if members is None or not any(member[1] == self.router_id for member in members):
            if members is not None:
                logger.warning("router %s: its group's listing (%d members) does not list it; "
                               "asked again", self.router_id, len(members))
            return
        if rebalances != self._rebalances:
            return  # a rebalance began meanwhile: its own listing follows
        self._listed = True
        self.core.routers_listed(frozenset(member[1] for member in members), now_ms())
        hosts = [member[2] for member in members if member[1] == self.router_id]
        if len(hosts) == 1:
            self._alone = True
        elif self._alone:
            logger.warning("router %s: %d routers run under its id (from %s); this one ran "
                           "alone under it before and serves on, the other stops",
                           self.router_id, len(hosts), ", ".join(sorted(hosts)))
        else:
            self._settled = False  # (it resumes nothing on its way out)
            self._id_in_use = (
                f"{len(hosts)} routers run under the id {self.router_id!r} (from "
                f"{', '.join(sorted(hosts))}); give each router an id of its own (--router-id), "
                "the same one each time it restarts")

    def _taken(self, assigned: set[TopicPartition], partitions: int) -> None:
        """The partitions of the request topic this router now consumes, of ``partitions``.
        Task admission weighs the tasks it sees against its share of the fleet, and admission
        takes its share of each tenant's rate limit: its share of the topic's partitions, as
        the broker lists them (partitions added to the topic count)."""
        self.assigned = frozenset(tp.partition for tp in assigned)
        self._settled = True
        self._assigned_ms = now_ms()
        logger.info("router %s consumes %s partitions %s", self.router_id, self.catalog.requests,
                    sorted(self.assigned))
        if not self._said_serving:  # (once: later rebalances are logged at INFO)
            self._said_serving = True
            say_serving(f"router {self.router_id}", self.catalog.requests, self.bootstrap,
                        f"partitions {sorted(self.assigned)}")
        if assigned:
            self.core.request_share = min(1.0, len(assigned) / partitions)
            # and the tenants' limits are the fleet's: this router admits its share of them
            self.core.admission.set_share(self.core.request_share, self._assigned_ms)

    def _recovered(self, message: Message, partition: int | None = None,
                   written_ms: int | None = None) -> None:
        """One event of the read-back: the core observes it, and a request that had its answer
        or was placed by this router is remembered, so a redelivery is not placed again. A
        ``Queued`` counts only with its ``Dispatch`` (read before it, from the dispatch topic):
        a crash between the two left the request uncommitted, and its redelivery is placed. A
        client's cancel another router forwarded is taken as when it is followed live (what it
        makes the core send goes with the first flush)."""
        self.read_back += 1
        self._heard_of_queued(message)
        if isinstance(message, Queued):
            self._unqueued.pop(message.request_id, None)
        if isinstance(message, Rejected) or (
                isinstance(message, Queued) and message.request_id in self.core.in_flight):
            self._remember_answered(message)
        elif isinstance(message, Dispatch) and message.router_id == self.router_id:
            self._remember(message.request.request_id, _body(message.request))
            if message.attempt == 1:  # its Queued went out with it (the telemetry is read later)
                self._unqueued[message.request.request_id] = message
        if isinstance(message, CancelRequest):  # a client's, forwarded: as when followed live
            self._forwarded(message, partition)
        elif isinstance(message, ScalePool):
            self._scaled(message)
        elif not isinstance(message, WorkerStatus) or self._slot_served(message):
            self.core.observe(message, now_ms(), written_ms)

    def _in_flight_key(self, key: bytes | None) -> bool:
        """Whether a record keyed by request id (a response chunk) is of a request in flight."""
        return key is not None and key.decode(errors="replace") in self.core.in_flight

    def _remember_answered(self, answer: Queued | Rejected) -> None:
        """A request answered, as read from telemetry (another router's answer, or this one's
        before it started): the refusal of a record that was no valid request keeps its id
        taken as such (``_reused``), not as a request whose resend is a redelivery."""
        rid = answer.request_id
        malformed = isinstance(answer, Rejected) and answer.reason == "invalid_request" \
            and answer.detail.startswith(_NOT_A_REQUEST)
        self._remember(rid, _MALFORMED if malformed and self._seen.get(rid) is None else None)

    def _remember(self, request_id: str, body: bytes | None = None) -> None:
        """A request answered, placed or waiting here (its ``_body`` where known)."""
        self._seen[request_id] = self._seen.get(request_id) if body is None else body
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)

    async def _follow(self, typed: TypedConsumer) -> None:
        failed_in_a_row = 0
        heard = self._heard
        while True:
            emitted = 0
            await take_on_added(typed.consumer, heard)
            items = await typed.fetch(100)
            self.core.fleet.heard_until_ms = await heard.update(
                typed.consumer, (item.record for item in items))
            for item in items:
                try:
                    emitted += self._followed(item.message, item.record.partition,
                                              item.record.timestamp)
                    failed_in_a_row = 0
                except CommandRefused as exc:  # (dead-lettered: the analytics say it did not hold)
                    await typed.dead_letter([(item.record, DecodeError("future_event_time",
                                                                       str(exc)))])
                except Exception as exc:  # a valid event the core fails on: set aside, not a
                    # crash (the read-back would meet it again at every restart); but a failure
                    # on every event is a broken router, which stops
                    failed_in_a_row += 1
                    if failed_in_a_row > _FAILURES_IN_A_ROW:
                        raise
                    logger.exception("router %s failed on %s[%d]@%d", self.router_id,
                                     item.record.topic, item.record.partition, item.record.offset)
                    await typed.dead_letter([(item.record, DecodeError(
                        "unprocessable", f"{type(exc).__name__}: {exc}"))])
            typed.take_dead_lettered()  # (the follower commits nothing: kept for no one)
            if emitted:
                await self.outbox.flush()

    def _followed(self, message: Message, partition: int | None = None,
                  written_ms: int | None = None) -> int:
        """One live event of a followed topic (read from ``partition``, its record written at
        ``written_ms``: ``RouterCore.observe``); returns how many
        messages it emitted. A request another router answered is remembered too: redelivered
        here after a rebalance, it is not placed a second time."""
        if isinstance(message, Dispatch) and message.router_id == self.router_id:
            if self.core.knows(message):
                return 0  # our own: the core accounted for it when it decided
            # Placed under this id by a process it knows nothing of: its predecessor, still
            # serving while this one started (a rolling restart). Taken over as one read back.
            self._remember(message.request.request_id, _body(message.request))
        if isinstance(message, CancelRequest):
            # A client's cancel another router forwarded: ours to end if we placed the request.
            return self._forwarded(message, partition)
        self._heard_of_queued(message)
        if isinstance(message, Queued | Rejected):
            self._remember_answered(message)
        if isinstance(message, WorkerStatus) and not self._slot_served(message):
            return 0
        if isinstance(message, ScalePool):
            self._scaled(message)
            return 0
        self.core.observe(message, now_ms(), written_ms)
        self._changed.set()
        if isinstance(message, Dispatch) and message.request.request_id in self._early_cancels:
            return self._placed_elsewhere(message)
        return 0

    def _placed_elsewhere(self, dispatch: Dispatch) -> int:
        """A client's cancel this router read before its request, which another router has now
        placed: the request was produced to another partition than its cancel (by a producer
        that partitions keys otherwise: README, "A client of your own"), so it never comes here.
        The cancel goes to the request's slot, as one read after another router placed its
        request does (``RouterCore.cancel``); returns how many messages that sent."""
        rid = dispatch.request.request_id
        cancel, _partition = self._early_cancels.pop(rid)
        return self._send(self.core.cancel(cancel, now_ms()), rid)

    def _heard_of_queued(self, message: Message) -> None:
        """Keep another router's first placement until its Queued is read (read back or live)."""
        if isinstance(message, Dispatch) and message.attempt == 1 and \
                message.router_id != self.router_id:
            self._unqueued_elsewhere[message.request.request_id] = message
            if len(self._unqueued_elsewhere) > _UNQUEUED_ELSEWHERE:
                self._unqueued_elsewhere.popitem(last=False)
        elif isinstance(message, Queued):
            self._unqueued_elsewhere.pop(message.request_id, None)

    def _forwarded(self, cancel: CancelRequest, partition: int | None) -> int:
        """A client's cancel another router forwarded (read from dispatch ``partition``): the
        core ends the request if this router continues it. Not before this router is assigned
        since the last rebalance began (it is then taken at the next tick): until that rebalance
        reaches it, a router that listed this one as gone continues its requests, and ends them
        too (both sent ``Cancelled``)."""
        if not self._settled:
            self._deferred.append((cancel, partition))
            return 0
        return self._send(self.core.forwarded_cancel(cancel, partition, now_ms()),
                          cancel.request_id)

    def _take_deferred(self) -> int:
        """The forwarded cancels read while not assigned (``_forwarded``), taken now; returns
        how many messages they made the core send."""
        deferred, self._deferred = self._deferred, []
        return sum(self._forwarded(cancel, partition) for cancel, partition in deferred)

    def _scaled(self, command: ScalePool) -> None:
        """The autoscaler sizes a pool of ``command.model``: a worker of it may come; one sized
        up (from zero, say, its cap raised) is coming, so the model's requests wait again."""
        self._commanded[command.model] = max(self._commanded.pop(command.model, 0),
                                             command.event_time_ms)
        if len(self._commanded) > _UNSERVED_MODELS:
            self._commanded.popitem(last=False)
        if command.replicas > self._sized.pop(command.pool, 0):
            self._unserved.discard(command.model)
        self._sized[command.pool] = command.replicas
        if len(self._sized) > _UNSERVED_MODELS:
            self._sized.popitem(last=False)

    def _slot_served(self, status: WorkerStatus) -> bool:
        """Whether a heartbeat's slot is a partition of the dispatch topic: a worker claiming
        one past them (misconfigured, or another deployment's) is not placed on (a dispatch to
        it could not be sent), and is said once."""
        partitions = self.catalog.spec(self.catalog.dispatch).partitions
        if status.slot < partitions:
            return True
        if status.worker_id not in self._bad_slots and len(self._bad_slots) < _UNSERVED_MODELS:
            self._bad_slots.add(status.worker_id)
            logger.warning("router %s ignores worker %s: its slot %d is past the %d partitions "
                           "of %s", self.router_id, status.worker_id, status.slot, partitions,
                           self.catalog.dispatch)
        return False

    async def _follow_config(self, typed: TypedConsumer) -> None:
        while True:
            await handle_each(await typed.fetch(500), self._configured)
            self._config_partition.watch()
            self._restore_config()
            await self.outbox.flush()

    def _configured(self, item: Decoded) -> None:
        """One record of the configuration topic: applied, or rejected with why."""
        if not isinstance(item.message, ConfigSet):
            return
        verdict = self.live_config.apply(item.message, item.record.offset, now_ms(),
                                         item.record.key, written_ms=item.record.timestamp)
        if verdict.type == "config_applied":
            self.core.apply_config(self.live_config.config, item.message)
        else:
            logger.warning("config rejected: %s", verdict.reason)
        self.outbox.emit(self.catalog.telemetry, verdict, verdict.key)

    def _restore_config(self) -> None:
        """Write again each good setting that a rejected record, now its key's newest, would
        take the place of once the topic is compacted (``LiveConfig.to_restore``)."""
        for record in self.live_config.to_restore(now_ms()):
            logger.warning("router %s writes %s again: the newest record of its key was "
                           "rejected, and compaction would keep that one", self.router_id,
                           record.key)
            self.outbox.emit(self.catalog.config, record, record.key, CONFIG_PARTITION)

    async def _resume_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.tick_s)  # the resumption tick
            if self._settled and not self._listed \
                    and time.monotonic() - self._list_tried >= _LIST_RETRY_S:
                await self._check_id()  # the listing after the last rebalance failed
            async with self._ticking:
                if not self._settled:
                    # Not assigned since the last rebalance began (nor yet, just started): a
                    # router that has listed this one as gone may be continuing its requests
                    # until that rebalance reaches it, and both would continue one (``_hand_over``)
                    continue
                sent = self._take_deferred()
                emits = self.core.resume(now_ms())
                for emit in emits:
                    message = emit.message
                    key = message.request.request_id if isinstance(message, Dispatch) \
                        else message.request_id
                    self._send([emit], key)
                    if isinstance(message, Dispatch):
                        logger.info("resumed %s on %s at token %d", key, message.worker_id,
                                    message.resume_from_token)
                if emits or sent:
                    await self.outbox.flush()

    def _send(self, emits: list[Emit], request_id: str) -> int:
        """What the core answered about one request: dispatch-topic messages to their slot,
        lifecycle events to telemetry, the end of its stream to its reply topic (on the stream's
        partition, where the dispatch pinned one: ``Dispatch.stream_partition``), unless that is
        an internal topic (a dispatch no router placed, written to a worker's partition, may
        name one). Returns how many it sent."""
        sent = 0
        for emit in emits:
            if isinstance(emit.message, ResponseChunk):
                if self.catalog.internal_reply_topic(emit.reply_to) is not None:
                    continue
                topic = emit.reply_to or self.catalog.responses
                pin = emit.stream_partition
                partition = None if pin is None else StreamPartition(pin)
            else:
                topic = self.catalog.dispatch if emit.slot is not None else self.catalog.telemetry
                partition = emit.slot
            self.outbox.emit(topic, emit.message, request_id, partition)
            sent += 1
        return sent

    async def _on_request(self, message: Message, partition: int | None = None,
                          offset: int | None = None) -> DecodeError | None:
        """Answer one request read at ``offset`` of the request topic's ``partition`` (or
        forward a cancel); or leave it waiting for a worker of its model (``_retry_waiting``).
        Returns why its record is dead-lettered instead: another request under an id in use."""
        if isinstance(message, CancelRequest):
            rid = message.request_id
            waiting = self.waiting.remove(rid)
            if waiting is not None:  # its client leaves before a worker came for it
                self._cancelled(waiting.request, message.reason)
                return None
            emits = self.core.cancel(message, now_ms())
            if not emits and rid not in self._seen and not self.core.placed(rid):
                # read before its request (sent after it, or the request sent back to the end
                # of the partition by a router that let it go): ends it when it comes
                self._early_cancels[rid] = (message, partition)
                if len(self._early_cancels) > _EARLY_CANCELS:
                    self._early_cancels.popitem(last=False)
            self._send(emits, rid)
            return None
        assert isinstance(message, InferenceRequest)
        if message.request_id in self._seen or self.core.placed(message.request_id):
            # a redelivered request: it already has its Queued or Rejected (or a Dispatch
            # another router made, whose Queued on another topic is not read yet), or it waits
            # here; or a client's other request under the same id, which nothing would answer
            return self._reused(message)
        self._remember(message.request_id, _body(message))
        early = self._early_cancels.pop(message.request_id, None)
        internal = self.catalog.internal_reply_topic(message.reply_to)
        if internal is not None:  # (refused before a cancel read early ends it: its stream has
            # nowhere to go)
            self._refused(message, Denial("invalid_request", internal), stream=False)
            return None
        if message.reply_to is not None and not await self._reply_topics.exist(message.reply_to):
            self._refused(message, Denial(
                "invalid_request", f"reply_to topic {message.reply_to!r} does not exist; create "
                "it before sending requests that name it"), stream=False)
            return None
        if early is not None:
            self._cancelled(message, early[0].reason)
            return None
        waiting = Waiting(message, time.monotonic() + self.no_worker_wait_s, partition, offset)
        if self.waiting.holds(message.model):
            self._wait(waiting)  # behind the model's requests read before it
        elif self._try(message):
            if message.model in self._unserved:  # none came while an earlier one waited
                self._give_up(message, known_unserved=True)
            elif self.no_worker_wait_s > 0:
                self._wait(waiting)
            else:
                self._give_up(message)

    async def _refuse_malformed(self, bad: list[tuple[ConsumerRecord, DecodeError]],
                                batch: list[Decoded] = ()) -> None:
        """Tell the client of each record that is no valid request, dead-lettered, but names a
        valid ``request_id`` not in use here: its stream ends, where it has somewhere to go, and
        it is ``rejected`` (``invalid_request``, saying why), as a request refused here is. Its
        id then stays taken: a corrected request sent under it is told to take another.
        ``batch``: the valid messages fetched with them, handled after: a request of theirs
        read before a bad record under its id has the id (as it would, fetched apart)."""
        earlier = {}  # (partition, request id) -> the offset of its first valid request
        for item in batch:
            if isinstance(item.message, InferenceRequest):
                earlier.setdefault((item.record.partition, item.message.request_id),
                                   item.record.offset)
        for record, error in bad:
            who = salvage_identity(record.value)
            if who is None or record.key != who["request_id"].encode():
                continue  # (keyed otherwise, it may be on another router's partition than
                # the request under its id, which this router would end)
            rid = who["request_id"]
            if rid in self._seen or self.core.placed(rid) or \
                    earlier.get((record.partition, rid), record.offset) < record.offset:
                continue  # another request's id: that one's client is not to be told
            self._remember(rid, _MALFORMED)
            rejected = Rejected(
                event_time_ms=now_ms(), reason="invalid_request",
                detail=f"{_NOT_A_REQUEST}{error.reason}: {error.detail})"[:MAX_REASON_CHARS],
                **{k: v for k, v in who.items() if k != "reply_to"})
            self.core.observe(rejected, now_ms())  # (a step of a task fails it, as refused)
            reply_to = who.get("reply_to")
            topic = None if reply_to == UNUSABLE_REPLY_TO else await self._stream_topic(reply_to)
            if topic is not None:
                self.outbox.emit(topic, stream_end(rid, self.router_id, 0, "error", now_ms()), rid)
            self.outbox.emit(self.catalog.telemetry, rejected, rid)

    async def _stream_topic(self, reply_to: str | None) -> str | None:
        """Where a request's stream goes, or None where it has nowhere to go (its ``reply_to``
        an internal topic, or missing)."""
        if reply_to is None:
            return self.catalog.responses
        if self.catalog.internal_reply_topic(reply_to) is not None:
            return None
        return reply_to if await self._reply_topics.exist(reply_to) else None

    def _reused(self, request: InferenceRequest) -> DecodeError | None:
        """Why ``request``, read under an id this router answered, placed or holds, is
        dead-lettered: it is another request than the one first read under its id (a client
        that reuses ids); None where it is the same one, read again (a redelivery, or its
        client's resend), or where the first one's body is not known here (ended before this
        router's start, read back from its ``Queued`` or ``Rejected`` alone). Placed by another
        router whose ``Queued`` for it was not read, it is sent that ``Queued``."""
        rid = request.request_id
        lost = self._unqueued_elsewhere.pop(rid, None)
        if lost is not None:
            # Placed by another router that stopped before its Queued went out (it sends one
            # once the Dispatch is on the broker): sent here, as of its placement, else the
            # request would end without one (the audit's terminal_without_queued). One sent
            # meanwhile is read twice, which every reader takes once.
            self.outbox.emit(self.catalog.telemetry, _queued(lost.request, lost.event_time_ms),
                             rid)
        flight = self.core.in_flight.get(rid)
        waiting = self.waiting.get(rid)
        first = waiting.request if waiting is not None else (
            flight.dispatch.request if flight is not None else None)
        known = self._seen.get(rid)
        if known is None and first is not None:  # (placed by another router)
            known = _body(first)
        if known is None or known == _body(request):
            return None
        if known == _MALFORMED:
            return DecodeError("duplicate_request_id", (
                f"request_id {rid!r} was refused: its first record was no valid request; send "
                "this one under a new id"))
        fields = "" if first is None else " (" + ", ".join(
            f for f in InferenceRequest.model_fields if f not in _NOT_OF_THE_BODY
            and getattr(first, f) != getattr(request, f)) + " differ)"
        return DecodeError("duplicate_request_id", (
            f"request_id {rid!r} is already in use by another request{fields}; a request id "
            "names one request: send this one under a new id"))

    def _cancelled(self, request: InferenceRequest, reason: str) -> None:
        """Its client cancelled a request no worker has: it ends here."""
        self._end_stream(request, "abort")
        self.outbox.emit(self.catalog.telemetry, Cancelled(
            event_time_ms=now_ms(), **about(request), reason=reason), request.request_id)

    def _end_stream(self, request: InferenceRequest, finish_reason: FinishReason) -> None:
        """A request that ends here, never placed: its stream ends before its first token."""
        self.outbox.emit(request.reply_to or self.catalog.responses, stream_end(
            request.request_id, self.router_id, 0, finish_reason, now_ms()), request.request_id)

    def _wait(self, waiting: Waiting) -> None:
        """A request begins to wait for a worker: where no worker of its model is live, the
        autoscaler is told with the batch's answers (``_tell_waiting``: it wakes a pool at
        zero)."""
        self.waiting.add(waiting)
        model = waiting.request.model
        if self._none_live(model):
            self._began_waiting[model] = self._began_waiting.get(model, 0) + 1

    def _tell_waiting(self) -> None:
        """One signal a model for the requests that began to wait with no live worker of it."""
        for model, requests in self._began_waiting.items():
            self.outbox.emit(self.catalog.signals, waiting_for_worker(
                model, now_ms(), self.no_worker_wait_s, requests), f"model:{model}")
        self._began_waiting.clear()

    def _retry_waiting(self, now: float | None = None) -> None:
        """Route the waiting requests again, each model's in the order they were read (one that
        still waits holds back the model's later ones); refuse those waited for long enough
        (as of ``now`` on the monotonic clock: by default, now)."""
        now = time.monotonic() if now is None else now
        still: set[str] = set()  # models whose first request here still waits
        for waiting in self.waiting.in_order():
            if self._handing_over:
                return
            model = waiting.request.model
            if model in self._unserved:  # an earlier request of it waited in vain meanwhile
                self.waiting.remove(waiting.request.request_id)
                self._give_up(waiting.request, known_unserved=True)
                continue
            if model not in still:
                if not self._try(waiting.request):
                    self.waiting.remove(waiting.request.request_id)  # answered
                    continue
                still.add(model)
            if now >= waiting.give_up:
                self.waiting.remove(waiting.request.request_id)
                self._give_up(waiting.request)

    def _try(self, message: InferenceRequest) -> bool:
        """Route a request: True if it must wait for a worker, False if it is answered (placed,
        refused, or refused at once as waiting for a model no worker of may come)."""
        try:
            decision = self.core.route(message, now_ms(), self._stream_partition(message))
        except Exception as exc:  # a bug this request sets off: it is refused, and the
            # requests behind it are served (a crash would meet it again at every restart)
            logger.exception("router %s could not route %s", self.router_id, message.request_id)
            self._refused(message, Denial(
                "invalid_request", f"the router failed on it ({type(exc).__name__}: {exc})"
                "; its log has the details"))
            return False
        if decision.dispatch is not None:
            self._unserved.discard(message.model)
            try:
                self.outbox.emit(self.catalog.dispatch, decision.dispatch, message.request_id,
                                 decision.dispatch.slot)
            except EncodeError as exc:  # the Dispatch wraps the request: it may not fit
                self._refused(message, Denial("invalid_request", f"too large to dispatch: {exc}"))
                return False
            # its Queued goes out once the Dispatch is on the broker (``_send_queued``)
            self._placed.append(_queued(message))
            return False
        if decision.denial is not None:
            self._rejected(message, decision.denial)
            return False
        if not self._may_come(message.model):  # no worker of it is coming
            # (no retry hint: a retry cannot help, so it fails its task; before 6 Dec it said
            # to retry in 5 s, a retry of a misspelt model refused the same way for ever)
            self._rejected(message, Denial("no_capacity", self._unheard_of(message.model)))
            return False
        return True

    def _stream_partition(self, request: InferenceRequest) -> int | None:
        """The partition ``request``'s stream is pinned to (``infra.bus.stream_partition``)
        among those its topic has as this router last heard (``_on_request`` checked that a
        client's topic exists); None where it heard of none: its key decides."""
        count = self._reply_topics.partitions(request.reply_to or self.catalog.responses)
        return None if count is None else stream_partition(request.request_id, count)

    def _give_up(self, request: InferenceRequest, known_unserved: bool = False) -> None:
        """Refuse a request no worker took in time; with no live worker of its model at all,
        the model's requests are refused at once until one of them is placed."""
        model = request.model
        if known_unserved:
            why = (f"no live worker serves {model} (none came while an earlier request "
                   f"waited {self.no_worker_wait_s:g}s)")
        elif self._none_live(model):
            why = f"no live worker serves {model}{self._not_live(model)}"[:MAX_REASON_CHARS]
            if len(self._unserved) >= _UNSERVED_MODELS:
                self._unserved.pop()
            self._unserved.add(model)
        else:
            why = f"no worker of {model} could take it within {self.no_worker_wait_s:g}s"
        self._rejected(request, Denial("no_capacity", why, retry_after_s=NO_CAPACITY_RETRY_S))

    def _rejected(self, request: InferenceRequest, denial: Denial) -> None:
        """Tell the client the core's refusal of its request (the core knows of it)."""
        self._send_rejected(request, _rejected(request, self.core.told(request, denial)))

    def _may_come(self, model: str) -> bool:
        """Whether a worker of ``model`` may come to serve a request that waits for one: one
        of the fleet's workers (any state: loading, draining, gone silent, until the core forgets
        it: ``FORGET_AFTER_S``) is of the model, or
        the autoscaler may start one (a pool it commanded within ``COMMANDED_FOR_MS``, as read
        back and followed on the control topic, or one of its configuration). Before any worker
        is heard of, any model may come."""
        workers = self.core.fleet.workers()
        if not workers or any(_pool_model(w.pool) == model or model in w.models
                              for w in workers):
            return True
        if now_ms() - self._commanded.get(model, -COMMANDED_FOR_MS) < COMMANDED_FOR_MS:
            return True  # a pool the autoscaler sizes (at zero too: a waiting request wakes it)
        autoscaler = self.core.config.autoscaler
        return autoscaler.enabled and any(_pool_model(p) == model for p in autoscaler.pools)

    def _unheard_of(self, model: str) -> str:
        served = sorted({_pool_model(w.pool) for w in self.core.fleet.workers()})
        listed = ", ".join(served[:20]) + (f" and {len(served) - 20} more" if len(served) > 20
                                           else "")
        pooled = any(_pool_model(p) == model for p in self.core.config.autoscaler.pools)
        why = ("an autoscaler pool names it but the autoscaler is off (autoscaler.enabled)"
               if pooled else "no autoscaler pool names it")
        return (f"no worker serves {model}, none has lately, and {why}: not waited for (the "
                f"fleet's models: {listed})")[:MAX_REASON_CHARS]

    def _not_live(self, model: str) -> str:
        """What the fleet's workers of ``model`` are doing instead of serving, as ``" (worker-0
        crashed, worker-1 loading)"``: a client, or its operator, is told why none took it
        (a vLLM worker whose server is gone says it crashed); empty where none is known."""
        now = now_ms()
        timeout_ms = self.core.fleet.heartbeat_timeout_ms
        states = [f"{w.worker_id} silent for {(now - w.last_seen_ms) / 1000:.0f}s"
                  if now - w.last_seen_ms > timeout_ms else f"{w.worker_id} {w.state}"
                  for w in sorted(self.core.fleet.workers(), key=lambda w: w.slot)
                  if _pool_model(w.pool) == model or model in w.models]
        if not states:
            return ""
        more = f" and {len(states) - 5} more" if len(states) > 5 else ""
        return f" ({', '.join(states[:5])}{more})"

    def _none_live(self, model: str) -> bool:
        """No live worker serves ``model`` (whatever their breakers): asked only of a request
        that waits, or in a batch that has waited (it scans the fleet)."""
        return not self.core.fleet.live(now_ms(), model)

    def _refused(self, request: InferenceRequest, denial: Denial, stream: bool = True) -> None:
        """Refuse a request the core did not refuse (or placed): the core ends it (forgets a
        placement, fails its task like any refused step) and its client is told; its stream
        ends too, unless it has nowhere to go (``stream`` False: a ``reply_to`` refused)."""
        rejected = _rejected(request, self.core.told(request, denial))
        self.core.observe(rejected, now_ms())
        self._send_rejected(request, rejected, stream)

    def _send_rejected(self, request: InferenceRequest, rejected: Rejected,
                       stream: bool = True) -> None:
        """The client told: its stream ended (unless it has nowhere to go), and why."""
        if stream:
            self._end_stream(request, "error")
        self.outbox.emit(self.catalog.telemetry, rejected, request.request_id)


def _pool_model(pool: str) -> str:
    """The model of a pool named GPU@MODEL."""
    return pool.partition("@")[2]


class RouterIdInUse(TerminalError):
    """Another running router has this router's id."""


class _HandOver(ConsumerRebalanceListener):
    """A router's part in a rebalance of its group: before its partitions are revoked, it
    finishes and commits the batch in hand (see ``RouterService._hand_over``)."""

    def __init__(self, router: RouterService) -> None:
        self.router = router

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.router._hand_over()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        router = self.router
        # (asked now: some may have been added since the catalog's count, or since this
        # router's metadata was last refreshed while the group's leader knew of them)
        partitions = await listed_partition_count(router._requests, router.catalog,
                                                  router.catalog.requests)
        router._taken(assigned, partitions)
        await self.router._check_id()


def _done_with(topic: str, batch: list[Decoded], handled: int, dead: list[tuple[int, int]]
               ) -> dict[TopicPartition, int]:
    """The offsets of ``topic`` to commit after the first ``handled`` requests of ``batch``:
    past them and past the records dead-lettered with them (``dead``: partition, offset), but
    in each partition no further than its first request left unhandled, which is read again."""
    done: dict[TopicPartition, int] = {}
    for partition, offset in dead + [(i.record.partition, i.record.offset)
                                     for i in batch[:handled]]:
        tp = TopicPartition(topic, partition)
        done[tp] = max(done.get(tp, 0), offset + 1)
    for item in reversed(batch[handled:]):  # the first left in each partition is the last set
        done[TopicPartition(topic, item.record.partition)] = item.record.offset
    return done


#: What a request read again may differ in: when it was sent, the schema version of the client
#: that sent it, and its priority (a tenant's configured priority replaces it in the request
#: the router places)
_NOT_OF_THE_BODY = frozenset({"event_time_ms", "schema_version", "priority"})


def _body(request: InferenceRequest) -> bytes:
    """What a request asks for, as a 16-byte digest: a request read again (redelivered, or
    sent again by its client) has the same."""
    return hashlib.blake2b(request.model_dump_json(exclude=_NOT_OF_THE_BODY).encode(),
                           digest_size=16).digest()


def _queued(request: InferenceRequest, at_ms: int | None = None) -> Queued:
    return Queued(
        event_time_ms=now_ms() if at_ms is None else at_ms, **about(request),
        prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens, priority=request.priority, step=request.step,
        steps_total=request.steps_total, deadline_ms=request.deadline_ms,
        ttft_slo_s=request.ttft_slo_s,
    )


def _rejected(request: InferenceRequest, denial: Denial) -> Rejected:
    return Rejected(
        event_time_ms=now_ms(), **about(request), reason=denial.reason,
        detail=denial.detail[:MAX_REASON_CHARS],  # (an error's text may run longer)
        retry_after_s=denial.retry_after_s,
    )
