"""The learned model end to end against simulated engines of known prefill rate and TPOT:
learned values and projections within 20% of the truth, output-length learning, drift that
re-profiles after a runtime change of the engine, and learned state across a restart."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from procs import MODEL, Proc, get_json, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(60)

RATE, OVERHEAD, TPOT, OUTPUT = 5000.0, 0.040, 0.015, 16  # the simulator's truth


def stream(base: str, prompt_tokens: int, max_tokens: int = 128) -> tuple[float, int]:
    """A streaming completion with a token-ID prompt: (seconds to the first event, events)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    body = {"model": MODEL, "prompt": [100 + i % 800 for i in range(prompt_tokens)],
            "max_tokens": max_tokens, "stream": True}
    start = time.monotonic()
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        first = resp.readline()
        ttft = time.monotonic() - start
        rest = resp.read()
    finally:
        conn.close()
    return ttft, (first + rest).count(b"data: {")


def learned(base: str, index: int = 0) -> dict[str, Any]:
    return get_json(base + "/engines")["engines"][index]["learned"]  # type: ignore[no-any-return]


def sim_config(sim: Proc, **changes: float) -> None:
    req = urllib.request.Request(sim.url + "/sim/config", data=json.dumps(changes).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def sim_received(sim: Proc) -> int:
    return int(get_json(sim.url + "/sim/stats")["received"])


def ready(proc: Proc) -> Proc:
    """Wait until the router has an eligible (healthy and profiled) engine."""
    deadline = time.monotonic() + 15
    while get_json(proc.url + "/ready") != {"ready": True} and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start_sim("--prefill-tokens-per-s", str(RATE), "--prefill-overhead-ms",
                     str(OVERHEAD * 1e3), "--tpot-ms", str(TPOT * 1e3), "--output-len",
                     str(OUTPUT))
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def router(sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = ready(start_router(tmp_path_factory.mktemp("learning"), router_config([sim.url])))
    try:
        yield proc
    finally:
        proc.stop()


def test_profile_learns_the_engine_within_20_percent(router: Proc) -> None:
    got = learned(router.url)
    assert got["prefill_tokens_per_s"] == pytest.approx(RATE, rel=0.2)
    assert got["prefill_overhead_s"] == pytest.approx(OVERHEAD, rel=0.2)
    assert got["tpot_s"] == pytest.approx(TPOT, rel=0.2)
    assert got["profiled_at"] == pytest.approx(time.time(), abs=120)
    assert (got["drift_ttft"], got["drift_tpot"]) == (0.0, 0.0)
    assert got["profile"] == {"count": 1, "reason": "join", "running": False, "due": None,
                              "failures": 0, "error": None}
    m = metrics(router.url)
    assert m['narwhal_engine_drift{engine="e0",kind="ttft"}'] == 0.0
    assert m['narwhal_engine_learned_prefill_tokens_per_second{engine="e0"}'] == \
        pytest.approx(RATE, rel=0.2)


def test_projected_ttft_matches_the_measured_one_under_a_burst(router: Proc) -> None:
    """Four 1000-token prompts at once on one engine that prefills them one after another:
    the k-th waits for k-1 others. Each measured TTFT is within 20% of the projection from
    the learned model, and so is the router's own prediction for each (drift_ttft)."""
    got = learned(router.url)
    per = got["prefill_overhead_s"] + 1000 / got["prefill_tokens_per_s"]
    ttfts: list[float] = []
    threads = [threading.Thread(target=lambda: ttfts.append(stream(router.url, 1000)[0]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(ttfts) == 4
    for k, measured in enumerate(sorted(ttfts), start=1):
        assert measured == pytest.approx(k * per, rel=0.2), (k, measured, per)
    after = learned(router.url)
    assert after["drift_ttft"] < 0.2  # the router's own projections held for each request
    last = after["last_prefill"]
    assert last["observed_s"] == pytest.approx(last["predicted_s"], rel=0.2)


def test_tpot_scoring_and_output_length_learning(router: Proc) -> None:
    for _ in range(8):
        _, events = stream(router.url, 50, max_tokens=64)
        assert events == OUTPUT  # the simulator stops at --output-len
    got = learned(router.url)
    assert got["tpot_s"] == pytest.approx(TPOT, rel=0.2)
    assert got["drift_tpot"] < 0.2
    completion = got["output_length"]["completion"]
    assert completion["samples"] >= 8
    # 16 of at most 64: a quarter (the prior of one half still weighs a little)
    assert completion["ratio_of_max"]["mean"] == pytest.approx(OUTPUT / 64, rel=0.2)
    assert completion["ratio_of_max"]["p50"] == pytest.approx(0.25)


def test_runtime_tpot_change_shows_as_drift_and_the_model_follows(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "4", "--prefill-tokens-per-s", "50000", "--output-len", "24")
    router = ready(start_router(tmp_path, router_config([sim.url])))
    try:
        assert learned(router.url)["tpot_s"] == pytest.approx(0.004, rel=0.2)
        sim_config(sim, tpot_ms=16.0)  # the engine slows down 4x
        peak = 0.0
        for _ in range(20):
            stream(router.url, 20, max_tokens=24)
            now = learned(router.url)
            peak = max(peak, now["drift_tpot"])
            if now["profile"]["count"] >= 2:
                break
        assert peak > 0.5  # over admission.drift_threshold
        after = wait_for(lambda: (lambda g: g if g["profile"]["count"] >= 2
                                  and not g["profile"]["running"] else None)(
                                      learned(router.url)))
        assert after, learned(router.url)
        assert after["profile"]["reason"] == "drift_tpot"
        assert after["tpot_s"] == pytest.approx(0.016, rel=0.2)  # re-profiled: follows
        assert after["drift_tpot"] < 0.5
        stream(router.url, 20, max_tokens=24)
        assert learned(router.url)["drift_tpot"] < 0.5
    finally:
        router.stop()
        sim.stop()


def test_runtime_prefill_change_shows_as_drift_and_reprofiles(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "2", "--prefill-tokens-per-s", "20000", "--output-len", "4")
    router = ready(start_router(tmp_path, router_config([sim.url])))
    try:
        assert learned(router.url)["prefill_tokens_per_s"] == pytest.approx(20000, rel=0.2)
        sim_config(sim, prefill_tokens_per_s=4000.0)  # prefill 5x slower
        peak = 0.0
        for _ in range(20):
            stream(router.url, 1000, max_tokens=4)
            now = learned(router.url)
            peak = max(peak, now["drift_ttft"])
            if now["profile"]["count"] >= 2:
                break
        assert peak > 0.5
        m = metrics(router.url)
        assert 'narwhal_engine_drift{engine="e0",kind="ttft"}' in m
        after = wait_for(lambda: (lambda g: g if g["profile"]["count"] >= 2
                                  and not g["profile"]["running"] else None)(
                                      learned(router.url)))
        assert after and after["profile"]["reason"] == "drift_ttft"
        assert after["prefill_tokens_per_s"] == pytest.approx(4000, rel=0.2)
    finally:
        router.stop()
        sim.stop()


def test_learned_state_survives_a_restart_without_reprofiling(tmp_path: Path) -> None:
    sim = start_sim("--tpot-ms", "3", "--prefill-tokens-per-s", "30000")
    state = tmp_path / "state.json"
    config = router_config([sim.url], state_file=str(state))
    try:
        first = ready(start_router(tmp_path, config))
        before = learned(first.url)
        first.stop()
        saved = json.loads(state.read_text())["learned"]
        assert saved["engines"]["e0"]["prefill_tokens_per_s"] == \
            pytest.approx(before["prefill_tokens_per_s"], rel=1e-5)  # /engines shows 6 digits
        probes = sim_received(sim)
        second = ready(start_router(tmp_path, config))
        try:
            restored = learned(second.url)
            assert restored["profile"]["reason"] == "restored"
            assert restored["profile"]["count"] == 0
            assert restored["prefill_tokens_per_s"] == before["prefill_tokens_per_s"]
            assert restored["tpot_s"] == pytest.approx(before["tpot_s"], rel=1e-5)
            time.sleep(0.5)
            assert sim_received(sim) == probes  # no probe went to the engine
            assert stream(second.url, 20, max_tokens=4)[1] >= 1
        finally:
            second.stop()
    finally:
        sim.stop()


def test_workers_take_turns_and_share_one_profile(tmp_path: Path) -> None:
    """Two worker processes, one engine: one profile between them (a warm-up, 16 to 1024
    twice as they are cheap, 2048 once: ten probes), the other worker adopts it, and both
    report the same model within 20% of the truth."""
    sim = start_sim("--tpot-ms", "5", "--prefill-tokens-per-s", "5000",
                    "--prefill-overhead-ms", "20")
    config = router_config([sim.url], state_file=str(tmp_path / "state.json"))
    router = ready(start_router(tmp_path, config, "--workers", "2"))
    try:
        assert 8 <= sim_received(sim) <= 11  # one profile (a busy host may skip a repeat)
        seen = {learned(router.url)["prefill_tokens_per_s"] for _ in range(8)}
        assert len(seen) == 1
        assert seen.pop() == pytest.approx(5000, rel=0.2)
    finally:
        router.stop()
        sim.stop()
