"""The /metrics exposition: SPEC §12 names, types and labels, parsed back with prometheus_client."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from narwhal._narwhal_fast import Board
from narwhal.api.metrics import CONTENT_TYPE, BoardCollector, build_registry, render

SPEC_COUNTERS = {
    "narwhal_offered": set(),
    "narwhal_unsized_offered": set(),
    "narwhal_offered_prompt_tokens": set(),
    "narwhal_rejected": {"reason"},
    "narwhal_refused": {"reason"},
    "narwhal_invalid_requests": {"reason"},
    "narwhal_expired": {"reason"},
    "narwhal_failed": {"reason"},
    "narwhal_cancelled": set(),
    "narwhal_completed": set(),
}
SPEC_GAUGES = {
    "narwhal_retained_requests": set(),
    "narwhal_queued_requests": set(),
    "narwhal_engine_inflight": {"engine", "phase"},
    "narwhal_engine_up": {"engine"},
}
SPEC_HISTOGRAMS = (
    "narwhal_ttft_seconds",
    "narwhal_tpot_seconds",
    "narwhal_queue_wait_seconds",
    "narwhal_e2e_seconds",
    "narwhal_output_tokens",
)


EXTRA_COUNTERS = ("narwhal_reaped_requests", "narwhal_board_lock_steals")


def scrape(
    board: Board, names: list[str], extra: Callable[[], Iterable[Metric]] | None = None
) -> dict[str, Metric]:
    text = render(build_registry(board, lambda: names, extra)).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, suffix: str = "", **labels: str) -> float:
    name = family.name + suffix
    found = [s.value for s in family.samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, family.samples)
    return float(found[0])


def busy_board() -> tuple[Board, list[object]]:
    """A board with a few finished requests, one queued, one slot held; returns the guards."""
    board = Board(engines=4)
    done, _ = board.arrive(10)
    done.sized(300)
    done.finish("completed")
    for cls, reason in [("rejected", "queue_full")] * 2 + [("failed", "engine_error")]:
        ticket, _ = board.arrive(10)
        ticket.finish(cls, reason)
    waiting, _ = board.arrive(10)
    assert waiting.enqueue(5)
    slot = board.acquire_slot(1, "decode", 8)
    board.set_engine_up(0, True)
    board.observe("ttft", 0.02)
    board.observe("ttft", 2.5)
    board.observe("output_tokens", 100)
    return board, [waiting, slot]


def test_every_spec_family_is_exposed_with_its_type_and_labels() -> None:
    board, _guards = busy_board()
    families = scrape(board, ["a0", "b0"])
    for name, labels in SPEC_COUNTERS.items():
        assert families[name].type == "counter", name
        for sample in families[name].samples:
            assert sample.name == name + "_total"
            assert set(sample.labels) == labels
    for name, labels in SPEC_GAUGES.items():
        assert families[name].type == "gauge", name
        assert families[name].samples
        assert all(set(s.labels) == labels for s in families[name].samples)
    for name in SPEC_HISTOGRAMS:
        assert families[name].type == "histogram", name
        buckets = [s for s in families[name].samples if s.name == name + "_bucket"]
        assert buckets[-1].labels == {"le": "+Inf"}
        assert buckets[-1].value == value(families[name], "_count")
    for name in EXTRA_COUNTERS:
        assert value(families[name], "_total") == 0
    text = render(build_registry(board, lambda: [])).decode()
    for name in SPEC_COUNTERS:
        assert f"# TYPE {name}_total counter" in text
    assert CONTENT_TYPE.startswith(b"text/plain")


def test_values_mirror_the_snapshot() -> None:
    board, _guards = busy_board()
    families = scrape(board, ["a0", "b0", "c0"])
    assert value(families["narwhal_offered"], "_total") == 5
    assert value(families["narwhal_offered_prompt_tokens"], "_total") == 300
    assert value(families["narwhal_unsized_offered"], "_total") == 3
    assert value(families["narwhal_completed"], "_total") == 1
    assert value(families["narwhal_cancelled"], "_total") == 0
    assert value(families["narwhal_rejected"], "_total", reason="queue_full") == 2
    assert value(families["narwhal_failed"], "_total", reason="engine_error") == 1
    assert value(families["narwhal_retained_requests"]) == 1
    assert value(families["narwhal_queued_requests"]) == 1
    inflight = families["narwhal_engine_inflight"]
    assert value(inflight, engine="b0", phase="decode") == 1
    assert value(inflight, engine="a0", phase="prefill") == 0
    assert len(inflight.samples) == 6, "one series per named engine and phase"
    assert value(families["narwhal_engine_up"], engine="a0") == 1
    assert value(families["narwhal_engine_up"], engine="c0") == 0
    ttft = families["narwhal_ttft_seconds"]
    assert value(ttft, "_count") == 2
    assert value(ttft, "_sum") == pytest.approx(2.52)
    assert value(ttft, "_bucket", le="0.025") == 1
    assert value(ttft, "_bucket", le="3.0") == 2
    assert value(families["narwhal_output_tokens"], "_bucket", le="128.0") == 1


def test_reason_series_only_for_reasons_seen() -> None:
    families = scrape(Board(engines=1), ["a0"])
    for name, labels in SPEC_COUNTERS.items():
        if labels:
            assert families[name].samples == [], name
    board, _guards = busy_board()
    families = scrape(board, [])
    assert [s.labels["reason"] for s in families["narwhal_rejected"].samples] == ["queue_full"]
    assert families["narwhal_refused"].samples == []
    assert families["narwhal_engine_inflight"].samples == []


def test_every_scrape_is_consistent() -> None:
    board, _guards = busy_board()
    families = scrape(board, [])
    finished = sum(
        s.value
        for name, labels in SPEC_COUNTERS.items()
        if name
        not in ("narwhal_offered", "narwhal_unsized_offered", "narwhal_offered_prompt_tokens")
        for s in families[name].samples
    )
    retained = value(families["narwhal_retained_requests"])
    assert value(families["narwhal_offered"], "_total") == finished + retained


def test_extra_families_and_duplicate_names() -> None:
    board = Board(engines=2)

    def token_accounting() -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "narwhal_engine_token_accounting", "Token accounting mode", labels=["engine", "mode"]
        )
        family.add_metric(["a0", "token_ids"], 1)
        yield family

    families = scrape(board, ["a0"], token_accounting)
    assert value(families["narwhal_engine_token_accounting"], engine="a0", mode="token_ids") == 1
    registry = build_registry(board, lambda: ["a0"])
    with pytest.raises(ValueError, match="Duplicated"):
        registry.register(BoardCollector(board, lambda: ["a0"]))
