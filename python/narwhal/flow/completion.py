"""The completion flow: intake at arrival, then sizing, admission, the wait for placement, and
the relay, to exactly one counted outcome per request.

Order of checks (SPEC §4): route → router state → retention → size → JSON and shape → model
→ sampling width → unsupported options → workload sizing → predictive admission → placement
(zero eligible engines) → admission queue (full, wait, deadline) → dispatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from narwhal._narwhal_fast import Board
from narwhal.admission.calibration import Sizing
from narwhal.admission.gate import AdmissionQueue
from narwhal.admission.predictive import NearBudget, PredictiveAdmission
from narwhal.config import Config
from narwhal.errors import Refusal
from narwhal.flow.attempt import Outcome
from narwhal.flow.context import UNLIMITED, RequestContext
from narwhal.flow.migration import Migrations
from narwhal.flow.relay import Relay
from narwhal.learning import Learning
from narwhal.learning.occupancy import Demand
from narwhal.observe import Observer
from narwhal.request.deadlines import Deadlines
from narwhal.request.models import Served
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler
from narwhal.server.exchange import EarlyResponse, Request, Responder
from narwhal.server.responses import refusal_response

COMPLETION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


def early(ref: Refusal, *, close: bool = False) -> EarlyResponse:
    status, headers, body = refusal_response(ref)
    return EarlyResponse(status, body, headers, close=close)


class CompletionFlow:
    """Takes completion requests from their headers to their one terminal outcome."""

    def __init__(
        self,
        config: Config,
        board: Board,
        *,
        sizing: Sizing,
        predictive: PredictiveAdmission,
        scheduler: Scheduler,
        queue: AdmissionQueue,
        learning: Learning,
        state_refusal: Callable[[], str | None],
        observer: Observer | None = None,
        names: Mapping[str, Served] | None = None,
        model_boards: Sequence[Board] | None = None,
    ):
        # Every name a client may send (configured models, aliases, adapters: the catalog's
        # live mapping), and with per-model metrics each model's board, by model index.
        self.names: str | Mapping[str, Served] = config.default_model if names is None else names
        self.model_boards = model_boards
        self.serving = config.serving
        self.board = board
        self.sizer = sizing.sizer
        self.sizing = sizing
        self.predictive = predictive
        self.scheduler = scheduler
        # The session header (lower case) when the cache-aware projection can use it.
        self.session_header = (config.scheduling.session_header.lower()
                               if learning.prefix is not None and scheduler.policy.cache_aware
                               else None)
        self.queue = queue
        self.learning = learning
        self.state_refusal = state_refusal
        self.observer = observer  # None: no access log, no tracing
        self.migrations = Migrations()  # this process's migration counts (/metrics)

    # -- intake: the request's headers are in (protocol callbacks: no awaits) ---------------
    def on_headers(self, request: Request, route: str) -> None:
        """Account for the request at arrival; raise EarlyResponse to answer it now."""
        ticket, within_limit = self.board.arrive(self.serving.http_retention_limit)
        ctx = request.state = RequestContext(ticket, route, request.arrival, request.headers)
        if self.observer is not None:
            ctx.obs = self.observer.begin(request, ctx.ensure_request_id())
        length = request.headers.get("content-length")
        too_large = (length is not None and length.isdigit()
                     and int(length) > self.serving.max_request_bytes)
        code = self.state_refusal()
        if code is None and not within_limit:
            code = "retention_full"
        if code is not None:
            ref = Refusal(code)
            ctx.finish(ref.row.counter or "rejected", code, ref.status)
            # A body within the limit is read and dropped (the connection stays usable); one
            # declared over it is not waited for: the answer goes out now and the
            # connection closes.
            raise early(ref, close=too_large)
        if too_large:
            ctx.finish("invalid_requests", "request_too_large", 413)
            raise early(Refusal("request_too_large"), close=True)

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        if isinstance(request.state, RequestContext):
            request.state.finish("invalid_requests", "request_too_large", 413)
        return early(Refusal("request_too_large"), close=True)

    def on_abandon(self, request: Request, *, malformed: bool = False) -> None:
        """The connection ended before the request could run: the client left, or sent a
        body the HTTP parser rejected (a malformed request, not a cancellation)."""
        if isinstance(request.state, RequestContext):
            if malformed:
                request.state.finish("invalid_requests", "invalid_request", 400)
            else:
                request.state.finish("cancelled")

    # -- the request's journey ---------------------------------------------------------------
    async def run(self, request: Request, responder: Responder, ctx: RequestContext) -> None:
        ticket = ctx.ticket
        obs = ctx.obs
        outcome: Outcome = ("cancelled", None)
        task = asyncio.current_task()
        if task is not None:

            def cancel_wait() -> None:
                task.cancel()

            responder.on_disconnect = cancel_wait
        board, model_ticket = self.board, None
        try:
            parsed = parse_request(ctx.route, request.body, model=self.names)
            if self.model_boards is not None and parsed.served is not None:
                # Per-model metrics: the request also arrives (and finishes) on its model's
                # board, where its latencies go (the collector sums them for the totals).
                board = self.model_boards[parsed.served.index]
                model_ticket = board.arrive(UNLIMITED)[0]
            if obs is not None:
                obs.parsed(parsed)
            tokens = await self.sizer.size(parsed)
            header = self.session_header
            session = request.headers.get(header) if header is not None else None
            try:
                demand: Demand | None = self.predictive.admit(
                    parsed, tokens, self.sizing.band(parsed), session)
            except NearBudget:  # the decision hangs on the exact count: ask for it
                assert self.sizing.exact is not None
                tokens, demand = await self.sizing.exact.size(parsed), None
            finally:
                ctx.prompt_tokens = tokens
                ticket.sized(tokens)
                if obs is not None:
                    obs.sized(tokens)
                if model_ticket is not None:
                    model_ticket.sized(tokens)
            if demand is None:
                demand = self.predictive.admit(parsed, tokens, session=session)
            deadlines = Deadlines.from_headers(
                request.headers, ctx.arrival, self.serving.request_timeout_s
            )
            if not demand.eligible:
                raise Refusal("backend_unavailable")
            with demand:
                placement, waited = await self.queue.place(ticket, deadlines, demand)
            board.observe("queue_wait", waited)
            if obs is not None:
                split = placement.split
                obs.placed(waited, placement.engine.name,
                           split.engine.name if split is not None else None)
            relay = Relay(ctx, parsed, placement, responder, deadlines,
                          scheduler=self.scheduler, queue=self.queue, learning=self.learning,
                          board=board, calibration=self.sizing.calibration,
                          migrations=self.migrations,
                          max_migrations=self.serving.max_migrations)
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
            ctx.finish(*outcome, responder.status)
            if model_ticket is not None:
                model_ticket.finish(*outcome)
