"""W3C Trace Context: reading a client's ``traceparent``, new trace and span IDs, the sampling
decision, and the ``traceparent`` an engine attempt carries."""

from __future__ import annotations

import random

_bits = random.getrandbits  # the module's generator (reseeded in a forked child)
_RATIO_MASK = (1 << 64) - 1
_HEX = frozenset("0123456789abcdef")


class TraceContext:
    """One request's place in a trace: its trace, the span Narwhal's server span continues
    (``parent_id``, 0 when Narwhal starts the trace), its own server span, whether it is
    sampled, and the client's ``tracestate`` (forwarded unchanged)."""

    __slots__ = ("parent_id", "sampled", "span_id", "state", "trace_id")

    def __init__(self, trace_id: int, parent_id: int, sampled: bool, state: str | None) -> None:
        self.trace_id = trace_id
        self.parent_id = parent_id
        self.span_id = _bits(64) or 1  # never 0, the invalid ID
        self.sampled = sampled
        self.state = state

    def traceparent(self, span_id: int) -> bytes:
        """The ``traceparent`` naming ``span_id`` (an attempt's span) as the engine's parent."""
        return b"00-%032x-%016x-%s" % (self.trace_id, span_id, b"01" if self.sampled else b"00")


def new_span_id() -> int:
    """A random span ID (never 0, the invalid ID)."""
    return _bits(64) or 1


def parse_traceparent(value: str) -> tuple[int, int, bool] | None:
    """``(trace_id, parent span id, sampled)`` of a valid version-00-compatible header,
    else None (a malformed header starts a new trace, as the W3C recommendation says)."""
    parts = value.strip().split("-")
    if len(parts) < 4:
        return None
    version, trace, span, flags = parts[0], parts[1], parts[2], parts[3]
    if (len(version) != 2 or version == "ff" or len(trace) != 32 or len(span) != 16
            or len(flags) != 2 or (version == "00" and len(parts) != 4)
            or not _HEX.issuperset(version + trace + span + flags)):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


class Sampler:
    """Parent-based sampling with a trace-ID ratio at the root, as the OpenTelemetry SDK's
    ``ParentBased(TraceIdRatioBased(ratio))``: a client's sampled flag decides its traces;
    a trace Narwhal starts is sampled when its ID's low 64 bits fall under the ratio."""

    __slots__ = ("bound",)

    def __init__(self, ratio: float) -> None:
        self.bound = round(ratio * (1 << 64))

    def start(self, headers: dict[str, str]) -> TraceContext:
        """The trace a request joins (its client's) or starts."""
        raw = headers.get("traceparent")
        parent = parse_traceparent(raw) if raw is not None else None
        if parent is not None:
            trace_id, parent_id, sampled = parent
            return TraceContext(trace_id, parent_id, sampled, headers.get("tracestate"))
        trace_id = _bits(128) or 1
        return TraceContext(trace_id, 0, (trace_id & _RATIO_MASK) < self.bound, None)
