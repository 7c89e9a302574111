"""Cache-aware placement end to end: real routers and simulated engines with a prefix cache
(``--kv-cache-tokens``, ``--enable-prompt-tokens-details``). A conversation's turns go to the
engine that holds its prefix; a hot prefix spills to a second engine under load; predictive
admission credits the cache; ``/engines`` shows each engine's prefix index."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import MODEL, Proc, get_json, http, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

SIM_FLAGS = ("--kv-cache-tokens", "200000", "--enable-prompt-tokens-details",
             "--prefill-overhead-ms", "2", "--tpot-ms", "2", "--output-len", "4")
SYSTEM = ("You are the support assistant of a router for language models; be brief, kind "
          "and exact, and never invent facts about the fleet. ")


def system(tag: str, repeat: int) -> str:
    return f"[{tag}] " + SYSTEM * repeat


def ask(base: str, messages: list[dict[str, str]], *, session: str | None = None,
        max_tokens: int = 4) -> tuple[int, dict[str, Any]]:
    headers = {"x-session-id": session} if session is not None else None
    status, _, raw = http(base, "POST", "/v1/chat/completions",
                          {"model": MODEL, "messages": messages, "max_tokens": max_tokens},
                          headers, timeout=60.0)
    return status, json.loads(raw)


def sim_counter(sim: Proc, name: str) -> float:
    _, _, raw = http(sim.url, "GET", "/metrics")
    for line in raw.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def served(sims: list[Proc], tag: str) -> list[int]:
    """Per engine: requests in its recent records whose prompt carries ``tag``."""
    out = []
    for sim in sims:
        recent = get_json(sim.url + "/sim/stats")["recent"]
        out.append(sum(tag in json.dumps(r["body"]) for r in recent))
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Proc, list[Proc]]]:
    sims = [start_sim(*SIM_FLAGS, "--prefill-tokens-per-s", "4000", "--seed", str(i))
            for i in range(2)]
    router = start_router(tmp_path, router_config([s.url for s in sims],
                                                  admission={"mode": "open"}))
    try:
        yield router, sims
    finally:
        router.stop()
        for sim in sims:
            sim.stop()


def test_a_conversation_stays_on_the_engine_that_caches_it(
        fleet: tuple[Proc, list[Proc]]) -> None:
    router, sims = fleet
    messages = [{"role": "system", "content": system("conv-a", 30)}]  # ~930 tokens
    cached = []
    for turn in range(5):
        messages.append({"role": "user", "content": f"question {turn}: what about tusks?"})
        status, body = ask(router.url, messages)
        assert status == 200, body
        details = body["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens", 0))
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]
                         ["content"] or "ok"})
    counts = served(sims, "conv-a")
    assert sorted(counts) == [0, 5], counts  # every turn on one engine
    assert cached[0] == 0 and all(c > 900 for c in cached[1:]), cached  # its prefix hit
    home = counts.index(5)
    engines = {e["name"]: e for e in get_json(router.url + "/engines")["engines"]}
    index = engines[f"e{home}"]["prefix_index"]
    assert index["indexed_blocks"] > 60 and index["estimated_hit_rate"] > 0.5
    assert index["reported_hit_rate"] > 0.5
    assert engines[f"e{1 - home}"]["prefix_index"]["indexed_blocks"] == 0


def test_a_session_header_keeps_turns_together(fleet: tuple[Proc, list[Proc]]) -> None:
    router, sims = fleet
    messages = [{"role": "system", "content": system("conv-s", 20)}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"turn {turn}"})
        status, body = ask(router.url, messages, session="session-s")
        assert status == 200, body
        messages.append({"role": "assistant", "content": "noted"})
    assert sorted(served(sims, "conv-s")) == [0, 4]


def test_a_hot_prefix_spills_to_a_second_engine_under_load(
        fleet: tuple[Proc, list[Proc]]) -> None:
    router, sims = fleet
    hot = system("hot", 40)  # ~1240 tokens: ~0.3 s to prefill uncached, ~2 ms cached
    status, _ = ask(router.url, [{"role": "system", "content": hot},
                                 {"role": "user", "content": "warm up"}])
    assert status == 200
    results: list[int] = []

    def one(i: int) -> None:
        # Each request's own part is long enough that queueing many of them on the hot
        # engine costs more than prefilling the shared prefix on the other one.
        status, _ = ask(router.url, [{"role": "system", "content": hot},
                                     {"role": "user", "content": f"q{i} " + "why? " * 300}])
        results.append(status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 24
    counts = served(sims, "[hot]")
    assert min(counts) >= 2, counts  # spilled: both engines served the hot prefix
    hits = [sim_counter(s, "vllm:prefix_cache_hits_total") for s in sims]
    assert min(hits) > 0, hits  # and once spilled, the second engine caches it too


def test_predictive_admission_credits_the_cache(tmp_path: Path) -> None:
    sim = start_sim(*SIM_FLAGS, "--prefill-tokens-per-s", "2000")
    router = start_router(tmp_path, router_config(
        [sim.url], admission={"mode": "predictive", "ttft_budget_s": 1.0}))
    try:
        base = system("pred", 45)  # ~1400 tokens: 0.7 s, within the 1 s budget
        longer = "tell me everything about narwhals and their tusks. " * 100  # 1200 more
        status, body = ask(router.url, [{"role": "system", "content": base},
                                        {"role": "user", "content": "hi"}])
        assert status == 200, body
        # The same prompt size uncached: ~2600 tokens, 1.3 s alone, refused.
        status, body = ask(router.url, [{"role": "system", "content": system("cold", 45)},
                                        {"role": "user", "content": longer}])
        assert status == 429 and body["error"]["code"] == "prompt_exceeds_ttft_budget", body
        # Its conversation's prefix is cached: only the new ~1200 tokens count, admitted.
        status, body = ask(router.url, [{"role": "system", "content": base},
                                        {"role": "user", "content": longer}])
        assert status == 200, body
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000
    finally:
        router.stop()
        sim.stop()


def test_two_workers_place_conversations_cache_aware(tmp_path: Path) -> None:
    """Each worker keeps its own index: turns that reach the same worker stay with their
    engine, and every turn is served; the engines' caches are hit."""
    sims = [start_sim(*SIM_FLAGS, "--prefill-tokens-per-s", "4000", "--seed", str(i))
            for i in range(2)]
    router = start_router(tmp_path, router_config([s.url for s in sims],
                                                  admission={"mode": "open"}),
                          "--workers", "2")
    try:
        for c in range(3):
            messages = [{"role": "system", "content": system(f"w2-{c}", 20)}]
            for turn in range(4):
                messages.append({"role": "user", "content": f"turn {turn}"})
                status, body = ask(router.url, messages, session=f"w2-{c}")
                assert status == 200, body
                messages.append({"role": "assistant", "content": "noted"})
        hits = sum(sim_counter(s, "vllm:prefix_cache_hits_total") for s in sims)
        queries = sum(sim_counter(s, "vllm:prefix_cache_queries_total") for s in sims)
        assert hits > 0.3 * queries, (hits, queries)
        described = get_json(router.url + "/engines")["engines"]
        assert all(e["prefix_index"]["capacity_blocks"] > 0 for e in described)
    finally:
        router.stop()
        for sim in sims:
            sim.stop()
