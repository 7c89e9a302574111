"""Placement: which engine runs a request, and the slots it holds there.

Eligible engines serve the request's model (or adapter), are healthy, not draining, not in
maintenance, of a role that can take a request's prefill, and, in predictive admission,
profiled. Among those with room the policy
orders the candidates (default ``lowest_ttft``); ties rotate. Slot limits live in the shared
board, so they hold across worker processes; so do the in-flight counts policies rank by.

Disaggregated fleets (``role: prefill`` / ``role: decode``): a request runs on a mixed engine
or splits into a prefill leg on a prefill engine and a decode leg on a decode engine whose
decode slot is reserved at placement. The better of the two is chosen by projected TTFT when
the learned model can project it (the KV transfer is not modelled), else by requests in
prefill per unit of weight. The decode engine of a pair is the least loaded one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from narwhal._narwhal_fast import Board
from narwhal.cluster.peers import PeerLoad
from narwhal.cluster.quota import EngineLimits
from narwhal.fleet.engine import Engine
from narwhal.learning import Learning
from narwhal.learning.occupancy import Demand
from narwhal.request.models import Served
from narwhal.request.parse import Parsed
from narwhal.scheduling.disagg import usable
from narwhal.scheduling.holds import Placement, Split
from narwhal.scheduling.policies import Candidate, Policy, make_policy, prefix_key

DEFAULT_POLICY = "lowest_ttft"
DEFAULT_PREFIX_CHARS = 256

__all__ = ["DEFAULT_POLICY", "Placement", "Scheduler", "Split"]


class Scheduler:
    """Places requests on placement-eligible engines by a named policy."""

    def __init__(
        self,
        engines: Sequence[Engine],
        board: Board,
        learning: Learning | None = None,
        *,
        policy: str = DEFAULT_POLICY,
        predictive: bool = False,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
        limits: EngineLimits | None = None,
        peers: PeerLoad | None = None,
    ):
        """``limits``: with a cluster, this instance's quota of each engine limit (None: the
        configured limits); ``peers``: the other instances' published load, counted with
        this instance's own in the projections."""
        self.engines = engines
        self.board = board
        self.learning = learning if learning is not None else Learning(engines)
        self.policy: Policy = make_policy(policy)
        self.predictive = predictive
        self.prefix_chars = prefix_chars
        self.limits = limits
        self.peers = peers
        self._turn = 0

    # -- what admission asks -----------------------------------------------------------------
    def eligible(self, served: Served | None = None) -> list[Engine]:
        """Placement-eligible engines; with ``served``, those serving that model or adapter."""
        learning, predictive = self.learning, self.predictive
        return [e for e in usable(self.engines, served)
                if not predictive or learning.profiled(e)]

    def demand(self, parsed: Parsed, prompt_tokens: int, session: str | None = None) -> Demand:
        """What ``parsed`` asks of the fleet (held pending while it waits for placement);
        ``session``: the client's session id (the affinity hint of the prefix index)."""
        prefix = prefix_key(parsed, self.prefix_chars) if self.policy.needs_prefix else None
        served = parsed.served
        demand = Demand(prompt_tokens, parsed.route, parsed.max_tokens, prefix,
                        self.learning.pending_for(served), served)
        demand.expected_output = self.learning.expected_output(demand)
        demand.eligible = self.eligible(served)  # admission and placement reuse it at once
        caches = self.learning.prefix
        if caches is not None and self.policy.cache_aware:
            caches.probe(demand, parsed, session)
        return demand

    def candidate(self, engine: Engine, demand: Demand, now: float,
                  inflight: tuple[int, int] | None = None) -> Candidate:
        learning = self.learning
        prefill, decode = self.board.inflight(engine.index) if inflight is None else inflight
        peers = self.peers
        wait = learning.prefill_wait(engine, now)
        if peers is not None:  # the other instances' load on the engine, as last published
            wait += peers.prefill_wait(engine.index, now)
            theirs = peers.inflight(engine.index)
            prefill, decode = prefill + theirs[0], decode + theirs[1]
        tokens = demand.prompt_tokens
        cached = 0
        interference = 0.0
        if demand.probe is not None:  # only the tokens its prefix cache lacks
            cached = tokens - learning.uncached_tokens(engine, demand)
            # What joining the engine's decode batch costs: each step there takes the learned
            # TPOT growth longer per request decoding, for this request's expected output,
            # borne by it and imposed on them.
            growth = learning.learned[engine.index].tpot.growth_s
            interference = 2.0 * growth * max(1.0, demand.expected_output) * decode
        ttft = wait + learning.prefill_model(engine).seconds(tokens - cached)
        return Candidate(engine, ttft, learning.decode_load(engine, now) / engine.config.weight,
                         prefill, decode, cached, ttft + interference)

    # -- placing -----------------------------------------------------------------------------
    def try_place(self, exclude: Engine | None = None,
                  demand: Demand | None = None) -> Placement | None:
        """Place ``demand`` (default: the oldest request waiting in the admission queue)."""
        board = self.board
        if demand is None:
            demand = self.learning.pending.head() or Demand(0)
        engines = demand.eligible
        if engines is None:
            engines = self.eligible(demand.served)
        else:
            demand.eligible = None  # good for this instant only
        if exclude is not None:
            engines = [e for e in engines if e is not exclude]
        if not engines:
            return None
        self._turn = (self._turn + 1) % len(engines)
        now = time.monotonic()
        candidates = []
        limits = self.limits
        for engine in engines[self._turn:] + engines[: self._turn]:
            inflight = board.inflight(engine.index)
            # A mixed engine needs a decode slot to come: both phases under max_decode.
            total = (engine.config.max_decode if limits is None
                     else limits.decode(engine.index))
            if engine.config.role == "prefill" or sum(inflight) < total:
                candidates.append(self.candidate(engine, demand, now, inflight))
        if not candidates:
            return None
        return self._choose(candidates, demand)

    def replace_prefill(self, placement: Placement, demand: Demand) -> Placement | None:
        """Another prefill engine for a split placement whose prefill leg failed; the decode
        half moves over to the new placement. None when no other prefill engine has room."""
        now = time.monotonic()
        failed = placement.engine
        engines = [e for e in self.eligible(demand.served)
                   if e.config.role == "prefill" and e is not failed]
        if not engines:
            return None
        ordered = self.policy.order([self.candidate(e, demand, now) for e in engines], demand)
        taken = self._take_prefill(ordered, demand)
        if taken is not None:
            taken.split, placement.split = placement.split, None
        return taken

    def decode_leg(self, placement: Placement) -> Placement:
        """The prefill leg of a split placement succeeded: its prefill slot goes back and the
        request moves to the decode engine with the slot reserved there."""
        split = placement.split
        assert split is not None
        placement.split = None
        self.release(placement)
        track = self.learning.place(split.engine, placement.track.demand, None, prefill=False)
        slot, split.slot = split.slot, None
        return Placement(self.board, split.engine, None, track, decode=slot)

    def release(self, placement: Placement) -> bool:
        """Give back everything ``placement`` holds: its slots and its place in the learned
        model's projections (idempotent). True when a slot was still held."""
        held = placement.release()
        self.learning.release(placement.track)
        return held

    # -- internals ---------------------------------------------------------------------------
    def _choose(self, candidates: list[Candidate], demand: Demand) -> Placement | None:
        """Acquire the better of the mixed and split placements, falling back to the other."""
        policy = self.policy
        mixed = [c for c in candidates if c.engine.config.role == "mixed"]
        prefill = [c for c in candidates if c.engine.config.role == "prefill"]
        mixed = policy.order(mixed, demand) if mixed else []
        prefill = policy.order(prefill, demand) if prefill else []
        split_first = bool(prefill) and self._better_split(mixed[0] if mixed else None,
                                                           prefill[0])
        for kind in (("split", "mixed") if split_first else ("mixed", "split")):
            if kind == "split" and prefill:
                placement = self._take_split(prefill, demand)
                if placement is not None:
                    return placement
            elif kind == "mixed" and mixed:
                placement = self._take_prefill(mixed, demand)
                if placement is not None:
                    return placement
        return None

    def _better_split(self, mixed: Candidate | None, split: Candidate) -> bool:
        if mixed is None:
            return True
        learning = self.learning
        if learning.profiled(mixed.engine) and learning.profiled(split.engine):
            return split.ttft_s < mixed.ttft_s
        weight_m, weight_s = mixed.engine.config.weight, split.engine.config.weight
        return split.prefill_inflight / weight_s < mixed.prefill_inflight / weight_m

    def _take_prefill(self, ordered: list[Candidate], demand: Demand) -> Placement | None:
        board, limits = self.board, self.limits
        for choice in ordered:
            engine = choice.engine
            cfg = engine.config
            if limits is None:
                limit, total = cfg.max_prefill, cfg.max_decode
            else:
                limit, total = limits.prefill(engine.index), limits.decode(engine.index)
            slot = board.acquire_slot(engine.index, "prefill", limit,
                                      total if cfg.role == "mixed" else None)
            if slot is not None:
                track = self.learning.place(engine, demand, slot)
                self.policy.placed(engine, demand)
                return Placement(board, engine, slot, track)
        return None

    def _decode_limit(self, engine: Engine) -> int:
        limits = self.limits
        return engine.config.max_decode if limits is None else limits.decode(engine.index)

    def _decoders(self, served: Served | None) -> list[Engine]:
        """Decode engines with a decode slot to come, least expected decode work first."""
        now = time.monotonic()
        learning, board = self.learning, self.board
        found = []
        for e in self.engines:
            if (e.config.role == "decode" and e.serves()
                    and (served is None or served.on(e.index))):
                decoding = board.inflight(e.index)[1]
                if decoding < self._decode_limit(e):
                    found.append((learning.decode_load(e, now) / e.config.weight,
                                  decoding / e.config.weight, e.index, e))
        return [e for *_, e in sorted(found)]

    def _take_split(self, ordered: list[Candidate], demand: Demand) -> Placement | None:
        for decoder in self._decoders(demand.served):
            slot = self.board.acquire_slot(decoder.index, "decode", self._decode_limit(decoder))
            if slot is None:
                continue
            placement = self._take_prefill(ordered, demand)
            if placement is None:
                slot.release()
                return None
            placement.split = Split(decoder, slot)
            return placement
        return None
