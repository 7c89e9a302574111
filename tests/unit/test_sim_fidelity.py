"""The simulator answers include_reasoning false and echo as vLLM 0.32 does (reasoning and tool
parsers on), driven through the HTTP protocol over a fake transport."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import Harness, event_json, run_async
from narwhal.sim import tokenizer

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
THINK = [{"role": "user", "content": "think first [[sim:reasoning]]"}]


def send(path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
         **settings: Any) -> tuple[int, Any, list[bytes]]:
    """(status, JSON body or the parsed events, raw events)."""
    async def go() -> tuple[int, Any, list[bytes]]:
        h = Harness(output_len="6", **settings)
        try:
            r, _ = await h.request("POST", path, {"model": "tiny", **body}, headers)
            assert r.complete, r.body
            if body.get("stream"):
                return r.status, event_json(r.events), r.events
            return r.status, r.json(), []
        finally:
            h.close()

    result: tuple[int, Any, list[bytes]] = run_async(go())
    return result


def choices(events: list[Any]) -> list[dict[str, Any]]:
    return [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]


# --- include_reasoning: false ------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["reasoning", "reasoning,id_only_events"])
def test_hidden_reasoning_streams_content_without_ids_or_logprobs(scenario: str) -> None:
    msgs = [{"role": "user", "content": f"think [[sim:{scenario}]]"}]
    ask = {"messages": msgs, "stream": True, "return_token_ids": True, "logprobs": True,
           "max_tokens": 40, "stream_options": {"include_usage": True}}
    _, shown, _ = send(CHAT, ask)
    _, hidden, _ = send(CHAT, ask | {"include_reasoning": False})
    assert any("reasoning" in c["delta"] for c in choices(shown))
    assert hidden[0]["prompt_token_ids"] == shown[0]["prompt_token_ids"]  # asked: still sent
    later = choices(hidden)[1:]
    assert all("reasoning" not in c["delta"] and c["delta"] for c in later[:-1])
    assert all(c["token_ids"] is None and c["logprobs"] is None for c in later)
    text = "".join(c["delta"].get("content") or "" for c in choices(shown))
    assert "".join(c["delta"].get("content") or "" for c in later) == text and text
    assert hidden[-2]["usage"] == shown[-2]["usage"]  # reasoning tokens still count


def test_hidden_reasoning_cut_by_max_tokens_ends_with_an_empty_delta() -> None:
    _, events, raw = send(CHAT, {"messages": THINK, "stream": True, "max_tokens": 3,
                                 "include_reasoning": False})
    assert len(raw) == 3 and events[-1] == "[DONE]"
    assert choices(events)[1] == {"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "length", "stop_reason": None,
                                  "token_ids": None}


def test_hidden_reasoning_non_streaming() -> None:
    ask = {"messages": THINK, "return_token_ids": True, "logprobs": True, "max_tokens": 40}
    _, shown, _ = send(CHAT, ask)
    _, hidden, _ = send(CHAT, ask | {"include_reasoning": False})
    message = hidden["choices"][0]["message"]
    assert shown["choices"][0]["message"]["reasoning"] and message["reasoning"] is None
    assert message["content"] == shown["choices"][0]["message"]["content"]
    assert hidden["choices"][0]["logprobs"] is None and hidden["choices"][0]["token_ids"] is None
    assert hidden["prompt_token_ids"] == shown["prompt_token_ids"] and hidden["prompt_token_ids"]
    assert hidden["usage"] == shown["usage"]


def test_id_only_events_have_an_empty_delta() -> None:
    # vLLM's DeltaMessage() for a token that yields no text; the finish keeps its delta.
    _, events, _ = send(CHAT, {"messages": [{"role": "user", "content": "x"}], "stream": True,
                               "return_token_ids": True, "max_tokens": 30},
                        {"X-Sim-Scenario": "id_only_events"})
    textless = [c for c in choices(events)[1:] if "content" not in c["delta"]]
    assert textless and all(c["delta"] == {} and c["token_ids"] for c in textless)
    assert choices(events)[-1]["delta"] == {"content": ""}


# --- echo --------------------------------------------------------------------------------

CONTINUE = [{"role": "user", "content": "Tell a story"},
            {"role": "assistant", "content": "Once upon"}]


def test_chat_echo_chunk_follows_the_role_chunk() -> None:
    ask = {"messages": CONTINUE, "echo": True, "stream": True, "return_token_ids": True,
           "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    _, events, raw = send(CHAT, ask)
    prompt = events[0]["usage"]["prompt_tokens"]
    assert orjson.loads(raw[1][6:]) == {
        "id": events[0]["id"], "object": "chat.completion.chunk",
        "created": events[0]["created"], "model": "tiny",
        "choices": [{"index": 0, "delta": {"content": "Once upon"}, "logprobs": None,
                     "finish_reason": None}],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0,
                  "completion_tokens_details": None}}
    assert all(c["token_ids"] for c in choices(events)[2:])
    assert events[-2]["usage"]["completion_tokens"] == 6  # the echo is not output


def test_chat_echo_non_streaming_prepends_the_text() -> None:
    _, plain, _ = send(CHAT, {"messages": CONTINUE})
    _, echoed, _ = send(CHAT, {"messages": CONTINUE, "echo": True})
    content = plain["choices"][0]["message"]["content"]
    assert echoed["choices"][0]["message"]["content"] == "Once upon" + content
    assert echoed["usage"] == plain["usage"]


def test_chat_echo_needs_the_response_role() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    _, events, raw = send(CHAT, {"messages": msgs, "echo": True, "stream": True})
    assert len(raw) == 8  # no echo chunk: role, six tokens (the last one finishes), [DONE]
    # Without a generation prompt the role is the last message's: the user text echoes.
    _, events, _ = send(CHAT, {"messages": msgs, "echo": True, "stream": True,
                               "add_generation_prompt": False})
    assert choices(events)[0]["delta"] == {"role": "user", "content": ""}
    assert choices(events)[1]["delta"] == {"content": "hi"}
    _, body, _ = send(CHAT, {"messages": msgs, "echo": True, "add_generation_prompt": False})
    assert body["choices"][0]["message"]["role"] == "user"
    assert body["choices"][0]["message"]["content"].startswith("hi")


@pytest.mark.parametrize("return_ids", [False, True])
def test_completion_echo_streams_the_prompt_first(return_ids: bool) -> None:
    ask = {"prompt": "Say hi", "max_tokens": 4, "stream": True, "return_token_ids": return_ids}
    _, plain, _ = send(CMPL, ask)
    _, echoed, _ = send(CMPL, ask | {"echo": True})
    first, again = choices(echoed)[0], choices(plain)[0]
    echo = "" if return_ids else "Say hi"  # vLLM echoes "" when IDs are returned
    assert first["text"] == echo + again["text"]
    assert first["prompt_token_ids"] == tokenizer.encode_prompt("Say hi")  # sent unasked too
    assert first["token_ids"] == again["token_ids"]  # generated IDs only
    assert [c["text"] for c in choices(echoed)[1:]] == [c["text"] for c in choices(plain)[1:]]


def test_completion_echo_with_max_tokens_zero_returns_the_prompt_only() -> None:
    _, events, raw = send(CMPL, {"prompt": "Say hi", "max_tokens": 0, "echo": True,
                                 "stream": True, "stream_options": {"include_usage": True}})
    assert [c["text"] for c in choices(events)] == ["Say hi"] and len(raw) == 3
    assert events[-2]["usage"]["completion_tokens"] == 1  # the engine ran one step
    _, events, _ = send(CMPL, {"prompt": "Say hi", "max_tokens": 0, "echo": True,
                               "stream": True, "return_token_ids": True})
    only = choices(events)[0]
    assert only["text"] == "" and len(only["token_ids"]) == 1 and only["finish_reason"]
    status, body, _ = send(CMPL, {"prompt": "Say hi", "max_tokens": 0, "echo": True})
    assert status == 200 and body["choices"][0]["text"] == "Say hi"
    assert body["usage"]["completion_tokens"] == 1
    status, body, _ = send(CMPL, {"prompt": "Say hi", "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens"


def test_completion_echo_of_token_ids_decodes_them() -> None:
    ids = tokenizer.encode_prompt("Say hi")
    _, body, _ = send(CMPL, {"prompt": ids, "max_tokens": 0, "echo": True})
    assert body["choices"][0]["text"] == "".join(tokenizer.OUTPUT_TEXTS[t] for t in ids)


def test_completion_echo_logprobs_cover_the_prompt() -> None:
    _, body, _ = send(CMPL, {"prompt": "Say hi", "max_tokens": 2, "echo": True, "logprobs": 1})
    lp = body["choices"][0]["logprobs"]
    prompt = len(tokenizer.encode_prompt("Say hi"))
    assert len(lp["tokens"]) == prompt + 2 and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 2
    plp = body["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == prompt
    _, events, _ = send(CMPL, {"prompt": "Say hi", "max_tokens": 2, "echo": True,
                               "logprobs": 1, "stream": True})
    streamed = [t for c in choices(events) for t in c["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]
