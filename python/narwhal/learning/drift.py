"""Drift scoring: an EWMA of the relative error between observed and predicted latency."""

from __future__ import annotations

import math

ALPHA = 0.2
"""Weight of the newest observation in the EWMA."""

MAX_ERROR = 2.0
"""One observation counts at most this much, so a single outlier (a GC pause, a network
hiccup) moves the score by ``ALPHA * MAX_ERROR`` = 0.4, under the default threshold of 0.5:
only drift that lasts (two or more large errors running) crosses it."""


class Drift:
    """How far an engine's measurements are from its model: 0 = perfect, 1 = off by 100%.

    ``floor_s`` keeps tiny predictions from turning millisecond jitter into huge relative
    errors: the error is ``|observed - predicted| / max(predicted, floor_s)``.
    """

    __slots__ = ("floor_s", "samples", "value")

    def __init__(self, floor_s: float) -> None:
        self.floor_s = floor_s
        self.value = 0.0
        self.samples = 0  # observations since the last reset

    def observe(self, observed_s: float, predicted_s: float) -> float:
        """Score one observation against its prediction; return the new drift."""
        if not (math.isfinite(observed_s) and math.isfinite(predicted_s)):
            return self.value
        error = abs(observed_s - predicted_s) / max(predicted_s, self.floor_s)
        self.value += ALPHA * (min(error, MAX_ERROR) - self.value)
        self.samples += 1
        return self.value

    def exceeds(self, threshold: float, min_samples: int = 2) -> bool:
        """Sustained drift: over ``threshold`` after at least ``min_samples`` observations."""
        return self.samples >= min_samples and self.value > threshold

    def reset(self) -> None:
        """A fresh model: nothing observed against it yet."""
        self.value = 0.0
        self.samples = 0
