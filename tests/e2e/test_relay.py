"""Streaming relay end to end: the openai SDK and raw HTTP through a real router process."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from procs import (
    MODEL,
    Proc,
    get_json,
    invariant_holds,
    metrics,
    router_config,
    start_router,
    start_sim,
)

pytestmark = pytest.mark.timeout(60)


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=30)


def _chat(stream_ids: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about narwhals"}],
        "max_tokens": 12,
        "stream": True,
    }
    if stream_ids:
        body["return_token_ids"] = True
    return body


def raw_post(base: str, path: str, body: dict[str, object]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def sse_events(raw: bytes) -> list[dict[str, object] | str]:
    out: list[dict[str, object] | str] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_openai_sdk_streams_tokens_with_null_ids(router: Proc) -> None:
    stream = client(router.url).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=10,
        stream=True,
    )
    text = ""
    chunks = 0
    for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.delta.role is None:
                assert choice.model_extra is not None
                assert choice.model_extra.get("token_ids") is None
    assert chunks >= 3
    assert text


def test_return_token_ids_are_relayed_exactly(router: Proc, engines: list[Proc]) -> None:
    status, _, via_router = raw_post(router.url, "/v1/chat/completions", _chat(stream_ids=True))
    assert status == 200
    status, _, direct = raw_post(engines[0].url, "/v1/chat/completions", _chat(stream_ids=True))
    assert status == 200
    routed, straight = sse_events(via_router), sse_events(direct)

    def ids(events: list[dict[str, object] | str]) -> list[int]:
        got: list[int] = []
        for ev in events:
            if isinstance(ev, dict):
                for ch in ev["choices"]:  # type: ignore[union-attr]
                    got += ch.get("token_ids") or []
        return got

    def prompt_ids(events: list[dict[str, object] | str]) -> object:
        first = events[0]
        assert isinstance(first, dict)
        return first["prompt_token_ids"]

    assert ids(routed) and ids(routed) == ids(straight)
    assert prompt_ids(routed) == prompt_ids(straight) and prompt_ids(routed)
    assert routed[-1] == "[DONE]"


def test_no_ids_asked_means_null_ids_and_no_usage_frame(router: Proc) -> None:
    status, headers, raw = raw_post(router.url, "/v1/chat/completions", _chat())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    bodies = [e for e in events if isinstance(e, dict)]
    assert bodies[0]["prompt_token_ids"] is None
    for ev in bodies:
        assert ev["choices"], "a usage-only frame reached a client that did not ask for usage"
        for ch in ev["choices"]:  # type: ignore[union-attr]
            assert ch.get("token_ids") is None


def test_completions_route_streams(router: Proc) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, _, raw = raw_post(router.url, "/v1/completions", body)
    assert status == 200
    events = [e for e in sse_events(raw) if isinstance(e, dict)]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6  # type: ignore[index]
    assert all(ch["token_ids"] is None for e in events[:-1] for ch in e["choices"])  # type: ignore[union-attr]


def _request_bytes(body: dict[str, object], path: str = "/v1/chat/completions") -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


def _read_responses(sock: socket.socket, count: int, timeout: float = 20.0) -> bytes:
    sock.settimeout(timeout)
    buf = b""
    deadline = time.monotonic() + timeout
    while buf.count(b"data: [DONE]") < count and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def test_keepalive_reuse_and_pipelining(router: Proc) -> None:
    host, port = router.url[len("http://") :].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(_request_bytes(_chat()))
        first = _read_responses(sock, 1)
        assert first.startswith(b"HTTP/1.1 200")
        # the same connection serves a second request, then two pipelined ones in order
        sock.sendall(
            _request_bytes(_chat())
            + _request_bytes(
                {"model": MODEL, "prompt": "pipelined", "max_tokens": 3, "stream": True},
                "/v1/completions",
            )
        )
        rest = _read_responses(sock, 2)
    assert rest.count(b"HTTP/1.1 200") == 2
    chat_at, cmpl_at = rest.index(b"chat.completion.chunk"), rest.index(b"text_completion")
    assert chat_at < cmpl_at


def test_chunked_upload(router: Proc) -> None:
    data = json.dumps(_chat()).encode()
    half = len(data) // 2
    body = b"%x\r\n%b\r\n%x\r\n%b\r\n0\r\n\r\n" % (half, data[:half], len(data) - half, data[half:])
    host, port = router.url[len("http://") :].split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
            b"content-type: application/json\r\n\r\n" + body
        )
        out = _read_responses(sock, 1)
    assert out.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in out


def test_client_disconnect_cancels_engine_request(router: Proc, engines: list[Proc]) -> None:
    before = [get_json(e.url + "/sim/stats")["aborted"] for e in engines]
    body = _chat()
    body["max_tokens"] = 2000
    host, port = router.url[len("http://") :].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(_request_bytes(body))
    sock.settimeout(10)
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(65536)
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = [get_json(e.url + "/sim/stats")["aborted"] for e in engines]
        if sum(after) > sum(before):
            break
        time.sleep(0.05)
    assert sum(after) == sum(before) + 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = metrics(router.url)
        if m.get("narwhal_retained_requests") == 0:
            break
        time.sleep(0.05)
    assert m["narwhal_retained_requests"] == 0 and invariant_holds(m)
    assert m["narwhal_cancelled_total"] >= 1


def _wait_inflight(base: str, phase: str, timeout: float = 10.0) -> None:
    """Until some engine has a request in ``phase`` (bounded)."""
    deadline = time.monotonic() + timeout
    while not any(v for k, v in metrics(base).items()
                  if k.startswith("narwhal_engine_inflight") and f'phase="{phase}"' in k):
        assert time.monotonic() < deadline, f"no request reached {phase}"
        time.sleep(0.02)


def test_sigterm_drains_inflight_stream(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "10")  # its 128-token answer: ~1.3 s of decode
    try:
        _drain_on_sigterm(tmp_path, sim)
    finally:
        sim.stop()


def _drain_on_sigterm(tmp: Path, sim: Proc) -> None:
    proc = start_router(tmp, router_config([sim.url]))
    try:
        body = _chat()
        body["max_tokens"] = 200
        result: dict[str, object] = {}

        def run() -> None:
            result["resp"] = raw_post(proc.url, "/v1/chat/completions", body)

        t = threading.Thread(target=run)
        t.start()
        _wait_inflight(proc.url, "decode")  # the stream is under way
        proc.signal(signal.SIGTERM)
        t.join(20)
        status, _, raw = result["resp"]  # type: ignore[misc]
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        assert proc.wait(15) == 0
    finally:
        proc.stop()


def test_client_leaving_while_the_engine_hangs_before_headers_ends_at_once(router: Proc) -> None:
    """The engine has not answered yet: the client's departure must not wait for the deadline."""
    body = _chat()
    body["messages"] = [{"role": "user", "content": "wait [[fault:hang_before_headers]]"}]
    host, port = router.url[len("http://") :].split(":")
    before = metrics(router.url)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(_request_bytes(body))
    _wait_inflight(router.url, "prefill")  # dispatched: the engine holds it without answering
    sock.close()
    deadline = time.monotonic() + 3
    m = metrics(router.url)
    while m["narwhal_retained_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
        m = metrics(router.url)
    assert m["narwhal_retained_requests"] == 0, "the request stayed retained after its client left"
    assert m["narwhal_cancelled_total"] - before["narwhal_cancelled_total"] == 1
    assert all(v == 0 for k, v in m.items() if k.startswith("narwhal_engine_inflight"))
    assert invariant_holds(m)
