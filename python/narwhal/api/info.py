"""Information routes: ``/health``, ``/ready``, ``/metrics``, ``/engines``, ``/v1/models``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from prometheus_client.registry import CollectorRegistry

from narwhal._narwhal_fast import Board
from narwhal.api.metrics import CONTENT_TYPE, render
from narwhal.errors.table import READY_REASONS
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.server.http import Responder

INFO_ROUTES = frozenset({"/health", "/ready", "/metrics", "/engines", "/v1/models"})


class Lifecycle:
    """Where the router is in its life: set by the composition root, read by ``/ready``."""

    __slots__ = ("draining", "started")

    def __init__(self) -> None:
        self.started = False
        self.draining = False


class InfoRoutes:
    """Answers the information routes from the collaborators that know the facts."""

    def __init__(
        self,
        model: str,
        board: Board,
        engines: Sequence[Engine],
        learning: Learning,
        registry: CollectorRegistry,
        lifecycle: Lifecycle,
        *,
        state_refusal: Callable[[], str | None],
        eligible: Callable[[], Sequence[Engine]],
    ):
        self.board = board
        self.engines = engines
        self.learning = learning
        self.registry = registry
        self.lifecycle = lifecycle
        self.state_refusal = state_refusal
        self.eligible = eligible
        card = {"id": model, "object": "model", "created": int(time.time()),
                "owned_by": "narwhal", "root": model, "parent": None}
        self._models = orjson.dumps({"object": "list", "data": [card]})

    def ready_reason(self) -> str | None:
        """Why the router is not ready (SPEC §3), or None."""
        if self.lifecycle.draining:
            return "draining"
        if not self.lifecycle.started:
            return "starting"
        code = self.state_refusal()
        if code is not None:
            return READY_REASONS.get(code, code)
        if not self.eligible():
            return "no_eligible_engines"
        return None

    def handle(self, path: str, responder: Responder) -> None:
        if path == "/health":
            responder.send(200, b'{"status":"ok"}')
        elif path == "/ready":
            reason = self.ready_reason()
            if reason is None:
                responder.send(200, b'{"ready":true}')
            else:
                responder.send(503, orjson.dumps({"ready": False, "reason": reason}))
        elif path == "/metrics":
            responder.send(200, render(self.registry), content_type=CONTENT_TYPE)
        elif path == "/engines":
            responder.send(200, orjson.dumps({"engines": self.describe_engines()}))
        else:
            responder.send(200, self._models)

    def describe_engines(self) -> list[dict[str, Any]]:
        board = self.board
        out = []
        for engine in self.engines:
            prefill, decode = board.inflight(engine.index)
            described = engine.describe({"prefill": prefill, "decode": decode})
            described["learned"] = self.learning.describe(engine)
            out.append(described)
        return out
