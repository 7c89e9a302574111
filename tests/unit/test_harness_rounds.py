"""The harness's interleaved CPU rounds decide the CPU-per-token targets, and the report shows
every round (benches/harness/rounds.py, report.py)."""

from __future__ import annotations

from typing import Any

from benches.harness import report


def _rounds(narwhal: list[float], vllm: list[float]) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(narwhal, vllm, strict=True)]
    ratios_sorted = sorted(ratios)
    return {
        "rounds": len(narwhal), "warmup_s": 2.0, "window_s": 5.0,
        "systems": ["narwhal", "vllm-router"],
        "loads": {"64": {
            "narwhal": {"cpu_s_per_1k_tokens": narwhal, "ttft_p50_ms": [22.0] * len(narwhal),
                        "errors": 0, "cpu_median": sorted(narwhal)[len(narwhal) // 2],
                        "ttft_p50_median": 22.0, "first_over_this_median": 1.0,
                        "first_over_this_range": [1.0, 1.0]},
            "vllm-router": {"cpu_s_per_1k_tokens": vllm, "ttft_p50_ms": [21.0] * len(vllm),
                            "errors": 0, "cpu_median": sorted(vllm)[len(vllm) // 2],
                            "ttft_p50_median": 21.0,
                            "first_over_this_median": ratios_sorted[len(ratios) // 2],
                            "first_over_this_range": [ratios_sorted[0], ratios_sorted[-1]]},
        }},
    }


def _figures(single_narwhal: float, single_vllm: float, rounds: dict[str, Any] | None
             ) -> dict[str, Any]:
    fig: dict[str, Any] = {"systems": {
        "narwhal": {"loads": {"64": {"cpu_s_per_1k_tokens": single_narwhal}}},
        "vllm-router": {"loads": {"64": {"cpu_s_per_1k_tokens": single_vllm}}},
    }}
    if rounds is not None:
        fig["cpu_rounds"] = rounds
    return fig


def test_the_median_of_interleaved_rounds_decides_not_the_single_windows() -> None:
    # Single windows say 0.5x (met); the rounds say 0.9x in the median (not met).
    rounds = _rounds([0.018, 0.020, 0.019], [0.020, 0.022, 0.021])
    rows = report._targets(_figures(0.010, 0.020, rounds))
    row = next(r for r in rows if "64 streams, 1 worker" in r)
    assert "median of 3 interleaved rounds" in row
    assert "0.90x" in row
    assert row.endswith("**not met** |")
    assert "single windows 0.0100 vs 0.0200" in row


def test_without_rounds_the_single_windows_decide() -> None:
    rows = report._targets(_figures(0.010, 0.020, None))
    row = next(r for r in rows if "64 streams, 1 worker" in r)
    assert "(0.50x)" in row and row.endswith("| met |")


def test_the_rounds_table_lists_every_round_and_the_ratio() -> None:
    lines = report._rounds_section({"cpu_rounds": _rounds([0.016, 0.030], [0.020, 0.020])})
    vllm = next(line for line in lines if "| vllm-router |" in line)
    assert "0.0200, 0.0200" in vllm
    assert "(0.80-1.50)" in vllm
    narwhal = next(line for line in lines if "| narwhal |" in line)
    assert "0.0160, 0.0300" in narwhal
