"""The learned latency model of the fleet: what the relay reports, what admission asks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.metrics_core import Metric

from narwhal.fleet.engine import Engine


class Learning:
    """Receives measurements from the relay and answers projections (issue: learning)."""

    def __init__(self, engines: Sequence[Engine]):
        self.engines = engines

    def on_first_token(self, engine: Engine, prompt_tokens: int, prefill_s: float) -> None:
        """First generated token of a request ``prefill_s`` after dispatch to ``engine``."""

    def on_end(
        self,
        engine: Engine,
        route: str,
        max_tokens: int | None,
        output_tokens: int,
        decode_s: float,
    ) -> None:
        """A request ended having generated ``output_tokens`` over ``decode_s`` of decode."""

    def metric_families(self) -> list[Metric]:
        """Learned-model metric families for /metrics (e.g. drift per engine)."""
        return []

    def describe(self, engine: Engine) -> dict[str, Any] | None:
        """The ``learned`` object of ``/engines``."""
        return None
