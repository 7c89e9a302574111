"""Golden tests from real vLLM 0.32 wire captures (tests/data/transcripts, copied from
../shared/reference/transcripts): exposure gives the no-IDs wire shape, and assembling a
captured stream gives the captured non-streaming body."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from stream_helpers import DONE, IMPLS, session

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"


@dataclass
class Capture:
    title: str
    request: dict[str, Any]
    body: bytes

    def events(self) -> list[bytes]:
        return [e[6:] for e in self.body.split(b"\n\n") if e.startswith(b"data: {")]


def captures(name: str) -> dict[str, Capture]:
    """Sections of one transcript file by title: request JSON from the curl line, body
    after the response headers."""
    out = {}
    for part in (DATA / name).read_bytes().split(b"################ ")[1:]:
        title, rest = part.split(b"\n", 1)
        curl = next(line for line in rest.split(b"\n") if line.startswith(b"$ curl"))
        request = json.loads(curl.split(b" -d ", 1)[1].strip().strip(b"'"))
        body = rest.split(b"\r\n\r\n", 1)[1]
        out[title.decode()] = Capture(title.decode(), request, body)
    return out


def one(name: str, title_start: str) -> Capture:
    matches = [c for t, c in captures(name).items() if t.startswith(title_start)]
    assert len(matches) == 1, title_start
    return matches[0]


CHAT_IDS = one("chat_stream.txt", "1. STREAMING chat, return_token_ids")
CHAT_LOGPROBS = one("chat_stream.txt", "2. STREAMING chat, no return_token_ids")
CHAT_CONTINUOUS = one("chat_stream.txt", "3. STREAMING chat, continuous_usage_stats")
CMPL_IDS = one("completions.txt", "STREAMING completions, logprobs=2")
CMPL_BATCH = one("completions.txt", "STREAMING completions, 2 prompts")
CMPL_TOKEN_PROMPT = one("completions.txt", "STREAMING completions, token-id prompt")
CMPL_NONSTREAM = one("completions.txt", "non-streaming completions, logprobs=2")
CHAT_NONSTREAM_IDS = one("nonstream.txt", "non-streaming chat, return_token_ids")
CHAT_NONSTREAM_PLAIN = one("nonstream.txt", "non-streaming chat, plain")
STREAMS = [CHAT_IDS, CHAT_LOGPROBS, CHAT_CONTINUOUS, CMPL_IDS, CMPL_BATCH, CMPL_TOKEN_PROMPT]
WITHOUT_IDS = [CHAT_LOGPROBS, CHAT_CONTINUOUS, CMPL_BATCH, CMPL_TOKEN_PROMPT]

pytestmark = pytest.mark.parametrize("impl", sorted(IMPLS))


def route(c: Capture) -> str:
    return "chat" if "messages" in c.request else "completion"


def null_ids(event: bytes) -> bytes:
    return re.sub(rb'"(prompt_)?token_ids":\[[0-9,]*\]', rb'"\1token_ids":null', event)


def same_shape(a: Any, b: Any, path: str = "$") -> None:
    """Same keys in the same order at every level; null matches anything."""
    if a is None or b is None:
        return
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same_shape(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            same_shape(x, y, f"{path}[{i}]")


def assembled(impl: str, c: Capture, **opts: Any) -> bytes:
    s = session(impl, route(c), assemble=True, **opts)
    out, _, state = s.feed(c.body)
    assert (out, state) == (b"", 1), s.failure
    body: bytes = s.finish()
    return body


# --- exposure ---------------------------------------------------------------------------


@pytest.mark.parametrize("c", [CHAT_IDS, CMPL_IDS], ids=["chat", "completion"])
def test_ids_exposed_as_vllm_sends_them_without_return_token_ids(impl: str, c: Capture) -> None:
    s = session(impl, route(c), require_token_ids=True)
    out, n, state = s.feed(c.body)
    assert state == 1 and s.failure is None
    want = b"".join(b"data: " + null_ids(e) + b"\n\n" for e in c.events()) + DONE
    assert out == want
    # The captured generated-ID count: 8 chat tokens, 5 completion tokens (incl. the last).
    assert n == len(re.findall(rb"(?<!prompt_)token_ids\":\[(\d+)", c.body)) == s.output_tokens
    # The nulled events have the wire shape of the capture made without return_token_ids.
    reference = (CHAT_LOGPROBS if route(c) == "chat" else CMPL_BATCH).events()
    mine = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    same_shape(mine[0], json.loads(reference[0]))
    same_shape(mine[1], json.loads(reference[1]))


@pytest.mark.parametrize("c", WITHOUT_IDS, ids=lambda c: c.title[:30])
def test_streams_without_ids_pass_unchanged_and_fail_when_ids_are_required(
    impl: str, c: Capture
) -> None:
    s = session(impl, route(c), require_token_ids=False)
    out, n, state = s.feed(c.body)
    assert state == 1 and out == b"".join(b"data: " + e + b"\n\n" for e in c.events()) + DONE
    assert n == s.output_tokens > 0
    strict = session(impl, route(c), require_token_ids=True)
    assert strict.feed(c.body)[2] == 2
    assert strict.failure[0] == "malformed_engine_output"


def test_drop_usage_removes_the_usage_frame_and_keeps_its_fingerprint(impl: str) -> None:
    """The usage frame the client did not ask for goes; its system_fingerprint lands on the
    finish event, where vLLM stamps it when the client asks no usage (engine-protocol.md)."""
    s = session(impl, "chat", drop_usage=True, expose_token_ids=True)
    out, _, _ = s.feed(CHAT_IDS.body)
    events = CHAT_IDS.events()
    fingerprint = json.loads(events[-1])["system_fingerprint"]
    assert fingerprint
    finish = events[-2][:-1] + b',"system_fingerprint":' + json.dumps(fingerprint).encode() + b"}"
    want = [*events[:-2], finish]
    assert out == b"".join(b"data: " + e + b"\n\n" for e in want) + DONE


def test_every_two_way_split_gives_the_same_bytes(impl: str) -> None:
    whole = session(impl, "completion").feed(CMPL_IDS.body)
    for i in range(len(CMPL_IDS.body)):
        s = session(impl, "completion")
        a, b = s.feed(CMPL_IDS.body[:i]), s.feed(CMPL_IDS.body[i:])
        assert (a[0] + b[0], a[1] + b[1], b[2]) == whole, i


# --- assembly ---------------------------------------------------------------------------


def test_completion_stream_assembles_to_the_captured_non_streaming_body(impl: str) -> None:
    """Same request (logprobs=2, return_token_ids, greedy) captured both ways."""
    got = assembled(impl, CMPL_IDS, expose_token_ids=True, require_token_ids=True)
    want = json.loads(CMPL_NONSTREAM.body)
    want["id"] = json.loads(CMPL_IDS.events()[0])["id"]
    assert got == json.dumps(want, separators=(",", ":"), ensure_ascii=False).encode()


def test_chat_stream_assembles_to_the_captured_non_streaming_shape(impl: str) -> None:
    body = json.loads(assembled(impl, CHAT_IDS, expose_token_ids=True, require_token_ids=True))
    ref = json.loads(CHAT_NONSTREAM_IDS.body)
    same_shape(body, ref)
    same_shape(json.loads(CHAT_NONSTREAM_PLAIN.body), body)
    # The same prompt and greedy decoding: max_tokens 5 there, 8 here.
    m, rm = body["choices"][0]["message"], ref["choices"][0]["message"]
    assert m["content"].startswith(rm["content"])
    assert body["choices"][0]["token_ids"][:5] == ref["choices"][0]["token_ids"]
    assert body["prompt_token_ids"] == ref["prompt_token_ids"]
    assert body["usage"] == {
        "prompt_tokens": 11,
        "total_tokens": 19,
        "completion_tokens": 8,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert body["system_fingerprint"] == ref["system_fingerprint"]


def test_chat_logprobs_assemble_like_the_captured_body(impl: str) -> None:
    body = json.loads(assembled(impl, CHAT_LOGPROBS, require_token_ids=False, prompt_tokens=11))
    ref = json.loads(CHAT_NONSTREAM_IDS.body)
    assert body["choices"][0]["logprobs"]["content"] == ref["choices"][0]["logprobs"]["content"][:4]
    assert (body["choices"][0]["token_ids"], body["prompt_token_ids"]) == (None, None)
    assert body["usage"]["completion_tokens"] == 4  # computed: no usage in this capture
    same_shape(body, ref)


def test_continuous_usage_and_batch_completions(impl: str) -> None:
    chat = json.loads(assembled(impl, CHAT_CONTINUOUS, require_token_ids=False))
    assert chat["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 8,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert chat["choices"][0]["message"]["content"] == "��ith"
    batch = json.loads(assembled(impl, CMPL_BATCH, require_token_ids=False, prompt_tokens=6))
    assert [(c["index"], c["text"]) for c in batch["choices"]] == [(0, "val st"), (1, "REpla")]
    same_shape(batch, json.loads(CMPL_NONSTREAM.body))
