"""Regressions for defects found when the router was tried from outside (per-engine limits
across workers, vLLM fidelity at the edges, the HTTP edge, hung engines), each through a real
router process against real simulator processes."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fleet_support import MARK, Counters, FaultProxy, chat, complete, fleet_config
from procs import MODEL, Proc, get_json, http, metrics, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

KEY_ENV = "NARWHAL_TEST_ENGINE_KEY"


def _error(raw: bytes) -> dict[str, object]:
    err = json.loads(raw)["error"]
    assert isinstance(err, dict)
    return err


# -- item 2: per-engine limits hold for the sum of the workers ------------------------------
@pytest.mark.parametrize("workers", [1, 2])
def test_engine_side_concurrency_stays_within_the_engine_limits(tmp_path: Path,
                                                                workers: int) -> None:
    sim = start_sim("--tpot-ms", "4", "--prefill-tokens-per-s", "100000")
    router = None
    try:
        engines = [{"name": "e0", "url": sim.url, "max_prefill": 1, "max_decode": 2}]
        router = start_router(tmp_path, fleet_config([sim.url], engines=engines),
                              "--workers", str(workers))
        _profiled(router)  # the profile's probes are the router's own, outside the limits
        assert http(sim.url, "POST", "/sim/reset")[0] == 200
        counters = Counters(router.url)

        def one(i: int) -> int:
            return complete(router.url, chat(f"burst {i}", max_tokens=12))[0]

        with ThreadPoolExecutor(50) as pool:
            statuses = list(pool.map(one, range(50)))
        assert statuses == [200] * 50
        stats = get_json(f"{sim.url}/sim/stats")
        # The simulator's own counts: requests decoding, and queued or in prefill.
        assert stats["peak_running"] <= 2, stats
        assert stats["peak_waiting"] <= 1, stats
        assert stats["peak_running"] == 2  # the burst did reach the limit
        delta = counters.settled()
        assert delta["narwhal_completed_total"] == 50
        m = metrics(router.url)
        assert m['narwhal_engine_inflight{engine="e0",phase="prefill"}'] == 0
        assert m['narwhal_engine_inflight{engine="e0",phase="decode"}'] == 0
    finally:
        if router is not None:
            router.stop()
        sim.stop()


def _profiled(router: Proc) -> None:
    """Wait until every worker has the engine's profile (its probes are over)."""
    deadline = time.monotonic() + 20
    done = 0
    while done < 6:  # several answers in a row, from whichever workers take them
        assert time.monotonic() < deadline, "the engine was not profiled in time"
        profile = get_json(f"{router.url}/engines")["engines"][0]["learned"]["profile"]
        done = done + 1 if profile["count"] >= 1 and not profile["running"] else 0
        time.sleep(0.05)


# -- items 7, 8, 9, 11 share one fleet -------------------------------------------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, Proc]:
    sim = start_sim("--tpot-ms", "2")
    router = start_router(
        tmp_path_factory.mktemp("defects"),
        fleet_config([sim.url], serving={"max_request_bytes": 4096, "http_retention_limit": 1}),
    )
    yield sim, router
    router.stop()
    sim.stop()


def test_stream_options_without_stream_is_refused_as_vllm_does(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    counters = Counters(router.url)
    for path, body in (
        ("/v1/chat/completions", {**chat(), "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"model": MODEL, "prompt": MARK, "max_tokens": 2, "stream": False,
                             "stream_options": {"include_usage": True}}),
    ):
        status, _, raw = http(router.url, "POST", path, body)
        err = _error(raw)
        assert (status, err["code"], err["param"]) == (400, "invalid_request", "stream_options")
    # An empty object is accepted, as vLLM accepts it.
    assert complete(router.url, {**chat(), "stream_options": {}})[0] == 200
    delta = counters.settled()
    assert delta['narwhal_invalid_requests_total{reason="invalid_request"}'] == 2
    assert delta["narwhal_completed_total"] == 1


def _raw(router: Proc, data: bytes, *, timeout: float = 10.0) -> tuple[bytes, bool, float]:
    """Send ``data``; read until the router closes (bytes, closed, seconds to the answer)."""
    host, port = router.url[len("http://"):].split(":")
    started = time.monotonic()
    answered = None
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        out, closed = b"", False
        try:
            while chunk := sock.recv(65536):
                if answered is None:
                    answered = time.monotonic() - started
                out += chunk
            closed = True
        except TimeoutError:
            pass
    return out, closed, answered if answered is not None else timeout


def _hold_retention(router: Proc) -> socket.socket:
    """A request whose body never finishes: it holds the one retention place."""
    host, port = router.url[len("http://"):].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                 b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{")
    deadline = time.monotonic() + 5
    while metrics(router.url)["narwhal_retained_requests"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return sock


def test_retention_full_with_a_large_declared_body_is_answered_at_once(
        fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    counters = Counters(router.url)
    holder = _hold_retention(router)
    try:
        # 1 MiB declared over a 4 KiB limit; the body is never sent.
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"content-type: application/json\r\ncontent-length: 1048576\r\n\r\n")
        out, closed, _ = _raw(router, head, timeout=5)
        assert out.startswith(b"HTTP/1.1 429 "), out[:200]
        assert closed, "the connection closes instead of waiting for the body"
        body = out.partition(b"\r\n\r\n")[2]
        assert _error(body)["code"] == "retention_full"
    finally:
        holder.close()
    delta = counters.settled()
    assert delta['narwhal_rejected_total{reason="retention_full"}'] == 1


def test_a_malformed_chunk_after_the_headers_is_an_invalid_request(
        fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    counters = Counters(router.url)
    data = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\nzz\r\nnot a chunk\r\n")
    out, closed, _ = _raw(router, data)
    assert out.startswith(b"HTTP/1.1 400 ") and closed
    delta = counters.settled()
    assert delta.get("narwhal_cancelled_total", 0) == 0
    assert delta['narwhal_invalid_requests_total{reason="invalid_request"}'] == 1


# -- item 8: an engine refusing the router's key ---------------------------------------------
def test_an_engine_refusing_the_routers_key_is_an_engine_error_and_leaks_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "the-routers-wrong-key")
    locked = start_sim("--tpot-ms", "2", "--api-key", "the-engines-key")
    open_sim = start_sim("--tpot-ms", "2")
    routers: list[Proc] = []
    try:
        # Alone, the engine's 401 becomes a 502 engine_error; its body never reaches the client.
        alone = start_router(tmp_path, fleet_config(
            [locked.url], engines=[{"name": "e0", "url": locked.url, "api_key_env": KEY_ENV}]))
        routers.append(alone)
        counters = Counters(alone.url)
        for stream in (False, True):
            status, _, raw = complete(alone.url, chat(stream=stream))
            assert status == 502 and _error(raw)["code"] == "engine_error"
            assert b"Unauthorized" not in raw and b"wrong-key" not in raw
        delta = counters.settled()
        assert delta['narwhal_failed_total{reason="engine_error"}'] == 2
        assert delta.get("narwhal_invalid_requests_total", 0) == 0
        m = metrics(alone.url)
        assert m['narwhal_engine_attempt_failures_total{engine="e0",reason="auth_rejected"}'] >= 2
        # Beside a peer that accepts the router, every request is served (retried there).
        pair = start_router(tmp_path, fleet_config(
            [locked.url, open_sim.url],
            engines=[{"name": "e0", "url": locked.url, "api_key_env": KEY_ENV},
                     {"name": "e1", "url": open_sim.url}]))
        routers.append(pair)
        counters = Counters(pair.url)
        assert [complete(pair.url)[0] for _ in range(6)] == [200] * 6
        assert counters.settled()["narwhal_completed_total"] == 6
    finally:
        for router in routers:
            router.stop()
        locked.stop()
        open_sim.stop()


# -- item 10: an engine that never sends its response headers --------------------------------
def test_a_hung_engine_is_tried_elsewhere_after_its_header_timeout(tmp_path: Path) -> None:
    hung = start_sim("--tpot-ms", "2")
    good = start_sim("--tpot-ms", "2")
    proxy = FaultProxy(int(hung.url.rsplit(":", 1)[1]), "fault:hang_before_headers")
    router = None
    try:
        # 1 s: the good engine's headers never come that late, even on a loaded host.
        engines = [{"name": "e0", "url": proxy.url, "header_timeout_s": 1.0},
                   {"name": "e1", "url": good.url, "header_timeout_s": 1.0}]
        router = start_router(tmp_path, fleet_config([proxy.url, good.url], engines=engines))
        counters = Counters(router.url)
        for stream in (False, True, False, True):
            status, _, _ = complete(router.url, chat(stream=stream))
            assert status == 200
        assert proxy.posts >= 1  # some attempts did go to the hung engine first
        delta = counters.settled()
        assert delta["narwhal_completed_total"] == 4
        m = metrics(router.url)
        failures = m['narwhal_engine_attempt_failures_total{engine="e0",reason="header_timeout"}']
        assert failures == proxy.posts
    finally:
        if router is not None:
            router.stop()
        proxy.close()
        hung.stop()
        good.stop()
