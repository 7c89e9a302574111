"""Per-request state from the moment a completion request's headers arrive."""

from __future__ import annotations

import secrets
from typing import Protocol

from narwhal._narwhal_fast import Board, Ticket
from narwhal.observe import Observation

UNLIMITED = 2**62
"""A model board's retention limit: the main board alone enforces the router's."""

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
        return tuple((raw, value.encode("latin-1"))
                     for name, raw in _FORWARDED if (value := get(name)))

    def ensure_request_id(self) -> str:
        """The client's ``X-Request-Id``, or a fresh one (16 hex digits, so an engine's
        response id reads ``chatcmpl-<16 hex>``) that every later attempt carries too."""
        rid = self.headers.get("x-request-id")
        if not rid:
            rid = self.headers["x-request-id"] = secrets.token_hex(8)
        return rid


class LatencySink(Protocol):
    """Where a request's latencies go: the board, or the board and its model's."""

    def observe(self, histogram: str, value: float) -> None: ...


class ModelBoard:
    """Per-model accounting of one request: a second ticket, on its model's board (every
    request with a model arrives and finishes there too), and its latencies observed on both
    boards. The main board's ticket keeps the unlabelled totals."""

    __slots__ = ("board", "main", "ticket")

    def __init__(self, main: Board, board: Board) -> None:
        self.main = main
        self.board = board
        self.ticket = board.arrive(UNLIMITED)[0]

    def observe(self, histogram: str, value: float) -> None:
        self.main.observe(histogram, value)
        self.board.observe(histogram, value)
