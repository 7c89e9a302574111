"""EngineConnection driven by a recording fake transport: no sockets, exact read boundaries."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from narwhal.upstream.client import EngineClient, UpstreamError, UpstreamResponse
from narwhal.upstream.connection import EngineConnection
from narwhal.upstream.response import BODY_ENDED, BODY_MALFORMED, FlowControl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference.chunked_oracle import ChunkedDecoder, ChunkError


def run(main: Callable[[], Awaitable[Any]], timeout: float = 5.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return uvloop.run(bounded())


class FakeTransport(asyncio.Transport):
    """Records writes and pause state; close/abort report connection_lost on the next tick."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: EngineConnection | None = None
        self.writes: list[bytes] = []
        self.reading = True
        self.closing = False
        self.aborted = False
        self.buffered = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def _lose(self, exc: Exception | None) -> None:
        if not self.closing:
            self.closing = True
            assert self.protocol is not None
            self.loop.call_soon(self.protocol.connection_lost, exc)

    def close(self) -> None:
        self._lose(None)

    def abort(self) -> None:
        self.aborted = True
        self._lose(None)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connect(client: EngineClient) -> tuple[EngineConnection, FakeTransport]:
    loop = asyncio.get_running_loop()
    conn = EngineConnection(loop, client)
    transport = FakeTransport(loop)
    transport.protocol = conn
    conn.connection_made(transport)
    return conn, transport


HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def start(conn: EngineConnection, request: bytes = b"GET / HTTP/1.1\r\n\r\n",
                timeout: float = 2.0) -> asyncio.Task[UpstreamResponse]:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(
        conn.request(request, head=False, deadline=loop.time() + timeout))
    await asyncio.sleep(0)
    return task


def test_request_is_one_write() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9", headers=[(b"Authorization", b"Bearer x")])
        conn, transport = connect(client)
        data = client._serialize("POST", "/v1/chat/completions", b"{}" * 1000, [(b"X-Y", b"z")])
        task = await start(conn, data)
        assert transport.writes == [data]
        conn.data_received(HEAD)
        assert (await task).status == 200
        conn.abort()

    run(main)


def test_one_on_data_per_read_and_split_framing() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn)
        conn.data_received(HEAD[:10])
        conn.data_received(HEAD[10:] + chunk(b"early"))
        resp = await task
        calls: list[bytes] = []
        ends: list[BaseException | None] = []
        resp.set_sink(calls.append, ends.append)
        assert calls == [b"early"]
        conn.data_received(chunk(b"a") + chunk(b"bb") + chunk(b"ccc"))
        assert calls[1:] == [b"abbccc"]
        wire = chunk(b"split across reads")
        conn.data_received(wire[:7])
        conn.data_received(wire[7:])
        assert calls[2:] == [b"spl", b"it across reads"]
        conn.data_received(b"0\r\n")                   # last-chunk: no body, no call
        assert len(calls) == 4 and ends == []
        conn.data_received(b"\r\n")
        assert ends == [None]
        assert client.idle_connections == 1 and not transport.closing
        await client.close()

    run(main)


def test_single_piece_is_passed_without_a_copy_of_the_read() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, _ = connect(client)
        task = await start(conn)
        conn.data_received(HEAD)
        resp = await task
        calls: list[bytes] = []
        resp.set_sink(calls.append, lambda exc: None)
        conn.data_received(chunk(b"x" * 100))
        assert calls == [b"x" * 100]
        conn.abort()

    run(main)


def test_pause_and_resume_map_to_the_transport() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn)
        conn.data_received(HEAD)
        resp = await task
        resp.set_sink(lambda data: resp.pause_reading(), lambda exc: None)
        conn.data_received(chunk(b"x"))
        assert not transport.reading
        resp.pause_reading()
        resp.resume_reading()
        assert transport.reading
        resp.pause_reading()
        conn.data_received(b"0\r\n\r\n")              # ends while paused: the pool resumes it
        assert transport.reading
        assert client.idle_connections == 1
        resp.pause_reading()                           # detached: no effect on the pooled socket
        assert transport.reading
        await client.close()

    run(main)


def test_request_waits_for_drain_and_headers_release_it() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        conn.pause_writing()
        task = await start(conn)
        await asyncio.sleep(0.01)
        assert not task.done()
        conn.resume_writing()                          # drained: now waits for headers
        await asyncio.sleep(0.01)
        assert not task.done()
        conn.pause_writing()
        transport.buffered = 10                        # request still unsent: never reuse
        conn.data_received(HEAD + b"0\r\n\r\n")        # an early answer also releases drain
        assert (await task).status == 200
        assert client.idle_connections == 0 and transport.closing

    run(main)


def test_connection_lost_releases_every_waiter() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, _ = connect(client)
        conn.pause_writing()
        task = await start(conn)
        conn.connection_lost(ConnectionResetError())
        with pytest.raises(UpstreamError) as info:
            await task
        assert (info.value.kind, info.value.before_headers) == ("reset", True)

        conn, _ = connect(client)
        task = await start(conn)
        conn.data_received(HEAD + chunk(b"x"))
        resp = await task
        conn.connection_lost(None)                     # before set_sink: kept for it
        ends: list[BaseException | None] = []
        resp.set_sink(lambda data: None, ends.append)
        assert isinstance(ends[0], UpstreamError) and ends[0].kind == "reset"
        assert ends[0].before_headers is False

    run(main)


def test_header_timeout_aborts() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn, timeout=0.05)
        with pytest.raises(UpstreamError) as info:
            await task
        assert info.value.kind == "timeout"
        assert transport.aborted

    run(main)


def test_junk_after_a_complete_response_keeps_the_response_but_not_the_socket() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n")
        resp = await task
        assert await resp.read_all() == b"ok"
        assert transport.closing and client.idle_connections == 0

    run(main)


def test_abort_inside_on_data_stops_delivery() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn)
        conn.data_received(HEAD + chunk(b"x"))
        resp = await task
        calls: list[bytes] = []
        ends: list[BaseException | None] = []

        def on_data(data: bytes) -> None:
            calls.append(data)
            resp.abort()

        resp.set_sink(on_data, ends.append)             # buffered data, abort inside
        conn.data_received(chunk(b"y") + b"0\r\n\r\n")  # too late: nobody listens
        assert calls == [b"x"] and ends == []
        assert transport.aborted and client.idle_connections == 0

    run(main)


def test_flow_control_release_wakes_drain() -> None:
    async def main() -> None:
        transport = FakeTransport(asyncio.get_running_loop())
        flow = FlowControl(transport)
        flow.pause_writing()
        waiter = asyncio.ensure_future(flow.drain())
        await asyncio.sleep(0)
        assert not waiter.done()
        flow.release()
        await asyncio.wait_for(waiter, 1.0)
        assert not flow.write_paused

    run(main)


class RawSink:
    """A pump that de-chunks with the reference decoder and records; the flags are its."""

    def __init__(self) -> None:
        self.decoder = ChunkedDecoder()
        self.reads: list[bytes] = []
        self.body: list[bytes] = []
        self.events: list[int] = []

    def pump(self, data: bytes) -> int:
        self.reads.append(data)
        flags = 0
        try:
            self.decoder.feed(data, self.body.append)
        except ChunkError:
            flags |= BODY_MALFORMED
        return flags | (BODY_ENDED if self.decoder.done else 0)


def test_raw_sink_takes_reads_from_a_chunk_boundary_and_recycles_the_connection() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        task = await start(conn)
        conn.data_received(HEAD + chunk(b"first") + b"5")  # mid size line: not yet
        resp = await task
        body: list[bytes] = []
        ends: list[BaseException | None] = []
        resp.set_sink(body.append, ends.append)
        sink = RawSink()
        assert not resp.set_raw_sink(sink.pump, sink.events.append)
        conn.data_received(b"\r\nhello\r\n")                # at a boundary now
        assert resp.set_raw_sink(sink.pump, sink.events.append)
        conn.data_received(chunk(b"raw"))
        assert body == [b"first", b"hello"] and sink.body == [b"raw"] and sink.events == []
        conn.data_received(b"0\r\n\r\n")
        assert sink.events == [BODY_ENDED] and ends == [None]
        assert client.idle_connections == 1 and not transport.closing
        # The next response on the reused connection is parsed from its status line.
        task = await start(conn)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        assert await (await task).read_all() == b"ok"
        await client.close()

    run(main)


def test_raw_sink_refused_without_chunked_framing() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, _ = connect(client)
        task = await start(conn)
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        resp = await task
        resp.set_sink(lambda data: None, lambda exc: None)
        sink = RawSink()
        assert not resp.set_raw_sink(sink.pump, sink.events.append)
        conn.abort()

    run(main)


def test_raw_bad_framing_is_a_protocol_error_and_junk_after_the_end_drops_the_socket() -> None:
    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        for wire, error in ((b"5\r\nhelloX", "protocol"), (b"0\r\n\r\nHTTP/1.1", None)):
            conn, transport = connect(client)
            task = await start(conn)
            conn.data_received(HEAD)
            resp = await task
            ends: list[BaseException | None] = []
            resp.set_sink(lambda data: None, ends.append)
            sink = RawSink()
            assert resp.set_raw_sink(sink.pump, sink.events.append)
            conn.data_received(wire)
            assert len(ends) == 1 and transport.closing
            end = ends[0]
            assert (end.kind if isinstance(end, UpstreamError) else end) == error
            assert client.idle_connections == 0

    run(main)
