"""Output tokens and the delta segments they belong to, pre-serialised for the hot path.

A generated token is a tuple ``(seg, id, escaped_text, text)``. Its segment says which
chat delta field the text goes to and holds the JSON bytes around it, so an event is
``seg.open + escaped texts + seg.close`` with no dict→JSON work per token. Tokens of one
mergeable segment concatenate into one delta; ``NONE`` tokens (EOS, tool markup) carry an
id but no text; complete segments (tool-call heads, fault payloads) are whole deltas.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

from narwhal.sim import tokenizer

CONTENT_KIND = "content"


class Seg:
    """One kind of delta fragment."""

    __slots__ = ("close", "index", "kind", "mergeable", "meta", "open")

    def __init__(
        self,
        kind: str,
        open_: bytes = b"",
        close: bytes = b"",
        *,
        index: int = 0,
        mergeable: bool = True,
        meta: Any = None,
    ) -> None:
        self.kind = kind
        self.open = open_
        self.close = close
        self.index = index
        self.mergeable = mergeable
        self.meta = meta

    def __repr__(self) -> str:
        return f"Seg({self.kind}, {self.index})"


Tok = tuple[Seg, int, bytes, str]

CONTENT = Seg(CONTENT_KIND, b'{"content":"', b'"}')
REASONING = Seg("reasoning", b'{"reasoning":"', b'"}')
REASONING_CONTENT = Seg("reasoning_content", b'{"reasoning_content":"', b'"}')
REFUSAL = Seg("refusal", b'{"refusal":"', b'"}')
FN_ARGS = Seg("fn_args", b'{"function_call":{"arguments":"', b'"}}')
NONE = Seg("none")
EMPTY_CONTENT_DELTA = b'{"content":""}'
EMPTY_DELTA = b"{}"

TEXT_SEGMENTS = {s.kind: s for s in (CONTENT, REASONING, REASONING_CONTENT, REFUSAL)}


def tool_args(index: int) -> Seg:
    """Argument fragments of tool call ``index``."""
    return Seg(
        "tool_args",
        b'{"tool_calls":[{"index":%d,"function":{"arguments":"' % index,
        b'"}}]}',
        index=index,
    )


def tool_head(index: int, call_id: str, name: str) -> Seg:
    """The first fragment of a tool call: id, type, index and name, no ``arguments``."""
    head = {"id": call_id, "type": "function", "index": index, "function": {"name": name}}
    delta = b'{"tool_calls":[' + orjson.dumps(head) + b"]}"
    return Seg("tool_head", delta, index=index, mergeable=False,
               meta={"id": call_id, "name": name})


def function_name(name: str) -> Seg:
    """Legacy ``function_call`` name fragment."""
    delta = b'{"function_call":{"name":' + orjson.dumps(name) + b"}}"
    return Seg("fn_name", delta, mergeable=False, meta=name)


def whole(kind: str, delta: dict[str, Any], meta: Any = None) -> Seg:
    """A complete, unmergeable delta (fault payloads such as audio or a custom tool)."""
    return Seg(kind, orjson.dumps(delta), mergeable=False, meta=meta)


def text_token(seg: Seg, text: str) -> Tok:
    """A token whose id comes from the tokenizer's piece map."""
    return (seg, tokenizer.piece_id(text), orjson.dumps(text)[1:-1], text)


def text_tokens(seg: Seg, text: str) -> list[Tok]:
    """The text split into tokenizer pieces, one token each."""
    return [text_token(seg, p) for p in tokenizer.pieces(text)]


def marker(token_id: int) -> Tok:
    """A token with an id and no text (EOS, tool-call or think markup)."""
    return (NONE, token_id, b"", "")


EOS_TOK: Tok = marker(tokenizer.EOS)

# A long fixed pseudo-random run of ordinary content tokens; a request reads a window of it.
_PLAIN_LEN = 4096


def _plain_run(seed: int) -> list[Tok]:
    rng = random.Random(seed)
    lo, hi = tokenizer.FIRST_ORDINARY, tokenizer.VOCAB_SIZE - 1
    run: list[Tok] = []
    for _ in range(_PLAIN_LEN):
        tid = rng.randint(lo, hi)
        run.append((CONTENT, tid, tokenizer.ESCAPED[tid], tokenizer.OUTPUT_TEXTS[tid]))
    return run + run


_PLAIN = _plain_run(20260)


def plain(offset: int, count: int, seg: Seg = CONTENT) -> list[Tok]:
    """``count`` ordinary tokens from the fixed run, starting at ``offset``."""
    offset %= _PLAIN_LEN
    if seg is CONTENT:
        out: list[Tok] = []
        while count > 0:
            take = min(count, _PLAIN_LEN)
            out.extend(_PLAIN[offset : offset + take])
            count -= take
        return out
    return [(seg, t[1], t[2], t[3]) for t in plain(offset, count)]


def render_ids(ids: list[int]) -> bytes:
    """``[1,2,3]`` with no spaces."""
    if len(ids) == 1:
        tid = ids[0]
        if 0 <= tid < tokenizer.VOCAB_SIZE:
            return b"[" + tokenizer.ID_BYTES[tid] + b"]"
    return b"[" + b",".join(str(i).encode() for i in ids) + b"]"


def group(toks: list[Tok]) -> list[tuple[Seg | None, list[Tok]]]:
    """Split tokens emitted together into events: one per run of a mergeable segment.

    Text-less tokens join the run before them (or the first run when they lead)."""
    events: list[tuple[Seg | None, list[Tok]]] = []
    cur: Seg | None = None
    run: list[Tok] = []
    for tok in toks:
        seg = tok[0]
        if seg is NONE:
            run.append(tok)
            continue
        if cur is None:
            cur = seg
            run.append(tok)
            continue
        if seg is cur and seg.mergeable:
            run.append(tok)
            continue
        events.append((cur, run))
        cur, run = seg, [tok]
    if run or not events:
        events.append((cur, run))
    return events


def delta_of(seg: Seg | None, run: list[Tok], empty: bytes) -> bytes:
    """The delta JSON for one run of tokens."""
    if seg is None:
        return empty
    if not seg.mergeable:
        return seg.open
    if len(run) == 1:
        return seg.open + run[0][2] + seg.close
    return seg.open + b"".join(t[2] for t in run if t[0] is seg) + seg.close
