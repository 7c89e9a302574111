"""Output-length learning: per model and route, measured output lengths relative to the
requested max.

Requests that name ``max_tokens`` teach the distribution of ``output / max_tokens`` (20
bins over (0, 1]); requests that do not teach the distribution of absolute lengths (bins
by powers of two). Both forget slowly (a half-life of about 180 requests), so a change in
the workload shows within a few hundred requests. A running request's expected length is
the mean of the lengths at least as long as what it has already generated: decode
correction as its tokens arrive.

The first configured model's distributions are the default (``OutputLengths.routes``);
every other model, and every adapter, has its own, an adapter's starting as a copy of its
base model's.
"""

from __future__ import annotations

import copy
from typing import Any

RATIO_BINS = 20
LOG_BINS = 24  # lengths up to 2**24 tokens
DECAY = 1.0 - 1.0 / 256.0
PRIOR_RATIO = 0.5  # before any measurement: half the requested maximum
PRIOR_TOKENS = 256.0  # before any measurement, when no maximum is named
PRIOR_WEIGHT = 1.0
ROUTES = ("chat", "completion")
_RESCALE_AT = 1e100
MODEL_LIMIT = 256
"""Models and adapters with their own distributions; past it the oldest adapter's go."""


class _Histogram:
    """Weighted samples in fixed bins, each bin keeping its weight and its weighted sum.

    Forgetting is O(1) per sample: instead of every bin shrinking by ``DECAY``, each new
    sample weighs ``1 / DECAY`` more than the one before (``_scale``). Stored values are the
    true ones times ``_scale``; means and conditional means are ratios, so the scale cancels.
    """

    __slots__ = ("_scale", "_sums", "_weights", "samples")

    def __init__(self, bins: int) -> None:
        self._weights = [0.0] * bins
        self._sums = [0.0] * bins
        self._scale = 1.0
        self.samples = 0

    @property
    def weights(self) -> list[float]:
        scale = self._scale
        return [w / scale for w in self._weights]

    @property
    def sums(self) -> list[float]:
        scale = self._scale
        return [v / scale for v in self._sums]

    def add(self, index: int, value: float, weight: float = 1.0, *, decay: bool = True) -> None:
        if decay:
            self._scale /= DECAY
            if self._scale > _RESCALE_AT:  # bring the stored values back near their true size
                scale = self._scale
                self._weights = [w / scale for w in self._weights]
                self._sums = [v / scale for v in self._sums]
                self._scale = 1.0
        weight *= self._scale
        self._weights[index] += weight
        self._sums[index] += weight * value

    def total(self) -> float:
        return sum(self._weights) / self._scale

    def mean(self) -> float:
        total = sum(self._weights)
        return sum(self._sums) / total if total > 0 else 0.0

    def conditional(self, index: int) -> float:
        """Mean of the samples in bin ``index`` and above (0.0 when there are none)."""
        weight = sum(self._weights[index:])
        return sum(self._sums[index:]) / weight if weight > 0 else 0.0

    def quantile(self, q: float, edge: Any) -> float:
        """The upper edge of the bin where the cumulative weight passes ``q``."""
        total = self.total()
        seen = 0.0
        for i, w in enumerate(self.weights):
            seen += w
            if total > 0 and seen >= q * total:
                return float(edge(i))
        return float(edge(len(self.weights) - 1))

    def as_json(self) -> dict[str, Any]:
        return {"weights": self.weights, "sums": self.sums, "samples": self.samples}

    def load(self, data: object) -> None:
        if not isinstance(data, dict):
            return
        weights, sums = data.get("weights"), data.get("sums")
        n = len(self.weights)
        if (isinstance(weights, list) and isinstance(sums, list) and len(weights) == n
                and len(sums) == n and all(isinstance(v, (int, float)) and v >= 0
                                           for v in weights + sums)):
            self._weights = [float(v) for v in weights]
            self._sums = [float(v) for v in sums]
            self._scale = 1.0
            samples = data.get("samples")
            self.samples = samples if isinstance(samples, int) and samples >= 0 else 0


def _ratio_bin(ratio: float) -> int:
    return min(RATIO_BINS - 1, max(0, int(ratio * RATIO_BINS - 1e-9)))


def _log_bin(tokens: float) -> int:
    return min(LOG_BINS - 1, max(0, int(tokens).bit_length() - 1))


class LengthDistribution:
    """One route's learned output lengths."""

    __slots__ = ("absolute", "ratio")

    def __init__(self) -> None:
        self.ratio = _Histogram(RATIO_BINS)
        self.absolute = _Histogram(LOG_BINS)
        self.ratio.add(_ratio_bin(PRIOR_RATIO), PRIOR_RATIO, PRIOR_WEIGHT, decay=False)
        self.absolute.add(_log_bin(PRIOR_TOKENS), PRIOR_TOKENS, PRIOR_WEIGHT, decay=False)

    def observe(self, max_tokens: int | None, output_tokens: int) -> None:
        """A request ended normally after generating ``output_tokens``."""
        if output_tokens < 0:
            return
        if max_tokens is not None and max_tokens > 0:
            ratio = min(1.0, output_tokens / max_tokens)
            self.ratio.add(_ratio_bin(ratio), ratio)
            self.ratio.samples += 1
        else:
            self.absolute.add(_log_bin(output_tokens), float(output_tokens))
            self.absolute.samples += 1

    def expected(self, max_tokens: int | None, generated: int = 0) -> float:
        """Expected total output of a request that has generated ``generated`` tokens so far."""
        if max_tokens is not None and max_tokens > 0:
            if generated >= max_tokens:
                return float(max_tokens)
            ratio = generated / max_tokens
            cond = self.ratio.conditional(_ratio_bin(ratio))
            guess = max_tokens * max(cond, ratio) if cond > 0 else float(max_tokens)
            return min(float(max_tokens), max(guess, generated + 1.0))
        cond = self.absolute.conditional(_log_bin(generated)) if generated else self.absolute.mean()
        if cond <= generated:
            cond = 2.0 * generated  # longer than anything seen: assume as long again
        return max(cond, generated + 1.0)

    def copy(self) -> LengthDistribution:
        return copy.deepcopy(self)

    def describe(self) -> dict[str, Any]:
        ratio, absolute = self.ratio, self.absolute
        return {
            "samples": ratio.samples + absolute.samples,
            "ratio_of_max": {
                "samples": ratio.samples,
                "mean": round(ratio.mean(), 4),
                "p50": ratio.quantile(0.5, lambda i: (i + 1) / RATIO_BINS),
                "p90": ratio.quantile(0.9, lambda i: (i + 1) / RATIO_BINS),
                "bins": [round(w, 3) for w in ratio.weights],
            },
            "unbounded_tokens": {
                "samples": absolute.samples,
                "mean": round(absolute.mean(), 1),
                "p50": absolute.quantile(0.5, lambda i: 2 ** (i + 1)),
                "p90": absolute.quantile(0.9, lambda i: 2 ** (i + 1)),
            },
        }


Table = dict[str, LengthDistribution]
"""One model's distributions, by route."""


class OutputLengths:
    """The learned distributions of every completion route: the default model's
    (``routes``) and every other model's or adapter's (``models``)."""

    __slots__ = ("models", "routes")

    def __init__(self) -> None:
        self.routes: Table = {route: LengthDistribution() for route in ROUTES}
        self.models: dict[str, Table] = {}

    def for_model(self, name: str, like: Table | None = None) -> Table:
        """``name``'s distributions; a new model starts from the prior, or from a copy of
        ``like`` (an adapter, from its base model's)."""
        table = self.models.get(name)
        if table is None:
            if like is None:
                table = {route: LengthDistribution() for route in ROUTES}
            else:
                table = {route: dist.copy() for route, dist in like.items()}
            self.models[name] = table
            if len(self.models) > MODEL_LIMIT:
                del self.models[next(iter(self.models))]
        return table

    def route(self, route: str) -> LengthDistribution:
        dist = self.routes.get(route)
        if dist is None:
            dist = self.routes[route] = LengthDistribution()
        return dist

    def observe(self, route: str, max_tokens: int | None, output_tokens: int) -> None:
        self.route(route).observe(max_tokens, output_tokens)

    def expected(self, route: str, max_tokens: int | None, generated: int = 0) -> float:
        return self.route(route).expected(max_tokens, generated)

    def describe(self, table: Table | None = None) -> dict[str, Any]:
        """The default model's distributions, or ``table``'s."""
        table = self.routes if table is None else table
        return {route: dist.describe() for route, dist in table.items()}

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _table_json(self.routes)
        if self.models:
            out["models"] = {name: _table_json(table) for name, table in self.models.items()}
        return out

    def load(self, data: object) -> None:
        if not isinstance(data, dict):
            return
        _load_table(self.routes, data)
        models = data.get("models")
        if isinstance(models, dict):
            for name, stored in models.items():
                if isinstance(name, str) and isinstance(stored, dict):
                    _load_table(self.for_model(name), stored)


def _table_json(table: Table) -> dict[str, Any]:
    return {route: {"ratio": d.ratio.as_json(), "absolute": d.absolute.as_json()}
            for route, d in table.items()}


def _load_table(table: Table, data: dict[Any, Any]) -> None:
    for route, stored in data.items():
        if route in ROUTES and isinstance(stored, dict):
            dist = table.get(route)
            if dist is None:
                dist = table[route] = LengthDistribution()
            dist.ratio.load(stored.get("ratio"))
            dist.absolute.load(stored.get("absolute"))
