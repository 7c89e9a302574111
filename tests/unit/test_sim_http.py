"""The simulator's HTTP/1.1 protocol over a recording fake transport: keep-alive, pipelining,
chunked request bodies, Expect, bad requests, idle timeout and the plain routes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from narwhal.sim import SimSettings, Simulator
from narwhal.sim.http import Connection

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import FakeTransport, Harness, parse_response, run_async

pytestmark = pytest.mark.timeout(30)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def _wait(transport: FakeTransport, predicate: Any, limit: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not predicate(bytes(transport.data)) and not transport.closed:
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.002)


def test_keep_alive_and_pipelining() -> None:
    async def go() -> tuple[list[int], bool]:
        h = Harness()
        try:
            conn, transport = h.connect()
            raw = Harness.raw_request("POST", "/v1/chat/completions", CHAT)
            conn.data_received(raw + Harness.raw_request("GET", "/health") + raw)
            await _wait(transport, lambda d: d.count(b"HTTP/1.1 200") == 3 and
                        d.endswith(b"}"))
            statuses, data = [], bytes(transport.data)
            for _ in range(3):
                r = parse_response(data)
                assert r.complete
                statuses.append(r.status)
                data = r.rest
            return statuses, transport.closed
        finally:
            h.close()

    assert run_async(go()) == ([200, 200, 200], False)


def test_chunked_request_body_and_expect_continue() -> None:
    async def go() -> bytes:
        h = Harness()
        try:
            conn, transport = h.connect()
            body = orjson.dumps(CHAT)
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                    b"transfer-encoding: chunked\r\n\r\n")
            conn.data_received(head)
            await asyncio.sleep(0)
            assert bytes(transport.data) == b"HTTP/1.1 100 Continue\r\n\r\n"
            half = len(body) // 2
            for part in (body[:half], body[half:]):
                conn.data_received(b"%x\r\n%b\r\n" % (len(part), part))
            conn.data_received(b"0\r\n\r\n")
            await _wait(transport, lambda d: d.endswith(b"}"))
            return bytes(transport.data)[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
        finally:
            h.close()

    r = parse_response(run_async(go()))
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_bad_request_line_gets_400_and_close() -> None:
    async def go() -> tuple[bytes, bool]:
        h = Harness()
        try:
            conn, transport = h.connect()
            conn.data_received(b"NOT HTTP AT ALL\r\n\r\n")
            await asyncio.sleep(0.01)
            return bytes(transport.data), transport.closed
        finally:
            h.close()

    data, closed = run_async(go())
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n") and closed


def test_connection_close_and_idle_timeout() -> None:
    async def go() -> tuple[bool, bool]:
        h = Harness()
        try:
            conn, transport = h.connect()
            conn.data_received(Harness.raw_request("GET", "/health",
                                                   headers={"connection": "close"}))
            await _wait(transport, lambda d: False, 0.05)
            closed_by_request = transport.closed and b"connection: close" in transport.data
            idle = Connection(h.app, h.loop, 0.05, h.connections, h.batch)
            t2 = FakeTransport(h.loop)
            t2.protocol = idle
            idle.connection_made(t2)  # type: ignore[arg-type]
            await asyncio.sleep(0.15)
            return closed_by_request, t2.closed
        finally:
            h.close()

    assert run_async(go()) == (True, True)


def test_routes_and_method_errors() -> None:
    async def go() -> dict[str, Any]:
        h = Harness()
        out: dict[str, Any] = {}
        try:
            for method, path in (("GET", "/v1/models"), ("GET", "/metrics"),
                                 ("GET", "/version"), ("GET", "/v1/chat/completions"),
                                 ("GET", "/missing"), ("POST", "/detokenize")):
                body = {"tokens": [16, 17]} if path == "/detokenize" else None
                r, _ = await h.request(method, path, body)
                out[f"{method} {path}"] = r
            r, _ = await h.request("POST", "/v1/chat/completions", b"{not json")
            out["bad json"] = r
            stats, _ = await h.request("GET", "/sim/stats")
            out["stats"] = stats.json()
            return out
        finally:
            h.close()

    out = run_async(go())
    models = out["GET /v1/models"].json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    card = models["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent",
                          "max_model_len", "permission"]
    metrics = out["GET /metrics"].body.decode()
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in metrics
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0' in metrics
    assert out["GET /version"].json() == {"version": "0.32.0"}
    assert out["GET /v1/chat/completions"].status == 405
    assert out["GET /v1/chat/completions"].header("allow") == "POST"
    assert out["GET /missing"].status == 404
    assert out["POST /detokenize"].json() == {"prompt": ".,"}
    assert out["bad json"].status == 400
    assert out["stats"]["received"] == 1 and out["stats"]["rejected"] == 1


def test_simulator_runs_inside_a_loop() -> None:
    async def go() -> tuple[int, bytes, int]:
        sim = Simulator(SimSettings(model="tiny", tpot_ms=1, prefill_overhead_ms=0))
        port = await sim.start("127.0.0.1", 0)
        try:
            with pytest.raises(RuntimeError):
                await sim.start("127.0.0.1", 0)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(Harness.raw_request("POST", "/v1/chat/completions",
                                             {**CHAT, "stream": True}))
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                assert chunk
                data += chunk
            writer.close()
            assert sim.app is not None
            return port, data, sim.app.stats.completed
        finally:
            await sim.stop()

    port, data, completed = run_async(go())
    r = parse_response(data)
    assert port > 0 and r.status == 200 and r.events[-1] == b"data: [DONE]"
    assert completed == 1
