"""Benchmarks of the per-token path: Rust StreamSession against its Python oracle, same run.

Run: ``pytest benches/bench_stream.py``. ``test_ratio_gate`` (last) fails when the Rust
path is less than 5x faster than the oracle on any case.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from narwhal._narwhal_fast import StreamSession
from reference import stream_oracle

IMPLS: dict[str, Any] = {"rust": StreamSession, "oracle": stream_oracle.StreamSession}
GATE = 5.0
MEDIANS: dict[tuple[str, str], float] = {}
HEAD = {
    "id": "chatcmpl-bc187f2374436c40",
    "object": "chat.completion.chunk",
    "created": 1796228970,
    "model": "meta-llama/Llama-3.1-8B-Instruct",
}


def frame(event: dict[str, Any]) -> bytes:
    return (
        b"data: " + json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    )


def content_event(i: int) -> bytes:
    """A typical vLLM content chunk with return_token_ids (one token)."""
    choice = {
        "index": 0,
        "delta": {"content": f" word{i % 97}"},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": [1000 + i % 30000],
    }
    return frame(HEAD | {"choices": [choice]})


def stream_reads(tokens: int) -> list[bytes]:
    """One read per event: role chunk, `tokens` content chunks, finish, usage, [DONE]."""
    role = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    finish = {
        "index": 0,
        "delta": {"content": ""},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": [2],
    }
    usage = {"prompt_tokens": 11, "total_tokens": 12 + tokens, "completion_tokens": tokens + 1}
    return [
        frame(HEAD | {"choices": [role], "prompt_token_ids": list(range(11))}),
        *(content_event(i) for i in range(tokens)),
        frame(HEAD | {"choices": [finish]}),
        frame(HEAD | {"choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


def record(case: str, impl: str, benchmark: Any) -> None:
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        MEDIANS[(case, impl)] = stats.stats.median


@pytest.mark.parametrize("impl", ["rust", "oracle"])
@pytest.mark.parametrize("per_read", [1, 16])
def test_parse_validate_expose(benchmark: Any, impl: str, per_read: int) -> None:
    """A streaming client without return_token_ids: parse, validate IDs, null them."""
    s = IMPLS[impl](
        "chat", assemble=False, expose_token_ids=False, drop_usage=False, require_token_ids=True
    )
    read = b"".join(content_event(i) for i in range(per_read))
    out, count, state = s.feed(read)
    assert (count, state) == (per_read, 0) and out.count(b'"token_ids":null') == per_read
    benchmark.extra_info["events_per_read"] = per_read
    benchmark(s.feed, read)
    record(f"event x{per_read}", impl, benchmark)


@pytest.mark.parametrize("impl", ["rust", "oracle"])
@pytest.mark.parametrize("per_read", [1, 16])
def test_pump(benchmark: Any, impl: str, per_read: int) -> None:
    """The fast path: one raw engine read (chunked framing: one chunk per event, as vLLM
    sends), de-chunked, parsed, validated, exposed, framed and written to the client."""
    s = IMPLS[impl](
        "chat", assemble=False, expose_token_ids=False, drop_usage=False, require_token_ids=True
    )
    written: list[bytes] = []
    s.start_pump(written.append)
    read = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in map(content_event, range(per_read)))
    assert s.pump(read) == 0 and written[0].count(b'"token_ids":null') == per_read
    benchmark.extra_info["events_per_read"] = per_read

    def pump() -> int:
        written.clear()
        flags: int = s.pump(read)
        return flags

    benchmark(pump)
    record(f"pump x{per_read}", impl, benchmark)


@pytest.mark.parametrize("impl", ["rust", "oracle"])
@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_assemble_stream(benchmark: Any, impl: str, tokens: int) -> None:
    """A non-streaming client: the whole engine stream, one read per event, then finish()."""
    reads = stream_reads(tokens)
    cls = IMPLS[impl]

    def run() -> bytes:
        s = cls(
            "chat",
            assemble=True,
            expose_token_ids=True,
            drop_usage=False,
            require_token_ids=True,
            prompt_tokens=11,
        )
        for r in reads:
            s.feed(r)
        body: bytes = s.finish()
        return body

    body = json.loads(run())
    assert len(body["choices"][0]["token_ids"]) == tokens + 1
    benchmark(run)
    record(f"assemble {tokens}", impl, benchmark)


def continuation_reads(tokens: int, prompt: int) -> list[bytes]:
    """A /v1/completions token-ID continuation of ``tokens`` chunks, usage, [DONE]."""
    head = {"id": "cmpl-9a0c4e1b2f3d5a67", "object": "text_completion", "created": 1796228971,
            "model": HEAD["model"]}

    def chunk(i: int, **kw: Any) -> bytes:
        choice = {"index": 0, "text": f" word{i % 97}", "logprobs": None, "finish_reason": None,
                  "stop_reason": None, "prompt_token_ids": None, "token_ids": [2000 + i]} | kw
        return frame(head | {"choices": [choice], "usage": None})

    usage = {"prompt_tokens": prompt, "total_tokens": prompt + tokens, "completion_tokens": tokens}
    return [
        chunk(0, prompt_token_ids=list(range(prompt))),
        *(chunk(i) for i in range(1, tokens - 1)),
        chunk(tokens - 1, finish_reason="stop"),
        frame(head | {"choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


@pytest.mark.parametrize("impl", ["rust", "oracle"])
def test_resumed_stream(benchmark: Any, impl: str) -> None:
    """A streaming chat answer broken after 32 tokens, resumed on another engine for 32 more:
    enable_resume, resume_point, resume and the rewriting of every continuation chunk."""
    broken = stream_reads(32)[:33]  # role chunk and 32 content chunks, no finish
    cont = continuation_reads(32, 11 + 32)
    cls = IMPLS[impl]

    def run() -> bytes:
        s = cls("chat", assemble=False, expose_token_ids=False, drop_usage=False,
                require_token_ids=True)
        s.enable_resume()
        for r in broken:
            s.feed(r)
        point = s.resume_point()
        assert point is not None and s.resume()
        out = b""
        for r in cont:
            out += s.feed(r)[0]
        return out

    assert b'"completion_tokens":64' in run()
    benchmark(run)
    record("resume 32+32", impl, benchmark)


def _ratios() -> tuple[list[str], list[str]]:
    """Each case's Rust and oracle medians from this run: report lines and the slow cases."""
    lines, slow = [], []
    for case in sorted({case for case, _ in MEDIANS}):
        rust, oracle = MEDIANS.get((case, "rust")), MEDIANS.get((case, "oracle"))
        if rust is None or oracle is None:
            continue
        ratio = oracle / rust
        per_event = (rust / int(case.split("x")[1])
                     if case.startswith(("event", "pump")) else None)
        extra = f", {per_event * 1e6:.2f} us/event" if per_event else ""
        lines.append(
            f"{case:>14}: rust {rust * 1e6:10.1f} us, oracle {oracle * 1e6:10.1f} us, "
            f"{ratio:6.1f}x{extra}"
        )
        if ratio < GATE:
            slow.append(case)
    return lines, slow


def test_ratio_gate(benchmark: Any) -> None:
    """Last in the file. It takes the benchmark fixture (timing the gate's own arithmetic) so
    that ``pytest benches --benchmark-only`` runs it too."""
    if not MEDIANS:
        pytest.skip("no benchmark statistics (benchmarks disabled or deselected)")
    lines, slow = benchmark.pedantic(_ratios, rounds=1, iterations=1)
    print("\n" + "\n".join(lines))
    assert lines, "no case has both a Rust and an oracle median"
    assert not slow, f"Rust path under {GATE}x the oracle: {slow}"
