"""``/v1/chat/completions`` and ``/v1/completions``: validation as vLLM does it, then a Response."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from narwhal.sim import bodies, directives, errors, scenarios, tokenizer
from narwhal.sim.directives import ID_FAULTS, Directives, Fault
from narwhal.sim.engine import Engine
from narwhal.sim.errors import SimError, bad_request
from narwhal.sim.frames import ChatFrames, CompletionFrames, StreamOptions
from narwhal.sim.http import Exchange, Request
from narwhal.sim.settings import SimSettings
from narwhal.sim.stats import Record, Stats
from narwhal.sim.stream import ChoiceJob, Response

MAX_LOGPROBS = 20
MULTI_TOKEN_INTERVAL = 3
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass
class _Ask:
    """What a valid request asks for, once parsed."""

    stream: bool
    prompts: list[list[int]]
    budgets: list[int]  # max_tokens per prompt (capped by the context window)
    interval: int
    opts: StreamOptions
    ignore_eos: bool
    echoes: list[str | None]  # per prompt: the echoed text (None: no echo asked)


class _Watcher:
    """Listener of an exchange that will never answer: counts the client leaving."""

    def __init__(self, stats: Stats, record: Record) -> None:
        self._stats = stats
        self._record = record

    def on_pause(self) -> None:
        pass

    def on_resume(self) -> None:
        pass

    def on_close(self) -> None:
        self._stats.client_left(self._record)


def _int_field(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"{key} must be an integer", key)
    if value < minimum:
        raise bad_request(f"{key} must be at least {minimum}, got {value}.", key)
    return value


class Completions:
    """Turns completion-route requests into engine jobs on one simulated engine."""

    def __init__(self, settings: SimSettings, engine: Engine, stats: Stats,
                 rng: random.Random) -> None:
        self._settings = settings
        self._engine = engine
        self._stats = stats
        self._rng = rng

    def handle(self, request: Request, exchange: Exchange, chat: bool) -> None:
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            record = self._stats.arrive(request.path, request.headers,
                                        request.body.decode("utf-8", "replace"))
            exchange.send(400, SimError(400, f"JSON decode error: {exc}", "Bad Request").body())
            self._stats.end(record, "rejected")
            return
        record = self._stats.arrive(request.path, request.headers, body)
        try:
            if not isinstance(body, dict):
                raise SimError(400, "Input should be a valid dictionary", "Bad Request")
            found = directives.parse(request.headers, request.body)
            if found.fault is not None and self._early_fault(found.fault, body, chat, exchange,
                                                             record):
                return
            response = self._prepare(request, exchange, record, body, found, chat)
        except SimError as err:
            exchange.send(err.status, err.body())
            self._stats.end(record, "rejected")
            return
        except ValueError as exc:  # bad directives
            exchange.send(400, bad_request(str(exc)).body())
            self._stats.end(record, "rejected")
            return
        fault = found.fault
        delay = fault.arg / 1000.0 if fault is not None and fault.name == "slow_headers" else 0.0
        response.begin(delay)

    def _early_fault(self, fault: Fault, body: dict[str, Any], chat: bool, exchange: Exchange,
                     record: Record) -> bool:
        """Faults that act before any header; True when the request is done with."""
        name = fault.name
        if name == "reset_before_headers":
            self._stats.end(record, fault.label)
            exchange.reset()
        elif name == "hang_before_headers":
            self._stats.end(record, fault.label)
            exchange.listener = _Watcher(self._stats, record)
            exchange.hang()
        elif name == "http_500":
            exchange.send(500, errors.internal().body())
            self._stats.end(record, fault.label)
        elif name == "http_400":
            prompt = len(self._chat_prompt(body)) if chat else 16
            limit = self._settings.max_model_len
            exchange.send(400, errors.context_too_long(limit, prompt, limit).body())
            self._stats.end(record, fault.label)
        else:
            return False
        return True

    # -- request preparation
    def _chat_prompt(self, body: dict[str, Any]) -> list[int]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise SimError(400, "messages: Field required (a non-empty list)", "Bad Request",
                           "messages")
        tools = body.get("tools")
        return tokenizer.encode_chat(messages, tools if isinstance(tools, list) else None,
                                     body.get("add_generation_prompt", True) is not False)

    def _completion_prompts(self, body: dict[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        special = body.get("add_special_tokens", True) is not False
        if isinstance(prompt, str):
            return [tokenizer.encode_prompt(prompt, special)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return [tokenizer.encode_prompt(p, special) for p in prompt]
            if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
                return [self._check_ids(prompt)]
            if all(isinstance(p, list) and p for p in prompt):
                return [self._check_ids(p) for p in prompt]
        raise SimError(400, "prompt must be a string, a list of strings or a list of token ids",
                       "Bad Request", "prompt")

    @staticmethod
    def _check_ids(ids: list[Any]) -> list[int]:
        for tid in ids:
            if not isinstance(tid, int) or isinstance(tid, bool):
                raise SimError(400, "prompt token ids must be integers", "Bad Request", "prompt")
            if not 0 <= tid < tokenizer.VOCAB_SIZE:
                raise bad_request(f"Token id {tid} is out of vocabulary")
        return list(ids)

    def _limits(self, prompt_len: int, max_tokens: int | None) -> int:
        limit = self._settings.max_model_len
        if prompt_len >= limit or (max_tokens is not None and prompt_len + max_tokens > limit):
            raise errors.context_too_long(limit, prompt_len, max_tokens)
        return max_tokens if max_tokens is not None else limit - prompt_len

    @staticmethod
    def _chat_echo(body: dict[str, Any], role: str) -> str | None:
        """What chat ``echo`` prepends: the last message's text when it has the response
        role, else "" (None when echo was not asked)."""
        if body.get("echo") is not True:
            return None
        last = body["messages"][-1]
        if not isinstance(last, dict) or last.get("role") != role:
            return ""
        content = last.get("content")
        if isinstance(content, list):  # text parts, joined as vLLM's string format does
            return "\n".join(p["text"] for p in content
                             if isinstance(p, dict) and isinstance(p.get("text"), str))
        return content if isinstance(content, str) else ""

    def _completion_echo(self, body: dict[str, Any], prompts: list[list[int]],
                         return_ids: bool) -> list[str | None]:
        """The prompt text each choice echoes: "" with return_token_ids (vLLM); the prompt
        string, or its IDs decoded."""
        if body.get("echo") is not True:
            return [None] * len(prompts)
        if return_ids:
            return [""] * len(prompts)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            return list(prompt)
        return ["".join(tokenizer.OUTPUT_TEXTS[t] for t in ids) for ids in prompts]

    def _parse(self, body: dict[str, Any], found: Directives, chat: bool) -> _Ask:
        """Validate the body the way vLLM does; raise SimError with vLLM's status and body."""
        model = body.get("model")
        if model is not None and not (isinstance(model, str) and self._settings.serves(model)):
            raise errors.not_found_model(str(model))
        n = body.get("n")
        if n is not None and n != 1:
            raise bad_request("The simulator supports n=1 only.", "n")
        stream = body.get("stream") is True
        options = body.get("stream_options")
        if options is not None and not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.")
        options = options if isinstance(options, dict) else {}
        prompts = [self._chat_prompt(body)] if chat else self._completion_prompts(body)
        max_tokens = _int_field(body, "max_completion_tokens", 1) if chat else None
        # vLLM answers completions echo with max_tokens 0 by the prompt alone; the engine
        # still generates one token (counted in usage, its ID returned when asked).
        asked = body.get("max_tokens")
        echo_only = not chat and body.get("echo") is True and type(asked) is int and asked == 0
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", 0 if echo_only else 1)
        if max_tokens is None and not chat and "max_tokens" not in body:
            max_tokens = COMPLETION_DEFAULT_MAX_TOKENS  # vLLM: an explicit null is no limit
        budgets = [self._limits(len(p), max_tokens) for p in prompts]
        if echo_only:
            budgets = [1] * len(prompts)
        k = self._logprobs(body, chat)
        interval = _int_field(body, "stream_interval", 1) or 1
        if found.has("multi_token"):
            interval = max(interval, MULTI_TOKEN_INTERVAL)
        fault = found.fault
        id_fault = fault.name if fault is not None and fault.name in ID_FAULTS else None
        return_ids = body.get("return_token_ids") is True
        role = "assistant"
        if chat and body.get("add_generation_prompt", True) is False:
            last = body["messages"][-1]
            role = str(last.get("role")) if isinstance(last, dict) else "assistant"
        opts = StreamOptions(
            return_ids=return_ids,
            include_usage=options.get("include_usage") is True,
            continuous=options.get("continuous_usage_stats") is True,
            logprobs=k, id_fault=id_fault,
            id_fault_after=fault.arg if id_fault is not None and fault is not None else 0,
            hide_reasoning=chat and body.get("include_reasoning") is False,
            role=role, echo_only=echo_only)
        echoes = [self._chat_echo(body, role)] if chat else \
            self._completion_echo(body, prompts, return_ids)
        return _Ask(stream, prompts, budgets, interval, opts, body.get("ignore_eos") is True,
                    echoes)

    def _prepare(self, request: Request, exchange: Exchange, record: Record,
                 body: dict[str, Any], found: Directives, chat: bool) -> Response:
        """Parse, plan every choice's tokens and wire the response to the engine."""
        ask = self._parse(body, found, chat)
        s = self._settings
        remote_prefill = self._check_role(body, ask.stream)
        opts = ask.opts
        # Random (not seeded) so that several simulators never hand out the same id.
        rid = ("chatcmpl-" if chat else "cmpl-") + (
            request.headers.get("x-request-id") or secrets.token_hex(8))
        created = int(time.time())
        plans = []
        id_prompt = not chat and isinstance(body.get("prompt"), list) and len(ask.prompts) == 1
        for prompt_ids, budget in zip(ask.prompts, ask.budgets, strict=True):
            # Same prompt, same tokens; the length is drawn per request from --output-len
            # (with a sampling seed in the body, from the prompt and that seed).
            split = scenarios.chat_prompt_length(prompt_ids) if id_prompt else None
            if split is not None:  # a chat answer resumed from its tokens so far
                base, generated = prompt_ids[:split], len(prompt_ids) - split
                offset = scenarios.content_offset(s.seed, base, body.get("seed"))
                full = scenarios.chat_plan({}, directives.NONE, offset,
                                           self._output_len(base, body), budget + generated,
                                           ask.ignore_eos)
                plans.append((prompt_ids, scenarios.continued(full, generated)))
                continue
            offset = scenarios.content_offset(s.seed, prompt_ids, body.get("seed"))
            out_len = self._output_len(prompt_ids, body)
            if chat:
                plan = scenarios.chat_plan(body, found, offset, out_len, budget, ask.ignore_eos)
            else:
                plan = scenarios.completion_plan(offset, out_len, budget, ask.ignore_eos)
            plans.append((prompt_ids, plan))
        kv = None if ask.stream else self._kv_params(body, rid, len(ask.prompts[0]))
        # vLLM answers an adapter's requests with its name, the base model's with the first
        # served name whichever one the request used.
        asked = body.get("model")
        model = asked if isinstance(asked, str) and asked in s.loras else s.served_model
        model_json, fp = orjson.dumps(model), s.fingerprint
        details = s.prompt_tokens_details
        frames: ChatFrames | CompletionFrames | None = None
        build: Callable[[list[ChoiceJob]], bytes]
        if chat:
            if ask.stream:
                frames = ChatFrames(rid, created, model_json, fp, opts, plans[0][1].empty_delta)

            def build(choices: list[ChoiceJob]) -> bytes:
                c = choices[0]
                return bodies.chat(rid, created, model, fp, toks=c.tokens, finish=c.finish,
                                   prompt_ids=c.prompt_ids, return_ids=opts.return_ids,
                                   top_logprobs=opts.logprobs,
                                   legacy_reasoning=found.has("reasoning_content"),
                                   id_fault=opts.id_fault, kv_transfer_params=kv,
                                   role=opts.role, echo=c.echo,
                                   hide_reasoning=opts.hide_reasoning,
                                   cached=c.cached_tokens if details else 0)
        else:
            if ask.stream:
                frames = CompletionFrames(rid, created, model_json, fp, opts)

            def build(choices: list[ChoiceJob]) -> bytes:
                outputs = [(c.tokens, c.finish, c.prompt_ids, c.echo) for c in choices]
                return bodies.completion(rid, created, model, fp, outputs=outputs,
                                         return_ids=opts.return_ids, k=opts.logprobs,
                                         id_fault=opts.id_fault, kv_transfer_params=kv,
                                         echo_only=opts.echo_only,
                                         cached=sum(c.cached_tokens for c in choices)
                                         if details else 0)
        response = Response(engine=self._engine, stats=self._stats, record=record,
                            exchange=exchange, stream=ask.stream, frames=frames,
                            fault=found.fault, build_body=build, details=details)
        for index, (prompt_ids, plan) in enumerate(plans):
            job = ChoiceJob(response, index, prompt_ids, plan.tokens, plan.finish, ask.interval,
                            ask.echoes[index])
            job.kv_ready = remote_prefill
            response.add(job)
        return response

    def _output_len(self, prompt_ids: list[int], body: dict[str, Any]) -> int:
        """The answer's length: drawn per request, or with a sampling ``seed`` in the body
        fixed by the prompt and that seed (so a resumed answer ends where the unbroken one
        would have)."""
        seed = body.get("seed")
        if seed is None:
            return self._settings.output_length.sample(self._rng)
        key = orjson.dumps([self._settings.seed, seed, prompt_ids, "length"])
        return self._settings.output_length.sample(random.Random(key))

    def _check_role(self, body: dict[str, Any], stream: bool) -> bool:
        """Disaggregation roles (vLLM NIXL): a prefill engine serves the prefill leg
        (``do_remote_decode``) non-streaming only; a decode engine serves only requests
        whose KV cache comes from a prefill engine (``do_remote_prefill``). True when the
        prompt's KV cache is remote (the engine skips its prefill compute)."""
        kv = body.get("kv_transfer_params")
        kv = kv if isinstance(kv, dict) else {}
        role = self._settings.role
        if role == "prefill" and kv.get("do_remote_decode") is True and stream:
            raise bad_request("A prefill engine serves the remote-decode prefill leg "
                              "non-streaming only.", "stream")
        if role == "decode":
            if kv.get("do_remote_prefill") is not True:
                raise bad_request("This decode engine requires kv_transfer_params with "
                                  "do_remote_prefill: true.", "kv_transfer_params")
            return True
        return False

    @staticmethod
    def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
        if chat:
            top = _int_field(body, "top_logprobs", 0)
            if body.get("logprobs") is not True:
                if top is not None:
                    raise bad_request(
                        "when using `top_logprobs`, `logprobs` must be set to true.",
                        "top_logprobs")
                return None
            k = top or 0
        else:
            value = _int_field(body, "logprobs", 0)
            if value is None:
                return None
            k = value
        if k > MAX_LOGPROBS:
            raise bad_request(f"Requested sample logprobs of {k}, which is greater than max "
                              f"allowed: {MAX_LOGPROBS}", "logprobs")
        return k

    def _kv_params(self, body: dict[str, Any], rid: str, prompt_len: int) -> Any:
        """What a NIXL prefill node returns for ``do_remote_decode`` (opaque to the router)."""
        asked = body.get("kv_transfer_params")
        if not isinstance(asked, dict) or asked.get("do_remote_decode") is not True:
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [list(range(1, 1 + max(1, prompt_len // 16)))],
                "remote_engine_id": f"sim-{self._settings.seed}", "remote_request_id": rid,
                "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1,
                "remote_num_tokens": prompt_len}
