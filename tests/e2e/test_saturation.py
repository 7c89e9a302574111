"""Saturation: retention, queue and slots exhausted by concurrent clients (some leaving early);
the counter invariant holds at every scrape and every gauge returns to zero — 1 and 2 workers."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from pathlib import Path

import pytest
from procs import MODEL, Proc, invariant_holds, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

LOAD_SECONDS = 4.0
CLIENTS = 32


def _one_request(base: str, rng: random.Random) -> str:
    host, port = base[len("http://") :].split(":")
    kind = rng.choice(["stream", "stream", "nonstream", "leave", "invalid"])
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "load"}],
        "max_tokens": rng.randint(2, 40),
        "stream": kind in ("stream", "leave"),
    }
    data = b"{broken" if kind == "invalid" else json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(head + data)
        if kind == "leave":
            time.sleep(rng.uniform(0.0, 0.05))  # leaves while queued, in prefill or in decode
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            return "left"
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    return raw.split(b" ", 2)[1].decode() if raw else "empty"


def _run_load(base: str) -> tuple[dict[str, int], list[str]]:
    stop = time.monotonic() + LOAD_SECONDS
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    violations: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop:
            try:
                got = _one_request(base, rng)
            except OSError as exc:
                got = type(exc).__name__
            with lock:
                outcomes[got] = outcomes.get(got, 0) + 1

    def scraper() -> None:
        while time.monotonic() < stop + 0.5:
            m = metrics(base)
            if not invariant_holds(m):
                violations.append(json.dumps(m))
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=scraper))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes, violations


@pytest.mark.parametrize("workers", [1, 2])
def test_invariant_under_saturation(tmp_path: Path, workers: int) -> None:
    sims = [start_sim("--tpot-ms", "3", "--prefill-tokens-per-s", "50000") for _ in range(2)]
    router: Proc | None = None
    try:
        engines = [
            {"name": f"e{i}", "url": s.url, "dialect": "vllm", "max_prefill": 2, "max_decode": 4}
            for i, s in enumerate(sims)
        ]
        cfg = router_config(
            [s.url for s in sims],
            engines=engines,
            serving={"http_retention_limit": 14},
            admission={"mode": "open", "queue_limit": 4, "max_wait_s": 0.3},
        )
        router = start_router(tmp_path, cfg, "--workers", str(workers))
        outcomes, violations = _run_load(router.url)
        assert not violations, (
            f"invariant broken in {len(violations)} scrapes: {violations[0][:2000]}"
        )
        # all the pressure points were reached
        assert outcomes.get("200", 0) > 20, outcomes
        assert outcomes.get("429", 0) > 0, outcomes
        assert outcomes.get("400", 0) > 0, outcomes
        deadline = time.monotonic() + 10
        m = metrics(router.url)
        while time.monotonic() < deadline and m["narwhal_retained_requests"]:
            time.sleep(0.1)
            m = metrics(router.url)
        assert invariant_holds(m)
        gauges = {
            k: v
            for k, v in m.items()
            if k.startswith(("narwhal_retained", "narwhal_queued", "narwhal_engine_inflight"))
        }
        assert gauges and all(v == 0 for v in gauges.values()), gauges
        assert m["narwhal_cancelled_total"] > 0
        assert (
            m.get('narwhal_rejected_total{reason="retention_full"}', 0)
            + m.get('narwhal_rejected_total{reason="queue_full"}', 0)
            > 0
        )
        pid = router.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == (workers if workers > 1 else 0)
        served = sum(v for k, v in outcomes.items() if k.isdigit())
        assert m["narwhal_offered_total"] >= served  # every answer was counted on the shared board
    finally:
        if router is not None:
            router.stop()
        for s in sims:
            s.stop()
