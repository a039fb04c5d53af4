"""The router's decisions as one pure object: admission, placement and resumption.

The live router service and the offline simulator drive the same ``RouterCore``: they feed it
every message they see (``observe``), ask it where a request goes (``route``), and ask it each
tick which in-flight requests must be resumed elsewhere (``resume``). Time is passed in.

Resumption: when a worker stops heart-beating or hands a request back, the request is
re-dispatched as a continuation from the last token offset the client received (attempt + 1),
within the retry budget. A request that outlives its expected time, or whose worker's breaker
opened, is first recalled from its (live) worker, which hands it back; so only one attempt
reaches a terminal state. A recall its serving worker leaves unanswered for ``RECALL_ANSWER_S``
(it does not hold the attempt) makes the request lost there. The recall spends the retry; when
the budget is spent, the request stays on the worker that is still running it rather than
fail.
"""

import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from controllers.overrides import OperatorOverrides
from controllers.retry_budget import RetryBudget
from controllers.router.admission import Admission, Denial
from controllers.router.answers import AnswerLengths
from controllers.router.candidates import (
    CHUNK_TOKENS, Candidate, build_candidates, configure_models, mark_deadlines_at_risk,
    perf_model)
from controllers.router.filters import DEADLINE_HEADROOM
from controllers.router.fleet import MAX_AHEAD_MS, FleetView, WorkerView
from controllers.router.ledger import PendingLedger
from controllers.router.policies import make_policy
from controllers.router.prefix import PrefixIndex
from controllers.router.scorers import DEFAULT_WEIGHTS, PlacementContext
from controllers.router.task_admission import TaskAdmission
from schemas import commands
from schemas.base import Message
from schemas.config import ConfigSet, GovernorConfig
from schemas.events import (
    TERMINAL_EVENT_TYPES, Cancelled, Completed, Failed, KvBlocksEvicted, KvBlocksStored,
    KvCacheCleared, Requeued, Started, StreamProgress, WorkerStatus, about, refused_for_now,
)
from schemas.limits import MAX_ATTEMPTS
from schemas.requests import (RECALLED, CancelRequest, Dispatch, FinishReason, InferenceRequest,
                              ResponseChunk, stream_end)
from workers.sim.models import model_specs

_AFFINITY_TASKS = 100_000
#: In fleets larger than this, the governor policy scores a shortlist (see ``_shortlist``).
SHORTLIST = 12
#: Slack on the expected duration of a dispatch before it counts as lost (a hung worker).
_EXPECTED_SLACK = 4.0
_EXPECTED_FLOOR_S = 30.0
#: How long a live worker has to answer a recall (it answers within its next loop, a few ms,
#: plus two Kafka hops) before the request is taken for lost on it: a worker that does not hold
#: the attempt (its dispatch lost) ignores the recall, and the request would wait for good.
RECALL_ANSWER_S = 10.0
#: A worker silent this long is taken for gone: its prefix blocks are forgotten.
GONE_AFTER_S = 60.0
#: A worker is forgotten altogether (its view, start, breaker state and pending accounting)
#: once it said it stopped or crashed this long ago, or has been silent for ``FORGET_AFTER_S``
#: (the breakers' ``FORGET_MS``), and no request in flight here is on it: placement scans the
#: fleet's view for every request, and worker ids that change at each restart (pods) or that
#: no worker holds (forged heartbeats) would grow it without bound. Heard again, it is new.
FORGET_STOPPED_S = GONE_AFTER_S
FORGET_AFTER_S = 300.0
#: A request to continue that has found no live worker of its model for this long fails
#: (``worker_lost``) rather than wait for good: a pool at zero is woken by the autoscaler in
#: a cold start, but a model whose every worker is gone and not coming back (autoscaling off,
#: or controllers restarted since the request was accepted) would leave it without an end.
NO_WORKER_GIVE_UP_S = 600.0
_ANY_ATTEMPT = 2**31  # a request's end that named no attempt ends every attempt read after it
#: How long a request no live worker can take yet waits for one (out of line, holding up no
#: other request): long enough for a pool at zero, woken as it begins to wait, to load a model
#: (about 30 s for an 8B model).
NO_WORKER_WAIT_S = 60.0
#: When a request that found no live worker of its model may try again (a refusal "for now":
#: with this hint its task goes on, ``schemas.events.refused_for_now``).
NO_CAPACITY_RETRY_S = 5.0
#: How long a router id must be missing from the router group before another router resumes
#: its placements: longer than a router's restart under the same id takes (it resumes its own
#: once back), short beside how long requests run.
ORPHAN_AFTER_S = 60.0


@dataclass(frozen=True)
class Decision:
    """Where a request goes: a dispatch, a rejection, or nowhere yet (no live worker)."""

    dispatch: Dispatch | None = None
    denial: Denial | None = None
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def waits(self) -> bool:
        return self.dispatch is None and self.denial is None


@dataclass(frozen=True)
class Emit:
    """A message the router must send; ``slot`` is the dispatch partition for dispatch-topic
    messages (a continuation, a cancellation), None for lifecycle events and for the end of a
    response stream, which goes to ``reply_to`` (None: the responses topic), on the stream's
    partition (``stream_partition``: the dispatch's; None: its key decides)."""

    message: Message
    slot: int | None = None
    reply_to: str | None = None
    stream_partition: int | None = None


@dataclass
class _InFlight:
    dispatch: Dispatch
    tokens_done: int
    placed_ms: int  # when this router learned of the attempt
    #: None until its worker is heard (a dispatch read back before the heartbeats after a
    #: restart): the expectation needs the worker's GPU and load
    expected_done_ms: int | None
    handed_back: bool = False
    evacuate: bool = False  # its worker's breaker opened: move it
    recall_sent_ms: int | None = None  # when it asked its worker to hand it back
    #: its worker's last heartbeat (on the worker's clock) when the recall was sent, and the
    #: first heartbeat after it in which the worker, paused, held no request at all
    recall_heard_ms: int | None = None
    paused_idle_ms: int | None = None
    retry_paid: bool = False  # the recall already spent the retry its continuation needs
    no_worker_since_ms: int | None = None  # to continue, and no live worker to take it since
    cancelled: str | None = None  # the client's reason, if it cancelled: not to be continued
    #: its final chunk streamed: the client has the whole answer (which may end before
    #: ``max_tokens``), only its Completed is still to be read
    whole: bool = False
    #: the workers of its earlier attempts that were replaced without a hand-back (silent, or
    #: a recall unanswered) and whose end has not been read: each may still report one. Its
    #: continuations go elsewhere where they can, as a ``Failed`` or ``Cancelled`` from a
    #: worker older than their ``attempt`` (which name none) is told by worker alone.
    unended: frozenset[str] = frozenset()

    def replaced(self, event: Message) -> bool:
        """Whether ``event`` is about an attempt this one replaced (its worker went silent or
        handed it back, and reports late): by attempt where the event has one, else by worker."""
        attempt = getattr(event, "attempt", None)
        if attempt is not None:
            return attempt < self.dispatch.attempt
        worker = getattr(event, "worker_id", None)
        return worker is not None and worker != self.dispatch.worker_id


#: How far a request's ``created_ms`` may be from the router's clock: ahead, as far as an
#: event may be (``fleet.MAX_AHEAD_MS``, the streams' ``max_event_ahead_s``); behind, a day.
CREATED_AHEAD_MS, CREATED_BEHIND_MS = MAX_AHEAD_MS, 86_400_000


def created_off_the_clock(request: InferenceRequest, now_ms: int) -> Denial | None:
    """An ``invalid_request`` for a request created further from ``now_ms`` than the bounds:
    TTFT and latency are measured from ``created_ms``, so a client clock far behind would count
    a served request as years late, and one ahead as answered at once."""
    ahead_ms = request.created_ms - now_ms
    if ahead_ms > CREATED_AHEAD_MS:
        return Denial("invalid_request", f"created_ms is {ahead_ms / 1000:.1f}s ahead of the "
                      f"router's clock (at most {CREATED_AHEAD_MS / 1000:g}s)")
    if -ahead_ms > CREATED_BEHIND_MS:
        return Denial("invalid_request", f"created_ms is {-ahead_ms / 1000:.0f}s before the "
                      f"router's clock (at most {CREATED_BEHIND_MS / 1000:,.0f}s)")
    return None


def held(request: InferenceRequest, live: list[WorkerView]
         ) -> tuple[list[WorkerView], Denial | None]:
    """The workers whose context holds the request's prompt and output (an engine refuses a
    longer one outright), and an ``invalid_request`` where workers serve its model but none is
    long enough: no retry or wait could serve it."""
    total = request.prompt_tokens + request.max_tokens
    fits = [w for w in live if w.holds(total)]
    if fits or not live:
        return fits, None
    longest = max(w.max_model_len for w in live)
    return fits, Denial("invalid_request", f"{request.prompt_tokens} prompt and "
                        f"{request.max_tokens} output tokens ({total}) exceed the context of every "
                        f"live worker of {request.model} (the longest: {longest} tokens)")


class RouterCore:
    def __init__(self, config: GovernorConfig = GovernorConfig(), router_id: str = "router-0") -> None:
        self.router_id = router_id
        self.fleet = FleetView(int(config.worker_heartbeat_timeout_s * 1000))
        self.ledger = PendingLedger()
        self.prefix = PrefixIndex()
        self._started: dict[str, int] = {}  # worker -> started_ms of its last heartbeat
        #: worker taken for gone (``_forget_gone``) -> its start before: ``_started`` holds when
        #: it was taken for gone until it is heard again (heard, it is the same worker or not)
        self._start_before_gone: dict[str, int] = {}
        self.admission = Admission()
        self.task_admission = TaskAdmission()
        self.answers = AnswerLengths()  # how long answers run (max_tokens is only a cap)
        #: The share of all requests this router reads (its partitions of the request topic):
        #: task admission weighs the tasks it sees against as much of the fleet.
        self.request_share = 1.0
        self.retry_budget = RetryBudget()
        self.breakers: dict[str, str] = {}
        self.pool_weights: dict[str, float] = {}
        self.in_flight: dict[str, _InFlight] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        #: (tenant, task) -> why it failed: one tenant's refusals cannot fail another's task
        self._failed_tasks: OrderedDict[tuple[str, str], str] = OrderedDict()
        #: the attempt with which each request ended on a worker (the most recent requests;
        #: ``_ANY_ATTEMPT`` where the end did not say): a dispatch of that attempt or an older
        #: one, read late, is not taken for one in flight
        self._done: OrderedDict[str, int] = OrderedDict()
        self.overrides = OperatorOverrides()  # SetAdmissionLimits, SetRetryBudget
        self._cancels: list[Emit] = []  # running attempts of requests an earlier attempt completed
        #: the router ids of the group's members as last listed (None: not known now)
        self._routers: frozenset[str] | None = None
        #: router ids of placements missing from the listings, since when (across listings)
        self._missing_since: dict[str, int] = {}
        self.orphan_after_s = ORPHAN_AFTER_S
        self.config = config
        self.apply_config(config)

    def apply_config(self, config: GovernorConfig, change: ConfigSet | None = None) -> None:
        """Take a new configuration; raises ValueError (naming the setting) if it cannot apply.
        ``change``: the record that gave it (None: a whole configuration, now), weighed against
        the operator's ``SetAdmissionLimits`` and ``SetRetryBudget`` commands
        (``OperatorOverrides``): a restarted router reads the commands back before the
        configuration's history."""
        model_specs(config.models)  # (what can fail, first: nothing is changed then)
        weights = {**DEFAULT_WEIGHTS, **config.router_weights}
        policy = make_policy(config.routing_policy, weights)
        configure_models(config.models)
        self.overrides.configured(self.config, config, change)
        self.config = config
        self.policy = policy
        self.full_admission = config.routing_policy == "governor"
        self.fleet.heartbeat_timeout_ms = int(config.worker_heartbeat_timeout_s * 1000)
        self.task_admission.configure(config.task_admission)
        self._apply_overrides()

    def _apply_overrides(self) -> None:
        self.admission.set_limits(self.overrides.tenant_limits(self.config))
        self.retry_budget.configure(*self.overrides.retry_budget(self.config))

    # -- whose requests ----------------------------------------------------------------------
    def routers_listed(self, routers: frozenset[str] | None, now_ms: int) -> None:
        """The router ids of the group's members, as listed at ``now_ms`` (None: unknown, as
        while the group rebalances). The placements of a router absent from the list for
        ``orphan_after_s`` (removed, or replaced under another id) are resumed by the live
        routers, each request by one (``adopter``), so a request is not left without a router
        to continue it.
        An id is missing from the first listing without it to the next one with it: the
        rebalances between (routers joining, or restarting) do not start its time again."""
        self._routers = None if routers is None else frozenset(routers)
        if routers is None:
            return
        placers = {flight.dispatch.router_id for flight in self.in_flight.values()}
        for router in placers - self._routers - {self.router_id}:
            self._missing_since.setdefault(router, now_ms)
        for router in [r for r in self._missing_since if r in self._routers or r not in placers]:
            del self._missing_since[router]

    def _resumes(self, dispatch: Dispatch, now_ms: int) -> bool:
        """Whether this router continues (or ends) the request ``dispatch`` placed: its own
        placements, and an orphan's if it is the adopter."""
        if dispatch.router_id == self.router_id:
            return True
        if self._routers is None:
            return False
        since = self._missing_since.get(dispatch.router_id)
        return (since is not None and now_ms - since >= self.orphan_after_s * 1000
                and self.router_id == self.adopter(dispatch.request.request_id))

    def answerable(self, now_ms: int) -> int:
        """Requests in flight this router answers for: its own placements and the orphans it
        adopted (``_resumes``)."""
        return sum(self._resumes(flight.dispatch, now_ms)
                   for flight in list(self.in_flight.values()))

    def continuations_waiting(self, now_ms: int) -> int:
        """Requests this router continues (its own placements and the orphans it adopted) whose
        attempt was lost or handed back, waiting for a live worker able to take them."""
        return sum(flight.no_worker_since_ms is not None and self._resumes(flight.dispatch, now_ms)
                   for flight in list(self.in_flight.values()))

    def _may_recall(self, worker_id: str) -> bool:
        """Whether an overdue request on ``worker_id`` is recalled. Governor's policy recalls it
        wherever it is; a baseline, as its authors document it, leaves a request queued on a
        worker that serves until it ends, and recalls it only from a worker that holds nothing
        or is not serving (drained, asleep: a dispatch it has not started, in its partition,
        would otherwise wait for good)."""
        if self.full_admission:
            return True
        worker = self.fleet.get(worker_id)
        return worker is None or worker.state != "warm" or worker.running + worker.waiting == 0

    def adopter(self, request_id: str) -> str:
        """The live router that resumes an orphaned request: the one whose id, hashed with the
        request's, comes highest (rendezvous hashing). Every router of the group computes the
        same one, and a gone router's requests spread evenly over the rest instead of all
        landing on one."""
        def rank(router_id: str) -> bytes:
            return hashlib.blake2b(f"{router_id}\0{request_id}".encode(), digest_size=8).digest()
        return max((self._routers or frozenset()) | {self.router_id}, key=rank)

    # -- what happened ---------------------------------------------------------------------
    def observe(self, message: Message, now_ms: int, written_ms: int | None = None) -> None:
        """``written_ms``: when the message's record was written (its Kafka timestamp), which an
        operator's command's stamp is judged against (None: ``now_ms``)."""
        match message:
            case WorkerStatus():
                if self.fleet.observe(message, now_ms):  # (not an older one delivered late)
                    self._incarnation(message)
                for progress in message.reply_progress:
                    self._progressed(message.worker_id, progress)
                self.ledger.heartbeat(message.worker_id, message.event_time_ms)
                self.task_admission.heard(message, now_ms)
            case Dispatch(worker_id=wid):
                self._dispatched(message, now_ms)
                flight = self.in_flight.get(message.request.request_id)
                if flight is not None and flight.dispatch is message and \
                        self.breakers.get(wid) == "open":  # placed before this router heard the
                    # breaker open (another router's, or read back after the command): moved too
                    flight.evacuate = True
            case Started(request_id=rid):
                flight = self.in_flight.get(rid)
                if flight is None or not flight.replaced(message):  # (an earlier attempt's
                    # says nothing of the one pending on its worker now)
                    self.ledger.started(rid, message.event_time_ms)
            case ResponseChunk(request_id=rid, token_offset=offset, tokens=tokens):
                self.streamed(rid, offset, len(tokens), message.attempt,
                              message.finish_reason if message.final else None)
            case Requeued(request_id=rid, tokens_done=done):
                flight = self.in_flight.get(rid)
                # an earlier attempt's hand-back read late must not move its continuation
                if flight is not None and message.attempt >= flight.dispatch.attempt:
                    flight.handed_back = True
                    flight.tokens_done = max(flight.tokens_done, done)
                    self.ledger.reported(rid)  # (nor count its continuation reported)
                elif flight is not None:  # that earlier attempt's end: nothing more comes of it
                    flight.unended -= {message.worker_id}
            case KvBlocksStored() | KvBlocksEvicted() | KvCacheCleared() \
                    if message.worker_id not in self._started:
                pass  # of no worker heard of: none places work on one before its first
                # heartbeat, and the blocks of a worker never heard were kept for ever (a
                # record of 8,192 under each of 300 made-up ids: a router of 67 MB held 964 MB)
            case KvBlocksStored(worker_id=wid, block_hashes=hashes):
                self.kv_stored(wid, hashes, message.event_time_ms)
            case KvBlocksEvicted(worker_id=wid, block_hashes=hashes):
                self.kv_evicted(wid, hashes)
            case KvCacheCleared(worker_id=wid):
                self.prefix.cleared(wid)
            case commands.SetBreakerState(worker_id=wid, state=state):
                was = self.breakers.get(wid)
                if (state == "open") != (was == "open"):
                    for flight in self.in_flight.values():
                        if flight.dispatch.worker_id == wid and flight.recall_sent_ms is None:
                            flight.evacuate = state == "open"  # (not open now: it stays)
                self.breakers[wid] = state
            case commands.SetRoutingWeights(weights=weights):
                self.pool_weights = dict(weights)
            case commands.SetLoadShedLevel(min_value=level, model=None):
                self.admission.shed_below = level  # every model's
                self.admission.shed_by_model.clear()
            case commands.SetLoadShedLevel(min_value=level, model=model):
                self.admission.shed_by_model[model] = level
            case commands.SetAdmissionLimits() | commands.SetRetryBudget():
                if self.overrides.take(message, now_ms if written_ms is None else written_ms):
                    # (not a restatement of the one held)
                    self._apply_overrides()
            case _ if message.type in TERMINAL_EVENT_TYPES:
                self._ended(message)

    def _progressed(self, worker_id: str, progress: StreamProgress) -> None:
        """A heartbeat's word of how far a stream to a client's own topic has gone (its chunks
        go there, not to the responses topic the router reads)."""
        flight = self.in_flight.get(progress.request_id)
        if flight is not None and flight.dispatch.worker_id == worker_id \
                and flight.dispatch.attempt == progress.attempt:
            flight.tokens_done = max(flight.tokens_done, progress.tokens_sent)

    def _incarnation(self, status: WorkerStatus) -> None:
        """A worker that stopped, crashed or started again (a new ``started_ms`` under the same
        id) holds none of the blocks it held: its prefix cache is forgotten, and KV events
        stamped before its start are not taken (another topic's, read late or read back). Its
        breaker's state is dropped too. One silent long enough to be taken for gone and heard
        again with the start it had is the same worker: its breaker's state stays."""
        wid = status.worker_id
        started = self._start_before_gone.pop(wid, None)
        if started is None:
            started = self._started.get(wid, status.started_ms)
        if status.state in ("stopped", "crashed") or started != status.started_ms:
            self.prefix.forget(wid)
            # nor is its breaker's state its own (a controller that forgot the worker, or
            # never knew it, would never close it)
            self.breakers.pop(wid, None)
        self._started[wid] = status.started_ms

    def _ended(self, event: Message) -> None:
        rid = event.request_id
        flight = self.in_flight.get(rid)
        if event.type == "completed" and flight is not None and not flight.replaced(event):
            # (once: the flight ends here; read again, or an older attempt's, it teaches nothing)
            self.answers.completed(event.tenant, event.model, event.output_tokens,
                                   flight.dispatch.request.max_tokens)
        if event.type != "rejected" and not (
                flight is not None and flight.replaced(event) and event.type != "completed"):
            attempt = getattr(event, "attempt", None)  # (None: a Failed or Cancelled of old)
            if flight is not None:
                attempt = max(flight.dispatch.attempt, attempt or 0)
            self._done[rid] = _ANY_ATTEMPT if attempt is None else attempt
            if len(self._done) > _AFFINITY_TASKS:
                self._done.popitem(last=False)
        if flight is not None and flight.replaced(event):
            # The attempt now running goes on; but the request is done if the old one completed.
            flight.unended -= {getattr(event, "worker_id", None)}
            if event.type == "completed":
                del self.in_flight[rid]
                self.ledger.reported(rid)
                if self._resumes(flight.dispatch, event.event_time_ms):
                    self._cancels.append(Emit(CancelRequest(
                        event_time_ms=event.event_time_ms, request_id=rid,
                        attempt=flight.dispatch.attempt,
                        reason="superseded: an earlier attempt completed"), flight.dispatch.slot))
            return
        self.ledger.reported(rid)
        self.in_flight.pop(rid, None)
        if event.task_id and (event.type == "failed" or (
                event.type == "rejected" and not refused_for_now(event.reason, event.retry_after_s))):
            self._fail_task(event.tenant, event.task_id, f"{rid} {event.type}")

    def _fail_task(self, tenant: str, task_id: str, why: str) -> None:
        key = (tenant, task_id)
        if key not in self._failed_tasks:
            self._failed_tasks[key] = why
            if len(self._failed_tasks) > _AFFINITY_TASKS:
                self._failed_tasks.popitem(last=False)

    def kv_stored(self, worker_id: str, hashes: list[int], event_time_ms: int) -> None:
        """What a ``KvBlocksStored`` tells (the offline simulator, which has no use for the message
        itself, says it directly): ``worker_id`` holds these blocks, unless it was never heard of
        (its blocks would be kept for ever) or they were stored before its start (a dead one's)."""
        started = self._started.get(worker_id)
        if started is not None and event_time_ms >= started:
            self.prefix.stored(worker_id, hashes)

    def kv_evicted(self, worker_id: str, hashes: list[int]) -> None:
        """What a ``KvBlocksEvicted`` tells (said directly as ``kv_stored``): ``worker_id`` no
        longer holds these blocks (nothing, for a worker never heard of)."""
        if worker_id in self._started:
            self.prefix.evicted(worker_id, hashes)

    def streamed(self, request_id: str, token_offset: int, count: int,
                 attempt: int | None = None, finish_reason: str | None = None) -> None:
        """``count`` tokens of ``request_id`` from ``token_offset`` on reached the client (what a
        ``ResponseChunk`` tells; the offline simulator, which has no use for the chunk itself,
        says it directly): a resumed stream continues after them; ``finish_reason`` (of a final
        chunk): "stop" or "length", the answer is whole there (a stream that ended in an error
        is not: its ``Failed`` follows). A replaced attempt's chunks count for nothing: a reader
        drops them once the newer attempt's arrive."""
        flight = self.in_flight.get(request_id)
        if flight is not None and attempt is not None and attempt != flight.dispatch.attempt:
            return
        if flight is not None and token_offset <= flight.tokens_done:
            flight.tokens_done = max(flight.tokens_done, token_offset + count)
            flight.whole = flight.whole or finish_reason in ("stop", "length")

    def placed(self, request_id: str) -> bool:
        """Whether the request is in flight, or ended on a worker, as far as this router read."""
        return request_id in self.in_flight or request_id in self._done

    def knows(self, dispatch: Dispatch) -> bool:
        """Whether ``dispatch`` is accounted for here: it, or a later attempt of its request, is
        in flight, or the request ended with it or after it."""
        rid = dispatch.request.request_id
        flight = self.in_flight.get(rid)
        return (flight is not None and flight.dispatch.attempt >= dispatch.attempt) or \
            dispatch.attempt <= self._done.get(rid, 0)

    def _dispatched(self, dispatch: Dispatch, now_ms: int) -> None:
        req = dispatch.request
        current = self.in_flight.get(req.request_id)
        if current is not None and current.dispatch.attempt > dispatch.attempt:
            return  # an older attempt read late
        if dispatch.router_id != self.router_id and \
                dispatch.attempt <= self._done.get(req.request_id, 0):
            return  # another router's, read after the request's end (on another topic)
        # (a continuation prefills the tokens generated before it too, as its worker's
        # heartbeats count them once it takes it)
        self.ledger.dispatched(req.request_id, dispatch.worker_id,
                               req.prompt_tokens + dispatch.resume_from_token)
        self.prefix.routed(dispatch.worker_id, req.prefix_hashes)
        self._affinity[req.effective_task_id] = dispatch.worker_id
        self._affinity.move_to_end(req.effective_task_id)
        if len(self._affinity) > _AFFINITY_TASKS:
            self._affinity.popitem(last=False)
        unended = frozenset() if current is None else current.unended
        if current is not None and current.dispatch.attempt < dispatch.attempt \
                and not current.handed_back:  # (a hand-back is the attempt's end)
            unended |= {current.dispatch.worker_id}
        flight = self.in_flight[req.request_id] = _InFlight(
            dispatch, dispatch.resume_from_token, now_ms, None,
            cancelled=current.cancelled if current is not None else None,  # its client's, kept
            unended=unended - {dispatch.worker_id})
        self._expect(flight)
        if self._routers is not None and dispatch.router_id != self.router_id and \
                dispatch.router_id not in self._routers:
            # read after the group was listed without its router (this router reading behind):
            # missing from now, else never resumed until the group next rebalances
            self._missing_since.setdefault(dispatch.router_id, now_ms)

    def _expect(self, flight: _InFlight) -> None:
        """Set when ``flight`` is due, once its worker has been heard."""
        if flight.expected_done_ms is None:
            expected = self._expected_ms(flight.dispatch)
            if expected is not None:
                flight.expected_done_ms = flight.placed_ms + expected

    def _expected_ms(self, dispatch: Dispatch) -> int | None:
        worker = self.fleet.get(dispatch.worker_id)
        req = dispatch.request
        if worker is None:
            return None
        perf = perf_model(worker.gpu_type, req.model, worker.gpus)
        decode = perf.decode_step_s(max(worker.running, 1) + 1, req.prompt_tokens)
        seconds = perf.prefill_s(req.prompt_tokens) + req.max_tokens * decode
        return int((_EXPECTED_SLACK * seconds + _EXPECTED_FLOOR_S) * 1000)

    # -- decisions -------------------------------------------------------------------------
    def told(self, request: InferenceRequest, denial: Denial) -> Denial:
        """The denial as the client is told it. Under full admission a denied step fails its
        task (``route`` refuses every later request of the task, a retry of the step under a
        new request id included), so a step of a task is told that instead of when to retry;
        a refusal for now (``schemas.events.NOT_NOW``) fails no task and keeps its hint."""
        if not self._fails_task(request, denial) or denial.reason == "task_failed":
            return denial
        return replace(denial, detail=f"{denial.detail}; task {request.task_id} fails with it",
                       retry_after_s=None)

    def route(self, request: InferenceRequest, now_ms: int,
              stream_partition: int | None = None) -> Decision:
        """``stream_partition``: where its stream goes (``Dispatch.stream_partition``), fixed
        by the caller, which knows the partitions of the request's reply topic."""
        request = self.admission.with_tenant_priority(request)
        decision = self._decide(request, now_ms, stream_partition)
        if decision.denial is not None and self._fails_task(request, decision.denial):
            # Failed as decided, not when the Rejected is read back: the task's next step may
            # be routed before that.
            self._fail_task(request.tenant, request.task_id, f"{request.request_id} rejected")
        return decision

    def _fails_task(self, request: InferenceRequest, denial: Denial) -> bool:
        return (self.full_admission and bool(request.task_id)
                and not refused_for_now(denial.reason, denial.retry_after_s))

    def _decide(self, request: InferenceRequest, now_ms: int,
                stream_partition: int | None) -> Decision:
        skewed = created_off_the_clock(request, now_ms)
        if skewed is not None:
            return Decision(denial=skewed)
        failed = self._failed_tasks.get((request.tenant, request.task_id or ""))
        if self.full_admission and failed is not None:
            # The task has already failed: serving its later steps would only waste GPU time.
            return Decision(denial=Denial(
                "task_failed", f"task {request.task_id} already failed ({failed})"))
        live = self.fleet.live(now_ms, request.model)  # for task admission and placement both
        if self.full_admission:
            live, denial = held(request, live)
            if denial is not None:
                return Decision(denial=denial)
            denial = self.admission.admit(request, now_ms)
            if denial is None:
                denial = self.task_admission.admit(request, live, now_ms, self.request_share,
                                                   self.answers.expected(request))
                if denial is not None:
                    self.admission.refund(request)  # refused: its tenant is not charged
            if denial is not None and denial.reason == "deadline_unreachable" and not live:
                # It waited for a worker of its model that never came: the autoscaler wakes a
                # pool on no_capacity (no hint: its deadline has passed, its task fails).
                denial = Denial("no_capacity", f"no live worker serves {request.model} and its "
                                f"deadline has passed ({denial.detail})")
            if denial is not None:
                return Decision(denial=denial)
        shed = self.admission.shed_share(request) if self.full_admission else None
        decision = self._place(request, now_ms, attempt=1, resume_from=0, exclude=None, shed=shed,
                               live=live, stream_partition=stream_partition)
        if decision.dispatch is None and self.full_admission:
            # Refused (nothing is served) or routed again later (charged then): not charged now.
            self.admission.refund(request)
        if decision.dispatch is not None:
            # The retry budget is a share of the requests placed: a waiting one counts once,
            # when placed, and a refused one not at all.
            self.retry_budget.request(now_ms / 1000)
            self._dispatched(decision.dispatch, now_ms)
        return decision

    def _place(self, request: InferenceRequest, now_ms: int, attempt: int, resume_from: int,
               exclude: str | Collection[str] | None, shed: float | None = None,
               live: list[WorkerView] | None = None,
               stream_partition: int | None = None) -> Decision:
        """``live``: the live workers of the request's model, if the caller has them already.
        ``stream_partition``: its stream's (a continuation's: the attempt before's)."""
        if live is None:
            live = self.fleet.live(now_ms, request.model)
            if self.full_admission:
                live, _ = held(request, live)  # (none held: it waits, as for no worker at all)
        excluded = {exclude} if isinstance(exclude, str) else set(exclude or ())
        workers = [w for w in live if w.worker_id not in excluded]
        if not workers:
            return Decision()
        if self.full_admission and len(workers) > SHORTLIST:
            workers = self._shortlist(request, workers)
        cands = build_candidates(
            request, workers, self.ledger, self.prefix, self.config.gpu_prices_usd_per_hour,
            self.breakers, self._affinity.get(request.effective_task_id),
            predict=self.full_admission, resumed=resume_from,
        )
        if self.full_admission and request.prompt_tokens + resume_from > CHUNK_TOKENS:
            mark_deadlines_at_risk(request, cands, self._deadlines_by_worker(cands), now_ms,
                                   resume_from)
        ctx = self._context(request, now_ms, shed, continuing=attempt > 1)
        placement = self.policy(ctx, cands)
        if placement.chosen is None:
            if placement.filtered_out_by == "shed":
                best = min(c.predicted_ttft_s for c in cands)
                return Decision(denial=self.admission.shed_denial(request, best, ctx.shed_share,
                                                                  ctx.budget_s))
            if placement.filtered_out_by == "deadline" and attempt == 1:
                best = min(c.predicted_ttft_s for c in cands)
                bound = ("its TTFT target" if ctx.budget_s == request.ttft_slo_s
                         else "the time left before its deadline")
                # The bound the filter applied, not the budget (a prediction between the two
                # read "1.85s exceeds its TTFT target, 2.00s" before 6 Dec; a target of 1 ms
                # read "0.00s")
                return Decision(denial=Denial(
                    "deadline_unreachable",
                    f"predicted TTFT {best:.3g}s on the best worker exceeds "
                    f"{DEADLINE_HEADROOM * ctx.budget_s:.3g}s, {DEADLINE_HEADROOM:.0%} of {bound} "
                    f"({ctx.budget_s:.3g}s; the rest is headroom for the prediction's error)"
                ))  # the deadline is fixed: a retry cannot help
            return Decision()
        worker: WorkerView = placement.chosen.worker
        dispatch = Dispatch(
            event_time_ms=now_ms, request=request, worker_id=worker.worker_id, slot=worker.slot,
            attempt=attempt, resume_from_token=resume_from, router_id=self.router_id,
            stream_partition=stream_partition,
        )
        return Decision(dispatch=dispatch, scores=placement.scores)

    def _deadlines_by_worker(self, cands: list[Candidate]) -> Callable[[str], list[tuple[int, int]]]:
        """Each candidate worker's requests in flight with a deadline and tokens still to
        generate, as (deadline, tokens left): what a long prefill placed there could make
        late (every router's, queued ones included)."""
        by_worker: dict[str, list[tuple[int, int]]] = {c.worker.worker_id: [] for c in cands}
        # each answer's expected length, worked out once a call for the requests that share it
        # (their tenant, model and cap): every request in flight is asked about
        expected: dict[tuple[str, str, int], float] = {}
        for flight in self.in_flight.values():
            d = flight.dispatch
            on = by_worker.get(d.worker_id)
            request = d.request
            if on is None or request.deadline_ms is None or flight.handed_back \
                    or flight.cancelled is not None or flight.whole:
                continue
            key = (request.tenant, request.model, request.max_tokens)
            tokens = expected.get(key)
            if tokens is None:
                tokens = expected[key] = self.answers.expected(request)
            left = self.answers.left(request, flight.tokens_done, tokens)
            if left > 0:  # (its cap reached, it only waits for its Completed to be read)
                on.append((request.deadline_ms, left))
        return by_worker.__getitem__

    def _shortlist(self, request: InferenceRequest, workers: list[WorkerView]) -> list[WorkerView]:
        """The workers worth scoring in a large fleet: the least loaded, those holding the
        request's longest cached prefix, and the one holding its task's earlier steps."""
        load = lambda w: w.running + w.waiting + self.ledger.requests(w.worker_id)  # noqa: E731
        chosen = {w.worker_id: w for w in heapq.nsmallest(SHORTLIST, workers, key=load)}
        holders = self.prefix.deepest_holders(request.prefix_hashes) if request.prefix_hashes else ()
        affinity = self._affinity.get(request.effective_task_id)
        extra = [w for w in workers if (w.worker_id in holders or w.worker_id == affinity)
                 and w.worker_id not in chosen]
        for w in heapq.nsmallest(SHORTLIST, extra, key=load):
            chosen[w.worker_id] = w
        return list(chosen.values())

    def _context(self, request: InferenceRequest, now_ms: int, shed: float | None = None,
                 continuing: bool = False) -> PlacementContext:
        """A continuation is placed without its deadline: it was accepted, and finishing it
        late beats never finishing it (its deadline may have passed while it was moved)."""
        if request.deadline_ms is not None and not continuing:
            budget = (request.deadline_ms - now_ms) / 1000
            if request.ttft_slo_s is not None:
                budget = min(budget, request.ttft_slo_s)
            return PlacementContext(request, now_ms, budget, True, self.pool_weights, shed)
        target = request.ttft_slo_s or self.config.slo.ttft_slo_s
        return PlacementContext(request, now_ms, target, False, self.pool_weights, shed)

    def cancel(self, cancel: CancelRequest, now_ms: int) -> list[Emit]:
        """A client's cancellation of a request in flight: forwarded to the worker running it;
        or, where none runs it (handed back, or its worker silent, and waiting for its
        continuation), the request ends here, cancelled, instead of being continued."""
        flight = self.in_flight.get(cancel.request_id)
        if flight is None:
            return []  # finished, or never placed here
        if cancel.attempt is not None:  # a client's cancel is the request's (an attempt on one
            cancel = cancel.model_copy(update={"attempt": None})  # marks the router's own)
        flight.cancelled = cancel.reason  # if it comes back (a recall crossing), not continued
        silent = self.fleet.silent(now_ms)
        waiting = flight.handed_back or flight.dispatch.worker_id in silent
        if not waiting or not self._resumes(flight.dispatch, now_ms):
            # The router that placed it continues it: ending it here would race that router,
            # which reads the forward too (``forwarded_cancel``).
            return [Emit(cancel, flight.dispatch.slot)]
        return self._cancelled(flight, now_ms, silent)

    def forwarded_cancel(self, cancel: CancelRequest, slot: int | None, now_ms: int) -> list[Emit]:
        """A client's cancel another router read and forwarded to the request's slot (seen on
        the dispatch topic, partition ``slot``; a client's carries no ``attempt``). The router
        that placed the request ends it here if it is waiting for its continuation, where no
        worker would read the forward; a worker running it does, and stops it. Forwarded to a
        slot the request has left (continued elsewhere meanwhile), it is sent on to the one
        running it."""
        flight = self.in_flight.get(cancel.request_id)
        mine = flight is not None and self._resumes(flight.dispatch, now_ms)
        if cancel.attempt is not None or not mine:
            return []
        flight.cancelled = cancel.reason  # if it comes back (a recall crossing), not continued
        silent = self.fleet.silent(now_ms)
        if flight.handed_back or flight.dispatch.worker_id in silent:
            return self._cancelled(flight, now_ms, silent)
        if slot is not None and slot != flight.dispatch.slot:
            return [Emit(cancel, flight.dispatch.slot)]
        return []

    def _cancelled(self, flight: _InFlight, now_ms: int, silent: set[str]) -> list[Emit]:
        old = flight.dispatch
        ended = Cancelled(event_time_ms=now_ms, **about(old.request), reason=flight.cancelled,
                          attempt=old.attempt)
        out = [self._supersede(old, now_ms, silent)] if old.worker_id in silent else []
        out.append(self._end_stream(flight, "abort", now_ms))
        self.observe(ended, now_ms)
        return out + [Emit(ended)]

    def resume(self, now_ms: int) -> list[Emit]:
        """Continuations (and cancellations of superseded attempts, or failures) for requests
        whose worker went silent, handed them back, or overran their expected time."""
        silent = self.fleet.silent(now_ms)
        self._forget_gone(silent, now_ms)
        # What was heard is judged as of when it was all read (a router reading behind has not
        # read the events that would tell it a worker answered or ended a request yet).
        judged_ms = self.fleet.judged(now_ms)
        out, self._cancels = self._cancels, []
        for rid, flight in list(self.in_flight.items()):
            old = flight.dispatch
            if not self._resumes(old, now_ms):
                continue  # the router that placed it resumes it (one continuation, not one per router)
            self._expect(flight)
            due = flight.expected_done_ms
            if due is None and judged_ms - flight.placed_ms > self.fleet.heartbeat_timeout_ms:
                silent.add(old.worker_id)  # not heard from since the attempt was placed
            unanswered = self._recall_unanswered(flight, judged_ms)
            lost = old.worker_id in silent or flight.handed_back or unanswered
            overdue = not lost and (flight.evacuate or (
                due is not None and judged_ms > due and self._may_recall(old.worker_id)))
            if not lost:
                flight.no_worker_since_ms = None  # its worker is heard again: a wait starts anew
            if not lost and not overdue:
                continue
            if lost and flight.cancelled is not None:  # its client cancelled: not continued
                out += self._cancelled(flight, now_ms, silent)
                continue
            req = old.request
            common = dict(event_time_ms=now_ms, **about(req))
            whole = flight.whole or flight.tokens_done >= req.max_tokens
            if whole and lost:  # the client has every token
                # (on a live worker, overdue, it is recalled below: the worker publishes its own
                # Completed, one, not two, or does not hold it and leaves the recall unanswered)
                done = Completed(**common, worker_id=old.worker_id, attempt=old.attempt,
                                 prompt_tokens=req.prompt_tokens, output_tokens=flight.tokens_done,
                                 finish_reason="length" if flight.tokens_done >= req.max_tokens
                                 else "stop",
                                 e2e_s=max(0, now_ms - req.created_ms) / 1000)
                out.append(self._supersede(old, now_ms, silent, unanswered))
                if not flight.whole:  # its final chunk not read: ended here (the vLLM adapter
                    # ends a request at the ``[DONE]`` after its last token, its worker lost or
                    # handing it back in between); a second end, after the worker's, is dropped
                    out.append(self._end_stream(flight, done.finish_reason, now_ms))
                out.append(Emit(done))
                self.observe(done, now_ms)
                continue
            if overdue:
                # A live worker is asked to hand the request back (it answers Requeued) rather
                # than raced: had it finished in the meantime, two attempts would both complete.
                # Only worth it when another worker can take the request.
                # The recall is the retry: without budget the request stays where it runs.
                others = [w for w in self.fleet.live(now_ms, req.model) if w.worker_id != old.worker_id]
                if others and flight.recall_sent_ms is None \
                        and self.retry_budget.try_retry(now_ms / 1000):
                    flight.recall_sent_ms, flight.retry_paid = now_ms, True
                    heard = self.fleet.get(old.worker_id)
                    flight.recall_heard_ms = heard.last_seen_ms if heard is not None else None
                    why = "its worker's breaker opened" if flight.evacuate else "overdue"
                    out.append(Emit(CancelRequest(event_time_ms=now_ms, request_id=rid,
                                                  attempt=old.attempt, reason=f"{RECALLED}{why}"),
                                    old.slot))
                continue
            if old.attempt >= MAX_ATTEMPTS:  # (a continuation past it is no valid Dispatch)
                out += self._fail_lost(flight, f"its {MAX_ATTEMPTS:,} attempts are spent",
                                       now_ms, silent, unanswered)
                continue
            continuation = dict(attempt=old.attempt + 1, resume_from=flight.tokens_done,
                                stream_partition=old.stream_partition)  # (its stream goes on)
            decision = self._place(req, now_ms, exclude={old.worker_id, *flight.unended},
                                   **continuation)
            if decision.dispatch is None and flight.unended:
                # (only a worker of an earlier attempt can take it: a late end of that attempt
                # would be taken for this one's, but better than no continuation)
                decision = self._place(req, now_ms, exclude=old.worker_id, **continuation)
            if decision.dispatch is None and old.worker_id not in silent:
                # Handed back by a worker that is still the only one able to serve it.
                decision = self._place(req, now_ms, exclude=None, **continuation)
            if decision.dispatch is None:  # no live worker right now: try again next tick
                since = flight.no_worker_since_ms = flight.no_worker_since_ms or now_ms
                if now_ms - since >= NO_WORKER_GIVE_UP_S * 1000:
                    out += self._fail_lost(
                        flight, f"no worker could take it for {NO_WORKER_GIVE_UP_S:g} s",
                        now_ms, silent, unanswered, reason="worker_lost")
                continue
            if not flight.retry_paid and not self.retry_budget.try_retry(now_ms / 1000):
                out += self._fail_lost(flight, "the retry budget is spent", now_ms, silent,
                                       unanswered)
                continue
            out += [self._supersede(old, now_ms, silent, unanswered),
                    Emit(decision.dispatch, decision.dispatch.slot)]
            self._dispatched(decision.dispatch, now_ms)
        return out

    def _fail_lost(self, flight: _InFlight, why: str, now_ms: int, silent: set[str],
                   unanswered: bool, reason: str = "retry_budget_exhausted") -> list[Emit]:
        """``flight``'s attempt is lost and it is not continued: it fails, saying ``why``."""
        old = flight.dispatch
        failed = Failed(event_time_ms=now_ms, **about(old.request), reason=reason,
                        worker_id=old.worker_id, attempt=old.attempt,
                        detail=f"{old.worker_id} lost the request at token {flight.tokens_done}; "
                               f"{why}")
        out = [self._supersede(old, now_ms, silent, unanswered),
               self._end_stream(flight, "error", now_ms), Emit(failed)]
        self.observe(failed, now_ms)
        return out

    def _end_stream(self, flight: _InFlight, finish_reason: FinishReason, now_ms: int) -> Emit:
        """The end of the stream of a request this router ends, after the tokens it read."""
        request = flight.dispatch.request
        return Emit(stream_end(request.request_id, self.router_id, flight.tokens_done,
                               finish_reason, now_ms, flight.dispatch.attempt),
                    reply_to=request.reply_to, stream_partition=flight.dispatch.stream_partition)

    def _forget_gone(self, silent: set[str], now_ms: int) -> None:
        """The prefix cache of a worker silent for ``GONE_AFTER_S`` (killed, and its slot not
        taken again) is forgotten: its blocks would keep it among a prefix's deepest holders.
        A worker gone for longer (``FORGET_STOPPED_S``, ``FORGET_AFTER_S``) with no request in
        flight on it is forgotten altogether."""
        horizon = now_ms - GONE_AFTER_S * 1000
        judged_ms = self.fleet.judged(now_ms)
        gone = []
        for wid in silent:
            worker = self.fleet.get(wid)
            if worker is None:
                continue
            if self._started.get(wid, 0) <= worker.last_seen_ms < horizon:
                self.prefix.forget(wid)
                # Its start taken as now: KV events it sent before, read late, are not taken;
                # heard again, its next heartbeat sets its start.
                self._start_before_gone[wid] = self._started.get(wid, 0)
                self._started[wid] = now_ms
            quiet_ms = judged_ms - worker.last_seen_ms
            if quiet_ms >= FORGET_AFTER_S * 1000 or (
                    worker.state in ("stopped", "crashed") and quiet_ms >= FORGET_STOPPED_S * 1000):
                gone.append(wid)
        if gone:
            busy = {flight.dispatch.worker_id for flight in self.in_flight.values()}
            self._forget_workers([wid for wid in gone if wid not in busy])  # (a request in
            # flight keeps its worker's view)

    def _forget_workers(self, worker_ids: list[str]) -> None:
        """Know nothing more of ``worker_ids``: heard again, one is taken as a new worker (and
        KV events it sent before, read late, are not taken: no worker heard of sent them)."""
        if not worker_ids:
            return
        self.fleet.forget(worker_ids)
        for wid in worker_ids:
            self.prefix.forget(wid)
            self._started.pop(wid, None)
            self._start_before_gone.pop(wid, None)
            self.breakers.pop(wid, None)
            self.ledger.forget_worker(wid)

    def _recall_unanswered(self, flight: _InFlight, now_ms: int) -> bool:
        """Whether ``flight``'s recall has gone unanswered for ``RECALL_ANSWER_S``: while its
        worker served, or, where the worker is drained or put to sleep (it answers no recall
        of a dispatch it has not started then), while its heartbeats since the recall reported
        it holding no request at all (counted on the worker's clock; its terminal event for the
        request, on another partition, would have been read by then)."""
        if flight.recall_sent_ms is None:
            return False
        worker = self.fleet.get(flight.dispatch.worker_id)
        if worker is not None and worker.state == "warm":
            flight.paused_idle_ms = None
            return now_ms - flight.recall_sent_ms > RECALL_ANSWER_S * 1000
        flight.recall_sent_ms = now_ms  # the wait while it serves starts again
        if worker is None or worker.running or worker.waiting \
                or worker.last_seen_ms <= (flight.recall_heard_ms or 0):
            flight.paused_idle_ms = None
            return False
        if flight.paused_idle_ms is None:
            flight.paused_idle_ms = worker.last_seen_ms
        return worker.last_seen_ms - flight.paused_idle_ms >= RECALL_ANSWER_S * 1000

    @staticmethod
    def _supersede(old: Dispatch, now_ms: int, silent: set[str], unanswered: bool = False) -> Emit:
        """A cancellation of ``old``'s attempt on its slot's partition. A worker commits a
        dispatch only once it has finished it, so a worker that later takes the slot over (a
        crashed one started again, the autoscaler scaling out) reads a lost or handed-back
        dispatch again, and right after it this: it drops the attempt instead of serving the
        request a second time (two completions of one request, ``governor demo --fault
        kill:1@6 --fault start:1@11``). A worker still running the attempt hands it back."""
        why = ("its worker went silent" if old.worker_id in silent
               else "its worker did not answer a recall" if unanswered else "handed back")
        return Emit(CancelRequest(event_time_ms=now_ms, request_id=old.request.request_id,
                                  attempt=old.attempt, reason=f"superseded: {why}"), old.slot)
