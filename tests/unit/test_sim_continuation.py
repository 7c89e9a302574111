"""Simulator: a chat answer resumed from a token-ID prompt on /v1/completions (what the router
sends when it migrates a broken stream) continues exactly where the unbroken answer goes, and
the break-after-N-tokens faults end a stream the ways a dying engine does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import Harness, event_json, run_async
from narwhal.sim.tokenizer import OUTPUT_TEXTS

pytestmark = pytest.mark.timeout(30)

MSG = [{"role": "user", "content": "tell me a story about routers"}]


def post(path: str, body: dict[str, Any], **settings: Any) -> Any:
    async def go() -> Any:
        h = Harness(**settings)
        try:
            r, _ = await h.request("POST", path, {"model": "tiny", **body})
            assert r.status == 200, r.body
            return event_json(r.events) if body.get("stream") else r.json()
        finally:
            h.close()

    return run_async(go())


def chat(max_tokens: int | None, seed: int | None = 7, **settings: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": MSG, "return_token_ids": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if seed is not None:
        body["seed"] = seed
    out: dict[str, Any] = post("/v1/chat/completions", body, **settings)
    return out


def resume(prompt: list[int], max_tokens: int | None, seed: int | None = 7,
           **settings: Any) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                            "return_token_ids": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    events: list[Any] = post("/v1/completions", body, **settings)
    assert events[-1] == "[DONE]"
    return events[:-1]


@pytest.mark.parametrize(("max_tokens", "output_len", "cut"), [
    (40, "uniform:5:60", 3),  # ends by EOS or by length, whichever the draw gives
    (12, "100000", 5),  # ends by length
    (None, "20", 7),  # no limit: the continuation sends max_tokens null
    (30, "geometric:10", 1),
])
def test_resumed_answer_equals_the_unbroken_one(max_tokens: int | None, output_len: str,
                                                cut: int) -> None:
    whole = chat(max_tokens, output_len=output_len)
    choice = whole["choices"][0]
    ids, prompt = choice["token_ids"], whole["prompt_token_ids"]
    if len(ids) <= cut:
        pytest.skip("the drawn answer is shorter than the cut")
    left = None if max_tokens is None else max_tokens - cut
    events = resume(prompt + ids[:cut], left, output_len=output_len)
    chunks = [e["choices"][0] for e in events if e["choices"]]
    rest = [i for c in chunks for i in c["token_ids"]]
    assert ids[:cut] + rest == ids
    assert "".join(c["text"] for c in chunks) == "".join(OUTPUT_TEXTS[i] for i in rest)
    assert chunks[-1]["finish_reason"] == choice["finish_reason"]
    assert chunks[0]["prompt_token_ids"] == prompt + ids[:cut]
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == len(rest)
    assert usage["prompt_tokens"] == len(prompt) + cut


def test_seeded_length_is_a_function_of_prompt_and_seed() -> None:
    first = chat(100, output_len="uniform:1:90")["choices"][0]["token_ids"]
    for _ in range(3):
        assert chat(100, output_len="uniform:1:90")["choices"][0]["token_ids"] == first


def test_a_plain_token_prompt_is_not_a_continuation() -> None:
    events = resume([1, 100, 200, 300], 8, output_len="100000")
    assert sum(len(e["choices"][0]["token_ids"]) for e in events if e["choices"]) == 8


def test_close_mid_stream_ends_the_body_without_done() -> None:
    async def go() -> Any:
        h = Harness(output_len="100000")
        try:
            r, _ = await h.request("POST", "/v1/chat/completions", {
                "model": "tiny", "stream": True, "max_tokens": 20, "return_token_ids": True,
                "messages": [{"role": "user", "content": "hi [[fault:close_mid_stream:4]]"}]})
            return r
        finally:
            h.close()

    r = run_async(go())
    events = event_json(r.events)
    assert r.complete and "[DONE]" not in events
    assert sum(len(e["choices"][0].get("token_ids") or []) for e in events) == 4
