"""CPU time and resident memory of a process tree, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _parents() -> dict[int, list[int]]:
    """ppid -> children over every process (/proc/<pid>/task/*/children needs a kernel option)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/stat") as f:
            ppid = int(f.read().rpartition(")")[2].split()[1])
            kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and every live descendant."""
    kids = _parents()
    seen: list[int] = []
    todo = [root] if os.path.exists(f"/proc/{root}") else []
    while todo and len(seen) < 10_000:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo.extend(kids.get(pid, ()))
    return seen


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    """utime + stime in seconds (fields 14 and 15 of /proc/<pid>/stat) of each live pid."""
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def rss_mb(pids: list[int]) -> float:
    """Sum of VmRSS of ``pids`` in MB (forked workers' shared pages count once per process)."""
    kb = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    kb += int(line.split()[1])
                    break
    return kb / 1024.0


@dataclass
class TreeMeter:
    """CPU seconds used by a process tree between :meth:`start` and :meth:`stop`, and its RSS."""

    root: int
    cpu_s: float = 0.0
    rss_mb: float = 0.0
    _before: dict[int, float] = field(default_factory=dict)

    def start(self) -> None:
        self._before = cpu_by_pid(tree(self.root))

    def stop(self) -> None:
        pids = tree(self.root)
        after = cpu_by_pid(pids)
        # Processes born in the window count in full; one that died in it is not seen.
        self.cpu_s = sum(t - self._before.get(pid, 0.0) for pid, t in after.items())
        self.rss_mb = rss_mb(pids)
