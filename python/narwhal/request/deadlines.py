"""A request's deadlines: when its response headers must go out, and when it must end (SPEC §4)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

_WHOLE_REQUEST_HEADERS = ("x-request-timeout", "x-stainless-timeout")
_HEADER_ONLY_HEADERS = ("x-stainless-read-timeout",)


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 and math.isfinite(seconds) else None


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Loop times by which response headers must go out, and by which the request must end."""

    headers_by: float
    total: float

    @classmethod
    def from_headers(
        cls, headers: Mapping[str, str], arrival: float, default_timeout_s: float
    ) -> Deadlines:
        whole = [s for h in _WHOLE_REQUEST_HEADERS if (s := _seconds(headers.get(h))) is not None]
        total = arrival + (min(whole) if whole else default_timeout_s)
        first_byte = [s for h in _HEADER_ONLY_HEADERS if (s := _seconds(headers.get(h)))]
        headers_by = min([total] + [arrival + s for s in first_byte])
        return cls(headers_by, total)
