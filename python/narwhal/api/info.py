"""Information routes: ``/health``, ``/ready``, ``/metrics``, ``/engines``, ``/v1/models``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson
from prometheus_client.registry import CollectorRegistry

from narwhal._narwhal_fast import Board
from narwhal.api.metrics import CONTENT_TYPE, render
from narwhal.cluster.sync import ClusterSync
from narwhal.errors.table import READY_REASONS
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.request.models import Catalog
from narwhal.server.exchange import Responder

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
        catalog: Catalog,
        board: Board,
        engines: Sequence[Engine],
        learning: Learning,
        registry: CollectorRegistry,
        lifecycle: Lifecycle,
        *,
        state_refusal: Callable[[], str | None],
        eligible: Callable[[], Sequence[Engine]],
        leaving: Sequence[Engine] = (),
        cluster: ClusterSync | None = None,
    ):
        """``engines``: the fleet's live list; ``leaving``: engines removed from it whose
        requests are still finishing (shown as ``removing``)."""
        self.board = board
        self.engines = engines
        self.leaving = leaving
        self.learning = learning
        self.registry = registry
        self.lifecycle = lifecycle
        self.state_refusal = state_refusal
        self.eligible = eligible
        self.catalog = catalog
        self.cluster = cluster  # several routers sharing the fleet: quotas, degraded sharing
        self._models = b""
        self._models_version = -1

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
            body: dict[str, Any] = {"engines": self.describe_engines()}
            if self.cluster is not None:
                body["cluster"] = self.cluster.describe()
            responder.send(200, orjson.dumps(body))
        else:
            responder.send(200, self.models())

    def models(self) -> bytes:
        """``GET /v1/models``: every servable name (models, aliases, adapters with their
        ``parent``), rebuilt only when the catalog changed."""
        catalog = self.catalog
        if self._models_version != catalog.version:
            self._models = orjson.dumps({"object": "list", "data": catalog.cards()})
            self._models_version = catalog.version
        return self._models

    def describe_engines(self) -> list[dict[str, Any]]:
        board, catalog, learning = self.board, self.catalog, self.learning
        out = []
        for engine in (*self.engines, *self.leaving):
            prefill, decode = board.inflight(engine.index)
            described = engine.describe({"prefill": prefill, "decode": decode},
                                        catalog.names_on(engine.index))
            learned = described["learned"] = learning.describe(engine)
            if learned is not None:
                learned["output_length_by_model"] = {
                    served.name: learning.output.describe(learning.lengths(served))
                    for served in catalog.served_on(engine.index)}
            prefix = learning.prefix
            described["prefix_index"] = prefix.describe(engine) if prefix is not None else None
            if self.cluster is not None:
                described["cluster"] = self.cluster.describe_engine(engine)
            out.append(described)
        return out
