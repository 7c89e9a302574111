"""Test helpers for the engine simulator: raw HTTP response parsing, an in-process harness
over a recording fake transport (no sockets), and a real ``python -m narwhal.sim`` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from narwhal.sim.app import SimApp
from narwhal.sim.engine import Engine
from narwhal.sim.http import Connection, WriteBatch
from narwhal.sim.settings import SimSettings

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RawResponse:
    """One HTTP/1.1 response as bytes arrived: status, headers in order, body, chunk list."""

    status: int = 0
    head: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    chunks: list[bytes] | None = None
    complete: bool = False
    rest: bytes = b""  # bytes after the end of this response

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def events(self) -> list[bytes]:
        """SSE events (``data: ...`` without the blank line)."""
        return [e for e in self.body.split(b"\n\n") if e]

    def json(self) -> Any:
        return orjson.loads(self.body)


def parse_response(data: bytes) -> RawResponse:
    """Parse as much of one response as ``data`` holds (chunked or Content-Length)."""
    r = RawResponse()
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return r
    r.head = data[:end]
    lines = r.head.decode("latin-1").split("\r\n")
    r.status = int(lines[0].split(" ")[1])
    r.headers = [(k.lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])]
    rest = data[end + 4 :]
    length = r.header("content-length")
    if length is not None:
        n = int(length)
        r.body, r.complete, r.rest = rest[:n], len(rest) >= n, rest[n:]
        return r
    if r.header("transfer-encoding") != "chunked":
        r.body = rest
        return r
    r.chunks = []
    pos = 0
    while True:
        eol = rest.find(b"\r\n", pos)
        if eol < 0:
            break
        try:
            size = int(rest[pos:eol], 16)
        except ValueError:
            break  # framing broken on purpose (bad_sse) or truncated
        start = eol + 2
        if len(rest) < start + size + 2:
            break
        if size == 0:
            r.complete, r.rest = True, rest[start + 2 :]
            break
        r.chunks.append(rest[start : start + size])
        pos = start + size + 2
    r.body = b"".join(r.chunks)
    return r


class FakeTransport:
    """Records what the protocol writes; close/abort report connection loss like asyncio."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.data = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.protocol: Connection | None = None
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.data += data
        self.changed.set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def _lose(self) -> None:
        if not self.closed:
            self.closed = True
            self.changed.set()
            if self.protocol is not None:
                self.loop.call_soon(self.protocol.connection_lost, None)

    def close(self) -> None:
        self._lose()

    def abort(self) -> None:
        self.aborted = True
        self._lose()


class Harness:
    """The simulator's app, engine and HTTP protocol in this loop, with no sockets."""

    def __init__(self, settings: SimSettings | None = None, **overrides: Any) -> None:
        base = dict(model="tiny", tpot_ms=0.0, prefill_overhead_ms=0.0, output_len="100000",
                    keepalive_timeout_s=0.0)
        base.update(overrides)
        self.settings = settings or SimSettings(**base)  # type: ignore[arg-type]
        self.loop = asyncio.get_running_loop()
        self.batch = WriteBatch()
        self.engine = Engine(self.settings, self.loop, self.batch)
        self.app = SimApp(self.settings, self.engine)
        self.connections: set[Connection] = set()

    def connect(self) -> tuple[Connection, FakeTransport]:
        conn = Connection(self.app, self.loop, 0.0, self.connections, self.batch)
        transport = FakeTransport(self.loop)
        transport.protocol = conn
        conn.connection_made(transport)  # type: ignore[arg-type]
        return conn, transport

    @staticmethod
    def raw_request(method: str, path: str, body: Any = None,
                    headers: dict[str, str] | None = None) -> bytes:
        payload = b"" if body is None else (body if isinstance(body, bytes)
                                            else orjson.dumps(body))
        lines = [f"{method} {path} HTTP/1.1", "host: sim"]
        for key, value in (headers or {}).items():
            lines.append(f"{key}: {value}")
        if method != "GET" or payload:
            lines.append("content-type: application/json")
            lines.append(f"content-length: {len(payload)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload

    async def request(self, method: str, path: str, body: Any = None,
                      headers: dict[str, str] | None = None, timeout: float = 5.0,
                      ) -> tuple[RawResponse, FakeTransport]:
        """Send one request on a fresh connection; wait until its response is complete
        (or the connection is gone, or ``timeout``)."""
        conn, transport = self.connect()
        conn.data_received(self.raw_request(method, path, body, headers))
        deadline = self.loop.time() + timeout
        while True:
            r = parse_response(bytes(transport.data))
            if r.complete or transport.closed or self.loop.time() > deadline:
                return r, transport
            transport.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(transport.changed.wait(),
                                       max(0.0, deadline - self.loop.time()))

    def close(self) -> None:
        self.engine.close()


class SimProcess:
    """``python -m narwhal.sim`` on a free loopback port; a context manager that stops it."""

    def __init__(self, *args: str, start_timeout: float = 15.0) -> None:
        self.args = ["--host", "127.0.0.1", "--port", "0", "--exit-with-parent", *args]
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0
        self.first_line = ""

    def __enter__(self) -> SimProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO / "python") + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "narwhal.sim", *self.args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(self.start_timeout)
        if not line or not line[0]:
            self.stop()
            raise RuntimeError("simulator did not print its listening line in time")
        self.first_line = line[0].decode().rstrip("\n")
        self.url = self.first_line.rsplit(" ", 1)[1]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the process and wait for it; kill it if it does not exit. Return its code."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        return int(proc.returncode)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout`` (bounded loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def event_json(events: list[bytes]) -> list[Any]:
    """Parse ``data: {...}`` events (``[DONE]`` is kept as the string ``"[DONE]"``)."""
    out: list[Any] = []
    for event in events:
        assert event.startswith(b"data: "), event
        payload = event[6:]
        out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


def run_async(coro: Any, timeout: float = 20.0) -> Any:
    """Run one coroutine to completion with an overall time limit."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())
