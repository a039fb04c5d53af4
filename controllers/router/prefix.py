"""Which prefix blocks each worker holds: exact from KV events, estimated from routing history.

A worker that publishes KV block events (the simulated engine does) is known exactly. A worker
that publishes none (a plain vLLM) is assumed to still hold the prefix blocks of the requests
recently routed to it, up to a bounded number of blocks per worker (least recently routed first
out), which approximates its LRU cache.
"""

from collections import OrderedDict


class PrefixIndex:
    def __init__(self, estimated_blocks_per_worker: int = 200_000) -> None:
        self.capacity = estimated_blocks_per_worker
        self._exact: dict[str, set[int]] = {}
        self._estimated: dict[str, OrderedDict[int, None]] = {}

    def stored(self, worker_id: str, hashes: list[int]) -> None:
        self._exact.setdefault(worker_id, set()).update(hashes)

    def evicted(self, worker_id: str, hashes: list[int]) -> None:
        self._exact.setdefault(worker_id, set()).difference_update(hashes)

    def cleared(self, worker_id: str) -> None:
        self._exact[worker_id] = set()
        self._estimated.pop(worker_id, None)

    def routed(self, worker_id: str, hashes: list[int]) -> None:
        """A request with these prefix hashes was placed on ``worker_id``."""
        if worker_id in self._exact or not hashes:
            return
        cache = self._estimated.setdefault(worker_id, OrderedDict())
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.capacity:
            cache.popitem(last=False)

    def overlap(self, worker_id: str, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` that ``worker_id`` holds."""
        held = self._exact.get(worker_id)
        if held is None:
            held = self._estimated.get(worker_id, {})
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def is_exact(self, worker_id: str) -> bool:
        return worker_id in self._exact
