"""Disaggregated placement and the prefill leg's body (no network)."""

from __future__ import annotations

import orjson
from fleet_helpers import healthy_engines

from narwhal._narwhal_fast import Board
from narwhal.config import EngineConfig
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.learning.occupancy import Demand
from narwhal.request.engine_body import REMOTE_DECODE, engine_request, prefill_body
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler

MODEL = "m"


def fleet(*roles: str) -> list[Engine]:
    return healthy_engines(EngineConfig(name=f"{role[0]}{i}", url=f"http://127.0.0.1:{9000 + i}",
                                        role=role, max_decode=4)
                           for i, role in enumerate(roles))


def scheduler(engines: list[Engine], *, predictive: bool = False,
              rates: dict[int, float] | None = None, policy: str = "lowest_ttft") -> Scheduler:
    learning = Learning(engines)
    for i, rate in (rates or {}).items():
        learning.learned[i].prefill = PrefillModel(0.005, rate)
    return Scheduler(engines, Board(engines=len(engines)), learning, policy=policy,
                     predictive=predictive)


def test_eligible_takes_prefill_engines_only_with_a_decode_engine() -> None:
    engines = fleet("mixed", "prefill", "decode")
    sched = scheduler(engines)
    assert sched.eligible() == engines[:2]  # decode engines are partners, not placements
    engines[2].draining = True
    assert sched.eligible() == engines[:1]
    # Predictive: prefill engines need a profile; decode engines are never profiled.
    engines[2].draining = False
    assert scheduler(engines, predictive=True, rates={0: 1e4}).eligible() == engines[:1]
    assert scheduler(engines, predictive=True, rates={0: 1e4, 1: 1e4}).eligible() == engines[:2]


def test_split_placement_holds_a_prefill_and_a_reserved_decode_slot() -> None:
    engines = fleet("prefill", "decode", "decode")
    sched = scheduler(engines)
    placed = sched.try_place(demand=Demand(100))
    assert placed is not None and placed.split is not None
    assert placed.engine is engines[0] and placed.split.engine is engines[1]
    snap = sched.board.snapshot()["engines"]
    assert snap[0]["prefill"] == 1 and snap[1]["decode"] == 1
    # The next split goes to the other decode engine (least decode work).
    second = sched.try_place(demand=Demand(100))
    assert second is not None and second.split is not None
    assert second.split.engine is engines[2]
    for p in (placed, second):
        assert sched.release(p)
        assert not sched.release(p)  # idempotent
    snap = sched.board.snapshot()["engines"]
    assert all(row["prefill"] == 0 and row["decode"] == 0 for row in snap)
    assert all(sched.board.inflight(i) == (0, 0) for i in range(3))


def test_mixed_or_split_by_projected_ttft() -> None:
    engines = fleet("mixed", "prefill", "decode")
    # The prefill engine is four times faster: long prompts split.
    sched = scheduler(engines, rates={0: 10_000.0, 1: 40_000.0})
    placed = sched.try_place(demand=Demand(4000))
    assert placed is not None and placed.split is not None and placed.engine is engines[1]
    # 0.105 s per prompt there against 0.405 s on the mixed engine: after three, its queue
    # makes the split slower than the mixed engine's whole prefill, and the mixed engine wins.
    for _ in range(2):
        more = sched.try_place(demand=Demand(4000))
        assert more is not None and more.split is not None
    mixed = sched.try_place(demand=Demand(4000))
    assert mixed is not None and mixed.split is None and mixed.engine is engines[0]


def test_unprofiled_choice_is_least_loaded() -> None:
    engines = fleet("mixed", "prefill", "decode")
    sched = scheduler(engines, policy="least_loaded")
    first = sched.try_place(demand=Demand(10))
    second = sched.try_place(demand=Demand(10))
    assert first is not None and second is not None
    assert {first.split is None, second.split is None} == {True, False}


def test_no_decode_capacity_falls_back_to_mixed() -> None:
    engines = fleet("mixed", "prefill", "decode")
    sched = scheduler(engines, rates={0: 10_000.0, 1: 40_000.0})
    held = [sched.board.acquire_slot(2, "decode", 4) for _ in range(4)]  # no decode slot
    assert all(held)
    placed = sched.try_place(demand=Demand(4000))
    assert placed is not None and placed.split is None and placed.engine is engines[0]


def test_replace_prefill_excludes_the_failed_engine_and_keeps_the_decode_half() -> None:
    engines = fleet("prefill", "prefill", "decode")
    sched = scheduler(engines)
    placed = sched.try_place(demand=Demand(10))
    assert placed is not None and placed.split is not None
    failed = placed.engine
    other = sched.replace_prefill(placed, Demand(10))
    assert other is not None and other.engine is not failed
    assert other.split is not None and placed.split is None  # the reserved slot moved over
    sched.release(placed)
    assert sched.board.inflight(engines[2].index) == (0, 1)
    failed.draining = True
    assert sched.replace_prefill(other, Demand(10)) is None
    assert other.split is not None  # kept when no replacement was found
    sched.release(other)
    assert all(sched.board.inflight(i) == (0, 0) for i in range(3))


def test_the_decode_leg_keeps_the_reserved_slot_and_frees_the_prefill_slot() -> None:
    engines = fleet("prefill", "decode")
    sched = scheduler(engines)
    placed = sched.try_place(demand=Demand(10))
    assert placed is not None and placed.split is not None
    leg = sched.decode_leg(placed)
    assert leg.engine is engines[1] and not leg.in_prefill
    assert sched.board.inflight(0) == (0, 0) and sched.board.inflight(1) == (0, 1)
    assert sched.release(leg)
    assert sched.board.inflight(1) == (0, 0)


def test_a_mixed_engine_is_placed_only_with_a_decode_slot_to_come() -> None:
    engines = fleet("mixed")  # max_decode 4, max_prefill 256
    sched = scheduler(engines)
    held = [sched.try_place(demand=Demand(10)) for _ in range(5)]
    assert all(p is not None for p in held[:4]) and held[4] is None
    for p in held[:4]:
        assert p is not None
        p.enter_decode()
        assert p.decode is not None and p.prefill is None
    assert sched.board.inflight(0) == (0, 4)
    assert sched.try_place(demand=Demand(10)) is None
    first = held[0]
    assert first is not None
    sched.release(first)
    assert sched.try_place(demand=Demand(10)) is not None


def test_prefill_body_follows_the_nixl_proxy() -> None:
    raw = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                        "stream": True, "stream_options": {"include_usage": True},
                        "max_tokens": 50, "max_completion_tokens": 50, "min_tokens": 3,
                        "min_completion_tokens": 3, "temperature": 0.5})
    parsed = parse_request("chat", raw, model=MODEL)
    assert orjson.loads(prefill_body(parsed)) == {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
        "max_tokens": 1, "max_completion_tokens": 1, "temperature": 0.5,
        "kv_transfer_params": REMOTE_DECODE}
    # The decode leg: the client's body with the prefill reply's parameters, verbatim.
    kv = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "opaque": {"x": 1}}
    decoder = fleet("decode")[0]
    decoded = orjson.loads(engine_request(parsed, token_ids=decoder.token_ids, kv_params=kv).body)
    assert decoded["kv_transfer_params"] == kv
    assert decoded["max_tokens"] == 50 and decoded["min_tokens"] == 3
    assert decoded["stream_options"] == {"include_usage": True}
