"""Placement: which engine runs a request, holding a prefill slot on it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from narwhal._narwhal_fast import Board, Slot
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.learning.occupancy import Demand, Track
from narwhal.request.parse import Parsed
from narwhal.scheduling import disagg
from narwhal.scheduling.disagg import Split
from narwhal.scheduling.policies import Candidate, Policy, make_policy, prefix_key

DEFAULT_POLICY = "lowest_ttft"
DEFAULT_PREFIX_CHARS = 256


@dataclass(slots=True)
class Placement:
    engine: Engine
    prefill: Slot
    track: Track  # the learned model's record of this attempt (projected load, timing)
    split: Split | None = None  # disaggregated: the decode engine and its reserved slot


class Scheduler:
    """Places requests on placement-eligible engines by a named policy.

    Eligible: healthy, not draining, not in maintenance, a role that can run the whole
    request, and, in predictive admission, profiled (the model can project its TTFT).
    Among those with a free prefill slot (and decode capacity to come) the policy orders
    the candidates (default ``lowest_ttft``); ties rotate. Slot limits are enforced by the
    shared board, so they hold across worker processes.
    """

    def __init__(
        self,
        engines: Sequence[Engine],
        board: Board,
        learning: Learning | None = None,
        *,
        policy: str = DEFAULT_POLICY,
        predictive: bool = False,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ):
        self.engines = engines
        self.board = board
        self.learning = learning if learning is not None else Learning(engines)
        self.policy: Policy = make_policy(policy)
        self.predictive = predictive
        self.prefix_chars = prefix_chars
        self._turn = 0
        # Per-worker view of in-flight work, for ranking only (limits live in the board).
        self.prefill_local = [0] * len(engines)
        self.decode_local = [0] * len(engines)

    def eligible(self) -> list[Engine]:
        learning, predictive = self.learning, self.predictive
        return [e for e in disagg.usable(self.engines)
                if not predictive or learning.profiled(e)]

    def demand(self, parsed: Parsed, prompt_tokens: int) -> Demand:
        """What ``parsed`` asks of the fleet (held pending while it waits for placement)."""
        prefix = prefix_key(parsed, self.prefix_chars) if self.policy.needs_prefix else None
        demand = Demand(prompt_tokens, parsed.route, parsed.max_tokens, prefix,
                        self.learning.pending)
        demand.expected_output = self.learning.expected_output(demand)
        return demand

    def candidate(self, engine: Engine, demand: Demand, now: float) -> Candidate:
        learning = self.learning
        ttft = (learning.prefill_wait(engine, now)
                + learning.prefill_model(engine).seconds(demand.prompt_tokens))
        return Candidate(engine, ttft, learning.decode_load(engine, now) / engine.config.weight,
                         self.prefill_local[engine.index], self.decode_local[engine.index])

    def try_place(self, exclude: Engine | None = None,
                  demand: Demand | None = None) -> Placement | None:
        """Place ``demand`` (default: the oldest request waiting in the admission queue)."""
        engines = [e for e in self.eligible() if e is not exclude
                   and (e.config.role == "prefill"  # its decode slot: see disagg.choose
                        or self.prefill_local[e.index] + self.decode_local[e.index]
                        < e.config.max_decode)]  # a decode slot to come on this engine
        if not engines:
            return None
        if demand is None:
            demand = self.learning.pending.head() or Demand(0)
        self._turn = (self._turn + 1) % len(engines)
        rotated = engines[self._turn :] + engines[: self._turn]
        now = time.monotonic()
        candidates = [self.candidate(e, demand, now) for e in rotated]
        return disagg.choose(self, candidates, demand)

    def enter_decode(self, engine: Engine) -> Slot | None:
        """Move one request of ``engine`` from prefill to decode (its decode slot was reserved
        at placement, so the limit here also admits the prefill work that reserved it)."""
        self.prefill_local[engine.index] -= 1
        self.decode_local[engine.index] += 1
        cfg = engine.config
        return self.board.acquire_slot(engine.index, "decode", cfg.max_decode + cfg.max_prefill)

    def leave(self, engine: Engine, phase: str) -> None:
        if phase == "prefill":
            self.prefill_local[engine.index] -= 1
        else:
            self.decode_local[engine.index] -= 1
