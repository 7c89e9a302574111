"""Route table of the simulated engine: vLLM's endpoints plus the test-only ``/sim/*`` routes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import orjson

from narwhal.sim import tokenizer
from narwhal.sim.completions import Completions
from narwhal.sim.engine import Engine
from narwhal.sim.errors import SimError
from narwhal.sim.http import Exchange, Request
from narwhal.sim.settings import SimSettings
from narwhal.sim.stats import Stats

_UNAUTHORIZED = b'{"error":"Unauthorized"}'
_NOT_FOUND = b'{"detail":"Not Found"}'
_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"

Handler = Callable[[Request, Exchange], None]


class SimApp:
    """Dispatches requests by method and path; every handler answers synchronously."""

    def __init__(self, settings: SimSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.stats = Stats()
        self.rng = random.Random(settings.seed)
        self.created = int(time.time())
        self.models_listed = 0  # GET /v1/models answered (a router's probes read it)
        self.completions = Completions(settings, engine, self.stats, self.rng)
        self._routes: dict[str, dict[str, Handler]] = {
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completion},
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health, "POST": self._health},
            "/v1/models": {"GET": self._models},
            "/v1/load_lora_adapter": {"POST": self._load_lora},
            "/v1/unload_lora_adapter": {"POST": self._unload_lora},
            "/metrics": {"GET": self._metrics},
            "/version": {"GET": self._version},
            "/load": {"GET": self._load},
            "/tokenize": {"POST": self._tokenize},
            "/detokenize": {"POST": self._detokenize},
            "/sim/stats": {"GET": self._sim_stats},
            "/sim/config": {"POST": self._sim_config, "GET": self._sim_config},
            "/sim/reset": {"POST": self._sim_reset},
        }

    def handle(self, request: Request, exchange: Exchange) -> None:
        key = self.settings.api_key
        if (key is not None and request.path.startswith("/v1")
                and request.headers.get("authorization") != f"Bearer {key}"):
            exchange.send(401, _UNAUTHORIZED)  # vLLM's authentication middleware
            return
        methods = self._routes.get(request.path)
        if methods is None:
            exchange.send(404, _NOT_FOUND)
            return
        handler = methods.get(request.method)
        if handler is None:
            exchange.send(405, _NOT_ALLOWED, headers=((b"allow", ", ".join(methods).encode()),))
            return
        handler(request, exchange)

    # -- vLLM routes
    def _chat(self, request: Request, exchange: Exchange) -> None:
        self.completions.handle(request, exchange, chat=True)

    def _completion(self, request: Request, exchange: Exchange) -> None:
        self.completions.handle(request, exchange, chat=False)

    def _health(self, request: Request, exchange: Exchange) -> None:
        exchange.send(200, b"", content_type=None)

    def _models(self, request: Request, exchange: Exchange) -> None:
        """vLLM's model list: a card per served name (root: the model path), then a card per
        loaded adapter (root: its path, parent: the first served name, no max_model_len)."""
        s = self.settings
        self.models_listed += 1
        cards = [self._card(name, s.model, None, s.max_model_len) for name in s.served_names]
        cards += [self._card(name, path, s.served_model, None) for name, path in s.loras.items()]
        exchange.send(200, orjson.dumps({"object": "list", "data": cards}))

    def _card(self, name: str, root: str, parent: str | None,
              max_model_len: int | None) -> dict[str, Any]:
        perm = {"id": f"modelperm-{self.rng.getrandbits(64):016x}", "object": "model_permission",
                "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}
        return {"id": name, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": root, "parent": parent, "max_model_len": max_model_len,
                "permission": [perm]}

    def _load_lora(self, request: Request, exchange: Exchange) -> None:
        """vLLM's runtime adapter loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING): a plain-text
        200, or its error envelope (400 InvalidUserInput, as vLLM's checks answer)."""
        try:
            body = self._json_body(request)
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
                raise SimError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                               "InvalidUserInput")
            if name in self.settings.loras and body.get("load_inplace") is not True:
                raise SimError(400, f"The lora adapter '{name}' has already been loaded. If "
                               "you want to load the adapter in place, set 'load_inplace' to "
                               "True.", "InvalidUserInput")
            if name in self.settings.served_names:
                raise SimError(400, f"The lora adapter name '{name}' is a served model name.",
                               "InvalidUserInput")
        except SimError as err:
            exchange.send(err.status, err.body())
            return
        self.settings.loras[name] = path
        exchange.send(200, f"Success: LoRA adapter '{name}' added successfully.".encode(),
                      content_type=None)

    def _unload_lora(self, request: Request, exchange: Exchange) -> None:
        try:
            name = self._json_body(request).get("lora_name")
            if not isinstance(name, str) or not name:
                raise SimError(400, "'lora_name' needs to be provided to unload a LoRA adapter.",
                               "InvalidUserInput")
            if name not in self.settings.loras:
                raise SimError(404, f"The lora adapter '{name}' cannot be found.",
                               "NotFoundError")
        except SimError as err:
            exchange.send(err.status, err.body())
            return
        del self.settings.loras[name]
        exchange.send(200, f"Success: LoRA adapter '{name}' removed successfully.".encode(),
                      content_type=None)

    def _metrics(self, request: Request, exchange: Exchange) -> None:
        e = self.engine
        labels = f'{{engine="0",model_name="{self.settings.served_model}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {float(e.num_running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} {float(e.num_waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{labels} {min(1.0, e.num_running / 256)}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{labels} {float(e.prompt_tokens_total)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{labels} {float(e.generation_tokens_total)}",
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number "
            "of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{labels} {float(e.prefix_cache.queries_total)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of "
            "cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{labels} {float(e.prefix_cache.hits_total)}",
        ]
        exchange.send(200, ("\n".join(lines) + "\n").encode(), content_type=_PROMETHEUS)

    def _version(self, request: Request, exchange: Exchange) -> None:
        exchange.send(200, orjson.dumps({"version": self.settings.version}))

    def _load(self, request: Request, exchange: Exchange) -> None:
        load = self.engine.num_running + self.engine.num_waiting
        exchange.send(200, orjson.dumps({"server_load": load}))

    def _json_body(self, request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(request.body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise SimError(400, f"JSON decode error: {exc}", "Bad Request") from None
        if not isinstance(body, dict):
            raise SimError(400, "Input should be a valid dictionary", "Bad Request")
        return body

    def _tokenize(self, request: Request, exchange: Exchange) -> None:
        try:
            body = self._json_body(request)
            model = body.get("model")
            if model is not None and not self.settings.serves(model):
                raise SimError(404, f"The model `{model}` does not exist.", "NotFoundError",
                               "model")
            if "messages" in body:
                messages = body.get("messages")
                if not isinstance(messages, list):
                    raise SimError(400, "messages must be a list", "Bad Request", "messages")
                tools = body.get("tools")
                ids = tokenizer.encode_chat(messages, tools if isinstance(tools, list) else None,
                                            body.get("add_generation_prompt", True) is not False)
                strs = None
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise SimError(400, "prompt must be a string", "Bad Request", "prompt")
                special = body.get("add_special_tokens", True) is not False
                ids = tokenizer.encode_prompt(prompt, special)
                strs = ([tokenizer.TEXTS[tokenizer.BOS]] if special else []) + \
                    tokenizer.pieces(prompt)
        except SimError as err:
            exchange.send(err.status, err.body())
            return
        out = {"count": len(ids), "max_model_len": self.settings.max_model_len, "tokens": ids,
               "token_strs": strs if body.get("return_token_strs") is True else None}
        exchange.send(200, orjson.dumps(out))

    def _detokenize(self, request: Request, exchange: Exchange) -> None:
        try:
            tokens = self._json_body(request).get("tokens")
            if not isinstance(tokens, list) or not all(
                    isinstance(t, int) and 0 <= t < tokenizer.VOCAB_SIZE for t in tokens):
                raise SimError(400, "tokens must be a list of token ids", "Bad Request", "tokens")
        except SimError as err:
            exchange.send(err.status, err.body())
            return
        text = "".join(tokenizer.OUTPUT_TEXTS[t] for t in tokens)
        exchange.send(200, orjson.dumps({"prompt": text}))

    # -- test-only routes
    def _sim_stats(self, request: Request, exchange: Exchange) -> None:
        out = self.stats.as_json(self.engine.num_running, self.engine.num_waiting)
        out["peak_running"] = self.engine.peak_running
        out["peak_waiting"] = self.engine.peak_waiting
        out["models_listed"] = self.models_listed
        exchange.send(200, orjson.dumps(out))

    def _sim_config(self, request: Request, exchange: Exchange) -> None:
        if request.method == "POST":
            try:
                self.settings.update(self._json_body(request))
            except SimError as err:
                exchange.send(err.status, err.body())
                return
            except ValueError as exc:
                exchange.send(400, SimError(400, str(exc)).body())
                return
        exchange.send(200, orjson.dumps(self.settings.snapshot()))

    def _sim_reset(self, request: Request, exchange: Exchange) -> None:
        self.stats.reset()
        self.engine.reset_peaks()
        self.engine.prefix_cache.clear()  # its counters keep counting, as Prometheus'.
        exchange.send(200, b'{"reset":true}')
