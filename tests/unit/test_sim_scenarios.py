"""Simulator content: token accounting, EOS/length, scenarios, logprobs, stream_interval and
back-pressure merging, driven through the HTTP protocol over a fake transport."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import Harness, event_json, parse_response, run_async

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello there"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "enum": ["a", "b"]}}}}},
]


def stream(body: dict[str, Any], headers: dict[str, str] | None = None, path: str = CHAT,
           **settings: Any) -> list[Any]:
    async def go() -> list[Any]:
        h = Harness(**settings)
        try:
            r, _ = await h.request("POST", path, {"model": "tiny", "stream": True, **body},
                                   headers)
            assert r.status == 200 and r.complete, r.body
            return event_json(r.events)
        finally:
            h.close()

    result: list[Any] = run_async(go())
    return result


def call(body: dict[str, Any], headers: dict[str, str] | None = None, path: str = CHAT,
         **settings: Any) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        h = Harness(**settings)
        try:
            r, _ = await h.request("POST", path, {"model": "tiny", **body}, headers)
            return r.status, r.json()
        finally:
            h.close()

    result: tuple[int, Any] = run_async(go())
    return result


def choices(events: list[Any]) -> list[dict[str, Any]]:
    return [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]


def all_ids(events: list[Any]) -> list[int]:
    return [i for c in choices(events) for i in (c.get("token_ids") or [])]


def test_eos_stop_includes_the_eos_id_with_empty_text() -> None:
    events = stream({"messages": MSG, "max_tokens": 50, "return_token_ids": True,
                     "stream_options": {"include_usage": True}}, output_len="5")
    assert events[-1] == "[DONE]"
    finish = choices(events)[-1]
    assert finish["finish_reason"] == "stop" and finish["delta"] == {"content": ""}
    assert finish["token_ids"] == [2]
    ids = all_ids(events)
    assert len(ids) == 5 and events[-2]["usage"]["completion_tokens"] == 5


def test_length_and_ignore_eos() -> None:
    events = stream({"messages": MSG, "max_tokens": 7, "return_token_ids": True},
                    output_len="100")
    assert choices(events)[-1]["finish_reason"] == "length" and len(all_ids(events)) == 7
    events = stream({"messages": MSG, "max_tokens": 9, "ignore_eos": True,
                     "return_token_ids": True}, output_len="2")
    assert choices(events)[-1]["finish_reason"] == "length" and len(all_ids(events)) == 9
    assert 2 not in all_ids(events)


def test_prompt_ids_usage_and_tokenize_agree() -> None:
    body = {"messages": MSG, "tools": TOOLS}

    async def go() -> tuple[Any, Any]:
        h = Harness()
        try:
            tok, _ = await h.request("POST", "/tokenize", body)
            r, _ = await h.request("POST", CHAT, {**body, "stream": True,
                                                  "return_token_ids": True, "max_tokens": 3,
                                                  "stream_options": {"include_usage": True}})
            return tok.json(), event_json(r.events)
        finally:
            h.close()

    tok, events = run_async(go())
    assert events[0]["prompt_token_ids"] == tok["tokens"]
    assert events[-2]["usage"]["prompt_tokens"] == tok["count"] == len(tok["tokens"])
    assert tok["token_strs"] is None and tok["max_model_len"] == 8192


def test_tool_calls_stream_the_vllm_way() -> None:
    events = stream({"messages": MSG, "tools": TOOLS, "return_token_ids": True},
                    {"X-Sim-Scenario": "tool_calls"})
    frags = [tc for c in choices(events) for tc in c["delta"].get("tool_calls", [])]
    heads = [f for f in frags if "id" in f]
    assert [h["index"] for h in heads] == [0, 1]
    for head in heads:
        assert list(head) == ["id", "type", "index", "function"]
        assert head["id"].startswith("chatcmpl-tool-") and len(head["id"]) == 30
        assert head["type"] == "function" and list(head["function"]) == ["name"]
    args = {0: "", 1: ""}
    for f in frags:
        if "id" not in f:
            assert list(f) == ["index", "function"] and list(f["function"]) == ["arguments"]
            args[f["index"]] += f["function"]["arguments"]
    assert orjson.loads(args[0]) == {"city": "sim", "days": 1}
    assert orjson.loads(args[1]) == {"q": "a"}
    assert choices(events)[-1]["finish_reason"] == "tool_calls"
    assert choices(events)[-1]["delta"] == {}


def test_interleaved_tools_alternate_by_index() -> None:
    events = stream({"messages": MSG}, {"X-Sim-Scenario": "interleaved_tools"})
    order = [tc["index"] for c in choices(events) for tc in c["delta"].get("tool_calls", [])]
    # head0 head1, then the argument fragments of the two calls alternate
    assert order[:10] == [0, 1] * 5


def test_tools_in_body_make_one_call_and_named_choice_stops() -> None:
    status, body = call({"messages": MSG, "tools": TOOLS})
    assert status == 200
    message = body["choices"][0]["message"]
    assert [tc["function"]["name"] for tc in message["tool_calls"]] == ["get_weather"]
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    named = {"type": "function", "function": {"name": "lookup"}}
    status, body = call({"messages": MSG, "tools": TOOLS, "tool_choice": named})
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup"
    assert body["choices"][0]["finish_reason"] == "stop"
    status, body = call({"messages": MSG, "tools": TOOLS, "tool_choice": "none",
                         "max_tokens": 4})
    assert "tool_calls" not in body["choices"][0]["message"]


def test_legacy_function_call() -> None:
    fns = [{"name": "add", "parameters": {"type": "object",
                                          "properties": {"a": {"type": "number"}}}}]
    events = stream({"messages": MSG, "functions": fns})
    deltas = [c["delta"] for c in choices(events)]
    assert deltas[1] == {"function_call": {"name": "add"}}
    args = "".join(d["function_call"].get("arguments", "") for d in deltas
                   if "function_call" in d)
    assert orjson.loads(args) == {"a": 1.5}
    assert choices(events)[-1]["finish_reason"] == "function_call"
    _, body = call({"messages": MSG, "functions": fns})
    assert body["choices"][0]["message"]["function_call"] == {"name": "add",
                                                              "arguments": '{"a": 1.5}'}


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_fields(field: str) -> None:
    events = stream({"messages": MSG, "max_tokens": 20}, {"X-Sim-Scenario": field})
    keys = [next(iter(c["delta"])) for c in choices(events)[1:]]
    assert keys[:8] == [field] * 8 and "content" in keys[8:]
    _, body = call({"messages": MSG, "max_tokens": 20}, {"X-Sim-Scenario": field})
    message = body["choices"][0]["message"]
    assert isinstance(message[field], str) and message[field]
    other = "reasoning" if field == "reasoning_content" else "reasoning_content"
    assert other not in message


def test_prompt_marker_selects_scenario() -> None:
    msg = [{"role": "user", "content": "please [[sim:refusal]]"}]
    _, body = call({"messages": msg})
    message = body["choices"][0]["message"]
    assert message["refusal"].startswith("I'm sorry") and message["content"] is None


def test_unknown_scenario_is_a_400() -> None:
    status, body = call({"messages": MSG}, {"X-Sim-Scenario": "reasoningg"})
    assert status == 400 and "reasoningg" in body["error"]["message"]


@pytest.mark.parametrize("ids", [True, False])
def test_id_only_events_only_when_ids_asked(ids: bool) -> None:
    events = stream({"messages": MSG, "return_token_ids": ids},
                    {"X-Sim-Scenario": "tool_calls,id_only_events"})
    empty = [c for c in choices(events) if c["delta"] == {} and c["finish_reason"] is None]
    if ids:
        assert empty and all(c["token_ids"] for c in empty)
        assert 7 in all_ids(events) and 8 in all_ids(events)
    else:
        assert not empty


def test_stream_interval_batches_tokens() -> None:
    events = stream({"messages": MSG, "max_tokens": 14, "stream_interval": 4,
                     "return_token_ids": True}, output_len="1000")
    sizes = [len(c["token_ids"]) for c in choices(events)[1:]]
    assert sizes == [1, 4, 4, 4, 1]
    text = "".join(c["delta"]["content"] for c in choices(events)[1:])
    assert text  # multi-token events concatenate the texts
    events = stream({"messages": MSG, "max_tokens": 7, "return_token_ids": True},
                    {"X-Sim-Scenario": "multi_token"}, output_len="1000")
    assert [len(c["token_ids"]) for c in choices(events)[1:]] == [1, 3, 3]


def test_continuous_usage_counts_token_ids() -> None:
    events = stream({"messages": MSG, "max_tokens": 10, "stream_interval": 3,
                     "return_token_ids": True,
                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    seen = 0
    for event in events[1:-2]:
        seen += len(event["choices"][0]["token_ids"])
        assert event["usage"]["completion_tokens"] == seen
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 10


def test_logprobs_cover_every_token() -> None:
    events = stream({"messages": MSG, "max_tokens": 6, "logprobs": True, "top_logprobs": 3,
                     "stream_interval": 2, "return_token_ids": True})
    for c in choices(events)[1:]:
        entries = c["logprobs"]["content"]
        assert len(entries) == len(c["token_ids"])
        assert all(len(e["top_logprobs"]) == 3 for e in entries)
    events = stream({"prompt": "hi", "max_tokens": 4, "logprobs": 0}, path="/v1/completions")
    offsets = [o for c in choices(events) for o in c["logprobs"]["text_offset"]]
    texts = [t for c in choices(events) for t in c["logprobs"]["tokens"]]
    assert offsets == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]


def test_completion_prompt_shapes() -> None:
    events = stream({"prompt": ["a", "b", "c"], "max_tokens": 2, "return_token_ids": True},
                    path="/v1/completions")
    firsts = {c["index"]: c["prompt_token_ids"] for c in choices(events)
              if c["prompt_token_ids"] is not None}
    assert sorted(firsts) == [0, 1, 2] and all(ids[0] == 1 for ids in firsts.values())
    status, body = call({"prompt": [1, 325, 612], "max_tokens": 2, "return_token_ids": True},
                        path="/v1/completions")
    assert status == 200
    assert body["choices"][0]["prompt_token_ids"] == [1, 325, 612]
    assert body["usage"]["prompt_tokens"] == 3
    _, body = call({"prompt": "x"}, path="/v1/completions")
    assert body["usage"]["completion_tokens"] <= 16  # vLLM's completions default max_tokens


def test_request_id_header_and_errors() -> None:
    events = stream({"messages": MSG, "max_tokens": 2}, {"X-Request-Id": "abc-123"})
    assert {e["id"] for e in events if isinstance(e, dict)} == {"chatcmpl-abc-123"}
    status, body = call({"messages": MSG, "model": "other"})
    assert status == 404 and body == {"error": {
        "message": "The model `other` does not exist.", "type": "NotFoundError",
        "param": "model", "code": 404}}
    status, body = call({"messages": MSG, "max_tokens": 9000})
    assert status == 400 and body["error"]["message"].startswith(
        "This model's maximum context length is 8192 tokens. However, you requested")
    status, body = call({"messages": MSG, "stream_options": {"include_usage": True}})
    assert status == 400


def test_back_pressure_merges_tokens_into_one_event() -> None:
    async def go() -> list[Any]:
        h = Harness(tpot_ms=1.0)
        try:
            conn, transport = h.connect()
            conn.data_received(h.raw_request("POST", CHAT, {
                "model": "tiny", "messages": MSG, "stream": True, "max_tokens": 40,
                "return_token_ids": True}))
            for _ in range(200):  # wait for the first events, then stall the client
                if transport.data.count(b"data: ") >= 3:
                    break
                await asyncio.sleep(0.001)
            conn.pause_writing()
            before = bytes(transport.data)
            for _ in range(50):
                await asyncio.sleep(0.002)
            assert bytes(transport.data) == before  # nothing written while paused
            conn.resume_writing()
            for _ in range(500):
                if transport.data.endswith(b"0\r\n\r\n"):
                    break
                await asyncio.sleep(0.002)
            return event_json(parse_response(bytes(transport.data)).events)
        finally:
            h.close()

    events = run_async(go())
    sizes = [len(c["token_ids"]) for c in choices(events)[1:]]
    assert sum(sizes) == 40 and max(sizes) > 1


def test_same_prompt_same_tokens_across_engines_and_modes() -> None:
    def ids(body: dict[str, Any], **settings: Any) -> list[int]:
        _, out = call({"messages": MSG, "max_tokens": 12, "return_token_ids": True, **body},
                      **settings)
        result: list[int] = out["choices"][0]["token_ids"]
        return result

    base = ids({})
    assert ids({}) == base  # a second engine (fresh harness) answers the same
    streamed = all_ids(stream({"messages": MSG, "max_tokens": 12, "return_token_ids": True,
                               "stream_interval": 5}))
    assert streamed == base
    assert ids({"seed": 3}) != base  # a sampling seed in the body picks another answer
    assert ids({}, seed=1) != base  # so does another simulator seed
    assert ids({"messages": [{"role": "user", "content": "other"}]}) != base
