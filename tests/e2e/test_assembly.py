"""Non-streaming assembly and engine-output validation end to end through the real router:
every row of the assembly table, each 502 condition and each token-ID failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from procs import MODEL, Proc, metrics, router_config, start_router, start_sim
from test_admission import error_of, post, settle

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
        },
    },
]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    sim = start_sim("--tpot-ms", "1", "--prefill-tokens-per-s", "500000")
    # Fault tests fail many attempts on purpose: keep the circuit breaker out of the way.
    cfg = router_config(
        [sim.url], health={"interval_s": 0.5, "timeout_s": 1.0, "failures_to_evict": 1000}
    )
    proc = start_router(tmp_path_factory.mktemp("asm"), cfg)
    yield proc
    proc.stop()
    sim.stop()


def sdk(router: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20)


def both(
    router: Proc, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The assembled answer, and the events of the same request streamed with IDs."""
    status, _, raw = post(router.url, path, {**body, "stream": False})
    assert status == 200, raw
    status, _, sraw = post(router.url, path, {**body, "stream": True})
    assert status == 200
    events = [json.loads(b[6:]) for b in sraw.decode().split("\n\n") if b.startswith("data: {")]
    return json.loads(raw), events


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        **extra,
    }


def concat(events: list[dict[str, Any]], key: str) -> str:
    return "".join(ch["delta"].get(key) or "" for e in events for ch in e["choices"])


@pytest.mark.parametrize("key", ["content", "reasoning", "reasoning_content", "refusal"])
def test_string_deltas_concatenate_under_their_key(router: Proc, key: str) -> None:
    marker = {
        "content": "",
        "reasoning": "[[sim:reasoning]]",
        "reasoning_content": "[[sim:reasoning_content]]",
        "refusal": "[[sim:refusal]]",
    }[key]
    body, events = both(router, chat(f"tell me {marker}"))
    message = body["choices"][0]["message"]
    expected = concat(events, key)
    assert expected, f"the simulator sent no {key}"
    assert message[key] == expected
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"]


def test_openai_sdk_non_streaming_chat(router: Proc) -> None:
    out = sdk(router).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi [[sim:reasoning]]"}], max_tokens=12
    )
    assert out.choices[0].message.content
    assert (out.choices[0].message.model_extra or {}).get("reasoning")
    assert (
        out.usage is not None
        and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    )


@pytest.mark.parametrize("scenario", ["tool_calls", "interleaved_tools"])
def test_tool_calls_grouped_by_index_in_order(router: Proc, scenario: str) -> None:
    out = sdk(router).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"weather? [[sim:{scenario}]]"}],
        tools=TOOLS,
        max_tokens=200,
    )  # type: ignore[arg-type]
    calls = out.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 2
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    for call in calls:
        assert call.id and call.type == "function"
        json.loads(call.function.arguments)  # type: ignore[union-attr]  # the engine's string, whole
    assert out.choices[0].finish_reason == "tool_calls"


def test_legacy_function_call_fragments_join(router: Proc) -> None:
    functions = [
        {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        }
    ]
    body, events = both(router, chat("[[sim:function_call]]", functions=functions, max_tokens=200))
    fc = body["choices"][0]["message"]["function_call"]
    streamed = [
        ch["delta"]["function_call"]
        for e in events
        for ch in e["choices"]
        if ch["delta"].get("function_call")
    ]
    assert fc["name"] == "".join(f.get("name") or "" for f in streamed) == "get_weather"
    assert fc["arguments"] == "".join(f.get("arguments") or "" for f in streamed)
    json.loads(fc["arguments"])


def test_chat_logprobs_concatenate_in_stream_order(router: Proc) -> None:
    body, events = both(router, chat("hi", logprobs=True, top_logprobs=2, max_tokens=6))
    streamed = [
        lp
        for e in events
        for ch in e["choices"]
        if ch.get("logprobs")
        for lp in ch["logprobs"]["content"]
    ]
    assert body["choices"][0]["logprobs"]["content"] == streamed
    assert len(streamed) == body["usage"]["completion_tokens"]


def test_completion_logprobs_concatenate_in_stream_order(router: Proc) -> None:
    req = {"model": MODEL, "prompt": "def hello", "max_tokens": 5, "logprobs": 2}
    body, events = both(router, req, "/v1/completions")
    lp = body["choices"][0]["logprobs"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert lp[key] == [
            x
            for e in events
            for ch in e["choices"]
            if ch.get("logprobs")
            for x in ch["logprobs"][key]
        ]
    assert body["choices"][0]["text"] == "".join(ch["text"] for e in events for ch in e["choices"])
    assert body["object"] == "text_completion"


def test_return_token_ids_in_assembled_responses(router: Proc) -> None:
    body, events = both(router, chat("ids please", return_token_ids=True))
    streamed_ids = [i for e in events for ch in e["choices"] for i in ch.get("token_ids") or []]
    assert body["choices"][0]["token_ids"] == streamed_ids and streamed_ids
    assert body["prompt_token_ids"] == events[0]["prompt_token_ids"]
    plain, _ = both(router, chat("no ids"))
    assert plain["choices"][0]["token_ids"] is None and plain["prompt_token_ids"] is None
    cbody, _ = both(
        router,
        {"model": MODEL, "prompt": "x", "max_tokens": 3, "return_token_ids": True},
        "/v1/completions",
    )
    assert cbody["choices"][0]["prompt_token_ids"] and cbody["choices"][0]["token_ids"]


def test_finish_and_stop_reason_survive_the_usage_frame(router: Proc) -> None:
    body, _ = both(router, chat("short", max_tokens=3))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and "stop_reason" in choice
    assert body["usage"]["completion_tokens"] == 3


UNSUPPORTED = ["audio", "annotations", "custom_tool"]
ID_FAULTS = ["missing_ids", "null_ids", "bool_ids", "negative_ids", "float_ids", "string_ids"]


@pytest.mark.parametrize("fault", UNSUPPORTED)
def test_unsupported_engine_fields_are_502(router: Proc, fault: str) -> None:
    before = metrics(router.url)
    extra = {"tools": TOOLS} if fault == "custom_tool" else {}
    status, _, raw = post(router.url, "/v1/chat/completions", chat(f"[[fault:{fault}]]", **extra))
    err = error_of(raw)
    assert (status, err["code"], err["type"]) == (502, "unsupported_engine_field", "upstream_error")
    after = settle(router.url)
    assert (
        after.get('narwhal_failed_total{reason="unsupported_engine_field"}', 0)
        - before.get('narwhal_failed_total{reason="unsupported_engine_field"}', 0)
        == 1
    )


@pytest.mark.parametrize("fault", [*ID_FAULTS, "malformed_json"])
def test_malformed_engine_output_non_streaming_is_502(router: Proc, fault: str) -> None:
    before = metrics(router.url)
    status, _, raw = post(router.url, "/v1/chat/completions", chat(f"[[fault:{fault}]]"))
    err = error_of(raw)
    assert (status, err["code"]) == (502, "malformed_engine_output")
    after = settle(router.url)
    key = 'narwhal_failed_total{reason="malformed_engine_output"}'
    assert after.get(key, 0) - before.get(key, 0) == 1


@pytest.mark.parametrize("fault", ID_FAULTS)
def test_token_id_failure_mid_stream_is_an_error_event(router: Proc, fault: str) -> None:
    before = metrics(router.url)
    status, _, raw = post(
        router.url, "/v1/chat/completions", chat(f"[[fault:{fault}:2]]", stream=True)
    )
    assert status == 200
    blocks = [b for b in raw.decode().split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]"
    assert json.loads(blocks[-2][6:])["error"]["code"] == 502
    assert sum(1 for b in blocks if '"delta"' in b) >= 2  # tokens before the fault were relayed
    after = settle(router.url)
    key = 'narwhal_failed_total{reason="malformed_engine_output"}'
    assert after.get(key, 0) - before.get(key, 0) == 1


def test_engine_error_event_mid_stream_is_relayed_and_counted(router: Proc) -> None:
    before = metrics(router.url)
    status, _, raw = post(
        router.url, "/v1/chat/completions", chat("[[fault:error_event:2]]", stream=True)
    )
    assert status == 200
    blocks = [b for b in raw.decode().split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]" and '"error"' in blocks[-2]
    after = settle(router.url)
    key = 'narwhal_failed_total{reason="engine_error"}'
    assert after.get(key, 0) - before.get(key, 0) == 1


def test_engine_4xx_passes_through_unchanged(router: Proc) -> None:
    before = metrics(router.url)
    status, _, raw = post(router.url, "/v1/chat/completions", chat("[[fault:http_400]]"))
    assert status == 400
    assert json.loads(raw)["error"]["type"] == "BadRequestError"  # the engine's own body
    after = settle(router.url)
    key = 'narwhal_invalid_requests_total{reason="engine_rejected"}'
    assert after.get(key, 0) - before.get(key, 0) == 1
