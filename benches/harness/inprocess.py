"""Per-request CPU in one process: a whole completion through the real router objects
(``benches/bench_request.py`` times it with pytest-benchmark; the harness report measures it
too, so the figure lands in ``docs/performance.*``).

The router is the real composition root (``narwhal.app.Narwhal``) with its defaults
(predictive admission, lowest-TTFT placement, the default sizing), served by the real HTTP
protocol; only the sockets are replaced: the client's transport records what it is sent, and
each engine connection's transport answers on the next loop tick with what a vLLM engine
sends for a one-token answer (and ``/tokenize``, for sizing that asks the engine). So one
round is all the CPU the router spends on a request, from its bytes arriving to the end of
its answer, with no engine and no kernel in it.

Two figures per case: ``request_us`` (the whole request) and ``dispatch_us`` (from the
request's headers to the engine request written: the per-request work before the engine
starts).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import subprocess
import sys
import time
from typing import Any

import orjson
import uvloop

from narwhal._narwhal_fast import Board
from narwhal.app import Narwhal
from narwhal.config import parse_config
from narwhal.fleet.engine import Health
from narwhal.learning.latency import PrefillModel
from narwhal.serve import limits_of, settle_gc
from narwhal.server.http import HttpProtocol
from narwhal.server.listener import HttpServer
from narwhal.upstream.client import EngineClient
from narwhal.upstream.connection import EngineConnection

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENGINES = 2
ROUNDS = 30
BATCH = 100  # requests per round (one run of the loop)

_SSE = (
    b'data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"M",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12]}\n\n'
    b'data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"M",'
    b'"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":"length",'
    b'"stop_reason":null,"token_ids":[9707]}]}\n\n'
    b"data: [DONE]\n\n"
)
STREAM_ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n"
                 + b"%x\r\n%b\r\n0\r\n\r\n" % (len(_SSE), _SSE))
TOKENIZE_ANSWER = (b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 55\r\n'
                   b'\r\n{"count":12,"max_model_len":8192,"tokens":[],"ok":true}')


class EngineTransport(asyncio.Transport):
    """An engine on the other end of a connection: answers each request on the next tick."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: EngineConnection,
                 bench: Bench) -> None:
        super().__init__()
        self.loop, self.conn, self.bench = loop, conn, bench
        self.closing = False

    def write(self, data: Any) -> None:
        self.bench.dispatched(bytes(data))
        answer = TOKENIZE_ANSWER if data.startswith(b"POST /tokenize") else STREAM_ANSWER
        self.loop.call_soon(self.conn.data_received, answer)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.conn.connection_lost, None)

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class LoopbackClient(EngineClient):
    """The engine client with its sockets replaced by :class:`EngineTransport`."""

    def __init__(self, url: str, bench: Bench, headers: Any = ()) -> None:
        super().__init__(url, headers=headers)
        self.bench = bench

    async def _connect(self, loop: asyncio.AbstractEventLoop,
                       deadline: float) -> EngineConnection:
        conn = EngineConnection(loop, self)
        conn.connection_made(self.bench.engine_transport(loop, conn, self.bench))
        return conn


class ClientTransport(asyncio.Transport):
    """The client's end: collects the answer and says when it is complete."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.done: asyncio.Future[None] | None = None

    def write(self, data: Any) -> None:
        self.data += data
        if self.data.endswith(b"0\r\n\r\n") and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Bench:
    """One router on a private loop, and one keep-alive client connection to it."""

    def __init__(self, sizing: str | None, tracing: str | None = None,
                 engine_transport: type[EngineTransport] = EngineTransport) -> None:
        """``tracing``: an OTLP/HTTP endpoint to export every request's spans to
        (``sample_ratio`` 1.0), or None for tracing off. ``engine_transport``: what answers
        on each engine connection (``bench_relay_read.py`` streams long answers)."""
        self.engine_transport = engine_transport
        admission: dict[str, Any] = {"queue_limit": 1024}
        if sizing is not None:
            admission["sizing"] = sizing
        raw: dict[str, Any] = {
            "model": MODEL,
            "engines": [{"name": f"e{i}", "url": f"http://127.0.0.1:{9 + i}"}
                        for i in range(ENGINES)],
            "admission": admission,
        }
        if tracing is not None:
            raw["tracing"] = {"otlp_endpoint": tracing, "sample_ratio": 1.0}
        config = parse_config(raw)
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.router = self.loop.run_until_complete(self._build(config))
        # The collector as `narwhal serve` leaves it once started (undone by close()).
        self._gc_threshold = gc.get_threshold()
        settle_gc()
        self.arrived = 0.0
        self.dispatch_s: list[float] = []
        self.server = HttpServer(self.router.router, limits_of(config), self.loop)
        self.protocol = HttpProtocol(self.server)
        self.transport = ClientTransport()
        self.protocol.connection_made(self.transport)
        body = orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 1, "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 4},
            {"role": "user", "content": "Say hi."}]})
        self.request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: narwhal\r\n"
                        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                        % (len(body), body))

    async def _build(self, config: Any) -> Narwhal:
        narwhal = Narwhal(config, Board(engines=ENGINES))
        for engine in narwhal.engines:
            engine.client = LoopbackClient(engine.config.url, self)
            engine.health = Health.HEALTHY
            narwhal.board.set_engine_up(engine.index, True)
            narwhal.learning.learned[engine.index].prefill = PrefillModel(0.005, 20_000.0)
        narwhal.lifecycle.started = True
        return narwhal

    def dispatched(self, data: bytes) -> None:
        if data.startswith(b"POST /v1/"):
            self.dispatch_s.append(time.perf_counter() - self.arrived)

    def run(self, requests: int) -> None:
        """``requests`` requests one after another on the keep-alive connection."""
        self.loop.run_until_complete(self._requests(requests))

    async def _requests(self, requests: int) -> None:
        transport, loop = self.transport, self.loop
        for _ in range(requests):
            transport.data.clear()
            transport.done = done = loop.create_future()
            self.arrived = time.perf_counter()
            self.protocol.data_received(self.request)
            await done

    def close(self) -> None:
        self.protocol.connection_lost(None)
        self.loop.run_until_complete(self.router.stop())
        self.loop.close()
        asyncio.set_event_loop(None)
        gc.unfreeze()
        gc.set_threshold(*self._gc_threshold)


def measure(sizing: str | None, requests: int = 3000, rounds: int = 15) -> dict[str, float]:
    """Median microseconds per whole request and per dispatch, after a warm-up."""
    bench = Bench(sizing)
    try:
        bench.run(300)
        bench.dispatch_s.clear()
        per_round = max(1, requests // rounds)
        times = []
        for _ in range(rounds):
            gc.collect()
            started = time.perf_counter()
            bench.run(per_round)
            times.append((time.perf_counter() - started) / per_round)
        times.sort()
        dispatch = sorted(bench.dispatch_s)
        return {"request_us_p50": round(times[len(times) // 2] * 1e6, 1),
                "dispatch_us_p50": round(statistics.median(dispatch) * 1e6, 1),
                "dispatch_us_p90": round(dispatch[int(0.9 * (len(dispatch) - 1))] * 1e6, 1),
                "requests": per_round * rounds}
    finally:
        bench.close()


def measure_interleaved(modes: tuple[str | None, ...] = (None, "estimate"),
                        repeats: int = 5) -> dict[str, dict[str, Any]]:
    """:func:`measure` ``repeats`` times per sizing mode, the modes taking turns: on a shared
    host one measurement reads anywhere in a ±20 % band (the host's moment, not the code),
    so each figure is the median over the repeats, with the range of the dispatch p50."""
    runs: dict[str, list[dict[str, float]]] = {mode or "default": [] for mode in modes}
    for _ in range(repeats):
        for mode in modes:
            runs[mode or "default"].append(measure(mode))
    out: dict[str, dict[str, Any]] = {}
    for name, rows in runs.items():
        dispatch = [r["dispatch_us_p50"] for r in rows]
        out[name] = {
            "request_us_p50": round(statistics.median(r["request_us_p50"] for r in rows), 1),
            "dispatch_us_p50": round(statistics.median(dispatch), 1),
            "dispatch_us_p90": round(statistics.median(r["dispatch_us_p90"] for r in rows), 1),
            "dispatch_us_p50_range": [min(dispatch), max(dispatch)],
            "repeats": len(rows),
            "requests": int(sum(r["requests"] for r in rows)),
        }
    return out


def tracing_cost(requests: int = 6000, rounds: int = 30) -> dict[str, float]:
    """Router CPU per request with tracing off and on (``sample_ratio`` 1.0, exporting to a
    local OTLP sink, ``otlp_sink.py``) in one process: one router configured with tracing,
    its flow's observer detached for the rounds that measure tracing off (what a config
    without tracing gives: no observer, one ``is not None`` check per hook), the two kinds of
    round interleaved. The event loop's CPU per request is the median of its rounds; tracing
    on adds the export thread's CPU over the whole run per request it exported."""
    sink = subprocess.Popen([sys.executable, "-m", "benches.harness.otlp_sink"],
                            stdout=subprocess.PIPE, text=True)
    bench = None
    try:
        assert sink.stdout is not None
        url = sink.stdout.readline().split()[-1]
        bench = Bench(None, tracing=url)
        flow, observer = bench.router.flow, bench.router.observer
        assert observer is not None and observer.tracer is not None
        exporter = observer.tracer.exporter
        bench.run(300)
        per_round = max(1, requests // rounds)
        loop_us: dict[str, list[float]] = {"off": [], "on": []}
        exported, cpu_before = exporter.exported, exporter.cpu_s()
        for index in range(rounds):
            for name in (("off", "on") if index % 2 else ("on", "off")):
                flow.observer = observer if name == "on" else None
                gc.collect()
                started = time.thread_time()
                bench.run(per_round)
                loop_us[name].append((time.thread_time() - started) / per_round * 1e6)
        flow.observer = observer
        traced = rounds * per_round
        deadline = time.monotonic() + 5.0
        while exporter.exported - exported < traced and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu_after = exporter.cpu_s()
        sent = exporter.exported - exported
        export_us = ((cpu_after - cpu_before) / sent * 1e6
                     if cpu_before is not None and cpu_after is not None and sent else 0.0)
        off = statistics.median(loop_us["off"])
        on = statistics.median(loop_us["on"]) + export_us
        paired = statistics.median(
            a / b for a, b in zip(loop_us["on"], loop_us["off"], strict=True))
        return {"off_us": round(off, 1), "on_us": round(on, 1), "export_us": round(export_us, 2),
                "ratio": round(on / off, 3),
                "paired_ratio": round(paired + export_us / off, 3),
                "requests": traced, "exported": sent}
    finally:
        if bench is not None:
            bench.close()
        sink.kill()
        sink.wait()
