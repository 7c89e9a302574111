"""Workload sizing: how many prompt tokens a validated request brings."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from narwhal.request.parse import Parsed

if TYPE_CHECKING:
    from narwhal.fleet.engine import Engine

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4  # role and separators the chat template adds around each message
TOKENS_PER_CHAT = 3  # the assistant turn the template opens


class Sizer(Protocol):
    """Counts a request's prompt tokens; may await (a tokenizer thread, an engine call)."""

    async def size(self, parsed: Parsed) -> int: ...


def chat_overhead(parsed: Parsed) -> int:
    """Template tokens a chat request adds around its text: 4 per message + 3; 0 for completions."""
    if parsed.route != "chat":
        return 0
    return TOKENS_PER_MESSAGE * parsed.messages + TOKENS_PER_CHAT


class EstimateSizer:
    """The documented estimate: ceil(chars / 4) + chat overhead, token-id prompts counted exactly.

    `chars` is `Parsed.prompt_text_chars`: message text and text parts, assistant tool-call
    names and arguments, and the JSON of tool definitions. Images and audio count nothing.
    """

    __slots__ = ()

    async def size(self, parsed: Parsed) -> int:
        return self.size_now(parsed)

    @staticmethod
    def size_now(parsed: Parsed) -> int:
        """The same estimate, synchronously (it never blocks)."""
        text_tokens = -(-parsed.prompt_text_chars // CHARS_PER_TOKEN)
        return text_tokens + parsed.prompt_token_ids + chat_overhead(parsed)


class TokenizerSizer:
    """Counts text with a Hugging Face `tokenizers` tokenizer.json, in a thread executor.

    The `tokenizers` package is optional and imported only here. The chat template is not
    applied: text pieces are counted without special tokens, plus the chat overhead above.
    """

    __slots__ = ("_executor", "_tokenizer")

    def __init__(self, tokenizer_json: str, *, executor: Executor | None = None) -> None:
        try:
            tokenizers = importlib.import_module("tokenizers")
        except ImportError as exc:
            raise ImportError("TokenizerSizer needs the optional `tokenizers` package "
                              "(pip install tokenizers)") from exc
        self._tokenizer: Any = tokenizers.Tokenizer.from_file(tokenizer_json)
        self._executor = executor  # None: the loop's default executor

    async def size(self, parsed: Parsed) -> int:
        texts = list(prompt_texts(parsed))
        counted = 0
        if texts:
            loop = asyncio.get_running_loop()
            counted = await loop.run_in_executor(self._executor, self.count, texts)
        return counted + parsed.prompt_token_ids + chat_overhead(parsed)

    def count(self, texts: list[str]) -> int:
        """Tokens in `texts` (blocking: call from a worker thread)."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return sum(len(e.ids) for e in encodings)


def prompt_texts(parsed: Parsed) -> Iterator[str]:
    """The text pieces of a validated request, in order (those `prompt_text_chars` counts)."""
    body = parsed.body
    if parsed.route != "chat":
        prompt = body["prompt"]
        if type(prompt) is str:
            yield prompt
        elif type(prompt[0]) is str:
            yield from prompt
        return
    for m in body["messages"]:
        content = m.get("content")
        if type(content) is str:
            yield content
        elif type(content) is list:
            for part in content:
                text = part.get("text")
                if type(text) is str:
                    yield text
        calls = m.get("tool_calls")
        if type(calls) is list:
            for call in calls:
                fn = call.get("function") if type(call) is dict else None
                if type(fn) is dict:
                    for key in ("name", "arguments"):
                        v = fn.get(key)
                        if type(v) is str:
                            yield v
    tools = body.get("tools")
    if tools:
        yield orjson.dumps(tools).decode()


class EngineSizer:
    """Asks an engine's ``/tokenize`` (vLLM and SGLang have it) for the exact prompt count.

    Engines are asked in turn among those serving the request's model; any failure, a
    timeout or a prompt shape ``/tokenize`` cannot take (a list of prompts) falls back to the
    estimate, so sizing never blocks a request for longer than ``timeout_s``.
    """

    DIALECTS = frozenset({"vllm", "sglang"})

    def __init__(self, engines: Sequence[Engine], *, timeout_s: float = 0.5) -> None:
        self._engines = [e for e in engines if e.config.dialect in self.DIALECTS]
        self._timeout_s = timeout_s
        self._turn = 0

    async def size(self, parsed: Parsed) -> int:
        body = self._tokenize_body(parsed)
        served = parsed.served
        serving = [e for e in self._engines
                   if e.serves() and (served is None or served.base.on(e.index))]
        if body is None or not serving:
            return EstimateSizer.size_now(parsed)
        self._turn = (self._turn + 1) % len(serving)
        engine = serving[self._turn]
        try:
            status, _, data = await engine.client.fetch(
                "POST", "/tokenize", orjson.dumps(body), timeout_s=self._timeout_s
            )
            if status == 200:
                count = orjson.loads(data).get("count")
                if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                    return count
        except Exception:  # an engine that cannot tokenize must not fail the request
            pass
        return EstimateSizer.size_now(parsed)

    @staticmethod
    def _tokenize_body(parsed: Parsed) -> dict[str, Any] | None:
        """The /tokenize request, naming the base model (an adapter shares its tokenizer and
        may not be loaded on the engine asked)."""
        body = parsed.body
        model = parsed.model if parsed.served is None else parsed.served.base.name
        if parsed.route == "chat":
            out: dict[str, Any] = {"model": model, "messages": body["messages"],
                                   "add_generation_prompt": True}
            if body.get("tools"):
                out["tools"] = body["tools"]
            return out
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return {"model": model, "prompt": prompt}
        return None  # token ids are counted exactly by the estimate; lists of prompts too
