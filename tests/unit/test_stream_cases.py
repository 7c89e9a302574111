"""Explicit cases for stream framing, token-ID validation, exposure and field checks.

Each case runs on the Rust StreamSession and on its Python oracle.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from stream_helpers import (
    DONE,
    IMPLS,
    cc,
    ch,
    chat,
    completion,
    dumps,
    role,
    session,
    sse,
    usage_frame,
)

pytestmark = pytest.mark.parametrize("impl", sorted(IMPLS))

TEXT = chat([ch({"content": "Hé 👋"}, token_ids=[11, 12])])
TEXT_BYTES = dumps(TEXT)


def feed_all(s: Any, reads: list[bytes]) -> tuple[bytes, int, int]:
    out, count, state = b"", 0, 0
    for r in reads:
        o, n, state = s.feed(r)
        out, count = out + o, count + n
    return out, count, state


# --- framing ----------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings_and_every_split_give_the_same_output(impl: str, eol: bytes) -> None:
    body = b": hello" + eol + b"event: chunk" + eol + b"id: 1" + eol + b"retry: 9" + eol
    body += b"data:" + TEXT_BYTES + eol + eol + b"data: [DONE]" + eol + eol
    want = (
        b"data: " + dumps(chat([ch({"content": "Hé 👋"}, token_ids=None)])) + b"\n\n" + DONE,
        2,
        1,
    )
    assert feed_all(session(impl), [body]) == want
    # One byte at a time splits CRLF pairs and the 4-byte emoji.
    assert feed_all(session(impl), [body[i : i + 1] for i in range(len(body))]) == want


def test_partial_event_waits_for_the_blank_line(impl: str) -> None:
    s = session(impl)
    assert s.feed(b"data: " + TEXT_BYTES + b"\n") == (b"", 0, 0)
    assert s.events == 0
    out, n, state = s.feed(b"\n")
    assert (n, state, s.events) == (2, 0, 1)
    assert out.startswith(b"data: {") and out.endswith(b"\n\n")


def test_several_data_lines_join_with_a_newline(impl: str) -> None:
    s = session(impl, expose_token_ids=True)
    out, _, _ = s.feed(b'data: {"choices":[{"index":0,\ndata: "delta":{}}]}\n\n')
    assert s.failure is None and s.events == 1
    assert out == b'data: {"choices":[{"index":0,\ndata: "delta":{}}]}\n\n'


def test_done_ends_the_stream_and_later_bytes_are_ignored(impl: str) -> None:
    s = session(impl)
    assert s.feed(b"data: [DONE]\n\ndata: {bad\n\n") == (DONE, 0, 1)
    assert s.feed(sse(TEXT)) == (b"", 0, 1)
    assert s.events == 0 and s.failure is None


@pytest.mark.parametrize("payload", [b"{bad", b"[DONE", b"", b"[1,2]", b'"x"', b"\xff{}", b"NaN"])
def test_an_event_that_is_not_a_json_object_fails(impl: str, payload: bytes) -> None:
    s = session(impl)
    out, _, state = s.feed(sse(TEXT, done=False) + b"data: " + payload + b"\n\n" + DONE)
    assert state == 2 and s.failure[0] == "malformed_engine_output"
    assert out == sse(chat([ch({"content": "Hé 👋"}, token_ids=None)]), done=False)
    assert s.feed(sse(TEXT)) == (b"", 0, 2)


def test_route_must_be_known(impl: str) -> None:
    with pytest.raises(ValueError):
        IMPLS[impl](
            "embeddings",
            assemble=False,
            expose_token_ids=False,
            drop_usage=False,
            require_token_ids=False,
        )


@pytest.mark.parametrize(
    "error",
    [
        b'{"error": {"message": "boom", "type": "InternalServerError", "param": null, '
        b'"code": 500}}',
        b'{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}',
    ],
)
def test_engine_error_event_is_forwarded_or_fails_assembly(impl: str, error: bytes) -> None:
    s = session(impl)
    assert s.feed(sse(error)) == (b"data: " + error + b"\n\n" + DONE, 0, 1)
    assert s.engine_error == error and s.failure is None and s.events == 1
    a = session(impl, assemble=True)
    a.feed(sse(role(), error))
    with pytest.raises(ValueError) as info:
        a.finish()
    assert (info.value.code, info.value.message) == ("engine_error", "boom")  # type: ignore[attr-defined]


# --- token IDs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "problem"),
    [
        ("missing", "no token_ids"),
        (None, "no token_ids"),
        ([True], "Boolean"),
        ([1, -3], "negative"),
        ([1.0], "not an integer"),
        (["7"], "string"),
        ([[7]], "nested list"),
        ([{}], "object"),
        (7, "must be a list"),
        ({"a": 1}, "must be a list"),
        ([2**64], "64-bit"),
    ],
)
def test_each_token_id_failure_is_named(impl: str, ids: Any, problem: str) -> None:
    choice = ch({"content": "x"})
    if ids != "missing":
        choice["token_ids"] = ids
    s = session(impl)
    out, n, state = s.feed(sse(role(), chat([choice])))
    assert (n, state) == (0, 2)
    code, message = s.failure
    assert code == "malformed_engine_output" and problem in message
    assert out.count(b"data: ") == 1  # the role chunk went out before the failure


def test_ids_are_counted_on_every_kind_of_event(impl: str) -> None:
    events = [
        role(prompt_ids=[1, 2, 3]),  # role chunk: no IDs needed; prompt IDs do not count
        chat([ch({"content": ""}, token_ids=[5])]),  # partial UTF-8: empty text, one ID
        chat([ch({"reasoning": "r"}, token_ids=[6, 7])]),
        chat([ch({}, token_ids=[8])]),  # ID-only event
        chat([ch({"content": ""}, finish_reason="stop", stop_reason=None, token_ids=[2])]),
        chat([ch({}, finish_reason="stop")]),  # finish without IDs: no output, fine
        usage_frame(completion_tokens=99),
    ]
    s = session(impl)
    _, n, state = s.feed(sse(*events))
    assert (n, state, s.events) == (5, 1, 7)
    assert s.output_tokens == 99 and s.engine_usage_completion_tokens == 99


def test_per_read_counts(impl: str) -> None:
    s = session(impl)
    one = sse(chat([ch({"content": "a"}, token_ids=[1, 2])]), done=False)
    assert s.feed(one + one[:10])[1] == 2
    assert s.feed(one[10:] + DONE)[1:] == (2, 1)
    assert s.output_tokens == 4


def test_a_malformed_list_fails_even_on_events_without_output(impl: str) -> None:
    s = session(impl)
    s.feed(sse(chat([ch({}, finish_reason="stop", token_ids=[True])])))
    assert s.failure[0] == "malformed_engine_output"
    s = session(impl)
    s.feed(sse(chat([ch({"role": "assistant"})], prompt_token_ids=[-1])))
    assert s.failure[0] == "malformed_engine_output"


def test_without_required_ids_events_with_output_are_counted(impl: str) -> None:
    s = session(impl, require_token_ids=False)
    _, n, state = s.feed(sse(role(), chat([ch({"content": "a"})]), chat([ch({"refusal": "b"})])))
    assert (n, state, s.output_tokens) == (2, 1, 2)


# --- exposure ---------------------------------------------------------------------------


def test_ids_become_null_in_place_and_id_only_events_drop(impl: str) -> None:
    events = [
        role(prompt_ids=[1, 2]),
        chat([ch({"content": "a"}, token_ids=[5])]),
        chat([ch({}, token_ids=[6])]),  # exists only to carry IDs
        chat([ch({}, finish_reason="tool_calls", token_ids=[7])]),
        chat([ch({}, logprobs={"content": []}, token_ids=[8])]),
    ]
    out, n, _ = session(impl).feed(sse(*events))
    nulled = [
        role(prompt_ids=None),
        chat([ch({"content": "a"}, token_ids=None)]),
        chat([ch({}, finish_reason="tool_calls", token_ids=None)]),
        chat([ch({}, logprobs={"content": []}, token_ids=None)]),
    ]
    assert out == sse(*nulled) and n == 4


def test_completion_prompt_ids_per_choice_and_empty_text_kept(impl: str) -> None:
    events = [completion([cc("", prompt_token_ids=[1], token_ids=[9])])]
    out, n, _ = session(impl, "completion").feed(sse(*events))
    assert out == sse(completion([cc("")])) and n == 1


def test_exposed_ids_pass_byte_for_byte(impl: str) -> None:
    raw = b'{"choices":[{"index":0,"delta":{"content":"\\u00e9"},"token_ids":[ 1,2 ],"x":1.50}]}'
    events = [raw, dumps(chat([ch({}, token_ids=[3])]))]
    assert session(impl, expose_token_ids=True).feed(sse(*events))[0] == sse(*events)


def test_drop_usage_drops_only_usage_only_frames(impl: str) -> None:
    continuous = chat(
        [ch({"content": "a"}, token_ids=[1])],
        usage={"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1},
    )
    body = sse(continuous, usage_frame())
    out, _, _ = session(impl, drop_usage=True, expose_token_ids=True).feed(body)
    assert out == sse(continuous)
    assert session(impl, drop_usage=False, expose_token_ids=True).feed(body)[0] == body


# --- fields the router cannot pass on (assembly) or that are malformed (both) ------------


@pytest.mark.parametrize(
    "choice",
    [
        ch({"content": "a", "audio": {"id": "x"}}),
        ch({"annotations": [{"type": "url"}]}),
        ch({"tool_calls": [{"index": 0, "id": "c", "type": "custom", "custom": {"name": "x"}}]}),
        ch({"tool_calls": [{"index": 0, "id": "c", "custom": {"input": "x"}}]}),
        ch({"content": "a"}, weird_choice_field=1),
    ],
)
def test_unsupported_fields_fail_assembly_only(impl: str, choice: dict[str, Any]) -> None:
    choice["token_ids"] = [1]
    a = session(impl, assemble=True)
    assert a.feed(sse(chat([choice])))[2] == 2
    assert a.failure[0] == "unsupported_engine_field"
    s = session(impl, expose_token_ids=True)
    assert s.feed(sse(chat([choice]))) == (sse(chat([choice])), 1, 1)


def test_null_unknown_fields_are_fine(impl: str) -> None:
    choice = ch({"content": "a", "audio": None, "annotations": None}, extra=None, token_ids=[1])
    a = session(impl, assemble=True)
    assert a.feed(sse(chat([choice]))) == (b"", 1, 1)


@pytest.mark.parametrize(
    ("event", "both_modes"),
    [
        (chat([ch({"content": 5})]), True),
        (chat([ch({"tool_calls": {"index": 0}})]), True),
        (chat([ch({"function_call": "f"})]), True),
        (chat([ch({}, finish_reason=1)]), True),
        (chat({"index": 0}), True),  # type: ignore[arg-type]
        (chat([["not an object"]]), True),  # type: ignore[list-item]
        (chat([{"index": 0, "delta": "hi"}]), True),
        (chat([], usage=[1]), True),
        (chat([], usage={"completion_tokens": "3"}), True),
        (completion([cc(["text"])]), True),  # type: ignore[arg-type]
        (chat([ch({"tool_calls": [{"index": -1, "id": "c"}]})]), False),
        (chat([ch({"tool_calls": [{"id": "c"}]})]), False),
        (chat([ch({"tool_calls": [{"index": 0, "function": {"name": 3}}]})]), False),
        (chat([ch({"tool_calls": ["call"]})]), False),
        (chat([ch({}, logprobs=[1])]), False),
        (chat([ch({}, logprobs={"content": {"token": "a"}})]), False),
        (chat([ch({}, stop_reason=1.5)]), False),
        (chat([{"delta": {}}]), False),  # choice without index
        (completion([cc("a", logprobs={"tokens": "a"})]), False),
    ],
)
def test_malformed_supported_fields(impl: str, event: dict[str, Any], both_modes: bool) -> None:
    route = "chat" if event["object"].startswith("chat") else "completion"
    for assemble in (True, False):
        s = session(impl, route, assemble=assemble, require_token_ids=False)
        s.feed(sse(event))
        failed = s.failure is not None and s.failure[0] == "malformed_engine_output"
        assert failed == (assemble or both_modes), (assemble, s.failure)


def test_failure_message_names_the_field(impl: str) -> None:
    s = session(impl)
    s.feed(sse(chat([ch({"content": 5})])))
    assert "delta.content" in s.failure[1]
    assert json.loads(dumps(s.failure))  # plain strings
