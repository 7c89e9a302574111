"""Pre-serialised frames: the single-token fast path writes exactly the general path's bytes,
and every event is compact JSON in vLLM's field order."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.sim import segments as sg
from narwhal.sim import tokenizer
from narwhal.sim.frames import ChatFrames, Choice, CompletionFrames, StreamOptions

token_ids = st.lists(st.integers(tokenizer.FIRST_ORDINARY, tokenizer.VOCAB_SIZE - 1),
                     min_size=1, max_size=12)


def _toks(ids: list[int], seg: sg.Seg = sg.CONTENT) -> list[sg.Tok]:
    return [(seg, i, tokenizer.ESCAPED[i], tokenizer.OUTPUT_TEXTS[i]) for i in ids]


@settings(max_examples=60, deadline=None)
@given(ids=token_ids, return_ids=st.booleans(),
       seg=st.sampled_from([sg.CONTENT, sg.REASONING, sg.REFUSAL, sg.tool_args(1)]))
def test_fast_path_equals_general_path(ids: list[int], return_ids: bool, seg: sg.Seg) -> None:
    opts = StreamOptions(return_ids=return_ids)
    outs = []
    for fast in (True, False):
        frames = ChatFrames("chatcmpl-x", 1, b'"m"', "fp", opts, sg.EMPTY_CONTENT_DELTA)
        frames.fast = fast
        choice = Choice(0, [1, 2])
        events = [e for t in _toks(ids, seg) for e in frames.events(choice, [t], None)]
        outs.append(events)
        assert choice.sent == len(ids)
    assert outs[0] == outs[1]
    for event in outs[0]:
        payload = event[6:-2]
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        assert orjson.dumps(orjson.loads(payload)) == payload


@pytest.mark.parametrize("include_usage", [False, True])
def test_finish_and_usage_frames(include_usage: bool) -> None:
    opts = StreamOptions(return_ids=True, include_usage=include_usage)
    frames = ChatFrames("chatcmpl-x", 1, b'"m"', "fp", opts, sg.EMPTY_CONTENT_DELTA)
    choice = Choice(0, [4, 5, 2])
    events = frames.events(choice, _toks([20, 21]), None)  # one event, two tokens
    events += frames.events(choice, [sg.EOS_TOK], "stop")
    role, body, finish = (orjson.loads(e[6:]) for e in events)
    assert role["prompt_token_ids"] == [4, 5, 2] and role["prompt_text"] is None
    assert body["choices"][0]["token_ids"] == [20, 21]
    assert body["choices"][0]["delta"]["content"] == "".join(
        tokenizer.OUTPUT_TEXTS[i] for i in (20, 21))
    assert finish["choices"][0] == {"index": 0, "delta": {"content": ""}, "logprobs": None,
                                    "finish_reason": "stop", "stop_reason": None,
                                    "token_ids": [2]}
    assert ("system_fingerprint" in finish) is not include_usage
    usage = orjson.loads(frames.usage_frame(3, 3)[6:])
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    assert usage["system_fingerprint"] == "fp"


def test_completion_first_chunk_carries_prompt_ids_per_choice() -> None:
    frames = CompletionFrames("cmpl-x", 1, b'"m"', "fp", StreamOptions(return_ids=True))
    a, b = Choice(0, [1, 9]), Choice(1, [1, 8])
    first_a = orjson.loads(frames.events(a, _toks([30]), None)[0][6:])["choices"][0]
    first_b = orjson.loads(frames.events(b, _toks([31]), None)[0][6:])["choices"][0]
    later = orjson.loads(frames.events(a, _toks([32]), "length")[0][6:])
    assert first_a["prompt_token_ids"] == [1, 9] and first_b["prompt_token_ids"] == [1, 8]
    assert first_b["index"] == 1 and later["choices"][0]["prompt_token_ids"] is None
    assert later["choices"][0]["finish_reason"] == "length" and later["system_fingerprint"]
