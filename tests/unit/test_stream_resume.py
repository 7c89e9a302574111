"""Resuming a broken answer (migration): the Rust StreamSession against its Python oracle.

Generated cases: a chat or completions stream breaks after some events (the connection cut,
maybe mid-event, or the engine's error event), and goes on with a ``/v1/completions``
token-ID continuation (itself maybe broken and resumed once more), every stream cut into
arbitrary reads; streaming and assembled, with and without ``return_token_ids``. Explicit
cases: where the answer cannot resume, and the error event held back.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from stream_helpers import (
    DONE,
    IMPLS,
    cc,
    ch,
    chat,
    completion,
    dumps,
    end_state,
    role,
    session,
    sse,
)

from reference import stream_oracle
from reference.chunked_oracle import ChunkedDecoder

EXAMPLES = int(os.environ.get("NARWHAL_PROP_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TEXT = st.text(st.characters(codec="utf-8"), max_size=4)
IDS = st.lists(st.integers(0, 2**40), min_size=1, max_size=3)
ERROR = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
# An answer stops being plain generated text (chat / completions).
UNSAFE = {
    "chat": ["finish", "reasoning", "tool", "second_choice", "logprobs", "unknown_field"],
    "completion": ["finish", "second_choice", "logprobs"],
}


def unsafe_event(route: str, kind: str, ids: list[int]) -> dict[str, Any]:
    if route == "chat":
        choice = {
            "finish": ch({"content": ""}, finish_reason="length", stop_reason=None),
            "reasoning": ch({"reasoning": "hm"}),
            "tool": ch({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                        "function": {"name": "f"}}]}),
            "second_choice": ch({"content": "b"}, index=1),
            "logprobs": ch({"content": "a"}, logprobs={"content": []}),
            "unknown_field": ch({"content": "a"}, weird=1),
        }[kind]
        return chat([choice | {"token_ids": ids}])
    choice = {
        "finish": cc("a", finish_reason="length"),
        "second_choice": cc("b", index=1),
        "logprobs": cc("a", logprobs={"text_offset": [0], "token_logprobs": [-0.5],
                                      "tokens": ["a"], "top_logprobs": [None]}),
    }[kind]
    return completion([choice | {"token_ids": ids}])


@st.composite
def first_engine(draw: st.DrawFn, route: str) -> tuple[list[dict[str, Any]], list[int], bool]:
    """The first engine's events up to the break, the prompt's IDs, and whether the answer
    is plain generated text with the prompt's IDs (resumable)."""
    prompt = draw(st.lists(st.integers(0, 2**40), max_size=4))
    with_prompt = draw(st.integers(0, 9)) > 0  # else the engine returned no prompt IDs
    events = []
    if route == "chat":
        events.append(role(prompt_ids=prompt if with_prompt else None))
    for k in range(draw(st.integers(0 if route == "chat" else 1, 5))):
        ids = draw(IDS)
        if route == "chat":
            events.append(chat([ch({"content": draw(TEXT)}, token_ids=ids)]))
        else:
            first = k == 0 and with_prompt
            events.append(completion([cc(draw(TEXT), token_ids=ids,
                                         prompt_token_ids=prompt if first else None)]))
    plain = draw(st.integers(0, 4)) > 0
    if not plain:
        at = draw(st.integers(1 if route == "chat" else 0, len(events)))
        events.insert(at, unsafe_event(route, draw(st.sampled_from(UNSAFE[route])), draw(IDS)))
    return events, prompt, plain and with_prompt


@st.composite
def continuation(
    draw: st.DrawFn, prompt: list[int], last: bool
) -> tuple[list[dict[str, Any]], bool]:
    """A /v1/completions token-ID continuation as vLLM streams it; True when it finishes
    (else it breaks again, for another resume; the ``last`` one finishes)."""
    finishes = last or draw(st.integers(0, 3)) > 0
    events = []
    for k in range(draw(st.integers(1, 4))):
        events.append(completion([cc(draw(TEXT), token_ids=draw(IDS),
                                     prompt_token_ids=prompt if k == 0 else None)]))
    if finishes:
        last = events[-1]["choices"][0]
        last["finish_reason"] = draw(st.sampled_from(["stop", "length"]))
        last["stop_reason"] = draw(st.sampled_from([None, 2]))
        if draw(st.booleans()):
            events[-1]["system_fingerprint"] = "fp-2"
        if draw(st.booleans()):
            n = sum(len(e["choices"][0]["token_ids"]) for e in events)
            usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n,
                     "completion_tokens": n}
            events.append(completion([], usage=usage, system_fingerprint="fp-2"))
    return events, finishes


def body_of(draw: st.DrawFn, events: list[Any], end: str) -> bytes:
    """Frame the events; ``end``: done, cut (maybe mid-event) or error (then [DONE])."""
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    body = b"".join(b"data: " + (e if isinstance(e, bytes) else dumps(e)) + eol + eol
                    for e in events)
    if end == "error":
        body += b"data: " + json.dumps(ERROR).encode() + eol + eol  # vLLM's spacing
    if end in ("done", "error"):
        body += b"data: [DONE]" + eol + eol
    elif draw(st.booleans()):  # the connection broke inside the next event
        body += b'data: {"id":"x","choices":[{"ind'
    return body


def reads_of(draw: st.DrawFn, body: bytes) -> list[bytes]:
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=6)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


@st.composite
def resumed_stream(draw: st.DrawFn, route: str) -> dict[str, Any]:
    opts = {
        "assemble": draw(st.booleans()),
        "expose_token_ids": draw(st.booleans()),  # the client's return_token_ids
        "drop_usage": draw(st.booleans()),
        "require_token_ids": draw(st.integers(0, 9)) > 0,
        "prompt_tokens": draw(st.integers(0, 99)),
        "model": draw(st.sampled_from([None, "m", "alias"])),
    }
    events, prompt, resumable = draw(first_engine(route))
    end = draw(st.sampled_from(["cut", "error"])) if draw(st.integers(0, 9)) else "done"
    hops = [reads_of(draw, body_of(draw, events, end))]
    answer = [c for e in events for c in e["choices"]]  # every choice the client is owed
    generated = [i for c in answer for i in c.get("token_ids") or []]
    for hop in range(2):
        more, finishes = draw(continuation(prompt + generated, last=hop == 1))
        hops.append(reads_of(draw, body_of(draw, more, "done" if finishes else draw(
            st.sampled_from(["cut", "error"])))))
        answer += [c for e in more for c in e["choices"]]
        generated = [i for c in answer for i in c.get("token_ids") or []]
        if finishes:
            break
    return {"route": route, "opts": opts, "hops": hops, "prompt": prompt,
            "resumable": resumable and end != "done", "answer": answer,
            "usage_sent": "usage" in more[-1] and not more[-1]["choices"]}


def run(cls: Any, route: str, opts: dict[str, Any], hops: list[list[bytes]]) -> dict[str, Any]:
    """Feed the first engine, then each continuation after resume(); what the client and the
    flow see."""
    s = cls(route, **opts)
    s.enable_resume()
    seen: list[Any] = [[s.feed(r) for r in hops[0]]]
    for reads in hops[1:]:
        seen.append((s.resume_point(), s.failure and s.failure[0], s.engine_error))
        resumed = s.resume()
        seen.append(resumed)
        if not resumed:
            break
        seen.append([s.feed(r) for r in reads])
    return {"seen": seen, "point": s.resume_point()} | end_state(s, opts["assemble"])


@pytest.mark.parametrize("route", ["chat", "completion"])
@SETTINGS
@given(data=st.data())
def test_resumed_streams_match_the_oracle(route: str, data: st.DataObject) -> None:
    case = data.draw(resumed_stream(route))
    rust = run(IMPLS["rust"], route, case["opts"], case["hops"])
    oracle = run(IMPLS["oracle"], route, case["opts"], case["hops"])
    assert rust == oracle


def client_events(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in out.split(b"\n\n")
            if line.startswith(b"data: {")]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("route", ["chat", "completion"])
@settings(SETTINGS, max_examples=max(1, EXAMPLES // 2))
@given(data=st.data())
def test_a_resumed_answer_reads_as_one_answer(impl: str, route: str, data: st.DataObject) -> None:
    """Whatever the breaks, the client gets one answer: the first event's identity on every
    event, every engine's text and IDs in order, the prompt counted once and the completion
    tokens summed."""
    case = data.draw(resumed_stream(route))
    assume(case["resumable"] and case["opts"]["require_token_ids"])
    opts = case["opts"]
    s = IMPLS[impl](route, **opts)
    s.enable_resume()
    out = b"".join(s.feed(r)[0] for r in case["hops"][0])
    for reads in case["hops"][1:]:
        assert s.resume()
        out += b"".join(s.feed(r)[0] for r in reads)
    assert s.state == 1 and s.resume_point() is None
    answer, prompt = case["answer"], case["prompt"]
    key = "content" if route == "chat" else "text"
    text = "".join((c["delta"].get("content") or "") if "delta" in c else c["text"]
                   for c in answer)
    ids = [i for c in answer for i in c.get("token_ids") or []]
    if opts["assemble"]:
        body = json.loads(s.finish())
        choice = body["choices"][0]
        got_text = choice["message"]["content"] if route == "chat" else choice["text"]
        got_ids = choice["token_ids"]
        events = [body]
    else:
        events = client_events(out)
        choices = [c for e in events for c in e["choices"]]
        got_text = "".join(
            (c["delta"].get(key) or "") if route == "chat" else c["text"] for c in choices
        )
        got_ids = [i for c in choices for i in c.get("token_ids") or []] or None
        model = opts["model"] or "m"
        assert {(e["id"], e["created"], e["model"]) for e in events} == {
            (events[0]["id"], 7, model)
        }
    assert got_text == text
    assert got_ids == (ids if opts["expose_token_ids"] else None)
    assert s.output_tokens == len(ids)
    usages = [e["usage"] for e in events if e.get("usage")]
    if case["usage_sent"] and (opts["assemble"] or not opts["drop_usage"]):
        # the continuation's usage frame: the prompt once, every engine's completion tokens
        total = usages[-1]["prompt_tokens"] + usages[-1]["completion_tokens"]
        assert (usages[-1]["prompt_tokens"], total) == (len(prompt), usages[-1]["total_tokens"])
        assert usages[-1]["completion_tokens"] == len(ids)
    elif opts["assemble"]:  # no usage from the engine: the router's sized prompt, its count
        assert (usages[-1]["prompt_tokens"], usages[-1]["completion_tokens"]) == (
            opts["prompt_tokens"], len(ids))
    else:
        assert usages == []


# --- explicit cases, each on the Rust session and on the oracle -------------------------

PROMPT = role(prompt_ids=[1, 2])
HELLO = chat([ch({"content": "hi"}, token_ids=[7, 8])])


def resumable(impl: str, route: str = "chat", **opts: Any) -> Any:
    s = session(impl, route, **opts)
    s.enable_resume()
    return s


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize(
    "events",
    [
        pytest.param([PROMPT, HELLO, unsafe_event("chat", kind, [5])], id=kind)
        for kind in UNSAFE["chat"]
    ]
    + [
        pytest.param([role(), HELLO], id="no_prompt_ids"),
        pytest.param([], id="nothing_read"),
        pytest.param([PROMPT, HELLO, b"[DONE]"], id="finished"),
        pytest.param([PROMPT, HELLO, b'{"choices":[{"index":0,"delta":{"content":5}}]}'],
                     id="failed_on_bad_output"),
    ],
)
def test_where_the_answer_cannot_resume(impl: str, events: list[Any]) -> None:
    s = resumable(impl)
    s.feed(sse(*events, done=False))
    assert s.resume_point() is None and s.resume() is False
    if s.state == 0:  # an error event now goes out as it did before
        error = json.dumps(ERROR).encode()
        assert s.feed(sse(error, done=False)) == (b"data: " + error + b"\n\n", 0, 0)
        assert s.failure is None and s.engine_error == error


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_without_enable_resume_nothing_is_kept(impl: str) -> None:
    s = session(impl)
    s.feed(sse(PROMPT, HELLO, done=False))
    assert s.resume_point() is None and s.resume() is False


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("route", ["chat", "completion"])
def test_the_error_event_is_held_back_and_a_continuation_may_break_again(
    impl: str, route: str
) -> None:
    first = [PROMPT, HELLO] if route == "chat" else [
        completion([cc("hi", prompt_token_ids=[1, 2], token_ids=[7, 8])])
    ]
    s = resumable(impl, route, expose_token_ids=True)
    s.feed(sse(*first, done=False))
    error = json.dumps(ERROR).encode()
    assert s.feed(sse(error)) == (b"", 0, 2)  # neither the event nor [DONE]
    assert s.failure == ("engine_error", "boom") and s.engine_error == error
    assert s.resume_point() == (b"[1,2,7,8]", 2) and s.resume()
    assert (s.failure, s.engine_error, s.state) == (None, None, 0)
    cont = completion([cc(" a", prompt_token_ids=[1, 2, 7, 8], token_ids=[9])])
    out, n, state = s.feed(sse(cont, error))
    assert (n, state, s.failure) == (1, 2, ("engine_error", "boom"))
    (event,) = [json.loads(line[6:]) for line in out.split(b"\n\n") if line]
    assert (event["id"], event["object"]) == (first[0]["id"], first[0]["object"])
    assert event["choices"][0]["token_ids"] == [9]
    assert s.resume_point() == (b"[1,2,7,8,9]", 3) and s.resume()
    out, n, state = s.feed(sse(completion([cc(" b", token_ids=[2], finish_reason="stop")])))
    assert (n, state, s.output_tokens) == (1, 1, 4) and out.endswith(DONE)
    assert s.resume_point() is None


def run_pumped(cls: Any, route: str, opts: dict[str, Any],
               hops: list[list[bytes]]) -> tuple[dict[str, Any], list[bytes]]:
    """As ``run``, each engine's reads sent raw (one chunk per read, the last chunk after the
    last) through start_pump/pump: the flags, what each hop wrote and the state change's read;
    and the client's bytes per hop, de-chunked."""
    s = cls(route, **opts)
    s.enable_resume()
    seen: list[Any] = []
    client: list[bytes] = []
    for hop, reads in enumerate(hops):
        if hop:
            seen.append((s.resume_point(), s.failure and s.failure[0], s.engine_error))
            if not s.resume():
                seen.append(False)
                break
        written: list[bytes] = []
        s.start_pump(written.append)
        wire = [b"%x\r\n%b\r\n" % (len(r), r) for r in reads if r] + [b"0\r\n\r\n"]
        flags, out = [], b""
        for r in wire:
            flags.append(s.pump(r))
            if flags[-1] & stream_oracle.STATE:
                out_state = s.last_read()
                seen.append(out_state)
                out += b"".join(dechunk(w) for w in written) + out_state[0]
                written.clear()
        out += b"".join(dechunk(w) for w in written)
        seen.append(flags)
        client.append(out)
    result = {"seen": seen, "point": s.resume_point(), "failure": s.failure and s.failure[0],
              "events": s.events, "output_tokens": s.output_tokens}
    return result, client


def dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    ChunkedDecoder().feed(data, out.append)
    return b"".join(out)


@pytest.mark.parametrize("route", ["chat", "completion"])
@SETTINGS
@given(data=st.data())
def test_resumed_streams_pumped_match_the_oracle_and_feed(route: str,
                                                         data: st.DataObject) -> None:
    case = data.draw(resumed_stream(route))
    rust, client = run_pumped(IMPLS["rust"], route, case["opts"], case["hops"])
    assert (rust, client) == run_pumped(IMPLS["oracle"], route, case["opts"], case["hops"])
    fed = run(IMPLS["rust"], route, case["opts"], case["hops"])
    feeds = [hop for hop in fed["seen"] if isinstance(hop, list)]
    assert client == [b"".join(out for out, _, _ in hop) for hop in feeds]
    assert (rust["point"], rust["failure"], rust["output_tokens"]) == (
        fed["point"], fed["failure"], fed["output_tokens"])
