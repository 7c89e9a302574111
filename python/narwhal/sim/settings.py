"""Simulator settings and the output-length distribution they name."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROLES = ("mixed", "prefill", "decode")


class OutputLength:
    """A distribution of output lengths, parsed from a spec.

    Specs: ``N`` (fixed), ``uniform:LO:HI`` (inclusive), ``geometric:MEAN``. Every draw is
    at least 1; the caller caps it by the request's ``max_tokens``.
    """

    __slots__ = ("_a", "_b", "_kind", "spec")

    def __init__(self, spec: str) -> None:
        self.spec = spec.strip()
        parts = self.spec.split(":")
        try:
            if len(parts) == 1:
                self._kind, self._a, self._b = "fixed", float(int(parts[0])), 0.0
            elif parts[0] == "uniform" and len(parts) == 3:
                self._kind, self._a, self._b = "uniform", float(int(parts[1])), float(int(parts[2]))
            elif parts[0] == "geometric" and len(parts) == 2:
                self._kind, self._a, self._b = "geometric", float(parts[1]), 0.0
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"bad output length spec {spec!r}: use N, uniform:LO:HI or geometric:MEAN"
            ) from None
        if self._a < 1 or (self._kind == "uniform" and self._b < self._a):
            raise ValueError(f"bad output length spec {spec!r}: lengths must be >= 1")

    def sample(self, rng: random.Random) -> int:
        """One draw (>= 1)."""
        if self._kind == "fixed":
            return int(self._a)
        if self._kind == "uniform":
            return rng.randint(int(self._a), int(self._b))
        # Geometric on {1, 2, ...} with the given mean: p = 1/mean.
        p = 1.0 / self._a
        if p >= 1.0:
            return 1
        u = 1.0 - rng.random()
        return max(1, math.ceil(math.log(u) / math.log1p(-p)))


@dataclass
class SimSettings:
    """Everything that shapes one simulated engine; the timing fields may change at run time."""

    model: str = DEFAULT_MODEL  # the model path (root of the base cards on /v1/models)
    served_names: tuple[str, ...] = ()  # as vLLM's --served-model-name; empty: (model,)
    loras: dict[str, str] = field(default_factory=dict)  # loaded adapters: name -> path
    prefill_tokens_per_s: float = 20000.0
    prefill_overhead_ms: float = 5.0
    tpot_ms: float = 10.0
    tpot_growth_ms: float = 0.0
    output_len: str = "128"
    max_model_len: int = 8192
    kv_cache_tokens: int = 0  # prefix cache capacity in tokens (LRU, 16-token blocks); 0: off
    prompt_tokens_details: bool = False  # vLLM's --enable-prompt-tokens-details
    role: str = "mixed"
    seed: int = 0
    keepalive_timeout_s: float = 5.0
    api_key: str | None = None  # as vLLM's --api-key: /v1 routes need this bearer key
    version: str = "0.32.0"
    output_length: OutputLength = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.served_names:
            self.served_names = (self.model,)
        self.validate()
        self.output_length = OutputLength(self.output_len)

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be > 0")
        for name in ("prefill_overhead_ms", "tpot_ms", "tpot_growth_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.kv_cache_tokens < 0:
            raise ValueError("kv_cache_tokens must be >= 0")
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be >= 2")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        clash = set(self.served_names) & set(self.loras)
        if clash:
            raise ValueError(f"adapter names clash with served model names: {sorted(clash)}")

    @property
    def served_model(self) -> str:
        """The name a base-model answer carries: the first served name (vLLM's
        ``base_model_paths[0].name``, whichever served name the request used)."""
        return self.served_names[0]

    def serves(self, name: str) -> bool:
        """A name a request may send: a served model name or a loaded adapter."""
        return name in self.served_names or name in self.loras

    @property
    def fingerprint(self) -> str:
        """The opaque ``system_fingerprint`` this engine stamps (vLLM 0.32 style)."""
        return f"vllm-{self.version}-5117e0a1"

    # Keys accepted by ``POST /sim/config`` and how to coerce them.
    RUNTIME_KEYS = ("tpot_ms", "tpot_growth_ms", "prefill_tokens_per_s", "prefill_overhead_ms",
                    "output_len")

    def update(self, changes: dict[str, object]) -> None:
        """Apply run-time changes atomically (all or nothing); raise ValueError on bad input."""
        unknown = sorted(set(changes) - set(self.RUNTIME_KEYS))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        staged: dict[str, object] = {}
        for key, value in changes.items():
            if key == "output_len":
                if not isinstance(value, (str, int)) or isinstance(value, bool):
                    raise ValueError("output_len must be a spec string")
                staged["output_length"] = OutputLength(str(value))
                staged[key] = str(value)
            else:
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise ValueError(f"{key} must be a number")
                staged[key] = float(value)
        before = {k: getattr(self, k) for k in staged}
        for key, value in staged.items():
            setattr(self, key, value)
        try:
            self.validate()
        except ValueError:
            for key, value in before.items():
                setattr(self, key, value)
            raise

    def snapshot(self) -> dict[str, object]:
        """The current settings as JSON-able values."""
        return {
            "model": self.model,
            "served_names": list(self.served_names),
            "loras": dict(self.loras),
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "prefill_overhead_ms": self.prefill_overhead_ms,
            "tpot_ms": self.tpot_ms,
            "tpot_growth_ms": self.tpot_growth_ms,
            "output_len": self.output_len,
            "max_model_len": self.max_model_len,
            "kv_cache_tokens": self.kv_cache_tokens,
            "prompt_tokens_details": self.prompt_tokens_details,
            "role": self.role,
            "seed": self.seed,
        }
