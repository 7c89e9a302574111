"""Placement: eligibility, the named policies, and prefix affinity that never overrides load."""

from __future__ import annotations

from collections import Counter

import pytest
from fleet_helpers import healthy_engines

from narwhal._narwhal_fast import Board
from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.learning.occupancy import Demand
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Placement, Scheduler
from narwhal.scheduling.policies import POLICIES, Candidate, make_policy, prefix_key

MODEL = "m"


def fleet(n: int, *, weights: tuple[float, ...] = ()) -> list[Engine]:
    return healthy_engines(EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9000 + i}",
                                        weight=weights[i] if weights else 1.0)
                           for i in range(n))


def scheduler(engines: list[Engine], policy: str = "lowest_ttft", *, predictive: bool = True,
              rates: tuple[float, ...] = ()) -> Scheduler:
    learning = Learning(engines)
    for i, learned in enumerate(learning.learned.values()):
        learned.prefill = PrefillModel(0.005, rates[i] if rates else 10_000.0)
    return Scheduler(engines, Board(engines=len(engines)), learning, policy=policy,
                     predictive=predictive)


def test_policies_are_chosen_by_name() -> None:
    assert set(POLICIES) == {"lowest_ttft", "prefix_affinity", "least_loaded"}
    assert make_policy("prefix_affinity").needs_prefix
    with pytest.raises(ValueError, match="unknown placement policy"):
        make_policy("random")


def test_unprofiled_engines_are_not_eligible_in_predictive_mode() -> None:
    engines = fleet(2)
    sched = scheduler(engines)
    sched.learning.learned[1].prefill = None
    assert sched.eligible() == [engines[0]]
    assert scheduler(engines, predictive=False).eligible() == engines
    engines[0].draining = True
    assert sched.eligible() == []


def test_lowest_projected_ttft_wins() -> None:
    engines = fleet(2)
    sched = scheduler(engines)
    first = sched.try_place(demand=Demand(5000))  # 0.5 s of prefill placed on one engine
    assert first is not None
    second = sched.try_place(demand=Demand(100))
    assert second is not None and second.engine is not first.engine


def test_a_faster_engine_takes_long_prompts_until_its_queue_evens_out() -> None:
    engines = fleet(2)
    sched = scheduler(engines, rates=(40_000.0, 10_000.0))
    placed = [sched.try_place(demand=Demand(4000)) for _ in range(5)]
    assert all(p is not None for p in placed)
    names = Counter(p.engine.name for p in placed if p is not None)
    # e0 does a 4000-token prompt in 0.105 s, e1 in 0.405 s: e0 takes four, e1 one
    assert names == {"e0": 4, "e1": 1}


def test_ties_go_to_the_lower_decode_load_per_weight() -> None:
    engines = fleet(2)
    sched = scheduler(engines)
    placement = sched.try_place(demand=Demand(10, max_tokens=1000))
    assert placement is not None
    sched.learning.on_first_token(placement.track, 0.0)  # now decoding: ~500 tokens to come
    busy = placement.engine
    for _ in range(3):
        nxt = sched.try_place(demand=Demand(10))
        assert nxt is not None and nxt.engine is not busy
        sched.release(nxt)


def test_slots_are_respected() -> None:
    engines = fleet(1)
    engines[0].config = EngineConfig(name="e0", url="http://127.0.0.1:9000", max_prefill=2)
    sched = scheduler(engines)
    held = [sched.try_place(demand=Demand(10)) for _ in range(3)]
    assert held[2] is None and held[0] is not None
    sched.release(held[0])
    assert sched.try_place(demand=Demand(10)) is not None


def test_prefix_key_reads_the_prompt_start() -> None:
    body = b'{"model": "m", "messages": [{"role": "system", "content": "You are a narwhal."}, ' \
           b'{"role": "user", "content": "%s"}]}'
    a = parse_request("chat", body % b"hello", model="m")
    b = parse_request("chat", body % b"goodbye", model="m")
    assert prefix_key(a, 18) == prefix_key(b, 18)  # the same 18-character system prompt
    assert prefix_key(a, 200) != prefix_key(b, 200)
    ids = parse_request("completion", b'{"model": "m", "prompt": [1, 2, 3, 4, 5]}', model="m")
    assert prefix_key(ids, 8) == hash((1, 2))


def _run(sched: Scheduler, demand: Demand, *, decode_tokens: int) -> Placement:
    placement = sched.try_place(demand=demand)
    assert placement is not None
    sched.learning.on_first_token(placement.track, 0.0)
    placement.enter_decode()
    placement.track.tokens = decode_tokens
    return placement


def test_hot_prefix_returns_home_only_while_home_is_no_busier() -> None:
    """A burst of one hot prefix spreads by projected TTFT; a sequential stream of it goes
    home only while home's decode load stays within one request of the least loaded."""
    engines = fleet(3)
    sched = scheduler(engines, "prefix_affinity")
    hot = 12345
    burst = []
    for _ in range(6):
        demand = Demand(2000, "completion", 64, prefix=hot)
        placement = sched.try_place(demand=demand)
        assert placement is not None
        burst.append(placement.engine.name)
    assert Counter(burst) == {"e0": 2, "e1": 2, "e2": 2}  # each prompt is 0.2 s of prefill

    engines = fleet(3)
    sched = scheduler(engines, "prefix_affinity")
    running = []
    for _ in range(30):  # none finishes: decode load piles up wherever they go
        demand = Demand(100, "completion", 64, prefix=hot)
        demand.expected_output = sched.learning.expected_output(demand)
        running.append(_run(sched, demand, decode_tokens=0))
    counts = Counter(p.engine.name for p in running)
    assert max(counts.values()) - min(counts.values()) <= 1, counts  # fair shares


def test_prefix_affinity_prefers_home_among_equals() -> None:
    engines = fleet(3)
    sched = scheduler(engines, "prefix_affinity")
    homes = set()
    for _ in range(5):  # each finishes before the next arrives: nothing to balance
        demand = Demand(100, "completion", 64, prefix=777)
        placement = _run(sched, demand, decode_tokens=64)
        homes.add(placement.engine.name)
        sched.learning.on_end(placement.track, 1.0, completed=True)
        sched.release(placement)
    assert len(homes) == 1


def test_least_loaded_counts_requests_per_weight() -> None:
    engines = fleet(2, weights=(2.0, 1.0))
    sched = scheduler(engines, "least_loaded")
    placed = Counter()
    for _ in range(6):
        p = sched.try_place(demand=Demand(10))
        assert p is not None
        placed[p.engine.name] += 1
    assert placed == {"e0": 4, "e1": 2}


def test_candidate_order_of_lowest_ttft_is_band_then_decode_load() -> None:
    engines = fleet(3)
    policy = make_policy("lowest_ttft")
    cands = [Candidate(engines[0], 0.100, 50.0, 0, 0), Candidate(engines[1], 0.101, 10.0, 0, 0),
             Candidate(engines[2], 0.300, 0.0, 0, 0)]
    ordered = [c.engine.name for c in policy.order(cands, Demand(0))]
    assert ordered == ["e1", "e0", "e2"]  # e0/e1 tie within 2%: less decode work first
