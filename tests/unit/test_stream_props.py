"""Property tests: the Rust StreamSession and its Python oracle agree on random engine streams."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stream_helpers import end_state

from narwhal._narwhal_fast import StreamSession
from reference import stream_oracle

EXAMPLES = int(os.environ.get("NARWHAL_PROP_EXAMPLES", "200"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TEXT = st.text(st.characters(codec="utf-8"), max_size=5)
IDS = st.lists(st.integers(0, 2**40), min_size=1, max_size=4)
FLOAT = st.floats(allow_nan=False, allow_infinity=False, width=64)
FINISH = st.sampled_from(["stop", "length", "tool_calls"])
STOP = st.one_of(st.none(), st.integers(0, 999), TEXT)
BAD_IDS: st.SearchStrategy[Any] = st.sampled_from(
    ["missing", None, [True], [1, False], [-1], [1.0], ["1"], [[1]], [{}], 5, "x", [2**64]]
)
OPTIONS = st.fixed_dictionaries(
    {
        "assemble": st.booleans(),
        "expose_token_ids": st.booleans(),
        "drop_usage": st.booleans(),
        "require_token_ids": st.booleans(),
        "prompt_tokens": st.integers(0, 10_000),
        "strip_reasoning": st.booleans(),
        "echo": st.booleans(),
        # the client's name for the model (an alias): "m" is the engine's own
        "model": st.one_of(st.none(), st.sampled_from(["m", "llama-8b"]), TEXT),
    }
)


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@st.composite
def chat_logprobs(draw: st.DrawFn) -> dict[str, Any] | None:
    entry = st.fixed_dictionaries(
        {
            "token": TEXT,
            "logprob": FLOAT,
            "bytes": st.lists(st.integers(0, 255), max_size=3),
            "top_logprobs": st.lists(
                st.fixed_dictionaries({"token": TEXT, "logprob": FLOAT}), max_size=2
            ),
        }
    )
    if draw(st.integers(0, 2)):
        return None
    lp: dict[str, Any] = {"content": draw(st.one_of(st.none(), st.lists(entry, max_size=2)))}
    if draw(st.booleans()):
        lp["refusal"] = draw(st.lists(entry, max_size=2))
    return lp


def tool_fragment(draw: st.DrawFn, started: set[int]) -> dict[str, Any]:
    """A call's first fragment carries id, type and name; later ones argument pieces."""
    k = draw(st.integers(0, 2))
    frag: dict[str, Any] = {"index": k, "function": {}}
    if k not in started or draw(st.integers(0, 9)) == 0:
        started.add(k)
        frag = {"id": f"call_{k}", "type": "function", **frag}
        frag["function"]["name"] = draw(st.sampled_from(["get", "_weather", "run"]))
    if draw(st.booleans()):
        frag["function"]["arguments"] = draw(TEXT)
    return frag


DELTA_KEYS = ["content", "reasoning", "reasoning_content", "refusal", "tool_calls", "function_call"]


def chat_delta(draw: st.DrawFn, started: set[int]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for key in draw(st.sets(st.sampled_from(DELTA_KEYS), max_size=2)):
        if key == "tool_calls":
            delta[key] = [tool_fragment(draw, started) for _ in range(draw(st.integers(1, 2)))]
        elif key == "function_call":
            keys = draw(st.sets(st.sampled_from(["name", "arguments"])))
            delta[key] = {k: draw(TEXT) for k in keys}
        else:
            delta[key] = draw(TEXT)
    return delta


def chunk(route: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    obj = "chat.completion.chunk" if route == "chat" else "text_completion"
    return {
        "id": f"{route}-1",
        "object": obj,
        "created": 7,
        "model": "m",
        "choices": choices,
        **extra,
    }


@st.composite
def chat_events(draw: st.DrawFn, ids: bool) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 2))
    events = []
    started: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        role = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        extra: dict[str, Any] = {"prompt_token_ids": draw(IDS) if ids else None}
        events.append(chunk("chat", [role], **extra))
    if draw(st.booleans()):  # vLLM's echo chunks: the last message's text, no IDs
        for i in range(n):
            echo = {"index": i, "delta": {"content": draw(TEXT)}, "logprobs": None}
            events.append(chunk("chat", [echo | {"finish_reason": None}]))
    for _ in range(draw(st.integers(0, 6))):
        choices = []
        for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2, unique=True)):
            kind = draw(st.integers(0, 5))
            choice: dict[str, Any] = {
                "index": i,
                "delta": {} if kind == 0 else chat_delta(draw, started[i]),
                "logprobs": None if kind == 0 else draw(chat_logprobs()),
                "finish_reason": None,
            }
            if kind == 1:
                choice["finish_reason"] = draw(FINISH)
                choice["stop_reason"] = draw(STOP)
            choice["token_ids"] = draw(IDS) if ids else None
            choices.append(choice)
        extra = {}
        if draw(st.integers(0, 5)) == 0:
            extra["usage"] = {"prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6}
        events.append(chunk("chat", choices, **extra))
    return events


@st.composite
def completion_events(draw: st.DrawFn, ids: bool) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 2))
    events, first = [], set()
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, n - 1))
        lp = None
        if draw(st.booleans()):
            k = draw(st.integers(0, 2))
            lp = {
                "text_offset": draw(st.lists(st.integers(0, 99), min_size=k, max_size=k)),
                "token_logprobs": draw(
                    st.lists(st.one_of(st.none(), FLOAT), min_size=k, max_size=k)
                ),
                "tokens": draw(st.lists(TEXT, min_size=k, max_size=k)),
                "top_logprobs": draw(
                    st.lists(
                        st.one_of(st.none(), st.dictionaries(TEXT, FLOAT, max_size=2)),
                        min_size=k,
                        max_size=k,
                    )
                ),
            }
        choice = {
            "index": i,
            "text": draw(TEXT),
            "logprobs": lp,
            "finish_reason": draw(st.one_of(st.none(), FINISH)),
            "stop_reason": draw(STOP),
            "prompt_token_ids": draw(IDS) if ids and i not in first else None,
            "token_ids": draw(IDS) if ids else None,
        }
        first.add(i)
        events.append(chunk("completion", [choice], usage=None))
    return events


FAULTS = st.sampled_from(
    [
        "ids",
        "json",
        "error",
        "audio",
        "choice_field",
        "custom_tool",
        "tool_type",
        "content_type",
        "tool_calls_type",
        "tool_index",
        "logprobs_shape",
        "finish_type",
        "choices_type",
        "delta_type",
        "stop_type",
        "usage_type",
        "text_type",
        "no_done",
        "tool_no_id",
    ]
)


def apply_fault(draw: st.DrawFn, events: list[Any], fault: str) -> bool:
    """Mutate one event in place; returns False when the stream should end without [DONE]."""
    if fault == "no_done":
        return False
    at = draw(st.integers(0, len(events) - 1))
    ev = events[at]
    c = ev["choices"][0] if ev.get("choices") else {}
    delta = c.get("delta")
    if fault == "ids":
        bad = draw(BAD_IDS)
        if bad == "missing":
            c.pop("token_ids", None)
        else:
            c["token_ids"] = bad
    elif fault == "json":
        events[at] = dumps(ev)[: draw(st.integers(0, 30))] + b"}x"
    elif fault == "error":
        err = {
            "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
        }
        events.insert(at, json.dumps(err).encode())
    elif fault == "audio" and delta is not None:
        delta["audio"] = {"id": "a"}
    elif fault == "choice_field":
        c["weird"] = draw(st.sampled_from([1, None, "x"]))
    elif fault in ("custom_tool", "tool_type", "tool_index", "tool_no_id") and delta is not None:
        tool = {"index": 0, "id": "call_z", "type": "function", "function": {"name": "f"}}
        if fault == "custom_tool":
            tool["custom"] = {"input": "x"}
        elif fault == "tool_type":
            tool["type"] = "custom"
        elif fault == "tool_index":
            tool["index"] = draw(st.sampled_from([-1, 1.5, None, "0"]))
        else:
            tool = {"index": 5, "function": {"arguments": "{}"}}
        delta["tool_calls"] = [tool]
    elif fault == "content_type" and delta is not None:
        delta["content"] = draw(st.sampled_from([5, [], {}, True]))
    elif fault == "tool_calls_type" and delta is not None:
        delta["tool_calls"] = {}
    elif fault == "logprobs_shape":
        c["logprobs"] = draw(st.sampled_from(["x", [], {"content": 1}, {"tokens": {}}]))
    elif fault == "finish_type":
        c["finish_reason"] = 3
    elif fault == "choices_type":
        ev["choices"] = {}
    elif fault == "delta_type" and delta is not None:
        c["delta"] = []
    elif fault == "stop_type":
        c["stop_reason"] = draw(st.sampled_from([1.5, True, [1]]))
    elif fault == "usage_type":
        ev["usage"] = draw(
            st.sampled_from([[], {"completion_tokens": "4"}, {"completion_tokens": -1}])
        )
    elif fault == "text_type" and "text" in c:
        c["text"] = 5
    return True


@st.composite
def stream(draw: st.DrawFn, route: str) -> tuple[dict[str, Any], list[bytes]]:
    opts = draw(OPTIONS)
    ids = draw(st.booleans()) or bool(opts["require_token_ids"])
    events: list[Any] = draw(chat_events(ids) if route == "chat" else completion_events(ids))
    if draw(st.booleans()):
        usage: dict[str, Any] = {
            "prompt_tokens": 5,
            "total_tokens": 9,
            "completion_tokens": draw(st.integers(0, 9)),
        }
        details: Any = draw(st.sampled_from([None, {}, {"cached_tokens": 4}, {"cached_tokens": -1},
                                             {"cached_tokens": "x"}, [], ...]))
        if details is not ...:
            usage["prompt_tokens_details"] = details
        events.append(chunk(route, [], usage=usage, system_fingerprint="fp"))
    done = True
    if draw(st.booleans()):
        done = apply_fault(draw, events, draw(FAULTS))
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    body = b""
    for ev in events:
        if draw(st.integers(0, 7)) == 0:
            body += draw(st.sampled_from([b": ping", b"event: message", b"id: 4"])) + eol
        prefix = draw(st.sampled_from([b"data: ", b"data:"]))
        body += prefix + (ev if isinstance(ev, bytes) else dumps(ev)) + eol + eol
    if done:
        body += b"data: [DONE]" + eol + eol
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=8)))
    reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return opts, reads


def run(cls: Any, route: str, opts: dict[str, Any], reads: list[bytes]) -> dict[str, Any]:
    s = cls(route, **opts)
    result: dict[str, Any] = {"reads": [s.feed(r) for r in reads]}
    result["after"] = s.feed(b"data: {}\n\n")
    result |= {"cached_tokens": s.engine_cached_tokens, "started": s.started}
    return result | end_state(s, opts["assemble"])


@SETTINGS
@given(stream("chat"))
def test_chat_streams_match_the_oracle(case: tuple[dict[str, Any], list[bytes]]) -> None:
    opts, reads = case
    assert run(StreamSession, "chat", opts, reads) == run(
        stream_oracle.StreamSession, "chat", opts, reads
    )


@SETTINGS
@given(stream("completion"))
def test_completion_streams_match_the_oracle(case: tuple[dict[str, Any], list[bytes]]) -> None:
    opts, reads = case
    assert run(StreamSession, "completion", opts, reads) == run(
        stream_oracle.StreamSession, "completion", opts, reads
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=200), st.sets(st.integers(1, 199), max_size=6), OPTIONS)
def test_arbitrary_bytes_match_the_oracle(
    body: bytes, cuts: set[int], opts: dict[str, Any]
) -> None:
    body = b"data: " + body
    points = sorted(c for c in cuts if c < len(body))
    reads = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert run(StreamSession, "chat", opts, reads) == run(
        stream_oracle.StreamSession, "chat", opts, reads
    )
