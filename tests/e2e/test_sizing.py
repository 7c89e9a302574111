"""Prompt sizing through a real router: the engines' exact count when asked for, and by
default the calibrated estimate learning from the counts the engines return on every stream."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from benches.harness.sizing import chat_body
from fleet_support import Counters
from procs import MODEL, Proc, http, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start_sim("--tpot-ms", "1")
    yield proc
    proc.stop()


def engine_count(sim: Proc, body: dict[str, object]) -> int:
    req = urllib.request.Request(sim.url + "/tokenize", data=json.dumps(
        {"model": MODEL, "messages": body["messages"], "tools": body.get("tools"),
         "add_generation_prompt": True}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.loads(resp.read())["count"])


def sized(router: Proc, body: dict[str, object]) -> float:
    before = metrics(router.url)["narwhal_offered_prompt_tokens_total"]
    status, _, raw = http(router.url, "POST", "/v1/chat/completions", body)
    assert status == 200, raw
    return metrics(router.url)["narwhal_offered_prompt_tokens_total"] - before


def test_sizing_engine_counts_every_prompt_exactly(sim: Proc, tmp_path: Path) -> None:
    router = start_router(tmp_path, router_config([sim.url], admission={"sizing": "engine"}))
    try:
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "How many tokens is this prompt, exactly?"}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 3}
        assert sized(router, body) == engine_count(sim, body)
    finally:
        router.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_default_estimate_learns_the_engines_count(sim: Proc, tmp_path: Path,
                                                       workers: int) -> None:
    router = start_router(tmp_path, router_config([sim.url]), "--workers", str(workers))
    try:
        counters = Counters(router.url)
        rng = random.Random(11)
        # Each worker learns from the streams it relays: enough requests for both to learn.
        for _ in range(30 * workers):
            body = chat_body(rng)
            body["max_tokens"] = 2
            sized(router, body)
        errors = []
        for _ in range(20):
            body = chat_body(rng)
            body["max_tokens"] = 2
            exact = engine_count(sim, body)
            errors.append(abs(sized(router, body) - exact) / exact)
        errors.sort()
        assert errors[len(errors) // 2] <= 0.05, errors
        assert counters.settled()["narwhal_completed_total"] == 30 * workers + 20
    finally:
        router.stop()
