"""What the engine is asked (request/engine_body.py) and what the session is told, for the
client options whose answer changes once token IDs are asked: include_reasoning and echo."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from narwhal.config import parse_config
from narwhal.request.engine_body import engine_request
from narwhal.request.models import Catalog
from narwhal.request.parse import Parsed, parse_request

MODEL = "m"
MSG = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f"}}]


def parsed(route: str = "chat", **fields: Any) -> Parsed:
    base: dict[str, Any] = {"model": MODEL}
    base |= {"messages": MSG} if route == "chat" else {"prompt": "Say"}
    return parse_request(route, orjson.dumps(base | fields), model=MODEL)


def ask(p: Parsed, token_ids: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the body the engine gets, the session options)."""
    req = engine_request(p, token_ids=token_ids)
    return orjson.loads(req.body), dict(req.session)


def options(drop_usage: bool = False, require_token_ids: bool = True,
            strip_reasoning: bool = False, echo: bool = False,
            model: str | None = None) -> dict[str, Any]:
    return {"drop_usage": drop_usage, "require_token_ids": require_token_ids,
            "strip_reasoning": strip_reasoning, "echo": echo, "model": model}


def test_plain_requests_ask_for_ids_only_where_the_engine_returns_them() -> None:
    for p in (parsed(stream=True), parsed(), parsed("completion", stream=True)):
        body, session = ask(p, True)
        assert body["return_token_ids"] is True and body["stream_interval"] == 1
        assert session["require_token_ids"]
        body, session = ask(p, False)
        assert "return_token_ids" not in body and not session["require_token_ids"]
        assert body["stream"] is True
    _, session = ask(parsed(stream=True))
    assert session == options()
    assert ask(parsed(stream=True), False)[1] == options(drop_usage=True, require_token_ids=False)


def test_include_reasoning_false_asks_with_reasoning_and_strips() -> None:
    body, session = ask(parsed(include_reasoning=False, logprobs=True, stream=True))
    assert "include_reasoning" not in body and body["return_token_ids"] is True
    assert body["logprobs"] is True  # the engine still checks them; the session nulls them
    assert session == options(strip_reasoning=True)
    # An engine without IDs answers the client's own request: nothing to strip.
    body, session = ask(parsed(include_reasoning=False, stream=True), False)
    assert body["include_reasoning"] is False and not session["strip_reasoning"]


@pytest.mark.parametrize("constraint", [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"structured_outputs": {"regex": "a+"}},
    {"guided_json": {"type": "object"}},
    {"tools": TOOLS, "tool_choice": "required"},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
])
def test_include_reasoning_false_with_a_grammar_goes_through(constraint: dict[str, Any]) -> None:
    # vLLM then holds the grammar from the first token: asking with reasoning would change
    # what is generated, so the engine gets the client's request, without IDs.
    body, session = ask(parsed(include_reasoning=False, stream=True, **constraint))
    assert body["include_reasoning"] is False and "return_token_ids" not in body
    assert body["stream_options"] == {"include_usage": True}
    assert session == options(drop_usage=True, require_token_ids=False)


@pytest.mark.parametrize("unconstrained", [
    {"response_format": {"type": "text"}}, {"tools": TOOLS, "tool_choice": "auto"},
])
def test_unconstrained_requests_still_strip(unconstrained: dict[str, Any]) -> None:
    _, session = ask(parsed(include_reasoning=False, **unconstrained))
    assert session == options(strip_reasoning=True)


def test_completion_echo_asks_ids_only_when_the_client_did() -> None:
    # With return_token_ids vLLM echoes "" instead of the prompt text.
    body, session = ask(parsed("completion", echo=True, max_tokens=0, stream=True))
    assert "return_token_ids" not in body and body["max_tokens"] == 0
    assert body["stream_options"] == {"include_usage": True}
    assert session == options(drop_usage=True, require_token_ids=False, echo=True)
    body, session = ask(parsed("completion", echo=True, return_token_ids=True))
    assert body["return_token_ids"] is True and session == options(echo=True)


def test_chat_echo_keeps_ids() -> None:
    body, session = ask(parsed(messages=[*MSG, {"role": "assistant", "content": "Once"}],
                               echo=True))
    assert body["return_token_ids"] is True and session == options(echo=True)


def test_an_alias_goes_to_the_engine_as_the_model_and_comes_back_as_sent() -> None:
    config = parse_config({
        "models": [{"name": MODEL, "aliases": ["short"]}, {"name": "other"}],
        "engines": [{"name": "a", "url": "http://h:1"}]})
    names = Catalog(config).names
    raw = orjson.dumps({"model": "short", "messages": MSG})
    body, session = ask(parse_request("chat", raw, model=names))
    assert body["model"] == MODEL and session == options(model="short")
    # with several models an engine may answer with another of its names: renamed too
    body, session = ask(parse_request("chat", orjson.dumps({"model": "other", "messages": MSG}),
                                      model=names))
    assert body["model"] == "other" and session == options(model="other")
    single = Catalog(parse_config({"model": MODEL,
                                   "engines": [{"name": "a", "url": "http://h:1"}]}))
    _, session = ask(parse_request("chat", orjson.dumps({"model": MODEL, "messages": MSG}),
                                   model=single.names))
    assert session == options()  # one model: the engine's own answer, no rename


def test_the_prefix_index_asks_for_usage_and_drops_it_unless_the_client_asked() -> None:
    def with_usage(p: Parsed) -> tuple[dict[str, Any], dict[str, Any]]:
        req = engine_request(p, token_ids=True, usage=True)
        return orjson.loads(req.body), dict(req.session)

    body, session = with_usage(parsed(stream=True))
    assert body["stream_options"] == {"include_usage": True} and session["drop_usage"]
    body, session = with_usage(parsed(stream=True, stream_options={"include_usage": True}))
    assert body["stream_options"] == {"include_usage": True} and not session["drop_usage"]
    body, session = with_usage(parsed())  # non-streaming clients get usage anyway
    assert body["stream_options"] == {"include_usage": True} and not session["drop_usage"]
    assert "stream_options" not in ask(parsed(stream=True))[0]  # without the index: as before
