"""``python -m benches.harness``: measure every system against the same engines, write the report.

For each system in turn: start it, then for each load run the engines directly and
through the system back to back (a paired direct phase per system and load, so drift on a
shared host hits both sides alike), then stop it. The saturation load switches the engines
to no decode delay (``POST /sim/config``) so the token flow is bounded by CPU, not by them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import (
    anchors,
    gates,
    inprocess,
    loadgen,
    measure,
    report,
    rounds,
    sizing,
    stages,
    systems,
)
from . import profiling as pyspy
from .measure import Phase

REPO = Path(__file__).resolve().parents[2]
SYSTEMS = ("narwhal", "narwhal-2w", "vllm-router", "sglang-router", "litellm")
OBSERVED = {
    # Narwhal (1 worker) with an observability feature on, beside plain "narwhal" (both off)
    "narwhal-traced": ["tracing.sample_ratio=1.0"],  # + tracing.otlp_endpoint: a local sink
    "narwhal-logged": ["logging.access_log=true", "logging.format=json"],  # + access_log_file
}
"""Systems run only when named in ``--systems`` (their cost is reported per request)."""
GATED_MAX_STREAMS = 64  # above it this 2-core host saturates: figures there are not gated
QUICK = dict(
    streams="1,8", warmup=0.3, duration=0.5, ttft_ms=5, tpot_ms=1.0, systems="narwhal", saturation=0
)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benches.harness", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke run: Narwhal and direct only, 1 and 8 streams, ~3 s",
    )
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma list among {', '.join(SYSTEMS + tuple(OBSERVED))} (the last "
        "with tracing to a local OTLP sink, or the access log, on; e.g. "
        "--systems narwhal,narwhal-traced measures tracing's CPU per request)",
    )
    p.add_argument("--streams", default="1,64,256", help="concurrent streams per load")
    p.add_argument(
        "--saturation", type=int, default=256, help="streams of the saturation load (0: skip it)"
    )
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    p.add_argument("--duration", type=float, default=8.0, help="seconds of each window")
    p.add_argument("--engines", type=int, default=2, help="simulated engine processes")
    p.add_argument("--ttft-ms", type=int, default=20, help="engine time to first token")
    p.add_argument("--tpot-ms", type=float, default=5.0, help="engine inter-token time")
    p.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    p.add_argument(
        "--venv",
        type=Path,
        default=Path(tempfile.gettempdir()) / "narwhal-anchors",
        help="venv for the anchor routers (created and filled from PyPI if needed)",
    )
    p.add_argument(
        "--narwhal-src",
        type=Path,
        help="run Narwhal and the simulator from this copy of python/ (e.g. a "
        "snapshot of a commit) instead of the installed package",
    )
    p.add_argument(
        "--narwhal-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one Narwhal config key for this run (e.g. admission.sizing=estimate);"
        " repeatable. The published report uses the defaults",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile Narwhal with py-spy (installed into --venv) and perf under load",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="also time the stages from arrival to first token inside Narwhal at the largest "
        "load (benches/harness/stages.py)",
    )
    p.add_argument(
        "--cpu-rounds",
        type=int,
        default=5,
        help="interleaved rounds of Narwhal and vllm-router at 64 and 256 streams for the "
        "CPU-per-token ratio (benches/harness/rounds.py; both in --systems; 0 skips them)",
    )
    p.add_argument("--out-md", type=Path, help="Markdown report (default: none)")
    p.add_argument("--out-json", type=Path, help="JSON figures (default: none)")
    args = p.parse_args(argv)
    if args.quick:
        defaults = p.parse_args([])
        for key, value in QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    return args


def _log(text: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _start(
    name: str,
    engine_urls: list[str],
    logdir: Path,
    args: argparse.Namespace,
    ready: dict[str, str],
    request_for: Callable[[loadgen.Target], bytes],
) -> systems.System:
    venv: Path = args.venv
    if name == "narwhal":
        return systems.start_narwhal(
            name, engine_urls, 1, logdir, args.narwhal_src, args.narwhal_set
        )
    if name == "narwhal-2w":
        return systems.start_narwhal(
            name, engine_urls, 2, logdir, args.narwhal_src, args.narwhal_set
        )
    if name in OBSERVED:
        extra = list(OBSERVED[name])
        sink = systems.start_otlp_sink(logdir) if name == "narwhal-traced" else None
        if sink is not None:
            extra.append(f"tracing.otlp_endpoint={sink.url}")
        else:
            extra.append(f"logging.access_log_file={logdir / (name + '-access.log')}")
        try:
            system = systems.start_narwhal(
                name, engine_urls, 1, logdir, args.narwhal_src, [*args.narwhal_set, *extra]
            )
        except BaseException:
            if sink is not None:
                sink.stop()
            raise
        if sink is not None:
            system.procs.append(sink)  # stopped with it; the router stays procs[0] (measured)
        return system
    anchor = next(a for a in anchors.ANCHORS if a.name == name)
    system = anchors.start(anchor, venv, engine_urls, logdir, request_for)
    system.version = f"{name} {ready[name]}"
    return system


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SYSTEMS) - set(OBSERVED))
    if unknown:
        print(f"unknown system(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    loads = [int(s) for s in args.streams.split(",") if s.strip()]
    sim = systems.SimSettings(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, tokens=args.tokens)
    logdir = Path(tempfile.mkdtemp(prefix="narwhal-bench-"))
    command = "python -m benches.harness " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    _log(f"logs in {logdir}")

    status: dict[str, str] = {}
    wanted_anchors = [n for n in names if not n.startswith("narwhal")]
    if wanted_anchors or args.profile:
        try:
            status.update(anchors.ensure_venv(args.venv, _log))
        except (OSError, subprocess.SubprocessError) as exc:
            status.update(
                {n: f"not measured: no venv at {args.venv} ({exc})" for n in wanted_anchors}
            )
    if args.profile and not (args.venv / "bin" / "py-spy").exists():
        _log(f"installing py-spy into {args.venv} (PyPI)")
        subprocess.run(
            [str(args.venv / "bin" / "python"), "-m", "pip", "install", "-q", "py-spy"],
            check=False,
            timeout=600,
        )

    phases: list[Phase] = []
    versions: dict[str, str] = {"direct": "no router"}
    revision = _revision(args.narwhal_src)
    profiles: dict[str, pyspy.Profile] = {}
    stage_rows: tuple[str, list[tuple[str, int, list[float]]]] | None = None
    started = time.time()
    engines = systems.start_engines(args.engines, sim, logdir, args.narwhal_src)
    engine_urls = [e.url for e in engines]
    engine_pids = [e.pid for e in engines]
    request_for = measure.request_maker(sim)
    cpu_rounds: dict[str, Any] | None = None

    try:
        direct = systems.direct(engine_urls)
        for name in names:
            if name in status and not status[name][:1].isdigit():
                _log(f"{name}: {status[name]}")
                versions[name] = status[name]
                continue
            try:
                system = _start(name, engine_urls, logdir, args, status, request_for)
            except (RuntimeError, OSError) as exc:
                _log(f"{name} not measured: {exc}")
                versions[name] = f"not measured: {str(exc).splitlines()[0]}"
                continue
            versions[name] = system.version
            if name.startswith("narwhal"):
                versions[name] += f" ({revision})"
            try:
                plan = [(str(n), n) for n in loads]
                if args.saturation:
                    plan.append(("saturation", args.saturation))
                for label, streams in plan:
                    if label == "saturation":
                        systems.set_engine_timing(engine_urls, tpot_ms=0)
                    try:
                        for target in (direct, system):
                            measure.settle()
                            phase = measure.run(
                                target,
                                engine_pids,
                                sim,
                                load=label,
                                streams=streams,
                                warmup_s=args.warmup,
                                duration_s=args.duration,
                            )
                            if target is direct:
                                phase.paired_with = name
                            phases.append(phase)
                            _log(report.one_line(phase))
                    finally:
                        if label == "saturation":
                            systems.set_engine_timing(engine_urls, tpot_ms=sim.tpot_ms)
                if args.profile and name == "narwhal":
                    profiles.update(_profile(system, engine_urls, engine_pids, sim, args, logdir))
                if name == "narwhal-traced":
                    counts = systems.sink_counts(system.procs[-1])
                    _log(f"{name}: the OTLP sink took {counts['posts']} posts, "
                         f"{counts['bytes']} bytes of spans")
            finally:
                system.stop()
            if args.stages and name == "narwhal":
                stage_rows = _stages(engine_urls, engine_pids, sim, args, logdir)
        cpu_rounds = _cpu_rounds(names, loads, engine_urls, engine_pids, sim, args, logdir,
                                 status, request_for, versions)
    finally:
        for e in engines:
            e.stop()

    meta = report.Meta(
        command=command,
        started=started,
        elapsed_s=time.time() - started,
        sim=sim,
        engines=args.engines,
        warmup_s=args.warmup,
        duration_s=args.duration,
        quick=args.quick,
        versions=versions,
        loadavg=os.getloadavg(),
        cores=os.cpu_count() or 0,
    )
    figures = report.figures(phases, names, meta)
    if cpu_rounds is not None:
        figures["cpu_rounds"] = cpu_rounds
    if not args.quick and "narwhal" in names:
        _log("per-request CPU in process, and the sizing estimate's accuracy")
        figures["in_process"] = inprocess.measure_interleaved()
        figures["sizing"] = sizing.accuracy()
    if not args.quick and "narwhal" in names and "narwhal-traced" in names:
        _log("tracing off and on, per request in process")
        figures["in_process_tracing"] = inprocess.tracing_cost()
    if args.out_json:
        args.out_json.write_text(json.dumps(figures, indent=2, sort_keys=False) + "\n")
        _log(f"wrote {args.out_json}")
    markdown = report.markdown(figures, profiles, stage_rows)
    if args.out_md:
        args.out_md.write_text(report.splice(args.out_md, markdown))
        _log(f"wrote {args.out_md}")
    else:
        print(markdown)
    failed = _gates(phases) if "narwhal" in names else []
    errors = sum(p.errors for p in phases)
    if errors:
        _log(f"{errors} errors (see the table and {logdir})")
    return 1 if errors or failed or not phases else 0


def _cpu_rounds(
    names: list[str],
    loads: list[int],
    engine_urls: list[str],
    engine_pids: list[int],
    sim: systems.SimSettings,
    args: argparse.Namespace,
    logdir: Path,
    status: dict[str, str],
    request_for: Callable[[loadgen.Target], bytes],
    versions: dict[str, str],
) -> dict[str, Any] | None:
    """Narwhal and vllm-router both up, measured in turn (rounds.py), when both were
    measured above; None otherwise."""
    pair = ("narwhal", "vllm-router")
    wanted = [n for n in loads if n in (64, 256)]
    if (args.quick or args.cpu_rounds <= 0 or not wanted
            or any(versions.get(n, "not measured").startswith("not measured") for n in pair)):
        return None
    _log(f"interleaved rounds of {' and '.join(pair)}: {args.cpu_rounds} per load")
    started: list[systems.System] = []
    try:
        for name in pair:
            started.append(_start(name, engine_urls, logdir, args, status, request_for))
        return rounds.interleaved(started, engine_pids, sim, loads=wanted,
                                  rounds=args.cpu_rounds, warmup_s=min(args.warmup, 2.0),
                                  duration_s=min(args.duration, 5.0), log=_log,
                                  perf_dir=logdir if args.profile else None)
    finally:
        for system in started:
            system.stop()


def _revision(src: Path | None) -> str:
    """Which Narwhal code ran: the commit, and whether the work tree differed from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "python", "rust"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"from {src}" if src else "installed package"
    if src is not None:
        changed = _differs_from_head(src)
        extra = f" + {changed} files changed from it" if changed else ""
        return f"code copied to {src}: commit {head}{extra}"
    return f"commit {head}{' + uncommitted changes' if dirty else ''}"


def _differs_from_head(src: Path) -> int | str:
    """How many .py files under ``src`` (a copy of python/) differ from HEAD's python/."""
    try:
        tree = subprocess.run(
            ["git", "-C", str(REPO), "ls-tree", "-r", "HEAD", "python"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        blobs = {line.split("\t")[1]: line.split()[2] for line in tree.splitlines()}
        files = sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)
        hashed = subprocess.run(
            ["git", "hash-object", "--stdin-paths"],
            input="\n".join(str(p) for p in files), capture_output=True, text=True,
            timeout=30, check=True,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"
    return sum(
        blobs.get("python/" + str(p.relative_to(src))) != h
        for p, h in zip(files, hashed, strict=True)
    )


def _gates(phases: list[Phase]) -> list[gates.Gate]:
    """The regression gates on every load Narwhal ran (saturation excluded)."""
    failed: list[gates.Gate] = []
    for p in phases:
        if p.system != "narwhal" or not p.load.isdigit() or int(p.load) > GATED_MAX_STREAMS:
            continue
        d = next((x for x in phases if x.paired_with == "narwhal" and x.load == p.load), None)
        if d is None:
            continue
        for gate in gates.check(d, p):
            _log(str(gate))
            if not gate.ok:
                failed.append(gate)
    return failed


def _stages(
    engine_urls: list[str],
    engine_pids: list[int],
    sim: systems.SimSettings,
    args: argparse.Namespace,
    logdir: Path,
) -> tuple[str, list[tuple[str, int, list[float]]]]:
    """One extra phase at the largest load with Narwhal under stages.py's timing probes."""
    out = logdir / "stages.tsv"
    system = systems.start_narwhal(
        "narwhal-stages",
        engine_urls,
        1,
        logdir,
        args.narwhal_src,
        args.narwhal_set,
        env={"NARWHAL_STAGES": str(out)},
        launcher=(str(Path(stages.__file__).resolve()),),
    )
    top = max(int(s) for s in args.streams.split(","))
    try:
        measure.settle()
        phase = measure.run(
            system, engine_pids, sim, load=str(top), streams=top,
            warmup_s=args.warmup, duration_s=args.duration,
        )  # fmt: skip
        _log("stages run (probes on): " + report.one_line(phase))
    finally:
        system.stop()
    label = (
        f"{top} streams: client TTFT p50 {phase.ttft_p50_ms:.1f} ms, p99 {phase.ttft_p99_ms:.1f} ms"
    )
    return label, stages.read(str(out))


def _profile(
    system: systems.System,
    engine_urls: list[str],
    engine_pids: list[int],
    sim: systems.SimSettings,
    args: argparse.Namespace,
    logdir: Path,
) -> dict[str, pyspy.Profile]:
    """py-spy on the router during extra, unreported phases: the largest load and saturation."""
    py_spy = args.venv / "bin" / "py-spy"
    root = system.root_pid
    assert root is not None
    top_streams = max(int(s) for s in args.streams.split(","))
    plan = [(f"{top_streams} streams", top_streams, False)]
    if args.saturation:
        plan.append(("saturation", args.saturation, True))
    duration = max(3, int(args.duration))
    out: dict[str, pyspy.Profile] = {}
    for label, streams, saturate in plan:
        result: list[pyspy.Profile] = []
        path = logdir / f"pyspy-{label.replace(' ', '-')}.txt"
        spy = threading.Thread(
            target=lambda p=path, r=result: r.append(pyspy.record(py_spy, root, duration, p))
        )

        def start_spy(edge: str, spy: threading.Thread = spy) -> None:
            if edge == "start":
                spy.start()

        if saturate:
            systems.set_engine_timing(engine_urls, tpot_ms=0)
        try:
            measure.settle()
            measure.run(
                system,
                engine_pids,
                sim,
                load=label,
                streams=streams,
                warmup_s=args.warmup,
                duration_s=duration + 1,
                hook=start_spy,
            )
            spy.join(timeout=duration + 90)
        finally:
            if saturate:
                systems.set_engine_timing(engine_urls, tpot_ms=sim.tpot_ms)
        out[label] = result[0] if result else pyspy.Profile(error="py-spy did not finish")
        _log(f"profiled narwhal at {label}: {out[label].samples} samples {out[label].error}")
    return out


if __name__ == "__main__":
    sys.exit(main())
