"""Workload sizing (admission/sizing.py): the documented estimate and the optional tokenizer."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from narwhal.admission.sizing import EstimateSizer, Sizer, TokenizerSizer, prompt_texts
from narwhal.request.parse import Parsed, parse_request

MODEL = "m"


def parsed(route: str, **fields: Any) -> Parsed:
    return parse_request(route, orjson.dumps({"model": MODEL, **fields}), model=MODEL)


def size(sizer: Sizer, p: Parsed) -> int:
    return asyncio.run(sizer.size(p))


@pytest.mark.parametrize(("route", "fields", "expected"), [
    ("completion", {"prompt": "abcd"}, 1),
    ("completion", {"prompt": "abcde"}, 2),  # ceil(5 / 4)
    ("completion", {"prompt": ""}, 0),
    ("completion", {"prompt": ["abcd", "abcd"]}, 2),
    ("completion", {"prompt": [1, 2, 3]}, 3),  # token ids counted exactly
    ("completion", {"prompt": [[1, 2], [3, 4, 5]]}, 5),
    ("chat", {"messages": [{"role": "user", "content": "abcdefgh"}]}, 2 + 4 + 3),
    ("chat", {"messages": [{"role": "system", "content": "a"},
                           {"role": "user", "content": [{"type": "text", "text": "bcd"},
                                                        {"type": "image_url"}]}]}, 1 + 8 + 3),
    ("chat", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "fn", "arguments": "{}"}}]}]}, 1 + 4 + 3),
])
def test_estimate(route: str, fields: dict[str, Any], expected: int) -> None:
    p = parsed(route, **fields)
    assert size(EstimateSizer(), p) == expected == EstimateSizer.size_now(p)


def test_estimate_counts_tool_definitions() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    with_tools = parsed("chat", messages=[{"role": "user", "content": "hi"}], tools=tools)
    without = parsed("chat", messages=[{"role": "user", "content": "hi"}])
    extra = size(EstimateSizer(), with_tools) - size(EstimateSizer(), without)
    assert extra == -(-(2 + len(orjson.dumps(tools))) // 4) - 1


def test_prompt_texts_match_the_counted_characters() -> None:
    p = parsed("chat", messages=[
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "input_audio"}]},
        {"role": "assistant", "content": "cde", "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    ], tools=[{"type": "function", "function": {"name": "g"}}])
    assert sum(map(len, prompt_texts(p))) == p.prompt_text_chars
    assert list(prompt_texts(parsed("completion", prompt=[1, 2]))) == []
    assert list(prompt_texts(parsed("completion", prompt=["a", "b"]))) == ["a", "b"]


def test_tokenizer_sizer_reports_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_tokenizers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tokenizers":
            raise ImportError("no tokenizers here")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "tokenizers", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_tokenizers)
    with pytest.raises(ImportError, match="optional `tokenizers` package"):
        TokenizerSizer("/nonexistent/tokenizer.json")


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "the": 3, "cat": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_tokenizer_sizer_counts_in_a_thread(tokenizer_json: str) -> None:
    loop_thread: list[int] = []
    seen: list[int] = []

    class Spy(TokenizerSizer):
        def count(self, texts: list[str]) -> int:
            seen.append(threading.get_ident())
            return super().count(texts)

    sizer = Spy(tokenizer_json)

    async def run() -> tuple[int, int, int]:
        loop_thread.append(threading.get_ident())
        chat = parsed("chat", messages=[{"role": "user", "content": "hello world the cat"},
                                        {"role": "assistant", "content": "dog"}])
        cmpl = parsed("completion", prompt="the cat")
        ids = parsed("completion", prompt=[5, 6, 7])
        return await sizer.size(chat), await sizer.size(cmpl), await sizer.size(ids)

    assert asyncio.run(run()) == (5 + 2 * 4 + 3, 2, 3)
    assert seen and all(t != loop_thread[0] for t in seen)  # never on the loop's thread
