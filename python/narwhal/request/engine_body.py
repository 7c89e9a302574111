"""What the engine is sent: the client's body rewritten for the relay or for a prefill leg.

Narwhal always streams from the engine and asks token-ID engines for IDs every token. It
asks for usage only where it needs it: to assemble a non-streaming answer, or to count
output on engines without token IDs (then the client's own choice is restored on the way
back). A disaggregated request's prefill leg (vLLM NIXL proxy protocol) gets the client's
body with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` where sent), ``stream:
false``, no ``stream_options`` / ``min_tokens`` / ``min_completion_tokens``, and
``kv_transfer_params`` asking for a remote decode.

Two client options change what vLLM answers once IDs are asked, so the router asks the
engine differently and tells the session (:func:`engine_request`) what to take back out:

* ``include_reasoning: false`` (chat): vLLM would null every ``token_ids``. The engine is
  asked with reasoning included and the session strips the reasoning, IDs and logprobs
  the client would not have had. Where the output is constrained (structured outputs, a
  required or named tool), vLLM's ``include_reasoning: false`` also changes what is
  generated (the grammar holds from the first token): the engine then gets the client's
  request without IDs, and output is counted from usage.
* completions ``echo: true``: with ``return_token_ids`` vLLM echoes ``""`` instead of the
  prompt text, so IDs are asked only when the client asked them; otherwise output is
  counted from usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import orjson

from narwhal.request.parse import Parsed

ROUTE_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
"""The engine path of each completion route."""

REMOTE_DECODE: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
_PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")
# Request fields that constrain generation by a grammar (vLLM structured outputs).
_CONSTRAINTS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
                "guided_grammar", "structural_tag")


class SessionOptions(TypedDict):
    """``StreamSession`` keywords that follow from what the engine was asked."""

    drop_usage: bool
    require_token_ids: bool
    strip_reasoning: bool
    echo: bool
    model: str | None  # the client's name for the model, every answer's `model`


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One attempt's request to the engine, and what its session must know of it."""

    body: bytes
    session: SessionOptions


def asks_token_ids(parsed: Parsed, token_ids: bool) -> bool:
    """Whether the engine is asked for token IDs: it returns them (``token_ids``) and
    asking does not change the answer the client would have had."""
    if not token_ids:
        return False
    if parsed.echo and parsed.route == "completion":
        return parsed.return_token_ids
    return parsed.include_reasoning or not _constrained(parsed.body)


def _constrained(body: dict[str, Any]) -> bool:
    """The request constrains the output by a grammar (structured outputs, or a tool call
    that must be made)."""
    if any(body.get(k) is not None for k in _CONSTRAINTS):
        return True
    fmt = body.get("response_format")
    if type(fmt) is dict and fmt.get("type") not in (None, "text"):
        return True
    choice = body.get("tool_choice")
    return bool(body.get("tools")) and (choice == "required" or type(choice) is dict)


def engine_request(parsed: Parsed, *, token_ids: bool,
                   kv_params: dict[str, Any] | None = None, usage: bool = False) -> EngineRequest:
    """What the engine is sent, and the session options that take back out what the client
    did not ask for.

    ``token_ids``: the engine returns validated token IDs (``return_token_ids``).
    ``kv_params``: a disaggregated decode leg carries the prefill engine's reply verbatim.
    ``usage``: ask the engine for usage even when the IDs count the tokens (the prefix index
    reads its ``prompt_tokens_details.cached_tokens``); dropped unless the client asked.
    """
    ids = asks_token_ids(parsed, token_ids)
    strip = ids and not parsed.include_reasoning
    body, drop_usage = _body(parsed, ids, strip, kv_params, usage)
    return EngineRequest(body, {"drop_usage": drop_usage, "require_token_ids": ids,
                                "strip_reasoning": strip, "echo": parsed.echo,
                                "model": parsed.answer_model})


def _body(parsed: Parsed, ids: bool, strip: bool,
          kv_params: dict[str, Any] | None, usage: bool = False) -> tuple[bytes, bool]:
    body: dict[str, Any] = dict(parsed.body)
    if kv_params is not None:
        body["kv_transfer_params"] = kv_params
    body["stream"] = True
    drop_usage = False
    if ids:
        body["return_token_ids"] = True
        body["stream_interval"] = 1
    if strip:
        del body["include_reasoning"]  # reasoning and IDs come back; the session strips
    if not parsed.stream:
        body["stream_options"] = {"include_usage": True}
    elif (usage or not ids) and not parsed.include_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
        drop_usage = True
    return orjson.dumps(body), drop_usage


def prefill_body(parsed: Parsed) -> bytes:
    """The prefill leg's body (TOY_PROXY step 2)."""
    body: dict[str, Any] = {k: v for k, v in parsed.body.items() if k not in _PREFILL_DROPPED}
    body["kv_transfer_params"] = dict(REMOTE_DECODE)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return orjson.dumps(body)


# -- migration: resuming a broken answer on another engine ---------------------------------
# Chat-only (or prompt-shaping) fields a token-ID continuation on /v1/completions does not
# take: the prompt is already the template's output plus the answer so far.
_NOT_CONTINUED = frozenset({
    "messages", "prompt", "tools", "tool_choice", "functions", "function_call",
    "parallel_tool_calls", "response_format", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "documents", "echo", "reasoning_effort",
    "max_completion_tokens", "max_tokens", "stream_options", "include_reasoning", "modalities",
    "audio", "suffix", "n", "best_of", "logprobs", "top_logprobs", "prompt_logprobs",
    "return_token_ids", "stream", "stream_interval", "add_special_tokens", "mm_processor_kwargs",
    "kv_transfer_params", "min_tokens", "min_completion_tokens",
})
_PENALTIES = ("presence_penalty", "frequency_penalty")


def resumable(parsed: Parsed) -> bool:
    """Whether a token-ID continuation can reproduce the rest of this request's answer (the
    request-level half of the rules in docs/reliability.md; the stream-level half, plain
    generated text so far, is the session's): one choice, no logprobs, no grammar, no tools
    the engine's parser could open after the break, no stop strings (one could span the
    break), no echo, no stripped reasoning, no per-chunk usage, no penalties over the output
    so far (they would count it as prompt)."""
    body = parsed.body
    if parsed.logprobs or parsed.echo or not parsed.include_reasoning or parsed.continuous_usage:
        return False
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return False
    if body.get("prompt_logprobs") is not None or body.get("suffix") is not None:
        return False
    if body.get("stop") or _constrained(body):
        return False
    if any(body.get(k) for k in _PENALTIES):
        return False
    if parsed.route == "chat":
        offers_tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
        return not offers_tools and not body.get("functions")
    prompt = body.get("prompt")
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and ((len(prompt) == 1 and isinstance(prompt[0], str))
                                      or all(type(p) is int for p in prompt)))


def continuation_body(parsed: Parsed, prompt_ids: bytes, generated: int, *,
                      usage: bool) -> bytes:
    """The continuation request for ``/v1/completions``: the token-ID prompt (the prompt's
    IDs then the ``generated`` ones, a JSON list as the session gives it), ``max_tokens``
    less what was generated (null without a limit: vLLM's completions default is 16), the
    client's sampling parameters, IDs every token; ``usage``: ask usage (the first
    attempt did)."""
    body: dict[str, Any] = {k: v for k, v in parsed.body.items() if k not in _NOT_CONTINUED}
    body["prompt"] = orjson.Fragment(prompt_ids)
    limit = parsed.max_tokens
    body["max_tokens"] = None if limit is None else limit - generated
    floor = parsed.body.get("min_tokens")
    if type(floor) is int and floor > generated:
        body["min_tokens"] = floor - generated
    body["stream"] = True
    body["return_token_ids"] = True
    body["stream_interval"] = 1
    if usage:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)
