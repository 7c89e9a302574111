"""Sampling profile of a running router with py-spy, summarised as self and inclusive time."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


@dataclass
class Profile:
    samples: int = 0
    rate_hz: int = 0
    duration_s: float = 0.0
    self_samples: Counter[str] = field(default_factory=Counter)
    incl_samples: Counter[str] = field(default_factory=Counter)
    error: str = ""

    def busy_fraction(self) -> float:
        expected = self.rate_hz * self.duration_s
        return self.samples / expected if expected else float("nan")


def _name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``; native frames stay as they are."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    short = "/".join(file.split("/")[-2:]) if file else ""
    return f"{m.group('func')} ({short})" if short else m.group("func")


def summarise(raw: str, rate_hz: int, duration_s: float) -> Profile:
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


def record(
    py_spy: Path, pid: int, duration_s: float, out: Path, rate_hz: int = 250, native: bool = True
) -> Profile:
    """Attach to ``pid`` (and its subprocesses) for ``duration_s``; never raises for py-spy."""
    argv = [
        str(py_spy),
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(duration_s)),
        "--rate",
        str(rate_hz),
        "--format",
        "raw",
        "-o",
        str(out),
        "--nonblocking",
        "--subprocesses",
    ]
    if native:
        argv.append("--native")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Profile(error=f"py-spy: {exc}")
    if done.returncode != 0 or not out.exists():
        if native:  # some builds cannot unwind native frames: fall back to Python frames
            return record(py_spy, pid, duration_s, out, rate_hz, native=False)
        return Profile(error=f"py-spy failed: {(done.stderr or done.stdout)[-400:]}")
    return summarise(out.read_text(errors="replace"), rate_hz, int(duration_s))


def top(counter: Counter[str], total: int, n: int = 20) -> list[tuple[str, float]]:
    return [(name, 100.0 * c / total) for name, c in counter.most_common(n)] if total else []
