"""Disaggregated prefill/decode end to end: real simulators in ``--role prefill`` and
``--role decode``, fault proxies in front of them, and a real router.

Each case checks the exact bodies each leg received (``/sim/stats`` ``recent``), the one
request id both legs carry, what the client sees, the counters and their invariant, and
every engine's in-flight slots back at zero.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import MARK, Counters, FaultProxy, chat, http, wait_for
from procs import Proc, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

HEALTH = {"interval_s": 0.5, "timeout_s": 1.0, "failures_to_evict": 1000}
FAST = ("--tpot-ms", "2", "--prefill-tokens-per-s", "200000")
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


class Fleet:
    def __init__(self, sims: dict[str, Proc], proxies: dict[str, FaultProxy], router: Proc):
        self.sims = sims
        self.proxies = proxies
        self.router = router
        self.base = router.url

    def records(self, name: str, request_id: str | None = None) -> list[dict[str, Any]]:
        """Test requests (carrying MARK) the engine received, optionally by request id."""
        _, _, raw = http(self.sims[name].url, "GET", "/sim/stats")
        out = [r for r in json.loads(raw)["recent"] if MARK in json.dumps(r["body"])]
        if request_id is not None:
            out = [r for r in out if r["headers"].get("x-request-id") == request_id]
        return out

    def modes(self, **modes: str) -> None:
        for name, proxy in self.proxies.items():
            wanted = modes.get(name, "pass")
            if proxy.mode != wanted:
                proxy.mode = wanted

    def slots_zero(self) -> None:
        def idle() -> bool:
            m = metrics(self.base)
            rows = {k: v for k, v in m.items() if k.startswith("narwhal_engine_inflight")}
            return bool(rows) and all(v == 0 for v in rows.values())

        wait_for(idle, 10)


def _start(tmp: Path, roles: dict[str, str], proxied: tuple[str, ...], *,
           flags: dict[str, tuple[str, ...]] | None = None,
           admission: dict[str, Any] | None = None,
           policy: str = "least_loaded") -> Iterator[Fleet]:
    sims: dict[str, Proc] = {}
    proxies: dict[str, FaultProxy] = {}
    router: Proc | None = None
    try:
        for name, role in roles.items():
            sims[name] = start_sim(*(flags or {}).get(name, FAST), "--role", role)
        engines = []
        for name, role in roles.items():
            url = sims[name].url
            if name in proxied:
                proxies[name] = FaultProxy(int(url.rsplit(":", 1)[1]))
                url = proxies[name].url
            engines.append({"name": name, "url": url, "dialect": "vllm", "role": role})
        config = router_config([], engines=engines, health=HEALTH,
                               admission=admission or {"mode": "open"},
                               scheduling={"policy": policy})
        router = start_router(tmp, config)
        fleet = Fleet(sims, proxies, router)
        wait_for(lambda: http(fleet.base, "GET", "/ready")[0] == 200, 15)
        yield fleet
    finally:
        if router is not None:
            router.stop()
        for proxy in proxies.values():
            proxy.close()
        for sim in sims.values():
            sim.stop()


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two prefill engines and one decode engine, each behind a fault proxy."""
    yield from _start(tmp_path_factory.mktemp("disagg"),
                      {"p0": "prefill", "p1": "prefill", "d0": "decode"}, ("p0", "p1", "d0"))


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "split" in request.fixturenames:
        fleet: Fleet = request.getfixturevalue("split")
        fleet.modes()


def _sse(raw: bytes) -> list[Any]:
    events = []
    for line in raw.decode().split("\n"):
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _prefill_record(fleet: Fleet, rid: str) -> tuple[str, dict[str, Any]]:
    found = [(n, r) for n in ("p0", "p1") for r in fleet.records(n, rid)]
    assert len(found) == 1, found
    return found[0]


def test_non_streaming_legs_bodies_and_shared_id(split: Fleet) -> None:
    counters = Counters(split.base)
    body = {**chat("disaggregate me"), "max_completion_tokens": 6, "min_tokens": 2,
            "temperature": 0.0, "seed": 7}
    status, _, raw = http(split.base, "POST", "/v1/chat/completions", body,
                          {"x-request-id": "disagg-one"})
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["id"] == "chatcmpl-disagg-one"
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"]
    assert answer.get("kv_transfer_params") is None
    assert 1 <= answer["usage"]["completion_tokens"] <= 6

    # The prefill leg: the client's body, one token, non-streaming, remote decode asked.
    name, prefill = _prefill_record(split, "disagg-one")
    expected = {k: v for k, v in body.items() if k != "min_tokens"}
    expected.update(max_tokens=1, max_completion_tokens=1, stream=False,
                    kv_transfer_params=REMOTE_DECODE)
    assert prefill["body"] == expected
    assert prefill["outcome"] == "completed"

    # The decode leg: the client's body plus the prefill reply's kv_transfer_params, verbatim
    # (replayed here on the same prefill engine: its reply is deterministic).
    [decode] = split.records("d0", "disagg-one")
    status, _, again = http(split.sims[name].url, "POST", "/v1/chat/completions",
                            prefill["body"], {"x-request-id": "disagg-one"})
    assert status == 200
    kv = json.loads(again)["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["remote_request_id"] == "chatcmpl-disagg-one"
    assert decode["body"] == {**body, "kv_transfer_params": kv, "stream": True,
                              "return_token_ids": True, "stream_interval": 1,
                              "stream_options": {"include_usage": True}}
    assert decode["outcome"] == "completed"
    split.slots_zero()
    delta = counters.settled()
    assert delta.get("narwhal_completed_total", 0) == 1, delta


def test_streaming_generates_one_id_for_both_legs(split: Fleet) -> None:
    counters = Counters(split.base)
    body = {**chat("stream me", stream=True), "stream_options": {"include_usage": True},
            "min_completion_tokens": 1}
    status, headers, raw = http(split.base, "POST", "/v1/chat/completions", body)
    assert status == 200, raw
    assert headers["content-type"].startswith("text/event-stream")
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    [cid] = ids
    assert cid.startswith("chatcmpl-")
    rid = cid[len("chatcmpl-"):]
    assert len(rid) == 16 and int(rid, 16) >= 0
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    # Token IDs were asked of the engine, not by the client: null, as vLLM writes them.
    assert all(ch.get("token_ids") is None for c in chunks for ch in c["choices"])

    _, prefill = _prefill_record(split, rid)
    expected = {k: v for k, v in body.items()
                if k not in ("stream_options", "min_completion_tokens")}
    expected.update(max_tokens=1, stream=False, kv_transfer_params=REMOTE_DECODE)
    assert prefill["body"] == expected
    [decode] = split.records("d0", rid)
    assert decode["body"]["stream_options"] == {"include_usage": True}
    assert decode["body"]["min_completion_tokens"] == 1
    assert decode["body"]["max_tokens"] == body["max_tokens"]
    assert decode["body"]["kv_transfer_params"]["do_remote_prefill"] is True
    split.slots_zero()
    assert counters.settled().get("narwhal_completed_total", 0) == 1


def test_learning_by_role(split: Fleet) -> None:
    """Prefill engines are profiled (streaming probes without KV parameters) and feed the
    prefill model; the decode engine is never probed and learns TPOT from decode legs."""
    def described() -> dict[str, Any]:
        _, _, raw = http(split.base, "GET", "/engines")
        return {e["name"]: e for e in json.loads(raw)["engines"]}

    for i in range(2):
        status, _, _ = http(split.base, "POST", "/v1/chat/completions",
                            chat(f"learn {i}", max_tokens=12))
        assert status == 200

    def learned() -> dict[str, Any] | None:
        rows = described()
        ok = rows["d0"]["learned"]["tpot_s"] and all(
            rows[n]["learned"]["prefill_tokens_per_s"] for n in ("p0", "p1"))
        return rows if ok else None

    rows = wait_for(learned, 30)
    assert rows["p0"]["role"] == rows["p1"]["role"] == "prefill"
    assert rows["d0"]["learned"]["prefill_tokens_per_s"] is None
    assert rows["d0"]["learned"]["profile"]["count"] == 0
    assert rows["d0"]["learned"]["profile"]["failures"] == 0


def test_simulator_roles(split: Fleet) -> None:
    """``--role decode`` refuses a request without remote-prefill KV parameters; ``--role
    prefill`` serves the remote-decode leg non-streaming only, and normal requests."""
    body = chat("direct")
    status, _, raw = http(split.sims["d0"].url, "POST", "/v1/chat/completions", body)
    assert status == 400 and json.loads(raw)["error"]["param"] == "kv_transfer_params"
    leg = {**body, "kv_transfer_params": REMOTE_DECODE, "stream": True}
    status, _, raw = http(split.sims["p0"].url, "POST", "/v1/chat/completions", leg)
    assert status == 400, raw
    status, _, raw = http(split.sims["p0"].url, "POST", "/v1/chat/completions", body)
    assert status == 200 and json.loads(raw).get("kv_transfer_params") is None


def test_completions_route(split: Fleet) -> None:
    body = {"model": chat()["model"], "prompt": f"{MARK} once upon a time", "max_tokens": 5}
    status, _, raw = http(split.base, "POST", "/v1/completions", body,
                          {"x-request-id": "disagg-cmpl"})
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["id"] == "cmpl-disagg-cmpl"
    _, prefill = _prefill_record(split, "disagg-cmpl")
    assert prefill["body"] == {**body, "max_tokens": 1, "stream": False,
                               "kv_transfer_params": REMOTE_DECODE}
    [decode] = split.records("d0", "disagg-cmpl")
    assert decode["body"]["max_tokens"] == 5 and decode["body"]["prompt"] == body["prompt"]
    split.slots_zero()


def test_prefill_failure_is_retried_on_another_prefill_engine(split: Fleet) -> None:
    split.modes(p0="fault:http_500")
    counters = Counters(split.base)
    before = split.proxies["p0"].posts
    for i in range(4):
        stream = i % 2 == 1
        status, _, raw = http(split.base, "POST", "/v1/chat/completions",
                              chat(f"retry {i}", stream=stream), {"x-request-id": f"retry-{i}"})
        assert status == 200, raw
        if stream:
            assert _sse(raw)[-1] == "[DONE]" and b'"error"' not in raw
        # p1 served every prefill leg; the decode engine saw each request once.
        assert [r["outcome"] for r in split.records("p1", f"retry-{i}")] == ["completed"]
        assert len(split.records("d0", f"retry-{i}")) == 1
    failed_on_p0 = split.proxies["p0"].posts - before
    assert failed_on_p0 >= 1  # rotation sent some prefill legs to the failing engine first
    for r in split.records("p0"):
        if r["headers"].get("x-request-id", "").startswith("retry-"):
            assert r["outcome"] == "fault:http_500"
    split.slots_zero()
    delta = counters.settled()
    assert delta.get("narwhal_completed_total", 0) == 4, delta


def test_every_prefill_engine_failing_is_a_502(split: Fleet) -> None:
    split.modes(p0="fault:http_500", p1="fault:reset_before_headers")
    counters = Counters(split.base)
    status, _, raw = http(split.base, "POST", "/v1/chat/completions", chat("nobody prefills"),
                          {"x-request-id": "no-prefill"})
    assert status == 502, raw
    assert json.loads(raw)["error"]["code"] == "engine_error"
    assert split.records("d0", "no-prefill") == []  # no decode leg without KV
    split.slots_zero()
    delta = counters.settled()
    assert delta.get('narwhal_failed_total{reason="engine_error"}', 0) == 1, delta


def test_decode_failure_is_502_or_error_event(split: Fleet) -> None:
    counters = Counters(split.base)
    split.modes(d0="fault:http_500")
    status, _, raw = http(split.base, "POST", "/v1/chat/completions", chat("decode 500"))
    assert status == 502, raw
    assert json.loads(raw)["error"]["code"] == "engine_error"
    status, _, raw = http(split.base, "POST", "/v1/chat/completions",
                          chat("decode 500 stream", stream=True))
    assert status == 502, raw

    split.modes(d0="fault:reset_mid_stream:3")
    status, _, raw = http(split.base, "POST", "/v1/chat/completions",
                          chat("decode reset", stream=True, max_tokens=20),
                          {"x-request-id": "decode-reset"})
    assert status == 200
    events = _sse(raw)
    assert events[-1] == "[DONE]"
    assert "error" in events[-2], events[-2]
    assert len(split.records("d0", "decode-reset")) == 1  # the decode leg is never retried
    split.slots_zero()
    delta = counters.settled()
    failed = sum(v for k, v in delta.items() if k.startswith("narwhal_failed_total"))
    assert failed == 3, delta


def test_no_leg_hangs_past_the_deadline(split: Fleet) -> None:
    counters = Counters(split.base)
    split.modes(p0="hang", p1="hang")
    start = time.monotonic()
    status, _, raw = http(split.base, "POST", "/v1/chat/completions", chat("hung prefill"),
                          {"x-request-timeout": "1.5"})
    assert status == 504, raw
    assert json.loads(raw)["error"]["message"].startswith("Terminal expiry")
    assert time.monotonic() - start < 4
    split.modes(d0="hang")
    start = time.monotonic()
    status, _, raw = http(split.base, "POST", "/v1/chat/completions",
                          chat("hung decode", stream=True), {"x-request-timeout": "1.5"})
    assert status == 504, raw
    assert time.monotonic() - start < 4
    split.modes()
    split.slots_zero()
    delta = counters.settled()
    expired = sum(v for k, v in delta.items() if k.startswith("narwhal_expired_total"))
    assert expired == 2, delta


def test_mixed_fleet_runs_both_ways_and_looks_the_same(tmp_path: Path) -> None:
    roles = {"m0": "mixed", "p0": "prefill", "d0": "decode"}
    fleet_iter = _start(tmp_path, roles, ())
    fleet = next(fleet_iter)
    try:
        counters = Counters(fleet.base)
        results: list[tuple[int, bytes]] = []

        def one(i: int) -> None:
            status, _, raw = http(fleet.base, "POST", "/v1/chat/completions",
                                  chat(f"mixed {i}", max_tokens=40),
                                  {"x-request-id": f"mixed-{i}"})
            results.append((status, raw))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [s for s, _ in results] == [200] * 4, results
        mixed = {r["headers"]["x-request-id"] for r in fleet.records("m0")}
        split = {r["headers"]["x-request-id"] for r in fleet.records("d0")}
        assert mixed and split, (mixed, split)  # least loaded: both ways were taken
        assert not mixed & split
        assert {r["headers"]["x-request-id"] for r in fleet.records("p0")} == split
        # The client cannot tell which way a request went: same keys, same id shape.
        shapes = {tuple(sorted(json.loads(raw))) for _, raw in results}
        assert len(shapes) == 1, shapes
        for _, raw in results:
            answer = json.loads(raw)
            assert answer["id"] == "chatcmpl-" + answer["id"].split("-", 1)[1]
        fleet.slots_zero()
        assert counters.settled().get("narwhal_completed_total", 0) == 4
    finally:
        fleet_iter.close()


def test_predictive_mixed_fleet_splits_when_the_prefill_engine_is_faster(tmp_path: Path) -> None:
    """Predictive admission, lowest projected TTFT: the decode engine is never profiled (and
    not waited for); a prompt's prefill is projected on the profiled prefill engine, ten
    times faster than the mixed one, so requests split until its queue evens out."""
    roles = {"m0": "mixed", "p0": "prefill", "d0": "decode"}
    slow = ("--tpot-ms", "2", "--prefill-tokens-per-s", "20000", "--prefill-overhead-ms", "5")
    fast = ("--tpot-ms", "2", "--prefill-tokens-per-s", "200000", "--prefill-overhead-ms", "5")
    started = time.monotonic()
    fleet_iter = _start(tmp_path, roles, (), flags={"m0": slow, "p0": fast, "d0": fast},
                        admission={"mode": "predictive", "ttft_budget_s": 5.0},
                        policy="lowest_ttft")
    fleet = next(fleet_iter)
    try:
        assert time.monotonic() - started < 10  # not held up waiting for d0's profile
        counters = Counters(fleet.base)
        prompt = " ".join(["narwhal"] * 1500)
        for i in range(3):
            status, _, raw = http(fleet.base, "POST", "/v1/chat/completions",
                                  chat(f"{prompt} {i}", max_tokens=6),
                                  {"x-request-id": f"predictive-{i}"})
            assert status == 200, raw
        assert len(fleet.records("d0")) == 3 and fleet.records("m0") == []
        fleet.slots_zero()
        assert counters.settled().get("narwhal_completed_total", 0) == 3
    finally:
        fleet_iter.close()
