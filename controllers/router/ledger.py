"""Optimistic accounting of dispatched work that workers have not reported yet. Pure.

Worker heartbeats lag behind dispatches by up to half a second; without this ledger a burst
between two heartbeats would all land on the worker that looked idlest. Every dispatch seen on
the dispatch topic (this router's and any other router's) is pending on its worker until that
worker reports it: a heartbeat stamped after its ``Started`` event (the heartbeat's backlog and
counts then include it), or a terminal event. Reading dispatches from the topic rather than from
what this router sent keeps two routers' ledgers the same.
"""

from collections import defaultdict


class PendingLedger:
    def __init__(self) -> None:
        self._by_request: dict[str, tuple[str, int]] = {}  # request -> (worker, prompt tokens)
        self._requests: dict[str, int] = defaultdict(int)
        self._tokens: dict[str, int] = defaultdict(int)
        self._started: dict[str, int] = {}  # started, not yet in a heartbeat

    def dispatched(self, request_id: str, worker_id: str, prompt_tokens: int) -> None:
        self.reported(request_id)
        self._by_request[request_id] = (worker_id, prompt_tokens)
        self._requests[worker_id] += 1
        self._tokens[worker_id] += prompt_tokens

    def started(self, request_id: str, at_ms: int) -> None:
        """The worker took the request; its next heartbeat will count it."""
        if request_id in self._by_request:
            self._started[request_id] = at_ms

    def heartbeat(self, worker_id: str, at_ms: int) -> None:
        """A heartbeat from ``worker_id``: what it started before ``at_ms`` is counted there now."""
        if not self._started:
            return
        counted = [rid for rid, t in self._started.items()
                   if t <= at_ms and self._by_request.get(rid, ("",))[0] == worker_id]
        for rid in counted:
            self.reported(rid)

    def reported(self, request_id: str) -> None:
        """The worker's status counts the request (or it finished): no longer pending."""
        self._started.pop(request_id, None)
        item = self._by_request.pop(request_id, None)
        if item is not None:
            worker_id, tokens = item
            self._requests[worker_id] -= 1
            self._tokens[worker_id] -= tokens

    def requests(self, worker_id: str) -> int:
        return self._requests.get(worker_id, 0)

    def prompt_tokens(self, worker_id: str) -> int:
        return self._tokens.get(worker_id, 0)

    def forget_worker(self, worker_id: str) -> None:
        """Nothing is pending on ``worker_id`` any more, and its counters go."""
        if self._requests.get(worker_id):
            for request_id, (wid, _) in list(self._by_request.items()):
                if wid == worker_id:
                    self.reported(request_id)
        self._requests.pop(worker_id, None)
        self._tokens.pop(worker_id, None)
