"""The prefill latency model: time = overhead + prompt tokens / rate, fitted by least squares."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_TOKENS_PER_S = 1e8
"""Ceiling of a fitted rate: a prefill that does not measurably grow with the prompt."""

MIN_OVERHEAD_S = 0.0


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """One engine's prefill: a fixed overhead plus the prompt at a steady token rate."""

    overhead_s: float
    tokens_per_s: float

    def seconds(self, prompt_tokens: int) -> float:
        """Predicted prefill time of a prompt of ``prompt_tokens`` on an idle engine."""
        return self.overhead_s + prompt_tokens / self.tokens_per_s

    def as_json(self) -> dict[str, float]:
        return {"prefill_overhead_s": self.overhead_s, "prefill_tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_json(cls, data: object) -> PrefillModel | None:
        """The model stored by :meth:`as_json`, or None when ``data`` does not hold one."""
        if not isinstance(data, dict):
            return None
        overhead = data.get("prefill_overhead_s")
        rate = data.get("prefill_tokens_per_s")
        if not _finite(overhead) or not _finite(rate):
            return None
        assert isinstance(overhead, (int, float)) and isinstance(rate, (int, float))
        if overhead < 0 or rate <= 0:
            return None
        return cls(float(overhead), float(rate))


DEFAULT_PREFILL = PrefillModel(overhead_s=0.02, tokens_per_s=10_000.0)
"""What an engine is assumed to do before its first profile (``open`` mode only)."""


class FitError(ValueError):
    """The measurements cannot give a prefill model."""


def fit_prefill(points: Sequence[tuple[int, float]]) -> PrefillModel:
    """Least-squares line through ``(prompt_tokens, seconds)`` points, by relative error.

    Each point is weighted by ``1 / seconds**2``, so a short prompt's 1 ms counts as much as
    a long prompt's 1 s would at the same relative error (probe noise is proportional, and
    short prompts are most of the traffic). The intercept is the overhead, the slope the
    seconds per token. A negative intercept (noise on a fast engine) refits through the
    origin; a slope that is not positive (the prompt length made no measurable difference)
    gives the ceiling rate and the mean time as overhead. Needs two distinct lengths.
    """
    clean = [(float(x), float(y)) for x, y in points if x >= 0 and _finite(y) and y > 0]
    if len({x for x, _ in clean}) < 2:
        raise FitError("need measurements at two or more prompt lengths")
    weights = [1.0 / (y * y) for _, y in clean]
    total = sum(weights)
    mean_x = sum(w * x for w, (x, _) in zip(weights, clean, strict=True)) / total
    mean_y = sum(w * y for w, (_, y) in zip(weights, clean, strict=True)) / total
    sxx = sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, clean, strict=True))
    sxy = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, clean, strict=True))
    slope = sxy / sxx
    if slope <= 1.0 / MAX_TOKENS_PER_S:
        return PrefillModel(max(MIN_OVERHEAD_S, mean_y), MAX_TOKENS_PER_S)
    intercept = mean_y - slope * mean_x
    if intercept < MIN_OVERHEAD_S:
        sxy0 = sum(w * x * y for w, (x, y) in zip(weights, clean, strict=True))
        sxx0 = sum(w * x * x for w, (x, _) in zip(weights, clean, strict=True))
        slope = max(sxy0 / sxx0, 1.0 / MAX_TOKENS_PER_S)
        intercept = MIN_OVERHEAD_S
    return PrefillModel(intercept, 1.0 / slope)


def _finite(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
