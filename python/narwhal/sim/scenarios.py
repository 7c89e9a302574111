"""Content plans: the exact tokens one request will generate, by scenario.

A plan is built once per request (not per token). Plain content reads a window of a fixed
pseudo-random token run and ends with EOS (finish ``stop``) unless ``max_tokens`` cuts it
(``length``). Tool calls, legacy function calls, reasoning and refusals follow the shapes
vLLM streams (tool-call head with id/type/index/name first, then argument fragments).
"""

from __future__ import annotations

import json
import random
import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from narwhal.sim import segments as sg
from narwhal.sim import tokenizer
from narwhal.sim.directives import PAYLOAD_FAULTS, Directives
from narwhal.sim.faults import payload_token

REASONING_TOKENS = 8
_ROLE_IDS = frozenset(tokenizer.ROLE_TOKENS.values())
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."
DEFAULT_TOOLS = (
    ("get_weather", '{"location": "Paris", "unit": "celsius"}'),
    ("get_time", '{"timezone": "Europe/Paris"}'),
)


@dataclass
class Plan:
    """Tokens to generate, the finish reason once all are out, the delta for text-less events."""

    tokens: list[sg.Tok]
    finish: str
    empty_delta: bytes = sg.EMPTY_CONTENT_DELTA


def _value(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "sim"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {},
            "null": None}.get(str(kind), "sim")


def _tool_name_args(tool: Any) -> tuple[str, str] | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function") if tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return None
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    values = {k: _value(v) for k, v in props.items()} if isinstance(props, dict) else {}
    return fn["name"], json.dumps(values, ensure_ascii=False)


def _calls(body: dict[str, Any], d: Directives) -> tuple[list[tuple[str, str]], bool]:
    """Tool calls to make and whether the tool choice named one function."""
    want = 2 if (d.has("tool_calls") or d.has("interleaved_tools")) else 0
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice == "none" and not want:
        return [], False
    available = [c for c in (_tool_name_args(t) for t in tools or ()) if c is not None] \
        if isinstance(tools, list) else []
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        named = [c for c in available if c[0] == name]
        if named:
            return named[:1], True
    if not available and not want:
        return [], False
    if not available:
        available = list(DEFAULT_TOOLS)
    count = want or 1
    return [available[i % len(available)] for i in range(count)], False


def _tool_tokens(calls: list[tuple[str, str]], interleave: bool,
                 id_only: bool) -> list[sg.Tok]:
    per_call: list[list[sg.Tok]] = []
    for index, (name, args) in enumerate(calls):
        call_id = f"chatcmpl-tool-{secrets.token_hex(8)}"
        head = sg.tool_head(index, call_id, name)
        toks: list[sg.Tok] = [(head, tokenizer.piece_id(name), b"", name)]
        toks += sg.text_tokens(sg.tool_args(index), args)
        per_call.append(toks)
    out: list[sg.Tok] = []
    if interleave and len(per_call) > 1:
        # head0 head1 a0 a1 a0 a1 ...: fragments of the calls alternate by index.
        longest = max(len(t) for t in per_call)
        for i in range(longest):
            for toks in per_call:
                if i < len(toks):
                    out.append(toks[i])
        return out
    for toks in per_call:
        if id_only:
            out.append(sg.marker(tokenizer.TOOL_CALL_OPEN))
        out.extend(toks)
        if id_only:
            out.append(sg.marker(tokenizer.TOOL_CALL_CLOSE))
    return out


def _sprinkle_markers(toks: list[sg.Tok]) -> list[sg.Tok]:
    """id_only_events for plain text: text-less tokens at the start and every 8 tokens."""
    out: list[sg.Tok] = [sg.marker(tokenizer.THINK_OPEN)]
    for i, tok in enumerate(toks, 1):
        out.append(tok)
        if i % 8 == 0:
            out.append(sg.marker(tokenizer.TOOL_CALL_OPEN))
    return out


def _finish(toks: list[sg.Tok], reason: str, max_tokens: int, ignore_eos: bool,
            offset: int, empty: bytes) -> Plan:
    if ignore_eos:
        if len(toks) < max_tokens:
            toks = toks + sg.plain(offset + len(toks), max_tokens - len(toks))
        return Plan(toks[:max_tokens], "length", empty)
    if len(toks) + 1 > max_tokens:
        return Plan(toks[:max_tokens], "length", empty)
    return Plan([*toks, sg.EOS_TOK], reason, empty)


def chat_prompt_length(prompt_ids: list[int]) -> int | None:
    """A token-ID completion prompt that continues a chat answer (how a router resumes a
    broken stream on another engine): the chat template's prompt (it opens with a role
    marker and ends with the assistant marker) followed by the answer's tokens so far.
    Returns the length of the chat prompt, or None when the prompt is not one."""
    if not prompt_ids or prompt_ids[0] not in _ROLE_IDS:
        return None
    for at in range(len(prompt_ids) - 1, -1, -1):
        if prompt_ids[at] == tokenizer.ASSISTANT:
            return at + 1
        if prompt_ids[at] < tokenizer.FIRST_ORDINARY:
            return None  # a special token after the last turn: not a plain answer
    return None


def continued(full: Plan, generated: int) -> Plan:
    """The rest of ``full`` once ``generated`` of its tokens are out: what the engine that
    answers a continuation prompt produces, so the resumed answer equals the unbroken one."""
    rest = full.tokens[generated:]
    if not rest:  # the unbroken answer would have ended here
        return Plan([sg.EOS_TOK], "stop", full.empty_delta)
    return Plan(rest, full.finish, full.empty_delta)


def content_offset(seed: int, prompt_ids: list[int], body_seed: Any) -> int:
    """Where in the fixed token run a prompt's answer starts: the same prompt (and seed)
    always gets the same tokens, like greedy decoding on a real engine."""
    return random.Random(orjson.dumps([seed, body_seed, prompt_ids])).randrange(1 << 20)


def chat_plan(body: dict[str, Any], d: Directives, offset: int, out_len: int,
              max_tokens: int, ignore_eos: bool) -> Plan:
    """The plan of one chat completion choice."""
    id_only = d.has("id_only_events")
    toks: list[sg.Tok] = []
    reason, empty = "stop", sg.EMPTY_CONTENT_DELTA
    thinking = sg.REASONING_CONTENT if d.has("reasoning_content") else (
        sg.REASONING if d.has("reasoning") else None)
    if thinking is not None:
        if id_only:
            toks.append(sg.marker(tokenizer.THINK_OPEN))
        toks += sg.plain(offset, REASONING_TOKENS, thinking)
        if id_only:
            toks.append(sg.marker(tokenizer.THINK_CLOSE))
    functions = body.get("functions")
    legacy = d.has("function_call") or (
        isinstance(functions, list) and bool(functions) and body.get("function_call") != "none")
    calls, named = ([], False) if legacy else _calls(body, d)
    if legacy:
        found = _tool_name_args({"type": "function", "function": (functions or [None])[0]})
        name, args = found or DEFAULT_TOOLS[0]
        toks.append((sg.function_name(name), tokenizer.piece_id(name), b"", name))
        toks += sg.text_tokens(sg.FN_ARGS, args)
        reason, empty = "function_call", sg.EMPTY_DELTA
    elif calls:
        toks += _tool_tokens(calls, d.has("interleaved_tools"), id_only)
        reason, empty = ("stop" if named else "tool_calls"), sg.EMPTY_DELTA
    elif d.has("refusal"):
        toks += sg.text_tokens(sg.REFUSAL, REFUSAL_TEXT)
    else:
        content = sg.plain(offset + 64, max(0, min(out_len, max_tokens + 1) - 1))
        toks += _sprinkle_markers(content) if id_only else content
    fault = d.fault
    if fault is not None and fault.name in PAYLOAD_FAULTS:
        at = min(fault.arg, len(toks))
        toks.insert(at, payload_token(fault.name))
    return _finish(toks, reason, max_tokens, ignore_eos, offset, empty)


def completion_plan(offset: int, out_len: int, max_tokens: int, ignore_eos: bool) -> Plan:
    """The plan of one text-completion choice (plain text)."""
    content = sg.plain(offset, max(0, min(out_len, max_tokens + 1) - 1))
    return _finish(content, "stop", max_tokens, ignore_eos, offset, sg.EMPTY_CONTENT_DELTA)
