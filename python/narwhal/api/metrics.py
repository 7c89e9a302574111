"""Prometheus exposition of the accounting board; metric names and labels declared once (§12)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from narwhal._narwhal_fast import Board
from narwhal.fleet.engine import Engine

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
"""The `Content-Type` of `render()`'s output (the text format `generate_latest` writes)."""

REASON = "reason"
MODEL = "model"
ENGINE = "engine"
PHASE = "phase"
PHASES = ("prefill", "decode")

_le: Callable[[float], str] = floatToGoString  # "+Inf", "0.001", ... (untyped upstream)


@dataclass(frozen=True)
class Family:
    """One metric family: its exposed name (counters without `_total`), snapshot key, help."""

    name: str
    key: str
    help: str


COUNTERS = (
    Family("narwhal_offered", "offered", "Requests offered to a completion route, at arrival."),
    Family(
        "narwhal_unsized_offered",
        "unsized_offered",
        "Offered requests that ended before their workload was sized.",
    ),
    Family(
        "narwhal_offered_prompt_tokens",
        "offered_prompt_tokens",
        "Prompt tokens of the offered requests that were sized.",
    ),
    Family("narwhal_cancelled", "cancelled", "Requests whose client went away."),
    Family("narwhal_completed", "completed", "Requests answered to the end."),
    # beyond §12 (additions): a dead worker's requests, finished as cancelled; lock takeovers
    Family(
        "narwhal_reaped_requests",
        "reaped",
        "Requests of dead worker processes finished as cancelled (included in cancelled).",
    ),
    Family(
        "narwhal_board_lock_steals",
        "lock_steals",
        "Board locks taken over from a worker that died holding one.",
    ),
)
REASON_COUNTERS = (
    Family("narwhal_rejected", "rejected", "Requests rejected for capacity, by error code."),
    Family("narwhal_refused", "refused", "Requests refused by predictive admission, by code."),
    Family(
        "narwhal_invalid_requests",
        "invalid_requests",
        "Malformed or unacceptable requests, by error code.",
    ),
    Family("narwhal_expired", "expired", "Requests whose wait or deadline expired, by error code."),
    Family("narwhal_failed", "failed", "Requests failed by an engine, by error code."),
)
GAUGES = (
    Family("narwhal_retained_requests", "retained", "HTTP requests held (waiting or running)."),
    Family("narwhal_queued_requests", "queued", "Requests waiting for placement."),
)
ENGINE_INFLIGHT = Family(
    "narwhal_engine_inflight", "engines", "Requests in flight on an engine, by phase."
)
ENGINE_UP = Family("narwhal_engine_up", "engines", "1 while the engine is healthy, else 0.")
HISTOGRAMS = (
    Family("narwhal_ttft_seconds", "ttft", "Time from arrival to the first generated token."),
    Family("narwhal_tpot_seconds", "tpot", "Time per output token after the first."),
    Family("narwhal_queue_wait_seconds", "queue_wait", "Time spent in the admission queue."),
    Family("narwhal_e2e_seconds", "e2e", "Time from arrival to the end of the response."),
    Family("narwhal_output_tokens", "output_tokens", "Generated tokens per completed request."),
)


MODEL_COUNTERS = frozenset({"offered", "unsized_offered", "offered_prompt_tokens", "cancelled",
                            "completed"})
MODEL_GAUGES = frozenset({"retained"})
"""Board families that also carry a sample per model (``model`` label) when the
configuration uses ``models``: request outcomes, what the invariant needs, and (every
histogram) the latencies."""

ModelSnapshots = Sequence[tuple[str, dict[str, Any]]]
"""(model name, its board's snapshot), per configured model."""


class BoardCollector(Collector):
    """Turns one `board.snapshot()` per scrape into metric families (no counting here).

    `engine_names()` gives the name of the engine in each board slot (None: a free slot);
    `extra()` yields more families
    (engine token accounting, learned drift, ...) owned by other parts. `models`: each
    configured model's name and board (per-model metrics): the outcome and latency families
    then carry, beside the unlabelled totals, one sample per model labelled `model`.
    """

    def __init__(
        self,
        board: Board,
        engine_names: Callable[[], Sequence[str | None]],
        extra: Callable[[], Iterable[Metric]] | None = None,
        models: Sequence[tuple[str, Board]] = (),
    ) -> None:
        self._board = board
        self._engine_names = engine_names
        self._extra = extra
        self._models = models

    def describe(self) -> Iterator[Metric]:
        """The board's families without samples (lets the registry reject duplicates)."""
        yield from _families({}, ())

    def collect(self) -> Iterator[Metric]:
        models = [(name, board.snapshot()) for name, board in self._models]
        yield from _families(self._board.snapshot(), self._engine_names(), models)
        if self._extra is not None:
            yield from self._extra()


def _families(snapshot: dict[str, Any], engine_names: Sequence[str | None],
              models: ModelSnapshots = ()) -> Iterator[Metric]:
    """Every board family; with an empty snapshot, just the declarations."""
    for family in COUNTERS:
        labelled = models if family.key in MODEL_COUNTERS else ()
        counter = CounterMetricFamily(family.name, family.help, labels=[MODEL])
        for labels, snap in ([], snapshot), *(([m], snap) for m, snap in labelled):
            if family.key in snap:
                counter.add_metric(labels, snap[family.key])
        yield counter
    for family in REASON_COUNTERS:
        by_reason = CounterMetricFamily(family.name, family.help, labels=[REASON, MODEL])
        for model, snap in ("", snapshot), *models:
            for reason, count in snap.get(family.key, {}).items():
                by_reason.add_metric([reason, model] if model else [reason], count)
        yield by_reason
    for family in GAUGES:
        labelled = models if family.key in MODEL_GAUGES else ()
        gauge = GaugeMetricFamily(family.name, family.help, labels=[MODEL])
        for labels, snap in ([], snapshot), *(([m], snap) for m, snap in labelled):
            if family.key in snap:
                gauge.add_metric(labels, snap[family.key])
        yield gauge
    inflight = GaugeMetricFamily(ENGINE_INFLIGHT.name, ENGINE_INFLIGHT.help, labels=[ENGINE, PHASE])
    up = GaugeMetricFamily(ENGINE_UP.name, ENGINE_UP.help, labels=[ENGINE])
    for name, cell in zip(engine_names, snapshot.get("engines", ()), strict=False):
        if name is None:
            continue  # a free slot
        for phase in PHASES:
            inflight.add_metric([name, phase], cell[phase])
        up.add_metric([name], 1 if cell["up"] else 0)
    yield inflight
    yield up
    for family in HISTOGRAMS:
        out = HistogramMetricFamily(family.name, family.help, labels=[MODEL])
        # With model boards, a request's latencies go to its model's board only: the
        # unlabelled histogram is their sum (and the main board's, which holds the rest).
        found = [(m, snap["histograms"][family.key]) for m, snap in [("", snapshot), *models]
                 if family.key in snap.get("histograms", {})]
        if found:
            total = _sum_histograms([histogram for _, histogram in found])
            for labels, histogram in ([], total), *(([m], h) for m, h in found if m):
                buckets = [(_le(le), count) for le, count in histogram["buckets"]]
                out.add_metric(labels, buckets, histogram["sum"])
        yield out


def _sum_histograms(histograms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Histograms of the same buckets added up."""
    if len(histograms) == 1:
        return histograms[0]
    first = histograms[0]["buckets"]
    counts = [sum(h["buckets"][i][1] for h in histograms) for i in range(len(first))]
    return {"buckets": [(le, count) for (le, _), count in zip(first, counts, strict=True)],
            "sum": sum(h["sum"] for h in histograms)}


def build_registry(
    board: Board,
    engine_names: Callable[[], Sequence[str | None]],
    extra: Callable[[], Iterable[Metric]] | None = None,
    models: Sequence[tuple[str, Board]] = (),
) -> CollectorRegistry:
    """A registry holding only the board's collector (no per-process default metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(board, engine_names, extra, models))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of every collector in `registry`."""
    return generate_latest(registry)


def token_accounting_family(engines: Iterable[Engine]) -> Metric:
    """``narwhal_engine_token_accounting{engine,mode}``: 1 for each engine's mode."""
    family = GaugeMetricFamily(
        "narwhal_engine_token_accounting",
        "1 for the engine's token accounting mode (token_ids or unavailable).",
        labels=["engine", "mode"],
    )
    for engine in engines:
        for mode in ("token_ids", "unavailable"):
            family.add_metric([engine.name, mode], float(engine.token_accounting == mode))
    return family
