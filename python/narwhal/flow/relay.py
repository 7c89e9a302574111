"""One placed request's engine attempts: dispatch, retry before headers, relay or assemble, end.

The per-token path: once the answer to the client has started, each engine network read
of a chunked body goes from the engine connection straight to ``StreamSession.pump`` (Rust
de-chunks, parses, validates, rewrites, frames the client's chunk and writes it to the client
transport; no Python frame); :meth:`Relay._on_pump` runs only for rare events (the first
token, the stream's end or failure). Before that, and for bodies that are not chunked,
:meth:`Relay._on_data` does the same per read from de-chunked bytes (``StreamSession.feed``).

Every attempt gets exactly one verdict for its engine's outlier detection
(``engine.breaker.record``): ``ok`` when the engine answered properly, a failure kind when
it did not, ``neutral`` when the attempt says nothing about the engine (the client left,
the deadline passed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from narwhal._narwhal_fast import Board, StreamSession
from narwhal.admission.calibration import Calibration
from narwhal.admission.gate import AdmissionQueue
from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.fleet.outlier import kind_for_code
from narwhal.flow.attempt import CANCELLED, Ended, Outcome, Retry, dispatch
from narwhal.flow.context import RequestContext
from narwhal.flow.migration import Migrations, open_continuation
from narwhal.flow.prefill import prefill_leg
from narwhal.learning import Learning
from narwhal.request.deadlines import Deadlines
from narwhal.request.engine_body import (
    ROUTE_PATHS,
    continuation_body,
    engine_request,
    prefill_body,
    resumable,
)
from narwhal.request.parse import Parsed
from narwhal.scheduling.placement import Placement, Scheduler
from narwhal.server.exchange import Responder
from narwhal.server.responses import midstream_error_event, refusal_response
from narwhal.upstream.client import UpstreamResponse

log = logging.getLogger("narwhal.relay")

_OPEN, _DONE, _FAILED = 0, 1, 2
# StreamSession.pump flags beyond the connection's own (narwhal_core::session::pump_flags)
_PUMP_TOKENS, _PUMP_STATE = 4, 8
_RETRYABLE_STREAM_FAILURES = frozenset({"engine_error", "malformed_engine_output"})
"""Failures of an attempt's first event that another engine may not repeat."""
_DONE_EVENT = b"data: [DONE]\n\n"


def _no_write(data: bytes) -> None:
    """The pump's writer while assembling: an assembled answer writes nothing per read."""


class Relay:
    """Runs a placed request to its one terminal outcome."""

    fast_reads = True
    """Pump streamed reads raw (``StreamSession.pump``); the benchmark turns it off."""

    __slots__ = ("_stall", "_tail", "_timer", "asks_usage", "awaiting_first", "board",
                 "calibration", "can_pump", "counts_ids", "ctx", "deadlines", "dispatched_at",
                 "done", "failure", "first_token_at", "headers", "judging", "kv_params",
                 "last_token_at", "learning", "loop", "max_migrations", "migrated",
                 "migrating", "migrations", "outcome", "parsed", "paused_at", "pending_from",
                 "placement", "pumping", "queue", "responder", "resumable", "retry_allowed",
                 "retry_failure", "retry_pending", "scheduler", "session", "stall_from", "task",
                 "upstream")

    def __init__(
        self,
        ctx: RequestContext,
        parsed: Parsed,
        placement: Placement,
        responder: Responder,
        deadlines: Deadlines,
        *,
        scheduler: Scheduler,
        queue: AdmissionQueue,
        learning: Learning,
        board: Board,
        calibration: Calibration | None = None,
        migrations: Migrations | None = None,
        max_migrations: int = 0,
    ):
        self.ctx = ctx
        self.parsed = parsed
        self.placement = placement
        self.responder = responder
        self.deadlines = deadlines
        self.scheduler = scheduler
        self.queue = queue
        self.learning = learning
        self.board = board
        self.calibration = calibration  # learns the estimate from the engine's prompt count
        self.headers: Sequence[tuple[bytes, bytes]] = ctx.forward_headers()
        self.kv_params: dict[str, Any] | None = None
        self._tail = b""  # the last output of a finished stream, written with the body's end
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.upstream: UpstreamResponse | None = None
        self.session: StreamSession | None = None
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.outcome: Outcome | None = None
        self.retry_allowed = True
        self.retry_pending = False  # the first event was invalid: retry once (_fail_stream)
        self.retry_failure: Refusal | None = None  # what to answer if no engine is left
        self.judging: Engine | None = None  # engine whose attempt awaits its verdict
        self.failure: str | None = None  # the current attempt's failure kind, once known
        self.counts_ids = False  # the attempt's reads count validated token IDs
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.dispatched_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # Migration (docs/reliability.md): a stream broken after its headers goes on on
        # another engine, from a token-ID continuation of the answer so far.
        self.migrations = migrations
        self.max_migrations = max_migrations if migrations is not None else 0
        self.migrated = 0  # continuations made
        self.resumable = False  # the current attempt's answer may be resumed
        self.asks_usage = False  # the first attempt asked usage (so does a continuation)
        self.migrating: tuple[str, bytes] | None = None  # (reason, body) for run to dispatch
        self.pending_from: Engine | None = None  # the continuation awaits a slot off this engine
        self.awaiting_first = True  # the attempt's first token has not come
        self._stall: asyncio.TimerHandle | None = None  # token_timeout_s watch, coarse
        self.paused_at: float | None = None  # reading paused by the client's back-pressure
        self.stall_from = 0.0  # the token timeout also counts from here (resumed reading)
        self.pumping = False  # the engine's reads go to session.pump (the fast path)
        self.can_pump = False  # the engine's body is chunked: pumping may start

    @property
    def engine(self) -> Engine:
        return self.placement.engine

    # -- attempts --------------------------------------------------------------------------
    async def run(self) -> Outcome:
        self.responder.on_disconnect = self._on_disconnect
        try:
            while True:
                retry = await self._attempt() or await self._first_event_failed()
                if not retry:
                    break
                if not self._switch_engine():
                    raise self.retry_failure or Refusal(
                        "engine_error", "Engine failed before responding")
            while await self._migration_due():
                await self._continue()
        except Refusal as ref:
            self._refuse(ref)
        finally:
            self._release()
            if self._timer is not None:
                self._timer.cancel()
            if self._stall is not None:
                self._stall.cancel()
            # No references back into the relay once it is over, so refcounting frees the
            # request's objects at once instead of the cycle collector, later.
            self.responder.on_disconnect = None
            self.task = None
            self._timer = self._stall = None
        assert self.outcome is not None
        return self.outcome

    def _begin(self, engine: Engine) -> None:
        engine.breaker.begin()
        self.judging = engine
        self.failure = None
        self.dispatched_at = self.loop.time()
        obs = self.ctx.obs
        if obs is not None:  # the attempt carries its own span in traceparent
            self.headers = obs.attempt_begin(engine.config, self.headers)

    async def _attempt(self) -> bool:
        """One engine attempt. True: failed before headers and may be retried."""
        if self.placement.split is not None and not await self._prefill():
            return False
        engine = self.engine
        self._begin(engine)
        ask = engine_request(self.parsed, token_ids=engine.token_ids, kv_params=self.kv_params,
                             usage=self.placement.track.demand.probe is not None)
        try:
            opened = await dispatch(engine, ROUTE_PATHS[self.parsed.route], ask.body,
                                    self.headers,
                                    headers_by=self.deadlines.headers_by,
                                    responder=self.responder)
        except Retry as exc:
            return self._may_retry(exc)
        if isinstance(opened, Ended):
            self._finish(*opened.outcome)
            return False
        self.upstream = opened
        self.counts_ids = ask.session["require_token_ids"]
        self.session = session = StreamSession(
            self.parsed.route,
            assemble=not self.parsed.stream,
            expose_token_ids=self.parsed.return_token_ids,
            prompt_tokens=self.ctx.prompt_tokens,
            **ask.session,
        )
        # A disaggregated request (a split placement, or its decode leg: kv_params) is not
        # resumed: a continuation runs whole on one mixed engine.
        self.resumable = (self.max_migrations > 0 and engine.config.migrate
                          and self.counts_ids and self.placement.split is None
                          and self.kv_params is None and resumable(self.parsed))
        if self.resumable:
            session.enable_resume()
            parsed = self.parsed
            self.asks_usage = (not parsed.stream or parsed.include_usage
                               or ask.session["drop_usage"])
        self._arm_deadline()
        self._read_from(opened)
        return False

    def _read_from(self, opened: UpstreamResponse) -> None:
        self.pumping = False
        self.can_pump = self.fast_reads and opened.headers.get("transfer-encoding") == "chunked"
        self.responder.set_flow_listener(self._pause, self._resume)
        opened.set_sink(self._on_data, self._on_end)

    def _start_pump(self) -> None:
        """Move the engine's reads to the fast path: the response to the client has started
        (its head is out) or is assembled, and the connection stands at a chunk boundary.
        Tried after each read until it takes."""
        upstream, session = self.upstream, self.session
        if upstream is None or session is None or self.outcome is not None:
            return
        if self.parsed.stream:
            writer = self.responder.raw_writer()
            if writer is None:
                return
        else:
            writer = _no_write
        session.start_pump(writer, self.placement.track)
        session.watch_tokens = self.awaiting_first
        if upstream.set_raw_sink(session.pump, self._on_pump):
            self.pumping = True
        else:
            session.stop_pump()

    def _on_pump(self, flags: int) -> None:
        """A pumped read needs Python: its state changed, or the first token came."""
        session = self.session
        if session is None or self.outcome is not None:
            return
        if flags & _PUMP_STATE:
            self._after_read(*session.last_read())
        elif flags & _PUMP_TOKENS:
            self._first_token(self.loop.time())
        # Flag 16 (the client transport's write raised: it is closed) needs nothing here:
        # the pump writes no more, and the client's connection_lost ends the request, as
        # on the Python path, whose writes to a closing connection are dropped.

    def _last_token(self) -> float:
        """The time of the last token read, on either path."""
        session = self.session
        if session is None:
            return self.last_token_at
        return max(self.last_token_at, session.last_token_at)

    def _pause(self) -> None:
        if self.upstream is not None:
            self.paused_at = self.loop.time()
            self.upstream.pause_reading()

    def _resume(self) -> None:
        if self.upstream is not None:
            self.paused_at = None
            self.stall_from = self.loop.time()
            self.upstream.resume_reading()

    def _may_retry(self, exc: Retry) -> bool:
        log.warning("attempt failed before headers: %s", exc)
        self._verdict(exc.kind)
        if self.retry_allowed and self.loop.time() < self.deadlines.headers_by:
            self.retry_allowed = False
            return True
        raise Refusal("engine_error", "The engine failed before responding")

    def _switch_engine(self) -> bool:
        """Move to another eligible engine for the single retry."""
        placement = self.scheduler.try_place(exclude=self.engine,
                                             demand=self.placement.track.demand)
        if placement is None:
            return False
        self._release()
        self.placement = placement
        self.session = None
        return True

    async def _prefill(self) -> bool:
        """Run the prefill leg (retried once on another prefill engine) and move to the
        decode engine. False when the request ended here (the engine's 4xx was passed on, or
        the client left); raises Refusal when no prefill leg can succeed."""
        self.ctx.ensure_request_id()
        self.headers = self.ctx.forward_headers()
        body = prefill_body(self.parsed)
        path = ROUTE_PATHS[self.parsed.route]
        while True:
            placement = self.placement
            self._begin(placement.engine)
            try:
                result = await prefill_leg(placement.engine, path, body, self.headers,
                                           headers_by=self.deadlines.headers_by,
                                           responder=self.responder)
            except Retry as exc:
                log.warning("prefill leg on %s failed: %s", placement.engine.name, exc)
                self._verdict(exc.kind)
                if self.outcome is not None:
                    return False
                if not self.retry_allowed or self.loop.time() >= self.deadlines.headers_by:
                    raise Refusal("engine_error",
                                  "The prefill engine failed before responding") from None
                self.retry_allowed = False
                other = self.scheduler.replace_prefill(placement, placement.track.demand)
                if other is None:
                    raise Refusal("engine_error", "The prefill engine failed and no other "
                                                  "was available") from None
                self._release_placement(placement)
                self.placement = other
                continue
            if isinstance(result, Ended):
                self._finish(*result.outcome)
                return False
            self._verdict("ok")
            self.learning.on_first_token(placement.track, self.loop.time())
            self.placement = self.scheduler.decode_leg(placement)
            self.queue.capacity_freed()
            self.kv_params = result
            self.retry_allowed = False  # the KV cache waits on this decode engine only
            return True

    # -- the per-token path ----------------------------------------------------------------
    def _on_data(self, data: bytes) -> None:
        session = self.session
        if session is None or self.outcome is not None:
            return
        self._after_read(*session.feed(data))
        if self.can_pump and not self.pumping and self.outcome is None:
            self._start_pump()

    def _after_read(self, out: bytes, tokens: int, state: int) -> None:
        if tokens:
            self.placement.track.tokens += tokens
            now = self.loop.time()
            if self.awaiting_first:
                self._first_token(now)
            self.last_token_at = now
        if out:
            responder = self.responder
            if not responder.started:
                responder.start(200)
                if self.first_token_at is None and not self.counts_ids:
                    self._first_token(self.loop.time())
            if state == _DONE and self.parsed.stream:
                self._tail = out  # goes out with the end of the body, in one write
            else:
                responder.write(out)
        if state:
            self._stream_state(state)

    def _first_token(self, now: float) -> None:
        self.awaiting_first = False
        placement = self.placement
        if self.first_token_at is None:
            self.first_token_at = now
            if self.ctx.obs is not None:
                self.ctx.obs.first_token()
            self.board.observe("ttft", now - self.ctx.arrival)
            self.learning.on_first_token(placement.track, now)
        self.last_token_at = now
        self._watch_stall()
        if placement.in_prefill:
            placement.enter_decode()
            self.queue.capacity_freed()

    def _stream_state(self, state: int) -> None:
        session = self.session
        assert session is not None
        if state == _DONE:
            if self.parsed.stream:
                tail, self._tail = self._tail, b""
                self.responder.end(tail)
                # An engine's own mid-stream error event was relayed as it was sent.
                if session.engine_error is not None:
                    self.failure = "engine_error_event"
                    self._finish("failed", "engine_error")
                else:
                    self._finish("completed", None)
                return
            try:
                body = session.finish()
            except ValueError as exc:
                code = getattr(exc, "code", "malformed_engine_output")
                self._fail_stream(code, str(exc), kind_for_code(code))
                return
            self.responder.send(200, body)
            self._finish("completed", None)
        elif state == _FAILED:
            code, message = session.failure or ("malformed_engine_output", "bad engine stream")
            error = session.engine_error
            if code == "engine_error" and error is not None and self.resumable:
                # An error event the session held back (the answer could go on).
                if self._migrate("engine_error_event", "engine_error_event"):
                    return
                if self.parsed.stream and self.responder.started:
                    # Ended as without migration: the engine's event, then the end.
                    if self.upstream is not None:
                        self.upstream.abort()
                    self.failure = "engine_error_event"
                    self.responder.end(b"data: " + error + b"\n\n" + _DONE_EVENT)
                    self._finish("failed", "engine_error")
                    return
            self._fail_stream(code, message, kind_for_code(code))

    def _on_end(self, exc: BaseException | None) -> None:
        if self.outcome is not None:
            return
        if self._migrate("reset" if exc is not None else "closed", "reset"):
            return
        message = (
            "The engine stream ended early" if exc is None else f"The engine stream failed: {exc}"
        )
        self._fail_stream("engine_error", message, "reset")

    # -- migration -------------------------------------------------------------------------
    def _migrate(self, reason: str, kind: str) -> bool:
        """The stream broke (``reason``) after the answer began: when the answer can go on
        (the request's and the stream's rules, the engine's ``migrate``, the request's
        ``max_migrations``, another engine placeable now), judge the broken engine
        (``kind``), move to the other engine and have ``run`` dispatch the continuation.
        False: end as without migration."""
        session = self.session
        migrations = self.migrations
        if (not self.resumable or session is None or migrations is None
                or self.migrated >= self.max_migrations or self.outcome is not None):
            return False
        if self.first_token_at is None and not self.responder.started:
            return False  # nothing out yet: the retry of a failed first event applies
        point = session.resume_point()
        broken = self.engine
        why = None
        if point is None:
            why = "the answer is not at a point it can resume from"
        elif self.loop.time() >= self.deadlines.total:
            why = "the request deadline has passed"
        elif self.parsed.max_tokens is not None and point[1] >= self.parsed.max_tokens:
            why = "every token asked for was generated"
        if why is not None or point is None:
            log.warning("engine %s broke the stream (%s): not migrated: %s", broken.name,
                        reason, why)
            return False
        prompt, generated = point
        placement = self._whole(self.scheduler.try_place(exclude=broken,
                                                         demand=self.placement.track.demand))
        if placement is None and not any(e is not broken and e.serves()
                                         and e.config.role == "mixed"
                                         for e in self.scheduler.engines):
            log.warning("engine %s broke the stream (%s): not migrated: no other engine "
                        "serves", broken.name, reason)
            return False
        upstream, self.upstream = self.upstream, None
        if upstream is not None:
            upstream.abort()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        log.warning("engine %s broke the stream (%s) after %d tokens: continuing on %s",
                    broken.name, reason, generated,
                    "another engine" if placement is None else placement.engine.name)
        self.failure = kind
        self._verdict(kind)
        self._release()
        if placement is not None:
            self.placement = placement
        else:  # every other engine is full: the continuation waits for a slot, first in line
            self.pending_from = broken
        self.migrated += 1
        migrations.counts[reason] += 1
        if self.ctx.obs is not None:
            self.ctx.obs.migrated(reason)
        body = continuation_body(self.parsed, prompt, generated, usage=self.asks_usage)
        self.migrating = (reason, body)
        if not self.done.done():
            self.done.set_result(None)
        return True

    def _whole(self, placement: Placement | None) -> Placement | None:
        """``placement`` when it runs a request whole (a mixed engine); a split one (a
        prefill engine with a decode partner) is given back: a continuation has no prefill
        leg."""
        if placement is not None and placement.split is not None:
            self.scheduler.release(placement)
            return None
        return placement

    async def _migration_due(self) -> bool:
        """Wait for the stream's end; True when it broke and goes on on another engine."""
        await self.done
        if self.migrating is None or self.outcome is not None:
            return False
        self.done = self.loop.create_future()
        return True

    async def _continue(self) -> None:
        """Open the continuation on the engine ``_migrate`` placed and read it into the same
        session; when it does not open, migrate again (within the limit) or end the stream
        as a mid-stream failure."""
        assert self.migrating is not None and self.session is not None
        reason, body = self.migrating
        self.migrating = None
        if self.pending_from is not None:
            broken, self.pending_from = self.pending_from, None
            until = min(self.deadlines.total, self.loop.time() + self.queue.max_wait_s)
            placement = self._whole(await self.queue.place_urgent(
                self.placement.track.demand, broken, until))
            if self.outcome is not None:  # the client left or the deadline passed meanwhile
                if placement is not None:
                    self.scheduler.release(placement)
                return
            if placement is None:
                assert self.migrations is not None
                self.migrations.failed[reason] += 1
                self._fail_stream("engine_error", "The engine stream failed and no other "
                                  "engine had room for its continuation", "neutral")
                return
            self.placement = placement
        engine = self.engine
        self._begin(engine)
        try:
            opened = await open_continuation(engine, body, self.headers,
                                             by=self.deadlines.total)
        except Retry as exc:
            if self.outcome is not None:  # the deadline passed meanwhile
                return
            log.warning("continuation on %s failed: %s", engine.name, exc)
            assert self.migrations is not None
            self.migrations.failed[reason] += 1
            self._verdict(exc.kind)
            if not self._migrate(reason, "neutral"):
                self._fail_stream("engine_error", "The engine stream failed and its "
                                  "continuation on another engine did not open", exc.kind)
            return
        if self.outcome is not None:  # the client left meanwhile
            opened.abort()
            return
        self.upstream = opened
        self.session.resume()
        self.awaiting_first = True
        self.stall_from = self.loop.time()
        self._watch_stall()
        self._read_from(opened)

    def _watch_stall(self) -> None:
        """Arm the engine's token timeout: one timer that, when it fires, compares the time
        of the last token (no timer per token)."""
        limit = self.engine.config.token_timeout_s
        if limit is None or self._stall is not None or self.outcome is not None:
            return
        self._stall = self.loop.call_at(max(self._last_token(), self.stall_from) + limit,
                                        self._check_stall)

    def _check_stall(self) -> None:
        self._stall = None
        limit = self.engine.config.token_timeout_s
        if self.outcome is not None or self.upstream is None or limit is None:
            return
        now = self.loop.time()
        due = max(self._last_token(), self.stall_from) + limit
        if self.paused_at is not None or now < due:  # progress, or our client is slow
            self._stall = self.loop.call_at(max(due, now + limit / 4), self._check_stall)
            return
        if self._migrate("stalled", "reset"):
            return
        self._fail_stream("engine_error", f"The engine sent no token for {limit:g} s", "reset")

    # -- endings ---------------------------------------------------------------------------
    def _fail_stream(self, code: str, message: str, kind: str) -> None:
        """The engine attempt failed after it started streaming to us."""
        if self.upstream is not None:
            self.upstream.abort()
        self.failure = kind
        responder = self.responder
        if not responder.started:
            if not self._retry_first_event(code, message, kind):
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
        self._finish(ref.row.counter or "failed", ref.code)

    def _finish(self, cls: str, reason: str | None) -> None:
        if self.outcome is not None:
            return
        self.outcome = (cls, reason)
        if cls == "completed" or reason == "engine_rejected":
            self._verdict("ok")
        else:
            self._verdict(self.failure or "neutral")
        if not self.done.done():
            self.done.set_result(None)

    def _retry_first_event(self, code: str, message: str, kind: str) -> bool:
        """The engine failed before anything reached the client and before any token (an
        invalid first event, a reset before the first event): retry once, like a failure
        before headers. True when the retry is on (``run`` picks it up)."""
        if code not in _RETRYABLE_STREAM_FAILURES or self.first_token_at is not None:
            return False
        if not self.retry_allowed or self.loop.time() >= self.deadlines.headers_by:
            return False
        log.warning("engine %s failed before its first event: %s", self.engine.name, message)
        self._verdict(kind)
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

    def _verdict(self, kind: str) -> None:
        """Report the current attempt's outcome to its engine's outlier detection, once."""
        engine, self.judging = self.judging, None
        if engine is not None:
            engine.breaker.record(kind)
            if self.ctx.obs is not None:
                self.ctx.obs.attempt_end(kind)

    def _on_disconnect(self) -> None:
        if self.upstream is not None:
            self.upstream.abort()
        elif self.task is not None and self.outcome is None:
            # Still waiting for an engine's headers (or a prefill leg): stop waiting now;
            # cancelling the open closes the engine connection, so the engine aborts too.
            self.task.cancel()
        self._finish(*CANCELLED)

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

    def _release_placement(self, placement: Placement) -> None:
        if self.scheduler.release(placement):
            self.queue.capacity_freed()

    def _release(self) -> None:
        """Give back the current attempt's slots (idempotent) and wake the queue."""
        self._release_placement(self.placement)
        self.responder.set_flow_listener(None, None)

    # -- measurements ----------------------------------------------------------------------
    def observe_end(self) -> None:
        board = self.board
        session = self.session
        now = self.loop.time()
        board.observe("e2e", now - self.ctx.arrival)
        if session is None:
            return
        if self.calibration is not None:
            counted = session.engine_prompt_tokens
            if counted is not None:
                self.calibration.observe(self.parsed, counted)
        caches = self.learning.prefix
        if caches is not None and self.placement.track.demand.probe is not None:
            caches.report(self.placement.engine.index, self.placement.track.demand,
                          session.engine_prompt_tokens, session.engine_cached_tokens)
        if self.first_token_at is None:
            return
        tokens = session.output_tokens
        board.observe("output_tokens", float(tokens))
        last_token_at = self._last_token()
        decode_s = last_token_at - self.first_token_at
        if self.ctx.obs is not None:
            self.ctx.obs.output(tokens, decode_s)
        if tokens > 1 and decode_s > 0:
            board.observe("tpot", decode_s / (tokens - 1))
        self.learning.on_end(
            self.placement.track, last_token_at, completed=self.outcome == ("completed", None)
        )
