"""Fuzzing the HTTP server protocol in process: random and mutated request bytes, fed in random
splits through a recording fake transport. Nothing may escape the protocol, every answer is
a well-formed HTTP/1.1 response, and every request the app saw ends exactly once (answered,
handled or abandoned) — the protocol-level form of the router's counter invariant.

``NARWHAL_FUZZ_HTTP_INPUTS`` sets the number of inputs (default: a few seconds' worth).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from typing import Any

from test_http_protocol import FakeTransport

from narwhal.server.exchange import EarlyResponse, Request, Responder, ServerLimits
from narwhal.server.http import HttpProtocol
from narwhal.server.listener import HttpServer

INPUTS = int(os.environ.get("NARWHAL_FUZZ_HTTP_INPUTS", "3000"))
LIMITS = ServerLimits(max_header_bytes=2048, max_headers=16, max_request_bytes=512)

SEEDS = [
    b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST /early HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc",
    b"POST /close HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc",
    b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\nok",
    b"GET /a HTTP/1.0\r\n\r\n",
    b"GET /a HTTP/1.1\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
    b"POST /a HTTP/1.1\r\ncontent-length: 600\r\n\r\n" + b"x" * 600,
]
DICT = [
    b"\r\n",
    b"\n",
    b"\r",
    b":",
    b" ",
    b"\x00",
    b"\xff",
    b"content-length: 3\r\n",
    b"content-length: 99999999999999999999\r\n",
    b"transfer-encoding: chunked\r\n",
    b"transfer-encoding: gzip\r\n",
    b"connection: close\r\n",
    b"expect: 100-continue\r\n",
    b"\r\n\r\n",
    b"0\r\n\r\n",
    b"ffffffff\r\n",
    b"-1\r\n",
    b";ext=1",
    b"HTTP/1.1",
    b"HTTP/9.9",
    b"GET ",
    b"POST /a ",
    b" /stream ",
    b" /early ",
    b" /close ",
    b"x" * 3000,
]


class CountingApp:
    """Echoes; answers early on /early and /close; streams on /stream. Records every end."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.early: set[int] = set()
        self.handled: list[int] = []
        self.abandoned: list[int] = []

    def on_headers(self, request: Request) -> None:
        self.seen.append(request)
        if request.path == "/early":
            self.early.add(id(request))
            raise EarlyResponse(429, b"busy", [(b"retry-after", b"1")])
        if request.path == "/close":
            self.early.add(id(request))
            raise EarlyResponse(413, b"big", close=True)

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        self.early.add(id(request))
        return EarlyResponse(413, b"chunked too big", close=True)

    def on_abandon(self, request: Request, *, malformed: bool = False) -> None:
        self.abandoned.append(id(request))

    async def handle(self, request: Request, responder: Responder) -> None:
        self.handled.append(id(request))
        if request.path == "/stream":
            responder.start(200)
            responder.write(b"data: 1\n\n")
            await asyncio.sleep(0)
            responder.write(b"data: 2\n\n")
            responder.end()
            return
        responder.send(200, request.body[:64])


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((0, 1, 1, 2, 4))):
        at = rng.randrange(len(buf) + 1)
        op = rng.randrange(6)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at:at] = rng.choice(DICT)
        elif op == 2 and buf:
            del buf[at : at + rng.randrange(1, 16)]
        elif op == 3:
            buf[at:at] = rng.choice(SEEDS)  # pipelining, or a request inside another
        elif op == 4:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        else:
            buf[at : at + rng.randrange(1, 8)] = rng.choice(DICT)
    return bytes(buf)


_STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")


async def one_input(rng: random.Random, data: bytes) -> None:
    app = CountingApp()
    loop = asyncio.get_running_loop()
    server = HttpServer(app, LIMITS, loop)
    proto = HttpProtocol(server)
    transport = FakeTransport()
    proto.connection_made(transport)
    at = 0
    while at < len(data) and not transport.closed:
        step = rng.choice((1, 2, 7, 64, len(data)))
        proto.data_received(data[at : at + step])  # nothing may escape
        at += step
        if rng.random() < 0.3:
            await asyncio.sleep(0)
    for _ in range(6):
        await asyncio.sleep(0)
    proto.connection_lost(None)
    for _ in range(4):
        await asyncio.sleep(0)
    out = bytes(transport.written)
    assert not out or out.startswith((b"HTTP/1.1 ", b"HTTP/1.1 100 Continue")), out[:200]
    for status in _STATUS.findall(out):
        assert 100 <= int(status) < 600
    ended = app.handled + app.abandoned
    assert len(ended) == len(set(ended)), "a request ended twice"
    for request in app.seen:
        if id(request) not in app.early:
            assert id(request) in ended, "a request the app saw never ended"
    assert not proto.pending and proto.current is None


def run_fuzz(inputs: int, seed: int) -> int:
    async def main() -> int:
        rng = random.Random(seed)
        for i in range(inputs):
            if rng.random() < 0.1:
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
            else:
                data = mutate(rng, rng.choice(SEEDS))
            try:
                await one_input(rng, data)
            except AssertionError as exc:
                raise AssertionError(f"input {i}: {data!r}") from exc
        return inputs

    return asyncio.run(main())


def test_fuzz_http_protocol() -> None:
    assert run_fuzz(INPUTS, seed=int(os.environ.get("NARWHAL_FUZZ_SEED", "8"))) == INPUTS


# -- regressions found by fuzzing and hardening -------------------------------------------------
def _feed(data: bytes, app: Any | None = None) -> tuple[bytes, bool]:
    async def main() -> tuple[bytes, bool]:
        server = HttpServer(app or CountingApp(), LIMITS, asyncio.get_running_loop())
        proto = HttpProtocol(server)
        transport = FakeTransport()
        proto.connection_made(transport)
        proto.data_received(data)
        for _ in range(8):
            await asyncio.sleep(0)
        return bytes(transport.written), transport.closed

    return asyncio.run(main())


def test_a_request_before_garbage_is_answered_then_the_400() -> None:
    out, closed = _feed(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n\x00garbage\r\n\r\n")
    assert _STATUS.findall(out) == [b"200", b"400"] and closed


def test_upgrade_is_answered_then_closed() -> None:
    out, closed = _feed(b"GET /a HTTP/1.1\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\nPRI *")
    assert _STATUS.findall(out) == [b"200"] and closed
    assert b"connection: close" in out


def test_many_early_answers_behind_one_exchange_do_not_recurse() -> None:
    early = b"POST /early HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
    out, _ = _feed(b"GET /stream HTTP/1.1\r\n\r\n" + early * 3000)
    assert _STATUS.findall(out) == [b"200"] + [b"429"] * 3000
