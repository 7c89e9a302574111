"""Closed-loop streaming chat load generator on asyncio + httptools: TTFT and inter-token latency.

Each of ``streams`` workers owns one keep-alive connection and sends its next request as
soon as the previous answer ends (closed loop). Every network read is timestamped once;
SSE events in it are split, parsed with orjson and counted as tokens when their delta
carries text. Figures cover a measurement window after a warm-up:

* TTFT: request write -> the read holding the first token, for first tokens read in the
  window (so a router that queues for longer than the window still yields samples);
* inter-token latency: the gap between two token-bearing reads divided by the tokens in
  the later read (so engines that merge tokens into one event still average correctly);
* tokens: token events read in the window, scaled per request by ``usage.completion_tokens``
  / token events when the answer reports usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Target:
    """Where one stream sends its requests: base URL and extra header lines."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 80


def chat_body(model: str, max_tokens: int, prompt: str) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
        }
    )


def request_bytes(target: Target, body: bytes, path: str = CHAT_PATH) -> bytes:
    host, port = target.address
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in target.headers),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Window:
    """The measurement window [start, end) on ``time.perf_counter``; set when warm-up ends."""

    start: float = float("inf")
    end: float = float("inf")

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class Figures:
    """Everything one phase measured."""

    streams: int
    window_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    tokens: float = 0.0
    requests: int = 0  # answers completed in the window
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text)


def _is_token(event: Any) -> tuple[bool, int | None]:
    """(carries a token, usage completion_tokens or None) for one parsed SSE event."""
    if not isinstance(event, dict):
        return False, None
    usage = event.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    choices = event.get("choices")
    if not choices:
        return False, completion
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        token = bool(
            delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
            or delta.get("tool_calls")
        )
    else:
        token = bool(choice.get("text"))
    return token, completion if isinstance(completion, int) else None


class _Exchange:
    """One request in flight on a connection."""

    __slots__ = (
        "buf",
        "done",
        "events_in_window",
        "events_total",
        "first_at",
        "last_at",
        "sent_at",
        "status",
        "usage",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, sent_at: float) -> None:
        self.sent_at = sent_at
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.buf = b""
        self.first_at: float | None = None
        self.last_at = 0.0
        self.events_total = 0
        self.events_in_window = 0
        self.usage: int | None = None


class StreamConnection(asyncio.Protocol):
    """One client connection; the protocol and the httptools callback sink in one object."""

    def __init__(self, loop: asyncio.AbstractEventLoop, figures: Figures, window: Window) -> None:
        # shared
        self._loop = loop
        self._figures = figures
        self._window = window
        # per connection
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = loop.create_future()
        self.keep_alive = True
        self._now = 0.0
        self._read_tokens = 0
        # per request
        self._ex: _Exchange | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._now = time.perf_counter()
        self._read_tokens = 0
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"bad HTTP from server: {exc}")
            return
        if self._read_tokens:
            self._account_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep_alive = False
        if self._ex is not None:
            self._fail(f"connection lost: {exc or 'closed by server'}")
        if not self.closed.done():
            self.closed.set_result(None)

    # -- httptools callbacks
    def on_headers_complete(self) -> None:
        if self._ex is not None:
            self._ex.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        ex = self._ex
        if ex is None:
            return
        buf = ex.buf + body
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, ex.buf = buf.split(b"\n\n")
        for raw in events:
            for line in raw.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]" or not payload:
                    continue
                try:
                    token, usage = _is_token(orjson.loads(payload))
                except orjson.JSONDecodeError:
                    continue
                if usage is not None:
                    ex.usage = usage
                if token:
                    self._read_tokens += 1

    def on_message_complete(self) -> None:
        ex = self._ex
        if ex is None:
            return
        if self._read_tokens:  # the read that ends the message also carried tokens
            self._record_tokens(ex, self._read_tokens)
            self._read_tokens = 0
        self.keep_alive = self._parser.should_keep_alive()
        self._ex = None
        figures = self._figures
        if ex.status != 200:
            figures.error(f"HTTP {ex.status}: {ex.buf[:200]!r}")
        elif self._window.holds(self._now):
            figures.requests += 1
        if ex.events_in_window:
            scale = ex.usage / ex.events_total if ex.usage and ex.events_total else 1.0
            figures.tokens += ex.events_in_window * scale
        if not ex.done.done():
            ex.done.set_result(None)

    # -- requests
    def send(self, request: bytes) -> _Exchange:
        assert self._transport is not None and self._ex is None
        ex = _Exchange(self._loop, time.perf_counter())
        self._ex = ex
        self._transport.write(request)
        return ex

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _account_read(self) -> None:
        ex = self._ex
        if ex is not None:
            self._record_tokens(ex, self._read_tokens)
        self._read_tokens = 0

    def _record_tokens(self, ex: _Exchange, k: int) -> None:
        now, window, figures = self._now, self._window, self._figures
        in_window = window.holds(now)
        if ex.first_at is None:
            ex.first_at = now
            if in_window:
                figures.ttft_s.append(now - ex.sent_at)
            k_gaps = k - 1
            gap = 0.0
        else:
            k_gaps = k
            gap = (now - ex.last_at) / k
        if in_window:
            figures.itl_s.extend([gap] * k_gaps)
            ex.events_in_window += k
        ex.events_total += k
        ex.last_at = now

    def _fail(self, why: str) -> None:
        ex, self._ex = self._ex, None
        self.keep_alive = False
        if ex is not None:
            self._figures.error(why)
            if not ex.done.done():
                ex.done.set_result(None)
        self.close()


async def _open(
    loop: asyncio.AbstractEventLoop, target: Target, figures: Figures, window: Window
) -> StreamConnection:
    host, port = target.address
    _, proto = await loop.create_connection(
        lambda: StreamConnection(loop, figures, window), host, port
    )
    return proto


async def _stream_worker(
    loop: asyncio.AbstractEventLoop,
    target: Target,
    request: bytes,
    figures: Figures,
    window: Window,
    stop_at: float,
    answer_timeout_s: float,
    answers: int | None = None,
) -> None:
    conn: StreamConnection | None = None
    sent = 0
    try:
        while time.perf_counter() < stop_at and (answers is None or sent < answers):
            sent += 1
            if conn is None or not conn.keep_alive:
                if conn is not None:
                    conn.close()
                try:
                    conn = await _open(loop, target, figures, window)
                except OSError as exc:
                    figures.error(f"connect: {exc}")
                    await asyncio.sleep(0.05)
                    continue
            ex = conn.send(request)
            try:
                await asyncio.wait_for(asyncio.shield(ex.done), answer_timeout_s)
            except asyncio.TimeoutError:
                figures.error("answer timed out")
                conn.close()
                conn = None
    finally:
        if conn is not None:
            conn.close()


async def run_phase(
    targets: Sequence[Target],
    request_for: Callable[[Target], bytes],
    *,
    streams: int,
    warmup_s: float,
    duration_s: float,
    on_window: Callable[[str], None] | None = None,
    drain_s: float = 30.0,
    answer_timeout_s: float = 60.0,
) -> Figures:
    """Run ``streams`` closed-loop workers; ``on_window("start"|"end")`` marks the window.

    Workers are spread round-robin over ``targets`` (several engines when measuring direct).
    New requests stop at the window's end; answers in flight get ``drain_s`` to finish.
    """
    loop = asyncio.get_running_loop()
    figures = Figures(streams=streams)
    window = Window()
    t0 = time.perf_counter()
    stop_at = t0 + warmup_s + duration_s
    requests = {t: request_for(t) for t in targets}
    tasks = [
        loop.create_task(
            _stream_worker(
                loop,
                targets[i % len(targets)],
                requests[targets[i % len(targets)]],
                figures,
                window,
                stop_at,
                answer_timeout_s,
            )
        )
        for i in range(streams)
    ]
    await asyncio.sleep(max(0.0, t0 + warmup_s - time.perf_counter()))
    if on_window is not None:
        on_window("start")
    window.start = time.perf_counter()
    await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
    window.end = time.perf_counter()
    if on_window is not None:
        on_window("end")
    figures.window_s = window.end - window.start
    done, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            figures.error(f"stream worker failed: {task.exception()!r}")
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
        figures.error(f"{len(pending)} streams still open {drain_s:.0f} s after the window")
    return figures


async def run_fixed(
    targets: Sequence[Target],
    request_for: Callable[[Target], bytes],
    *,
    streams: int,
    answers: int,
    timeout_s: float = 60.0,
) -> Figures:
    """``streams`` closed-loop workers sending ``answers`` requests each; everything counts.

    The fixed amount of work makes the wall time a benchmark (pytest-benchmark times it).
    """
    loop = asyncio.get_running_loop()
    figures = Figures(streams=streams)
    window = Window(start=time.perf_counter())
    stop_at = window.start + timeout_s
    requests = {t: request_for(t) for t in targets}
    tasks = [
        loop.create_task(
            _stream_worker(
                loop,
                targets[i % len(targets)],
                requests[targets[i % len(targets)]],
                figures,
                window,
                stop_at,
                timeout_s,
                answers,
            )
        )
        for i in range(streams)
    ]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s + 5)
    window.end = time.perf_counter()
    figures.window_s = window.end - window.start
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            figures.error(f"stream worker failed: {task.exception()!r}")
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
        figures.error(f"{len(pending)} streams did not finish in {timeout_s:.0f} s")
    return figures


async def probe(target: Target, request: bytes, timeout_s: float) -> str | None:
    """Send one streaming request; None when it came back 200 with at least one token."""
    loop = asyncio.get_running_loop()
    figures = Figures(streams=1)
    window = Window(start=0.0)
    try:
        conn = await asyncio.wait_for(_open(loop, target, figures, window), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"connect: {exc!r}"
    try:
        ex = conn.send(request)
        await asyncio.wait_for(asyncio.shield(ex.done), timeout_s)
    except asyncio.TimeoutError:
        return "timed out"
    finally:
        conn.close()
    if figures.errors:
        return figures.error_samples[0]
    if ex.events_total == 0:
        return "no token in the answer"
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]
