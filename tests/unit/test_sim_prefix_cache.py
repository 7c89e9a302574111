"""The simulator's prefix cache: 16-token blocks, LRU in tokens, prefill only the uncached
tokens, vLLM's counters on /metrics and prompt_tokens_details.cached_tokens in usage."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from tests.helpers.simproc import Harness

from narwhal.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes

pytestmark = pytest.mark.timeout(30)


def test_blocks_chain_so_a_shared_block_after_a_different_prefix_misses() -> None:
    a = list(range(100, 164))
    b = [7] * 16 + a[16:]
    assert block_hashes(a)[1:] != block_hashes(b)[1:]
    assert len(block_hashes(a)) == 4 and len(block_hashes(a[:47])) == 2


def test_hits_count_leading_full_blocks_and_always_leave_the_last_token() -> None:
    cache = PrefixCache(1600)
    prompt = list(range(200, 250))  # 50 tokens: 3 full blocks
    assert cache.admit(prompt) == 0
    assert cache.admit(prompt) == 48
    assert cache.admit(prompt[:48]) == 32  # fully cached: the last block is recomputed
    assert cache.admit(prompt[:20] + [1] * 40) == BLOCK_TOKENS
    assert cache.queries_total == 50 + 50 + 48 + 60
    assert cache.hits_total == 48 + 32 + 16


def test_lru_evicts_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(64)  # 4 blocks
    a, b = list(range(300, 333)), list(range(400, 433))  # 2 blocks each
    cache.admit(a)
    cache.admit(b)
    cache.admit(a)  # a is the most recent now
    cache.admit(list(range(500, 533)))  # evicts b
    assert cache.blocks == 4
    assert cache.admit(a) == 32 and cache.admit(b) == 0


def test_disabled_cache_does_nothing() -> None:
    cache = PrefixCache(0)
    assert not cache.enabled and cache.admit(list(range(100))) == 0 and cache.queries_total == 0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_engine_reports_cached_tokens_and_counters() -> None:
    system = "You are a helpful router. " * 40
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 3,
                            "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": "hello there"}]}

    async def go() -> tuple[Any, Any, Any, bytes, str]:
        h = Harness(kv_cache_tokens=4096, prompt_tokens_details=True, output_len="3")
        try:
            first, _ = await h.request("POST", "/v1/chat/completions", body)
            second, _ = await h.request("POST", "/v1/chat/completions", body)
            streamed, _ = await h.request("POST", "/v1/chat/completions", {
                **body, "stream": True, "stream_options": {"include_usage": True}})
            metrics, _ = await h.request("GET", "/metrics")
            return (first.json()["usage"], second.json()["usage"], h.engine.prefix_cache,
                    streamed.events[-2], metrics.body.decode())
        finally:
            h.close()

    first, second, cache, usage_event, metrics = asyncio.run(go())
    prompt = first["prompt_tokens"]
    assert first["prompt_tokens_details"] is None  # nothing cached: vLLM leaves it out
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached == (prompt - 1) // BLOCK_TOKENS * BLOCK_TOKENS > 0
    usage = orjson.loads(usage_event.removeprefix(b"data: "))["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": cached}
    assert _metric(metrics, "vllm:prefix_cache_queries_total") == 3 * prompt
    assert _metric(metrics, "vllm:prefix_cache_hits_total") == 2 * cached == cache.hits_total

