"""Request validation (admission/validate.py): each rule's code, status and param, and order."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.errors import Refusal
from narwhal.request.parse import MAX_DEPTH, Parsed, parse_request
from narwhal.server.responses import refusal_response

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
CMPL: dict[str, Any] = {"model": MODEL, "prompt": "Once upon a time"}


def parse(route: str, body: Any) -> Parsed:
    raw = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    return parse_request(route, raw, model=MODEL)


def refusal(route: str, body: Any) -> Refusal:
    with pytest.raises(Refusal) as info:
        parse(route, body)
    return info.value


def chat(**fields: Any) -> dict[str, Any]:
    return {**CHAT, **fields}


def cmpl(**fields: Any) -> dict[str, Any]:
    return {**CMPL, **fields}


def check(ref: Refusal, code: str, status: int, param: str | None) -> None:
    assert (ref.code, ref.row.status, ref.param) == (code, status, param), ref


# -- JSON ----------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"", b"{", b"{'model': 1}", b'{"model": "m",}', b"nul", b'{"a": NaN}', b'{"a": 1e400}',
    b'{"a": "\xff\xfe"}', b'{"a": "\\ud800"}', b"\xef\xbb\xbf{}", b'{"a": 1} trailing',
    b'{"a": "tab\tinside"}', "{\"model\": \"caf\u00e9\"}".encode("latin-1"),
])
@pytest.mark.parametrize("route", ["chat", "completion"])
def test_unparseable_is_invalid_json(route: str, raw: bytes) -> None:
    check(refusal(route, raw), "invalid_json", 400, None)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1025, 100_000])
def test_deep_nesting_is_invalid_json(depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    check(refusal("chat", deep), "invalid_json", 400, None)
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "x": %s}' % (
        MODEL.encode(), deep)
    check(refusal("chat", body), "invalid_json", 400, None)


@pytest.mark.parametrize("depth", [3, MAX_DEPTH + 1, 1000])
def test_deep_completion_prompt_is_refused(depth: int) -> None:
    deep = b"[" * depth + b"1" + b"]" * depth
    head = b'{"model": "%s", ' % MODEL.encode()
    check(refusal("completion", head + b'"prompt": ' + deep + b"}"),
          "invalid_request", 400, "prompt[0][0]")
    check(refusal("completion", head + b'"prompt": [[1], ' + deep + b"]}"),
          "invalid_request", 400, "prompt[1][0]")
    if depth > MAX_DEPTH:  # the same nesting outside the prompt is walked
        check(refusal("completion", head + b'"prompt": "p", "x": ' + deep + b"}"),
              "invalid_json", 400, None)


def test_deep_prompt_field_on_chat_is_walked() -> None:
    deep = orjson.loads(b"[" * 300 + b"]" * 300)
    check(refusal("chat", chat(prompt=deep)), "invalid_json", 400, None)


def test_nesting_at_the_limit_passes_through() -> None:
    depth = MAX_DEPTH - 1  # plus the body object itself
    body = chat(extra=orjson.loads(b"[" * depth + b"]" * depth))
    assert parse("chat", body).body["extra"]


def test_many_brackets_in_strings_are_not_nesting() -> None:
    text = "{[" * 5000
    p = parse("chat", chat(messages=[{"role": "user", "content": text}]))
    assert p.prompt_text_chars == len(text)


@pytest.mark.parametrize("body", [[], [CHAT], "text", 3, None, True])
@pytest.mark.parametrize("route", ["chat", "completion"])
def test_non_object_is_invalid_request_without_param(route: str, body: Any) -> None:
    check(refusal(route, body), "invalid_request", 400, None)


# -- shape and field types -----------------------------------------------------------------

CHAT_SHAPE = [
    ({"messages": CHAT["messages"]}, "model"),  # missing model
    (chat(model=None), "model"),
    (chat(model=3), "model"),
    (chat(model=["m"]), "model"),
    ({"model": MODEL}, "messages"),
    (chat(messages=None), "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages={"role": "user"}), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"role": "user", "content": "a"}, {"content": "b"}]), "messages[1].role"),
    (chat(messages=[{"role": "user"}, {"role": 5, "content": "b"}]), "messages[1].role"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": {"type": "text"}}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": ["hi"]}]), "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}, {"text": "c"}]}]),
     "messages[0].content[2].type"),
    (chat(messages=[{"role": "user", "content": [{"type": None}]}]), "messages[0].content[0].type"),
    (chat(stream="yes"), "stream"),
    (chat(stream=1), "stream"),
    (chat(stream_options=True), "stream_options"),
    (chat(stream_options=[]), "stream_options"),
    (chat(stream_options={"include_usage": True}), "stream_options"),  # vLLM: stream only
    (chat(stream=False, stream_options={"include_usage": False}), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "true"}), "stream_options.include_usage"),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (chat(stream=True, stream_options={"continuous_usage_stats": 0}),
     "stream_options.continuous_usage_stats"),
    (chat(n=True), "n"), (chat(n=1.0), "n"), (chat(n="3"), "n"), (chat(n=0), "n"),
    (chat(n=-2), "n"),
    (chat(best_of=False), "best_of"), (chat(best_of=1.5), "best_of"), (chat(best_of=0), "best_of"),
    (chat(max_tokens=True), "max_tokens"), (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens="3"), "max_tokens"), (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=2**64), "max_tokens"),  # beyond u64 orjson yields a float
    (chat(max_completion_tokens=False), "max_completion_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(return_token_ids="true"), "return_token_ids"),
    (chat(return_token_ids=1), "return_token_ids"),
    (chat(echo="true"), "echo"), (chat(echo=True, max_tokens=0), "max_tokens"),  # chat: >= 1
    (chat(include_reasoning=0), "include_reasoning"),
    (chat(include_reasoning="false"), "include_reasoning"),
    (chat(logprobs=1), "logprobs"), (chat(logprobs="true"), "logprobs"),
    (chat(top_logprobs=True), "top_logprobs"), (chat(top_logprobs=2.0), "top_logprobs"),
    (chat(top_logprobs=-2), "top_logprobs"),
    (chat(tools={"type": "function"}), "tools"),
    (chat(tools=[{"type": "function"}, "fn"]), "tools[1]"),
    (chat(tools=[{"type": "function"}, {"function": {}}]), "tools[1].type"),
    (chat(tools=[{"type": 1}]), "tools[0].type"),
    (chat(tool_choice=1), "tool_choice"), (chat(tool_choice=["auto"]), "tool_choice"),
    (chat(tool_choice=True), "tool_choice"),
    (chat(modalities="text"), "modalities"), (chat(modalities=["text", 1]), "modalities"),
    (chat(audio="alloy"), "audio"), (chat(audio=[]), "audio"),
]

CMPL_SHAPE = [
    ({"prompt": "x"}, "model"),
    (cmpl(model=None), "model"),
    ({"model": MODEL}, "prompt"),
    (cmpl(prompt=None), "prompt"),
    (cmpl(prompt=[]), "prompt"),
    (cmpl(prompt=5), "prompt"),
    (cmpl(prompt={"text": "x"}), "prompt"),
    (cmpl(prompt=[True, 1]), "prompt[0]"),
    (cmpl(prompt=[1.5]), "prompt[0]"),
    (cmpl(prompt=[None]), "prompt[0]"),
    (cmpl(prompt=["a", 1]), "prompt[1]"),
    (cmpl(prompt=[1, 2, True]), "prompt[2]"),
    (cmpl(prompt=[1, 2, False]), "prompt[2]"),
    (cmpl(prompt=[1, 2.0]), "prompt[1]"),
    (cmpl(prompt=[1, "2"]), "prompt[1]"),
    (cmpl(prompt=[1, -1]), "prompt[1]"),
    (cmpl(prompt=[1, [2]]), "prompt[1]"),
    (cmpl(prompt=[[1], [2, True]]), "prompt[1][1]"),
    (cmpl(prompt=[[1], []]), "prompt[1]"),
    (cmpl(prompt=[[1], 2]), "prompt[1]"),
    (cmpl(prompt=[[1], ["a"]]), "prompt[1][0]"),
    (cmpl(stream="false"), "stream"),
    (cmpl(stream_options=1), "stream_options"),
    (cmpl(stream_options={"include_usage": True}), "stream_options"),  # vLLM: stream only
    (cmpl(n=True), "n"), (cmpl(best_of="2"), "best_of"), (cmpl(max_tokens=0), "max_tokens"),
    (cmpl(return_token_ids=0), "return_token_ids"),
    (cmpl(echo=1), "echo"), (cmpl(echo=False, max_tokens=0), "max_tokens"),
    (cmpl(echo=True, max_tokens=False), "max_tokens"),
    (cmpl(echo=True, max_tokens=0.0), "max_tokens"),
    (cmpl(echo=True, max_tokens=-1), "max_tokens"),
    (cmpl(logprobs=True), "logprobs"), (cmpl(logprobs=-1), "logprobs"),
    (cmpl(logprobs=1.0), "logprobs"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_SHAPE)
def test_chat_shape(body: dict[str, Any], param: str) -> None:
    check(refusal("chat", body), "invalid_request", 400, param)


@pytest.mark.parametrize(("body", "param"), CMPL_SHAPE)
def test_completion_shape(body: dict[str, Any], param: str) -> None:
    check(refusal("completion", body), "invalid_request", 400, param)


@pytest.mark.parametrize("field", [
    "stream", "stream_options", "n", "best_of", "max_tokens", "max_completion_tokens",
    "return_token_ids", "logprobs", "top_logprobs", "tools", "tool_choice", "modalities",
    "audio", "echo", "include_reasoning"])
def test_null_router_fields_count_as_absent(field: str) -> None:
    p = parse("chat", chat(**{field: None}))
    assert p.stream is False and p.max_tokens is None and p.tools == 0
    assert p.echo is False and p.include_reasoning is True


@pytest.mark.parametrize(("body", "route"), [
    (chat(messages=[{"role": "assistant", "tool_calls": []}]), "chat"),  # no content
    (chat(messages=[{"role": "user", "content": None}]), "chat"),
    (chat(messages=[{"role": "user", "content": []}]), "chat"),
    (chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]), "chat"),
    (chat(top_logprobs=-1), "chat"), (chat(top_logprobs=0), "chat"),
    (chat(tool_choice="auto"), "chat"),
    (chat(tool_choice={"type": "function", "function": {"name": "f"}}), "chat"),
    (chat(modalities=["text"]), "chat"),
    (chat(stream_options={}), "chat"),
    (chat(n=1, best_of=1, max_tokens=2**64 - 1), "chat"),  # largest integer orjson keeps
    (chat(unknown={"deep": [1, {"x": None}]}, temperature="hot"), "chat"),  # passes through
    (cmpl(prompt=""), "completion"),
    (cmpl(prompt=["a", ""]), "completion"),
    (cmpl(prompt=[0]), "completion"),
    (cmpl(logprobs=0), "completion"),
    (cmpl(tools="not interpreted on completions", modalities=5), "completion"),
    (cmpl(messages="not interpreted on completions"), "completion"),
    (cmpl(include_reasoning="not interpreted on completions"), "completion"),
    (cmpl(echo=True, max_tokens=0), "completion"),  # vLLM answers the prompt alone
])
def test_accepted(body: dict[str, Any], route: str) -> None:
    assert parse(route, body).body == body


# -- model, sampling width, unsupported options --------------------------------------------

@pytest.mark.parametrize("route,base", [("chat", CHAT), ("completion", CMPL)])
def test_model_not_found(route: str, base: dict[str, Any]) -> None:
    ref = refusal(route, {**base, "model": "gpt-4o"})
    check(ref, "model_not_found", 404, "model")
    assert ref.message == "The model `gpt-4o` does not exist."
    assert ref.row.type == "invalid_request_error"


def test_model_name_in_message_is_bounded() -> None:
    ref = refusal("chat", chat(model="x" * 10_000))
    assert len(ref.message) < 400


@pytest.mark.parametrize("route,base", [("chat", CHAT), ("completion", CMPL)])
@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"n": 2, "best_of": 2}, "n"),
    ({"n": 1, "best_of": 2}, "best_of"), ({"n": 2, "stream": True}, "n"),
])
def test_sampling_width(route: str, base: dict[str, Any], fields: dict[str, Any],
                        param: str) -> None:
    ref = refusal(route, {**base, **fields})
    check(ref, "invalid_sampling_width", 400, param)
    assert "Invalid sampling width" in ref.message


TOOL_FN = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize(("fields", "param"), [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"modalities": ["audio"], "audio": {"voice": "alloy"}}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"audio": {}, "tools": [{"type": "custom"}]}, "audio"),
    ({"tools": [TOOL_FN, {"type": "custom", "custom": {"name": "g"}}]}, "tools[1].type"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"modalities": ["text", "audio"], "stream": False}, "modalities"),
])
def test_unsupported_non_streaming_options(fields: dict[str, Any], param: str) -> None:
    check(refusal("chat", chat(**fields)), "unsupported_option", 400, param)


@pytest.mark.parametrize("fields", [
    {"modalities": ["text", "audio"]}, {"audio": {"voice": "alloy"}},
    {"tools": [{"type": "custom"}]},
])
def test_streaming_requests_keep_unsupported_options(fields: dict[str, Any]) -> None:
    assert parse("chat", chat(stream=True, **fields)).stream is True


def test_function_tools_and_text_modality_are_supported() -> None:
    p = parse("chat", chat(tools=[TOOL_FN, TOOL_FN], modalities=["text"]))
    assert p.tools == 2


# -- order of checks -----------------------------------------------------------------------

@pytest.mark.parametrize(("route", "body", "code", "param"), [
    ("chat", chat(model="other", n=2), "model_not_found", "model"),
    ("chat", chat(model="other", stream="x"), "invalid_request", "stream"),
    ("chat", chat(model=5, messages=[]), "invalid_request", "model"),
    ("chat", chat(messages=[], stream="x"), "invalid_request", "messages"),
    ("chat", chat(stream="x", n="y"), "invalid_request", "stream"),
    ("chat", chat(n=2, audio={"voice": "a"}), "invalid_sampling_width", "n"),
    ("chat", chat(model="other", audio={"voice": "a"}), "model_not_found", "model"),
    ("chat", chat(n=2, audio=3), "invalid_request", "audio"),
    ("chat", chat(modalities=["audio"], tools=[{"type": 1}]), "invalid_request", "tools[0].type"),
    ("completion", cmpl(model="other", best_of=4), "model_not_found", "model"),
    ("completion", cmpl(model="other", prompt=[]), "invalid_request", "prompt"),
])
def test_order_of_checks(route: str, body: dict[str, Any], code: str, param: str) -> None:
    ref = refusal(route, body)
    assert (ref.code, ref.param) == (code, param)


# -- what the router reads -----------------------------------------------------------------

def test_parsed_chat_fields() -> None:
    body = chat(
        messages=[
            {"role": "system", "content": "abcd"},
            {"role": "user", "content": [{"type": "text", "text": "efg"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "fn", "arguments": "{}"}}]},
        ],
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
        max_tokens=5, max_completion_tokens=7, return_token_ids=True, logprobs=True,
        tools=[TOOL_FN])
    p = parse("chat", body)
    assert p.body == body and p.route == "chat" and p.model == MODEL
    assert (p.stream, p.include_usage, p.continuous_usage, p.return_token_ids, p.logprobs) == (
        True, True, True, True, True)
    assert p.max_tokens == 7  # max_completion_tokens wins
    assert p.tools == 1 and p.messages == 3 and p.prompt_token_ids == 0
    assert p.prompt_text_chars == 4 + 3 + 2 + 2 + len(orjson.dumps([TOOL_FN]))


def test_parsed_defaults() -> None:
    p = parse("chat", CHAT)
    assert (p.stream, p.include_usage, p.continuous_usage, p.return_token_ids, p.logprobs,
            p.max_tokens, p.tools, p.messages, p.prompt_text_chars) == (
        False, False, False, False, False, None, 0, 1, 2)
    assert parse("chat", chat(max_tokens=9)).max_tokens == 9


def test_parsed_echo_and_include_reasoning() -> None:
    p = parse("chat", chat(echo=True, include_reasoning=False))
    assert (p.echo, p.include_reasoning) == (True, False)
    assert parse("chat", chat(include_reasoning=True)).include_reasoning is True
    p = parse("completion", cmpl(echo=True, max_tokens=0))
    assert (p.echo, p.max_tokens) == (True, 1)  # the engine generates one token it hides
    assert p.body["max_tokens"] == 0  # the engine gets the client's value
    assert parse("completion", cmpl(echo=True, max_tokens=3)).max_tokens == 3
    assert parse("completion", cmpl(include_reasoning=False)).include_reasoning is True


@pytest.mark.parametrize(("prompt", "chars", "ids"), [
    ("hello", 5, 0), (["ab", "cde"], 5, 0), ([1, 2, 3], 0, 3), ([[1, 2], [3]], 0, 3),
])
def test_parsed_completion_prompt(prompt: Any, chars: int, ids: int) -> None:
    p = parse("completion", cmpl(prompt=prompt, logprobs=0, max_tokens=4,
                                 max_completion_tokens=99))
    assert (p.prompt_text_chars, p.prompt_token_ids, p.messages) == (chars, ids, 0)
    assert p.logprobs is True and p.max_tokens == 4  # max_completion_tokens is chat-only


def test_duplicate_keys_last_wins() -> None:
    """Documented: duplicate keys are not an error; the last occurrence wins (as in vLLM)."""
    raw = b'{"model": "other", "model": "%s", "prompt": "x", "n": 5, "n": 1}' % MODEL.encode()
    p = parse("completion", raw)
    assert p.model == MODEL and p.body["n"] == 1
    raw = b'{"model": "%s", "prompt": "x", "n": 1, "n": 2}' % MODEL.encode()
    check(refusal("completion", raw), "invalid_sampling_width", 400, "n")


def test_huge_numbers() -> None:
    check(refusal("chat", b'{"model": "%s", "n": 1e999}' % MODEL.encode()),
          "invalid_json", 400, None)  # infinity is not JSON
    def body(n: bytes) -> bytes:
        return b'{"model": "%s", "messages": [{"role": "u", "content": "x"}], "n": %s}' % (
            MODEL.encode(), n)

    # Documented orjson behaviour: integers beyond 64 bits parse as floats (a wrong type here),
    # and beyond the double range as infinity (not JSON).
    check(refusal("chat", body(b"9" * 40)), "invalid_request", 400, "n")
    check(refusal("chat", body(b"-" + b"9" * 20)), "invalid_request", 400, "n")
    check(refusal("chat", body(b"9" * 400)), "invalid_json", 400, None)
    p = parse("completion", cmpl(prompt=[2**63 - 1, 2**64 - 1]))
    assert p.prompt_token_ids == 2


def test_unicode_survives() -> None:
    body = chat(messages=[{"role": "user", "content": "naïve ☃ 🐳"}])
    p = parse("chat", body)
    assert p.body == body and p.prompt_text_chars == len("naïve ☃ 🐳")


def test_unknown_route_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        parse_request("embeddings", b"{}", model=MODEL)


def test_large_token_prompt_is_fast_enough() -> None:
    raw = orjson.dumps(cmpl(prompt=[[i % 50_000 for i in range(1000)] for _ in range(200)]))
    assert parse("completion", raw).prompt_token_ids == 200_000


# -- property: anything in, a Refusal or a Parsed out --------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=20,
)
FIELDS = ["model", "messages", "prompt", "stream", "stream_options", "n", "best_of",
          "max_tokens", "max_completion_tokens", "return_token_ids", "logprobs",
          "top_logprobs", "tools", "tool_choice", "modalities", "audio", "echo",
          "include_reasoning"]


def _mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Plausible values most of the time, anything JSON now and then."""
    return st.integers(0, 7).flatmap(lambda i: json_values if i == 0 else valid)


_small = st.integers(min_value=-1, max_value=3)
_part = st.fixed_dictionaries({"type": _mostly(st.sampled_from(["text", "image_url"]))},
                              optional={"text": _mostly(st.text(max_size=8))})
_message = st.fixed_dictionaries(
    {"role": _mostly(st.sampled_from(["system", "user", "assistant"]))},
    optional={"content": _mostly(st.none() | st.text(max_size=8) | st.lists(_part, max_size=3)),
              "tool_calls": json_values})
_tool = st.fixed_dictionaries({"type": _mostly(st.sampled_from(["function", "custom"]))},
                              optional={"function": json_values})
OPTIONAL = {
    "stream": _mostly(st.none() | st.booleans()),
    "stream_options": _mostly(st.none() | st.fixed_dictionaries({}, optional={
        "include_usage": _mostly(st.booleans()),
        "continuous_usage_stats": _mostly(st.booleans())})),
    "n": _mostly(_small), "best_of": _mostly(_small), "max_tokens": _mostly(_small),
    "max_completion_tokens": _mostly(_small), "return_token_ids": _mostly(st.booleans()),
    "logprobs": _mostly(st.booleans() | _small), "top_logprobs": _mostly(_small),
    "tools": _mostly(st.lists(_tool, max_size=3)),
    "tool_choice": _mostly(st.sampled_from(["auto", "none"])),
    "modalities": _mostly(st.lists(st.sampled_from(["text", "audio"]), max_size=2)),
    "audio": _mostly(st.none() | st.just({"voice": "alloy"})),
    "echo": _mostly(st.none() | st.booleans()),
    "include_reasoning": _mostly(st.none() | st.booleans()),
}
_model = _mostly(st.sampled_from([MODEL, MODEL, MODEL, "other"]))
_prompt = _mostly(st.text(max_size=8) | st.lists(st.text(max_size=4), max_size=3)
                  | st.lists(st.integers(min_value=-1, max_value=9), max_size=4)
                  | st.lists(st.lists(st.integers(min_value=0, max_value=9), max_size=3),
                             max_size=3))
_BRANCHES = [
    st.fixed_dictionaries({"model": _model, "messages": _mostly(st.lists(_message, max_size=3))},
                          optional=OPTIONAL),
    st.fixed_dictionaries({"model": _model, "prompt": _prompt}, optional=OPTIONAL),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8),
    json_values,
]
bodies = st.sampled_from([0, 0, 0, 0, 1, 1, 1, 1, 2, 3]).flatmap(lambda i: _BRANCHES[i])


def _outcome(route: str, raw: bytes) -> None:
    try:
        p = parse_request(route, raw, model=MODEL)
    except Refusal as ref:
        status, headers, body = refusal_response(ref)
        env = orjson.loads(body)["error"]
        assert status in (400, 404) and env["code"] == ref.code
        assert env["type"] == "invalid_request_error" and isinstance(env["message"], str)
        assert env["param"] is None or isinstance(env["param"], str)
        assert headers == []
    else:
        assert isinstance(p.body, dict) and p.model == MODEL
        assert p.prompt_text_chars >= 0 and p.prompt_token_ids >= 0


@settings(max_examples=400, deadline=None)
@given(route=st.sampled_from(["chat", "completion"]), body=bodies)
def test_random_bodies_only_refuse(route: str, body: Any) -> None:
    _outcome(route, orjson.dumps(body))


@settings(max_examples=200, deadline=None)
@given(route=st.sampled_from(["chat", "completion"]), raw=st.binary(max_size=64))
def test_random_bytes_only_refuse(route: str, raw: bytes) -> None:
    _outcome(route, raw)
