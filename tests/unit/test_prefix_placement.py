"""Cache-aware projection: placement and predictive admission count only the tokens an
engine's prefix cache probably lacks (learning/prefix.py), and the session hint."""

from __future__ import annotations

from typing import Any

import orjson
from fleet_helpers import healthy_engines

from narwhal._narwhal_fast import Board
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.config import Admission, EngineConfig
from narwhal.errors import Refusal
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.learning.prefix import PrefixCaches, prompt_text
from narwhal.request.parse import Parsed, parse_request
from narwhal.scheduling.placement import Scheduler

RATE, OVERHEAD = 1000.0, 0.01  # 1000 prompt tokens: 1.01 s of prefill
SYSTEM = "You are a router's helpful assistant; answer in one short sentence please. " * 80


def fleet(n: int = 2, budget: float = 1.5) -> tuple[Scheduler, PredictiveAdmission]:
    engines = healthy_engines(EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9100 + i}")
                              for i in range(n))
    learning = Learning(engines)
    learning.prefix = PrefixCaches(engines)
    for learned in learning.learned.values():
        learned.prefill = PrefillModel(OVERHEAD, RATE)
    sched = Scheduler(engines, Board(engines=n), learning, predictive=True)
    config = Admission(mode="predictive", ttft_budget_s=budget)
    return sched, PredictiveAdmission(config, learning, sched)


def chat(*turns: str) -> Parsed:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user", "content": t} for t in turns]
    return parse_request("chat", orjson.dumps({"model": "m", "messages": messages}), model="m")


def tokens(parsed: Parsed) -> int:
    return len(prompt_text(parsed)) // 4


def test_admission_credits_a_cached_prefix() -> None:
    sched, adm = fleet()
    first = chat("what is a narwhal?")
    n = tokens(first)  # ~1500 tokens: 1.5 s of prefill, over the 1.5 s budget
    try:
        adm.admit(first, n)
        raise AssertionError("an uncached prompt over the budget was admitted")
    except Refusal as ref:
        assert ref.code == "prompt_exceeds_ttft_budget"
    # The same conversation placed once (budget aside) on e1: its prefix is cached there.
    track = sched.learning.place(sched.engines[1], sched.demand(first, n), None)
    sched.learning.release(track)  # ... and done
    follow = chat("what is a narwhal?", "and its tusk?")
    demand = adm.admit(follow, tokens(follow))  # admitted: most of it is cached on e1
    projection = adm.project(demand)
    assert projection is not None and projection.engine.name == "e1"
    assert projection.prefill_s < 0.2


def test_placement_prefers_the_cached_engine_until_its_queue_costs_more() -> None:
    sched, _ = fleet()
    first = chat("hello")
    placed = sched.try_place(demand=sched.demand(first, tokens(first)))
    assert placed is not None
    home = placed.engine
    again = sched.try_place(demand=sched.demand(chat("hello", "more"), tokens(first) + 3))
    assert again is not None and again.engine is home
    # Pile uncached work on the home engine: the next turn spills to the other one.
    for i in range(3):
        other = chat(f"unrelated {i} " * 400)
        sched.learning.place(home, sched.demand(other, tokens(other)), None)
    spilled = sched.try_place(demand=sched.demand(chat("hello", "again"), tokens(first) + 3))
    assert spilled is not None and spilled.engine is not home


def test_session_hint_credits_the_last_turns_engine() -> None:
    sched, _ = fleet()
    first = chat("hi")
    d = sched.demand(first, tokens(first), "conv-1")
    sched.learning.place(sched.engines[0], d, None)
    caches = sched.learning.prefix
    assert caches is not None
    caches.index.set_capacity(0, 0)  # the index forgot it (e.g. evicted)
    caches.index.set_capacity(0, 10_000)
    follow = sched.demand(chat("hi", "next"), tokens(first) + 3, "conv-1")
    assert follow.probe is not None and follow.probe.matched(0) == 0
    assert sched.learning.uncached_tokens(sched.engines[0], follow) < 20
    assert sched.learning.uncached_tokens(sched.engines[1], follow) == follow.prompt_tokens
    stranger = sched.demand(chat("hi", "next"), tokens(first) + 3, "conv-2")
    assert sched.learning.uncached_tokens(sched.engines[0], stranger) == stranger.prompt_tokens


def test_reported_cached_tokens_correct_the_index() -> None:
    sched, _ = fleet()
    caches = sched.learning.prefix
    assert caches is not None
    first = chat("hi")
    d = sched.demand(first, tokens(first))
    caches.report(0, d, d.prompt_tokens, None)  # never reported: no evidence
    assert caches.describe(sched.engines[0])["reported_hit_rate"] is None  # type: ignore[index]
    sched.learning.place(sched.engines[0], d, None)
    again = sched.demand(first, tokens(first))
    assert again.probe.matched(0) == again.probe.chunks
    capacity = caches.index.state(0)[1]  # type: ignore[index]
    caches.report(0, again, again.prompt_tokens, 0)  # the engine had evicted it all
    assert caches.index.state(0)[1] == capacity * 9 // 10  # type: ignore[index]
    caches.report(0, again, again.prompt_tokens, None)  # it reports: silence means 0
    described = caches.describe(sched.engines[0])
    assert described is not None and described["reported_hit_rate"] == 0.0
    # e1 never saw the prompt, yet reports it cached (another router placed it): it grows.
    caches.report(1, again, again.prompt_tokens, again.prompt_tokens - 1)
    assert caches.index.state(1)[1] > capacity  # type: ignore[index]


def test_a_credited_prefill_is_not_scored_for_drift() -> None:
    sched, _ = fleet()
    learning = sched.learning
    first = chat("hi")
    cold = learning.place(sched.engines[0], sched.demand(first, tokens(first)), None)
    warm = learning.place(sched.engines[0], sched.demand(first, tokens(first)), None)
    assert cold.cached_tokens == 0 and warm.cached_tokens > 0
    for track in (cold, warm):
        track.placed_at -= 10.0  # far off its prediction
        learning.on_first_token(track, 0.0)
    assert learning.learned[0].drift_ttft.samples == 1  # the cold one only
