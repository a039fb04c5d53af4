"""Per-request state from lifecycle events, keyed by request_id like the telemetry topic. Pure.

For each lifecycle event (and each InferenceRequest, which carries the TTFT SLO) it updates the
request's entry and returns what the event means for the signals:

* observations for the request's ``model:``, ``tenant:`` and ``fleet:all`` scopes, and through the
  worker aggregator (which knows the worker's pool) for its ``worker:`` and ``pool:`` scopes;
* the end of an attempt on a worker (Completed, Requeued, Failed, Cancelled, or superseded by the
  Started of a later attempt), which the worker aggregator turns into a cost;
* the outcome of the request as a step of its task (a request without task_id is a task of one),
  and, from its Queued, that the step runs until its deadline (so its task stays open meanwhile).
  A completion read before both the request's Queued and its InferenceRequest (a Completed
  names its task but not its step nor the task's steps_total, nor the request's deadline) is
  held in the entry until one of them is read, and judged then: taken as step 1 of 1, it closed
  its task as succeeded. An entry
  holding one is forgotten as any ended request (``retention_s`` after its end), and its task,
  told nothing, times out as any that makes no progress.

Definitions (see README, "Live signals"):
* TTFT is ``FirstToken.ttft_s`` of the request's first first-token (a continuation's second
  first-token after a requeue is not a new TTFT). A continuation's (``tokens_done`` above 0:
  tokens were streamed before its attempt) is none even where the first attempt's was lost or
  is read after it, as the store's ``request_minute`` and ``report slo`` leave it out (before
  7 Dec the first one read was taken); it bounds the TTFT its SLO is judged by when the
  request has no other, as ``report slo`` judges it (by the least ``ttft_s`` of its
  continuations' first tokens, ``request_outcomes.continuation_ttft_s``).
* Inter-token latency is ``(e2e - ttft) / (output_tokens - 1)`` from the Completed event.
* A request succeeds when it completes by its deadline (``deadline_ms``, else created plus the
  configured default deadline). It meets its SLO when it also had its first token within its TTFT
  SLO (the request's ``ttft_slo_s``, from its Queued or its InferenceRequest, whichever the
  streams read first; else the default).
* A Failed from the worker of an attempt that a newer one replaced (the router resumed the
  request elsewhere) is no state of the request, as the audit and the report judge it: dropped
  when the newer attempt's Started was read first, else taken back once it is (``xr``: one
  failure less, and the request's later end counts).
* Duplicates (at-least-once delivery) are recognised by the event's identity: request, type and
  attempt (Preempted: worker, tokens done and time), and dropped. A request keeps the identities
  of its newest ``PREEMPTIONS_KEPT`` preemptions only (the others are bounded by its attempts,
  at most 1,000), so that its entry stays far under the record limit; a preemption re-sent
  after that many newer ones would count twice.
"""

from collections.abc import Iterable, MutableMapping
from typing import Any

from schemas.base import Message
from schemas.config import SloConfig
from streams.signals.outputs import FLEET, Out, observe, scope_key

PREEMPTIONS_KEPT = 256
#: A request with no event for this long (event time) is forgotten, ended or not.
IDLE_RETENTION_S = 3600.0


def identity(event: Message) -> str:
    kind = event.type
    if kind == "preempted":
        return f"preempted:{event.worker_id}:{event.tokens_done}:{event.event_time_ms}"
    attempt = getattr(event, "attempt", None)
    return kind if attempt is None else f"{kind}:{attempt}"


#: Between a task's tenant and its id in the task key: a character neither names nor ids allow
#: (both allow ``/``), so no two (tenant, task) pairs, and no request id, give one key.
TASK_KEY_SEPARATOR = "|"


def _task(event: Message, rid: str) -> str:
    """The key of the request's task: a task id is its tenant's (two tenants may use one); a
    request without one is a task of its own, keyed by its request id."""
    return f"{event.tenant}{TASK_KEY_SEPARATOR}{event.task_id}" if event.task_id else rid


class RequestBook:
    def __init__(self, table: MutableMapping[str, Any], slo: SloConfig = SloConfig(),
                 retention_s: float = 300.0, idle_retention_s: float = IDLE_RETENTION_S) -> None:
        self.table = table
        self.slo = slo
        self.retention_ms = int(retention_s * 1000)
        self.idle_retention_ms = int(idle_retention_s * 1000)

    def apply(self, event: Message) -> list[Out]:
        """Update the request of ``event``; return its outputs (none for a duplicate)."""
        rid = event.request_id
        st = self.table.get(rid)
        if st is None:
            st = {"rid": rid, "tn": event.tenant, "m": event.model, "task": _task(event, rid),
                  "step": 1, "steps": 1, "cr": None, "dl": None, "slo": None, "ttft": None, "att": {},
                  "seen": [], "end": None, "last": event.event_time_ms}
            if event.type == "requeued" and self._forgotten(event):  # (not held again)
                return self._requeued_after_end(st, event)
        ident = identity(event)
        if ident in st["seen"] or ident in st.get("pre", ()) or self._replaced(st, event):
            return []
        if event.type == "preempted":
            preempted = st.setdefault("pre", [])
            preempted.append(ident)
            del preempted[:-PREEMPTIONS_KEPT]
        else:
            st["seen"].append(ident)
        st["last"] = max(st["last"], event.event_time_ms)
        outs = getattr(self, f"_on_{event.type}")(st, event)
        self.table[rid] = st
        return outs

    def _scopes(self, st: dict) -> list[str]:
        return [scope_key("model", st["m"]), scope_key("tenant", st["tn"]), FLEET]

    def _emit(self, st: dict, obs: dict, worker: str | None) -> list[Out]:
        outs = observe(self._scopes(st), obs)
        if worker is not None:
            outs.append(Out("worker", worker, {"k": "obs", "obs": obs}))
        return outs

    def _request_facts(self, st: dict, event: Message) -> list[Out]:
        """What the InferenceRequest says, and the router copies into Queued (which usually
        precedes the request's Completed in its partition, where the requests topic may not have
        been read yet); the step of a completion held until they were known."""
        st.update(step=event.step, steps=event.steps_total, cr=event.created_ms,
                  dl=event.deadline_ms if event.deadline_ms is not None else st["dl"],
                  slo=event.ttft_slo_s if event.ttft_slo_s is not None else st["slo"])
        if event.task_id:
            st["task"] = _task(event, st["rid"])
        held = st.pop("held", None)  # (its completion's time: judged by the deadline now known)
        if held is None:
            return []
        t = held[-1]
        return [self._step_out(st, "ok" if t <= self._deadline(st, t) else "late", t)]

    def _on_inference_request(self, st: dict, event: Message) -> list[Out]:
        return self._request_facts(st, event)

    def _on_queued(self, st: dict, event: Message) -> list[Out]:
        released = self._request_facts(st, event)
        t = event.event_time_ms
        running = Out("task", st["task"], {"k": "run", "rid": st["rid"], "step": st["step"],
                                           "t": t, "tn": st["tn"], "dl": self._deadline(st, t)})
        return released + observe(self._scopes(st), {"k": "q", "t": t}) + [running]

    def _deadline(self, st: dict, created: int) -> int:
        """The request's deadline: its own, else its creation (``created`` when unknown) plus
        the default."""
        created = st["cr"] if st["cr"] is not None else created
        return st["dl"] if st["dl"] is not None else created + int(self.slo.deadline_s * 1000)

    def _on_rejected(self, st: dict, event: Message) -> list[Out]:
        if self._ended_already(st):
            return []
        st["end"] = event.event_time_ms
        obs = {"k": "r", "t": event.event_time_ms, "shed": int(event.reason == "load_shed")}
        if event.for_now:  # its task goes on: a retry under a new id may succeed
            return self._emit(st, obs, None)
        return self._emit(st, obs, None) + self._step(st, event, "failed")

    def _on_started(self, st: dict, event: Message) -> list[Out]:
        t, attempt = event.event_time_ms, str(event.attempt)
        st["att"][attempt] = [event.worker_id, t, 1]
        taken_back = self._failure_replaced(st, t)  # (the request goes on: not ended)
        ended = self._ended_before_start(st, event.attempt)
        if ended is None:
            outs = self._end_attempts(st, t, keep=attempt)
        else:
            outs = self._end_attempts(st, ended, only=attempt)
        outs += self._emit(st, {"k": "s", "t": t, "a": event.attempt}, event.worker_id)
        return outs + taken_back

    @staticmethod
    def _ended_before_start(st: dict, attempt: int) -> int | None:
        """When an attempt whose Started is read only now ended already: as the first newer
        attempt started, else at the request's end; None while it may run. Such a Started is
        read after them where its worker's record came late (another producer's, a retry's);
        before 7 Dec it opened an attempt that nothing closed (never charged) and closed the
        newer one at its own start, charging that nothing."""
        newer = [start for a, (_w, start, _open) in st["att"].items() if int(a) > attempt]
        if newer:
            return min(newer)
        return st["end"] if st.get("done") else None

    def _failure_replaced(self, st: dict, t: int) -> list[Out]:
        """A failure read before the Started of the attempt that replaced the failing one (the
        router had resumed the request elsewhere: its worker's failure is no state of the
        request, as ``_replaced`` finds when the Started is read first, and as the audit and
        the report judge it): the request goes on. Its failure is taken back (``xr``: one
        failure less) and a later end counts; its task, closed as failed by it, succeeds after
        all if the request completes in time (``TaskBook``). The take-back has the failure's
        time (an entry of before 7 Dec kept none: the Started's), so a window holds both or
        neither: before 7 Dec it had the Started's, and a 10 s window holding it alone counted
        -1 failures, and a success rate of 2.0 over two completions."""
        failure = st.get("fx")
        if failure is None:
            return []
        newest = max(st["att"], key=int)
        attempt = failure[2] if len(failure) > 2 else None  # (None: it named none, or of old)
        if (st["att"][newest][0] == failure[0] if attempt is None else int(newest) <= attempt):
            return []
        del st["fx"]
        st.update(done=False, end=None)
        seen = "failed" if attempt is None else f"failed:{attempt}"
        if seen in st["seen"]:  # (a copy of it read again is a replaced attempt's now)
            st["seen"].remove(seen)
        return self._emit(st, {"k": "xr", "t": failure[1] if len(failure) > 1 else t},
                          failure[0])

    def _on_first_token(self, st: dict, event: Message) -> list[Out]:
        if event.tokens_done > 0:  # a continuation's: no TTFT, though its SLO's bound
            st["cttft"] = min(st.get("cttft", event.ttft_s), event.ttft_s)
            return []
        if st["ttft"] is not None:
            return []
        st["ttft"] = event.ttft_s
        return self._emit(st, {"k": "f", "t": event.event_time_ms, "v": event.ttft_s},
                          event.worker_id)

    def _on_preempted(self, st: dict, event: Message) -> list[Out]:
        return self._emit(st, {"k": "p", "t": event.event_time_ms}, event.worker_id)

    def _on_requeued(self, st: dict, event: Message) -> list[Out]:
        if st.get("done"):
            return self._requeued_after_end(st, event)
        t = event.event_time_ms
        outs = self._end_attempts(st, t, only=str(event.attempt))
        return outs + self._emit(st, {"k": "rq", "t": t}, event.worker_id)

    def _forgotten(self, event: Message) -> bool:
        """Whether the request of ``event``, which the book does not hold, may be one it forgot:
        created (or of an older producer, which does not say when) at least ``retention_s``
        before ``event``. One created since cannot have ended that long ago (its ``Queued``,
        which a router that crashed sends when it restarts, may come after its worker's
        events)."""
        created = event.created_ms
        return created is None or event.event_time_ms - created >= self.retention_ms

    def _requeued_after_end(self, st: dict, event: Message) -> list[Out]:
        """A hand-back of a request that had ended (or that the book forgot, ended or idle):
        an attempt that a newer one replaced, given back by a worker that was paused or cut
        off meanwhile. The router places nothing for it, so it is no requeue: its attempt
        ended when the newer one started, or at the request's end, and it is counted as
        ``requeued_after_end``."""
        return self._emit(st, {"k": "rqe", "t": event.event_time_ms}, event.worker_id)

    def _ended_already(self, st: dict) -> bool:
        """The request reached a terminal state before (two attempts can both end: the first
        end counts, as the router counts it); else it does now."""
        ended, st["done"] = st.get("done", False), True
        return ended

    def _on_completed(self, st: dict, event: Message) -> list[Out]:
        if self._ended_already(st):
            return []
        t = event.event_time_ms
        outs = self._end_attempts(st, t)
        st["end"] = t
        ok = t <= self._deadline(st, t - int(event.e2e_s * 1000))
        ttft = st["ttft"] if st["ttft"] is not None else st.get("cttft", event.e2e_s)
        slo = st["slo"] if st["slo"] is not None else self.slo.ttft_slo_s
        itl = None
        if st["ttft"] is not None and event.output_tokens > 1:
            itl = max(0.0, event.e2e_s - st["ttft"]) / (event.output_tokens - 1)
        obs = {"k": "c", "t": t, "e2e": event.e2e_s, "in": event.prompt_tokens,
               "out": event.output_tokens, "ok": int(ok), "slo": int(ok and ttft <= slo),
               "itl": itl}
        return outs + self._emit(st, obs, event.worker_id) + self._step(
            st, event, "ok" if ok else "late")

    def _on_failed(self, st: dict, event: Message) -> list[Out]:
        return self._terminal_failure(st, event, "x")

    def _on_cancelled(self, st: dict, event: Message) -> list[Out]:
        return self._terminal_failure(st, event, "n")

    @staticmethod
    def _replaced(st: dict, event: Message) -> bool:
        """A Failed of an attempt a newer one replaced: the newer attempt goes on. Told by its
        attempt (below the newest started), or where it names none (a worker older than the
        field) by its worker (not the newest attempt's): decided before its identity is
        recorded, as such a failure's identity is the current attempt's too (recorded, it
        dropped the real failure)."""
        if event.type != "failed" or not st["att"]:
            return False
        if event.attempt is not None:
            return event.attempt < int(max(st["att"], key=int))
        return event.worker_id is not None and \
            st["att"][max(st["att"], key=int)][0] != event.worker_id

    def _terminal_failure(self, st: dict, event: Message, kind: str) -> list[Out]:
        if self._ended_already(st):
            return []
        t = event.event_time_ms
        outs = self._end_attempts(st, t)
        st["end"] = t
        if kind == "x" and (event.worker_id is not None or event.attempt is not None):
            st["fx"] = [event.worker_id, t, event.attempt]  # (its attempt may be replaced)
        return outs + self._emit(st, {"k": kind, "t": t}, event.worker_id) + self._step(
            st, event, "failed")

    def _end_attempts(self, st: dict, t: int, keep: str | None = None,
                      only: str | None = None) -> list[Out]:
        """Close the open attempts (all, all but ``keep``, or just ``only``) at ``t``."""
        outs = []
        for attempt, (worker, start, is_open) in st["att"].items():
            if not is_open or attempt == keep or (only is not None and attempt != only):
                continue
            st["att"][attempt] = [worker, start, 0]
            outs.append(Out("worker", worker, {
                "k": "end", "rid": st["rid"], "task": st["task"],
                "tn": st["tn"], "a": int(attempt), "s": start, "e": max(start, t)}))
        return outs

    def _step(self, st: dict, event: Message, outcome: str) -> list[Out]:
        """The request's outcome as a step of its task; a completion whose step the streams
        have not learnt (neither Queued nor InferenceRequest read: no ``cr``) is held for it,
        and judged then by the request's own deadline (a completion judged by the default one
        alone could be in time by it and late by its own, or the other way). A failure closes
        its task whatever the step, unless the step has succeeded (``TaskBook``); one whose
        step is not learnt yet names none (``None``), and closes its task (before 7 Dec it was
        step 1: a failure of step 2 after step 1 had succeeded changed nothing, and the task
        timed out 120 s later)."""
        if outcome in ("ok", "late") and st["cr"] is None:
            st["held"] = [event.event_time_ms]
            return []
        return [self._step_out(st, outcome, event.event_time_ms)]

    def _step_out(self, st: dict, outcome: str, t: int) -> Out:
        return Out("task", st["task"], {
            "k": "step", "rid": st["rid"], "step": st["step"] if st["cr"] is not None else None,
            "steps": st["steps"], "o": outcome, "t": t, "tn": st["tn"]})

    def expires_ms(self, st: dict) -> int:
        """The event time after which ``sweep`` forgets this request (unless it changes)."""
        idle = st["last"] + self.idle_retention_ms
        return idle if st["end"] is None else min(st["end"] + self.retention_ms, idle)

    def sweep(self, keys: Iterable[str], watermark_ms: int) -> list[str]:
        """Forget requests finished ``retention_s`` ago (or idle for ``idle_retention_s``)."""
        gone = []
        for key in list(keys):
            st = self.table.get(key)
            if st is None:
                continue
            if (st["end"] is not None and st["end"] < watermark_ms - self.retention_ms) or (
                    st["last"] < watermark_ms - self.idle_retention_ms):
                self.table.pop(key, None)
                gone.append(key)
        return gone
