"""Profiles of a running router: py-spy (Python frames) and perf (CPU by library and symbol).

py-spy samples wall-clock stacks of the running thread without pausing it, so a frame that
makes a syscall also carries the time the process waits for a CPU after waking a peer on a
busy host. perf samples CPU cycles only, in the kernel too, but sees the interpreter as
``_PyEval_EvalFrameDefault``; the two together say where the per-token time goes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")
_PERF_ROW = re.compile(r"^\s*([\d.]+)%\s+(.*?)\s*$")


@dataclass
class Profile:
    samples: int = 0
    rate_hz: int = 0
    duration_s: float = 0.0
    self_samples: Counter[str] = field(default_factory=Counter)
    incl_samples: Counter[str] = field(default_factory=Counter)
    error: str = ""
    perf_dso: list[tuple[str, float]] = field(default_factory=list)
    perf_symbols: list[tuple[str, float]] = field(default_factory=list)
    perf_error: str = ""

    def busy_fraction(self) -> float:
        expected = self.rate_hz * self.duration_s
        return self.samples / expected if expected else float("nan")


def _name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (dir/file.py)``."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    short = "/".join(file.split("/")[-2:]) if file else ""
    return f"{m.group('func')} ({short})" if short else m.group("func")


def summarise(raw: str, rate_hz: int, duration_s: float) -> Profile:
    """py-spy's raw (collapsed) output -> self and inclusive samples per function."""
    prof = Profile(rate_hz=rate_hz, duration_s=duration_s)
    for line in raw.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        stack, count = m.group(1), int(m.group(2))
        frames = [_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        prof.samples += count
        prof.self_samples[frames[-1]] += count
        for name in set(frames):
            prof.incl_samples[name] += count
    return prof


def record(py_spy: Path, pid: int, duration_s: float, out: Path, rate_hz: int = 250) -> Profile:
    """py-spy on ``pid`` and its children for ``duration_s``, with perf alongside when present."""
    argv = [
        str(py_spy), "record", "--pid", str(pid), "--duration", str(int(duration_s)),
        "--rate", str(rate_hz), "--format", "raw", "-o", str(out),
        "--nonblocking", "--subprocesses",
    ]  # fmt: skip
    perf_data = out.with_suffix(".perf.data")
    perf = _start_perf(pid, duration_s, perf_data)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        prof = Profile(error=f"py-spy: {exc}")
    else:
        if done.returncode != 0 or not out.exists():
            prof = Profile(error=f"py-spy failed: {(done.stderr or done.stdout)[-400:]}")
        else:
            prof = summarise(out.read_text(errors="replace"), rate_hz, int(duration_s))
    _finish_perf(perf, perf_data, prof)
    return prof


def perf_start(pid: int, duration_s: float, data: Path) -> subprocess.Popen[bytes] | None:
    """perf sampling ``pid`` (every thread) for ``duration_s``; None without perf."""
    return _start_perf(pid, duration_s, data)


def perf_dso(perf: subprocess.Popen[bytes] | None, data: Path) -> tuple[list[tuple[str, float]],
                                                                        str]:
    """Wait for ``perf`` (from perf_start): its CPU cycles by library, and an error or ""."""
    prof = Profile()
    _finish_perf(perf, data, prof)
    return prof.perf_dso, prof.perf_error


def _start_perf(pid: int, duration_s: float, data: Path) -> subprocess.Popen[bytes] | None:
    if shutil.which("perf") is None:
        return None
    argv = ["perf", "record", "-F", "499", "-o", str(data), "-p", str(pid),
            "--", "sleep", str(int(duration_s))]  # fmt: skip
    try:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def _finish_perf(perf: subprocess.Popen[bytes] | None, data: Path, prof: Profile) -> None:
    if perf is None:
        prof.perf_error = "perf is not installed"
        return
    try:
        perf.wait(timeout=120)
    except subprocess.TimeoutExpired:
        perf.kill()
        perf.wait(timeout=5)
    if perf.returncode != 0 or not data.exists():
        prof.perf_error = f"perf record failed (status {perf.returncode})"
        return
    prof.perf_dso = _perf_report(data, "dso")
    prof.perf_symbols = _perf_report(data, "dso,sym")


def _perf_report(data: Path, sort: str) -> list[tuple[str, float]]:
    try:
        done = subprocess.run(
            ["perf", "report", "-i", str(data), "--no-children", "--sort", sort, "--stdio",
             "-g", "none"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows: list[tuple[str, float]] = []
    for line in done.stdout.splitlines():
        if line.startswith("#"):
            continue
        m = _PERF_ROW.match(line)
        if m:
            rows.append((" ".join(m.group(2).split()), float(m.group(1))))
    return rows


def top(counter: Counter[str], total: int, n: int = 20) -> list[tuple[str, float]]:
    return [(name, 100.0 * c / total) for name, c in counter.most_common(n)] if total else []
