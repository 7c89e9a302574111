"""A readable pure-Python model of the per-engine prefix index (rust/narwhal_core/src/prefix.rs)."""

from __future__ import annotations

from collections import OrderedDict

MASK = (1 << 64) - 1
SEED = 0xCBF29CE484222325
MUL = 0x9E3779B97F4A7C15
FIN = 0xFF51AFD7ED558CCD


def chunk_size(chunk_bytes: int) -> int:
    return -(-max(8, chunk_bytes) // 8) * 8


def chunk_hashes(text: bytes, chunk_bytes: int) -> list[int]:
    """Each full chunk's hash, chained: it starts from the previous chunk's."""
    size = chunk_size(chunk_bytes)
    out: list[int] = []
    parent = SEED
    for start in range(0, len(text) - size + 1, size):
        h = parent
        for at in range(start, start + size, 8):
            h = ((h ^ int.from_bytes(text[at : at + 8], "little")) * MUL) & MASK
            h ^= h >> 32
        h ^= h >> 29
        h = (h * FIN) & MASK
        h ^= h >> 32
        out.append(h)
        parent = h
    return out


class PrefixProbe:
    def __init__(self, hashes: list[int], matched: list[int]) -> None:
        self.hashes = hashes
        self._matched = matched

    @property
    def chunks(self) -> int:
        return len(self.hashes)

    def matched(self, engine: int) -> int:
        return self._matched[engine] if 0 <= engine < len(self._matched) else 0


class _Held:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()  # least recently placed first
        self.placed = 0
        self.matched_total = 0

    def matched(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.lru:
                break
            n += 1
        return n

    def insert(self, hashes: list[int]) -> int:
        matched = self.matched(hashes)
        self.placed += len(hashes)
        self.matched_total += matched
        if self.capacity == 0:
            return matched
        for h in hashes[max(0, len(hashes) - self.capacity):]:
            self.lru[h] = None
            self.lru.move_to_end(h)
        self.evict()
        return matched

    def evict(self) -> None:
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)


class PrefixIndex:
    def __init__(self, capacities: list[int], chunk_bytes: int = 64) -> None:
        self.chunk_bytes = chunk_size(chunk_bytes)
        self._engines = [_Held(c) for c in capacities]

    def probe(self, text: str) -> PrefixProbe:
        hashes = chunk_hashes(text.encode("utf-8", "surrogatepass"), self.chunk_bytes)
        matched = [e.matched(hashes) for e in self._engines] if hashes else []
        return PrefixProbe(hashes, matched)

    def insert(self, engine: int, probe: PrefixProbe) -> int:
        if not 0 <= engine < len(self._engines):
            return 0
        return self._engines[engine].insert(probe.hashes)

    def forget(self, engine: int, probe: PrefixProbe, keep: int) -> None:
        if 0 <= engine < len(self._engines):
            for h in probe.hashes[keep:]:
                self._engines[engine].lru.pop(h, None)

    def set_capacity(self, engine: int, capacity: int) -> None:
        if 0 <= engine < len(self._engines):
            self._engines[engine].capacity = capacity
            self._engines[engine].evict()

    def state(self, engine: int) -> tuple[int, int, int, int] | None:
        if not 0 <= engine < len(self._engines):
            return None
        e = self._engines[engine]
        return len(e.lru), e.capacity, e.placed, e.matched_total
