"""A paged KV cache with automatic prefix caching, as vLLM keeps it, counted in blocks.

Capacity is ``num_blocks`` blocks of ``block_size`` tokens. A request holds *private* blocks
(tokens not yet part of a full, hashed prefix block) and references to *cached entries*: full
prefix blocks identified by the hash chain of the prompt, then of the answer as it is generated
(a block cached once its tokens' KV is computed). An entry may span several engine blocks
(Mooncake's trace hashes 512-token blocks; the engine allocates 16-token blocks), so an entry
records how many engine blocks it holds.

An entry nobody references stays cached until its blocks are needed. Free blocks, cached or
not, wait in one queue in the order they were freed, as vLLM's free block queue keeps them, and
an allocation takes from its oldest end, evicting the cached entries it takes: a request's
blocks are freed in reverse (its private tail first, then its prefix from the end), so an
eviction takes the end of a prefix before its start. (Before 7 Dec blocks never cached were
taken first, whenever freed, and a cached entry was evicted only when none was left: the cache
kept entries longer than vLLM's, which evicts an entry freed before a block that was never
cached.) Stored and evicted hashes are recorded for KV events.
"""

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Entry:
    blocks: int
    refs: int = 0


@dataclass(slots=True, eq=False)
class _Free:
    """A run of free blocks never cached (or no longer), in the free queue (a key of its own)."""

    blocks: int


@dataclass
class KvCache:
    num_blocks: int
    block_size: int = 16
    free_blocks: int = field(init=False)
    queries_tokens: int = 0
    hits_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.free_blocks = 0  # (in runs of the queue: ``free``)
        self._entries: dict[int, _Entry] = {}
        #: the free queue, oldest first: unreferenced cached entries (by hash) and runs of
        #: blocks not cached (``_Free``)
        self._evictable: OrderedDict[int | _Free, None] = OrderedDict()
        self._evictable_blocks = 0  # (the cached entries')
        self.free(self.num_blocks)
        self.stored: list[int] = []
        self.evicted: list[int] = []

    @property
    def available_blocks(self) -> int:
        """Blocks that an allocation can get: free ones plus unreferenced cached ones."""
        return self.free_blocks + self._evictable_blocks

    @property
    def used_blocks(self) -> int:
        """Blocks referenced by running requests (cached but unreferenced blocks count as free)."""
        return self.num_blocks - self.available_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cached_prefix(self, hashes: tuple[int, ...], blocks: int) -> int:
        """How many leading hashes of ``hashes`` are cached as entries of ``blocks`` blocks (an
        id cached at another size, sent with another ``hash_block_size``, is another prefix)."""
        n = 0
        entries = self._entries
        for h in hashes:
            entry = entries.get(h)
            if entry is None or entry.blocks != blocks:
                break
            n += 1
        return n

    def record_query(self, queried_tokens: int, hit_tokens: int) -> None:
        self.queries_tokens += queried_tokens
        self.hits_tokens += hit_tokens

    def can_take(self, hashes: tuple[int, ...], blocks: int) -> bool:
        """Whether ``blocks`` private blocks can be allocated once the cached entries
        ``hashes`` are referenced (those nobody references are then no longer evictable)."""
        entries = self._entries
        taken = sum(entries[h].blocks for h in set(hashes) if entries[h].refs == 0)
        return blocks <= self.available_blocks - taken

    def acquire(self, hashes: tuple[int, ...]) -> None:
        """Reference cached entries (all must be cached)."""
        for h in hashes:
            entry = self._entries[h]
            if entry.refs == 0:
                del self._evictable[h]
                self._evictable_blocks -= entry.blocks
            entry.refs += 1

    def release(self, hashes: tuple[int, ...]) -> None:
        """Drop references to a request's leading entries ``hashes``; those nobody references
        become evictable, the chain's tail first, as vLLM frees a request's blocks in reverse
        (``KVCacheManager.free``): an eviction takes the end of a prefix and leaves its start to
        be hit, where taking the start first left every entry after it cached and unmatchable."""
        for h in reversed(hashes):
            entry = self._entries[h]
            entry.refs -= 1
            if entry.refs == 0:
                self._evictable[h] = None
                self._evictable_blocks += entry.blocks

    def allocate(self, blocks: int) -> bool:
        """Take ``blocks`` private blocks from the oldest end of the free queue, evicting the
        cached entries taken (an entry's blocks not needed stay free, at the queue's head)."""
        if blocks > self.free_blocks + self._evictable_blocks:  # available_blocks
            return False
        queue = self._evictable
        while blocks > 0:
            key = next(iter(queue))
            if type(key) is _Free:
                taken = min(key.blocks, blocks)
                key.blocks -= taken
                if not key.blocks:
                    del queue[key]
                self.free_blocks -= taken
                blocks -= taken
                continue
            del queue[key]
            entry = self._entries.pop(key)
            self._evictable_blocks -= entry.blocks
            self.evicted.append(key)
            if entry.blocks > blocks:
                rest = _Free(entry.blocks - blocks)
                queue[rest] = None
                queue.move_to_end(rest, last=False)
                self.free_blocks += rest.blocks
                blocks = 0
            else:
                blocks -= entry.blocks
        return True

    def free(self, blocks: int) -> None:
        """Blocks not cached given back: at the newest end of the free queue."""
        if blocks <= 0:
            return
        queue = self._evictable
        last = next(reversed(queue), None) if queue else None
        if type(last) is _Free:
            last.blocks += blocks  # (freed one after the other: one run)
        else:
            queue[_Free(blocks)] = None
        self.free_blocks += blocks
        assert self.free_blocks <= self.num_blocks, "freed more blocks than were allocated"

    def promote(self, h: int, blocks: int) -> bool | None:
        """Turn ``blocks`` private blocks of a request into the cached entry ``h``, referenced once.

        Returns False when another request cached ``h`` first: then the caller references that
        entry and the private blocks are freed here; None when that entry has another size (the
        id stood for another number of tokens): nothing changes, the blocks stay private.
        """
        entry = self._entries.get(h)
        if entry is not None:
            if entry.blocks != blocks:
                return None
            self.acquire((h,))
            self.free(blocks)
            return False
        self._entries[h] = _Entry(blocks, refs=1)
        self.stored.append(h)
        return True

    def by_unit(self, hashes: list[int]) -> dict[int, list[int]]:
        """Cached ``hashes`` (in order) by the tokens each stands for: its entry's blocks times
        the block size (a KV event's ``block_size`` is that unit, 512 tokens for Mooncake's
        hashes, not the engine's 16-token block)."""
        out: dict[int, list[int]] = {}
        for h in hashes:
            out.setdefault(self._entries[h].blocks * self.block_size, []).append(h)
        return out

    def drain_events(self) -> tuple[list[int], list[int]]:
        """The hashes stored and evicted since the last call, each once, as the cache stands
        now: a hash evicted and stored again in between is stored (sent as two lists, stored
        before evicted, it would have read as gone), one stored and evicted again is evicted."""
        entries = self._entries
        stored = [h for h in dict.fromkeys(self.stored) if h in entries]
        evicted = [h for h in dict.fromkeys(self.evicted) if h not in entries]
        self.stored, self.evicted = [], []
        return stored, evicted

    def clear(self, num_blocks: int | None = None) -> None:
        """Forget everything (a crash or a model switch), and hold ``num_blocks`` blocks from
        now on if given (another model's cache fits another number in the same memory). Only
        when no request holds a block."""
        self.evicted.extend(self._entries)
        self._entries.clear()
        self._evictable.clear()
        self._evictable_blocks = self.free_blocks = 0
        if num_blocks is not None:
            if num_blocks < 1:
                raise ValueError("num_blocks must be positive")
            self.num_blocks = num_blocks
        self.free(self.num_blocks)
