"""Which engines can take a request's prefill in a fleet that may be disaggregated."""

from __future__ import annotations

from collections.abc import Sequence

from narwhal.fleet.engine import Engine
from narwhal.request.models import Served


def usable(engines: Sequence[Engine], served: Served | None = None) -> list[Engine]:
    """Serving engines that can take a request's prefill slot: mixed engines, and prefill
    engines while some decode engine serves (decode engines are chosen as partners); with
    ``served``, only engines that serve that model or adapter."""
    if served is None or served.engines is None:
        serving = [e for e in engines if e.serves()]
    else:
        where = served.engines
        serving = [e for e in engines if e.index in where and e.serves()]
    decoders = any(e.config.role == "decode" for e in serving)
    return [e for e in serving
            if e.config.role == "mixed" or (e.config.role == "prefill" and decoders)]
