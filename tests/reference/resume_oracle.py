"""Pure-Python reference of resuming a broken answer (``narwhal_core`` resume.rs), tests only.

A session with resume enabled keeps, from every event it accepted:

* the prompt's token IDs (the first ``prompt_token_ids`` list of the first engine),
* every generated token ID, in order,
* the first event's identity (``id``, ``created``, ``model`` and its first choice's
  ``index``), which every continuation event is given,
* whether the answer so far is plain generated text: one choice, and no reasoning, refusal,
  tool or function call, unknown field, logprobs or finish reason. Only then can a token-ID
  continuation on ``/v1/completions`` reproduce what follows.

A continuation event (a ``text_completion`` chunk) is rewritten into the original stream's
shape before the session reads it like any other event. A usage frame's usage counts the
original prompt once and the completion tokens of every engine.
"""

from __future__ import annotations

from typing import Any

from .oracle_json import CHOICE_KEYS, delta_of, dumps, is_uint, malformed

PLAIN_DELTA_KEYS = ("role", "content")
STRUCTURE_DELTA_KEYS = ("reasoning", "reasoning_content", "refusal", "tool_calls", "function_call")


def is_plain_text(choice: dict[str, Any]) -> bool:
    """No finish, logprobs, structure (reasoning, refusal, calls) or unknown non-null field."""
    if choice.get("finish_reason") is not None or choice.get("logprobs") is not None:
        return False
    if any(v is not None for k, v in choice.items() if k not in CHOICE_KEYS):
        return False
    return all(v is None for k, v in delta_of(choice).items() if k not in PLAIN_DELTA_KEYS)


class Resume:
    """What a session keeps so that its answer can go on on another engine."""

    def __init__(self) -> None:
        self.safe = True  # every output so far is plain generated text on one choice
        self.prompt: list[int] | None = None
        self.generated: list[int] = []
        self.head: dict[str, Any] | None = None  # id, created, model, index
        self.continuing = False  # reading a continuation: rewrite before processing
        self.base = 0  # IDs generated before the current continuation

    # -- reading the answer ----------------------------------------------------------------
    def accept(self, ev: dict[str, Any]) -> None:
        """An event the session accepted (validated, not an error event)."""
        choices = ev.get("choices") or []
        prompt_lists = [ev.get("prompt_token_ids")] + [c.get("prompt_token_ids") for c in choices]
        for ids in prompt_lists:
            if ids is not None and self.prompt is None and not self.continuing:
                self.prompt = list(ids)
        for c in choices:
            self.generated += c.get("token_ids") or []
        if self.head is None:
            if not choices:
                return
            self.head = {key: ev.get(key) for key in ("id", "created", "model")}
            self.head["index"] = choices[0].get("index")
        for c in choices:
            same_choice = dumps(c.get("index")) == dumps(self.head["index"])
            if not same_choice or not is_plain_text(c):
                self.safe = False

    def ready(self) -> bool:
        """The answer can continue on another engine from here."""
        return self.safe and self.prompt is not None and self.head is not None

    def prompt_json(self) -> bytes:
        """The continuation's token-ID prompt: the prompt's IDs, then the generated ones."""
        assert self.prompt is not None
        return dumps(self.prompt + self.generated)

    # -- reading a continuation ------------------------------------------------------------
    def begin(self, generated: int) -> None:
        self.continuing, self.base = True, generated

    def rewrite(self, ev: dict[str, Any], chat: bool) -> bytes:
        """A continuation event (completion chunk) in the original stream's shape."""
        if self.head is None:
            raise malformed("continuation before the first event")
        out: dict[str, Any] = {
            "id": self.head["id"],
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.head["created"],
            "model": self.head["model"],
            "choices": [
                rewrite_choice(c, chat, self.head["index"]) for c in ev.get("choices") or []
            ],
        }
        usage_only = ev.get("usage") is not None and ev.get("choices") == []
        if usage_only:
            out["usage"] = self.summed_usage(ev["usage"])
        elif not chat:
            out["usage"] = None  # vLLM's completion chunks carry every field
        if ev.get("system_fingerprint") is not None:
            out["system_fingerprint"] = ev["system_fingerprint"]
        return dumps(out)

    def summed_usage(self, usage: dict[str, Any]) -> dict[str, int]:
        """The original prompt once; the completion tokens of every engine so far."""
        completion_tokens = usage.get("completion_tokens")
        if completion_tokens is not None and not is_uint(completion_tokens):
            raise malformed(
                f"usage.completion_tokens must be a nonnegative integer, got {completion_tokens!r}"
            )
        prompt = len(self.prompt or [])
        completion = self.base + (completion_tokens or 0)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }


def rewrite_choice(c: dict[str, Any], chat: bool, index: Any) -> dict[str, Any]:
    """One continuation choice under the original choice ``index``. Chat: ``delta.content``
    (``stop_reason`` on the finish chunk only, as vLLM sends it); completions: ``text`` with
    every field of vLLM's completion choice."""
    text = c.get("text") if c.get("text") is not None else ""
    finish = c.get("finish_reason")
    choice: dict[str, Any] = {"index": index}
    choice |= {"delta": {"content": text}} if chat else {"text": text}
    choice |= {"logprobs": None, "finish_reason": finish}
    if not chat or finish is not None:
        choice["stop_reason"] = c.get("stop_reason")
    if chat:
        if c.get("token_ids") is not None:
            choice["token_ids"] = c["token_ids"]
    else:
        choice["prompt_token_ids"] = None  # the continuation's prompt is not the client's
        choice["token_ids"] = c.get("token_ids")
    return choice
