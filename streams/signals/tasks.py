"""Per-task state, keyed by task_id (the by-task repartition of the request outcomes). Pure.

A task is a workflow of ``steps_total`` requests sharing a ``task_id``; a request without one is a
task of one step. The book accumulates the cost of every attempt of every step (the worker book's
charges) and closes the task:

* ``succeeded`` when every step from 1 to ``steps_total`` has a request that completed by its
  deadline (a step may be retried under a new request id: DESIGN.md, as ``governor report``
  counts it);
* ``failed`` when a step failed, was rejected or cancelled, unless a request of that step has
  completed in time already;
* ``timed_out`` when a step completed after its deadline (the same way), or when the task made
  no progress for ``idle_timeout_s`` of event time before all its steps were done. A step
  queued and not yet ended (the request book says so from its Queued: ``run``) is progress
  until its deadline, at most ``RUN_HELD_MAX_S`` after it was queued: the idle timeout counts
  from the later of the last progress and that time, so a long generation within its deadline
  keeps its task open, and a step whose end is lost holds it no longer than that.

On closing it emits one ``tc`` observation (outcome and cost so far) to the task's ``tenant:``
and ``fleet:all`` scopes. A charge that arrives after the close (charges are settled at the
worker's next heartbeat, so the last step's usually does) still counts: it is emitted as ``tl``,
cost without an outcome. So a task that fails at step 3 of 5 adds the cost of steps 1 to 3 and
no success. Every new charge is also emitted as ``ch`` (attributed spend) to those scopes.
Steps open tasks, charges do not: a charge of a task the book does not hold (forgotten
``retention_s`` after its close, or not opened yet) is emitted as ``ch`` and ``tl`` alone, and
its digest kept ``retention_s`` under the task's key (``unheld``), so it counts once.

A task closed as failed or timed out keeps counting the steps that succeed while it is kept
(``retention_s``): once each step it missed has a request that completed in time (retries under
new request ids), it succeeded after all and emits ``tr`` to those scopes (one failure or time-out
less, one success more; its cost was counted already). So the running total counts what the
report counts; a window holding the revision and not the close shows one failure below zero.

Duplicates: a step outcome applied twice changes nothing (the steps completed are a set, a
closed task closes no second time, and one revised stays succeeded). Charges are deduplicated by
request and attempt: the task keeps a 64-bit digest of each (``charged``, in arrival order), its
newest ``CHARGES_KEPT`` only, so that its entry stays far under the record limit (a task of
10,000 steps and 20,000 charges encodes to about 510 KB); a charge re-sent after 20,000 newer
ones would count twice.
"""

import hashlib
from collections.abc import Iterable, MutableMapping
from typing import Any

from schemas.limits import MAX_TASK_STEPS
from streams.signals.outputs import FLEET, Out, scope_key

_CLOSE = {"failed": "failed", "late": "timed_out"}
#: Charge digests a task keeps (its newest): two for each step a task may have.
CHARGES_KEPT = 2 * MAX_TASK_STEPS
#: The longest a step queued holds its task open (a day: the longest deadline expected), should
#: its deadline be later still (any epoch up to ``MAX_EPOCH_MS`` is valid).
RUN_HELD_MAX_S = 86_400.0


def _charge(rid: str, attempt: object) -> str:
    return hashlib.blake2b(f"{rid}:{attempt}".encode(), digest_size=8).hexdigest()


def _current(st: dict) -> dict:
    """An entry written before 5 Dec (lists of steps, request ids and charges, searched
    linearly) in today's form: steps completed and charge digests as keys of dicts."""
    if isinstance(st["ok"], list):
        st["ok"] = dict.fromkeys(map(str, st["ok"]), 1)
        st["charged"] = dict.fromkeys((_charge(*i.rsplit(":", 1)) for i in st["charged"]), 1)
        st.pop("rids", None)
    return st


def _charges_of_unheld(p: dict) -> dict:
    """The entry that keeps the charge digests of a task the book does not hold, until
    ``retention_s`` after the newest (``_unheld_cost``); a step opens the task, keeping them.
    ``unheld`` tells it from a task. It has the shape of a task that succeeded, closed at the
    charge's time: a streams worker older than 7 Dec, reading it, forgets it as such, counts a
    charge once, and drops the task's steps meanwhile (CHANGELOG, "Upgrading")."""
    return {"tn": p["tn"], "steps": 1, "ok": {}, "charged": {}, "usd": 0.0, "o": "succeeded",
            "closed": p["t"], "last": p["t"], "unheld": 1}


def _opened(p: dict, unheld: dict | None) -> dict:
    """A task a step opens, with the charge digests of an ``unheld`` entry (its charges before
    it counted as task cost without an outcome: not in its ``usd``)."""
    return {"tn": p["tn"], "steps": 1, "ok": {}, "charged": unheld["charged"] if unheld else {},
            "usd": 0.0, "o": None, "closed": None, "last": p["t"]}


def _newly_charged(st: dict, p: dict) -> bool:
    """Note charge ``p`` in ``st``'s digests (its newest ``CHARGES_KEPT``); False if they had
    it: a re-sent charge."""
    ident, charged = _charge(p["rid"], p["a"]), st["charged"]
    if ident in charged:
        return False
    charged[ident] = 1
    if len(charged) > CHARGES_KEPT:
        del charged[next(iter(charged))]  # the oldest
    return True


class TaskBook:
    def __init__(self, table: MutableMapping[str, Any], idle_timeout_s: float = 120.0,
                 retention_s: float = 600.0) -> None:
        self.table = table
        self.idle_timeout_ms = int(idle_timeout_s * 1000)
        self.retention_ms = int(retention_s * 1000)

    def apply(self, task_id: str, payload: dict, watermark_ms: int | None = None) -> list[Out]:
        """``watermark_ms``: the partition's event time as the payload arrives, its own
        included: a task that ``sweep`` forgets at that time is taken as forgotten, whether or
        not a sweep has run since (sweeps run as batches end, so before 7 Dec a charge read in
        the batch whose time passed a closed task's retention counted as that closed task's
        cost, ``tl``, and one read in the next opened a task of its own). A charge opens no
        task (``_unheld_cost``)."""
        known = self.table.get(task_id)
        if known and watermark_ms is not None and self._forgettable(known, watermark_ms):
            known = None
        unheld = known if known and known.get("unheld") else None
        if (not known or unheld) and payload["k"] == "cost":
            return self._unheld_cost(task_id, unheld, payload)
        st = _current(known) if known and not unheld else _opened(payload, unheld)
        st["last"] = max(st["last"], payload["t"])
        kind = payload["k"]
        outs = (self._cost(st, payload) if kind == "cost" else self._run(st, payload)
                if kind == "run" else self._step(st, payload))
        self.table[task_id] = st
        return outs

    def _run(self, st: dict, p: dict) -> list[Out]:
        """A step queued: it holds the task open until its deadline (steps are keyed by number,
        at most ``MAX_TASK_STEPS``, so the entry stays bounded; a retry under a new request id
        is the same step)."""
        step = str(p["step"])
        if st["o"] is None and step not in st["ok"]:
            held = min(p["dl"], p["t"] + int(RUN_HELD_MAX_S * 1000))
            running = st.setdefault("run", {})
            running[step] = max(running.get(step, held), held)
        return []

    def _step(self, st: dict, p: dict) -> list[Out]:
        st["steps"] = max(st["steps"], p["steps"])
        step, ok = str(p["step"]), st["ok"]
        if p["o"] in _CLOSE:  # a miss: closes the task unless closed, or the step has succeeded
            # (a step ``None``, not known yet, is none that has: ``requests.RequestBook._step``)
            if st["o"] is not None or step in ok:
                return []
            st.get("run", {}).pop(step, None)
            return self._close(st, _CLOSE[p["o"]], p["t"])
        if st["o"] == "succeeded":
            return []
        st.get("run", {}).pop(step, None)
        ok[step] = 1
        if len(ok) < st["steps"]:  # each step is at most its own steps_total, at most the
            return []  # task's: all of 1..steps are done when there are as many
        if st["o"] is None:
            return self._close(st, "succeeded", p["t"])
        return self._revise(st, p["t"])

    def _revise(self, st: dict, t: int) -> list[Out]:
        """A task closed as failed or timed out whose missed steps have all succeeded since
        (retried under new request ids): it succeeded after all. A ``tr`` observation moves it
        from its first outcome to ``succeeded``; its cost was counted already."""
        was = st["o"]
        st.update(o="succeeded", closed=t)
        obs = {"k": "tr", "t": t, "was": was}
        return [Out("scope", key, obs) for key in self._scopes(st)]

    def _cost(self, st: dict, p: dict) -> list[Out]:
        if not _newly_charged(st, p):
            return []
        st["usd"] += p["usd"]
        # attributed spend, closed or not; after the close, the task's cost too
        return self._spent(st, p, ("ch",) if st["o"] is None else ("ch", "tl"))

    def _unheld_cost(self, task_id: str, unheld: dict | None, p: dict) -> list[Out]:
        """A charge of a task the book does not hold: one forgotten ``retention_s`` after its
        close, or one no step has opened yet. It opens no task (before 7 Dec it did, and that
        task, which never ran, was counted timed out ``idle_timeout_s`` later); its cost counts
        as attributed spend and as task cost without an outcome, as a charge after a close
        does. Its digest is kept ``retention_s`` (``_charges_of_unheld``, ``unheld``: those
        kept so far), so that a crash's replay sending it again is dropped (before 7 Dec no
        entry kept it, and it counted twice)."""
        st = unheld or _charges_of_unheld(p)
        if not _newly_charged(st, p):
            return []
        st["closed"] = st["last"] = max(st["last"], p["t"])
        self.table[task_id] = st
        return self._spent(p, p, ("ch", "tl"))

    def _spent(self, st: dict, p: dict, kinds: tuple[str, ...]) -> list[Out]:
        """Charge ``p`` as each of ``kinds`` to the scopes of ``st`` (an entry, or a payload:
        both name the tenant)."""
        return [Out("scope", key, {"k": kind, "t": p["t"], "usd": p["usd"]})
                for kind in kinds for key in self._scopes(st)]

    def _scopes(self, st: dict) -> list[str]:
        return [scope_key("tenant", st["tn"]), FLEET]

    def _close(self, st: dict, outcome: str, t: int) -> list[Out]:
        st.update(o=outcome, closed=t)
        st.pop("run", None)
        obs = {"k": "tc", "t": t, "o": outcome, "usd": st["usd"]}
        return [Out("scope", key, obs) for key in self._scopes(st)]

    def expires_ms(self, st: dict) -> int | None:
        """The event time after which ``sweep`` times this task out (open) or forgets it
        (closed), unless it changes."""
        if st["o"] is None:
            return max([st["last"], *st.get("run", {}).values()]) + self.idle_timeout_ms
        return None if st["closed"] is None else st["closed"] + self.retention_ms

    def sweep(self, keys: Iterable[str], watermark_ms: int) -> tuple[list[Out], list[str]]:
        """Time out idle open tasks (no step running either); forget tasks closed
        ``retention_s`` ago."""
        outs, gone = [], []
        for key in list(keys):
            st = self.table.get(key)
            if st is None:
                continue
            if st["o"] is None and (due := self.expires_ms(st)) < watermark_ms:
                outs += self._close(st, "timed_out", due)
                self.table[key] = st
            elif self._forgettable(st, watermark_ms):
                self.table.pop(key, None)
                gone.append(key)
        return outs, gone

    def _forgettable(self, st: dict, watermark_ms: int) -> bool:
        """Closed ``retention_s`` before ``watermark_ms``."""
        return st["closed"] is not None and st["closed"] < watermark_ms - self.retention_ms
