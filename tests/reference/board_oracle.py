"""A readable pure-Python model of the accounting board's transitions: the Rust board's oracle."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

REASONS = (
    "invalid_json",
    "invalid_request",
    "model_not_found",
    "invalid_sampling_width",
    "unsupported_option",
    "request_too_large",
    "retention_full",
    "queue_full",
    "admission_wait_expired",
    "deadline_expired",
    "ttft_budget_exceeded",
    "prompt_exceeds_ttft_budget",
    "backend_unavailable",
    "router_standby",
    "router_fenced",
    "maintenance",
    "monitoring_degraded",
    "engine_error",
    "unsupported_engine_field",
    "malformed_engine_output",
    "engine_rejected",
)
REASON_CLASSES = ("rejected", "refused", "invalid_requests", "expired", "failed")
BARE_CLASSES = ("cancelled", "completed")
PHASES = ("prefill", "decode")

_LATENCY: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
)
_LATENCY += (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
_E2E: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    7.5,
)
_E2E += (10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 450.0, 600.0)
_TPOT: tuple[float, ...] = (
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
)
_TPOT += (0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
BOUNDS: dict[str, tuple[float, ...]] = {
    "ttft": _LATENCY,
    "tpot": _TPOT,
    "queue_wait": _LATENCY,
    "e2e": _E2E,
    "output_tokens": tuple(float(2**i) for i in range(16)),
}


def check_terminal(cls: str, reason: str | None) -> None:
    """Raises ValueError as the board does for a bad class/reason pair."""
    if cls in BARE_CLASSES:
        if reason is not None:
            raise ValueError(f"terminal class {cls!r} takes no reason")
        return
    if cls not in REASON_CLASSES:
        raise ValueError(f"unknown terminal class {cls!r}")
    if reason is None:
        raise ValueError(f"terminal class {cls!r} needs a reason")
    if reason not in REASONS:
        raise ValueError(f"unknown reason {reason!r}")


@dataclass
class OracleHistogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, +Inf last
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # the first bound >= value (Prometheus `le`), else +Inf
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return {
            "buckets": list(zip((*self.bounds, math.inf), cumulative, strict=True)),
            "sum": self.total,
            "count": running,
        }


class BoardOracle:
    """The board's state and transitions, one Python attribute per Rust counter."""

    def __init__(self, engines: int = 256) -> None:
        if not 1 <= engines <= 65536:
            raise ValueError("engines")
        self.offered = self.retained = self.retention_held = self.queued = 0
        self.unsized_offered = self.offered_prompt_tokens = 0
        self.cancelled = self.completed = 0
        self.terminal = {cls: dict.fromkeys(REASONS, 0) for cls in REASON_CLASSES}
        self.inflight = [{phase: 0 for phase in PHASES} for _ in range(engines)]
        self.up = [False] * engines
        self.histograms = {name: OracleHistogram(b) for name, b in BOUNDS.items()}

    def arrive(self, retention_limit: int) -> tuple[OracleTicket, bool]:
        self.offered += 1
        self.retained += 1
        admitted = self.retention_held < retention_limit
        if admitted:
            self.retention_held += 1
        return OracleTicket(self, admitted), admitted

    def acquire_slot(self, engine: int, phase: str, limit: int,
                     total_limit: int | None = None) -> OracleSlot | None:
        if phase not in PHASES or not 0 <= engine < len(self.inflight):
            raise ValueError(f"engine {engine} / phase {phase!r}")
        if self.inflight[engine][phase] >= limit:
            return None
        if total_limit is not None and sum(self.inflight[engine].values()) >= total_limit:
            return None
        self.inflight[engine][phase] += 1
        return OracleSlot(self, engine, phase)

    def queued_now(self) -> int:
        return self.queued

    def inflight_of(self, engine: int) -> tuple[int, int]:
        if not 0 <= engine < len(self.inflight):
            raise ValueError(f"engine {engine}")
        return self.inflight[engine]["prefill"], self.inflight[engine]["decode"]

    def set_engine_up(self, engine: int, up: bool) -> None:
        if not 0 <= engine < len(self.up):
            raise ValueError(f"engine {engine}")
        self.up[engine] = up

    def observe(self, histogram: str, value: float) -> None:
        if histogram not in self.histograms or not math.isfinite(value):
            raise ValueError(f"{histogram!r} / {value!r}")
        self.histograms[histogram].observe(value)

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "offered": self.offered,
            "unsized_offered": self.unsized_offered,
            "offered_prompt_tokens": self.offered_prompt_tokens,
            "retained": self.retained,
            "retention_held": self.retention_held,
            "queued": self.queued,
            "cancelled": self.cancelled,
            "completed": self.completed,
        }
        for cls, counts in self.terminal.items():
            snap[cls] = {reason: n for reason, n in counts.items() if n > 0}
        snap["engines"] = [
            {"prefill": cell["prefill"], "decode": cell["decode"], "up": up}
            for cell, up in zip(self.inflight, self.up, strict=True)
        ]
        snap["histograms"] = {name: h.snapshot() for name, h in self.histograms.items()}
        snap["reaped"] = 0  # no dead workers in a single-process model
        snap["workers"] = 1
        snap["lock_steals"] = 0
        return snap


class OracleTicket:
    """One retained request; `drop()` stands for the Rust guard's drop."""

    def __init__(self, board: BoardOracle, admitted: bool) -> None:
        self.board = board
        self.admitted = admitted
        self.is_sized = False
        self.queued = False
        self.finished = False

    def sized(self, prompt_tokens: int) -> None:
        if self.is_sized or self.finished:
            return
        self.is_sized = True
        self.board.offered_prompt_tokens += prompt_tokens

    def enqueue(self, queue_limit: int) -> bool:
        if self.queued:
            return True
        if self.finished:
            return False
        if self.board.queued < queue_limit:
            self.board.queued += 1
            self.queued = True
        return self.queued

    def dequeue(self) -> None:
        if self.queued:
            self.board.queued -= 1
            self.queued = False

    def finish(self, cls: str, reason: str | None = None) -> bool:
        check_terminal(cls, reason)
        if self.finished:
            return False
        board = self.board
        if cls == "cancelled":
            board.cancelled += 1
        elif cls == "completed":
            board.completed += 1
        else:
            assert reason is not None
            board.terminal[cls][reason] += 1
        board.retained -= 1
        if self.admitted:
            board.retention_held -= 1
        self.dequeue()
        if not self.is_sized:
            board.unsized_offered += 1
        self.finished = True
        return True

    def drop(self) -> None:
        if not self.finished:
            self.finish("cancelled")


class OracleSlot:
    """One phase slot; `drop()` stands for the Rust guard's drop."""

    def __init__(self, board: BoardOracle, engine: int, phase: str) -> None:
        self.board, self.engine, self.phase = board, engine, phase
        self.released = False

    def release(self) -> bool:
        if self.released:
            return False
        self.board.inflight[self.engine][self.phase] -= 1
        self.released = True
        return True

    def drop(self) -> None:
        self.release()
