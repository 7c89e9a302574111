"""Pure-Python reference of non-streaming assembly (the Rust assemble.rs), tests only."""

from __future__ import annotations

from typing import Any

from .oracle_json import (
    CHOICE_KEYS,
    OUTPUT_KEYS,
    delta_of,
    dumps,
    is_uint,
    malformed,
    unsupported,
    want,
)

DELTA_KEYS = frozenset({"role", *OUTPUT_KEYS})
CHAT_LOGPROB_KEYS = ("content", "refusal")
COMPLETION_LOGPROB_KEYS = ("text_offset", "token_logprobs", "tokens", "top_logprobs")


class Assembler:
    """Folds events into the vLLM-0.32-shaped non-streaming body."""

    def __init__(
        self,
        chat: bool,
        expose_token_ids: bool,
        *,
        strip_reasoning: bool = False,
        echo: bool = False,
    ) -> None:
        self.chat = chat
        self.expose = expose_token_ids
        self.strip = chat and strip_reasoning  # include_reasoning false
        self.echo = chat and echo
        self.meta: dict[str, Any] = {"id": None, "created": None, "model": None}
        self.system_fingerprint: Any = None
        self.usage: dict[str, Any] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.choices: dict[int, dict[str, Any]] = {}

    def prepare(self, ev: dict[str, Any]) -> None:
        """Malformed checks for the whole event, then unsupported-field checks."""
        lp_keys = CHAT_LOGPROB_KEYS if self.chat else COMPLETION_LOGPROB_KEYS
        choices = ev.get("choices") or []
        for c in choices:
            if not is_uint(c.get("index")):
                raise malformed(f"choices[].index must be a nonnegative integer: {c.get('index')}")
            delta = delta_of(c)
            for t in delta.get("tool_calls") or []:
                if not isinstance(t, dict):
                    raise malformed("tool_calls[] must be an object")
                if not is_uint(t.get("index")):
                    raise malformed("tool_calls[].index must be a nonnegative integer")
                want(t.get("id"), str, "tool_calls[].id")
                want(t.get("type"), str, "tool_calls[].type")
                fn = want(t.get("function"), dict, "tool_calls[].function") or {}
                want(fn.get("name"), str, "tool_calls[].function.name")
                want(fn.get("arguments"), str, "tool_calls[].function.arguments")
            fc = delta.get("function_call") or {}
            want(fc.get("name"), str, "delta.function_call.name")
            want(fc.get("arguments"), str, "delta.function_call.arguments")
            logprobs = want(c.get("logprobs"), dict, "logprobs") or {}
            for key in lp_keys:
                want(logprobs.get(key), list, f"logprobs.{key}")
            for key in ("stop_reason", "matched_stop"):
                v = c.get(key)
                if (
                    v is not None
                    and not isinstance(v, str)
                    and not (isinstance(v, int) and not isinstance(v, bool))
                ):
                    raise malformed(f"{key} must be a string or an integer, got {v!r}")
        for c in choices:
            for key, v in c.items():
                if key not in CHOICE_KEYS and v is not None:
                    raise unsupported(f"unsupported choice field `{key}`")
            for key, v in delta_of(c).items():
                if key not in DELTA_KEYS and v is not None:
                    raise unsupported(f"unsupported delta field `{key}`")
            for t in delta_of(c).get("tool_calls") or []:
                if t.get("custom") is not None:
                    raise unsupported("custom tool output is not supported")
                if t.get("type") is not None and t["type"] != "function":
                    raise unsupported(f"tool call type {t['type']!r} is not supported")

    def apply(self, ev: dict[str, Any]) -> None:
        for key in self.meta:
            if self.meta[key] is None:
                self.meta[key] = ev.get(key)
        if ev.get("system_fingerprint") is not None:
            self.system_fingerprint = ev["system_fingerprint"]
        if ev.get("usage") is not None:
            self.usage = dict(ev["usage"])
            self.usage.setdefault("prompt_tokens_details", None)
            self.usage.setdefault("completion_tokens_details", None)
        if self.prompt_token_ids is None:
            self.prompt_token_ids = ev.get("prompt_token_ids")
        for c in ev.get("choices") or []:
            if self.chat and self.prompt_token_ids is None:
                self.prompt_token_ids = c.get("prompt_token_ids")
            acc = self.choices.setdefault(c["index"], {"tools": {}})
            delta = delta_of(c)
            if delta.get("role") is not None:
                acc.setdefault("role", delta["role"])
            keys = (
                ("content", "refusal")
                if self.strip
                else ("content", "reasoning", "reasoning_content", "refusal")
            )
            for key in keys:
                if delta.get(key) is not None:
                    acc[key] = acc.get(key, "") + delta[key]
            if c.get("text") is not None:
                acc["text"] = acc.get("text", "") + c["text"]
            if delta.get("function_call") is not None:
                fc = acc.setdefault("function_call", {"name": "", "arguments": ""})
                for key in ("name", "arguments"):
                    fc[key] += delta["function_call"].get(key) or ""
            for t in delta.get("tool_calls") or []:
                tool = acc["tools"].setdefault(t["index"], {"id": "", "name": "", "arguments": ""})
                tool["id"] += t.get("id") or ""
                for key in ("name", "arguments"):
                    tool[key] += (t.get("function") or {}).get(key) or ""
            if c.get("logprobs") is not None and not self.strip:
                lp = acc.setdefault("logprobs", {})
                for key in CHAT_LOGPROB_KEYS if self.chat else COMPLETION_LOGPROB_KEYS:
                    if c["logprobs"].get(key) is not None:
                        lp[key] = lp.get(key, []) + c["logprobs"][key]
            if c.get("finish_reason") is not None:
                acc["finish_reason"] = c["finish_reason"]
            stop = next(
                (c[k] for k in ("stop_reason", "matched_stop") if c.get(k) is not None), None
            )
            if stop is not None:
                acc["stop_reason"] = stop
            if c.get("token_ids") is not None and not self.strip:
                acc["token_ids"] = acc.get("token_ids", []) + c["token_ids"]
            if not self.chat and acc.get("prompt_token_ids") is None:
                acc["prompt_token_ids"] = c.get("prompt_token_ids")

    def body(self, prompt_tokens: int, output_tokens: int) -> bytes:
        for i, acc in self.choices.items():
            for t_index, t in acc["tools"].items():
                if not t["id"]:
                    raise malformed(f"tool call {t_index} of choice {i} has no id")
                if not t["name"]:
                    raise malformed(f"tool call {t_index} of choice {i} has no function name")
        usage = self.usage or {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + output_tokens,
            "completion_tokens": output_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        choices = [self._choice(i, self.choices[i]) for i in sorted(self.choices)]
        head = {**self.meta, "object": "chat.completion" if self.chat else "text_completion"}
        body: dict[str, Any] = {k: head[k] for k in ("id", "object", "created", "model")}
        body |= {
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": self.system_fingerprint,
            "usage": usage,
        }
        if self.chat:
            body |= {
                "prompt_logprobs": None,
                "prompt_token_ids": self._ids(self.prompt_token_ids),
                "prompt_text": None,
            }
        body |= {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        return dumps(body)

    def _ids(self, ids: list[int] | None) -> list[int] | None:
        return ids if self.expose else None

    def _choice(self, index: int, acc: dict[str, Any]) -> dict[str, Any]:
        lp = acc.get("logprobs")
        out: dict[str, Any] = {"index": index}
        if self.chat:
            tools = [acc["tools"][k] for k in sorted(acc["tools"])]
            content = acc.get("content")
            if self.echo:  # vLLM prepends the echoed text to a string, even to nothing
                content = content or ""
            elif tools and not content:
                content = None
            message: dict[str, Any] = {
                "role": acc.get("role", "assistant"),
                "content": content,
                "refusal": acc.get("refusal"),
                "annotations": None,
                "audio": None,
                "function_call": acc.get("function_call"),
            }
            if tools:
                message["tool_calls"] = [
                    {
                        "id": t["id"],
                        "type": "function",
                        "function": {"name": t["name"], "arguments": t["arguments"]},
                    }
                    for t in tools
                ]
            message["reasoning"] = acc.get("reasoning")
            if "reasoning_content" in acc:
                message["reasoning_content"] = acc["reasoning_content"]
            if lp is not None:
                lp = {"content": lp.get("content")} | (
                    {"refusal": lp["refusal"]} if "refusal" in lp else {}
                )
            out |= {"message": message, "logprobs": lp}
        else:
            if lp is not None:
                lp = {k: lp.get(k) for k in COMPLETION_LOGPROB_KEYS}
            out |= {"text": acc.get("text", ""), "logprobs": lp}
        out |= {
            "finish_reason": acc.get("finish_reason"),
            "stop_reason": acc.get("stop_reason"),
            "token_ids": self._ids(acc.get("token_ids")),
        }
        if not self.chat:
            out |= {
                "prompt_logprobs": None,
                "prompt_token_ids": self._ids(acc.get("prompt_token_ids")),
            }
        return out | {"routed_experts": None}
