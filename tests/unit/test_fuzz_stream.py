"""A short fuzz run of ``StreamSession`` through the binding (the long runs use the Rust driver
in ``fuzz/``): mutated real vLLM streams in every mode and random read splits. No exception
but ``StreamError`` from ``finish``, the same outcome whatever the splits, and client bytes
that are ``data:`` events of JSON.

``NARWHAL_FUZZ_STREAM_INPUTS`` sets the number of inputs (default: a few seconds' worth).
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

from narwhal._narwhal_fast import StreamSession

INPUTS = int(os.environ.get("NARWHAL_FUZZ_STREAM_INPUTS", "4000"))
TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
MODES = [
    dict(
        zip(("assemble", "expose_token_ids", "drop_usage", "require_token_ids"), bits, strict=True)
    )
    for bits in itertools.product((False, True), repeat=4)
]
DICT = [
    b"data: ",
    b"\n\n",
    b"\r\n",
    b"\r",
    b"[DONE]",
    b"null",
    b"true",
    b"-1",
    b"1e400",
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b",",
    b":",
    b'"token_ids":[true]',
    b'"token_ids":null',
    b'"token_ids":[1.0]',
    b'"tool_calls":[{"index":-1}]',
    b'"usage":{"completion_tokens":-1}',
    b'"error":{}',
    b"\xff",
    b'"audio":{"id":"a"}',
    b"18446744073709551616",
    b"\\ud800",
    "é".encode(),
    b": comment\n",
]


def seeds() -> list[bytes]:
    """Each run of ``data:`` lines in the transcripts, as one stream."""
    out: list[bytes] = []
    for path in sorted(TRANSCRIPTS.glob("*.txt")):
        current = b""
        for line in path.read_bytes().splitlines():
            if line.startswith(b"data: "):
                current += line + b"\n\n"
            elif line and current:
                out.append(current)
                current = b""
        if current:
            out.append(current)
    assert out, "no transcript streams found"
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        at = rng.randrange(len(buf) + 1)
        op = rng.randrange(4)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at:at] = rng.choice(DICT)
        elif op == 2 and buf:
            del buf[at : at + rng.randrange(1, 24)]
        else:
            buf[at : at + rng.randrange(1, 12)] = rng.choice(DICT)
    return bytes(buf)


def run(route: str, mode: dict[str, bool], data: bytes, cuts: list[int]) -> tuple[Any, ...]:
    session = StreamSession(route, prompt_tokens=5, **mode)
    out, tokens, state, at = b"", 0, 0, 0
    for cut in [*cuts, len(data)]:
        chunk, n, state = session.feed(data[at:cut])
        out, tokens, at = out + chunk, tokens + n, cut
    finished: Any = None
    if mode["assemble"]:
        try:
            finished = session.finish()
        except ValueError as exc:
            finished = getattr(exc, "code", "?")
    return out, tokens, state, session.failure, session.output_tokens, finished


def check_sse(out: bytes) -> None:
    if not out:
        return
    assert out.endswith(b"\n\n"), out[-200:]
    for event in out[:-2].split(b"\n\n"):
        lines = event.split(b"\n")
        assert all(line.startswith(b"data: ") for line in lines), event
        data = b"\n".join(line[6:] for line in lines)
        if data != b"[DONE]":
            json.loads(data)


def test_fuzz_stream_session() -> None:
    rng = random.Random(int(os.environ.get("NARWHAL_FUZZ_SEED", "11")))
    corpus = seeds()
    for i in range(INPUTS):
        data = mutate(rng, rng.choice(corpus))
        route = rng.choice(("chat", "completion"))
        mode = rng.choice(MODES)
        cuts = sorted({rng.randrange(1, max(2, len(data))) for _ in range(rng.randrange(6))})
        whole = run(route, mode, data, [])
        split = run(route, mode, data, cuts)
        assert whole == split, (i, data, mode, cuts)
        if mode["assemble"]:
            assert whole[0] == b""
            if isinstance(whole[5], bytes):
                json.loads(whole[5])
        else:
            check_sse(whole[0])
