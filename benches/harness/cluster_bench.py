"""Cluster benchmark: tokens/s and added TTFT with one router vs two sharing the fleet through
Redis behind a simple client-side split (each stream sticks to one router, round robin).

    python -m benches.harness.cluster_bench [--streams 64] [--out-md FILE]

Systems, each in front of the same simulated engines: ``direct`` (the engines themselves:
the TTFT every router adds to), ``one`` (one Narwhal, no cluster), ``cluster x1`` (one Narwhal
in a cluster: the cost of the sync task alone) and ``cluster x2`` (two Narwhal instances in
one cluster, the load split between them). Needs ``redis-server`` on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .loadgen import Figures, Target, chat_body, percentile, request_bytes, run_phase
from .report import splice_named
from .systems import MODEL, SimSettings, System, direct, free_port, start_engines, start_narwhal


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benches.harness.cluster_bench",
                                description=__doc__)
    p.add_argument("--streams", type=int, default=64, help="concurrent streams")
    p.add_argument("--engines", type=int, default=2, help="simulated engine processes")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=1, help="workers per router instance")
    p.add_argument("--out-md", type=Path, help="Markdown report (default: stdout)")
    p.add_argument("--into", type=Path, help="a document to write the table into, between "
                   "its <!-- cluster_bench:begin/end --> markers (docs/performance.md)")
    return p.parse_args(argv)


def _redis(logdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}/0"


def _measure(system: System, settings: SimSettings, args: argparse.Namespace) -> Figures:
    body = chat_body(MODEL, settings.tokens, settings.prompt())

    def request_for(target: Target) -> bytes:
        return request_bytes(target, body)

    return asyncio.run(run_phase(system.targets, request_for, streams=args.streams,
                                 warmup_s=args.warmup, duration_s=args.duration))


def _row(name: str, figures: Figures, base_ttft_ms: float | None) -> str:
    ttft = [t * 1e3 for t in figures.ttft_s]
    p50, p99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
    added = "" if base_ttft_ms is None else f"{p50 - base_ttft_ms:+.1f}"
    rate = figures.tokens / figures.window_s if figures.window_s else 0.0
    return (f"| {name} | {rate:,.0f} | {p50:.1f} | {p99:.1f} | {added} | "
            f"{figures.requests} | {figures.errors} |")


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    logdir = Path(tempfile.mkdtemp(prefix="narwhal-cluster-bench-"))
    settings = SimSettings()
    engines = start_engines(args.engines, settings, logdir)
    redis, url = _redis(logdir)
    urls = [e.url for e in engines]
    rows: list[str] = []
    try:
        base = _measure(direct(urls), settings, args)
        base_ttft = percentile([t * 1e3 for t in base.ttft_s], 0.5)
        rows.append(_row("direct (engines)", base, None))
        cluster = ["cluster.backend=redis", f"cluster.url={url}",
                   "cluster.key_prefix=bench", "cluster.sync_interval_ms=100"]
        plans: list[tuple[str, list[list[str]]]] = [
            ("one router", [[]]),
            ("cluster x1", [cluster]),
            ("cluster x2 (client split)", [cluster, cluster]),
        ]
        for name, instances in plans:
            systems = [start_narwhal(f"{name.split()[0]}{i}", urls, args.workers, logdir,
                                     overrides=o) for i, o in enumerate(instances)]
            try:
                time.sleep(1.0)  # profiles done, instances joined
                joined = System(name, [t for s in systems for t in s.targets])
                rows.append(_row(name, _measure(joined, settings, args), base_ttft))
            finally:
                for s in systems:
                    s.stop()
    finally:
        redis.terminate()
        redis.wait(5)
        for e in engines:
            e.stop()
    table = "\n".join([
        f"Cluster benchmark: {args.engines} simulated engines (TTFT {settings.ttft_ms} ms, "
        f"ITL {settings.tpot_ms} ms, {settings.tokens} tokens), {args.streams} streams, "
        f"{args.workers} worker(s) per instance, {args.duration:g} s window.",
        "",
        "| system | tokens/s | TTFT p50 ms | TTFT p99 ms | added TTFT p50 ms | answers | errors |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    if args.out_md is not None:
        args.out_md.write_text(table + "\n")
    if args.into is not None:
        splice_named(args.into, "cluster_bench", "python -m benches.harness.cluster_bench "
                     f"--streams {args.streams} --into {args.into}", table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
