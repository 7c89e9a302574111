"""The access log's lines (JSON and text) and its writer: whole lines per write, at most
PIPE_BUF bytes to a pipe, everything written by the time it closes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from narwhal.observe import access_log
from narwhal.observe.access_log import FIELDS, PIPE_BUF, AccessLog, LineClock, text_line

RECORD: dict[str, object] = {
    "time": "2026-01-02T03:04:05.006Z", "request_id": "abc", "client": "127.0.0.1:5000",
    "route": "/v1/chat/completions", "model": "m", "stream": True, "status": 200,
    "outcome": "completed", "reason": None, "engines": ["e0", "e1"], "attempts": 2,
    "prompt_tokens": 12, "output_tokens": 64, "queue_wait_s": 0.0, "ttft_s": 0.0125,
    "tpot_s": 0.005, "total_s": 0.33,
}


def test_the_field_list_names_every_record_field() -> None:
    assert list(RECORD) == list(FIELDS[:-1]) and FIELDS[-1] == "trace_id"


def test_a_text_line_is_key_value_pairs() -> None:
    line = text_line(RECORD).decode()
    assert line == (
        "time=2026-01-02T03:04:05.006Z request_id=abc client=127.0.0.1:5000 "
        "route=/v1/chat/completions model=m stream=true status=200 outcome=completed "
        "reason=- engines=e0,e1 attempts=2 prompt_tokens=12 output_tokens=64 queue_wait_s=0 "
        "ttft_s=0.0125 tpot_s=0.005 total_s=0.33\n")


def test_text_values_that_would_break_the_line_are_quoted() -> None:
    line = text_line({"request_id": 'a b"c=d\\', "model": "x\ny", "engines": []}).decode()
    assert line == 'request_id="a b\\"c=d\\\\" model="x\\ny" engines=-\n'
    assert line.count("\n") == 1


def test_the_clock_formats_utc_milliseconds() -> None:
    clock = LineClock()
    assert clock.format(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123Z"
    assert clock.format(1_700_000_000_999_000_000) == "2023-11-14T22:13:20.999Z"
    assert clock.format(1_700_000_001_000_000_000) == "2023-11-14T22:13:21.000Z"


def test_a_file_gets_every_line_by_close(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def main() -> None:
        log = AccessLog(asyncio.get_running_loop(), "json", str(path))
        for i in range(1000):
            log.write({**RECORD, "request_id": f"r{i}"})
        log.close()

    asyncio.run(main())
    lines = path.read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [f"r{i}" for i in range(1000)]


def test_lines_go_out_after_a_short_wait_without_close(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def main() -> None:
        log = AccessLog(asyncio.get_running_loop(), "text", str(path))
        log.write(RECORD)
        assert path.read_text() == ""  # buffered
        await asyncio.sleep(0.5)
        assert path.read_text() == text_line(RECORD).decode()
        log.close()

    asyncio.run(main())


def test_a_pipe_gets_whole_lines_in_writes_of_at_most_pipe_buf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    writes: list[bytes] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes | memoryview) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    def drain() -> None:
        while True:
            try:
                os.read(read_fd, 1 << 20)
            except BlockingIOError:
                return

    async def main() -> None:
        saved = os.dup(2)
        os.dup2(write_fd, 2)  # standard error is a pipe, as under a supervisor
        try:
            log = AccessLog(asyncio.get_running_loop(), "json", None)
            assert log.chunk_limit == PIPE_BUF
            monkeypatch.setattr(access_log.os, "write", recording_write)
            for i in range(200):
                log.write({**RECORD, "request_id": f"r{i}" * 20})
                drain()
            log.close()
            drain()
        finally:
            monkeypatch.undo()
            os.dup2(saved, 2)
            os.close(saved)

    asyncio.run(main())
    os.close(read_fd)
    os.close(write_fd)
    assert len(writes) > 10
    assert all(len(w) <= PIPE_BUF and w.endswith(b"\n") for w in writes)
    lines = b"".join(writes).decode().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [f"r{i}" * 20 for i in range(200)]
