"""The admission table through a real router process: one test per row, with counters."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import (
    MODEL,
    Proc,
    free_port,
    http,
    invariant_holds,
    metrics,
    router_config,
    start_router,
    start_sim,
)

pytestmark = pytest.mark.timeout(90)


def post(
    base: str,
    path: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> tuple[int, dict[str, str], bytes]:
    """A raw HTTP/1.1 POST on its own connection: (status, lower-cased headers, body)."""
    return http(base, "POST", path, body, headers, timeout)


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **extra,
    }


def error_of(body: bytes) -> dict[str, Any]:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err  # type: ignore[no-any-return]


def delta(before: dict[str, float], after: dict[str, float], series: str) -> float:
    return after.get(series, 0.0) - before.get(series, 0.0)


def settle(base: str, timeout: float = 5.0) -> dict[str, float]:
    """Scrape until nothing is retained (every request reached its terminal class)."""
    deadline = time.monotonic() + timeout
    m = metrics(base)
    while time.monotonic() < deadline and (
        m.get("narwhal_retained_requests") or m.get("narwhal_queued_requests")
    ):
        time.sleep(0.05)
        m = metrics(base)
    return m


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start_sim("--tpot-ms", "20", "--prefill-tokens-per-s", "100000")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def router(sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    cfg = router_config(
        [sim.url],
        engines=[
            {"name": "e0", "url": sim.url, "dialect": "vllm", "max_prefill": 1, "max_decode": 1}
        ],
        serving={"max_request_bytes": 4096, "http_retention_limit": 3},
        # max_wait_s: long enough that a stalled test still finds the queue full (below).
        admission={"mode": "open", "queue_limit": 1, "max_wait_s": 1.2},
    )
    proc = start_router(tmp_path_factory.mktemp("adm"), cfg)
    yield proc
    proc.stop()


BAD_BODIES = [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_request", None),
    (
        json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(),
        400,
        "invalid_request",
        "model",
    ),
    (
        json.dumps(chat(stream_options={"include_usage": "yes"}, stream=True)).encode(),
        400,
        "invalid_request",
        "stream_options.include_usage",
    ),
    (
        json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "a"}, {"role": 3}]}
        ).encode(),
        400,
        "invalid_request",
        "messages[1].role",
    ),
    (json.dumps(chat(max_tokens=True)).encode(), 400, "invalid_request", "max_tokens"),
    (json.dumps(chat(max_tokens=1.5)).encode(), 400, "invalid_request", "max_tokens"),
    (json.dumps({**chat(), "model": "other-model"}).encode(), 404, "model_not_found", "model"),
    (json.dumps(chat(n=2)).encode(), 400, "invalid_sampling_width", "n"),
    (json.dumps(chat(best_of=3)).encode(), 400, "invalid_sampling_width", "best_of"),
    (
        json.dumps(chat(modalities=["text", "audio"])).encode(),
        400,
        "unsupported_option",
        "modalities",
    ),
    (
        json.dumps(chat(audio={"voice": "alloy", "format": "wav"})).encode(),
        400,
        "unsupported_option",
        "audio",
    ),
    (
        json.dumps(
            chat(
                tools=[
                    {"type": "function", "function": {"name": "f"}},
                    {"type": "custom", "custom": {"name": "g"}},
                ]
            )
        ).encode(),
        400,
        "unsupported_option",
        "tools[1].type",
    ),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), BAD_BODIES)
def test_invalid_request_rows(
    router: Proc, body: bytes, status: int, code: str, param: str | None
) -> None:
    before = metrics(router.url)
    got, headers, raw = post(router.url, "/v1/chat/completions", body)
    assert got == status
    err = error_of(raw)
    assert (err["code"], err["param"], err["type"]) == (code, param, "invalid_request_error")
    if code == "invalid_sampling_width":
        assert "Invalid sampling width" in err["message"]
    assert "retry-after" not in headers
    after = settle(router.url)
    assert delta(before, after, f'narwhal_invalid_requests_total{{reason="{code}"}}') == 1
    assert delta(before, after, "narwhal_offered_total") == 1
    assert invariant_holds(after)


def test_streaming_request_with_audio_is_not_refused(router: Proc) -> None:
    status, _, raw = post(
        router.url, "/v1/chat/completions", chat(stream=True, modalities=["text", "audio"])
    )
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")


def test_request_too_large_from_content_length(router: Proc) -> None:
    before = metrics(router.url)
    status, headers, raw = post(router.url, "/v1/chat/completions", chat("x" * 5000))
    assert status == 413 and error_of(raw)["code"] == "request_too_large"
    assert headers.get("connection") == "close"
    after = settle(router.url)
    assert delta(before, after, 'narwhal_invalid_requests_total{reason="request_too_large"}') == 1
    assert delta(before, after, "narwhal_unsized_offered_total") == 1


def test_request_too_large_chunked_is_cut_off_early(router: Proc) -> None:
    host, port = router.url[len("http://") :].split(":")
    before = metrics(router.url)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        piece = b"x" * 3000
        sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) * 2)  # 6000 bytes > 4096: answered now
        sock.settimeout(10)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413")
    after = settle(router.url)
    assert delta(before, after, 'narwhal_invalid_requests_total{reason="request_too_large"}') == 1


def _hold(
    base: str,
    max_tokens: int,
    results: list[tuple[int, dict[str, str], bytes]],
    headers: dict[str, str] | None = None,
) -> threading.Thread:
    t = threading.Thread(
        target=lambda: results.append(
            post(base, "/v1/chat/completions", chat(stream=True, max_tokens=max_tokens), headers)
        )
    )
    t.start()
    return t


def _wait_for(base: str, series: str, value: float, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics(base).get(series, 0.0) >= value:
            return
        time.sleep(0.02)
    raise AssertionError(f"{series} never reached {value}")


def test_queue_full_then_wait_expired_then_retention_full(router: Proc) -> None:
    before = metrics(router.url)
    results: list[tuple[int, dict[str, str], bytes]] = []
    # Holds the only prefill+decode slot ~2.6 s (the simulator's 128-token answer).
    running = _hold(router.url, 150, results)
    _wait_for(router.url, 'narwhal_engine_inflight{engine="e0",phase="decode"}', 1)
    waiting = _hold(router.url, 2, results)  # waits in the queue (limit 1) ...
    _wait_for(router.url, "narwhal_queued_requests", 1)
    status, headers, raw = post(
        router.url, "/v1/chat/completions", chat()
    )  # ... so this one is refused
    assert (status, headers.get("retry-after"), error_of(raw)["code"]) == (429, "1", "queue_full")
    assert error_of(raw)["type"] == "capacity_error"
    waiting.join(10)  # max_wait_s 1.2 < the running stream
    status, _, raw = next(r for r in results if r[0] != 200)
    err = error_of(raw)
    assert status == 504 and err["code"] == "admission_wait_expired"
    assert err["message"].startswith("Terminal expiry") and err["type"] == "timeout_error"
    running.join(15)
    after = settle(router.url)
    assert delta(before, after, 'narwhal_rejected_total{reason="queue_full"}') == 1
    assert delta(before, after, 'narwhal_expired_total{reason="admission_wait_expired"}') == 1
    assert delta(before, after, "narwhal_completed_total") == 1
    assert invariant_holds(after)
    assert after['narwhal_engine_inflight{engine="e0",phase="prefill"}'] == 0
    assert after['narwhal_engine_inflight{engine="e0",phase="decode"}'] == 0
    assert after["narwhal_queued_requests"] == 0


def test_retention_full(sim: Proc, tmp_path: Path) -> None:
    cfg = router_config([sim.url], serving={"http_retention_limit": 1}, admission={"mode": "open"})
    proc = start_router(tmp_path, cfg)
    try:
        before = metrics(proc.url)
        results: list[tuple[int, dict[str, str], bytes]] = []
        holder = _hold(proc.url, 100, results)  # retained ~2 s: the refusal comes well before
        _wait_for(proc.url, "narwhal_retained_requests", 1)
        status, headers, raw = post(proc.url, "/v1/chat/completions", chat())
        err = error_of(raw)
        assert (status, headers.get("retry-after"), err["code"]) == (429, "1", "retention_full")
        assert err["type"] == "capacity_error"
        holder.join(15)
        assert results[0][0] == 200
        after = settle(proc.url)
        assert delta(before, after, 'narwhal_rejected_total{reason="retention_full"}') == 1
        assert delta(before, after, "narwhal_unsized_offered_total") == 1
        assert invariant_holds(after)
    finally:
        proc.stop()


def test_deadline_before_headers_is_504(router: Proc) -> None:
    before = metrics(router.url)
    status, _, raw = post(
        router.url,
        "/v1/chat/completions",
        chat("[[fault:hang_before_headers]]", stream=True),
        {"X-Request-Timeout": "0.4"},
    )
    err = error_of(raw)
    assert (status, err["code"]) == (504, "deadline_expired")
    assert err["message"].startswith("Terminal expiry")
    after = settle(router.url)
    assert delta(before, after, 'narwhal_expired_total{reason="deadline_expired"}') == 1


def test_stainless_read_timeout_bounds_time_to_headers(router: Proc) -> None:
    status, _, raw = post(
        router.url,
        "/v1/chat/completions",
        chat("[[fault:hang_before_headers]]"),
        {"X-Stainless-Read-Timeout": "0.3"},
    )
    assert (status, error_of(raw)["code"]) == (504, "deadline_expired")


def test_deadline_after_headers_ends_stream_with_error_event(router: Proc) -> None:
    before = metrics(router.url)
    status, _, raw = post(
        router.url,
        "/v1/chat/completions",
        chat(stream=True, max_tokens=200),  # ~2.6 s: headers go out long before the deadline
        {"X-Stainless-Timeout": "1.2"},
    )
    assert status == 200
    events = [b for b in raw.decode().split("\n\n") if b]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["code"] == 504 and error["message"].startswith("Terminal expiry")
    after = settle(router.url)
    assert delta(before, after, 'narwhal_expired_total{reason="deadline_expired"}') == 1


def test_backend_unavailable_when_no_engine_is_eligible(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = start_router(tmp_path, router_config([dead]))
    try:
        before = metrics(proc.url)
        status, headers, raw = post(proc.url, "/v1/chat/completions", chat())
        assert (status, headers.get("retry-after"), error_of(raw)["code"]) == (
            503,
            "1",
            "backend_unavailable",
        )
        after = settle(proc.url)
        assert delta(before, after, 'narwhal_rejected_total{reason="backend_unavailable"}') == 1
        assert invariant_holds(after)
    finally:
        proc.stop()


def test_unknown_route_and_wrong_method(router: Proc) -> None:
    status, _, raw = post(router.url, "/v1/nothing", chat())
    assert status == 404 and error_of(raw)["type"] == "invalid_request_error"
    host, port = router.url[len("http://") :].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 405")
