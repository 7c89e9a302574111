"""The processes under test: simulated engines, Narwhal (one or two workers), and a runner for
any router started from a command line. Every process binds 127.0.0.1 and logs to a file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .loadgen import Target

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process in its own session, output to ``log``; stopped with SIGTERM then SIGKILL."""

    def __init__(
        self, name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log = log
        self.url = ""  # set once the process says where it listens
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_line(self, marker: str, timeout_s: float) -> str:
        """The first output line holding ``marker``; RuntimeError if the process ends first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if marker in line:
                    return line.strip()
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        tail = self.output()[-3000:]
        self.stop()
        raise RuntimeError(f"{self.name} did not print {marker!r} in {timeout_s:.0f} s:\n{tail}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        # Workers or helpers left in the process group go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def url_in(line: str) -> str:
    return line[line.index("http://") :].split()[0].rstrip(",;)")


@dataclass(frozen=True)
class SimSettings:
    """The simulated engine's timing: anchors-like by default (TTFT ~20 ms, ITL 5 ms, 64 tokens).

    The simulator prefills one request at a time, so TTFT is not its prefill time: prefill is
    made negligible and each request carries a ``[[fault:slow_headers:N]]`` prompt marker, a
    per-request timer of N ms before the engine starts it (concurrent across requests, as a
    batched prefill is). The marker rides in the prompt, so every router forwards it.
    """

    ttft_ms: int = 20
    tpot_ms: float = 5.0
    tokens: int = 64

    def flags(self) -> list[str]:
        return [
            "--tpot-ms",
            str(self.tpot_ms),
            "--tpot-growth-ms",
            "0",
            "--prefill-overhead-ms",
            "0",
            "--prefill-tokens-per-s",
            "1000000",
            "--output-len",
            str(self.tokens),
        ]

    def prompt(self) -> str:
        marker = f" [[fault:slow_headers:{self.ttft_ms}]]" if self.ttft_ms > 0 else ""
        return "Tell me about narwhals." + marker


def narwhal_env(src: Path | None) -> dict[str, str] | None:
    """Run ``python -m narwhal`` from ``src`` (a snapshot of python/) instead of the install."""
    if src is None:
        return None
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}


def start_engines(
    count: int, settings: SimSettings, logdir: Path, src: Path | None = None
) -> list[Proc]:
    procs: list[Proc] = []
    try:
        for i in range(count):
            procs.append(
                Proc(
                    f"engine{i}",
                    [
                        sys.executable,
                        "-m",
                        "narwhal.sim",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        "0",
                        "--model",
                        MODEL,
                        "--seed",
                        str(i),
                        *settings.flags(),
                    ],
                    logdir / f"engine{i}.log",
                    env=narwhal_env(src),
                )
            )
        for p in procs:
            p.url = url_in(p.wait_line("listening on", 30))
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def set_engine_timing(engine_urls: Sequence[str], **changes: object) -> None:
    """Change simulator timing at run time (``POST /sim/config``)."""
    body = json.dumps(changes).encode()
    for url in engine_urls:
        req = urllib.request.Request(
            url + "/sim/config",
            data=body,
            method="POST",
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            resp.read()


@dataclass
class System:
    """A running router (or the engines themselves) as the harness sees it."""

    name: str
    targets: list[Target]
    procs: list[Proc] = field(default_factory=list)
    version: str = ""

    @property
    def root_pid(self) -> int | None:
        return self.procs[0].pid if self.procs else None

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


def direct(engine_urls: Sequence[str]) -> System:
    return System("direct", [Target(u) for u in engine_urls], version="no router")


def narwhal_config(engine_urls: Sequence[str]) -> dict[str, Any]:
    """Defaults everywhere (admission, limits, health), except what a test bed must say."""
    return {
        "model": MODEL,
        "listen": {"host": "127.0.0.1", "port": 0},
        "engines": [
            {"name": f"e{i}", "url": u, "dialect": "vllm"} for i, u in enumerate(engine_urls)
        ],
    }


def start_narwhal(
    name: str,
    engine_urls: Sequence[str],
    workers: int,
    logdir: Path,
    src: Path | None = None,
    overrides: Sequence[str] = (),
    env: dict[str, str] | None = None,
    launcher: Sequence[str] = ("-m", "narwhal"),
) -> System:
    """Narwhal on defaults; ``overrides`` are ``section.key=value`` (YAML value) changes.

    ``launcher`` replaces ``-m narwhal`` (``stages.py`` runs it with timing probes).
    """
    config = narwhal_config(engine_urls)
    for item in overrides:
        dotted, _, raw = item.partition("=")
        *parents, leaf = dotted.split(".")
        nodes: list[dict[str, Any]] = [config]
        for part in parents:  # a list (engines) applies the change to every entry
            found = [n.setdefault(part, {}) for n in nodes]
            nodes = [x for f in found for x in (f if isinstance(f, list) else [f])]
        for node in nodes:
            node[leaf] = yaml.safe_load(raw)
    path = logdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = Proc(
        name,
        [sys.executable, *launcher, "serve", "--config", str(path), "--workers", str(workers)],
        logdir / f"{name}.log",
        env={**(narwhal_env(src) or {}), **(env or {})},
    )
    url = url_in(proc.wait_line("narwhal serving", 30))
    from narwhal import __version__

    return System(name, [Target(url)], [proc], version=f"narwhal {__version__}")


def start_otlp_sink(logdir: Path) -> Proc:
    """The OTLP/HTTP sink a traced Narwhal exports to (``otlp_sink.py``)."""
    proc = Proc("otlp-sink", [sys.executable, "-m", "benches.harness.otlp_sink"],
                logdir / "otlp-sink.log")
    proc.url = url_in(proc.wait_line("listening on", 30))
    return proc


def sink_counts(sink: Proc) -> dict[str, int]:
    with urllib.request.urlopen(sink.url + "/stats", timeout=5) as resp:
        counts: dict[str, int] = json.loads(resp.read())
    return counts
