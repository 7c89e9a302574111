"""Client faults through a real router: a client leaving in every phase (queued, prefill, decode,
mid-body upload) cancels the engine request and leaks nothing; a client that stops reading
pauses the engine stream (bounded router memory) and gets every token when it resumes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import Counters, wait_for
from procs import Proc, metrics, start_sim
from test_faults_engine import Leaks, chat, counted, events, fault_router, rss_bytes, sim_stats

pytestmark = pytest.mark.timeout(120)

CANCELLED = "narwhal_cancelled_total"
LINGER_RST = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close sends a reset


def send(router: Proc, body: bytes, *, length: int | None = None, rcvbuf: int = 0) -> socket.socket:
    """Open a connection and send a completion request (or only part of its body)."""
    host, port = router.url[len("http://") :].split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {length or len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def leave(sock: socket.socket, how: str) -> None:
    """Go away: a reset (SO_LINGER 0) or an orderly FIN."""
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
    sock.close()


def body_of(content: str, **extra: Any) -> bytes:
    return json.dumps(chat(content, **extra)).encode()


def engine_saw(sim: Proc, text: str) -> bool:
    """Whether one of the simulator's recent requests carried ``text``."""
    return any(text in json.dumps(r["body"]) for r in sim_stats(sim)["recent"])


def series(m: dict[str, float], name: str) -> float:
    return m.get(name, 0.0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """One engine with one prefill and one decode slot, slow prefill for long prompts."""
    sim = start_sim("--tpot-ms", "5", "--prefill-tokens-per-s", "400", "--output-len", "4000")
    engines = [{"name": "e0", "url": sim.url, "dialect": "vllm", "max_prefill": 1, "max_decode": 1}]
    router = fault_router(
        tmp_path_factory.mktemp("clients"),
        [sim],
        engines=engines,
        admission={"mode": "open", "queue_limit": 4, "max_wait_s": 20},
    )
    try:
        yield sim, router
    finally:
        router.stop()
        sim.stop()


INFLIGHT = 'narwhal_engine_inflight{engine="e0",phase="%s"}'


@pytest.mark.parametrize("how", ["reset", "fin"])
@pytest.mark.parametrize("stream", [True, False])
def test_client_leaves_in_decode(fleet: tuple[Proc, Proc], stream: bool, how: str) -> None:
    sim, router = fleet
    leaks = Leaks(router, [sim])
    counters = Counters(router.url)
    before = sim_stats(sim)
    sock = send(router, body_of("hi", stream=stream, max_tokens=4000))
    wait_for(lambda: metrics(router.url).get(INFLIGHT % "decode"), 10)
    if stream:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    leave(sock, how)
    wait_for(lambda: sim_stats(sim)["aborted"] > before["aborted"], 5)
    assert counted(counters.settled()) == {CANCELLED: 1.0}
    leaks.check()


@pytest.mark.parametrize("how", ["reset", "fin"])
def test_client_leaves_in_prefill(fleet: tuple[Proc, Proc], how: str) -> None:
    sim, router = fleet
    leaks = Leaks(router, [sim])
    counters = Counters(router.url)
    before = sim_stats(sim)
    prompt = " ".join(["narwhal"] * 1200)  # about 3 s of prefill at 400 tokens/s
    sock = send(router, body_of(prompt, stream=True, max_tokens=8))
    wait_for(lambda: sim_stats(sim)["running"] + sim_stats(sim)["waiting"] >= 1, 5)
    assert metrics(router.url).get(INFLIGHT % "prefill") == 1.0
    leave(sock, how)
    wait_for(lambda: sim_stats(sim)["aborted"] > before["aborted"], 5)
    assert counted(counters.settled()) == {CANCELLED: 1.0}
    leaks.check()


def test_client_leaves_while_queued(fleet: tuple[Proc, Proc]) -> None:
    sim, router = fleet
    leaks = Leaks(router, [sim])
    counters = Counters(router.url)
    holder = send(router, body_of("hold the engine", stream=True, max_tokens=4000))
    wait_for(lambda: metrics(router.url).get(INFLIGHT % "decode"), 10)
    queued = send(router, body_of("wait for me", stream=True))
    wait_for(lambda: metrics(router.url).get("narwhal_queued_requests") == 1.0, 5)
    leave(queued, "reset")
    wait_for(lambda: metrics(router.url).get("narwhal_queued_requests") == 0.0, 5)
    assert series(metrics(router.url), CANCELLED) - series(counters.before, CANCELLED) == 1
    assert not engine_saw(sim, "wait for me")  # the queued one never left the router
    leave(holder, "reset")
    assert counted(counters.settled()) == {CANCELLED: 2.0}
    leaks.check()


@pytest.mark.parametrize("how", ["reset", "fin"])
def test_client_leaves_mid_upload(fleet: tuple[Proc, Proc], how: str) -> None:
    sim, router = fleet
    leaks = Leaks(router, [sim])
    counters = Counters(router.url)
    body = body_of("an upload that never ends", stream=True)
    sock = send(router, body[:20], length=len(body) + 1000)
    wait_for(lambda: metrics(router.url).get("narwhal_retained_requests") == 1.0, 5)
    leave(sock, how)
    assert counted(counters.settled()) == {CANCELLED: 1.0}
    assert not engine_saw(sim, "an upload that never ends")
    leaks.check()


def test_slow_reader_pauses_the_engine_and_finishes(tmp_path: Path) -> None:
    """A client that stops reading: the router stops reading from the engine (the simulator,
    like vLLM, merges the tokens it could not send into fewer events), its memory stays flat,
    and every token arrives once the client reads again."""
    tokens = 20000
    sim = start_sim(
        "--tpot-ms",
        "0.05",
        "--output-len",
        "1000000",
        "--max-model-len",
        "2000000",
        "--prefill-tokens-per-s",
        "200000",
    )
    router = fault_router(tmp_path, [sim])
    try:
        pid = router.proc.pid
        leaks = Leaks(router, [sim])
        counters = Counters(router.url)
        body = body_of(
            "slow reader",
            stream=True,
            max_tokens=tokens,
            logprobs=True,
            top_logprobs=5,
            return_token_ids=True,
        )
        sock = send(router, body, rcvbuf=4096)
        raw = sock.recv(2048)
        rss_before, peak = rss_bytes(pid), 0
        stalled_until = time.monotonic() + 4.0
        while time.monotonic() < stalled_until:
            time.sleep(0.2)
            peak = max(peak, rss_bytes(pid))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        while chunk := sock.recv(1 << 20):
            raw += chunk
        sock.close()
        head, _, chunked = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        out = bytearray()
        while chunked:
            size_line, _, chunked = chunked.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out += chunked[:size]
            chunked = chunked[size + 2 :]
        evs = events(bytes(out))
        assert evs[-1] == "[DONE]"
        ids = sum(len(e["choices"][0].get("token_ids") or []) for e in evs[:-1] if e.get("choices"))
        assert ids == tokens
        assert len(evs) < tokens * 0.9, len(evs)  # the engine was paused: tokens were merged
        assert len(out) > 8 << 20  # far more than the router may hold
        assert peak - rss_before < 8 << 20, (rss_before, peak)
        assert counted(counters.settled()) == {"narwhal_completed_total": 1.0}
        leaks.check()
    finally:
        router.stop()
        sim.stop()


def test_a_request_cancelled_after_its_answer_leaves_the_reused_connection_alone() -> None:
    """Regression (found by the soak: one answer in ~20 000 lost). A client that left while
    its prompt was being sized cancelled the /tokenize request after the engine had
    answered and the connection had gone back to the pool; its cancellation handler then
    aborted the connection under the next request, which died with CancelledError and its
    client got no answer at all. Driven step by step on one pooled connection."""
    from test_upstream_connection import HEAD, chunk, connect, run, start

    from narwhal.upstream.client import EngineClient

    async def main() -> None:
        client = EngineClient("http://127.0.0.1:9")
        conn, transport = connect(client)
        first = await start(conn)  # the sizing request, waiting for its answer
        second = asyncio.ensure_future(client.open("POST", "/v1/completions", b"{}", timeout_s=2))
        conn.data_received(HEAD + chunk(b'{"count":3}') + b"0\r\n\r\n")  # answered, pooled
        first.cancel()  # its client left; the answer is already there
        await asyncio.sleep(0)  # the second request takes the pooled connection first
        await asyncio.sleep(0)
        assert first.cancelled()
        assert not second.done() and not transport.aborted
        conn.data_received(HEAD)
        assert (await asyncio.wait_for(second, 1)).status == 200

    run(main)
