"""What the engine is asked (request/engine_body.py) and what the session is told, for the
client options whose answer changes once token IDs are asked: include_reasoning and echo."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from narwhal.request.engine_body import asks_token_ids, engine_body, session_options
from narwhal.request.parse import Parsed, parse_request

MODEL = "m"
MSG = [{"role": "user", "content": "hi"}]


def parsed(route: str = "chat", **fields: Any) -> Parsed:
    base: dict[str, Any] = {"model": MODEL}
    base |= {"messages": MSG} if route == "chat" else {"prompt": "Say"}
    return parse_request(route, orjson.dumps(base | fields), model=MODEL)


def sent(p: Parsed, token_ids: bool = True) -> dict[str, Any]:
    body, _ = engine_body(p, token_ids=token_ids)
    out: dict[str, Any] = orjson.loads(body)
    return out


def test_plain_requests_ask_ids_and_keep_todays_session() -> None:
    p = parsed(stream=True)
    assert sent(p)["return_token_ids"] is True
    assert session_options(p, token_ids=True) == {
        "require_token_ids": True, "strip_reasoning": False, "echo": False}
    assert session_options(p, token_ids=False)["require_token_ids"] is False


def test_include_reasoning_false_asks_with_reasoning_and_strips() -> None:
    p = parsed(include_reasoning=False, logprobs=True, stream=True)
    body = sent(p)
    assert "include_reasoning" not in body and body["return_token_ids"] is True
    assert body["logprobs"] is True  # the engine still validates them; the session nulls them
    assert session_options(p, token_ids=True) == {
        "require_token_ids": True, "strip_reasoning": True, "echo": False}
    # An engine without IDs answers the client's own request: nothing to strip.
    assert sent(p, token_ids=False)["include_reasoning"] is False
    assert session_options(p, token_ids=False)["strip_reasoning"] is False


@pytest.mark.parametrize("constraint", [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"structured_outputs": {"regex": "a+"}},
    {"guided_json": {"type": "object"}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
    {"tools": [{"type": "function", "function": {"name": "f"}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}}},
])
def test_include_reasoning_false_with_a_grammar_is_passed_through(
    constraint: dict[str, Any],
) -> None:
    # vLLM then applies the grammar from the first token: asking with reasoning would
    # change what is generated, so the engine gets the client's request and no IDs.
    p = parsed(include_reasoning=False, stream=True, **constraint)
    body, drop_usage = engine_body(p, token_ids=True)
    decoded = orjson.loads(body)
    assert decoded["include_reasoning"] is False and "return_token_ids" not in decoded
    assert decoded["stream_options"] == {"include_usage": True} and drop_usage
    assert session_options(p, token_ids=True) == {
        "require_token_ids": False, "strip_reasoning": False, "echo": False}


@pytest.mark.parametrize("unconstrained", [
    {"response_format": {"type": "text"}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
])
def test_unconstrained_requests_still_strip(unconstrained: dict[str, Any]) -> None:
    p = parsed(include_reasoning=False, **unconstrained)
    assert asks_token_ids(p, True) and session_options(p, token_ids=True)["strip_reasoning"]


def test_completion_echo_asks_ids_only_when_the_client_did() -> None:
    # With return_token_ids vLLM echoes "" instead of the prompt text.
    p = parsed("completion", echo=True, max_tokens=0, stream=True)
    body, drop_usage = engine_body(p, token_ids=True)
    decoded = orjson.loads(body)
    assert "return_token_ids" not in decoded and decoded["max_tokens"] == 0
    assert drop_usage and decoded["stream_options"] == {"include_usage": True}
    assert session_options(p, token_ids=True) == {
        "require_token_ids": False, "strip_reasoning": False, "echo": True}
    p = parsed("completion", echo=True, return_token_ids=True)
    assert sent(p)["return_token_ids"] is True
    assert session_options(p, token_ids=True)["require_token_ids"] is True


def test_chat_echo_keeps_ids() -> None:
    p = parsed(messages=[*MSG, {"role": "assistant", "content": "Once"}], echo=True)
    assert sent(p)["return_token_ids"] is True
    assert session_options(p, token_ids=True) == {
        "require_token_ids": True, "strip_reasoning": False, "echo": True}
