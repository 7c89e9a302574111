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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process that prints one ready line; its later output is kept for diagnosis."""

    def __init__(
        self,
        argv: Sequence[str],
        ready: str,
        timeout: float = 20.0,
        env: dict[str, str] | None = None,
    ):
        self.argv = list(argv)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        self.ready_line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if ready in line:
                self.ready_line = line.strip()
                break
        if not self.ready_line:
            self.stop()
            raise RuntimeError(f"{self.argv} did not start:\n{''.join(self.lines)}")
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def url(self) -> str:
        line = self.ready_line
        return line[line.index("http://") :].split()[0].rstrip(",;)")

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode


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
    return config


def start_router(
    tmp_path: Path, config: dict[str, Any], *extra: str, env: dict[str, str] | None = None
) -> Proc:
    path = tmp_path / f"narwhal-{free_port()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return Proc(
        [sys.executable, "-m", "narwhal", "serve", "--config", str(path), *extra],
        ready="narwhal serving",
        env=env,
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
