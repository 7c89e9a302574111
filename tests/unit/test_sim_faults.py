"""Injected faults: each one misbehaves exactly as named, only for the request carrying it,
and ``/sim/stats`` records its outcome."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import FakeTransport, Harness, RawResponse, event_json, run_async

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 6, "return_token_ids": True}


def faulted(fault: str, body: dict[str, Any] | None = None, timeout: float = 2.0,
            **settings: Any) -> tuple[RawResponse, FakeTransport, dict[str, Any]]:
    async def go() -> tuple[RawResponse, FakeTransport, dict[str, Any]]:
        h = Harness(**settings)
        try:
            r, transport = await h.request("POST", CHAT, body or BODY, {"X-Sim-Fault": fault},
                                           timeout=timeout)
            await asyncio.sleep(0.01)
            stats, _ = await h.request("GET", "/sim/stats")
            return r, transport, stats.json()
        finally:
            h.close()

    result: tuple[RawResponse, FakeTransport, dict[str, Any]] = run_async(go())
    return result


def choice_lines(r: RawResponse) -> list[bytes]:
    return [e for e in r.events if b'"choices":[{' in e]


@pytest.mark.parametrize(("fault", "field"), [
    ("missing_ids", b"}]"),
    ("null_ids", b'"token_ids":null}]'),
    ("bool_ids", b'"token_ids":[true]}]'),
    ("negative_ids", b'"token_ids":[-'),
    ("float_ids", b".0]}]"),
    ("string_ids", b'"token_ids":["'),
])
def test_token_id_faults(fault: str, field: bytes) -> None:
    r, _, stats = faulted(fault)
    assert r.complete and r.events[-1] == b"data: [DONE]"
    content = [e for e in choice_lines(r) if b'"role"' not in e]
    assert content and all(field in e for e in content)
    if fault == "missing_ids":
        assert all(b"token_ids" not in e for e in content)
    assert stats["recent"][-1]["outcome"] == f"fault:{fault}"


def test_token_id_fault_after_n_tokens() -> None:
    r, _, _ = faulted("bool_ids:3")
    content = [e for e in choice_lines(r) if b'"role"' not in e]
    assert [b"[true]" in e for e in content] == [False, False, False, True, True, True]


def test_token_id_fault_in_non_streaming_body() -> None:
    r, _, _ = faulted("null_ids", {**BODY, "stream": False})
    assert r.json()["choices"][0]["token_ids"] is None
    r, _, _ = faulted("missing_ids", {**BODY, "stream": False})
    assert "token_ids" not in r.json()["choices"][0]


def test_malformed_json_event_mid_stream() -> None:
    r, _, _ = faulted("malformed_json:2")
    assert r.complete
    bad = [e for e in r.events if e.startswith(b"data: {") and not _valid(e[6:])]
    assert len(bad) == 1 and r.events.index(bad[0]) == 3  # role, token 1, token 2, broken
    assert r.events[-1] == b"data: [DONE]"


def _valid(payload: bytes) -> bool:
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    return True


def test_bad_sse_framing() -> None:
    r, _, _ = faulted("bad_sse:1")
    assert b"garbage framing" in r.body and r.complete


@pytest.mark.parametrize("stream", [True, False])
def test_bad_http_chunk_then_close(stream: bool) -> None:
    r, transport, stats = faulted("bad_chunk:2", {**BODY, "stream": stream})
    assert r.status == 200 and r.header("transfer-encoding") == "chunked"
    assert not r.complete and transport.closed and not transport.aborted
    assert transport.data.endswith(b"zz\r\nthis is not a chunk\r\n")
    assert stats["recent"][-1]["outcome"] == "fault:bad_chunk" and stats["running"] == 0


@pytest.mark.parametrize(("fault", "key"), [("audio", "audio"), ("annotations", "annotations"),
                                            ("custom_tool", "tool_calls")])
def test_unsupported_delta_fields(fault: str, key: str) -> None:
    r, _, _ = faulted(fault)
    deltas = [orjson.loads(e[6:])["choices"][0]["delta"] for e in choice_lines(r)]
    carrying = [d for d in deltas if key in d]
    assert len(carrying) == 1
    if fault == "custom_tool":
        call = carrying[0]["tool_calls"][0]
        assert call["type"] == "custom" and "custom" in call and "function" not in call
    r, _, _ = faulted(fault, {**BODY, "stream": False})
    message = r.json()["choices"][0]["message"]
    if fault == "custom_tool":
        assert message["tool_calls"][0]["type"] == "custom"
    else:
        assert message[key] is not None


def test_http_errors_before_the_stream() -> None:
    r, _, stats = faulted("http_500")
    assert r.status == 500 and r.json() == {"error": {
        "message": "Internal server error", "type": "InternalServerError", "param": None,
        "code": 500}}
    assert stats["recent"][-1]["outcome"] == "fault:http_500"
    r, _, _ = faulted("http_400")
    error = r.json()["error"]
    assert r.status == 400 and error["type"] == "BadRequestError" and error["code"] == 400
    assert error["message"].startswith("This model's maximum context length is 8192 tokens.")


def test_reset_before_headers() -> None:
    _, transport, stats = faulted("reset_before_headers")
    assert transport.aborted and transport.data == b""
    assert stats["recent"][-1]["outcome"] == "fault:reset_before_headers"
    assert stats["aborted"] == 0


@pytest.mark.parametrize("after", [0, 2])
def test_reset_mid_stream(after: int) -> None:
    r, transport, stats = faulted(f"reset_mid_stream:{after}")
    assert transport.aborted and r.status == 200 and not r.complete
    tokens = [e for e in choice_lines(r) if b'"role"' not in e]
    assert len(tokens) == after
    assert stats["running"] == 0 and stats["waiting"] == 0


def test_hang_before_headers_and_mid_stream() -> None:
    r, transport, stats = faulted("hang_before_headers", timeout=0.3)
    assert transport.data == b"" and not transport.closed
    assert stats["recent"][-1]["outcome"] == "fault:hang_before_headers"
    r, transport, stats = faulted("hang_mid_stream:3", timeout=0.3)
    assert not r.complete and not transport.closed
    assert len([e for e in choice_lines(r) if b'"role"' not in e]) == 3
    assert stats["running"] == 0  # the hung request left the batch


def test_error_event_uses_python_json_spacing() -> None:
    r, _, stats = faulted("error_event:2")
    assert stats["recent"][-1]["outcome"] == "fault:error_event"
    assert r.complete and r.events[-1] == b"data: [DONE]"
    err = r.events[-2]
    assert err == b"data: " + json.dumps({"error": {
        "message": "Internal server error", "type": "InternalServerError", "param": None,
        "code": 500}}).encode()
    assert b'{"error": {"message": ' in err
    assert len([e for e in choice_lines(r) if b'"role"' not in e]) == 2
    assert event_json(r.events[:1])[0]["choices"][0]["delta"]["role"] == "assistant"


def test_slow_headers_delay_the_response() -> None:
    async def go() -> tuple[float, float]:
        h = Harness()
        try:
            conn, transport = h.connect()
            start = h.loop.time()
            conn.data_received(h.raw_request("POST", CHAT, BODY,
                                              {"X-Sim-Fault": "slow_headers:150"}))
            first = done = 0.0
            for _ in range(400):
                if transport.data and not first:
                    first = h.loop.time() - start
                if transport.data.endswith(b"0\r\n\r\n"):
                    done = h.loop.time() - start
                    break
                await asyncio.sleep(0.002)
            return first, done
        finally:
            h.close()

    first, done = run_async(go())
    assert 0.14 <= first < 0.5 and done >= first


def test_fault_marker_in_prompt_and_isolation() -> None:
    body = {**BODY, "messages": [{"role": "user", "content": "x [[fault:http_500]]"}]}

    async def go() -> tuple[int, int]:
        h = Harness()
        try:
            bad, _ = await h.request("POST", CHAT, body)
            good, _ = await h.request("POST", CHAT, BODY)
            return bad.status, good.status
        finally:
            h.close()

    assert run_async(go()) == (500, 200)


def test_unknown_fault_is_a_400() -> None:
    r, _, _ = faulted("explode")
    assert r.status == 400 and "explode" in r.json()["error"]["message"]


def test_client_disconnect_aborts_and_frees_the_slot() -> None:
    async def go() -> dict[str, Any]:
        h = Harness(tpot_ms=5.0)
        try:
            conn, transport = h.connect()
            conn.data_received(h.raw_request("POST", CHAT, {**BODY, "max_tokens": 1000}))
            for _ in range(200):
                if transport.data.count(b"data: ") >= 3:
                    break
                await asyncio.sleep(0.002)
            assert h.engine.num_running == 1
            transport.close()  # the client went away
            await asyncio.sleep(0.02)
            stats, _ = await h.request("GET", "/sim/stats")
            return dict(stats.json())
        finally:
            h.close()

    stats = run_async(go())
    assert stats["aborted"] == 1 and stats["running"] == 0 and stats["completed"] == 0
    assert stats["recent"][-1]["outcome"] == "aborted"
    assert stats["recent"][-1]["headers"]["content-type"] == "application/json"
    assert stats["recent"][-1]["body"]["max_tokens"] == 1000
