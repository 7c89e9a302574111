"""Deterministic logprobs for generated tokens, in vLLM's chat and text-completion shapes.

The sampled token is always the most likely one (as with greedy decoding); alternatives
are fixed other ids with slightly lower values.
"""

from __future__ import annotations

from functools import lru_cache

import orjson

from narwhal.sim import segments as sg
from narwhal.sim import tokenizer

_SPAN = tokenizer.VOCAB_SIZE - tokenizer.FIRST_ORDINARY


def logprob(token_id: int) -> float:
    return -round(0.05 + ((token_id * 7919) % 5000) / 1000.0, 6)


def alternatives(token_id: int, k: int) -> list[tuple[int, str, float]]:
    """``k`` (id, text, logprob) candidates, most likely first; the sampled token leads."""
    out: list[tuple[int, str, float]] = []
    base = logprob(token_id)
    for j in range(k):
        if j == 0:
            continue
        tid = (token_id - tokenizer.FIRST_ORDINARY + 131 * j) % _SPAN + tokenizer.FIRST_ORDINARY
        out.append((tid, tokenizer.OUTPUT_TEXTS[tid], round(base - 0.0137 * j - 0.003, 6)))
    return out


def _entry(text: str, value: float) -> dict[str, object]:
    return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8", "replace"))}


@lru_cache(maxsize=8192)
def _chat_entry(token_id: int, text: str, k: int) -> bytes:
    value = logprob(token_id)
    top = [_entry(text, value)] if k > 0 else []
    top += [_entry(t, v) for _, t, v in alternatives(token_id, k)]
    return orjson.dumps({**_entry(text, value), "top_logprobs": top})


def chat(run: list[sg.Tok], k: int) -> bytes:
    """``{"content":[...]}`` for the tokens of one chat event."""
    return b'{"content":[' + b",".join(_chat_entry(t[1], t[3], k) for t in run) + b"]}"


def chat_value(toks: list[sg.Tok], k: int) -> list[object]:
    """The ``content`` list for a non-streaming chat body."""
    return [orjson.loads(_chat_entry(t[1], t[3], k)) for t in toks]


def prompt_toks(ids: list[int]) -> list[sg.Tok]:
    """An echoed prompt's tokens, decoded as vLLM's logprobs show them (special tokens by
    name, so a token's length need not be its share of the echoed text)."""
    return [(sg.CONTENT, t, b"", tokenizer.TEXTS[t]) for t in ids]


def completion_parts(run: list[sg.Tok], k: int, offset: int,
                     prompt: int = 0) -> tuple[dict[str, list[object]], int]:
    """Text-completion logprob arrays for ``run`` whose text starts at char ``offset``.

    The first ``prompt`` tokens are an echoed prompt's: the first has no logprob, the others
    list the ``k`` likeliest tokens besides their own (a prompt token is rarely the
    likeliest); a generated token is the likeliest, so its own entry counts among the ``k``.
    """
    offsets: list[object] = []
    values: list[object] = []
    tokens: list[object] = []
    tops: list[object] = []
    for i, (_seg, tid, _esc, text) in enumerate(run):
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        if i == 0 and prompt:
            values.append(None)
            tops.append(None)
            continue
        value = logprob(tid)
        values.append(value)
        top: dict[str, float] = {text: value}
        for _, alt, alt_value in alternatives(tid, k + 1 if i < prompt else k):
            top.setdefault(alt, alt_value)
        tops.append(top)
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
            "top_logprobs": tops}, offset


def prompt_logprobs(ids: list[int], k: int) -> list[object]:
    """A completion choice's ``prompt_logprobs`` (echo with logprobs asks for them): per
    prompt token after the first, its own entry and the ``k`` likeliest, by token ID."""
    out: list[object] = [None]
    for tid in ids[1:]:
        entry = {str(tid): {"logprob": logprob(tid), "rank": 2 + tid % 997,
                            "decoded_token": tokenizer.TEXTS[tid]}}
        for rank, (alt, text, value) in enumerate(alternatives(tid, k + 1), 1):
            entry.setdefault(str(alt), {"logprob": value, "rank": rank, "decoded_token": text})
        out.append(entry)
    return out


def completion(run: list[sg.Tok], k: int, offset: int, prompt: int = 0) -> tuple[bytes, int]:
    """The serialised ``logprobs`` object of one completion event and the next offset."""
    parts, offset = completion_parts(run, k, offset, prompt)
    return orjson.dumps(parts), offset
