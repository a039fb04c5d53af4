"""Optimistic accounting of dispatched work that workers have not reported yet. Pure.

Worker heartbeats lag behind dispatches by up to half a second; without this ledger a burst
between two heartbeats would all land on the worker that looked idlest. Every dispatch seen on
the dispatch topic (this router's and any other router's) is pending on its worker until that
worker reports it: its ``Started`` event or a terminal event. Reading dispatches from the topic
rather than from what this router sent keeps two routers' ledgers the same.
"""

from collections import defaultdict


class PendingLedger:
    def __init__(self) -> None:
        self._by_request: dict[str, tuple[str, int]] = {}  # request -> (worker, prompt tokens)
        self._requests: dict[str, int] = defaultdict(int)
        self._tokens: dict[str, int] = defaultdict(int)

    def dispatched(self, request_id: str, worker_id: str, prompt_tokens: int) -> None:
        self.reported(request_id)
        self._by_request[request_id] = (worker_id, prompt_tokens)
        self._requests[worker_id] += 1
        self._tokens[worker_id] += prompt_tokens

    def reported(self, request_id: str) -> None:
        """The worker has reported the request (started or finished): its status counts it."""
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
        for request_id, (wid, _) in list(self._by_request.items()):
            if wid == worker_id:
                self.reported(request_id)
