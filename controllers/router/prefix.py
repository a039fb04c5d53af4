"""Which prefix blocks each worker holds: exact from KV events, estimated from routing history.

A worker that publishes KV block events (the simulated engine does) is known exactly. A worker
that publishes none (a plain vLLM) is assumed to still hold the prefix blocks of the requests
recently routed to it, up to a bounded number of blocks per worker (least recently routed first
out), which approximates its LRU cache. An inverted index (block -> workers) finds the workers
holding the longest prefix of a request without looking at every worker.
"""

from collections import OrderedDict, defaultdict


class PrefixIndex:
    def __init__(self, estimated_blocks_per_worker: int = 200_000) -> None:
        self.capacity = estimated_blocks_per_worker
        self._exact: dict[str, set[int]] = {}
        self._estimated: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = defaultdict(set)

    def stored(self, worker_id: str, hashes: list[int]) -> None:
        self._exact_of(worker_id).update(hashes)
        holders = self._holders
        for h in hashes:
            holders[h].add(worker_id)

    def evicted(self, worker_id: str, hashes: list[int]) -> None:
        self._exact_of(worker_id).difference_update(hashes)
        unhold = self._unhold
        for h in hashes:
            unhold(h, worker_id)

    def cleared(self, worker_id: str) -> None:
        for h in self._exact.get(worker_id, ()):
            self._unhold(h, worker_id)
        self._exact[worker_id] = set()
        self._drop_estimates(worker_id)

    def forget(self, worker_id: str) -> None:
        """Know nothing of ``worker_id``'s cache (it stopped, or restarted empty): estimated
        again from routing history unless it publishes KV events."""
        self.cleared(worker_id)
        del self._exact[worker_id]

    def routed(self, worker_id: str, hashes: list[int]) -> None:
        """A request with these prefix hashes was placed on ``worker_id``."""
        if worker_id in self._exact or not hashes:
            return
        cache = self._estimated.setdefault(worker_id, OrderedDict())
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
            self._holders[h].add(worker_id)
        while len(cache) > self.capacity:
            h, _ = cache.popitem(last=False)
            self._unhold(h, worker_id)

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

    def deepest_holders(self, hashes: list[int]) -> set[str]:
        """Workers holding the deepest block of ``hashes`` that any worker holds (a shortlist:
        their overlap is the longest on offer, as chains share their leading blocks)."""
        for h in reversed(hashes):
            holders = self._holders.get(h)
            if holders:
                return holders
        return set()

    def is_exact(self, worker_id: str) -> bool:
        return worker_id in self._exact

    def _exact_of(self, worker_id: str) -> set[int]:
        """The blocks ``worker_id`` holds, known exactly: from its first KV event (a store or an
        eviction) its estimates are dropped, from the holders index too."""
        if worker_id in self._estimated:
            self._drop_estimates(worker_id)
        return self._exact.setdefault(worker_id, set())

    def _unhold(self, h: int, worker_id: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[h]

    def _drop_estimates(self, worker_id: str) -> None:
        for h in self._estimated.pop(worker_id, {}):
            if worker_id not in self._exact or h not in self._exact[worker_id]:
                self._unhold(h, worker_id)
