"""A fleet that changes without a restart, through the real router: reload (SIGHUP and the
admin route) adding and removing engines under streaming load, an invalid reload changing
nothing, engines added and removed through the admin API across workers, and discovery from
a watched file and from DNS (a DNS server this test runs on loopback)."""

from __future__ import annotations

import json
import signal
import socketserver
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from fleet_support import (
    ADMIN_ENV,
    ADMIN_SECTION,
    MARK,
    Counters,
    admin,
    engines,
    redis_server,
    wait_for,
)
from procs import MODEL, Proc, free_port, http, router_config

STREAM_TOKENS = 40
"""Tokens per streamed answer in the load; at 25 ms per token a stream lasts about a second."""


def start_slow_sim(host: str = "127.0.0.1", port: int = 0) -> Proc:
    return Proc([sys.executable, "-m", "narwhal.sim", "--host", host, "--port", str(port),
                 "--exit-with-parent", "--tpot-ms", "25", "--output-len", "1000",
                 "--prefill-tokens-per-s", "200000"], ready="listening on")


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    procs = [start_slow_sim() for _ in range(3)]
    yield procs
    for proc in procs:
        proc.stop()


def config(urls: dict[str, str], **sections: Any) -> dict[str, Any]:
    sections.setdefault("admission", {"mode": "open"})
    sections.setdefault("scheduling", {"policy": "least_loaded"})
    sections.setdefault("admin", ADMIN_SECTION)
    return router_config([], engines=[{"name": n, "url": u} for n, u in urls.items()],
                         **sections)


def write(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    tmp.replace(path)


def router_with_file(tmp_path: Path, data: dict[str, Any], *extra: str) -> tuple[Proc, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "narwhal.yaml"
    write(path, data)
    proc = Proc([sys.executable, "-m", "narwhal", "serve", "--config", str(path), *extra],
                ready="narwhal serving", env=ADMIN_ENV)
    return proc, path


def stream(base: str, n: int) -> tuple[int, str | None, list[int]]:
    """One streamed chat: (content chunks, finish reason, token IDs)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=30)
    chunks, finish, ids = 0, None, []
    for chunk in client.chat.completions.create(
            model=MODEL, stream=True, max_tokens=STREAM_TOKENS,
            messages=[{"role": "user", "content": f"{MARK} stream {n}"}],
            extra_body={"return_token_ids": True}):
        choice = chunk.choices[0] if chunk.choices else None
        if choice is None:
            continue
        if choice.delta.content:
            chunks += 1
        ids += getattr(choice, "token_ids", None) or []
        finish = choice.finish_reason or finish
    return chunks, finish, ids


def running(sim: Proc) -> int:
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return int(json.loads(raw)["running"])


def engine_names(base: str) -> set[str]:
    return set(engines(base))


def send(base: str, count: int) -> None:
    """``count`` short chats, each answered 200."""
    for i in range(count):
        status, _, body = http(base, "POST", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": f"{MARK} probe {i}"}]})
        assert status == 200, body


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("how", ["sighup", "admin"])
def test_reload_adds_and_removes_engines_under_streaming_load(
        tmp_path: Path, sims: list[Proc], workers: int, how: str) -> None:
    a, b, c = sims
    router, path = router_with_file(
        tmp_path, config({"a": a.url, "b": b.url}), "--workers", str(workers))
    try:
        base = router.url
        counters = Counters(base)
        received_c = json.loads(http(c.url, "GET", "/sim/stats")[2])["received"]
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(stream, base, n) for n in range(8)]
            wait_for(lambda: running(b) >= 2, 10)  # streams are open on the engine to go
            write(path, config({"a": a.url, "c": c.url}))
            if how == "sighup":
                router.signal(signal.SIGHUP)
            else:
                status, _, body = admin(base, "/admin/reload")
                assert status == 200, body
                assert [e["name"] for e in body["leaving"]] == ["b"]
            # Nothing new goes to b, c joins once probed and profiled, b leaves once idle.
            wait_for(lambda: engine_names(base) == {"a", "c"}, 15)
            results = [f.result(timeout=30) for f in futures]
        # Every stream, those on b included, ended whole: all its tokens, a finish reason.
        assert all(finish == "length" and len(ids) == STREAM_TOKENS for _, finish, ids in results)
        # every worker (each forgets b once no worker has it in flight: polled)
        wait_for(lambda: all(engine_names(base) == {"a", "c"} for _ in range(8)), 10)
        received_b = json.loads(http(b.url, "GET", "/sim/stats")[2])["received"]
        for i in range(6):
            assert stream(base, 100 + i)[1] == "length"
        stats_c = json.loads(http(c.url, "GET", "/sim/stats")[2])
        assert stats_c["received"] > received_c  # the new engine takes requests
        # and the removed one none
        assert json.loads(http(b.url, "GET", "/sim/stats")[2])["received"] == received_b
        delta = counters.settled()
        assert delta.get("narwhal_completed_total", 0) >= 14
        assert not any(k.startswith("narwhal_failed_total") for k in delta), delta
        m = counters.delta()
        assert m.get("narwhal_retained_requests", 0) == 0
    finally:
        router.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_invalid_reload_changes_nothing(tmp_path: Path, sims: list[Proc],
                                        workers: int) -> None:
    a, b, _ = sims
    good = config({"a": a.url, "b": b.url})
    router, path = router_with_file(tmp_path, good, "--workers", str(workers))
    try:
        base = router.url
        # An invalid file: the admin route answers 400 with the start-up check's message.
        bad = config({"a": a.url, "b": b.url})
        bad["engines"][1]["max_decode"] = 0
        write(path, bad)
        status, _, body = admin(base, "/admin/reload")
        assert status == 400
        check = Proc([sys.executable, "-m", "narwhal", "serve", "--config", str(path)],
                     ready="never", wait_ready=False)
        assert check.wait(30) == 2
        printed = "".join(check.lines).strip().removeprefix("narwhal: ")
        assert body["error"]["message"] == printed
        assert "engines[1].max_decode" in printed
        # SIGHUP with the same file: logged, nothing changes, the router serves on.
        router.signal(signal.SIGHUP)
        wait_for(lambda: any("reload refused" in line for line in router.lines), 10)
        # A key that needs a restart is refused by name.
        restart = config({"a": a.url}, listen={"host": "127.0.0.2", "port": 0})
        write(path, restart)
        status, _, body = admin(base, "/admin/reload")
        assert status == 400
        assert "listen.host" in body["error"]["message"]
        for _ in range(8):
            assert engine_names(base) == {"a", "b"}
            assert engines(base)["b"]["max_decode"] == 256
        assert http(base, "POST", "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": MARK}]})[0] == 200
    finally:
        router.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_admin_adds_and_removes_engines(tmp_path: Path, sims: list[Proc],
                                        workers: int) -> None:
    a, b, c = sims
    router, _ = router_with_file(tmp_path, config({"a": a.url}), "--workers", str(workers))
    try:
        base = router.url
        counters = Counters(base)
        # Bad entries: the envelope names the key.
        status, _, body = admin(base, "/admin/engines", {"name": "b", "url": b.url,
                                                           "max_decode": -1})
        assert status == 400 and body["error"]["param"] == "max_decode"
        status, _, body = admin(base, "/admin/engines", {"name": "a", "url": c.url})
        assert status == 409 and body["error"]["param"] == "name"
        status, _, body = admin(base, "/admin/engines", {"name": "b", "url": a.url})
        assert status == 400 and "same engine" in body["error"]["message"]
        # Added: visible on /engines at once, in every worker; placed on once joined.
        status, _, body = admin(base, "/admin/engines", {"name": "b", "url": b.url,
                                                           "max_decode": 8})
        assert status == 200, body
        for _ in range(8):
            assert engine_names(base) == {"a", "b"}
        wait_for(lambda: all(engines(base)["b"]["state"] == "healthy" for _ in range(8)), 15)
        assert engines(base)["b"]["max_decode"] == 8
        before = json.loads(http(b.url, "GET", "/sim/stats")[2])["received"]
        send(base, 8)  # least-loaded placement rotates ties: some land on b
        assert json.loads(http(b.url, "GET", "/sim/stats")[2])["received"] > before
        # Removed under load: its stream finishes; then it is gone from every worker.
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(stream, base, n) for n in range(4)]
            wait_for(lambda: running(b) >= 1, 10)
            status, _, body = admin(base, "/admin/engines/b", method="DELETE")
            assert status == 200, body
            results = [f.result(timeout=30) for f in futures]
        assert all(finish == "length" and len(ids) == STREAM_TOKENS for _, finish, ids in results)
        wait_for(lambda: all(engine_names(base) == {"a"} for _ in range(8)), 10)
        status, _, body = admin(base, "/admin/engines/b", method="DELETE")
        assert status == 404
        # The last engine cannot go: the configuration would have none.
        status, _, body = admin(base, "/admin/engines/a", method="DELETE")
        assert status == 400 and "engines" in body["error"]["message"]
        # Admin changes are not in the file: a reload goes back to it.
        admin(base, "/admin/engines", {"name": "c", "url": c.url})
        assert admin(base, "/admin/reload")[0] == 200
        wait_for(lambda: all(engine_names(base) == {"a"} for _ in range(8)), 10)
        delta = counters.settled()
        assert not any(k.startswith("narwhal_failed_total") for k in delta), delta
    finally:
        router.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_file_discovery(tmp_path: Path, sims: list[Proc], workers: int) -> None:
    a, b, c = sims
    listing = tmp_path / "engines.yaml"
    write(listing, [{"name": "a", "url": a.url}])
    data = config({}, discovery={"file": str(listing), "interval_s": 0.2})
    del data["engines"]
    router, _ = router_with_file(tmp_path, data, "--workers", str(workers))
    try:
        base = router.url
        assert engine_names(base) == {"a"}
        write(listing, [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}])
        wait_for(lambda: all(engine_names(base) == {"a", "b"} for _ in range(8)), 10)
        write(listing, [{"name": "b", "url": b.url}, {"name": "c", "url": c.url}])
        wait_for(lambda: all(engine_names(base) == {"b", "c"} for _ in range(8)), 10)
        # An invalid listing changes nothing and is logged.
        write(listing, [{"name": "b", "url": b.url, "max_decode": "lots"}])
        wait_for(lambda: any("discovery file" in line and "not applied" in line
                             for line in router.lines), 10)
        assert engine_names(base) == {"b", "c"}
        wait_for(lambda: all(engines(base)[n]["state"] == "healthy" for n in "bc"
                             for _ in range(8)), 15)
        for _ in range(8):
            status, _, body = http(base, "POST", "/v1/chat/completions", {
                "model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": MARK}]})
            assert status == 200, body
    finally:
        router.stop()


def test_admin_engine_changes_reach_every_router_of_a_cluster(tmp_path: Path,
                                                              sims: list[Proc]) -> None:
    a, b, _ = sims
    with redis_server() as redis:
        cluster = {"backend": "redis", "url": redis.url, "key_prefix": "fleet-test",
                   "sync_interval_ms": 50}
        routers = [router_with_file(tmp_path / f"r{i}", config({"a": a.url}, cluster=cluster),
                                    *flags)[0]
                   for i, flags in enumerate([(), ("--workers", "2")])]
        try:
            one, two = (r.url for r in routers)
            status, _, body = admin(one, "/admin/engines", {"name": "b", "url": b.url})
            assert status == 200, body
            wait_for(lambda: all(engine_names(two) == {"a", "b"} for _ in range(8)), 10)
            status, _, body = admin(two, "/admin/engines/b", method="DELETE")
            assert status == 200, body
            wait_for(lambda: all(engine_names(one) == {"a"} for _ in range(8)), 10)
            wait_for(lambda: all(engine_names(two) == {"a"} for _ in range(8)), 10)
        finally:
            codes = [router.stop() for router in routers]
        # SIGTERM stops every process of both (a worker whose cluster loop lost its
        # cancellation was killed by the parent after 6 s, or the process never ended).
        assert codes == [0, 0], codes
        assert not any("did not exit within" in line for r in routers for line in r.lines)


# -- DNS ------------------------------------------------------------------------------------
class DnsServer:
    """A DNS server on 127.0.0.1 (UDP) answering A records for one name from a mutable list."""

    def __init__(self, name: str) -> None:
        from dnslib import QTYPE, RR, A, DNSRecord

        self.name = name
        self.addresses: list[str] = []
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data, sock = self.request
                query = DNSRecord.parse(data)
                reply = query.reply()
                qname = str(query.q.qname).rstrip(".")
                if qname == server.name and query.q.qtype == QTYPE.A:
                    for address in list(server.addresses):
                        reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A(address), ttl=1))
                sock.sendto(reply.pack(), self.client_address)

        self.server = socketserver.ThreadingUDPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_dns_discovery(tmp_path: Path) -> None:
    port = free_port()
    # Two engines on one port at two loopback addresses, as pods behind a headless Service.
    sims = [start_slow_sim("127.0.0.2", port), start_slow_sim("127.0.0.3", port)]
    dns = DnsServer("vllm.models.test")
    try:
        dns.addresses = ["127.0.0.2"]
        data = config({}, discovery={"dns": {
            "name": "vllm.models.test", "port": port, "interval_s": 0.2,
            "resolver": f"127.0.0.1:{dns.port}", "engine": {"max_decode": 16}}})
        del data["engines"]
        router, _ = router_with_file(tmp_path, data, "--workers", "2")
        try:
            base = router.url
            assert engine_names(base) == {"127.0.0.2"}
            assert engines(base)["127.0.0.2"]["max_decode"] == 16
            dns.addresses = ["127.0.0.2", "127.0.0.3"]
            wait_for(lambda: all(engine_names(base) == {"127.0.0.2", "127.0.0.3"}
                                 for _ in range(8)), 10)
            assert engines(base)["127.0.0.3"]["url"] == f"http://127.0.0.3:{port}"
            wait_for(lambda: all(engines(base)["127.0.0.3"]["state"] == "healthy"
                                 for _ in range(8)), 15)
            dns.addresses = ["127.0.0.3"]
            wait_for(lambda: all(engine_names(base) == {"127.0.0.3"} for _ in range(8)), 10)
            counters = Counters(base)
            for _ in range(3):
                status, _, body = http(base, "POST", "/v1/chat/completions", {
                    "model": MODEL, "max_tokens": 2,
                    "messages": [{"role": "user", "content": MARK}]})
                assert status == 200, body
            assert counters.settled().get("narwhal_completed_total") == 3
        finally:
            router.stop()
    finally:
        dns.close()
        for sim in sims:
            sim.stop()
