"""Soak: saturation with faults mixed in. Every request is accounted for (client tallies equal
the counter deltas), the invariant holds at every scrape, gauges end at zero, and router memory
and descriptors stay flat after warm-up.

Quick mode (30 s) runs in the default ``pytest``; ``NARWHAL_SOAK_S=600`` runs ten minutes and
prints the figures (``-s`` shows them; ``NARWHAL_SOAK_OUT=FILE`` also writes them as JSON, the
stored run that ``python -m benches.harness.soak_report`` turns into docs/reliability.md's
table). A second soak (half as long) kills an engine
(SIGKILL) every few seconds and restarts it on its port: no plain stream fails after its
answer began (migration carries it to another engine). Streams the soak's fault markers break
on purpose are reported beside it: at this rate of faults, ejections and kills together
sometimes leave no other engine to carry them.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fleet_support import start_sim_on
from procs import MODEL, Proc, invariant_holds, metrics, start_sim
from test_faults_engine import Leaks, client_fds, fault_router, gauges, port_of, rss_bytes

SOAK_S = float(os.environ.get("NARWHAL_SOAK_S", "30"))
WARMUP_S = min(60.0, max(10.0, SOAK_S / 5))
CLIENTS = 12
pytestmark = pytest.mark.timeout(SOAK_S + 180)

# kind → (weight, prompt marker, stream, extra headers); the expected class follows the answer.
KINDS: dict[str, tuple[int, str, bool, dict[str, str]]] = {
    "stream": (30, "", True, {}),
    "whole": (15, "", False, {}),
    "leave": (8, "", True, {}),
    "invalid": (5, "", False, {}),
    "reset_mid": (4, "[[fault:reset_mid_stream:3]]", True, {}),
    "http_500": (3, "[[fault:http_500]]", False, {}),
    "malformed": (3, "[[fault:malformed_json:2]]", True, {}),
    "bool_ids": (3, "[[fault:bool_ids:2]]", False, {}),
    "error_event": (3, "[[fault:error_event:2]]", True, {}),
    "hang_mid": (2, "[[fault:hang_mid_stream:2]]", True, {"x-request-timeout": "0.5"}),
    "hang_head": (2, "[[fault:hang_before_headers]]", False, {"x-request-timeout": "0.5"}),
    "engine_400": (2, "[[fault:http_400]]", True, {}),
}
KILL_EVERY_S = 2.5
"""In the kill soak: an engine is killed this often, and restarted after RESTART_AFTER_S."""
RESTART_AFTER_S = 0.5
CLASSES = ("rejected", "refused", "invalid_requests", "expired", "failed", "cancelled", "completed")


def classify(raw: bytes) -> str:
    """The terminal class an answer implies (what the router must have counted)."""
    if not raw:
        return "no_answer"
    status = int(raw.split(b" ", 2)[1])
    if status in (429, 503):
        return "rejected"
    if status in (400, 404, 413):
        return "invalid_requests"
    if status == 504:
        return "expired"
    if status == 502:
        return "failed"
    if status != 200:
        return f"status_{status}"
    if not raw.endswith(b"0\r\n\r\n") and b"content-length" not in raw[:1024].lower():
        return "truncated"
    if b'data: {"error": ' in raw:
        return "expired" if b'"code": 504}' in raw else "failed"
    return "completed"


def failed_mid_stream(raw: bytes) -> bool:
    """The answer began (200, a stream) and then failed: an error event, or no end."""
    return raw.startswith(b"HTTP/1.1 200") and classify(raw) in ("failed", "expired",
                                                                  "truncated")


def one_request(base: str, rng: random.Random,
                mid_failures: Counter[str] | None = None) -> tuple[str, str]:
    kind = rng.choices(list(KINDS), weights=[w for w, *_ in KINDS.values()])[0]
    _, marker, stream, headers = KINDS[kind]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"soak {rng.randrange(1 << 30)} {marker}"}],
        "max_tokens": 400 if kind == "leave" else rng.randint(4, 48),
        "stream": stream,
    }
    data = b'{"model": broken' if kind == "invalid" else json.dumps(body).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
    head += f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    host, port = base[len("http://") :].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + data)
        if kind == "leave":
            time.sleep(rng.uniform(0.0, 0.1))  # queued, in prefill or in decode
            sock.setblocking(False)
            try:
                early = sock.recv(64)  # a refusal at arrival may already be here
            except BlockingIOError:
                early = b""
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
            # An answer that came before the client left is that answer's class (a refusal at
            # arrival; with engines killed, a 502 when no engine could take the request).
            if early.startswith((b"HTTP/1.1 429", b"HTTP/1.1 503")):
                return kind, "rejected"
            return kind, "failed" if early.startswith(b"HTTP/1.1 502") else "left"
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    if mid_failures is not None and failed_mid_stream(raw):
        mid_failures[kind] += 1
    return kind, classify(raw)


def soak_router(tmp_path: Path, sims: list[Proc], **sections: Any) -> Proc:
    """The soak's router: 2 prefill and 4 decode slots per engine, retention 20, a queue of 6
    waiting at most 2 s, open admission; ``sections`` add to or replace these."""
    engines = [
        {"name": f"e{i}", "url": s.url, "dialect": "vllm", "max_prefill": 2, "max_decode": 4}
        for i, s in enumerate(sims)
    ]
    sections = {"serving": {"http_retention_limit": 20},
                "admission": {"mode": "open", "queue_limit": 6, "max_wait_s": 2}, **sections}
    return fault_router(tmp_path, sims, engines=engines, **sections)


def test_soak(tmp_path: Path) -> None:
    sims = [start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "100000") for _ in range(2)]
    router: Proc | None = None
    try:
        router = soak_router(tmp_path, sims)
        figures = run_soak(router, sims)
        print("\nsoak figures:", json.dumps(figures, indent=1))
        out = os.environ.get("NARWHAL_SOAK_OUT")
        if out:  # the stored run behind docs/reliability.md (benches/harness/soak_report.py)
            stored = {"command": f"NARWHAL_SOAK_S={SOAK_S:g} NARWHAL_SOAK_OUT={out} pytest "
                                 'tests/e2e/test_soak.py -k "not kills"',
                      "commit": _commit(), **figures}
            Path(out).write_text(json.dumps(stored, indent=1) + "\n")
    finally:
        if router is not None:
            router.stop()
        for s in sims:
            s.stop()


def _commit() -> str:
    """The checkout's commit (``+`` when python/ differs from it), or ``unknown``."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "python"], cwd=root,
                               timeout=10, check=False).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+" if dirty else "")


def test_soak_with_engine_kills(tmp_path: Path) -> None:
    # Three engines: one killed, one ejected for the faults the soak mixes in, one to carry on.
    sims = [start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "100000") for _ in range(3)]
    ports = [port_of(s.url) for s in sims]
    router: Proc | None = None
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        rng = random.Random(7)
        while not stop.wait(KILL_EVERY_S):
            i = rng.randrange(len(sims))
            sims[i].proc.kill()  # SIGKILL: mid-stream connections reset
            sims[i].proc.wait(5)
            kills += 1
            time.sleep(RESTART_AFTER_S)
            sims[i] = start_sim_on(ports[i], "--tpot-ms", "2")

    try:
        router = soak_router(
            tmp_path,
            sims,
            serving={"http_retention_limit": 20, "max_migrations": 2},
            # An operator's health settings (the fault matrix turns eviction off): a killed
            # engine is ejected after two failures and back after one good probe.
            health={"interval_s": 0.2, "timeout_s": 0.5, "failures_to_evict": 2,
                    "successes_to_restore": 1},
        )
        thread = threading.Thread(target=killer)
        thread.start()
        try:
            mid_failures: Counter[str] = Counter()
            figures = run_soak(router, sims, seconds=SOAK_S / 2, warmup_s=WARMUP_S / 2,
                               mid_failures=mid_failures, stop_faults=stop)
        finally:
            stop.set()
            thread.join(10)
        figures["engine_kills"] = kills
        figures["mid_stream_failures"] = dict(mid_failures)
        migrated = sum(v for k, v in metrics(router.url).items()
                       if k.startswith("narwhal_migrations_total"))
        figures["migrations"] = migrated
        print("\nsoak with engine kills:", json.dumps(figures, indent=1))
        assert kills >= 2, figures
        assert migrated > 0, figures
        assert not mid_failures.get("stream"), figures
    finally:
        stop.set()
        if router is not None:
            router.stop()
        for s in sims:
            s.stop()


def run_soak(router: Proc, sims: list[Proc], *, seconds: float = SOAK_S,
             warmup_s: float = WARMUP_S, mid_failures: Counter[str] | None = None,
             stop_faults: threading.Event | None = None) -> dict[str, object]:
    pid = router.proc.pid
    leaks = Leaks(router, sims)
    engine_ports = {port_of(s.url) for s in sims}
    start_metrics = metrics(router.url)
    started = time.monotonic()
    stop_at = started + seconds
    tally: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    lock = threading.Lock()
    violations: list[str] = []
    odd: list[str] = []  # answers no terminal class explains, with the kind of request
    samples: list[tuple[float, int, int]] = []  # (elapsed, rss, client fds)
    scrapes = 0

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            try:
                kind, got = one_request(router.url, rng, mid_failures)
            except OSError as exc:
                kind, got = "error", type(exc).__name__
            with lock:
                tally[got] += 1
                kinds[kind] += 1
                if got not in (*CLASSES, "left"):
                    odd.append(f"{kind}: {got}")

    def scraper() -> None:
        nonlocal scrapes
        last_sample = 0.0
        while time.monotonic() < stop_at + 1:
            m = metrics(router.url)
            scrapes += 1
            if not invariant_holds(m):
                violations.append(json.dumps(m)[:3000])
            now = time.monotonic() - started
            if now - last_sample >= 1.0:
                last_sample = now
                samples.append((now, rss_bytes(pid), client_fds(pid, engine_ports)))
            time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=scraper))
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    assert not any(t.is_alive() for t in threads), "a client hung"
    if stop_faults is not None:  # engines back (and probed) before the leak checks
        stop_faults.set()
        time.sleep(RESTART_AFTER_S + 2.0)
    end_metrics = leaks.check(timeout=15)

    # zero lost requests: every answer was counted in the class it implies, nothing else
    assert not violations, f"invariant broken in {len(violations)} scrapes: {violations[0]}"
    log = "".join(router.lines[-40:])
    assert not odd, (odd, tally, log)
    assert not any("Traceback" in line for line in router.lines), log

    def counted(cls: str) -> float:
        got = sum(v for k, v in end_metrics.items() if k.startswith(f"narwhal_{cls}_total"))
        was = sum(v for k, v in start_metrics.items() if k.startswith(f"narwhal_{cls}_total"))
        return got - was

    for cls in ("refused", "invalid_requests", "expired", "completed"):
        assert counted(cls) == tally[cls], (cls, str({c: (tally[c], counted(c))
                                                      for c in (*CLASSES, "left")}))
    # A client that left was cancelled, unless an answer came first that it did not read: a
    # refusal at arrival (one more rejection) or, with engines killed, a 502 when no engine
    # could take it (one more failure). Every request is still counted exactly once.
    left_as = {c: counted(c) - tally[c] for c in ("cancelled", "rejected", "failed")}
    assert sum(left_as.values()) == tally["left"], (left_as, tally)
    assert all(v >= 0 for v in left_as.values()), (left_as, tally)
    offered = end_metrics["narwhal_offered_total"] - start_metrics["narwhal_offered_total"]
    assert offered == sum(tally.values())
    assert not any(gauges(end_metrics).values())
    for needed in ("completed", "failed", "expired", "left", "invalid_requests"):
        assert tally[needed] > 0, (needed, tally)

    # flat memory and descriptors after warm-up
    after = [s for s in samples if s[0] >= warmup_s]
    assert len(after) >= 5, samples
    rss_warm = max(s[1] for s in after[:3])
    rss_end = max(s[1] for s in after[-3:])
    assert rss_end <= rss_warm * 1.10, (rss_warm, rss_end)
    fds_warm = max(s[2] for s in after[:3])
    assert max(s[2] for s in after) <= fds_warm + CLIENTS + 4, samples
    return {
        "seconds": seconds,
        "requests": sum(tally.values()),
        "outcomes": dict(tally),
        "kinds": dict(kinds),
        "scrapes": scrapes,
        "rss_start_mib": round(samples[0][1] / 2**20, 1),
        "rss_after_warmup_mib": round(rss_warm / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "rss_max_mib": round(max(s[1] for s in samples) / 2**20, 1),
        "client_fds_start": samples[0][2],
        "client_fds_max": max(s[2] for s in samples),
        "client_fds_end": client_fds(pid, engine_ports),
    }
