"""One measured phase: a closed-loop load on one system, with the router's CPU and RSS."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import uvloop

from . import loadgen, procstat
from .systems import MODEL, SimSettings, System


@dataclass
class Phase:
    """Figures of one (system, load) phase; latencies in ms."""

    system: str
    load: str  # "1", "64", "256" or "saturation"
    streams: int
    window_s: float
    requests: int
    errors: int
    tokens: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    ttft_samples: int
    cpu_s: float  # router process tree (0 for direct)
    rss_mb: float
    engines_cpu_s: float
    client_cpu_s: float  # this load generator
    error_samples: list[str] = field(default_factory=list)
    paired_with: str = ""  # for a direct phase: the router measured right after it

    @property
    def cpu_s_per_1k_tokens(self) -> float:
        return 1000.0 * self.cpu_s / self.tokens if self.tokens else float("nan")

    @property
    def cpu_ms_per_request(self) -> float:
        """Router CPU per answer in the window (every process of the router's tree)."""
        return 1000.0 * self.cpu_s / self.requests if self.requests else float("nan")

    @property
    def client_cpu_s_per_1k_tokens(self) -> float:
        return 1000.0 * self.client_cpu_s / self.tokens if self.tokens else float("nan")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu_s_per_1k_tokens"] = self.cpu_s_per_1k_tokens
        out["cpu_ms_per_request"] = self.cpu_ms_per_request
        return out


def _ms(values: Sequence[float], q: float) -> float:
    return 1000.0 * loadgen.percentile(values, q)


class Meters:
    """CPU of the router tree, the engines and this process from :meth:`start` to :meth:`stop`."""

    def __init__(self, system: System, engine_pids: Sequence[int]) -> None:
        self.router = procstat.TreeMeter(system.root_pid) if system.root_pid else None
        self.engines = [procstat.TreeMeter(pid) for pid in engine_pids]
        self._client0 = 0.0
        self.client_cpu_s = 0.0

    @staticmethod
    def _self_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def start(self) -> None:
        for m in ([self.router] if self.router else []) + self.engines:
            m.start()
        self._client0 = self._self_cpu()

    def stop(self) -> None:
        self.client_cpu_s = self._self_cpu() - self._client0
        for m in ([self.router] if self.router else []) + self.engines:
            m.stop()


def phase_of(system: System, load: str, figures: loadgen.Figures, meters: Meters) -> Phase:
    window = figures.window_s or float("nan")
    router = meters.router
    return Phase(
        system=system.name,
        load=load,
        streams=figures.streams,
        window_s=figures.window_s,
        requests=figures.requests,
        errors=figures.errors,
        tokens=figures.tokens,
        tokens_per_s=figures.tokens / window,
        ttft_p50_ms=_ms(figures.ttft_s, 50),
        ttft_p99_ms=_ms(figures.ttft_s, 99),
        itl_p50_ms=_ms(figures.itl_s, 50),
        itl_p99_ms=_ms(figures.itl_s, 99),
        ttft_samples=len(figures.ttft_s),
        cpu_s=router.cpu_s if router else 0.0,
        rss_mb=router.rss_mb if router else 0.0,
        engines_cpu_s=sum(m.cpu_s for m in meters.engines),
        client_cpu_s=meters.client_cpu_s,
        error_samples=figures.error_samples,
    )


def request_maker(sim: SimSettings) -> Callable[[loadgen.Target], bytes]:
    body = loadgen.chat_body(MODEL, sim.tokens, sim.prompt())
    return lambda target: loadgen.request_bytes(target, body)


def run(
    system: System,
    engine_pids: Sequence[int],
    sim: SimSettings,
    *,
    load: str,
    streams: int,
    warmup_s: float,
    duration_s: float,
    hook: Callable[[str], None] | None = None,
) -> Phase:
    """Drive ``system`` with ``streams`` closed-loop streams; measure the window only."""
    meters = Meters(system, engine_pids)

    def on_window(edge: str) -> None:
        meters.start() if edge == "start" else meters.stop()
        if hook is not None:
            hook(edge)

    figures = uvloop.run(
        loadgen.run_phase(
            system.targets,
            request_maker(sim),
            streams=streams,
            warmup_s=warmup_s,
            duration_s=duration_s,
            on_window=on_window,
        )
    )
    return phase_of(system, load, figures, meters)


def run_fixed(
    system: System, engine_pids: Sequence[int], sim: SimSettings, *, streams: int, answers: int
) -> Phase:
    """``streams`` x ``answers`` streamed answers, all measured (a pytest-benchmark round)."""
    meters = Meters(system, engine_pids)
    meters.start()
    figures = uvloop.run(
        loadgen.run_fixed(system.targets, request_maker(sim), streams=streams, answers=answers)
    )
    meters.stop()
    return phase_of(system, str(streams), figures, meters)


def settle(seconds: float = 0.3) -> None:
    """Let connections of the previous phase close before the next one starts."""
    time.sleep(seconds)


def combine(phases: Sequence[Phase]) -> Phase:
    """Rounds of one case as one phase: medians of the latencies and rates, sums of the rest."""

    def med(key: str) -> float:
        values = [getattr(p, key) for p in phases]
        return statistics.median(values) if values else float("nan")

    first = phases[0]
    return Phase(
        system=first.system,
        load=first.load,
        streams=first.streams,
        window_s=sum(p.window_s for p in phases),
        requests=sum(p.requests for p in phases),
        errors=sum(p.errors for p in phases),
        tokens=sum(p.tokens for p in phases),
        tokens_per_s=med("tokens_per_s"),
        ttft_p50_ms=med("ttft_p50_ms"),
        ttft_p99_ms=med("ttft_p99_ms"),
        itl_p50_ms=med("itl_p50_ms"),
        itl_p99_ms=med("itl_p99_ms"),
        ttft_samples=sum(p.ttft_samples for p in phases),
        cpu_s=sum(p.cpu_s for p in phases),
        rss_mb=max(p.rss_mb for p in phases),
        engines_cpu_s=sum(p.engines_cpu_s for p in phases),
        client_cpu_s=sum(p.client_cpu_s for p in phases),
        error_samples=[e for p in phases for e in p.error_samples][:5],
    )
