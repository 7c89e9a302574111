"""Predictive admission's arithmetic: projected TTFT, the two refusals, Retry-After."""

from __future__ import annotations

import pytest
from fleet_helpers import healthy_engines

from narwhal._narwhal_fast import Board
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.config import Admission, EngineConfig
from narwhal.errors import Refusal
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.learning.occupancy import Demand
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler
from narwhal.server.responses import refusal_response

RATE, OVERHEAD = 1000.0, 0.01  # 1000 tokens of prompt: 1.01 s of prefill


def admission(n: int = 1, *, mode: str = "predictive", budget: float = 2.0,
              ) -> PredictiveAdmission:
    engines = healthy_engines(EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9100 + i}")
                              for i in range(n))
    learning = Learning(engines)
    for learned in learning.learned.values():
        learned.prefill = PrefillModel(OVERHEAD, RATE)
    sched = Scheduler(engines, Board(engines=n), learning, predictive=mode == "predictive")
    config = Admission(mode=mode, ttft_budget_s=budget)  # type: ignore[arg-type]
    return PredictiveAdmission(config, learning, sched)


def parsed(tokens: int) -> object:
    body = b'{"model": "m", "prompt": [%s], "max_tokens": 4}' % b",".join([b"7"] * tokens)
    return parse_request("completion", body, model="m")


def refusal(adm: PredictiveAdmission, tokens: int) -> Refusal | None:
    try:
        adm.admit(parsed(tokens), tokens)  # type: ignore[arg-type]
    except Refusal as ref:
        return ref
    return None


def test_idle_fleet_projects_the_prompt_alone() -> None:
    adm = admission()
    projection = adm.project(Demand(500))
    assert projection is not None
    assert projection.wait_s == 0.0
    assert projection.ttft_s == pytest.approx(0.51)
    assert refusal(adm, 500) is None


def test_prompt_alone_over_budget_is_not_retryable() -> None:
    adm = admission()
    ref = refusal(adm, 2500)  # 2.51 s alone > 2.0 s
    assert ref is not None and ref.code == "prompt_exceeds_ttft_budget"
    assert ref.retry_after is None and ref.row.counter == "refused"
    assert "shorten the prompt or raise the target" in ref.message
    status, headers, _ = refusal_response(ref)
    assert status == 429 and not any(k.lower() == b"retry-after" for k, _ in headers)


@pytest.mark.parametrize(("placed", "tokens", "retry_after"), [
    (1900, 1900, 2),   # 1.91 + 1.91 = 3.82 s: over by 1.82 s
    (1500, 1000, 1),   # 1.51 + 1.01 = 2.52 s: over by 0.52 s (half up, and at least 1)
    (1000, 200, 1),    # 1.01 + 0.21 = 1.22 s: over by... nothing: no refusal (None below)
    (3000, 1000, 2),   # 3.01 + 1.01 = 4.02 s: over by 2.02 s
    (3600, 1000, 3),   # 3.61 + 1.01 = 4.62 s: over by 2.62 s, rounded (far from the half)
])
def test_total_over_budget_carries_the_overrun(placed: int, tokens: int,
                                               retry_after: int) -> None:
    adm = admission()
    adm.scheduler.try_place(demand=Demand(placed))
    ref = refusal(adm, tokens)
    if placed + tokens < 1800:
        assert ref is None
        return
    assert ref is not None and ref.code == "ttft_budget_exceeded" and ref.row.counter == "refused"
    assert ref.retry_after == retry_after
    status, headers, _ = refusal_response(ref)
    assert status == 429
    assert (b"Retry-After", str(retry_after).encode()) in headers


def test_queued_requests_ahead_count_in_the_wait() -> None:
    adm = admission(2)
    learning = adm.learning
    # both engines busy for 1.01 s, and four more 1000-token requests waiting in the queue
    placed = [adm.scheduler.try_place(demand=Demand(1000)) for _ in range(2)]
    # Projected at the later placement's instant. The earlier engine frees up sooner by
    # the wall time between the two placements, so each engine's wait is derived from its
    # own placement's instant: the clock between them cannot move the expectation.
    instants = [p.track.placed_at for p in placed if p is not None]
    assert len(instants) == 2
    now = max(instants)
    waits = [1.01 - (now - at) for at in instants]
    waiting = [Demand(1000, book=learning.pending) for _ in range(4)]
    for demand in waiting:
        demand.__enter__()
    projection = adm.project(Demand(100), now)
    assert projection is not None
    # the queue drains two at a time, 1.01 s each: the level L with
    # (L - w0) / 1.01 + (L - w1) / 1.01 = 4, i.e. 2 x 1.01 s queued after the mean wait
    assert projection.wait_s == pytest.approx(2 * 1.01 + sum(waits) / 2, rel=1e-6)
    for demand in waiting:
        demand.__exit__()
    # nothing queued: the engine that frees up first
    assert adm.project(Demand(100), now).wait_s == pytest.approx(min(waits), rel=1e-6)  # type: ignore[union-attr]


def test_best_engine_is_projected() -> None:
    adm = admission(2)
    adm.scheduler.try_place(demand=Demand(1900))
    projection = adm.project(Demand(1900))
    assert projection is not None and projection.wait_s == 0.0  # the idle engine
    assert refusal(adm, 1900) is None


def test_open_mode_never_refuses_predictively() -> None:
    adm = admission(mode="open")
    for _ in range(5):
        adm.scheduler.try_place(demand=Demand(1900))
    assert refusal(adm, 1900) is None
    assert refusal(adm, 50_000) is None


def test_no_eligible_engine_leaves_the_answer_to_placement() -> None:
    adm = admission()
    adm.learning.learned[0].prefill = None  # not profiled yet
    assert adm.project(Demand(100)) is None
    assert refusal(adm, 100_000) is None
