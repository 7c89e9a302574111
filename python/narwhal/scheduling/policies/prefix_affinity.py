"""``prefix_affinity``: ``lowest_ttft``, preferring the engine that last served the prefix.

The affinity term only orders engines that already tie on projected TTFT and whose decode
load is within one request's expected output of the least loaded of them, so it never
overrides load: a hot prefix goes back to its engine only while that engine is no busier
than its fair share, and spreads as soon as it is.
"""

from __future__ import annotations

from collections import OrderedDict

from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.request.parse import Parsed
from narwhal.scheduling.policies.base import Candidate, tie_band

MAX_PREFIXES = 4096
"""Prefixes remembered (least recently placed forgotten first)."""


def prefix_key(parsed: Parsed, chars: int) -> int | None:
    """A hash of the first ``chars`` characters of the prompt (``chars // 4`` token IDs)."""
    body = parsed.body
    if parsed.route == "chat":
        parts: list[str] = []
        size = 0
        for message in body.get("messages", ()):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str))
            if not isinstance(content, str):
                continue
            parts.append(str(message.get("role")))
            parts.append(content[: chars - size])
            size += len(parts[-1])
            if size >= chars:
                break
        return hash(tuple(parts)) if parts else None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return hash(prompt[:chars])
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return hash(first[:chars])
        if isinstance(first, int):
            return hash(tuple(prompt[: max(1, chars // 4)]))
        if isinstance(first, list):
            return hash(tuple(first[: max(1, chars // 4)]))
    return None


class PrefixAffinity:
    """Remembers which engine last took each prefix."""

    name = "prefix_affinity"
    cache_aware = False
    needs_prefix = True

    def __init__(self) -> None:
        self.last: OrderedDict[int, str] = OrderedDict()

    def order(self, candidates: list[Candidate], demand: Demand) -> list[Candidate]:
        band = tie_band(candidates)
        home = self.last.get(demand.prefix) if demand.prefix is not None else None
        floor = min(c.decode_load for c in candidates if c.ttft_s <= band)
        slack = max(1.0, demand.expected_output)

        def key(c: Candidate) -> tuple[bool, float, bool, float]:
            tied = c.ttft_s <= band
            at_home = tied and c.engine.name == home and c.decode_load <= floor + slack
            return (not tied, 0.0 if tied else c.ttft_s, not at_home, c.decode_load)

        return sorted(candidates, key=key)

    def placed(self, engine: Engine, demand: Demand) -> None:
        if demand.prefix is None:
            return
        self.last[demand.prefix] = engine.name
        self.last.move_to_end(demand.prefix)
        if len(self.last) > MAX_PREFIXES:
            self.last.popitem(last=False)
