"""Builders for engine streams used by the stream tests (vLLM 0.32 shapes, compact JSON)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from narwhal._narwhal_fast import StreamSession
from reference import stream_oracle

IMPLS = {"rust": StreamSession, "oracle": stream_oracle.StreamSession}
DONE = b"data: [DONE]\n\n"


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def chat(choices: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": choices,
        **top,
    }


def completion(choices: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": choices,
        "usage": None,
        **top,
    }


def ch(delta: dict[str, Any] | None = None, index: int = 0, **kw: Any) -> dict[str, Any]:
    """A chat choice in vLLM's key order."""
    return {
        "index": index,
        "delta": {} if delta is None else delta,
        "logprobs": None,
        "finish_reason": None,
        **kw,
    }


def cc(text: str | None, index: int = 0, **kw: Any) -> dict[str, Any]:
    """A completion choice in vLLM's key order."""
    base = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    return base | kw


def role(index: int = 0, prompt_ids: list[int] | None = None) -> dict[str, Any]:
    return chat([ch({"role": "assistant", "content": ""}, index)], prompt_token_ids=prompt_ids)


def usage_frame(route: str = "chat", completion_tokens: int = 3, **extra: Any) -> dict[str, Any]:
    usage = {
        "prompt_tokens": 5,
        "total_tokens": 5 + completion_tokens,
        "completion_tokens": completion_tokens,
        **extra,
    }
    make = chat if route == "chat" else completion
    frame = make([], usage=usage, system_fingerprint="fp-1")
    return frame


def sse(*events: dict[str, Any] | bytes, done: bool = True) -> bytes:
    out = b"".join(b"data: " + (e if isinstance(e, bytes) else dumps(e)) + b"\n\n" for e in events)
    return out + (DONE if done else b"")


def session(impl: str, route: str = "chat", **opts: Any) -> Any:
    defaults = {
        "assemble": False,
        "expose_token_ids": False,
        "drop_usage": False,
        "require_token_ids": True,
    }
    return IMPLS[impl](route, **(defaults | opts))


def assemble(impl: str, body: bytes, route: str = "chat", **opts: Any) -> dict[str, Any]:
    s = session(impl, route, assemble=True, **opts)
    out, _, state = s.feed(body)
    assert (out, state) == (b"", 1), s.failure
    result: dict[str, Any] = json.loads(s.finish())
    return result


def finish_error(impl: str, body: bytes, route: str = "chat", **opts: Any) -> tuple[str, str]:
    s = session(impl, route, assemble=True, **opts)
    s.feed(body)
    try:
        s.finish()
    except ValueError as e:
        return e.code, e.message  # type: ignore[attr-defined]
    raise AssertionError("finish() did not raise")


def end_state(s: Any, assemble: bool) -> dict[str, Any]:
    """What a session shows once fed (for comparing the Rust session with its oracle): its
    failure code, events, counts and the engine's figures, and the assembled answer (or the
    code ``finish`` raised) when ``assemble``."""
    state: dict[str, Any] = {
        "failure": s.failure and s.failure[0],
        "events": s.events,
        "output_tokens": s.output_tokens,
        "engine_error": s.engine_error,
        "usage_tokens": s.engine_usage_completion_tokens,
        "prompt_tokens": s.engine_prompt_tokens,
    }
    if assemble:
        try:
            state["finish"] = s.finish()
        except ValueError as e:
            state["finish"] = getattr(e, "code", "no code")
    return state
