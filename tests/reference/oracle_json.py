"""Errors and JSON helpers shared by the stream oracle modules (tests only)."""

from __future__ import annotations

import json
from typing import Any

U64_MAX = 2**64 - 1
OUTPUT_KEYS = (
    "content",
    "reasoning",
    "reasoning_content",
    "refusal",
    "tool_calls",
    "function_call",
)
CHOICE_KEYS = frozenset({
    "index",
    "delta",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "matched_stop",
    "token_ids",
    "prompt_token_ids",
})
"""A streamed choice's fields the session knows (any other with a value is kept as is when
assembling, and makes an answer not resumable)."""


class StreamError(ValueError):
    """A failed or unassemblable stream; ``code`` is the public error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def malformed(message: str) -> StreamError:
    return StreamError("malformed_engine_output", message)


def unsupported(message: str) -> StreamError:
    return StreamError("unsupported_engine_field", message)


def noun(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a Boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    return "a list" if isinstance(v, list) else "an object"


def want(v: object, kind: type, what: str) -> Any:
    """v must be null or of ``kind``."""
    if v is not None and not isinstance(v, kind):
        raise malformed(f"{what} must be {noun(kind())}, got {noun(v)}")
    return v


def is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX


def delta_of(choice: dict[str, Any]) -> dict[str, Any]:
    return choice.get("delta") or {}


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
