"""Non-streaming response bodies with every field of the vLLM 0.32 captures, in order."""

from __future__ import annotations

from typing import Any

import orjson

from narwhal.sim import faults, logprobs
from narwhal.sim import segments as sg


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    details = {"cached_tokens": cached} if cached else None
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion, "prompt_tokens_details": details,
            "completion_tokens_details": None}


def _ids(value: list[int], asked: bool, fault: str | None) -> Any:
    if fault is not None:
        return faults.ids_value(fault, value)
    return value if asked else None


def _put_ids(choice: dict[str, Any], value: Any) -> None:
    if value is not ...:
        choice["token_ids"] = value


def chat_message(toks: list[sg.Tok], legacy_reasoning: bool, role: str = "assistant",
                 hide_reasoning: bool = False) -> dict[str, Any]:
    """Assemble the response message from the generated tokens (reasoning hidden with
    ``include_reasoning: false``)."""
    text: dict[str, list[str]] = {}
    calls: dict[int, dict[str, Any]] = {}
    function: dict[str, str] | None = None
    audio: Any = None
    annotations: Any = None
    for seg, _tid, _esc, raw in toks:
        kind = seg.kind
        if kind in sg.TEXT_SEGMENTS:
            text.setdefault(kind, []).append(raw)
        elif kind == "tool_head":
            calls[seg.index] = {"id": seg.meta["id"], "type": "function",
                                "function": {"name": seg.meta["name"], "arguments": ""}}
        elif kind == "tool_args" and seg.index in calls:
            calls[seg.index]["function"]["arguments"] += raw
        elif kind == "fn_name":
            function = {"name": seg.meta, "arguments": ""}
        elif kind == "fn_args" and function is not None:
            function["arguments"] += raw
        elif kind == "audio":
            audio = seg.meta
        elif kind == "annotations":
            annotations = seg.meta
            text.setdefault(sg.CONTENT_KIND, []).append(raw)
        elif kind == "custom_tool":
            call = dict(seg.meta)
            calls[len(calls) + 100] = {k: v for k, v in call.items() if k != "index"}

    def joined(kind: str) -> str | None:
        parts = text.get(kind)
        return "".join(parts) if parts is not None else None

    content = joined(sg.CONTENT_KIND)
    if content is None and not (calls or function or "refusal" in text):
        content = ""
    message: dict[str, Any] = {
        "role": role, "content": content, "refusal": joined("refusal"),
        "annotations": annotations, "audio": audio, "function_call": function,
    }
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    if legacy_reasoning:
        message["reasoning_content"] = None if hide_reasoning else joined("reasoning_content")
    else:
        message["reasoning"] = None if hide_reasoning else joined("reasoning")
    return message


def chat(rid: str, created: int, model: str, fingerprint: str, *, toks: list[sg.Tok],
         finish: str, prompt_ids: list[int], return_ids: bool, top_logprobs: int | None,
         legacy_reasoning: bool, id_fault: str | None, kv_transfer_params: Any = None,
         role: str = "assistant", echo: str | None = None,
         hide_reasoning: bool = False, cached: int = 0) -> bytes:
    """``chat.completion`` body. ``echo``: the echoed text when echo was asked (vLLM then
    prepends it to the content, even to none). ``hide_reasoning``: include_reasoning false
    (no reasoning, and null logprobs and token IDs)."""
    lp = None if top_logprobs is None or hide_reasoning else {
        "content": logprobs.chat_value(toks, top_logprobs)}
    message = chat_message(toks, legacy_reasoning, role, hide_reasoning)
    if echo is not None:
        message["content"] = echo + (message["content"] or "")
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "logprobs": lp, "finish_reason": finish, "stop_reason": None}
    _put_ids(choice, _ids([t[1] for t in toks], return_ids and not hide_reasoning, id_fault))
    choice["routed_experts"] = None
    return orjson.dumps({
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [choice], "service_tier": None, "system_fingerprint": fingerprint,
        "usage": _usage(len(prompt_ids), len(toks), cached), "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if return_ids else None, "prompt_text": None,
        "kv_transfer_params": kv_transfer_params, "ec_transfer_params": None, "metrics": None,
    })


def completion(rid: str, created: int, model: str, fingerprint: str, *,
               outputs: list[tuple[list[sg.Tok], str, list[int], str | None]],
               return_ids: bool, k: int | None, id_fault: str | None,
               kv_transfer_params: Any = None, echo_only: bool = False,
               cached: int = 0) -> bytes:
    """``text_completion`` body; ``outputs`` holds (tokens, finish, prompt ids, echoed text
    or None) per choice. ``echo_only``: echo with max_tokens 0 (the generated token is not
    shown, but counted and, when asked, its ID returned)."""
    choices = []
    prompt_total = completion_total = 0
    for index, (toks, finish, prompt_ids, echo) in enumerate(outputs):
        prompt_total += len(prompt_ids)
        completion_total += len(toks)
        shown = [] if echo is not None and echo_only else toks
        text = "".join(t[3] for t in shown)
        lp = prompt_lp = None
        if echo is None:
            if k is not None:
                lp = logprobs.completion_parts(toks, k, 0)[0]
        else:
            text = echo + text
            if k is not None:  # vLLM: echo asks prompt logprobs as many as logprobs
                scored = logprobs.prompt_toks(prompt_ids) + shown
                lp = logprobs.completion_parts(scored, k, 0, len(prompt_ids))[0]
                prompt_lp = logprobs.prompt_logprobs(prompt_ids, k)
        choice: dict[str, Any] = {"index": index, "text": text,
                                  "logprobs": lp, "finish_reason": finish, "stop_reason": None}
        _put_ids(choice, _ids([t[1] for t in toks], return_ids, id_fault))
        choice["prompt_logprobs"] = prompt_lp
        choice["prompt_token_ids"] = prompt_ids if return_ids else None
        choice["routed_experts"] = None
        choices.append(choice)
    return orjson.dumps({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "service_tier": None, "system_fingerprint": fingerprint,
        "usage": _usage(prompt_total, completion_total, cached),
        "kv_transfer_params": kv_transfer_params, "ec_transfer_params": None, "metrics": None,
    })
