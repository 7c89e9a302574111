"""Predictive admission: refuse a request whose projected TTFT exceeds the budget (SPEC §4).

The budget is the model's own ``models[].ttft_budget_s`` when set (an adapter takes its base
model's), else ``admission.ttft_budget_s``; the projection counts the engines serving the
model and the requests queued for it.

Projected TTFT on an engine = the expected admission wait + this prompt's prefill there,
counting only the tokens its prefix cache probably lacks (as placement projects it).
The expected wait counts the prefill work already placed on the engine (in flight and
queued on it, from the learned model) and the requests waiting in the router's admission
queue ahead of this one, spread over the engines as they free up; in a cluster, the other
instances' placed work and queued requests as they last published them count too. The
projection is the best engine's. A prompt that alone (on the fastest idle engine) exceeds
the budget gets the non-retryable 429 ``prompt_exceeds_ttft_budget``; otherwise a
projection over budget gets 429 ``ttft_budget_exceeded`` with Retry-After = the overrun,
rounded half up, >= 1 s. ``open`` mode never refuses here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from narwhal.config import Admission
from narwhal.errors import Refusal
from narwhal.errors.table import retry_after_for_overrun
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.learning.occupancy import Demand, water_level
from narwhal.request.models import Served
from narwhal.request.parse import Parsed
from narwhal.scheduling.placement import Scheduler


@dataclass(frozen=True, slots=True)
class Projection:
    """The best engine's projection for one request."""

    engine: Engine
    wait_s: float  # expected admission wait: placed and queued prefill work ahead
    prefill_s: float  # this prompt's prefill on that engine
    alone_s: float  # this prompt's prefill on the fastest eligible engine, idle

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.prefill_s


class NearBudget(Exception):
    """The projection lies within the prompt size's error band of the budget."""


class PredictiveAdmission:
    """Projects each request's TTFT and refuses over ``admission.ttft_budget_s``."""

    def __init__(self, config: Admission, learning: Learning, scheduler: Scheduler) -> None:
        self.predictive = config.mode == "predictive"
        self.budget_s = config.ttft_budget_s
        self.learning = learning
        self.scheduler = scheduler

    def admit(self, parsed: Parsed, prompt_tokens: int, band: float = 0.0,
              session: str | None = None) -> Demand:
        """The request's demand; raises Refusal when predictive admission refuses it, and
        NearBudget when ``band`` (the relative error of ``prompt_tokens``) could change the
        decision, so the caller may size the prompt exactly and ask again."""
        demand = self.scheduler.demand(parsed, prompt_tokens, session)
        if self.predictive:
            self.check(demand, band)
        return demand

    def check(self, demand: Demand, band: float = 0.0) -> None:
        projection = self.project(demand)
        if projection is None:
            return  # nothing eligible: placement answers backend_unavailable
        served = demand.served
        budget = self.budget_s if served is None or served.budget_s is None else served.budget_s
        if band and (abs(projection.alone_s - budget) <= band * projection.alone_s
                     or abs(projection.ttft_s - budget) <= band * projection.prefill_s):
            raise NearBudget
        if projection.alone_s > budget:
            raise Refusal(
                "prompt_exceeds_ttft_budget",
                f"The prompt alone ({demand.prompt_tokens} tokens) needs about "
                f"{projection.alone_s:.2f} s of prefill, over the time-to-first-token budget "
                f"of {budget:g} s, so retrying cannot help: shorten the prompt or raise the "
                f"target ({_budget_key(served)}).",
            )
        total = projection.ttft_s
        if total > budget:
            retry_after = retry_after_for_overrun(total - budget)
            raise Refusal(
                "ttft_budget_exceeded",
                f"The projected time to first token ({total:.2f} s) exceeds the budget of "
                f"{budget:g} s; retry after {retry_after} s.",
                retry_after=retry_after,
            )

    def project(self, demand: Demand, now: float | None = None) -> Projection | None:
        """The lowest projected TTFT over eligible engines, or None when none is eligible."""
        engines = demand.eligible
        if engines is None:
            engines = self.scheduler.eligible(demand.served)
        if not engines:
            return None
        learning = self.learning
        now = time.monotonic() if now is None else now
        pending = learning.pending_for(demand.served)
        queued, tokens = pending.count, pending.tokens
        peers = self.scheduler.peers
        if peers is not None:  # the other instances' queued requests and placed work count
            served = demand.served
            theirs = peers.pending("" if pending is learning.pending or served is None
                                   else served.name)
            queued, tokens = queued + theirs[0], tokens + theirs[1]
        mean_queued = tokens / queued if queued > 0 else 0.0
        waits = []
        for engine in engines:
            model = learning.prefill_model(engine)
            per_request = model.overhead_s + mean_queued / model.tokens_per_s
            wait = learning.prefill_wait(engine, now)
            if peers is not None:
                wait += peers.prefill_wait(engine.index, now)
            waits.append((wait, 1.0 / per_request if per_request > 0 else 0.0))
        level = water_level(waits, queued)
        # Only the tokens each engine's prefix cache lacks (the placement's projection).
        owns = [learning.prefill_model(e).seconds(learning.uncached_tokens(e, demand))
                for e in engines]
        best, best_wait, best_ttft = 0, 0.0, math.inf
        for index, ((wait, _), own) in enumerate(zip(waits, owns, strict=True)):
            wait = wait if wait > level else level
            if wait + own < best_ttft:  # the first of equals wins
                best, best_wait, best_ttft = index, wait, wait + own
        return Projection(engines[best], best_wait, owns[best], min(owns))


def _budget_key(served: Served | None) -> str:
    if served is None or served.base.budget_s is None:
        return "admission.ttft_budget_s"
    return f"the ttft_budget_s of model {served.base.name}"
