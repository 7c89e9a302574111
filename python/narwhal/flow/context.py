"""Per-request state from the moment a completion request's headers arrive."""

from __future__ import annotations

import secrets
from typing import Protocol

from narwhal._narwhal_fast import Board, Ticket

UNLIMITED = 2**62
"""A model board's retention limit: the main board alone enforces the router's."""


class RequestContext:
    """One completion request: its accounting ticket (a Rust guard: finished exactly once,
    dropped unfinished it counts as cancelled), route, arrival and headers."""

    __slots__ = ("arrival", "headers", "prompt_tokens", "route", "ticket")

    def __init__(self, ticket: Ticket, route: str, arrival: float, headers: dict[str, str]):
        self.ticket = ticket
        self.route = route
        self.arrival = arrival
        self.headers = headers
        self.prompt_tokens = 0

    def forward_headers(self) -> tuple[tuple[bytes, bytes], ...]:
        """Client headers every engine attempt carries (the request id)."""
        request_id = self.headers.get("x-request-id")
        if request_id:
            return ((b"x-request-id", request_id.encode("latin-1")),)
        return ()

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
