"""Request validation: JSON, body shape and router-interpreted field types, in SPEC §4's order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from narwhal.errors import Refusal
from narwhal.request.models import Served

MAX_DEPTH = 128
"""Deepest JSON nesting accepted (orjson itself parses 1024 levels but serializes only 254)."""

_CONTAINERS = (dict, list)


@dataclass(slots=True)
class Parsed:
    """A validated completion request: the untouched body plus what the router reads from it."""

    route: str  # "chat" | "completion"
    body: dict[str, Any]  # the parsed body, untouched but for `model` (the canonical name)
    model: str  # the canonical name: what the engine is sent
    stream: bool
    include_usage: bool  # client's stream_options.include_usage (False if absent)
    continuous_usage: bool  # client's stream_options.continuous_usage_stats (False if absent)
    return_token_ids: bool
    max_tokens: int | None  # chat: max_completion_tokens wins; completions echo with 0: 1
    logprobs: bool  # chat: logprobs is true; completions: logprobs is an integer
    prompt_text_chars: int  # characters of prompt text (content, text parts, tool JSON)
    prompt_token_ids: int  # number of token ids when the completion prompt is ids
    tools: int  # number of tool definitions
    messages: int = 0  # number of chat messages (0 for completions)
    echo: bool = False  # the client sent echo: true (the engine echoes prompt text)
    include_reasoning: bool = True  # chat: False when the client sent include_reasoning: false
    served: Served | None = None  # what the name resolved to (None: a plain model name)
    alias: str | None = None  # the name the client sent, when an alias of `model`
    size_features: Any = None  # sizing's reading of the prompt, computed once (calibration)
    answer_model: str | None = None  # the `model` every answer carries (the client's name),
    # when the engine may answer with another (an alias; with several models, any name)


def parse_request(route: str, raw: bytes, *, model: str | Mapping[str, Served]) -> Parsed:
    """Parse and check one completion request body; raise Refusal on the first failing rule.

    Checks run in SPEC §4's order: JSON and shape (including every router-interpreted field's
    type) → model → sampling width → unsupported non-streaming options. Within the shape step
    the first offending field wins, in this order: `model`, `messages` / `prompt`, `stream`,
    `stream_options`, `n`, `best_of`, `echo`, `max_tokens`, `max_completion_tokens`,
    `return_token_ids`, `include_reasoning` (chat), `logprobs`, `top_logprobs`, `tools`,
    `tool_choice`, `modalities`, `audio`. A router-interpreted field sent as `null` counts as
    absent (as in vLLM). ``model``: the one name served, or every name a client may send
    (configured models, aliases, adapters), mapped to what it means; an alias is replaced by
    its model's name in the body the engine gets. Completions accept `max_tokens: 0` with
    `echo: true`, as vLLM does (it answers the prompt alone and generates one token, so
    `Parsed.max_tokens` is 1).
    Duplicate keys: the last occurrence wins (orjson's behaviour, like Python's json).
    """
    chat = route == "chat"
    if not chat and route != "completion":
        raise ValueError(f"unknown route {route!r}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refusal("invalid_json", f"The request body is not valid JSON: {exc}") from None
    # Nesting deeper than MAX_DEPTH needs more than 2 * MAX_DEPTH bytes. A completion prompt
    # list is skipped here: _check_prompt admits only strings and integers inside it.
    skip = body.get("prompt") if not chat and type(body) is dict else None
    # ... and at least MAX_DEPTH openers: counting them is a C-level scan of the raw bytes.
    if (len(raw) > 2 * MAX_DEPTH and raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
            and _deeper_than(body, MAX_DEPTH, skip)):
        raise Refusal("invalid_json",
                      f"The request body is nested deeper than {MAX_DEPTH} levels.")
    if type(body) is not dict:
        raise Refusal("invalid_request", "The request body must be a JSON object.")

    # -- shape and router-interpreted field types ----------------------------------------
    req_model = body.get("model")
    if type(req_model) is not str:
        if "model" not in body:
            _bad("model", "Missing required field `model`.")
        _bad("model", "`model` must be a string.")
    n_messages = prompt_ids = 0
    if chat:
        n_messages, chars = _check_messages(body)
    else:
        chars, prompt_ids = _check_prompt(body)

    stream = _opt_bool(body, "stream") is True
    include_usage = continuous = False
    so = body.get("stream_options")
    if so is not None:
        if type(so) is not dict:
            _bad("stream_options", "`stream_options` must be an object or null.")
        include_usage = _opt_bool(so, "include_usage", "stream_options.") is True
        continuous = _opt_bool(so, "continuous_usage_stats", "stream_options.") is True
        if so and not stream:  # as vLLM: a non-empty object needs stream: true
            _bad("stream_options", "Stream options can only be defined when `stream=True`.")
    n = _opt_int(body, "n", 1)
    best_of = _opt_int(body, "best_of", 1)
    echo = _opt_bool(body, "echo") is True
    mt = body.get("max_tokens")
    echo_only = not chat and echo and type(mt) is int and mt == 0  # vLLM: the prompt alone
    max_tokens = 1 if echo_only else _opt_int(body, "max_tokens", 1)
    if chat:
        mct = _opt_int(body, "max_completion_tokens", 1)
        if mct is not None:
            max_tokens = mct
    return_ids = _opt_bool(body, "return_token_ids") is True
    include_reasoning = not chat or _opt_bool(body, "include_reasoning") is not False
    if chat:
        logprobs = _opt_bool(body, "logprobs") is True
        _opt_int(body, "top_logprobs", -1)  # vLLM: >= 0, or -1 for the whole vocabulary
        n_tools, tool_chars = _check_tools(body)
        chars += tool_chars
        tc = body.get("tool_choice")
        if tc is not None and type(tc) is not str and type(tc) is not dict:
            _bad("tool_choice", "`tool_choice` must be a string or an object.")
        modalities = body.get("modalities")
        if modalities is not None and (
            type(modalities) is not list or any(type(m) is not str for m in modalities)
        ):
            _bad("modalities", "`modalities` must be a list of strings.")
        audio = body.get("audio")
        if audio is not None and type(audio) is not dict:
            _bad("audio", "`audio` must be an object or null.")
    else:
        logprobs = _opt_int(body, "logprobs", 0) is not None
        n_tools, modalities, audio = 0, None, None

    # -- model -----------------------------------------------------------------------------
    served = alias = None
    if isinstance(model, str):
        known = req_model == model
    else:
        served = model.get(req_model)
        known = served is not None
    if not known:
        shown = req_model if len(req_model) <= 256 else req_model[:256] + "…"
        raise Refusal("model_not_found", f"The model `{shown}` does not exist.", param="model")
    answer = None
    if served is not None and (served.rename or served.name != req_model):
        answer = req_model
        if served.name != req_model:
            alias, req_model = req_model, served.name
            body["model"] = req_model

    # -- sampling width --------------------------------------------------------------------
    if n is not None and n > 1:
        raise Refusal("invalid_sampling_width",
                      f"Invalid sampling width: n = {n}; this router serves n = 1 only.",
                      param="n")
    if best_of is not None and best_of > 1:
        raise Refusal("invalid_sampling_width",
                      f"Invalid sampling width: best_of = {best_of}; "
                      "this router serves best_of = 1 only.", param="best_of")

    # -- unsupported non-streaming options -------------------------------------------------
    if chat and not stream:
        _check_unsupported(body, modalities, audio)

    return Parsed(route, body, req_model, stream, include_usage, continuous, return_ids,
                  max_tokens, logprobs, chars, prompt_ids, n_tools, n_messages, echo,
                  include_reasoning, served, alias, answer_model=answer)


def _bad(param: str, message: str) -> NoReturn:
    raise Refusal("invalid_request", message, param=param)


def _opt_bool(obj: dict[str, Any], key: str, prefix: str = "") -> bool | None:
    v = obj.get(key)
    if v is None or v is True or v is False:
        return v
    _bad(prefix + key, f"`{prefix}{key}` must be a boolean.")


def _opt_int(obj: dict[str, Any], key: str, minimum: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if type(v) is not int or v < minimum:  # Booleans, floats and strings are not integers
        _bad(key, f"`{key}` must be an integer >= {minimum}.")
    return v


def _check_messages(body: dict[str, Any]) -> tuple[int, int]:
    """Chat `messages`: (message count, prompt text characters)."""
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        _bad("messages", "`messages` must be a non-empty list of message objects.")
    chars = 0
    for i, m in enumerate(messages):
        if type(m) is not dict:
            _bad(f"messages[{i}]", f"`messages[{i}]` must be an object.")
        if type(m.get("role")) is not str:
            _bad(f"messages[{i}].role", f"`messages[{i}].role` must be a string.")
        content = m.get("content")
        if type(content) is str:
            chars += len(content)
        elif type(content) is list:
            for j, part in enumerate(content):
                if type(part) is not dict:
                    _bad(f"messages[{i}].content[{j}]",
                         f"`messages[{i}].content[{j}]` must be a content part object.")
                if type(part.get("type")) is not str:
                    _bad(f"messages[{i}].content[{j}].type",
                         f"`messages[{i}].content[{j}].type` must be a string.")
                text = part.get("text")
                if type(text) is str:
                    chars += len(text)
        elif content is not None:
            _bad(f"messages[{i}].content",
                 f"`messages[{i}].content` must be a string, null or a list of content parts.")
        calls = m.get("tool_calls")
        if type(calls) is list:  # not router-interpreted: only counted, never refused
            chars += _tool_call_chars(calls)
    return len(messages), chars


def _tool_call_chars(calls: list[Any]) -> int:
    chars = 0
    for call in calls:
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is dict:
            for key in ("name", "arguments"):
                v = fn.get(key)
                if type(v) is str:
                    chars += len(v)
    return chars


def _check_prompt(body: dict[str, Any]) -> tuple[int, int]:
    """Completions `prompt`: (prompt text characters, prompt token ids)."""
    prompt = body.get("prompt")
    if type(prompt) is str:
        return len(prompt), 0
    if type(prompt) is not list or not prompt:
        _bad("prompt", "`prompt` must be a string, a list of strings, a list of token ids "
             "or a list of token-id lists, and not empty.")
    first = type(prompt[0])
    if first is str:
        for i, p in enumerate(prompt):
            if type(p) is not str:
                _bad(f"prompt[{i}]", f"`prompt[{i}]` must be a string like `prompt[0]`.")
        return sum(map(len, prompt)), 0
    if first is int:
        _check_ids(prompt, "prompt")
        return 0, len(prompt)
    if first is list:
        total = 0
        for i, p in enumerate(prompt):
            if type(p) is not list or not p:
                _bad(f"prompt[{i}]", f"`prompt[{i}]` must be a non-empty list of token ids.")
            _check_ids(p, f"prompt[{i}]")
            total += len(p)
        return 0, total
    _bad("prompt[0]", "`prompt[0]` must be a string, a token id or a list of token ids.")


def _check_ids(ids: list[Any], param: str) -> None:
    kinds = set(map(type, ids))  # C-speed scan; a Boolean's type is bool, not int
    if kinds != {int} or min(ids) < 0:
        for j, v in enumerate(ids):
            if type(v) is not int or v < 0:
                _bad(f"{param}[{j}]", f"`{param}[{j}]` must be a token id (an integer >= 0).")


def _check_tools(body: dict[str, Any]) -> tuple[int, int]:
    """Chat `tools`: (tool count, characters of their JSON, which the template renders)."""
    tools = body.get("tools")
    if tools is None:
        return 0, 0
    if type(tools) is not list:
        _bad("tools", "`tools` must be a list of tool objects.")
    for i, t in enumerate(tools):
        if type(t) is not dict:
            _bad(f"tools[{i}]", f"`tools[{i}]` must be an object.")
        if type(t.get("type")) is not str:
            _bad(f"tools[{i}].type", f"`tools[{i}].type` must be a string.")
    return len(tools), (len(orjson.dumps(tools)) if tools else 0)


def _check_unsupported(body: dict[str, Any], modalities: Any, audio: Any) -> None:
    """Non-streaming requests Narwhal cannot assemble: first of modalities, audio, tools[i].type."""
    if modalities is not None and any(m != "text" for m in modalities):
        raise Refusal("unsupported_option", "Only text output is supported for non-streaming "
                      "requests; remove `modalities` or stream.", param="modalities")
    if audio is not None:
        raise Refusal("unsupported_option", "Audio output is not supported for non-streaming "
                      "requests; remove `audio` or stream.", param="audio")
    for i, t in enumerate(body.get("tools") or ()):
        if t["type"] != "function":
            raise Refusal("unsupported_option", f"Tool type `{t['type'][:64]}` is not supported "
                          "for non-streaming requests; only `function` tools are.",
                          param=f"tools[{i}].type")


def _deeper_than(obj: Any, limit: int, skip: Any = None) -> bool:
    """True when `obj` nests containers more than `limit` levels deep (iterative, no recursion).

    Visits each container once; long all-scalar lists are passed over by a C-level type scan.
    `skip` (compared by identity) is not entered.
    """
    level: list[Any] = [obj] if type(obj) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        nxt: list[Any] = []
        push = nxt.append
        for o in level:
            vals = o.values() if type(o) is dict else o
            if len(vals) > 32:
                kinds = set(map(type, vals))
                if dict not in kinds and list not in kinds:
                    continue
            for v in vals:
                if type(v) in _CONTAINERS and v is not skip:
                    push(v)
        level = nxt
    return False
