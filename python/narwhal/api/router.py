"""The router application: route table, accounting at arrival, and the completion flow."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from narwhal._narwhal_fast import Board, Ticket
from narwhal.admission.gate import AdmissionQueue
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.admission.sizing import Sizer, make_sizer
from narwhal.api.admin import AdminApi
from narwhal.api.auth import PROTECTED_ROUTES, ClientAuth
from narwhal.api.metrics import BoardCollector, render
from narwhal.config import Config
from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.fleet.health import HealthMonitor
from narwhal.fleet.state import RouterState
from narwhal.flow.relay import Relay
from narwhal.learning import Learning
from narwhal.request.deadlines import Deadlines
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler
from narwhal.server.http import EarlyResponse, Request, Responder
from narwhal.server.responses import error_body, refusal_response
from narwhal.upstream.client import EngineClient

log = logging.getLogger("narwhal.router")

COMPLETION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
INFO_ROUTES = frozenset({"/health", "/ready", "/metrics", "/engines", "/v1/models"})


class RequestContext:
    """Per-request accounting state, created when a completion request's headers arrive."""

    __slots__ = ("arrival", "headers", "prompt_tokens", "route", "ticket")

    def __init__(self, ticket: Ticket, route: str, arrival: float, headers: dict[str, str]):
        self.ticket = ticket
        self.route = route
        self.arrival = arrival
        self.headers = headers
        self.prompt_tokens = 0


_AUTH_MESSAGE = "A valid API key is required (Authorization: Bearer <key>)."


def _early(ref: Refusal, *, close: bool = False) -> EarlyResponse:
    status, headers, body = refusal_response(ref)
    return EarlyResponse(status, body, headers, close=close)


class Router:
    """Implements the HTTP server's App protocol for Narwhal."""

    def __init__(self, config: Config, board: Board, *, sizer: Sizer | None = None):
        self.config = config
        self.board = board
        self.engines: list[Engine] = []
        for index, engine_config in enumerate(config.engines):
            headers: list[tuple[bytes, bytes]] = []
            if engine_config.api_key:
                headers.append((b"authorization", f"Bearer {engine_config.api_key}".encode()))
            client = EngineClient(engine_config.url, headers=headers)
            self.engines.append(Engine(index, engine_config, client))
        self.learning = Learning(self.engines, config, shared_path=board.path)
        self.scheduler = Scheduler(
            self.engines, board, self.learning, policy=config.scheduling.policy,
            predictive=config.admission.mode == "predictive",
            prefix_chars=config.scheduling.affinity_prefix_chars,
        )
        self.predictive = PredictiveAdmission(config.admission, self.learning, self.scheduler)
        self.queue = AdmissionQueue(
            self.scheduler, config.admission.queue_limit, config.admission.max_wait_s
        )
        self.sizer: Sizer = sizer or make_sizer(
            config.admission.sizing, self.engines, config.tokenizer
        )
        self.health = HealthMonitor(self.engines, config.health, self._engine_changed)
        self.state = RouterState(config, self.engines, self.health)
        self.learning.on_profiled = self._engine_changed
        self.admin = AdminApi(self)
        keys = config.auth.api_keys
        self.auth = ClientAuth(keys) if keys is not None else None
        self.collector = BoardCollector(
            board, lambda: [e.name for e in self.engines], extra=self._metric_families
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.started = False
        self.draining = False
        self.created = int(time.time())

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.health.probe_all()
        self.health.start()
        await self.state.start()
        await self.learning.start()
        self.started = True

    async def stop(self) -> None:
        await self.learning.stop()
        await self.state.stop()
        await self.health.stop()
        await asyncio.gather(*(e.client.close() for e in self.engines))

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        """SIGTERM: ``/ready`` says draining, and a held HA lease goes to the standby now."""
        self._draining = value
        if value:
            self.state.step_down()

    def _engine_changed(self, engine: Engine) -> None:
        self.board.set_engine_up(engine.index, engine.serves())
        self.learning.engine_changed(engine)
        if engine.serves():
            self.queue.kick()

    # -- router state ----------------------------------------------------------------------
    def state_refusal(self) -> str | None:
        """The router-state refusal code in force, if any (SPEC §4 last row)."""
        return self.state.refusal()

    def ready_reason(self) -> str | None:
        if self.draining:
            return "draining"
        if not self.started:
            return "starting"
        code = self.state_refusal()
        if code is not None:
            return {"router_standby": "standby", "router_fenced": "fenced"}.get(code, code)
        if not self.scheduler.eligible():
            return "no_eligible_engines"
        return None

    # -- App protocol ----------------------------------------------------------------------
    def on_headers(self, request: Request) -> None:
        # Refused before accounting: a request without a valid client key is not a
        # completion the router takes (not offered, not counted).
        auth = self.auth
        if auth and request.path in PROTECTED_ROUTES and not auth.allows(
            request.headers.get("authorization")
        ):
            raise _early(Refusal("unauthorized", _AUTH_MESSAGE))
        route = COMPLETION_ROUTES.get(request.path)
        if route is None or request.method != "POST":
            return
        ticket, within_limit = self.board.arrive(self.config.serving.http_retention_limit)
        ctx = RequestContext(ticket, route, request.arrival, request.headers)
        request.state = ctx
        code = self.state_refusal()
        if code is None and not within_limit:
            code = "retention_full"
        if code is not None:
            ref = Refusal(code)
            ticket.finish(ref.row.counter or "rejected", code)
            raise _early(ref)
        length = request.headers.get("content-length")
        if (
            length is not None
            and length.isdigit()
            and int(length) > self.config.serving.max_request_bytes
        ):
            ticket.finish("invalid_requests", "request_too_large")
            raise _early(Refusal("request_too_large"), close=True)

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        ref = Refusal("request_too_large")
        if isinstance(request.state, RequestContext):
            request.state.ticket.finish("invalid_requests", "request_too_large")
        return _early(ref, close=True)

    def on_abandon(self, request: Request) -> None:
        if isinstance(request.state, RequestContext):
            request.state.ticket.finish("cancelled")

    async def handle(self, request: Request, responder: Responder) -> None:
        ctx = request.state
        if isinstance(ctx, RequestContext):
            await self.completion(request, responder, ctx)
            return
        path = request.path
        if path.startswith("/admin/"):
            await self.admin.handle(request, responder)
        elif path in COMPLETION_ROUTES or (path in INFO_ROUTES and request.method != "GET"):
            self._plain_error(responder, 405, "method_not_allowed", "Method not allowed")
        elif path in INFO_ROUTES:
            self.info(path, responder)
        else:
            self._plain_error(responder, 404, "not_found", f"No route for {path}")

    # -- completion flow -------------------------------------------------------------------
    async def completion(self, request: Request, responder: Responder, ctx: RequestContext) -> None:
        ticket = ctx.ticket
        outcome: tuple[str, str | None] = ("cancelled", None)
        task = asyncio.current_task()
        if task is not None:

            def cancel_wait() -> None:
                task.cancel()

            responder.on_disconnect = cancel_wait
        try:
            parsed = parse_request(ctx.route, request.body, model=self.config.model)
            ctx.prompt_tokens = await self.sizer.size(parsed)
            ticket.sized(ctx.prompt_tokens)
            deadlines = Deadlines.from_headers(
                request.headers, ctx.arrival, self.config.serving.request_timeout_s
            )
            demand = self.predictive.admit(parsed, ctx.prompt_tokens)
            if not self.scheduler.eligible():
                raise Refusal("backend_unavailable")
            with demand:
                placement, waited = await self.queue.place(ticket, deadlines)
            self.board.observe("queue_wait", waited)
            relay = Relay(self, ctx, parsed, placement, responder, deadlines)
            outcome = await relay.run()
            relay.observe_end()
        except Refusal as ref:
            if not responder.started:
                status, headers, body = refusal_response(ref)
                responder.send(status, body, headers)
            outcome = (ref.row.counter or "failed", ref.code)
        except asyncio.CancelledError:
            if not responder.disconnected:
                raise
            responder.abort()
        finally:
            cls, reason = outcome
            ticket.finish(cls, reason)

    def forward_headers(self, ctx: RequestContext) -> Sequence[tuple[bytes, bytes]]:
        request_id = ctx.headers.get("x-request-id")
        if request_id:
            return ((b"x-request-id", request_id.encode("latin-1")),)
        return ()

    def _metric_families(self) -> list[Metric]:
        accounting = GaugeMetricFamily(
            "narwhal_engine_token_accounting",
            "1 for the engine's token accounting mode (token_ids or unavailable).",
            labels=["engine", "mode"],
        )
        for engine in self.engines:
            for mode in ("token_ids", "unavailable"):
                accounting.add_metric([engine.name, mode], float(engine.token_accounting == mode))
        return [accounting, *self.learning.metric_families()]

    # -- information routes ----------------------------------------------------------------
    def info(self, path: str, responder: Responder) -> None:
        if path == "/health":
            responder.send(200, b'{"status":"ok"}')
        elif path == "/ready":
            reason = self.ready_reason()
            if reason is None:
                responder.send(200, b'{"ready":true}')
            else:
                responder.send(503, orjson.dumps({"ready": False, "reason": reason}))
        elif path == "/metrics":
            responder.send(
                200,
                render(self.registry),
                content_type=b"text/plain; version=0.0.4; charset=utf-8",
            )
        elif path == "/engines":
            responder.send(200, orjson.dumps({"engines": self.describe_engines()}))
        else:
            card = {"id": self.config.model, "object": "model", "created": self.created,
                    "owned_by": "narwhal", "root": self.config.model, "parent": None}
            responder.send(200, orjson.dumps({"object": "list", "data": [card]}))

    def describe_engines(self) -> list[dict[str, Any]]:
        snapshot: Any = self.board.snapshot()
        inflight = snapshot.get("engines", [])
        out = []
        for engine in self.engines:
            row = inflight[engine.index] if engine.index < len(inflight) else {}
            phases = {"prefill": int(row.get("prefill", 0)), "decode": int(row.get("decode", 0))}
            described = engine.describe(phases)
            described["learned"] = self.learning.describe(engine)
            out.append(described)
        return out

    @staticmethod
    def _plain_error(responder: Responder, status: int, code: str, message: str) -> None:
        responder.send(status, error_body(message, "invalid_request_error", None, code))
