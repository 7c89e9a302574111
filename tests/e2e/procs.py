"""Real processes for end-to-end tests: simulated engines and the router, on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHUTDOWN_GRACE_S = 5.0
"""``serving.shutdown_grace_s`` of ``router_config`` unless the test sets it."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ROUTERS: list[Proc] = []
"""Every router started here, in order (``conftest.py`` checks each left nothing behind)."""
LEFTOVER_WAIT_S = 2.0
"""After the router's main process has exited, how long its other processes may take to go."""


class Proc:
    """A child process that prints one ready line; its later output is kept for diagnosis.

    A router (``python -m narwhal serve``) runs in its own session and process group, so the
    helpers find and kill every process it started (workers, demo engines) even when its
    main process is gone; ``stop`` records in ``left_behind`` what had to be killed.
    ``wait_ready=False`` returns as soon as the process is started.
    """

    def __init__(
        self,
        argv: Sequence[str],
        ready: str,
        timeout: float = 20.0,
        env: dict[str, str] | None = None,
        *,
        wait_ready: bool = True,
    ):
        self.argv = list(argv)
        self.is_router = any(
            self.argv[i : i + 2] == ["narwhal", "serve"] for i in range(len(self.argv))
        )
        self.left_behind: list[str] = []
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=self.is_router,
        )
        if self.is_router:
            ROUTERS.append(self)
        self.lines: list[str] = []
        self.ready_line = ""
        self.ready_seen = threading.Event()
        self._ready = ready
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        if not wait_ready:
            return
        if not self.ready_seen.wait(timeout) or not self.ready_line:
            self.stop()
            raise RuntimeError(f"{self.argv} did not start:\n{''.join(self.lines)}")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if not self.ready_line and self._ready in line:
                self.ready_line = line.strip()
                self.ready_seen.set()
        self.ready_seen.set()  # the output ended: whoever waits for the ready line stops

    @property
    def url(self) -> str:
        line = self.ready_line
        return line[line.index("http://") :].split()[0].rstrip(",;)")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def workers(self) -> list[int]:
        """The main process's children now (a ``--workers N`` router's workers)."""
        pid = self.proc.pid
        try:
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def group(self) -> list[int]:
        """Live processes of a router's process group (its main process included)."""
        return group_members(self.proc.pid) if self.is_router else []

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait; kill what is still running after ``timeout`` (for a router, its
        whole process group, recording in ``left_behind`` what had to be killed)."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                if self.is_router:
                    self.left_behind.append(
                        f"main process {self.proc.pid} still running {timeout:.0f} s after SIGTERM"
                    )
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.reap_group()
        return self.proc.returncode

    def reap_group(self) -> list[int]:
        """Wait (bounded) for a router's process group to empty; SIGKILL what remains and
        record it in ``left_behind``. Returns the PIDs that had to be killed."""
        if not self.is_router:
            return []
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        left = self.group()
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = self.group()
        if left:
            self.left_behind.append(
                f"processes {left} of router {self.proc.pid} still running "
                f"(main process {'running' if self.proc.poll() is None else 'exited'})"
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.wait(timeout=5)
        return left


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state ppid pgrp ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def routers_left_behind(routers: Sequence[Proc]) -> list[str]:
    """What ``routers`` left running (killed here, group and all), as messages."""
    problems: list[str] = []
    for router in routers:
        if router.proc.poll() is None:
            router.left_behind.append(f"main process {router.proc.pid} never stopped")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(router.proc.pid, signal.SIGKILL)
            router.proc.wait(timeout=5)
        router.reap_group()
        problems += [f"{' '.join(router.argv[2:])}: {p}" for p in router.left_behind]
        router.left_behind.clear()
    return problems


def start_sim(*flags: str) -> Proc:
    return Proc(
        [
            sys.executable,
            "-m",
            "narwhal.sim",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--exit-with-parent",
            *flags,
        ],
        ready="listening on",
    )


def router_config(engine_urls: Sequence[str], **sections: Any) -> dict[str, Any]:
    engines = sections.pop("engines", None) or [
        {"name": f"e{i}", "url": url, "dialect": "vllm"} for i, url in enumerate(engine_urls)
    ]
    config: dict[str, Any] = {
        "model": MODEL,
        "listen": {"host": "127.0.0.1", "port": 0},
        "engines": engines,
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
    }
    for key, value in sections.items():
        config[key] = value
    # A bounded drain, so stopping a router with a stream still open never nears the
    # helpers' kill timeout (a router still running then fails the test).
    config["serving"] = {"shutdown_grace_s": SHUTDOWN_GRACE_S, **config.get("serving", {})}
    return config


def start_router(
    tmp_path: Path,
    config: dict[str, Any],
    *extra: str,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
) -> Proc:
    path = tmp_path / f"narwhal-{free_port()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return Proc(
        [sys.executable, "-m", "narwhal", "serve", "--config", str(path), *extra],
        ready="narwhal serving",
        env=env,
        wait_ready=wait_ready,
    )


def get_json(url: str, timeout: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read())


def metrics(base: str) -> dict[str, float]:
    """Scrape /metrics into {series: value} (series with labels as written)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def terminal_sum(m: dict[str, float]) -> float:
    classes = (
        "rejected",
        "refused",
        "invalid_requests",
        "expired",
        "failed",
        "cancelled",
        "completed",
    )
    return sum(v for k, v in m.items() for c in classes if k.startswith(f"narwhal_{c}_total"))


def invariant_holds(m: dict[str, float]) -> bool:
    return m.get("narwhal_offered_total", 0.0) == terminal_sum(m) + m.get(
        "narwhal_retained_requests", 0.0
    )


@contextlib.contextmanager
def running(*procs: Proc) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.stop()


def http(
    base: str,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 exchange on its own connection: (status, lower-cased headers, body)."""
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    host, port = base[len("http://") :].split(":")
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
    if body is not None:
        head += f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + data)
        raw = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    head_bytes, _, rest = raw.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if hdrs.get("transfer-encoding") == "chunked":
        out = b""
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2 :]
        rest = out
    return status, hdrs, rest
