"""What vLLM itself sends for ``include_reasoning: false`` and for ``echo``, rebuilt by the
session from an engine asked with reasoning and IDs (streaming and assembly).

Each case runs on the Rust StreamSession and on its Python oracle.
"""

from __future__ import annotations

import pytest
from stream_helpers import (
    DONE,
    IMPLS,
    assemble,
    cc,
    ch,
    chat,
    completion,
    role,
    session,
    sse,
    usage_frame,
)

pytestmark = pytest.mark.parametrize("impl", sorted(IMPLS))

LP = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
USAGE = {"prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5}

# What a vLLM engine asked with reasoning, IDs and logprobs sends.
ENGINE = [
    role(prompt_ids=[1, 2]),
    chat([ch({}, logprobs=LP, token_ids=[9])]),  # <think>: only IDs
    chat([ch({"reasoning": "hm"}, logprobs=LP, token_ids=[11])]),
    chat([ch({"reasoning": "m", "content": "Hi"}, logprobs=LP, token_ids=[12, 13])]),
    chat([ch({"content": "!"}, logprobs=LP, token_ids=[14])], usage=USAGE),
    chat([ch({"content": ""}, logprobs=LP, finish_reason="stop", stop_reason=None, token_ids=[2])]),
]
# What vLLM sends the client who asked include_reasoning false (IDs and logprobs null).
CLIENT = [
    role(prompt_ids=None),
    chat([ch({"content": "Hi"}, token_ids=None)]),
    chat([ch({"content": "!"}, token_ids=None)], usage=USAGE),
    chat([ch({"content": ""}, finish_reason="stop", stop_reason=None, token_ids=None)]),
]


def test_strip_reasoning_streams_what_vllm_sends(impl: str) -> None:
    out, n, state = session(impl, strip_reasoning=True).feed(sse(*ENGINE))
    assert out == sse(*CLIENT)
    assert (n, state) == (6, 1)  # every ID is still validated and counted


def test_strip_reasoning_keeps_asked_prompt_ids_but_never_token_ids(impl: str) -> None:
    out, _, _ = session(impl, strip_reasoning=True, expose_token_ids=True).feed(sse(*ENGINE))
    assert out == sse(role(prompt_ids=[1, 2]), *CLIENT[1:])


def test_strip_reasoning_cut_during_reasoning_ends_with_an_empty_delta(impl: str) -> None:
    events = [
        role(),
        chat([ch({"reasoning": "a"}, token_ids=[5])]),
        chat([ch({"reasoning": "b"}, finish_reason="length", token_ids=[6])]),
    ]
    out, n, _ = session(impl, strip_reasoning=True).feed(sse(*events))
    assert out == sse(role(), chat([ch({}, finish_reason="length", token_ids=None)]))
    assert n == 2


def test_strip_reasoning_drops_legacy_reasoning_content_too(impl: str) -> None:
    events = [chat([ch({"reasoning": "a", "reasoning_content": "a"}, token_ids=[5])])]
    assert session(impl, strip_reasoning=True).feed(sse(*events)) == (DONE, 1, 1)


def test_strip_reasoning_still_requires_ids(impl: str) -> None:
    s = session(impl, strip_reasoning=True)
    s.feed(sse(chat([ch({"reasoning": "a"})]), done=False))
    assert s.failure is not None and s.failure[0] == "malformed_engine_output"


def test_strip_reasoning_assembles_without_reasoning_ids_or_logprobs(impl: str) -> None:
    body = assemble(impl, sse(*ENGINE), strip_reasoning=True, expose_token_ids=True)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hi!" and choice["message"]["reasoning"] is None
    assert choice["logprobs"] is None and choice["token_ids"] is None
    assert body["prompt_token_ids"] == [1, 2]  # vLLM keeps the prompt IDs the client asked
    plain = assemble(impl, sse(*ENGINE), expose_token_ids=True)
    assert plain["choices"][0]["message"]["reasoning"] == "hmm"
    assert plain["choices"][0]["token_ids"] == [9, 11, 12, 13, 14, 2]


def test_strip_reasoning_applies_to_chat_only(impl: str) -> None:
    events = [completion([cc("a", logprobs={"tokens": ["a"]}, token_ids=[5])])]
    s = session(impl, "completion", strip_reasoning=True, expose_token_ids=True)
    assert s.feed(sse(*events))[0] == sse(*events)


# --- echo -------------------------------------------------------------------------------

ECHO = chat(
    [{"index": 0, "delta": {"content": "Once upon"}, "logprobs": None, "finish_reason": None}]
)


def test_chat_echo_chunk_is_relayed_and_not_counted(impl: str) -> None:
    events = [role(), ECHO, chat([ch({"content": " a time"}, token_ids=[7, 8])])]
    s = session(impl, echo=True, expose_token_ids=True)
    out, n, _ = s.feed(sse(*events))
    assert out == sse(*events) and n == 2 and s.output_tokens == 2
    s = session(impl, echo=True, require_token_ids=False)
    assert s.feed(sse(*events))[1] == 1  # one event carrying output: the echo is prompt


def test_chat_echo_chunk_without_echo_asked_is_output_without_ids(impl: str) -> None:
    s = session(impl)
    assert s.feed(sse(role(), ECHO))[2] == 2
    assert s.failure is not None and "no token_ids" in s.failure[1]


def test_chat_echo_is_only_accepted_before_generated_output(impl: str) -> None:
    s = session(impl, echo=True)
    s.feed(sse(role(), chat([ch({"content": "x"}, token_ids=[7])]), ECHO))
    assert s.failure is not None and "no token_ids" in s.failure[1]


def test_chat_echo_assembles_the_echo_first_and_keeps_the_role(impl: str) -> None:
    user_role = chat([ch({"role": "user", "content": ""})], prompt_token_ids=None)
    events = [
        user_role,
        ECHO,
        chat([ch({"content": " a time"}, finish_reason="stop", token_ids=[7])]),
    ]
    body = assemble(impl, sse(*events), echo=True)
    message = body["choices"][0]["message"]
    assert (message["role"], message["content"]) == ("user", "Once upon a time")
    assert body["usage"]["completion_tokens"] == 1


def test_chat_echo_content_is_never_null(impl: str) -> None:
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    events = [role(), chat([ch({"tool_calls": [call]}, finish_reason="tool_calls", token_ids=[3])])]
    assert assemble(impl, sse(*events), echo=True)["choices"][0]["message"]["content"] == ""
    assert assemble(impl, sse(*events))["choices"][0]["message"]["content"] is None


def test_completion_echo_keeps_the_prompt_ids_vllm_sends_unasked(impl: str) -> None:
    first = completion([cc("Say hi there", prompt_token_ids=[1, 2])])
    later = completion([cc(" you", finish_reason="length")])
    s = session(impl, "completion", echo=True, require_token_ids=False)
    out, n, _ = s.feed(sse(first, later))
    assert out == sse(first, later) and n == 2
    assembled = assemble(impl, sse(first, later), "completion", echo=True, require_token_ids=False)
    choice = assembled["choices"][0]
    assert choice["text"] == "Say hi there you" and choice["prompt_token_ids"] is None


def test_completion_echo_with_ids_is_verbatim(impl: str) -> None:
    # return_token_ids: vLLM echoes "" and carries the prompt in prompt_token_ids.
    events = [completion([cc("", finish_reason="length", prompt_token_ids=[1, 2], token_ids=[40])])]
    s = session(impl, "completion", echo=True, expose_token_ids=True)
    out, n, _ = s.feed(sse(*events))
    assert out == sse(*events) and n == 1
    body = assemble(impl, sse(*events), "completion", echo=True, expose_token_ids=True)
    assert body["choices"][0]["prompt_token_ids"] == [1, 2]
    assert (body["choices"][0]["text"], body["choices"][0]["token_ids"]) == ("", [40])


# --- usage the client did not ask for --------------------------------------------------------

FINISH = chat([ch({"content": ""}, finish_reason="stop", stop_reason=None, token_ids=None)])


def test_dropped_usage_leaves_its_fingerprint_on_the_finish_event(impl: str) -> None:
    # vLLM stamps system_fingerprint on the finish event when no usage frame follows.
    text = chat([ch({"content": "a"}, token_ids=None)])
    body = sse(role(), text, FINISH, usage_frame())  # the usage frame carries "fp-1"
    out, _, _ = session(impl, drop_usage=True, require_token_ids=False).feed(body)
    assert out == sse(role(), text, FINISH | {"system_fingerprint": "fp-1"})
    out, _, _ = session(impl, drop_usage=False, require_token_ids=False).feed(body)
    assert out == body


def test_a_held_finish_event_goes_out_with_whatever_comes_next(impl: str) -> None:
    s = session(impl, drop_usage=True, require_token_ids=False)
    assert s.feed(sse(FINISH, done=False)) == (b"", 1, 0)  # waiting for the usage frame
    assert s.feed(DONE) == (sse(FINISH), 0, 1)
    s = session(impl, drop_usage=True, require_token_ids=False)
    s.feed(sse(FINISH, done=False))
    out, _, state = s.feed(b"data: {bad\n\n")
    assert (out, state) == (sse(FINISH, done=False), 2)
    stamped = FINISH | {"system_fingerprint": "own"}
    s = session(impl, drop_usage=True, require_token_ids=False)
    assert s.feed(sse(stamped, done=False))[0] == sse(stamped, done=False)
