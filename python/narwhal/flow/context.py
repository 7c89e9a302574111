"""Per-request state from the moment a completion request's headers arrive."""

from __future__ import annotations

import secrets

from narwhal._narwhal_fast import Ticket
from narwhal.observe import Observation

UNLIMITED = 2**62
"""A model board's retention limit (per-model metrics): the main board alone enforces the
router's ``serving.http_retention_limit``."""

_FORWARDED = (("x-request-id", b"x-request-id"), ("traceparent", b"traceparent"),
              ("tracestate", b"tracestate"))
"""Client headers forwarded to engines: name as parsed, name as sent."""


class RequestContext:
    """One completion request: its accounting ticket (a Rust guard: finished exactly once,
    dropped unfinished it counts as cancelled), route, arrival and headers."""

    __slots__ = ("arrival", "headers", "obs", "prompt_tokens", "route", "ticket")

    def __init__(self, ticket: Ticket, route: str, arrival: float, headers: dict[str, str]):
        self.ticket = ticket
        self.route = route
        self.arrival = arrival
        self.headers = headers
        self.prompt_tokens = 0
        self.obs: Observation | None = None  # with the access log or tracing on

    def finish(self, cls: str, reason: str | None = None, status: int = 0) -> None:
        """Count the request's one outcome (the first call wins) and, when it is observed,
        write it out (``status``: the HTTP status answered, 0 for none)."""
        if self.ticket.finish(cls, reason) and self.obs is not None:
            self.obs.finish(cls, reason, status)

    def forward_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """Client headers every engine attempt carries: the request id and the W3C trace
        context (``traceparent``, ``tracestate``) as the client sent them (while tracing,
        each attempt replaces ``traceparent`` with its own span's)."""
        get = self.headers.get
        out: tuple[tuple[bytes, bytes], ...] = ()
        for name, raw in _FORWARDED:
            value = get(name)
            if value:
                out += ((raw, value.encode("latin-1")),)
        return out

    def ensure_request_id(self) -> str:
        """The client's ``X-Request-Id``, or a fresh one (16 hex digits, so an engine's
        response id reads ``chatcmpl-<16 hex>``) that every later attempt carries too."""
        rid = self.headers.get("x-request-id")
        if not rid:
            rid = self.headers["x-request-id"] = secrets.token_hex(8)
        return rid
