"""The access log: one line per finished completion request, JSON or logfmt-style text, to
stderr or a file, buffered and written whole lines at a time.

Several worker processes may share the destination: each worker opens it itself (a file with
``O_APPEND``), and every write holds whole lines only (at most ``PIPE_BUF`` bytes to a pipe, so
two workers' lines never interleave), so no line is split, lost or doubled between them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Mapping

import orjson

log = logging.getLogger("narwhal.access")

FIELDS = (
    "time", "request_id", "client", "route", "model", "stream", "status", "outcome", "reason",
    "engines", "attempts", "prompt_tokens", "output_tokens", "queue_wait_s", "ttft_s",
    "tpot_s", "total_s", "trace_id",
)
"""Every line's fields, in order (``trace_id`` only while tracing is on)."""

FLUSH_AFTER_S = 0.2
FILE_BUFFER_BYTES = 65536
PIPE_BUF = 4096  # POSIX guarantees atomic pipe writes up to 512; Linux up to 4096


class LineClock:
    """``time`` of a line: ISO 8601 UTC with milliseconds, the seconds part formatted once
    per second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def format(self, wall_ns: int) -> str:
        second, rest = divmod(wall_ns, 1_000_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{rest // 1_000_000:03d}Z"


def json_line(record: Mapping[str, object]) -> bytes:
    return orjson.dumps(record) + b"\n"


def _text_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value) or "-"
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return orjson.dumps(text).decode()
    return text


def text_line(record: Mapping[str, object]) -> bytes:
    """``key=value`` pairs (logfmt): absent values as ``-``, lists comma-joined, values with
    spaces, quotes, ``=`` or control characters quoted as JSON strings."""
    return (" ".join(f"{k}={_text_value(v)}" for k, v in record.items()) + "\n").encode()


class AccessLog:
    """Formats and writes the access log of one worker process."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fmt: str, path: str | None) -> None:
        self.loop = loop
        self.format_line = json_line if fmt == "json" else text_line
        self.clock = LineClock()
        self.path = path
        if path is None:
            self.fd = 2
            self.owned = False
        else:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            self.owned = True
        try:
            regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        except OSError:
            regular = False
        self.chunk_limit = FILE_BUFFER_BYTES if regular else PIPE_BUF
        self._lines: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._failed = False

    def write(self, record: Mapping[str, object]) -> None:
        line = self.format_line(record)
        self._lines.append(line)
        self._size += len(line)
        if self._size >= self.chunk_limit:
            self.flush()
        elif self._timer is None:
            self._timer = self.loop.call_later(FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        """Write every buffered line, in chunks of whole lines of at most ``chunk_limit``."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        lines, self._lines, self._size = self._lines, [], 0
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) > self.chunk_limit:
                self._write(b"".join(chunk))
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        if chunk:
            self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            if not self._failed:  # said once; the lines that cannot be written are dropped
                self._failed = True
                log.error("access log %s cannot be written: %s", self.path or "stderr", exc)

    def close(self) -> None:
        self.flush()
        if self.owned:
            os.close(self.fd)
            self.owned = False
