"""The HTTP server protocol driven with a recording fake transport: no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from narwhal.server.exchange import EarlyResponse, Request, Responder, ServerLimits
from narwhal.server.http import HttpProtocol
from narwhal.server.listener import HttpServer


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class EchoApp:
    """Answers with the method, path and body; optional early answers by path."""

    def __init__(self) -> None:
        self.abandoned: list[str] = []
        self.gate: asyncio.Event | None = None

    def on_headers(self, request: Request) -> None:
        if request.path == "/early":
            raise EarlyResponse(429, b"busy", [(b"retry-after", b"1")])
        if request.path == "/too-big":
            raise EarlyResponse(413, b"big", close=True)

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        return EarlyResponse(413, b"chunked too big", close=True)

    def on_abandon(self, request: Request, *, malformed: bool = False) -> None:
        self.abandoned.append(request.path)

    async def handle(self, request: Request, responder: Responder) -> None:
        if request.path == "/stream":
            responder.start(200)
            responder.write(b"data: 1\n\n")
            if self.gate is not None:
                await self.gate.wait()
            responder.write(b"data: 2\n\n")
            responder.end()
            return
        responder.send(200, f"{request.method} {request.path} ".encode() + request.body)


async def _connect(app: EchoApp, **limits: Any) -> tuple[HttpProtocol, FakeTransport]:
    server = HttpServer(app, ServerLimits(**limits), asyncio.get_running_loop())
    proto = HttpProtocol(server)
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, transport


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_keep_alive_and_pipelined_requests_answer_in_order() -> None:
    async def main() -> bytes:
        proto, transport = await _connect(EchoApp())
        proto.data_received(
            b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nonePOST /b HTTP/1.1\r\n"
            b"host: x\r\ncontent-length: 3\r\n\r\ntwo"
        )
        await _settle()
        assert not transport.closed
        return bytes(transport.written)

    out = run(main())
    assert out.count(b"HTTP/1.1 200 OK") == 2
    assert out.index(b"POST /a one") < out.index(b"POST /b two")
    assert b"connection: keep-alive" in out


def test_chunked_request_body_is_joined() -> None:
    async def main() -> bytes:
        proto, transport = await _connect(EchoApp())
        proto.data_received(b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        proto.data_received(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        await _settle()
        return bytes(transport.written)

    assert b"POST /c abcde" in run(main())


def test_malformed_http_is_400_and_closes() -> None:
    async def main() -> tuple[bytes, bool]:
        proto, transport = await _connect(EchoApp())
        proto.data_received(b"GARBAGE\x00\x01 nonsense\r\n\r\n")
        await _settle()
        return bytes(transport.written), transport.closed

    out, closed = run(main())
    assert out.startswith(b"HTTP/1.1 400") and b"connection: close" in out and closed


def test_header_limits_are_431() -> None:
    async def main(headers: bytes, **limits: Any) -> bytes:
        proto, transport = await _connect(EchoApp(), **limits)
        proto.data_received(b"GET /x HTTP/1.1\r\n" + headers + b"\r\n")
        await _settle()
        assert transport.closed
        return bytes(transport.written)

    many = b"".join(b"h%d: v\r\n" % i for i in range(20))
    assert run(main(many, max_headers=10)).startswith(b"HTTP/1.1 431")
    assert run(main(b"big: " + b"v" * 5000 + b"\r\n", max_header_bytes=1024)).startswith(
        b"HTTP/1.1 431"
    )


def test_early_answer_reads_and_drops_the_body_and_keeps_the_connection() -> None:
    async def main() -> tuple[bytes, bool]:
        proto, transport = await _connect(EchoApp())
        proto.data_received(b"POST /early HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nbody")
        proto.data_received(b"POST /after HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nz")
        await _settle()
        return bytes(transport.written), transport.closed

    out, closed = run(main())
    assert out.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in out
    assert b"POST /after z" in out and not closed


def test_early_close_answer_stops_reading() -> None:
    async def main() -> tuple[bytes, bool, bool]:
        proto, transport = await _connect(EchoApp())
        proto.data_received(b"POST /too-big HTTP/1.1\r\nhost: x\r\ncontent-length: 99999\r\n\r\n")
        await _settle()
        return bytes(transport.written), transport.closed, transport.paused

    out, closed, paused = run(main())
    assert out.startswith(b"HTTP/1.1 413") and b"connection: close" in out
    assert closed and paused


def test_chunked_body_over_the_limit_is_cut_off() -> None:
    async def main() -> bytes:
        proto, transport = await _connect(EchoApp(), max_request_bytes=8)
        proto.data_received(b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        proto.data_received(b"a\r\n0123456789\r\n")
        await _settle()
        return bytes(transport.written)

    assert run(main()).startswith(b"HTTP/1.1 413")


def test_streamed_response_is_chunked_with_the_head_in_the_first_write() -> None:
    async def main() -> bytes:
        proto, transport = await _connect(EchoApp())
        proto.data_received(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        await _settle()
        return bytes(transport.written)

    out = run(main())
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head and b"text/event-stream" in head
    assert body == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"


def test_client_gone_mid_stream_abandons_pipelined_requests() -> None:
    async def main() -> EchoApp:
        app = EchoApp()
        app.gate = asyncio.Event()
        proto, _ = await _connect(app)
        proto.data_received(
            b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\nPOST /queued HTTP/1.1\r\nhost: x\r\n"
            b"content-length: 1\r\n\r\nq"
        )
        await _settle()
        proto.connection_lost(None)
        app.gate.set()
        await _settle()
        return app

    assert run(main()).abandoned == ["/queued"]


@pytest.mark.timeout(10)
def test_idle_and_slow_headers_close_the_connection() -> None:
    async def main() -> tuple[bool, bool]:
        _proto, idle = await _connect(EchoApp(), keepalive_timeout_s=0.05)
        proto2, slow = await _connect(EchoApp(), header_timeout_s=0.05, keepalive_timeout_s=5)
        proto2.data_received(b"GET /x HTTP/1.1\r\nhost")  # headers never finish
        await asyncio.sleep(0.2)
        return idle.closed, slow.closed

    assert run(main()) == (True, True)
