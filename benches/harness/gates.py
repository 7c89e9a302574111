"""Regression gates: Narwhal against references measured in the same run, as ratios.

Ratios of two measurements taken seconds apart on one machine hold on a fast laptop and on
a loaded CI runner alike, and the limits sit far from today's figures (see
docs/performance.md) so only a real regression trips them:

* throughput: Narwhal's tokens/s at least half of direct's (engine-paced, closed loop);
* first token: Narwhal's TTFT p50 at most 3x direct's (Nagle on a socket, or a timer in
  the dispatch path, adds 20-40 ms and trips it);
* per token: Narwhal's ITL p50 at most 1.5x direct's (tokens held back and sent in bursts);
* CPU: the router's CPU per token at most 4x this load generator's, which parses the very
  same stream on the same loop (uvloop + httptools + orjson), so both scale with the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .measure import Phase

MIN_TOKENS_VS_DIRECT = 0.5
MAX_TTFT_P50_VS_DIRECT = 3.0
MAX_ITL_P50_VS_DIRECT = 1.5
MAX_CPU_VS_CLIENT = 4.0


@dataclass(frozen=True)
class Gate:
    name: str
    value: float
    limit: float
    higher_is_better: bool

    @property
    def ok(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def __str__(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "ok  " if self.ok else "FAIL"
        return f"{verdict} {self.name}: {self.value:.3f} (limit {op} {self.limit})"


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else float("nan")


def check(direct: Phase, narwhal: Phase) -> list[Gate]:
    """The gates for one load, Narwhal against the direct phase paired with it."""
    n = narwhal.streams
    return [
        Gate(
            f"tokens/s vs direct at {n} streams",
            _div(narwhal.tokens_per_s, direct.tokens_per_s),
            MIN_TOKENS_VS_DIRECT,
            True,
        ),
        Gate(
            f"TTFT p50 vs direct at {n} streams",
            _div(narwhal.ttft_p50_ms, direct.ttft_p50_ms),
            MAX_TTFT_P50_VS_DIRECT,
            False,
        ),
        Gate(
            f"ITL p50 vs direct at {n} streams",
            _div(narwhal.itl_p50_ms, direct.itl_p50_ms),
            MAX_ITL_P50_VS_DIRECT,
            False,
        ),
        Gate(
            f"router CPU per token vs the load generator's at {n} streams",
            _div(narwhal.cpu_s_per_1k_tokens, narwhal.client_cpu_s_per_1k_tokens),
            MAX_CPU_VS_CLIENT,
            False,
        ),
    ]
