"""Helpers for the fleet and HA end-to-end tests: raw HTTP, admin calls, counter deltas, a
fault-injecting TCP proxy in front of a real simulator, and a real redis-server process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from procs import MODEL, Proc, free_port, http, metrics, router_config

from narwhal.config import sections as _sections

TOKEN = "fleet-test-token"
ADMIN_ENV = {"NARWHAL_FLEET_TEST_TOKEN": TOKEN}
ADMIN_SECTION = {"token_env": "NARWHAL_FLEET_TEST_TOKEN"}


def fleet_config(engine_urls: list[str], **sections: Any) -> dict[str, Any]:
    """``router_config`` with open admission and, where this build has the key, least-loaded
    placement: ties rotate, so a few requests reach every eligible engine whatever the
    learned model thinks of it (these tests steer traffic by health, drain and faults)."""
    sections.setdefault("admission", {"mode": "open"})
    if hasattr(_sections, "Scheduling"):
        sections.setdefault("scheduling", {"policy": "least_loaded"})
    return router_config(engine_urls, **sections)


# -- HTTP ------------------------------------------------------------------------------------
# In every test request's prompt, so engines' records tell them from the router's own
# requests (profiling probes, tokenizer calls).
MARK = "fleet-test-request"


def chat(content: str = "Tell me about narwhals", *, stream: bool = False,
         max_tokens: int = 8) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"{MARK} {content}"}],
            "max_tokens": max_tokens, "stream": stream}


def complete(base: str, body: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return http(base, "POST", "/v1/chat/completions", body or chat(), headers)


def admin(base: str, path: str, body: dict[str, Any] | bytes | None = None, *,
          token: str | None = TOKEN, method: str = "POST") -> tuple[int, dict[str, str], Any]:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    status, hdrs, raw = http(base, method, path, body, headers)
    return status, hdrs, json.loads(raw) if raw else None


def ready(base: str) -> tuple[int, dict[str, Any]]:
    status, _, raw = http(base, "GET", "/ready")
    return status, json.loads(raw)


def engines(base: str) -> dict[str, dict[str, Any]]:
    _, _, raw = http(base, "GET", "/engines")
    return {e["name"]: e for e in json.loads(raw)["engines"]}


def envelope(raw: bytes) -> dict[str, Any]:
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


def assert_refused(resp: tuple[int, dict[str, str], bytes], status: int, code: str,
                   retry_after: str | None = "1") -> None:
    got_status, headers, raw = resp
    assert got_status == status, (got_status, raw)
    assert envelope(raw)["code"] == code
    assert headers.get("retry-after") == retry_after


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {got!r})")
        time.sleep(every)


class Counters:
    """``/metrics`` deltas since construction, and the accounting invariant."""

    def __init__(self, base: str):
        self.base = base
        self.before = metrics(base)

    def delta(self) -> dict[str, float]:
        after = metrics(self.base)
        keys = set(after) | set(self.before)
        return {k: after.get(k, 0.0) - self.before.get(k, 0.0) for k in keys
                if after.get(k, 0.0) != self.before.get(k, 0.0)}

    def settled(self, timeout: float = 10.0) -> dict[str, float]:
        """Wait until nothing is retained, check the invariant, return the deltas."""

        def idle() -> dict[str, float] | None:
            m = metrics(self.base)
            return m if m.get("narwhal_retained_requests") == 0 else None

        m = wait_for(idle, timeout)
        offered = m.get("narwhal_offered_total", 0.0)
        classes = ("rejected", "refused", "invalid_requests", "expired", "failed", "cancelled",
                   "completed")
        terminal = sum(v for k, v in m.items() for c in classes
                       if k.startswith(f"narwhal_{c}_total"))
        assert offered == terminal + m["narwhal_retained_requests"], m
        return self.delta()


def sim_received(sim: Proc) -> int:
    """Test requests (carrying MARK) among the simulator's last 32 completion requests."""
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return sum(MARK in json.dumps(r["body"]) for r in json.loads(raw)["recent"])


def start_sim_on(port: int, *flags: str) -> Proc:
    """A simulator on a fixed port (to restart an engine where the router expects it); port
    0 takes a free one as it binds (a port picked ahead by ``free_port`` may be taken by
    then, as another connection's local port)."""
    return Proc([sys.executable, "-m", "narwhal.sim", "--host", "127.0.0.1", "--port",
                 str(port), "--tpot-ms", "2", "--prefill-tokens-per-s", "200000", *flags],
                ready="listening on")


# -- a fault-injecting proxy -----------------------------------------------------------------
class FaultProxy:
    """A TCP proxy in front of one engine, run on its own event loop thread.

    Modes: ``pass`` forwards bytes both ways; ``hang`` accepts and never answers (probes time
    out: the engine's state is unknown); ``fault:<name[:arg]>`` forwards, but adds
    ``X-Sim-Fault`` to every completion request, so only this engine misbehaves. Changing
    the mode closes every open connection, so the next request sees the new mode. ``posts``
    counts test requests (carrying MARK) that reached the engine.
    """

    def __init__(self, target_port: int, mode: str = "pass"):
        self.target_port = target_port
        self._mode = mode
        self.posts = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(5)
        assert self._server is not None
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        started.set()
        self._loop.run_forever()

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        done = threading.Event()

        def switch() -> None:
            self._mode = mode
            for w in list(self._writers):
                w.close()
            done.set()

        self._loop.call_soon_threadsafe(switch)
        done.wait(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._mode == "hang":
                await reader.read()  # until the router gives up and closes
                return
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(upstream)
            back = asyncio.ensure_future(self._pipe(up_reader, writer))
            mode = self._mode
            while data := await reader.read(65536):
                if data.startswith((b"POST /v1/chat/completions ", b"POST /v1/completions ")):
                    self.posts += MARK.encode() in data
                    if mode.startswith("fault:"):
                        line, sep, rest = data.partition(b"\r\n")
                        data = line + sep + f"X-Sim-Fault: {mode[6:]}\r\n".encode() + rest
                upstream.write(data)
            back.cancel()
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
        except (ConnectionError, OSError):
            transport = writer.transport
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # pass the engine's reset on as a reset
        finally:
            writer.close()

    def close(self) -> None:
        def stop() -> None:
            assert self._server is not None
            self._server.close()
            for w in list(self._writers):
                w.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(5)


# -- redis-server ----------------------------------------------------------------------------
class RedisServer:
    """A real ``redis-server`` on a free loopback port, without persistence."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Proc | None = None

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.proc = Proc([binary, "--port", str(self.port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no"],
                         ready="Ready to accept connections")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
