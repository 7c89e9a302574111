"""The simulator's served names and LoRA adapters, as vLLM answers them: several
--served-model-name, --lora, /v1/models cards, runtime load and unload, and the name each
answer carries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from narwhal.sim import SimSettings
from narwhal.sim.cli import add_arguments, settings_from

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import Harness, run_async

pytestmark = pytest.mark.timeout(30)


def chat(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": stream}


def test_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "/models/llama", "--served-model-name", "a", "b",
                              "--served-model-name", "c", "--lora", "sql=/p/sql",
                              "--lora", "chat"])
    settings = settings_from(args)
    assert settings.served_names == ("a", "b", "c") and settings.served_model == "a"
    assert settings.loras == {"sql": "/p/sql", "chat": "/adapters/chat"}
    assert SimSettings(model="m").served_names == ("m",)
    with pytest.raises(ValueError, match="clash"):
        SimSettings(model="m", loras={"m": "/p"})


def test_names_adapters_and_runtime_loading() -> None:
    async def go() -> dict[str, Any]:
        h = Harness(model="/models/llama", served_names=("llama", "llama-alt"),
                    loras={"sql": "/p/sql"})
        out: dict[str, Any] = {}
        try:
            async def call(key: str, method: str, path: str, body: Any = None) -> None:
                r, _ = await h.request(method, path, body)
                out[key] = r

            await call("models", "GET", "/v1/models")
            await call("alt", "POST", "/v1/chat/completions", chat("llama-alt"))
            await call("sql", "POST", "/v1/chat/completions", chat("sql"))
            await call("sql stream", "POST", "/v1/chat/completions", chat("sql", True))
            await call("unknown", "POST", "/v1/chat/completions", chat("nope"))
            await call("load", "POST", "/v1/load_lora_adapter",
                       {"lora_name": "new", "lora_path": "/p/new"})
            await call("load again", "POST", "/v1/load_lora_adapter",
                       {"lora_name": "new", "lora_path": "/p/new"})
            await call("load bad", "POST", "/v1/load_lora_adapter", {"lora_name": "x"})
            await call("new", "POST", "/v1/chat/completions", chat("new"))
            await call("tokenize", "POST", "/tokenize", {"model": "new", "prompt": "hi"})
            await call("models 2", "GET", "/v1/models")
            await call("unload", "POST", "/v1/unload_lora_adapter", {"lora_name": "new"})
            await call("unload again", "POST", "/v1/unload_lora_adapter", {"lora_name": "new"})
            await call("unload bad", "POST", "/v1/unload_lora_adapter", {})
            await call("gone", "POST", "/v1/chat/completions", chat("new"))
            return out
        finally:
            h.close()

    out = run_async(go())
    cards = out["models"].json()["data"]
    assert [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in cards] == [
        ("llama", "/models/llama", None, 8192), ("llama-alt", "/models/llama", None, 8192),
        ("sql", "/p/sql", "llama", None)]
    assert out["alt"].json()["model"] == "llama"  # the first served name, as vLLM answers
    assert out["sql"].json()["model"] == "sql"
    assert b'"model":"sql"' in out["sql stream"].body
    assert out["unknown"].status == 404
    assert out["unknown"].json()["error"]["type"] == "NotFoundError"
    assert (out["load"].status, out["load"].body) == (
        200, b"Success: LoRA adapter 'new' added successfully.")
    assert out["load again"].status == 400
    assert out["load again"].json()["error"]["type"] == "InvalidUserInput"
    assert out["load bad"].json()["error"]["message"] == (
        "Both 'lora_name' and 'lora_path' must be provided.")
    assert out["new"].json()["model"] == "new" and out["tokenize"].status == 200
    assert [c["id"] for c in out["models 2"].json()["data"]][-1] == "new"
    assert (out["unload"].status, out["unload"].body) == (
        200, b"Success: LoRA adapter 'new' removed successfully.")
    assert out["unload again"].status == 404
    assert out["unload again"].json()["error"]["message"] == (
        "The lora adapter 'new' cannot be found.")
    assert out["unload bad"].status == 400
    assert out["gone"].status == 404
