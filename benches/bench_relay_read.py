"""Router CPU per relayed engine read, in one process: streamed answers of many one-token
reads through the real engine connection, relay, Rust session and client responder (the
composition root of ``benches/harness/inprocess.py``, sockets replaced). The engine's reads
are handed to the connection one ``data_received`` call each: the first (head and role
event), then, a loop turn later (the relay has taken the response), the others back to back
(so the figure is the router's work per read, not the loop's), stopping while the router
pauses reading.

``read_us`` is (CPU of a 257-read answer - CPU of a 2-read answer) / 255: what one more
engine read costs. With ``Relay.fast_reads`` the streamed reads go
socket -> ``StreamSession.pump`` -> client transport; without, through the Python path.
Rounds of the two modes are interleaved. Run: ``pytest benches/bench_relay_read.py
--benchmark-only -s`` or ``python -m benches.bench_relay_read``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches.harness.inprocess import Bench, EngineTransport

from narwhal.flow import relay

LONG = 256  # content reads of the long answer

_HEAD = (b'{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,'
         b'"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,')


def _event(choice: bytes, extra: bytes = b"") -> bytes:
    sse = b"data: " + _HEAD + choice + b"}]" + extra + b"}\n\n"
    return b"%x\r\n%b\r\n" % (len(sse), sse)


def answer(tokens: int) -> list[bytes]:
    """A vLLM-like streamed chat answer, one network read per event (and the end)."""
    role = _event(b'"delta":{"role":"assistant","content":""},"logprobs":null,'
                  b'"finish_reason":null', b',"prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12]')
    words = [_event(b'"delta":{"content":" w%d"},"logprobs":null,"finish_reason":null,'
                    b'"token_ids":[%d]' % (i % 97, 1000 + i)) for i in range(tokens)]
    finish = _event(b'"delta":{"content":""},"logprobs":null,"finish_reason":"length",'
                    b'"stop_reason":null,"token_ids":[2]')
    done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    return [head + role, *words, finish, done]


class StreamingEngine(EngineTransport):
    """Answers a completion with ``bench.reads``, one ``data_received`` per read; stops
    sending while its reading is paused (the router's back-pressure)."""

    paused = False
    next_read: int | None = None  # the read held back by a pause

    def write(self, data: Any) -> None:
        if not data.startswith(b"POST /v1/"):
            super().write(data)
            return
        self.bench.dispatched(bytes(data))
        self.conn.data_received(self.bench.reads[0])  # type: ignore[attr-defined]
        self.loop.call_soon(self._feed, 1)  # once the relay has taken the response

    def pause_reading(self) -> None:
        self.paused = True
        self.bench.pauses = getattr(self.bench, "pauses", 0) + 1

    def resume_reading(self) -> None:
        self.paused = False
        if self.next_read is not None:
            i, self.next_read = self.next_read, None
            self.loop.call_soon(self._feed, i)

    def _feed(self, i: int) -> None:
        reads: list[bytes] = self.bench.reads  # type: ignore[attr-defined]
        receive = self.conn.data_received
        while i < len(reads) and not self.closing:
            if self.paused:
                self.next_read = i
                return
            receive(reads[i])
            i += 1


def make_bench() -> Bench:
    bench = Bench("estimate", engine_transport=StreamingEngine)
    bench.reads = answer(1)  # type: ignore[attr-defined]
    bench.run(200)
    return bench


def cpu_per_request(bench: Bench, tokens: int, requests: int) -> float:
    bench.reads = answer(tokens)  # type: ignore[attr-defined]
    gc.collect()
    started = time.thread_time()
    bench.run(requests)
    spent = time.thread_time() - started
    assert bench.transport.data.endswith(b"0\r\n\r\n")
    return spent / requests


def measure(rounds: int = 15, requests: int = 40) -> dict[str, float]:
    """Median CPU per added engine read, fast path and Python path interleaved."""
    bench = make_bench()
    per_read: dict[bool, list[float]] = {True: [], False: []}
    try:
        for index in range(rounds):
            for fast in ((True, False) if index % 2 else (False, True)):
                relay.Relay.fast_reads = fast
                short = cpu_per_request(bench, 1, requests)
                long = cpu_per_request(bench, LONG, requests)
                per_read[fast].append((long - short) / (LONG - 1))
    finally:
        relay.Relay.fast_reads = True
        bench.close()
    fast_us = statistics.median(per_read[True]) * 1e6
    slow_us = statistics.median(per_read[False]) * 1e6
    return {"fast_read_us": round(fast_us, 2), "python_read_us": round(slow_us, 2),
            "ratio": round(slow_us / fast_us, 2)}


def test_cpu_per_read(benchmark: Any) -> None:
    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    print(f"\nper engine read: {result}")
    assert result["fast_read_us"] > 0


if __name__ == "__main__":
    pytest.main([__file__, "--benchmark-only", "-q", "-s"])
