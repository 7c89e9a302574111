"""``narwhal serve --demo``, the README's main command, end to end with the openai SDK."""

from __future__ import annotations

import sys

import openai
import pytest
from procs import Proc, free_port

from narwhal.cli import DEMO_MODEL

pytestmark = pytest.mark.timeout(60)


def test_demo_streams_tokens_with_null_ids_and_exact_ids_when_asked() -> None:
    demo = Proc(
        [sys.executable, "-m", "narwhal", "serve", "--demo", "--port", str(free_port())],
        ready="narwhal serving",
    )
    try:
        client = openai.OpenAI(base_url=demo.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Say hello to the narwhals"}]
        text, ids_seen = "", []
        for chunk in client.chat.completions.create(
            model=DEMO_MODEL, messages=messages, max_tokens=12, stream=True
        ):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                ids_seen.append((choice.model_extra or {}).get("token_ids"))
        assert text
        assert ids_seen and all(ids is None for ids in ids_seen)

        streamed: list[int] = []
        prompt_ids = None
        for chunk in client.chat.completions.create(
            model=DEMO_MODEL,
            messages=messages,
            max_tokens=12,
            stream=True,
            extra_body={"return_token_ids": True},
        ):
            extra = chunk.model_extra or {}
            prompt_ids = prompt_ids or extra.get("prompt_token_ids")
            for choice in chunk.choices:
                streamed += (choice.model_extra or {}).get("token_ids") or []
        assert prompt_ids and all(isinstance(i, int) and i >= 0 for i in prompt_ids)
        # the exact IDs: the same request answered non-streaming carries the same list
        whole = client.chat.completions.create(
            model=DEMO_MODEL,
            messages=messages,
            max_tokens=12,
            extra_body={"return_token_ids": True},
        )
        assert streamed and streamed == (whole.choices[0].model_extra or {})["token_ids"]
        # ... and the engine's own answer, asked directly, has the same IDs
        engine_url = demo.ready_line.split("demo engines: ")[1].split()[0]
        direct = openai.OpenAI(base_url=engine_url + "/v1", api_key="none", max_retries=0)
        straight = direct.chat.completions.create(
            model=DEMO_MODEL,
            messages=messages,
            max_tokens=12,
            extra_body={"return_token_ids": True},
        )
        assert streamed == (straight.choices[0].model_extra or {})["token_ids"]
        assert prompt_ids == (straight.model_extra or {})["prompt_token_ids"]
    finally:
        demo.stop()
