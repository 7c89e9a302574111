"""Engine faults through a real router: simulator faults and real process kills, each with its
status or error event, counter deltas, the invariant, and no slot or descriptor leak."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import Counters, http, wait_for
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

pytestmark = pytest.mark.timeout(120)

# The circuit breaker and eviction would turn later cases into 503s: keep them out of the way.
HEALTH = {"interval_s": 0.5, "timeout_s": 1.0, "failures_to_evict": 1000}
GAUGES = ("narwhal_retained_requests", "narwhal_queued_requests", "narwhal_engine_inflight")


def fault_router(tmp: Path, sims: list[Proc], **sections: Any) -> Proc:
    """One router in open admission, breaker and eviction out of the way."""
    sections.setdefault("admission", {"mode": "open"})
    sections.setdefault("health", HEALTH)
    return start_router(tmp, router_config([s.url for s in sims], **sections))


# -- leak checks ---------------------------------------------------------------------------
def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sockets(pid: int) -> dict[int, tuple[int, str]]:
    """The process's TCP sockets: inode → (remote port, state code from /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    out: dict[int, tuple[int, str]] = {}
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        inode = int(cols[9])
        if inode in inodes:
            out[inode] = (int(cols[2].split(":")[1], 16), cols[3])
    return out


def client_fds(pid: int, engine_ports: set[int]) -> int:
    """Descriptors other than engine sockets (pooled keep-alive sockets are not leaks)."""
    engine = sum(port in engine_ports for port, _ in sockets(pid).values())
    return fd_count(pid) - engine


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def gauges(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if k.startswith(GAUGES)}


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


class Leaks:
    """A router's descriptors before a case; :meth:`check` waits for them to come back."""

    def __init__(self, router: Proc, sims: list[Proc]):
        self.router = router
        self.pid = router.proc.pid
        self.engine_ports = {port_of(s.url) for s in sims}
        self.before = client_fds(self.pid, self.engine_ports)

    def check(self, timeout: float = 10.0) -> dict[str, float]:
        """Gauges at zero, the invariant, no extra client descriptor, no engine socket left
        half-closed (CLOSE_WAIT) and at most a small idle pool."""

        def idle() -> dict[str, float] | None:
            m = metrics(self.router.url)
            return m if not any(gauges(m).values()) else None

        m = wait_for(idle, timeout)
        assert invariant_holds(m), m
        wait_for(lambda: client_fds(self.pid, self.engine_ports) <= self.before, timeout)

        def engine_sockets_settled() -> bool:
            engine = [st for port, st in sockets(self.pid).values() if port in self.engine_ports]
            return "08" not in engine and len(engine) <= 2 * max(2, len(self.engine_ports))

        wait_for(engine_sockets_settled, timeout)
        return m


def sim_stats(sim: Proc) -> dict[str, Any]:
    stats: dict[str, Any] = get_json(sim.url + "/sim/stats")
    return stats


def events(raw: bytes) -> list[Any]:
    """The SSE data payloads of a de-chunked stream body (``[DONE]`` as the string)."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat(content: str, *, stream: bool, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def counted(delta: dict[str, float]) -> dict[str, float]:
    """The terminal-class deltas (what the request was counted as)."""
    classes = ("rejected", "refused", "invalid", "expired", "failed", "cancelled", "completed")
    return {k: v for k, v in delta.items() if k.startswith(tuple(f"narwhal_{c}" for c in classes))}


# -- simulator faults ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    sim = start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "200000")
    router = fault_router(tmp_path_factory.mktemp("faults"), [sim])
    try:
        http(router.url, "POST", "/v1/chat/completions", chat("warm up", stream=True))
        yield sim, router
    finally:
        router.stop()
        sim.stop()


FAILED = 'narwhal_failed_total{reason="%s"}'
EXPIRED = 'narwhal_expired_total{reason="deadline_expired"}'
COMPLETED = "narwhal_completed_total"
REJECTED_BY_ENGINE = 'narwhal_invalid_requests_total{reason="engine_rejected"}'

# fault marker, stream → status, error (body code, or the event's integer code), counter,
# whether the router must cut the engine request (the simulator counts it aborted)
MATRIX: list[tuple[str, bool, int, str | int | None, str, bool]] = [
    ("reset_before_headers", True, 502, "engine_error", FAILED % "engine_error", False),
    ("reset_before_headers", False, 502, "engine_error", FAILED % "engine_error", False),
    ("http_500", True, 502, "engine_error", FAILED % "engine_error", False),
    ("http_500", False, 502, "engine_error", FAILED % "engine_error", False),
    ("http_400", True, 400, 400, REJECTED_BY_ENGINE, False),
    ("http_400", False, 400, 400, REJECTED_BY_ENGINE, False),
    ("reset_mid_stream:3", True, 200, 502, FAILED % "engine_error", False),
    ("reset_mid_stream:3", False, 502, "engine_error", FAILED % "engine_error", False),
    ("error_event:2", True, 200, 500, FAILED % "engine_error", False),
    ("error_event:2", False, 502, "engine_error", FAILED % "engine_error", False),
    ("malformed_json:2", True, 200, 502, FAILED % "malformed_engine_output", True),
    (
        "malformed_json:2",
        False,
        502,
        "malformed_engine_output",
        FAILED % "malformed_engine_output",
        True,
    ),
    ("bad_chunk:2", True, 200, 502, FAILED % "engine_error", False),
    ("bad_chunk:2", False, 502, "engine_error", FAILED % "engine_error", False),
    # Lines that are not SSE fields are ignored by the SSE grammar: the valid events go on.
    ("bad_sse:2", True, 200, None, COMPLETED, False),
    ("bad_sse:2", False, 200, None, COMPLETED, False),
    ("missing_ids:0", True, 200, 502, FAILED % "malformed_engine_output", True),
    (
        "missing_ids:0",
        False,
        502,
        "malformed_engine_output",
        FAILED % "malformed_engine_output",
        True,
    ),
    ("null_ids:3", True, 200, 502, FAILED % "malformed_engine_output", True),
    ("bool_ids:3", True, 200, 502, FAILED % "malformed_engine_output", True),
    ("bool_ids:0", False, 502, "malformed_engine_output", FAILED % "malformed_engine_output", True),
    ("negative_ids:3", True, 200, 502, FAILED % "malformed_engine_output", True),
    (
        "negative_ids:0",
        False,
        502,
        "malformed_engine_output",
        FAILED % "malformed_engine_output",
        True,
    ),
    ("float_ids:2", True, 200, 502, FAILED % "malformed_engine_output", True),
    (
        "string_ids:2",
        False,
        502,
        "malformed_engine_output",
        FAILED % "malformed_engine_output",
        True,
    ),
    # Unsupported fields: a streaming client gets the engine's bytes; assembly refuses them.
    ("audio:2", True, 200, None, COMPLETED, False),
    ("audio:2", False, 502, "unsupported_engine_field", FAILED % "unsupported_engine_field", True),
    (
        "annotations:2",
        False,
        502,
        "unsupported_engine_field",
        FAILED % "unsupported_engine_field",
        True,
    ),
    (
        "custom_tool:1",
        False,
        502,
        "unsupported_engine_field",
        FAILED % "unsupported_engine_field",
        True,
    ),
    ("slow_headers:300", True, 200, None, COMPLETED, False),
    ("hang_before_headers", True, 504, "deadline_expired", EXPIRED, True),
    ("hang_before_headers", False, 504, "deadline_expired", EXPIRED, True),
    ("hang_mid_stream:3", True, 200, 504, EXPIRED, True),
    ("hang_mid_stream:3", False, 504, "deadline_expired", EXPIRED, True),
]


@pytest.mark.parametrize(
    ("fault", "stream", "status", "error", "series", "cut"),
    MATRIX,
    ids=[f"{m[0]}-{'stream' if m[1] else 'whole'}" for m in MATRIX],
)
def test_engine_fault(
    fleet: tuple[Proc, Proc],
    fault: str,
    stream: bool,
    status: int,
    error: str | int | None,
    series: str,
    cut: bool,
) -> None:
    sim, router = fleet
    leaks = Leaks(router, [sim])
    counters = Counters(router.url)
    aborted = sim_stats(sim)["aborted"]
    body = chat(f"tell me [[fault:{fault}]]", stream=stream, max_tokens=12)
    started = time.monotonic()
    got, _, raw = http(
        router.url, "POST", "/v1/chat/completions", body, {"x-request-timeout": "1.5"}
    )
    took = time.monotonic() - started
    assert got == status, (got, raw)
    assert took < 5, took  # a hang ends at the deadline, never later
    if status != 200:
        err = json.loads(raw)["error"]
        assert err["code"] == error, err
    elif stream:
        evs = events(raw)
        assert evs[-1] == "[DONE]", raw[-300:]
        last = evs[-2]
        if error is None:
            assert "error" not in last and last["choices"][0]["finish_reason"], last
            assert b"garbage" not in raw and b"still no field" not in raw
        else:
            assert last["error"]["code"] == error, last
            assert set(last["error"]) == {"message", "type", "param", "code"}
    else:
        assert json.loads(raw)["choices"][0]["finish_reason"] == "length"
    delta = counters.settled()
    assert counted(delta) == {series: 1.0}, delta
    assert delta["narwhal_offered_total"] == 1.0
    leaks.check()
    if cut:
        wait_for(lambda: sim_stats(sim)["aborted"] > aborted, 5)
    if fault.startswith("hang"):
        assert took > 1.4, took


def test_mid_stream_deadline_event_says_during_the_response(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    body = chat("[[fault:hang_mid_stream:2]]", stream=True)
    # The deadline leaves a slow host ample time to send the headers before the hang.
    _, _, raw = http(router.url, "POST", "/v1/chat/completions", body, {"x-request-timeout": "1.5"})
    err = events(raw)[-2]["error"]
    assert err["type"] == "timeout_error" and err["code"] == 504
    assert "before the response started" not in err["message"], err


# -- real process kills --------------------------------------------------------------------
def test_engine_refusing_connections_is_502(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "2")
    router = fault_router(tmp_path, [sim])
    try:
        leaks = Leaks(router, [sim])
        sim.proc.kill()
        sim.wait(5)
        counters = Counters(router.url)
        for stream in (True, False):
            got, _, raw = http(
                router.url, "POST", "/v1/chat/completions", chat("hi", stream=stream)
            )
            assert got == 502, raw  # eviction and the breaker are out of the way (HEALTH)
            assert json.loads(raw)["error"]["code"] == "engine_error"
        delta = counters.settled()
        assert counted(delta) == {FAILED % "engine_error": 2.0}, delta
        leaks.check()
    finally:
        router.stop()
        sim.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_engine_killed_mid_stream(tmp_path: Path, stream: bool) -> None:
    sim = start_sim("--tpot-ms", "5", "--output-len", "2000")
    router = fault_router(tmp_path, [sim])
    try:
        leaks = Leaks(router, [sim])
        counters = Counters(router.url)
        host, port = router.url[len("http://") :].split(":")
        data = json.dumps(chat("a long answer", stream=stream, max_tokens=2000)).encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                % (len(data), data)
            )
            wait_for(
                lambda: metrics(router.url).get(
                    'narwhal_engine_inflight{engine="e0",phase="decode"}'
                ),
                5,
            )
            time.sleep(0.1)
            sim.proc.send_signal(signal.SIGKILL)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        if stream:
            assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
            assert b'"code": 502' in raw and raw.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        else:
            assert raw.startswith(b"HTTP/1.1 502"), raw[:200]
            assert b'"code":"engine_error"' in raw
        delta = counters.settled()
        assert counted(delta) == {FAILED % "engine_error": 1.0}, delta
        leaks.check()
    finally:
        router.stop()
        sim.stop()
