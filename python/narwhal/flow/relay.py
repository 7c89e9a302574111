"""One request's engine attempts: dispatch, retry before headers, relay or assemble, and end.

The per-token path lives in :meth:`Relay._on_data`: one Rust call per engine network read
(``StreamSession.feed``) and at most one write to the client, with no awaits.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from narwhal._narwhal_fast import Slot, StreamSession
from narwhal.errors import Refusal
from narwhal.fleet.breaker import ENGINE_FAULTS, judge
from narwhal.fleet.engine import Engine
from narwhal.flow.prefill import run_prefill
from narwhal.request.deadlines import Deadlines
from narwhal.request.engine_body import ROUTE_PATHS, engine_body
from narwhal.scheduling.placement import Placement
from narwhal.server.http import Responder
from narwhal.server.responses import midstream_error_event, refusal_response
from narwhal.upstream.client import UpstreamError, UpstreamResponse

if TYPE_CHECKING:
    from narwhal.api.router import RequestContext, Router
    from narwhal.request.parse import Parsed

log = logging.getLogger("narwhal.relay")

_OPEN, _DONE, _FAILED = 0, 1, 2

class Relay:
    """Runs a placed request to its one terminal outcome."""

    def __init__(
        self,
        router: Router,
        ctx: RequestContext,
        parsed: Parsed,
        placement: Placement,
        responder: Responder,
        deadlines: Deadlines,
    ):
        self.router = router
        self.ctx = ctx
        self.parsed = parsed
        self.engine = placement.engine
        self.prefill: Slot | None = placement.prefill
        self.track = placement.track
        self.split = placement.split  # disaggregated: the prefill leg runs first (disagg.py)
        self.kv_params: dict[str, Any] | None = None
        self.decode: Slot | None = None
        self.phase: str | None = "prefill"
        self._tail = b""  # the last output of a finished stream, written with the body's end
        self.responder = responder
        self.deadlines = deadlines
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.upstream: UpstreamResponse | None = None
        self.session: StreamSession | None = None
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.outcome: tuple[str, str | None] | None = None
        self.retry_allowed = True
        self.retry_pending = False  # the first event was invalid: retry once (see _fail_stream)
        self.retry_failure: Refusal | None = None  # what to answer if no engine is left
        self.judging: Engine | None = None  # engine whose attempt awaits its breaker verdict
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.dispatched_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- attempts --------------------------------------------------------------------------
    async def run(self) -> tuple[str, str | None]:
        responder = self.responder
        responder.on_disconnect = self._on_disconnect
        try:
            while True:
                retry = await self._attempt() or await self._first_event_failed()
                if not retry:
                    break
                if not self._switch_engine():
                    raise self.retry_failure or Refusal(
                        "engine_error", "Engine failed before responding")
            await self.done
        except Refusal as ref:
            self._refuse(ref)
        finally:
            self._release()
            if self._timer is not None:
                self._timer.cancel()
        assert self.outcome is not None
        return self.outcome

    async def _attempt(self) -> bool:
        """One engine attempt. True: failed before headers and may be retried."""
        if self.split is not None and not await run_prefill(self):
            return False
        engine = self.engine
        engine.breaker.begin()
        self.judging = engine
        body, drop_usage = engine_body(self.parsed, token_ids=engine.token_ids,
                                        kv_params=self.kv_params)
        headers = self.router.forward_headers(self.ctx)
        timeout = self.deadlines.headers_by - self.loop.time()
        if timeout <= 0:
            raise Refusal("deadline_expired")
        self.dispatched_at = self.loop.time()
        try:
            upstream = await engine.client.open(
                "POST", ROUTE_PATHS[self.parsed.route], body, headers, timeout_s=timeout
            )
        except UpstreamError as exc:
            if exc.kind == "timeout" and self.loop.time() >= self.deadlines.headers_by - 1e-3:
                raise Refusal("deadline_expired") from None
            return self._may_retry(f"engine {engine.name}: {exc.kind}")
        if self.responder.disconnected:
            upstream.abort()
            self._finish("cancelled", None)
            return False
        status = upstream.status
        if status >= 500:
            upstream.abort()
            return self._may_retry(f"engine {engine.name} answered {status}")
        if status != 200:
            await self._pass_through(upstream)
            return False
        self.upstream = upstream
        self.session = StreamSession(
            self.parsed.route,
            assemble=not self.parsed.stream,
            expose_token_ids=self.parsed.return_token_ids,
            drop_usage=drop_usage,
            require_token_ids=engine.token_ids,
            prompt_tokens=self.ctx.prompt_tokens,
        )
        self._arm_deadline()
        self.responder.set_flow_listener(upstream.pause_reading, upstream.resume_reading)
        upstream.set_sink(self._on_data, self._on_end)
        return False

    def _may_retry(self, why: str) -> bool:
        log.warning("attempt failed before headers: %s", why)
        self._verdict(False)
        if self.retry_allowed and self.loop.time() < self.deadlines.headers_by:
            self.retry_allowed = False
            return True
        raise Refusal("engine_error", "The engine failed before responding")

    def _switch_engine(self) -> bool:
        """Move to another eligible engine for the single retry."""
        placement = self.router.scheduler.try_place(exclude=self.engine, demand=self.track.demand)
        if placement is None:
            return False
        self._release()
        self.engine = placement.engine
        self.prefill = placement.prefill
        self.track = placement.track
        self.split = placement.split
        self.phase = "prefill"
        self.session = None
        return True

    async def _pass_through(self, upstream: UpstreamResponse) -> None:
        """The engine's own 4xx before its stream: to the client unchanged, not retried."""
        try:
            body = await upstream.read_all()
        except UpstreamError:
            raise Refusal("engine_error", "The engine's error response was cut off") from None
        content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
        self.responder.send(upstream.status, body, content_type=content_type)
        self._finish("invalid_requests", "engine_rejected")

    # -- the per-token path ----------------------------------------------------------------
    def _on_data(self, data: bytes) -> None:
        session = self.session
        if session is None or self.outcome is not None:
            return
        out, tokens, state = session.feed(data)
        if tokens:
            self.track.tokens += tokens
            now = self.loop.time()
            if self.first_token_at is None:
                self._first_token(now)
            self.last_token_at = now
        if out:
            responder = self.responder
            if not responder.started:
                responder.start(200)
                if self.first_token_at is None and not self.engine.token_ids:
                    self._first_token(self.loop.time())
            if state == _DONE and self.parsed.stream:
                self._tail = out  # goes out with the end of the body, in one write
            else:
                responder.write(out)
        if state:
            self._stream_state(state)

    def _first_token(self, now: float) -> None:
        self.first_token_at = now
        self.router.board.observe("ttft", now - self.ctx.arrival)
        self.router.learning.on_first_token(self.track, now)
        if self.phase == "prefill" and self.prefill is not None:
            self.prefill.release()
            self.prefill = None
            self.phase = "decode"
            self.decode = self.router.scheduler.enter_decode(self.engine)
            self.router.queue.capacity_freed()

    def _stream_state(self, state: int) -> None:
        session = self.session
        assert session is not None
        if state == _DONE:
            if self.parsed.stream:
                tail, self._tail = self._tail, b""
                self.responder.end(tail)
                # An engine's own mid-stream error event was relayed as it was sent.
                failed = session.engine_error is not None
                self._finish(*(("failed", "engine_error") if failed else ("completed", None)))
                return
            try:
                body = session.finish()
            except ValueError as exc:
                code = getattr(exc, "code", "malformed_engine_output")
                self._fail_stream(code if code != "engine_error" else "engine_error", str(exc))
                return
            self.responder.send(200, body)
            self._finish("completed", None)
        elif state == _FAILED:
            code, message = session.failure or ("malformed_engine_output", "bad engine stream")
            self._fail_stream(code, message)

    def _on_end(self, exc: BaseException | None) -> None:
        if self.outcome is not None:
            return
        message = (
            "The engine stream ended early" if exc is None else f"The engine stream failed: {exc}"
        )
        self._fail_stream("engine_error", message)

    # -- endings ---------------------------------------------------------------------------
    def _fail_stream(self, code: str, message: str) -> None:
        """The engine attempt failed after it started streaming to us."""
        if self.upstream is not None:
            self.upstream.abort()
        responder = self.responder
        if not responder.started:
            if not self._retry_first_event(code, message):
                self._refuse(Refusal(code, message))
        else:
            responder.write(midstream_error_event(Refusal(code, message)))
            responder.end()
            self._finish("failed", code)

    def _refuse(self, ref: Refusal) -> None:
        if self.outcome is not None:
            return
        if self.upstream is not None:
            self.upstream.abort()
        if not self.responder.started:
            status, headers, body = refusal_response(ref)
            self.responder.send(status, body, headers)
        counter = ref.row.counter or "failed"
        self._finish(counter, ref.code)

    def _finish(self, cls: str, reason: str | None) -> None:
        if self.outcome is not None:
            return
        self.outcome = (cls, reason)
        self._verdict(judge(cls, reason))
        if not self.done.done():
            self.done.set_result(None)

    def _retry_first_event(self, code: str, message: str) -> bool:
        """The engine failed before anything reached the client and before any token (an
        invalid first event, a reset before the first event): retry once, like a failure
        before headers. True when the retry is on (``run`` picks it up)."""
        if code not in ENGINE_FAULTS or self.first_token_at is not None:
            return False
        if not self.retry_allowed or self.loop.time() >= self.deadlines.headers_by:
            return False
        log.warning("engine %s failed before its first event: %s", self.engine.name, message)
        self._verdict(False)
        self.retry_allowed = False
        self.retry_pending = True
        self.retry_failure = Refusal(code, message)
        self.upstream = self.session = None
        if not self.done.done():
            self.done.set_result(None)
        return True

    async def _first_event_failed(self) -> bool:
        """Wait for the attempt's stream; True when it must be retried on another engine."""
        await self.done
        if not self.retry_pending or self.outcome is not None:
            return False
        self.retry_pending = False
        self.done = self.loop.create_future()
        return True

    def _verdict(self, ok: bool | None) -> None:
        """Report the current attempt's outcome to its engine's circuit breaker, once."""
        engine, self.judging = self.judging, None
        if engine is not None:
            engine.breaker.record(ok)

    def _on_disconnect(self) -> None:
        if self.upstream is not None:
            self.upstream.abort()
        elif self.task is not None and self.outcome is None:
            # Still waiting for an engine's headers (or a prefill leg): stop waiting now;
            # cancelling the open closes the engine connection, so the engine aborts too.
            self.task.cancel()
        self._finish("cancelled", None)

    def _arm_deadline(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_at(self.deadlines.total, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if self.outcome is not None:
            return
        ref = Refusal("deadline_expired")
        if self.upstream is not None:
            self.upstream.abort()
        if not self.responder.started:
            self._refuse(ref)
        else:
            late = Refusal(
                "deadline_expired", "Terminal expiry: the request deadline passed mid-response."
            )
            self.responder.write(midstream_error_event(late))
            self.responder.end()
            self._finish("expired", "deadline_expired")

    def _release(self) -> None:
        """Give back the slots of the current attempt (idempotent) and wake the queue."""
        scheduler = self.router.scheduler
        phase, self.phase = self.phase, None
        split, self.split = self.split, None
        if split is not None:
            split.release(scheduler)
        if phase == "prefill" and self.prefill is not None:
            self.prefill.release()
            scheduler.leave(self.engine, "prefill")
        elif phase == "decode":
            if self.decode is not None:
                self.decode.release()
            scheduler.leave(self.engine, "decode")
        self.prefill = self.decode = None
        self.router.learning.release(self.track)
        self.responder.set_flow_listener(None, None)
        if phase is not None:
            self.router.queue.capacity_freed()

    # -- measurements ----------------------------------------------------------------------
    def observe_end(self) -> None:
        board = self.router.board
        session = self.session
        now = self.loop.time()
        board.observe("e2e", now - self.ctx.arrival)
        if session is None or self.first_token_at is None:
            return
        tokens = session.output_tokens
        board.observe("output_tokens", float(tokens))
        decode_s = self.last_token_at - self.first_token_at
        if tokens > 1 and decode_s > 0:
            board.observe("tpot", decode_s / (tokens - 1))
        self.router.learning.on_end(
            self.track, self.last_token_at, completed=self.outcome == ("completed", None)
        )
