"""Which prompt prefixes each engine probably holds in its prefix (KV) cache.

The router has no tokenizer, so it indexes the prompt's *text*: the rendered prompt (tool
definitions, then each message's role and content; a completion's prompt string) cut into
``scheduling.prefix_chunk_bytes``-byte chunks, chained-hashed (the Rust ``PrefixIndex``).
Each engine's index holds at most ``engines[].kv_cache_tokens`` worth of chunks, least
recently placed evicted first, as the engine's own LRU cache ages its blocks. A placement
inserts the prompt's chunks on its engine; an engine's report of fewer cached tokens than
estimated shrinks that engine's index (its cache ages faster than assumed), more grows it
(up to 4x ``kv_cache_tokens``).

The estimate of a candidate's cached tokens: the prompt's tokens in proportion to the
matched leading bytes of its text (always leaving one token to compute, as vLLM does).
``X-Session-Id`` (``scheduling.session_header``): a conversation's turns credit the engine
that served its last turn with that turn's prefix, when the index knows less.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from narwhal._narwhal_fast import PrefixIndex, PrefixProbe
from narwhal.fleet.engine import Engine
from narwhal.learning.occupancy import Demand
from narwhal.request.parse import Parsed

CHARS_PER_TOKEN = 4  # text bytes per engine token, for the index's capacity
MIN_CAPACITY = 64  # chunks an engine's index keeps however often it is corrected down
MAX_SESSIONS = 65536
"""Sessions remembered (least recently placed forgotten first)."""
SEP_MESSAGE, SEP_ROLE = "\x1e", "\x1f"


def prompt_text(parsed: Parsed) -> str:
    """The prompt as the engine's template would lay it out, up to the router's knowledge:
    tools, then role and content of each message; a completion's first prompt string."""
    body = parsed.body
    if parsed.route == "chat":
        parts: list[str] = []
        tools = body.get("tools")
        if tools:
            parts += (orjson.dumps(tools).decode(), SEP_MESSAGE)
        for message in body.get("messages", ()):
            if type(message) is not dict:
                continue
            content = message.get("content")
            if type(content) is not str:
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str)
                                  ) if isinstance(content, list) else ""
            role = message.get("role")
            parts += (role if type(role) is str else str(role), SEP_ROLE, content, SEP_MESSAGE)
        return "".join(parts)  # one copy of the text
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    return ""  # token-ID prompts are not indexed


class PrefixCaches:
    """The per-engine prefix index and the session hints; see the module docstring."""

    def __init__(self, engines: Sequence[Engine], chunk_bytes: int = 64) -> None:
        self.chunk_bytes = chunk_bytes
        # Chunks each engine's cache holds (from kv_cache_tokens), by board slot.
        self.configured = {e.index: self.capacity(e) for e in engines}
        slots = max(self.configured, default=-1) + 1
        self.index = PrefixIndex([self.configured.get(k, 0) for k in range(slots)], chunk_bytes)
        self.chunk_bytes = self.index.chunk_bytes
        self.sessions: OrderedDict[str, tuple[int, int]] = OrderedDict()  # -> engine, chunks
        self.reported: dict[int, list[int]] = {}  # engine -> [prompt tokens, cached] reported

    def capacity(self, engine: Engine) -> int:
        """Chunks the engine's cache holds: its KV tokens as text bytes, in chunks."""
        tokens = getattr(engine.config, "kv_cache_tokens", 0)
        return tokens * CHARS_PER_TOKEN // self.chunk_bytes

    def add_engine(self, engine: Engine) -> None:
        """An engine joined the fleet in slot ``engine.index``: its index starts empty."""
        self.configured[engine.index] = capacity = self.capacity(engine)
        self.index.reset(engine.index, capacity)
        self.reported.pop(engine.index, None)

    def remove_engine(self, engine: Engine) -> None:
        """An engine left the fleet: nothing is cached there any more (sessions homed on it
        are forgotten as they come)."""
        self.configured.pop(engine.index, None)
        self.index.reset(engine.index, 0)
        self.reported.pop(engine.index, None)

    # -- a request ----------------------------------------------------------------------------
    def probe(self, demand: Demand, parsed: Parsed, session: str | None) -> None:
        """Match the request's prompt on every engine; the demand keeps the probe."""
        text = prompt_text(parsed)
        size = len(text)
        if size < self.chunk_bytes:
            return
        probe = self.index.probe(text)
        if probe.chunks == 0:
            return
        demand.probe = probe
        size = size if text.isascii() else len(text.encode())  # bytes, as the index cuts
        demand.cached_per_chunk = demand.prompt_tokens * self.chunk_bytes / size
        demand.session = session
        if session is not None:
            demand.session_home = self.sessions.get(session)

    @staticmethod
    def matched(demand: Demand, engine: int) -> int:
        """Leading chunks ``engine`` holds: the index's, or the session's last turn there."""
        probe: PrefixProbe | None = demand.probe
        if probe is None:
            return 0
        matched = probe.matched(engine)
        home = demand.session_home
        if home is not None and home[0] == engine:
            matched = max(matched, min(home[1], probe.chunks))
        return matched

    @classmethod
    def cached_tokens(cls, demand: Demand, engine: int) -> int:
        """The prompt tokens ``engine`` probably holds (at most all but one)."""
        if demand.probe is None:
            return 0
        matched = cls.matched(demand, engine)
        if matched == 0:
            return 0
        return min(demand.prompt_tokens - 1, int(matched * demand.cached_per_chunk))

    def placed(self, engine: int, demand: Demand) -> None:
        """The demand went to ``engine``: its chunks are that engine's most recent."""
        probe = demand.probe
        if probe is None:
            return
        self.index.insert(engine, probe)
        if demand.session is not None:
            sessions = self.sessions
            sessions[demand.session] = (engine, probe.chunks)
            sessions.move_to_end(demand.session)
            if len(sessions) > MAX_SESSIONS:
                sessions.popitem(last=False)

    def report(self, engine: int, demand: Demand, prompt_tokens: int | None,
               cached: int | None) -> None:
        """The engine's usage for a placed prompt: count its cached tokens, and when it held
        fewer chunks than the index thought, forget the others there. vLLM reports
        ``cached_tokens`` only when some were cached (and only with
        ``--enable-prompt-tokens-details``): once an engine has reported it, its silence
        means none."""
        if cached is None:
            if engine not in self.reported:
                return  # this engine never reports: no evidence either way
            cached = 0
        totals = self.reported.setdefault(engine, [0, 0])
        if prompt_tokens is not None:
            totals[0] += prompt_tokens
            totals[1] += cached
        probe = demand.probe
        if probe is None or demand.cached_per_chunk <= 0:
            return
        held = int(cached / demand.cached_per_chunk)
        expected = self.matched(demand, engine)
        state = self.index.state(engine)
        if state is None:
            return
        # The prompt's chunks are on the engine now either way (it just computed them); a
        # wrong estimate says the engine's cache ages faster or slower than the index does.
        capacity = state[1]
        if held + 1 < expected:
            self.index.set_capacity(engine, max(MIN_CAPACITY, capacity * 9 // 10))
        elif held > expected + 1:
            ceiling = self.configured.get(engine, 0) * 4
            self.index.set_capacity(engine, min(ceiling, capacity + capacity // 20 + 1))

    # -- reporting ----------------------------------------------------------------------------
    def describe(self, engine: Engine) -> dict[str, Any] | None:
        """The ``prefix_index`` object of ``/engines``."""
        state = self.index.state(engine.index)
        if state is None:
            return None
        blocks, capacity, placed, matched = state
        reported = self.reported.get(engine.index)
        return {
            "indexed_blocks": blocks,
            "capacity_blocks": capacity,
            "chunk_bytes": self.chunk_bytes,
            "estimated_hit_rate": round(matched / placed, 4) if placed else None,
            "reported_hit_rate": (round(reported[1] / reported[0], 4)
                                  if reported and reported[0] else None),
        }
