"""Router CPU per token in interleaved windows: several systems running at once, measured
in turn, round after round, on the same engines.

One window per system (the main table) leaves a ratio of two routers' CPU per token to the
host's moment: on the shared 2-core host one window of vllm-router has read 0.0196 and
another 0.0273 s per 1k tokens at 64 streams. Here every system is up for the whole
section, each round measures each of them once (the order turning every round), and the
figure kept is the median over rounds of the per-round ratio to the first system, so a
slow moment of the host lands on both sides of most ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import measure
from . import profiling as pyspy
from .systems import SimSettings, System

KERNEL = "[kernel.kallsyms]"


def interleaved(
    systems: Sequence[System],
    engine_pids: Sequence[int],
    sim: SimSettings,
    *,
    loads: Sequence[int],
    rounds: int,
    warmup_s: float,
    duration_s: float,
    log: Callable[[str], None],
    perf_dir: Path | None = None,
) -> dict[str, Any]:
    """Per load: each system's CPU per 1k tokens and TTFT p50 in every round, the medians,
    and the median per-round ratio of every system to ``systems[0]``. With ``perf_dir``,
    one more (unreported) window per system under perf splits its CPU per token into the
    kernel's part and the rest."""
    out: dict[str, Any] = {"rounds": rounds, "warmup_s": warmup_s, "window_s": duration_s,
                           "systems": [s.name for s in systems], "loads": {}}
    for streams in loads:
        per: dict[str, dict[str, list[float]]] = {
            s.name: {"cpu_s_per_1k_tokens": [], "ttft_p50_ms": [], "errors": []}
            for s in systems}
        for index in range(rounds):
            order = list(systems) if index % 2 == 0 else list(reversed(systems))
            for system in order:
                measure.settle()
                phase = measure.run(system, engine_pids, sim, load=str(streams),
                                    streams=streams, warmup_s=warmup_s, duration_s=duration_s)
                row = per[system.name]
                row["cpu_s_per_1k_tokens"].append(phase.cpu_s_per_1k_tokens)
                row["ttft_p50_ms"].append(phase.ttft_p50_ms)
                row["errors"].append(float(phase.errors))
                log(f"round {index + 1}/{rounds} {system.name:12s} {streams:4d}: "
                    f"{phase.cpu_s_per_1k_tokens:.4f} s/1k, TTFT p50 {phase.ttft_p50_ms:.2f} ms")
        base = per[systems[0].name]["cpu_s_per_1k_tokens"]
        table: dict[str, Any] = {}
        for system in systems:
            row = per[system.name]
            cpu = row["cpu_s_per_1k_tokens"]
            ratios = [a / b for a, b in zip(base, cpu, strict=True) if b > 0]
            table[system.name] = {
                "cpu_s_per_1k_tokens": cpu,
                "ttft_p50_ms": row["ttft_p50_ms"],
                "errors": int(sum(row["errors"])),
                "cpu_median": statistics.median(cpu),
                "ttft_p50_median": statistics.median(row["ttft_p50_ms"]),
                # systems[0]'s CPU over this system's, round by round
                "first_over_this_median": statistics.median(ratios) if ratios else None,
                "first_over_this_range": [min(ratios), max(ratios)] if ratios else None,
            }
        if perf_dir is not None:
            for system in systems:
                table[system.name]["split"] = _split(system, engine_pids, sim, streams,
                                                     warmup_s, duration_s, perf_dir)
                log(f"perf {system.name} {streams}: {table[system.name]['split']}")
        out["loads"][str(streams)] = table
    return out


def _split(system: System, engine_pids: Sequence[int], sim: SimSettings, streams: int,
           warmup_s: float, duration_s: float, perf_dir: Path) -> dict[str, Any]:
    """The kernel's share of the router's CPU cycles in one window under perf."""
    pid = system.root_pid
    assert pid is not None
    data = perf_dir / f"perf-{system.name}-{streams}.data"
    perf: list[Any] = []

    def on_window(edge: str) -> None:
        if edge == "start":
            perf.append(pyspy.perf_start(pid, max(1.0, duration_s - 1.0), data))

    measure.settle()
    measure.run(system, engine_pids, sim, load=str(streams), streams=streams,
                warmup_s=warmup_s, duration_s=duration_s, hook=on_window)
    rows, error = pyspy.perf_dso(perf[0] if perf else None, data)
    if error or not rows:
        return {"error": error or "perf recorded nothing"}
    total = sum(pct for _, pct in rows)
    kernel = sum(pct for dso, pct in rows if dso == KERNEL)
    return {"kernel_share": kernel / total if total else None,
            "by_library": [[dso, pct] for dso, pct in rows[:8]]}
