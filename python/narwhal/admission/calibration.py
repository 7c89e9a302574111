"""Sizing without a round trip: the estimate, calibrated on the engines' own prompt counts.

Every relayed stream tells the router how many prompt tokens the engine counted (its
``prompt_token_ids``, or ``usage.prompt_tokens``), for free. Per base model (one tokenizer
and chat template), :class:`Calibration` fits ``tokens ≈ a·chars + b·spaces + c·symbols +
d·messages + e`` (symbols: bytes that are neither ASCII letters, digits nor spaces, which
tokenizers split finely) to the last :data:`WINDOW` such counts by least squares on the
relative error, ridge-regularised toward the static estimate's coefficients so a narrow mix
of prompts cannot swing it, and keeps the fit's relative error: its 90th percentile is the
*band* within which a sizing decision is uncertain.

:class:`CalibratedSizer` sizes every request with the calibrated estimate, at no await. Only
where a decision hangs on the exact count (predictive admission whose projection lies within
the band of the budget) does the flow ask the exact sizer (the engines' ``/tokenize``).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from narwhal.admission.sizing import (
    CHARS_PER_TOKEN,
    TOKENS_PER_CHAT,
    TOKENS_PER_MESSAGE,
    EngineSizer,
    EstimateSizer,
    Sizer,
    TokenizerSizer,
    prompt_texts,
)
from narwhal.request.parse import Parsed

if TYPE_CHECKING:
    from narwhal.fleet.engine import Engine

WINDOW = 256
"""Engine counts kept per model and route."""
MIN_FIT = 8
"""Counts needed before the fit replaces the static estimate."""
REFIT_EVERY = 8
"""Counts between refits (a refit is one 5x5 solve of the running normal equations)."""
BAND_EVERY = 64
"""Counts between refreshes of the band (a pass over the window's residuals)."""
SAMPLE_EVERY = 8
"""With a full window, one count in this many is taken (each costs two rank-one updates)."""
REBUILD_EVERY = 16 * WINDOW
"""Counts between rebuilds of the running sums from the window (rounding)."""
RIDGE = 1e-3
"""How strongly each coefficient is held to the static estimate's, per unit of relative change
(weak: enough to fix directions the counts do not span, such as a constant message count)."""
BAND_FLOOR = 0.02
"""The band is never narrower than this relative error."""
UNCALIBRATED_BAND = 0.35
"""The band before a fit: the static estimate's error on unfamiliar text can be this large."""


Features = tuple[float, float, float, float, float]
_PLAIN = bytes(range(ord("0"), ord("9") + 1)) + bytes(range(ord("A"), ord("Z") + 1)) \
    + bytes(range(ord("a"), ord("z") + 1)) + b" "


def features(parsed: Parsed) -> Features:
    """What the calibrated estimate sees of a prompt: characters, spaces, symbol bytes and
    messages of its text (as the static estimate counts it), and a constant. Counted with
    C-speed string methods (about 1 µs per kilobyte of prompt), once per request."""
    cached = parsed.size_features
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    text = "".join(prompt_texts(parsed))
    raw = text.encode("utf-8", "surrogatepass")
    found = (float(len(text)), float(text.count(" ")), float(len(raw.translate(None, _PLAIN))),
             float(parsed.messages), 1.0)
    parsed.size_features = found
    return found


def _prior(route: str) -> Features:
    chat = route == "chat"
    return (1.0 / CHARS_PER_TOKEN, 0.0, 0.0, float(TOKENS_PER_MESSAGE) if chat else 0.0,
            float(TOKENS_PER_CHAT) if chat else 0.0)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a small dense system."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


_NAMES = ("chars", "spaces", "symbols", "messages", "fixed")


class _Fit:
    """One model and route's counts and current coefficients. The normal equations are kept
    as running sums over the window (a count in, the oldest out), so a refit is one 5x5
    solve; the band (a pass over the window's residuals) is refreshed less often."""

    __slots__ = ("ata", "atb", "band", "coef", "counts", "fitted", "seen", "since", "total")

    def __init__(self, route: str) -> None:
        self.coef = _prior(route)
        self.counts: deque[tuple[Features, float]] = deque()
        self.ata = [[0.0] * len(self.coef) for _ in self.coef]
        self.atb = [0.0] * len(self.coef)
        self.fitted = False
        self.band = UNCALIBRATED_BAND
        self.since = 0  # counts since the last fit
        self.total = 0  # counts taken
        self.seen = 0  # counts offered

    def _account(self, x: Features, y: float, sign: float) -> None:
        w = sign / (y * y)  # least squares on the relative error
        ata, atb = self.ata, self.atb
        for i, xi in enumerate(x):
            wxi = w * xi
            atb[i] += wxi * y
            row = ata[i]
            for j, xj in enumerate(x):
                row[j] += wxi * xj

    def add(self, x: Features, tokens: float, route: str) -> None:
        self.seen += 1
        if self.seen % SAMPLE_EVERY and len(self.counts) >= WINDOW:
            return  # a full window learns from a sample: the fit moves slowly anyway
        counts = self.counts
        counts.append((x, tokens))
        self._account(x, tokens, 1.0)
        if len(counts) > WINDOW:
            old, y = counts.popleft()
            self._account(old, y, -1.0)
        self.total += 1
        self.since += 1
        if self.total % REBUILD_EVERY == 0:  # running sums drift: rebuild them from the window
            self.ata = [[0.0] * len(x) for _ in x]
            self.atb = [0.0] * len(x)
            for old, y in counts:
                self._account(old, y, 1.0)
        if len(counts) >= MIN_FIT and (not self.fitted or self.since >= REFIT_EVERY):
            self.refit(route, band=not self.fitted or self.total % BAND_EVERY < REFIT_EVERY)

    def refit(self, route: str, *, band: bool) -> None:
        """Solve the normal equations, with a ridge that holds each coefficient near the
        static estimate's in relative terms."""
        self.since = 0
        prior = _prior(route)
        ata = [row[:] for row in self.ata]
        atb = self.atb[:]
        for i, p in enumerate(prior):
            unit = max(abs(p), 1.0 / CHARS_PER_TOKEN)
            ata[i][i] += RIDGE / (unit * unit)
            atb[i] += RIDGE * p / (unit * unit)
        solved = _solve(ata, atb)
        if solved is None:
            return
        coef: Features = (solved[0], solved[1], solved[2], solved[3], solved[4])
        self.coef = coef
        self.fitted = True
        if band:
            errors = sorted(abs(_dot(coef, x) - y) / y for x, y in self.counts)
            self.band = max(BAND_FLOOR, errors[int(0.9 * (len(errors) - 1))])


def _dot(coef: Features, x: Features) -> float:
    return float(sum(map(operator.mul, coef, x)))


class Calibration:
    """The calibrated estimate, per base model and route, learned from engine counts."""

    def __init__(self) -> None:
        self._fits: dict[tuple[int, str], _Fit] = {}

    @staticmethod
    def _key(parsed: Parsed) -> tuple[int, str]:
        served = parsed.served
        return (0 if served is None else served.base.index, parsed.route)

    def _fit(self, parsed: Parsed) -> _Fit:
        key = self._key(parsed)
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = _Fit(parsed.route)
        return fit

    def tokens(self, parsed: Parsed) -> int:
        """The calibrated prompt count (token-ID prompts count exactly)."""
        fit = self._fits.get(self._key(parsed))
        if fit is None or not fit.fitted or not parsed.prompt_text_chars:
            return EstimateSizer.size_now(parsed)
        return max(1, round(_dot(fit.coef, features(parsed)))) + parsed.prompt_token_ids

    def band(self, parsed: Parsed) -> float:
        """The relative error within which a decision on this request's size is uncertain."""
        fit = self._fits.get(self._key(parsed))
        return UNCALIBRATED_BAND if fit is None else fit.band

    def observe(self, parsed: Parsed, engine_tokens: int) -> None:
        """The engine counted ``engine_tokens`` for this request's prompt."""
        text_tokens = engine_tokens - parsed.prompt_token_ids
        if text_tokens <= 0 or not parsed.prompt_text_chars:
            return  # a token-ID prompt: the estimate is exact already
        if parsed.route == "completion" and isinstance(parsed.body.get("prompt"), list):
            return  # several prompts: a stream's prompt_token_ids cover only the first
        self._fit(parsed).add(features(parsed), float(text_tokens), parsed.route)

    def describe(self) -> list[dict[str, object]]:
        """Per model and route: counts seen, coefficients and band (for ``/engines``)."""
        out: list[dict[str, object]] = []
        for (model, route), fit in sorted(self._fits.items()):
            out.append({"model_index": model, "route": route, "counts": fit.seen,
                        "fitted": fit.fitted,
                        "coefficients": dict(zip(_NAMES, (round(c, 5) for c in fit.coef),
                                                 strict=True)),
                        "band": round(fit.band, 4)})
        return out


class CalibratedSizer:
    """Sizes with the calibrated estimate, at no await."""

    __slots__ = ("calibration",)

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration

    async def size(self, parsed: Parsed) -> int:
        return self.calibration.tokens(parsed)


@dataclass(frozen=True, slots=True)
class Sizing:
    """How requests are sized: ``sizer`` for every request; with ``calibration``, the
    estimate learns from the engines' counts, and ``exact`` (when not None) is asked where
    predictive admission's decision lies within the estimate's error band."""

    sizer: Sizer
    calibration: Calibration | None = None
    exact: Sizer | None = None

    def band(self, parsed: Parsed) -> float:
        """The relative error that could change a decision; 0 when nothing is more exact."""
        if self.exact is None or self.calibration is None:
            return 0.0
        return self.calibration.band(parsed)


def make_sizing(mode: str, engines: Sequence[Engine], tokenizer: str | None) -> Sizing:
    """``auto`` (the default): the local tokenizer when configured, else the calibrated
    estimate, with the engines' ``/tokenize`` for the requests whose admission hangs on the
    exact count. ``engine``: ``/tokenize`` for every request. ``estimate``: the static
    estimate. ``tokenizer``: the local tokenizer."""
    if mode == "tokenizer" or (mode == "auto" and tokenizer):
        if not tokenizer:
            raise ValueError("admission.sizing: tokenizer needs the `tokenizer` key")
        return Sizing(TokenizerSizer(tokenizer))
    if mode == "engine":
        return Sizing(EngineSizer(engines))
    if mode == "estimate":
        return Sizing(EstimateSizer())
    calibration = Calibration()
    exact = (EngineSizer(engines)
             if any(e.config.dialect in EngineSizer.DIALECTS for e in engines) else None)
    return Sizing(CalibratedSizer(calibration), calibration, exact)


