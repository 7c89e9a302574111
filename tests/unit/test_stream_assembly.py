"""Explicit cases for non-streaming assembly: one per row of the seed's table, and the rest.

Each case runs on the Rust StreamSession and on its Python oracle.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from stream_helpers import (
    IMPLS,
    assemble,
    cc,
    ch,
    chat,
    completion,
    finish_error,
    role,
    session,
    sse,
    usage_frame,
)

pytestmark = pytest.mark.parametrize("impl", sorted(IMPLS))


def message(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    m: dict[str, Any] = body["choices"][index]["message"]
    return m


def test_string_deltas_concatenate_per_key(impl: str) -> None:
    body = sse(
        role(),
        chat([ch({"reasoning": "th", "reasoning_content": "th"}, token_ids=[1])]),
        chat([ch({"reasoning": "ink", "reasoning_content": "ink"}, token_ids=[2])]),
        chat([ch({"content": "Hé"}, token_ids=[3])]),
        chat([ch({"content": 'llo \\ "q" \u0019 👋'}, token_ids=[4])]),
        chat([ch({"refusal": "no"}, token_ids=[5])]),
        chat([ch({"refusal": "pe"}, token_ids=[6])]),
    )
    m = message(assemble(impl, body))
    assert m["content"] == 'Héllo \\ "q" \u0019 👋'
    assert (m["reasoning"], m["reasoning_content"], m["refusal"]) == ("think", "think", "nope")
    assert list(m) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
        "reasoning_content",
    ]


def test_reasoning_content_key_only_when_the_engine_used_it(impl: str) -> None:
    m = message(assemble(impl, sse(role(), chat([ch({"reasoning": "r"}, token_ids=[1])]))))
    assert "reasoning_content" not in m and m["reasoning"] == "r"


def test_tool_calls_grouped_by_index_and_returned_in_order(impl: str) -> None:
    def tc(**kw: Any) -> dict[str, Any]:
        return chat([ch({"tool_calls": [kw]}, token_ids=[9])])

    body = sse(
        role(),
        tc(index=1, id="call_b", type="function", function={"name": "se"}),
        tc(index=0, id="call_", type="function", function={"name": "get", "arguments": '{"a'}),
        tc(index=1, function={"name": "arch", "arguments": "{}"}),
        tc(index=0, id="a", function={"arguments": '": 1}'}),
        chat([ch({}, finish_reason="tool_calls", token_ids=[2])]),
    )
    m = message(assemble(impl, body))
    assert m["content"] is None
    assert m["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "get", "arguments": '{"a": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "search", "arguments": "{}"}},
    ]
    assert list(m)[5:7] == ["function_call", "tool_calls"]


@pytest.mark.parametrize(
    ("fragment", "problem"),
    [
        ({"index": 0, "type": "function", "function": {"name": "f"}}, "no id"),
        (
            {"index": 0, "id": "c", "type": "function", "function": {"arguments": "{}"}},
            "no function name",
        ),
        ({"index": 0, "id": "", "function": {"name": "f"}}, "no id"),
    ],
)
def test_every_tool_call_needs_an_id_and_a_name(
    impl: str, fragment: dict[str, Any], problem: str
) -> None:
    body = sse(role(), chat([ch({"tool_calls": [fragment]}, token_ids=[1])]))
    code, msg = finish_error(impl, body)
    assert code == "malformed_engine_output" and problem in msg


def test_legacy_function_call_fragments_concatenate(impl: str) -> None:
    body = sse(
        role(),
        chat([ch({"function_call": {"name": "get_"}}, token_ids=[1])]),
        chat([ch({"function_call": {"name": "time", "arguments": "{"}}, token_ids=[2])]),
        chat([ch({"function_call": {"arguments": "}"}}, token_ids=[3])]),
    )
    assert message(assemble(impl, body))["function_call"] == {"name": "get_time", "arguments": "{}"}


def test_chat_logprobs_content_and_refusal_concatenate(impl: str) -> None:
    a = {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}
    b = {"token": "b", "logprob": -1.25, "bytes": [98], "top_logprobs": []}
    body = sse(
        role(),
        chat([ch({"content": "a"}, logprobs={"content": [a]}, token_ids=[1])]),
        chat([ch({"content": "b"}, logprobs={"content": [b], "refusal": [a]}, token_ids=[2])]),
        chat([ch({"refusal": "b"}, logprobs={"content": None, "refusal": [b]}, token_ids=[3])]),
    )
    assert assemble(impl, body)["choices"][0]["logprobs"] == {"content": [a, b], "refusal": [a, b]}
    plain = sse(role(), chat([ch({"content": "a"}, logprobs={"content": [a]}, token_ids=[1])]))
    assert assemble(impl, plain)["choices"][0]["logprobs"] == {"content": [a]}


def test_completion_logprob_arrays_concatenate(impl: str) -> None:
    def lp(off: int, tok: str, p: float) -> dict[str, Any]:
        return {
            "text_offset": [off],
            "token_logprobs": [p],
            "tokens": [tok],
            "top_logprobs": [{tok: p}],
        }

    body = sse(
        completion([cc("AR", logprobs=lp(0, "AR", -1.5), token_ids=[1])]),
        completion([cc("orm", logprobs=lp(2, "orm", -2.5), finish_reason="length", token_ids=[2])]),
    )
    choice = assemble(impl, body, "completion", expose_token_ids=True)["choices"][0]
    assert choice["text"] == "ARorm" and choice["token_ids"] == [1, 2]
    assert choice["logprobs"] == {
        "text_offset": [0, 2],
        "token_logprobs": [-1.5, -2.5],
        "tokens": ["AR", "orm"],
        "top_logprobs": [{"AR": -1.5}, {"orm": -2.5}],
    }


def test_finish_and_stop_reason_survive_a_later_usage_frame(impl: str) -> None:
    body = sse(
        role(),
        chat([ch({"content": "a"}, token_ids=[1])]),
        chat([ch({"content": ""}, finish_reason="stop", stop_reason="</s>", token_ids=[2])]),
        chat([ch({}, token_ids=[3])]),
        usage_frame(),
    )
    choice = assemble(impl, body)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "</s>")


def test_sglang_matched_stop_is_the_stop_reason(impl: str) -> None:
    body = sse(
        chat(
            [
                {
                    "index": 0,
                    "delta": {"content": "a"},
                    "finish_reason": "stop",
                    "matched_stop": 128009,
                }
            ]
        )
    )
    choice = assemble(impl, body, require_token_ids=False)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", 128009)


def test_token_ids_concatenate_and_prompt_ids_come_from_the_first_chunk(impl: str) -> None:
    body = sse(
        role(prompt_ids=[4, 5]),
        chat([ch({"content": "a"}, token_ids=[1, 2])]),
        chat([ch({"content": "b"}, finish_reason="length", token_ids=[3])]),
    )
    out = assemble(impl, body, expose_token_ids=True)
    assert (out["choices"][0]["token_ids"], out["prompt_token_ids"]) == ([1, 2, 3], [4, 5])
    hidden = assemble(impl, body, expose_token_ids=False)
    assert (hidden["choices"][0]["token_ids"], hidden["prompt_token_ids"]) == (None, None)


def test_metadata_and_engine_usage_with_details_added(impl: str) -> None:
    first = role()
    first["id"], first["created"] = "chatcmpl-first", 1
    body = sse(
        first, chat([ch({"content": "a"}, token_ids=[1])], id="chatcmpl-later"), usage_frame()
    )
    out = assemble(impl, body, prompt_tokens=999)
    assert (out["id"], out["created"], out["model"]) == ("chatcmpl-first", 1, "m")
    assert out["system_fingerprint"] == "fp-1"
    assert out["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 8,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    detailed = sse(usage_frame(prompt_tokens_details={"cached_tokens": 2}))
    assert list(assemble(impl, detailed)["usage"])[3:] == [
        "prompt_tokens_details",
        "completion_tokens_details",
    ]


def test_usage_is_computed_when_the_engine_sent_none(impl: str) -> None:
    body = sse(
        role(),
        chat([ch({"content": "ab"}, token_ids=[1, 2])]),
        chat([ch({}, finish_reason="stop", token_ids=[3])]),
    )
    assert assemble(impl, body, prompt_tokens=10)["usage"] == {
        "prompt_tokens": 10,
        "total_tokens": 13,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_choices_come_back_in_index_order(impl: str) -> None:
    body = sse(
        completion([cc("b", index=1)]),
        completion([cc("a", index=0)]),
        completion([cc("c", index=1, finish_reason="length")]),
    )
    out = assemble(impl, body, "completion", require_token_ids=False)
    assert [(c["index"], c["text"]) for c in out["choices"]] == [(0, "a"), (1, "bc")]


def test_body_shapes_match_vllm_key_order(impl: str) -> None:
    chat_out = assemble(impl, sse(role(), chat([ch({"content": "a"}, token_ids=[1])])))
    assert list(chat_out) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert list(chat_out["choices"][0]) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
    ]
    cmpl = assemble(impl, sse(completion([cc("a", token_ids=[1])])), "completion")
    assert list(cmpl) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert list(cmpl["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
        "routed_experts",
    ]


def test_a_stream_without_done_cannot_be_assembled(impl: str) -> None:
    code, msg = finish_error(impl, sse(role(), done=False))
    assert code == "malformed_engine_output" and "[DONE]" in msg


def test_failure_is_raised_by_finish(impl: str) -> None:
    body = sse(role(), chat([ch({"content": "a"})]))  # IDs required, missing
    assert finish_error(impl, body)[0] == "malformed_engine_output"


def test_finish_needs_assemble_mode(impl: str) -> None:
    s = session(impl)
    s.feed(sse(role()))
    with pytest.raises(ValueError):
        s.finish()


def test_assembled_body_is_compact_json(impl: str) -> None:
    s = session(impl, assemble=True)
    s.feed(sse(role(), chat([ch({"content": "é"}, token_ids=[1])])))
    raw = s.finish()
    assert json.dumps(json.loads(raw), separators=(",", ":"), ensure_ascii=False).encode() == raw
