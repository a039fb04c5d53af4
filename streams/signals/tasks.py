"""Per-task state, keyed by task_id (the by-task repartition of the request outcomes). Pure.

A task is a workflow of ``steps_total`` requests sharing a ``task_id``; a request without one is a
task of one step. The book accumulates the cost of every attempt of every step (the worker book's
charges) and closes the task:

* ``succeeded`` when every step from 1 to ``steps_total`` completed by its deadline;
* ``failed`` when a step failed, was rejected or cancelled;
* ``timed_out`` when a step completed after its deadline, or when the task made no progress for
  ``idle_timeout_s`` of event time before all its steps were done.

On closing it emits one ``tc`` observation (outcome and cost so far) to the task's ``tenant:`` and
``fleet:all`` scopes. A charge that arrives after the close (charges are settled at the worker's
next heartbeat, so the last step's usually does) still counts: it is emitted as ``tl``, cost
without an outcome. So a task that fails at step 3 of 5 adds the cost of steps 1 to 3 and no
success. Every new charge is also emitted as ``ch`` (attributed spend) to those scopes. Step
outcomes are deduplicated by request id, charges by request id and attempt.
"""

from collections.abc import Iterable, MutableMapping
from typing import Any

from streams.signals.outputs import FLEET, Out, scope_key

_CLOSE = {"failed": "failed", "late": "timed_out"}


class TaskBook:
    def __init__(self, table: MutableMapping[str, Any], idle_timeout_s: float = 120.0,
                 retention_s: float = 600.0) -> None:
        self.table = table
        self.idle_timeout_ms = int(idle_timeout_s * 1000)
        self.retention_ms = int(retention_s * 1000)

    def apply(self, task_id: str, payload: dict) -> list[Out]:
        st = self.table.get(task_id) or {"tn": payload["tn"], "steps": 1, "ok": [], "rids": [],
                                         "charged": [], "usd": 0.0, "o": None, "closed": None,
                                         "last": payload["t"]}
        st["last"] = max(st["last"], payload["t"])
        outs = self._cost(st, payload) if payload["k"] == "cost" else self._step(st, payload)
        self.table[task_id] = st
        return outs

    def _step(self, st: dict, p: dict) -> list[Out]:
        if p["rid"] in st["rids"]:
            return []
        st["rids"].append(p["rid"])
        st["steps"] = max(st["steps"], p["steps"])
        if st["o"] is not None:
            return []
        if p["o"] in _CLOSE:
            return self._close(st, _CLOSE[p["o"]], p["t"])
        if p["step"] not in st["ok"]:
            st["ok"].append(p["step"])
        if all(step in st["ok"] for step in range(1, st["steps"] + 1)):
            return self._close(st, "succeeded", p["t"])
        return []

    def _cost(self, st: dict, p: dict) -> list[Out]:
        ident = f"{p['rid']}:{p['a']}"
        if ident in st["charged"]:
            return []
        st["charged"].append(ident)
        st["usd"] += p["usd"]
        charge = {"k": "ch", "t": p["t"], "usd": p["usd"]}  # attributed spend, closed or not
        outs = [Out("scope", key, charge) for key in self._scopes(st)]
        if st["o"] is not None:
            late = {"k": "tl", "t": p["t"], "usd": p["usd"]}
            outs += [Out("scope", key, late) for key in self._scopes(st)]
        return outs

    def _scopes(self, st: dict) -> list[str]:
        return [scope_key("tenant", st["tn"]), FLEET]

    def _close(self, st: dict, outcome: str, t: int) -> list[Out]:
        st.update(o=outcome, closed=t)
        obs = {"k": "tc", "t": t, "o": outcome, "usd": st["usd"]}
        return [Out("scope", key, obs) for key in self._scopes(st)]

    def expires_ms(self, st: dict) -> int | None:
        """The event time after which ``sweep`` times this task out (open) or forgets it
        (closed), unless it changes."""
        if st["o"] is None:
            return st["last"] + self.idle_timeout_ms
        return None if st["closed"] is None else st["closed"] + self.retention_ms

    def sweep(self, keys: Iterable[str], watermark_ms: int) -> tuple[list[Out], list[str]]:
        """Time out idle open tasks; forget tasks closed ``retention_s`` ago."""
        outs, gone = [], []
        for key in list(keys):
            st = self.table.get(key)
            if st is None:
                continue
            if st["o"] is None and st["last"] < watermark_ms - self.idle_timeout_ms:
                outs += self._close(st, "timed_out", st["last"] + self.idle_timeout_ms)
                self.table[key] = st
            elif st["closed"] is not None and st["closed"] < watermark_ms - self.retention_ms:
                self.table.pop(key, None)
                gone.append(key)
        return outs, gone
