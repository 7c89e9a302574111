"""Which engines can take a request's prefill in a fleet that may be disaggregated."""

from __future__ import annotations

from collections.abc import Sequence

from narwhal.fleet.engine import Engine


def usable(engines: Sequence[Engine]) -> list[Engine]:
    """Serving engines that can take a request's prefill slot: mixed engines, and prefill
    engines while some decode engine serves (decode engines are chosen as partners)."""
    serving = [e for e in engines if e.serves()]
    decoders = any(e.config.role == "decode" for e in serving)
    return [e for e in serving
            if e.config.role == "mixed" or (e.config.role == "prefill" and decoders)]
