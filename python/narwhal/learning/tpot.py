"""TPOT scoring: per-attempt time per output token, and each engine's TPOT model.

An engine read that carries k validated token IDs spreads the gap since the previous read
over its k tokens, so one attempt's TPOT is the time from its first read to its last over
the tokens that arrived after the first read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FORGET = 0.95
"""Weight kept by past observations at each new one (an EWMA with alpha 0.05): small
changes are followed within a few dozen requests; a large one stays visible as drift
long enough to re-profile the engine."""

MIN_BATCH_VARIANCE = 0.25
"""Below this spread of batch sizes the growth term is not identifiable and keeps its value."""

PROFILE_WEIGHT = 2.0
"""How many ordinary observations a profile's measurement is worth."""


def attempt_tpot(first_at: float, last_at: float, tokens: int, first_tokens: int) -> float | None:
    """TPOT of one decode attempt, or None when fewer than two reads carried tokens.

    ``tokens`` validated IDs arrived in all; ``first_tokens`` of them in the first read
    (at ``first_at``); the last read came at ``last_at``.
    """
    later = tokens - first_tokens
    if later <= 0 or not last_at > first_at:
        return None
    return (last_at - first_at) / later


def reads_tpot(reads: Sequence[tuple[float, int]]) -> float | None:
    """TPOT from ``(arrival time, tokens in that read)`` pairs, in arrival order."""
    if len(reads) < 2:
        return None
    return attempt_tpot(reads[0][0], reads[-1][0], sum(k for _, k in reads), reads[0][1])


class TpotModel:
    """``tpot(n) = base + growth * (n - 1)``, n the requests decoding on the engine at once.

    Fitted by least squares with exponential forgetting over ``(n, tpot)`` observations:
    with one batch size it is the EWMA of TPOT; when batch sizes vary, the growth term
    (what each extra request in the batch adds) is learned too and never goes negative.
    """

    __slots__ = ("_s0", "_s1", "_s2", "_t0", "_t1", "base_s", "growth_s", "samples")

    def __init__(self, base_s: float | None = None, growth_s: float = 0.0) -> None:
        self.base_s = base_s
        self.growth_s = growth_s
        self.samples = 0
        self._s0 = self._s1 = self._s2 = self._t0 = self._t1 = 0.0
        if base_s is not None:
            self._seed(0.0, base_s, PROFILE_WEIGHT)

    def predict(self, batch: float = 1.0) -> float | None:
        """Expected TPOT with ``batch`` requests decoding; None before any measurement."""
        if self.base_s is None:
            return None
        return self.base_s + self.growth_s * max(0.0, batch - 1.0)

    def observe(self, tpot_s: float, batch: float = 1.0) -> None:
        """One decode attempt's TPOT, measured while ``batch`` requests decoded on average."""
        if not (math.isfinite(tpot_s) and tpot_s > 0 and math.isfinite(batch)):
            return
        x = max(0.0, batch - 1.0)
        if self.base_s is None:
            self._seed(x, tpot_s, 1.0)
        else:
            self._s0 = FORGET * self._s0 + 1.0
            self._s1 = FORGET * self._s1 + x
            self._s2 = FORGET * self._s2 + x * x
            self._t0 = FORGET * self._t0 + tpot_s
            self._t1 = FORGET * self._t1 + x * tpot_s
        self.samples += 1
        self._solve()

    def reset(self, tpot_s: float, batch: float = 1.0) -> None:
        """A profile measured ``tpot_s`` at ``batch``: start over from it, keeping the growth."""
        self._seed(max(0.0, batch - 1.0), tpot_s, PROFILE_WEIGHT)
        self._solve()

    def _seed(self, x: float, y: float, weight: float) -> None:
        self._s0, self._s1, self._s2 = weight, weight * x, weight * x * x
        self._t0, self._t1 = weight * y, weight * x * y
        self.base_s = max(1e-9, y - self.growth_s * x)

    def _solve(self) -> None:
        s0 = self._s0
        mean_x, mean_y = self._s1 / s0, self._t0 / s0
        var_x = self._s2 / s0 - mean_x * mean_x
        growth = self.growth_s
        if var_x > MIN_BATCH_VARIANCE:
            growth = max(0.0, (self._t1 / s0 - mean_x * mean_y) / var_x)
        base = mean_y - growth * mean_x
        if base < 0.05 * mean_y:  # the line would say a lone request decodes for free
            base, growth = mean_y, 0.0
        self.base_s, self.growth_s = base, growth
