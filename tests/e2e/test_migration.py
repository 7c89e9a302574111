"""Migration end to end: a stream that breaks after its headers (reset, closed without
[DONE], the engine's error event, a stall, the engine process killed) goes on on the other
engine, and the client, with the ``openai`` SDK, gets one uninterrupted answer equal token
for token to what an unbroken engine answers for the same seed; unsafe requests end as
before. Counters settle, gauges return to zero, the invariant holds."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fleet_support import Counters, wait_for
from procs import (
    MODEL,
    Proc,
    http,
    invariant_holds,
    metrics,
    router_config,
    start_router,
    start_sim,
)
from test_faults_engine import GAUGES, HEALTH  # breaker and eviction out of the way

pytestmark = pytest.mark.timeout(120)

COMPLETED = "narwhal_completed_total"
SEED = 11
MAX_TOKENS = 40


def migrations(reason: str) -> str:
    return f'narwhal_migrations_total{{reason="{reason}"}}'


def start_fleet(tmp: Path, sims: list[Proc], *extra: str, token_timeout_s: float = 30.0,
                **sections: Any) -> Proc:
    engines = [{"name": f"e{i}", "url": s.url, "dialect": "vllm",
                "token_timeout_s": token_timeout_s} for i, s in enumerate(sims)]
    sections.setdefault("admission", {"mode": "open"})
    return start_router(tmp, router_config([], engines=engines, health=HEALTH, **sections),
                        *extra)


def sims(n: int = 2, tpot_ms: str = "2") -> list[Proc]:
    # --output-len fixed by the seed: an answer ends by EOS before max_tokens some of the time
    return [start_sim("--tpot-ms", tpot_ms, "--output-len", "uniform:20:60") for _ in range(n)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Proc], Proc]]:
    engines = sims()
    router = start_fleet(tmp_path_factory.mktemp("migration"), engines, token_timeout_s=1.0)
    try:
        yield engines, router
    finally:
        router.stop()
        for s in engines:
            s.stop()


def body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": MAX_TOKENS, "seed": SEED, **extra}


def unbroken(sim: Proc, request: dict[str, Any]) -> dict[str, Any]:
    """What an engine answers without the fault (the header's fault wins over the marker)."""
    status, _, raw = http(sim.url, "POST", "/v1/chat/completions",
                          {**request, "stream": False, "return_token_ids": True},
                          headers={"x-sim-fault": "slow_headers:0"})
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    return {"content": choice["message"]["content"], "ids": choice["token_ids"],
            "finish": choice["finish_reason"], "prompt": json.loads(raw)["usage"]["prompt_tokens"]}


def client(router: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0, timeout=30)


def ask(router: Proc, request: dict[str, Any], *, stream: bool,
        ids: bool) -> dict[str, Any]:
    """The answer through the router with the SDK: content, token IDs (when asked), finish,
    usage, the chunks' ids."""
    extra = {"return_token_ids": True} if ids else {}
    kwargs = {k: v for k, v in request.items() if k not in ("model", "messages")}
    c = client(router)
    if not stream:
        r = c.chat.completions.create(model=MODEL, messages=request["messages"],
                                      extra_body=extra, **kwargs)
        choice = r.choices[0]
        return {"content": choice.message.content, "ids": getattr(choice, "token_ids", None),
                "finish": choice.finish_reason, "usage": r.usage, "chunk_ids": {r.id},
                "prompt_ids": getattr(r, "prompt_token_ids", None)}
    chunks = list(c.chat.completions.create(
        model=MODEL, messages=request["messages"], stream=True,
        stream_options={"include_usage": True}, extra_body=extra, **kwargs))
    content, token_ids, finish = "", [], None
    for ch in chunks:
        for choice in ch.choices:
            assert choice.index == 0
            content += choice.delta.content or ""
            token_ids += getattr(choice, "token_ids", None) or []
            finish = choice.finish_reason or finish
    return {"content": content, "ids": token_ids if ids else None, "finish": finish,
            "usage": chunks[-1].usage, "chunk_ids": {ch.id for ch in chunks},
            "created": {ch.created for ch in chunks}, "models": {ch.model for ch in chunks},
            "prompt_ids": getattr(chunks[0], "prompt_token_ids", None)}


def settle(router: Proc, counters: Counters) -> dict[str, float]:
    def idle() -> dict[str, float] | None:
        m = metrics(router.url)
        return m if not any(v for k, v in m.items() if k.startswith(GAUGES)) else None

    m = wait_for(idle, 10)
    assert invariant_holds(m), m
    return counters.settled()


def check_same_answer(got: dict[str, Any], want: dict[str, Any], ids: bool) -> None:
    assert got["content"] == want["content"]
    assert got["finish"] == want["finish"]
    assert len(got["chunk_ids"]) == 1  # one answer: the same id throughout
    if ids:
        assert got["ids"] == want["ids"]
    else:
        assert got["ids"] is None and got["prompt_ids"] is None
    usage = got["usage"]
    assert usage.prompt_tokens == want["prompt"]  # the prompt counted once
    assert usage.completion_tokens == len(want["ids"])  # every engine's tokens summed


@pytest.mark.parametrize("fault", ["reset_mid_stream:6", "close_mid_stream:6",
                                   "error_event:6", "hang_mid_stream:6"])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("ids", [True, False])
def test_broken_stream_goes_on_on_the_other_engine(fleet: tuple[list[Proc], Proc], fault: str,
                                                   stream: bool, ids: bool) -> None:
    engines, router = fleet
    request = body(f"tell me about narwhals [[fault:{fault}]] {stream} {ids}")
    want = unbroken(engines[0], request)
    assert len(want["ids"]) > 6
    counters = Counters(router.url)
    got = ask(router, request, stream=stream, ids=ids)
    check_same_answer(got, want, ids)
    if stream:
        assert len(got["created"]) == 1 and got["models"] == {MODEL}
    delta = settle(router, counters)
    reason = {"reset_mid_stream": "reset", "close_mid_stream": "closed",
              "error_event": "engine_error_event", "hang_mid_stream": "stalled"}[
        fault.split(":")[0]]
    assert delta.get(COMPLETED) == 1.0, delta
    assert delta.get(migrations(reason)) == 1.0, delta
    assert not any(k.startswith("narwhal_failed") for k in delta), delta
    # the broken engine was judged: one failed attempt on one engine
    failures = {k: v for k, v in delta.items()
                if k.startswith("narwhal_engine_attempt_failures_total")}
    assert sum(failures.values()) == 1.0, delta


@pytest.mark.parametrize(("content", "extra"), [
    ("[[fault:reset_mid_stream:6]] stop strings", {"stop": ["zzzz"]}),  # could span the break
    ("[[fault:reset_mid_stream:4]] [[sim:reasoning]]", {}),  # breaks inside reasoning
    ("[[fault:reset_mid_stream:6]] logprobs", {"logprobs": True}),
])
def test_unsafe_requests_end_as_before(fleet: tuple[list[Proc], Proc], content: str,
                                       extra: dict[str, Any]) -> None:
    _, router = fleet
    counters = Counters(router.url)
    status, _, raw = http(router.url, "POST", "/v1/chat/completions",
                          {**body(content), "stream": True, **extra})
    assert status == 200
    text = raw.decode()
    assert '"code": 502' in text and text.endswith("data: [DONE]\n\n")
    delta = settle(router, counters)
    assert delta.get('narwhal_failed_total{reason="engine_error"}') == 1.0, delta
    assert not any(k.startswith("narwhal_migrations") for k in delta), delta


def test_migrate_false_ends_as_before(tmp_path: Path) -> None:
    engines = sims()
    router = start_router(tmp_path, router_config(
        [], engines=[{"name": f"e{i}", "url": s.url, "dialect": "vllm", "migrate": False}
                     for i, s in enumerate(engines)],
        health=HEALTH, admission={"mode": "open"}))
    try:
        counters = Counters(router.url)
        status, _, raw = http(router.url, "POST", "/v1/chat/completions",
                              {**body("[[fault:reset_mid_stream:5]]"), "stream": True})
        assert status == 200 and b'"code": 502' in raw
        delta = settle(router, counters)
        assert delta.get('narwhal_failed_total{reason="engine_error"}') == 1.0, delta
    finally:
        router.stop()
        for s in engines:
            s.stop()


def busy_engine(router: Proc) -> int:
    """The index of the engine decoding the one request in flight."""
    def which() -> int | None:
        m = metrics(router.url)
        for i in (0, 1):
            if m.get(f'narwhal_engine_inflight{{engine="e{i}",phase="decode"}}'):
                return i
        return None

    found: int = wait_for(which, 10)
    return found


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("ids", [True, False])
def test_engine_killed_mid_stream(tmp_path: Path, stream: bool, ids: bool) -> None:
    engines = sims(tpot_ms="50")  # 20 to 40 tokens: 1 s or more, still under way at the kill
    router = start_fleet(tmp_path, engines)
    try:
        request = body("a story about a router that never drops a token")
        counters = Counters(router.url)
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["got"] = ask(router, request, stream=stream, ids=ids)
            except Exception as exc:  # reported by the main thread
                result["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        victim = busy_engine(router)
        time.sleep(0.15)  # a few tokens in (not asserted on: any point of the answer will do)
        engines[victim].proc.send_signal(signal.SIGKILL)
        engines[victim].proc.wait(5)
        t.join(60)
        assert "error" not in result, result.get("error")
        want = unbroken(engines[1 - victim], request)
        check_same_answer(result["got"], want, ids)
        delta = settle(router, counters)
        assert delta.get(COMPLETED) == 1.0, delta
        broke = delta.get(migrations("reset"), 0) + delta.get(migrations("closed"), 0)
        assert broke == 1.0, delta
    finally:
        router.stop()
        for s in engines:
            s.stop()


def test_two_workers(tmp_path: Path) -> None:
    engines = sims()
    router = start_fleet(tmp_path, engines, "--workers", "2")
    try:
        counters = Counters(router.url)
        for n, (stream, ids) in enumerate([(True, True), (False, False), (True, False),
                                           (False, True)]):
            request = body(f"two workers {n} [[fault:reset_mid_stream:5]]")
            want = unbroken(engines[0], request)
            check_same_answer(ask(router, request, stream=stream, ids=ids), want, ids)
        delta = settle(router, counters)
        assert delta.get(COMPLETED) == 4.0, delta
        assert not any(k.startswith("narwhal_failed") for k in delta), delta
    finally:
        router.stop()
        for s in engines:
            s.stop()
