"""EngineClient against small asyncio servers on real loopback sockets (uvloop)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from narwhal.upstream.client import EngineClient, UpstreamError, UpstreamResponse

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(main: Callable[[], Awaitable[Any]], timeout: float = 10.0) -> Any:
    """Run one test body on uvloop, bounded in time."""

    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return uvloop.run(bounded())


class Server:
    """A loopback HTTP server whose per-connection behaviour is a coroutine."""

    def __init__(self, handler: Handler, port: int = 0) -> None:
        self.handler = handler
        self.port = port
        self.connections = 0
        self.requests: list[tuple[bytes, dict[bytes, bytes], bytes]] = []
        self.raw: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass                                  # cancelled: the test is over
        finally:
            self.tasks.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def read_request(
        self, reader: asyncio.StreamReader
    ) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        """One request, or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head[:-4].split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
        self.raw.append(head + body)
        request = (lines[0], headers, body)
        self.requests.append(request)
        return request


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class Sink:
    """Records on_data / on_end calls."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.end: list[BaseException | None] = []
        self.ended = asyncio.Event()
        self.got_data = asyncio.Event()

    def on_data(self, data: bytes) -> None:
        self.data.append(data)
        self.got_data.set()

    def on_end(self, exc: BaseException | None) -> None:
        self.end.append(exc)
        self.ended.set()

    def attach(self, resp: UpstreamResponse) -> Sink:
        resp.set_sink(self.on_data, self.on_end)
        return self


async def settle(cond: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def echo_server(port: int = 0) -> Server:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await srv.read_request(reader) is not None:
            writer.write(ok(b"hello"))

    srv = Server(handler, port)
    return srv


# -- keep-alive, framing ------------------------------------------------------------------


def test_keep_alive_reuses_one_connection() -> None:
    async def main() -> None:
        async with echo_server() as srv:
            client = EngineClient(srv.url)
            for _ in range(3):
                status, headers, body = await client.fetch("GET", "/health", timeout_s=2)
                assert (status, body, headers["content-length"]) == (200, b"hello", "5")
            assert srv.connections == 1
            assert len(srv.requests) == 3
            assert (client.idle_connections, client.open_connections) == (1, 1)
            await client.close()
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_content_length_body_through_sink() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"01234")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"56789")
            await srv.read_request(reader)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("POST", "/v1/completions", b"{}", timeout_s=2)
            assert resp.status == 200
            assert resp.headers["x-a"] == "1, 2"
            sink = Sink().attach(resp)
            await sink.ended.wait()
            assert b"".join(sink.data) == b"0123456789"
            assert len(sink.data) == 2
            assert sink.end == [None]
            assert client.idle_connections == 1
            await client.close()

    run(main)


def test_chunked_body_is_dechunked() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD)
            for part in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
                await asyncio.sleep(0.02)
                writer.write(chunk(part))
            writer.write(b"0\r\n\r\n")
            await srv.read_request(reader)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("POST", "/v1/chat/completions", b"{}", timeout_s=2)
            sink = Sink().attach(resp)
            await sink.ended.wait()
            assert b"".join(sink.data) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            assert sink.end == [None]
            assert client.idle_connections == 1
            await client.close()

    run(main)


def test_close_delimited_body_ends_with_the_connection() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst ")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"second")
            await writer.drain()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/", timeout_s=2)
            sink = Sink().attach(resp)
            await sink.ended.wait()
            assert b"".join(sink.data) == b"first second"
            assert sink.end == [None]
            assert client.idle_connections == 0
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_one_on_data_per_network_read() -> None:
    async def main() -> None:
        go = asyncio.Event()
        more = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD)
            await go.wait()
            # several chunks in one send: one read on the client, one on_data call
            writer.write(chunk(b"data: a\n\n") + chunk(b"data: b\n\n") + chunk(b"data: c\n\n"))
            await more.wait()
            writer.write(chunk(b"data: d\n\n") + b"0\r\n\r\n")
            await srv.read_request(reader)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("POST", "/v1/completions", b"{}", timeout_s=2)
            sink = Sink().attach(resp)
            assert sink.data == []
            go.set()
            await sink.got_data.wait()
            await asyncio.sleep(0.05)
            assert sink.data == [b"data: a\n\ndata: b\n\ndata: c\n\n"]
            more.set()
            await sink.ended.wait()
            assert sink.data[1:] == [b"data: d\n\n"]
            assert sink.end == [None]
            await client.close()

    run(main)


def test_body_with_headers_is_delivered_inside_set_sink() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await srv.read_request(reader) is not None:
                writer.write(ok(b"all at once"))

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/", timeout_s=2)
            await asyncio.sleep(0.05)          # the whole message is in by now
            assert client.idle_connections == 1  # already back in the pool
            sink = Sink().attach(resp)           # delivered synchronously
            assert sink.data == [b"all at once"]
            assert sink.end == [None]
            with pytest.raises(RuntimeError):
                resp.set_sink(sink.on_data, sink.on_end)
            resp.abort()                         # over: must not touch the pooled socket
            assert client.idle_connections == 1
            assert (await client.fetch("GET", "/", timeout_s=2))[0] == 200
            assert srv.connections == 1
            await client.close()

    run(main)


def test_informational_responses_are_skipped() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(b"final"))
            await srv.read_request(reader)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            status, headers, body = await client.fetch("POST", "/", b"{}", timeout_s=2)
            assert (status, body) == (200, b"final")
            assert "link" not in headers
            await client.close()

    run(main)


def test_head_response_has_no_body() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            status, headers, body = await client.fetch("HEAD", "/", timeout_s=2)
            assert (status, headers["content-length"], body) == (200, "1234", b"")
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_connection_close_response_is_not_pooled() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await srv.read_request(reader) is not None:
                writer.write(ok(b"bye", b"Connection: close\r\n"))

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            assert (await client.fetch("GET", "/", timeout_s=2))[2] == b"bye"
            assert client.idle_connections == 0
            assert (await client.fetch("GET", "/", timeout_s=2))[2] == b"bye"
            assert srv.connections == 2
            await settle(lambda: client.open_connections == 0)

    run(main)


# -- request serialisation ----------------------------------------------------------------


def test_request_serialisation() -> None:
    async def main() -> None:
        async with echo_server() as srv:
            client = EngineClient(srv.url + "/", headers=[(b"Authorization", b"Bearer k")])
            await client.fetch("POST", "/v1/completions", b'{"a":1}',
                               [(b"X-Request-Id", b"r1")], timeout_s=2)
            await client.fetch("GET", "/health", timeout_s=2)
            host = srv.url.removeprefix("http://").encode()
            assert srv.raw[0] == (
                b"POST /v1/completions HTTP/1.1\r\nHost: " + host + b"\r\n"
                b"Content-Length: 7\r\nContent-Type: application/json\r\nAccept: */*\r\n"
                b"Authorization: Bearer k\r\nX-Request-Id: r1\r\n\r\n{\"a\":1}"
            )
            assert srv.raw[1] == (
                b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nAccept: */*\r\n"
                b"Authorization: Bearer k\r\n\r\n"
            )
            with pytest.raises(ValueError):
                await client.open("GET", "/x y", timeout_s=1)
            with pytest.raises(ValueError):
                await client.open("GET", "/", headers=[(b"X", b"a\r\nB: c")], timeout_s=1)
            await client.close()

    run(main)


def test_path_prefix_and_explicit_content_type() -> None:
    async def main() -> None:
        async with echo_server() as srv:
            client = EngineClient(srv.url + "/engine0")
            await client.fetch("POST", "/v1/x", b"a=1",
                               [(b"content-type", b"text/plain")], timeout_s=2)
            line, headers, _ = srv.requests[0]
            assert line == b"POST /engine0/v1/x HTTP/1.1"
            assert headers[b"content-type"] == b"text/plain"
            assert srv.raw[0].lower().count(b"content-type") == 1
            await client.close()

    run(main)


def test_large_request_body_is_sent_whole() -> None:
    async def main() -> None:
        payload = bytes(range(256)) * (8 << 12)          # 8 MiB: the transport pauses writing

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(0.1)                     # let the client's buffer fill up
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            writer.write(ok(b"%d" % len(body) if body == payload else b"bad"))
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            status, _, body = await client.fetch("POST", "/", payload, timeout_s=5)
            assert (status, body) == (200, str(len(payload)).encode())
            assert client.idle_connections == 1
            await client.close()

    run(main)


def test_tcp_nodelay_is_set() -> None:
    async def main() -> None:
        async with echo_server() as srv:
            client = EngineClient(srv.url)
            await client.fetch("GET", "/", timeout_s=2)
            (conn,) = client._idle
            sock = conn._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            await client.close()

    run(main)


# -- backpressure and abort ---------------------------------------------------------------


def test_pause_and_resume_reading_reach_the_engine() -> None:
    async def main() -> None:
        piece = b"x" * (256 << 10)
        total = 64                                        # 16 MiB: more than socket buffers
        finished = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD)
            for _ in range(total):
                writer.write(chunk(piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            finished.set()
            await srv.read_request(reader)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/stream", timeout_s=2)
            sink = Sink()
            received = 0

            def on_data(data: bytes) -> None:
                nonlocal received
                received += len(data)
                sink.on_data(data)
                resp.pause_reading()                   # a slow client: pause at once

            resp.set_sink(on_data, sink.on_end)
            await sink.got_data.wait()
            calls, seen = len(sink.data), received
            await asyncio.sleep(0.2)
            assert (len(sink.data), received) == (calls, seen)   # nothing read while paused
            assert not finished.is_set()                          # the engine is held back
            while not sink.ended.is_set():
                resp.resume_reading()
                await asyncio.sleep(0)
            assert received == total * len(piece)
            assert sink.end == [None]
            assert client.idle_connections == 1                   # reading resumed in the pool
            await client.close()

    run(main)


def test_abort_makes_the_engine_see_the_disconnect() -> None:
    async def main() -> None:
        seen: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
            with contextlib.suppress(ConnectionError):
                assert await reader.read() == b""
            seen.set_result(time.monotonic())

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("POST", "/v1/completions", b"{}", timeout_s=2)
            sink = Sink().attach(resp)
            await sink.got_data.wait()
            aborted_at = time.monotonic()
            resp.abort()
            resp.abort()                                  # idempotent
            assert await asyncio.wait_for(seen, 1.0) - aborted_at < 0.5
            await settle(lambda: client.open_connections == 0)
            assert sink.end == []                         # no sink calls after abort
            assert client.idle_connections == 0

    run(main)


def test_cancelled_open_closes_the_connection() -> None:
    async def main() -> None:
        seen = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            await reader.read()
            seen.set()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            task = asyncio.create_task(client.open("GET", "/", timeout_s=5))
            await settle(lambda: len(srv.requests) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(seen.wait(), 1.0)
            await settle(lambda: client.open_connections == 0)

    run(main)


# -- failures -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_connection_refused_is_a_connect_error() -> None:
    async def main() -> None:
        client = EngineClient(f"http://127.0.0.1:{free_port()}")
        with pytest.raises(UpstreamError) as info:
            await client.open("GET", "/", timeout_s=2)
        assert (info.value.kind, info.value.before_headers) == ("connect", True)
        assert client.open_connections == 0

    run(main)


def test_header_timeout() -> None:
    async def main() -> None:
        seen = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            await reader.read()                           # never answers; waits for EOF
            seen.set()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            started = time.monotonic()
            with pytest.raises(UpstreamError) as info:
                await client.open("POST", "/", b"{}", timeout_s=0.2)
            assert 0.15 < time.monotonic() - started < 1.0
            assert (info.value.kind, info.value.before_headers) == ("timeout", True)
            await asyncio.wait_for(seen.wait(), 1.0)     # the engine saw the disconnect
            await settle(lambda: client.open_connections == 0)

    run(main)


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("how", ["rst", "fin"])
def test_connection_dies_mid_body(how: str) -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            await asyncio.sleep(0.05)
            if how == "rst":
                _rst(writer)
            else:
                writer.close()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/", timeout_s=2)
            sink = Sink().attach(resp)
            await sink.ended.wait()
            assert b"".join(sink.data) == b"0123456789"
            (err,) = sink.end
            assert isinstance(err, UpstreamError)
            assert (err.kind, err.before_headers) == ("reset", False)
            assert client.open_connections == 0 and client.idle_connections == 0

    run(main)


def test_read_all_raises_when_the_body_is_cut() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD + chunk(b"partial"))
            await writer.drain()
            await asyncio.sleep(0.05)
            _rst(writer)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/", timeout_s=2)
            with pytest.raises(UpstreamError) as info:
                await resp.read_all()
            assert (info.value.kind, info.value.before_headers) == ("reset", False)

    run(main)


def test_reset_before_headers_on_a_fresh_connection_is_not_retried() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            _rst(writer)

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            with pytest.raises(UpstreamError) as info:
                await client.open("POST", "/", b"{}", timeout_s=2)
            assert (info.value.kind, info.value.before_headers) == ("reset", True)
            assert srv.connections == 1

    run(main)


def test_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served = 0
            while await srv.read_request(reader) is not None:
                if served == 1:                            # the keep-alive race: drop it
                    writer.close()
                    return
                served += 1
                writer.write(ok(b"fine"))

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            assert (await client.fetch("POST", "/", b"{}", timeout_s=2))[2] == b"fine"
            assert (await client.fetch("POST", "/", b"{}", timeout_s=2))[2] == b"fine"
            assert srv.connections == 2
            assert len(srv.requests) == 3
            await client.close()

    run(main)


def test_pooled_connection_closed_by_the_engine_leaves_the_pool() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(ok())
            await writer.drain()
            await asyncio.sleep(0.05)                     # the engine's keep-alive timeout

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            await client.fetch("GET", "/", timeout_s=2)
            await settle(lambda: client.open_connections == 0)
            assert client.idle_connections == 0
            assert (await client.fetch("GET", "/", timeout_s=2))[0] == 200
            assert srv.connections == 2

    run(main)


def test_malformed_response_is_a_protocol_error() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(b"HTTX/1.1 200 OK\r\n\r\n")
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            with pytest.raises(UpstreamError) as info:
                await client.open("GET", "/", timeout_s=2)
            assert (info.value.kind, info.value.before_headers) == ("protocol", True)
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_malformed_chunk_mid_body_is_a_protocol_error() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD + chunk(b"good"))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"zz\r\nbad\r\n")
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            sink = Sink().attach(await client.open("GET", "/", timeout_s=2))
            await sink.ended.wait()
            assert sink.data == [b"good"]
            (err,) = sink.end
            assert isinstance(err, UpstreamError)
            assert (err.kind, err.before_headers) == ("protocol", False)
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_unexpected_bytes_on_an_idle_connection_close_it() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(ok())
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(ok(b"nobody asked"))
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            await client.fetch("GET", "/", timeout_s=2)
            await settle(lambda: client.open_connections == 0)
            assert client.idle_connections == 0

    run(main)


def test_sink_exception_ends_the_exchange() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await srv.read_request(reader)
            writer.write(CHUNKED_HEAD)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(chunk(b"boom"))
            await reader.read()

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            resp = await client.open("GET", "/", timeout_s=2)
            sink = Sink()

            def on_data(data: bytes) -> None:
                raise KeyError(data)

            resp.set_sink(on_data, sink.on_end)
            await sink.ended.wait()
            assert isinstance(sink.end[0], KeyError)
            await settle(lambda: client.open_connections == 0)

    run(main)


# -- fetch, pool limits, idle timeout, close ----------------------------------------------


def test_fetch_limit_and_body_timeout() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while (req := await srv.read_request(reader)) is not None:
                if req[0].startswith(b"GET /big"):
                    writer.write(ok(b"x" * 1000))
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")

        async with Server(handler) as srv:
            client = EngineClient(srv.url)
            with pytest.raises(UpstreamError) as info:
                await client.fetch("GET", "/big", timeout_s=2, limit=100)
            assert (info.value.kind, info.value.before_headers) == ("protocol", False)
            started = time.monotonic()
            with pytest.raises(UpstreamError) as info:
                await client.fetch("GET", "/slow", timeout_s=0.2)
            assert (info.value.kind, info.value.before_headers) == ("timeout", False)
            assert time.monotonic() - started < 1.0
            await settle(lambda: client.open_connections == 0)

    run(main)


def test_max_idle_bounds_the_pool() -> None:
    async def main() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await srv.read_request(reader) is not None:
                await asyncio.sleep(0.05)
                writer.write(ok())

        async with Server(handler) as srv:
            client = EngineClient(srv.url, max_idle=2)
            results = await asyncio.gather(
                *(client.fetch("GET", "/", timeout_s=2) for _ in range(5)))
            assert [r[0] for r in results] == [200] * 5
            assert srv.connections == 5
            await settle(lambda: client.open_connections == 2)
            assert client.idle_connections == 2
            await client.close()
            assert client.idle_connections == 0
            await settle(lambda: client.open_connections == 0)
            with pytest.raises(UpstreamError) as info:
                await client.open("GET", "/", timeout_s=1)
            assert info.value.kind == "connect"

    run(main)


def test_idle_connections_time_out() -> None:
    async def main() -> None:
        async with echo_server() as srv:
            client = EngineClient(srv.url, idle_timeout_s=0.1)
            await client.fetch("GET", "/", timeout_s=2)
            assert client.idle_connections == 1
            await settle(lambda: client.open_connections == 0)
            assert client.idle_connections == 0
            assert (await client.fetch("GET", "/", timeout_s=2))[0] == 200
            assert srv.connections == 2
            await client.close()

    run(main)


def test_bad_urls_are_refused() -> None:
    for url in ("https://x:1", "ftp://x", "127.0.0.1:8000"):
        with pytest.raises(ValueError):
            EngineClient(url)


def test_client_built_outside_the_loop_and_max_idle_zero() -> None:
    port = free_port()
    client = EngineClient(f"http://127.0.0.1:{port}", max_idle=0)   # e.g. at config load

    async def main() -> None:
        async with echo_server(port) as srv:
            assert (await client.fetch("GET", "/", timeout_s=2))[0] == 200
            assert client.idle_connections == 0
            await settle(lambda: client.open_connections == 0)
            loop_client = EngineClient(srv.url, loop=asyncio.get_running_loop())
            assert (await loop_client.fetch("GET", "/", timeout_s=2))[0] == 200
            assert loop_client.idle_connections == 1
            await loop_client.close()

    run(main)
