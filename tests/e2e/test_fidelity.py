"""Fidelity to vLLM 0.32 end to end through the real router: ``include_reasoning: false`` and
``echo`` reach the client byte for byte as the engine answers them when called directly.

Each request goes to the simulator directly and through the router (same X-Request-Id, so the
same id; ``created`` is masked). Each routed request is counted completed, with no failure and
no failed engine attempt.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from procs import MODEL, Proc, metrics, router_config, start_router, start_sim
from test_admission import post, settle

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
THINK = [{"role": "user", "content": "Why is the sky blue? [[sim:reasoning]]"}]
MARKUP = [{"role": "user", "content": "Think it over [[sim:reasoning,id_only_events]]"}]
CONTINUE = [
    {"role": "user", "content": "Tell me a story"},
    {"role": "assistant", "content": "Once upon a time, é 👋"},
]
CREATED = re.compile(rb'"created":\d+')


@pytest.fixture(scope="module")
def sim() -> Iterator[Proc]:
    proc = start_sim("--tpot-ms", "1", "--prefill-tokens-per-s", "500000", "--output-len", "14")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def router(sim: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_router(tmp_path_factory.mktemp("fidelity"), router_config([sim.url]))
    yield proc
    proc.stop()


def counted(before: dict[str, float], after: dict[str, float], prefix: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))


def same_answer(router: Proc, sim: Proc, path: str, body: dict[str, Any]) -> bytes:
    """The routed answer equals the engine's own; the request is counted completed, with
    nothing against the engine. Returns the routed body."""
    headers = {"x-request-id": f"fid-{uuid.uuid4().hex[:12]}"}
    before = metrics(router.url)
    status, _, routed = post(router.url, path, body, headers)
    status_direct, _, direct = post(sim.url, path, body, headers)
    assert (status, status_direct) == (200, 200), (routed, direct)
    assert CREATED.sub(b"", routed) == CREATED.sub(b"", direct)
    after = settle(router.url)
    assert counted(before, after, "narwhal_completed_total") == 1
    for prefix in (
        "narwhal_failed_total",
        "narwhal_invalid_requests_total",
        "narwhal_engine_attempt_failures_total",
    ):
        assert counted(before, after, prefix) == 0, prefix
    return routed


def events(raw: bytes) -> list[Any]:
    return [json.loads(b[6:]) for b in raw.split(b"\n\n") if b.startswith(b"data: {")]


def deltas(raw: bytes) -> list[dict[str, Any]]:
    return [c["delta"] for e in events(raw) for c in e["choices"]]


# --- include_reasoning: false ------------------------------------------------------------


@pytest.mark.parametrize(
    "ask",
    [
        {"return_token_ids": True, "logprobs": True, "top_logprobs": 2},
        {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {},
    ],
    ids=["ids+logprobs", "continuous-usage", "plain"],
)
@pytest.mark.parametrize("messages", [THINK, MARKUP], ids=["reasoning", "markup"])
def test_hidden_reasoning_streams_as_vllm(
    router: Proc, sim: Proc, ask: dict[str, Any], messages: list[dict[str, Any]]
) -> None:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 40,
        "stream": True,
        "include_reasoning": False,
        **ask,
    }
    routed = same_answer(router, sim, CHAT, body)
    assert not any("reasoning" in d for d in deltas(routed))
    assert "".join(d.get("content") or "" for d in deltas(routed))  # the answer came through
    for e in events(routed):
        for c in e["choices"]:
            assert c.get("token_ids") is None and c["logprobs"] is None


@pytest.mark.parametrize("ask", [{"return_token_ids": True, "logprobs": True}, {}])
def test_hidden_reasoning_assembles_as_vllm(router: Proc, sim: Proc, ask: dict[str, Any]) -> None:
    body = {"model": MODEL, "messages": THINK, "max_tokens": 40, "include_reasoning": False, **ask}
    answer = json.loads(same_answer(router, sim, CHAT, body))
    choice = answer["choices"][0]
    assert choice["message"]["reasoning"] is None and choice["message"]["content"]
    assert choice["token_ids"] is None and choice["logprobs"] is None


def test_hidden_reasoning_cut_during_reasoning(router: Proc, sim: Proc) -> None:
    body = {"model": MODEL, "messages": THINK, "max_tokens": 3, "include_reasoning": False}
    routed = same_answer(router, sim, CHAT, body | {"stream": True})
    assert deltas(routed)[-1] == {}
    assert (
        json.loads(same_answer(router, sim, CHAT, body))["choices"][0]["message"]["content"] == ""
    )


def test_hidden_reasoning_with_a_grammar_goes_through_unchanged(router: Proc, sim: Proc) -> None:
    body = {
        "model": MODEL,
        "messages": THINK,
        "max_tokens": 20,
        "include_reasoning": False,
        "response_format": {"type": "json_object"},
        "return_token_ids": True,
    }
    same_answer(router, sim, CHAT, body | {"stream": True})
    same_answer(router, sim, CHAT, body)


def test_openai_sdk_without_reasoning(router: Proc) -> None:
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL, messages=THINK, max_tokens=30, extra_body={"include_reasoning": False}
    )
    message = out.choices[0].message
    assert message.content and (message.model_extra or {}).get("reasoning") is None
    shown = client.chat.completions.create(model=MODEL, messages=THINK, max_tokens=30)
    assert (shown.choices[0].message.model_extra or {}).get("reasoning")
    assert out.usage == shown.usage  # the hidden reasoning is still generated output


# --- echo --------------------------------------------------------------------------------

CHAT_ECHO = {
    "plain": {},
    "ids": {"return_token_ids": True},
    "continue": {"add_generation_prompt": False, "continue_final_message": True},
    "usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
}


@pytest.mark.parametrize(
    ("stream", "ask"),
    [
        *((True, ask) for ask in CHAT_ECHO.values()),
        *((False, ask) for ask in CHAT_ECHO.values() if "stream_options" not in ask),
    ],
    ids=[*(f"stream-{k}" for k in CHAT_ECHO), *(k for k in CHAT_ECHO if k != "usage")],
)
def test_chat_echo_as_vllm(router: Proc, sim: Proc, stream: bool, ask: dict[str, Any]) -> None:
    body = {
        "model": MODEL,
        "messages": CONTINUE,
        "max_tokens": 10,
        "echo": True,
        "stream": stream,
        **ask,
    }
    routed = same_answer(router, sim, CHAT, body)
    if stream:
        assert deltas(routed)[1] == {"content": CONTINUE[-1]["content"]}
    else:
        content = json.loads(routed)["choices"][0]["message"]["content"]
        assert content.startswith(CONTINUE[-1]["content"])


def test_chat_echo_of_the_user_turn_without_a_generation_prompt(router: Proc, sim: Proc) -> None:
    body = {
        "model": MODEL,
        "messages": CONTINUE[:1],
        "max_tokens": 6,
        "echo": True,
        "add_generation_prompt": False,
    }
    answer = json.loads(same_answer(router, sim, CHAT, body))
    assert answer["choices"][0]["message"]["role"] == "user"
    same_answer(router, sim, CHAT, body | {"stream": True})


def test_chat_echo_is_not_output(router: Proc) -> None:
    """The echoed text is prompt: the output-length histogram gets the generated tokens."""
    body = {"model": MODEL, "messages": CONTINUE, "max_tokens": 10, "echo": True}
    before = metrics(router.url)
    status, _, raw = post(router.url, CHAT, body)
    after = settle(router.url)
    assert status == 200
    generated = json.loads(raw)["usage"]["completion_tokens"]
    assert counted(before, after, "narwhal_output_tokens_sum") == generated


CMPL_ECHO = {
    "text": {"max_tokens": 5},
    "ids": {"max_tokens": 5, "return_token_ids": True},
    "prompt-only": {"max_tokens": 0},
    "prompt-only-ids": {"max_tokens": 0, "return_token_ids": True},
    "token-prompt": {"max_tokens": 4, "prompt": [1, 300, 301, 302]},
}


@pytest.mark.parametrize(
    ("stream", "ask"),
    [
        *((True, ask) for ask in CMPL_ECHO.values()),
        *((False, ask) for ask in CMPL_ECHO.values()),
        # Several prompts only assembled: streamed, their choices interleave as timing has it.
        (False, {"max_tokens": 3, "prompt": ["Say hi", "Count to three"]}),
    ],
    ids=[*(f"stream-{k}" for k in CMPL_ECHO), *CMPL_ECHO, "two-prompts"],
)
def test_completion_echo_as_vllm(
    router: Proc, sim: Proc, stream: bool, ask: dict[str, Any]
) -> None:
    body = {"model": MODEL, "prompt": "Say hi", "echo": True, "stream": stream, **ask}
    routed = same_answer(router, sim, CMPL, body)
    if not stream and ask == {"max_tokens": 0}:
        assert json.loads(routed)["choices"][0]["text"] == "Say hi"


def test_completion_echo_streams_logprobs_as_vllm(router: Proc, sim: Proc) -> None:
    body = {
        "model": MODEL,
        "prompt": "Say hi",
        "echo": True,
        "stream": True,
        "max_tokens": 4,
        "logprobs": 2,
    }
    routed = same_answer(router, sim, CMPL, body)
    assert events(routed)[0]["choices"][0]["logprobs"]["token_logprobs"][0] is None


def test_openai_sdk_echo_with_max_tokens_zero(router: Proc) -> None:
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(model=MODEL, prompt="Say hi", echo=True, max_tokens=0)
    assert out.choices[0].text == "Say hi"
    assert out.usage is not None and out.usage.completion_tokens == 1  # vLLM ran one step
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="Say hi", echo=True, max_tokens=0, stream=True
        )
    )
    assert text == "Say hi"
