"""The simulated engine's automatic prefix cache, as vLLM's: full blocks of 16 token IDs,
each identified by the hash of its tokens chained to its parent block's hash, evicted least
recently used once the cache holds ``capacity_tokens``.

A prompt's cached tokens are its longest run of leading blocks found in the cache; vLLM
always computes at least the last prompt token, so a fully cached prompt still prefills
one block's worth less one token at most. Counters are vLLM's: queries and hits in tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16


def block_hashes(ids: Sequence[int], limit: int | None = None) -> list[int]:
    """The chained hashes of the prompt's full blocks (at most ``limit`` of them)."""
    full = len(ids) // BLOCK_TOKENS
    if limit is not None:
        full = min(full, limit)
    out: list[int] = []
    parent = 0
    for b in range(full):
        parent = hash((parent, tuple(ids[b * BLOCK_TOKENS : (b + 1) * BLOCK_TOKENS])))
        out.append(parent)
    return out


class PrefixCache:
    """Bounded LRU of block hashes; ``capacity_tokens`` 0 disables it."""

    __slots__ = ("_blocks", "capacity_blocks", "hits_total", "queries_total")

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(0, capacity_tokens) // BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries_total = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
        self.hits_total = 0  # of them found cached (vllm:prefix_cache_hits_total)

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def admit(self, ids: Sequence[int]) -> int:
        """Look the prompt up, then cache its full blocks (they are computed now); return
        the cached tokens (a multiple of the block size, less than the prompt's length)."""
        if not self.enabled or not ids:
            return 0
        hashes = block_hashes(ids)
        blocks = self._blocks
        hit = 0
        for h in hashes:
            if h not in blocks:
                break
            hit += 1
        cached = min(hit * BLOCK_TOKENS, ((len(ids) - 1) // BLOCK_TOKENS) * BLOCK_TOKENS)
        self.queries_total += len(ids)
        self.hits_total += cached
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return cached

    def clear(self) -> None:
        self._blocks.clear()
