"""What is learned about one engine: its models, drift scores, profile bookkeeping and load.

Shared by the facade (``model.py``), which scores measurements into it, and the supervisor
(``supervisor.py``), which profiles the engine and saves and restores it; neither imports the
other.
"""

from __future__ import annotations

import math

from narwhal.fleet.engine import Engine
from narwhal.learning.drift import Drift
from narwhal.learning.latency import PrefillModel
from narwhal.learning.occupancy import EngineLoad
from narwhal.learning.tpot import TpotModel

TTFT_DRIFT_FLOOR_S = 0.02
"""Prefill predictions below this count as this much when scoring drift (jitter guard)."""
TPOT_DRIFT_FLOOR_S = 0.002


class EngineLearned:
    """Everything learned about one engine, and its projected load in this process."""

    __slots__ = ("drift_tpot", "drift_ttft", "due", "engine", "error", "failures",
                 "last_prefill", "load", "outcomes", "prefill", "profile_reason", "profiled_at",
                 "profiled_mono", "profiles", "profiling", "retry_at", "tpot", "wanted_at")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.prefill: PrefillModel | None = None
        self.tpot = TpotModel()
        self.drift_ttft = Drift(TTFT_DRIFT_FLOOR_S)
        self.drift_tpot = Drift(TPOT_DRIFT_FLOOR_S)
        self.load = EngineLoad()
        self.profiled_at: float | None = None  # Unix time of the last profile
        self.profiled_mono = -math.inf
        self.profile_reason: str | None = None  # join | drift_ttft | drift_tpot | restored
        self.profiles = 0
        self.failures = 0  # failed profiles since the last good one
        self.error: str | None = None  # why the last profile failed
        self.profiling = False
        self.due: str | None = None  # why a re-profile is wanted
        self.wanted_at = 0.0  # Unix time it became wanted
        self.retry_at = 0.0  # monotonic time before which no profile is tried
        self.last_prefill: tuple[float, float] | None = None  # (predicted, observed) seconds
        self.outcomes = [0, 0]  # finished profiles: [ok, failed]

    def profiled(self) -> bool:
        return self.prefill is not None
