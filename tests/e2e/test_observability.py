"""Traces, the access log and log formats end to end (issue 18): real routers and simulators,
a real OTLP/HTTP receiver here (decoding with ``opentelemetry-proto``), raw HTTP.

* A streamed, a refused (at intake and after parsing) and a retried request reach the
  receiver as a server span with sizing, admission-wait, placement and engine-attempt
  children, with the client's trace as parent; each engine received, in ``traceparent``, the
  span of the attempt it served. Both legs of a disaggregated request likewise.
* Access-log lines parse and carry every field; one per counted outcome, with two workers too.
* ``traceparent``/``tracestate`` reach every engine attempt unchanged while tracing is off.
* With the collector down the router serves as before.
* ``logging.format``/``--log-format json`` make the router's own lines JSON; a tracing
  configuration without the SDK fails at start naming ``narwhal[otel]``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto")

from fleet_support import MARK, Counters, FaultProxy, chat, http, wait_for
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from procs import MODEL, Proc, free_port, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(180)

FAST = ("--tpot-ms", "2", "--prefill-tokens-per-s", "200000")
HEALTH = {"interval_s": 0.5, "timeout_s": 1.0, "failures_to_evict": 1000}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
FIELDS = {"time", "request_id", "client", "route", "model", "stream", "status", "outcome",
          "reason", "engines", "attempts", "prompt_tokens", "output_tokens", "queue_wait_s",
          "ttft_s", "tpot_s", "total_s"}


# -- an OTLP/HTTP receiver ---------------------------------------------------------------------
def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return [_value(x) for x in v.array_value.values] if kind == "array_value" else getattr(
        v, kind)


class Collector(ThreadingHTTPServer):
    """Takes ``POST /v1/traces`` (OTLP protobuf) and keeps every span, decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receiver)
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for rs in request.resource_spans:
                self.resources.append({kv.key: _value(kv.value) for kv in rs.resource.attributes})
                for ss in rs.scope_spans:
                    self.spans += [_span(s) for s in ss.spans]

    def trace(self, trace_id: str, count: int) -> list[dict[str, Any]]:
        """The spans of ``trace_id`` once ``count`` have arrived."""

        def arrived() -> list[dict[str, Any]] | None:
            with self.lock:
                found = [s for s in self.spans if s["trace_id"] == trace_id]
            return found if len(found) >= count else None

        found: list[dict[str, Any]] = wait_for(arrived, 15)
        return found


def _span(s: Span) -> dict[str, Any]:
    return {"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
            "parent": s.parent_span_id.hex(), "name": s.name, "kind": s.kind,
            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
            "attrs": {kv.key: _value(kv.value) for kv in s.attributes},
            "events": [(e.name, e.time_unix_nano) for e in s.events],
            "status": s.status.code, "message": s.status.message}


class _Receiver(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        status = 200 if self.path == "/v1/traces" else 404
        if status == 200:
            self.server.take(body)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    server = Collector()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# -- helpers -----------------------------------------------------------------------------------
def traceparent(n: int) -> tuple[str, str]:
    """A client's traceparent (its own trace id per test request) and that trace id."""
    trace = f"{n:08x}" + CLIENT_TRACE[8:]
    return f"00-{trace}-00f067aa0ba902b7-01", trace


def access_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def access_line(path: Path, request_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        lines = [x for x in access_lines(path) if x["request_id"] == request_id]
        assert len(lines) <= 1, lines
        return lines[0] if lines else None

    line: dict[str, Any] = wait_for(found, 10)
    assert set(line) >= FIELDS, line
    return line


def received(sim: Proc, request_id: str) -> list[dict[str, str]]:
    """Headers of the test requests ``sim`` received with ``request_id``."""
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return [r["headers"] for r in json.loads(raw)["recent"]
            if MARK in json.dumps(r["body"]) and r["headers"].get("x-request-id") == request_id]


def by_name(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in sorted(spans, key=lambda s: s["start"]):
        out.setdefault(s["name"], []).append(s)
    return out


def server_span(spans: list[dict[str, Any]]) -> dict[str, Any]:
    (server,) = [s for s in spans if s["kind"] == Span.SPAN_KIND_SERVER]
    return server


def attempts_of(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s["kind"] == Span.SPAN_KIND_CLIENT),
                  key=lambda s: s["attrs"]["narwhal.attempt"])


def sse_done(raw: bytes) -> bool:
    return raw.rstrip().endswith(b"data: [DONE]") and b'"error"' not in raw


# -- a traced fleet: e0 behind a fault proxy, e1 direct ------------------------------------------
class Fleet:
    def __init__(self, tmp: Path, collector_url: str, **extra: Any) -> None:
        self.sims = [start_sim(*FAST), start_sim(*FAST)]
        self.proxy = FaultProxy(int(self.sims[0].url.rsplit(":", 1)[1]))
        self.log = tmp / "access.log"
        config = router_config(
            [self.proxy.url, self.sims[1].url], health=HEALTH, admission={"mode": "open"},
            scheduling={"policy": "least_loaded"},
            serving={"max_request_bytes": 65536},
            tracing={"otlp_endpoint": collector_url, "service_name": "narwhal-e2e",
                     "sample_ratio": 1.0},
            logging={"access_log": True, "format": "json", "access_log_file": str(self.log)},
            **extra)
        self.router = start_router(tmp, config)
        self.base = self.router.url
        wait_for(lambda: http(self.base, "GET", "/ready")[0] == 200, 15)

    def close(self) -> None:
        self.router.stop()
        self.proxy.close()
        for s in self.sims:
            s.stop()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, collector: Collector) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("traced"), collector.url)
    try:
        yield fleet
    finally:
        fleet.close()


def test_a_streamed_request_is_one_trace_joined_to_the_client_and_the_engine(
    traced: Fleet, collector: Collector,
) -> None:
    parent, trace = traceparent(1)
    status, _, raw = http(traced.base, "POST", "/v1/chat/completions",
                          chat("trace me", stream=True, max_tokens=6),
                          {"traceparent": parent, "tracestate": "vendor=abc",
                           "x-request-id": "obs-stream"})
    assert status == 200 and sse_done(raw), raw

    spans = collector.trace(trace, 5)
    assert len(spans) == 5, spans
    server = server_span(spans)
    assert server["parent"] == "00f067aa0ba902b7"  # the client's span
    assert server["name"] == f"chat {MODEL}"
    attrs = server["attrs"]
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert 1 <= attrs["gen_ai.usage.output_tokens"] <= 6
    assert attrs["narwhal.outcome"] == "completed" and "narwhal.reason" not in attrs
    assert attrs["http.response.status_code"] == 200
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["narwhal.request_id"] == "obs-stream"
    assert attrs["narwhal.retries"] == 0
    assert attrs["narwhal.ttft_s"] > 0
    assert server["status"] == Status.STATUS_CODE_UNSET
    ((event, at),) = server["events"]
    assert event == "first_token" and server["start"] < at <= server["end"]

    named = by_name(spans)
    children = [named["narwhal.sizing"][0], named["narwhal.admission_wait"][0],
                named["narwhal.placement"][0], *attempts_of(spans)]
    assert [c["parent"] for c in children] == [server["span_id"]] * 4
    starts = [c["start"] for c in children]
    assert starts == sorted(starts) and server["start"] <= starts[0]
    assert all(c["end"] <= server["end"] for c in children)
    assert named["narwhal.sizing"][0]["attrs"]["gen_ai.usage.input_tokens"] == (
        attrs["gen_ai.usage.input_tokens"])
    assert named["narwhal.admission_wait"][0]["attrs"]["narwhal.queue_wait_s"] == 0.0
    (attempt,) = attempts_of(spans)
    engine = attempt["attrs"]["narwhal.engine"]
    assert attrs["narwhal.engines"] == [engine]
    assert named["narwhal.placement"][0]["attrs"]["narwhal.engine"] == engine
    assert attempt["attrs"]["narwhal.attempt.outcome"] == "ok"
    assert attempt["attrs"]["gen_ai.request.model"] == MODEL
    assert attempt["attrs"]["narwhal.engine.role"] == "mixed"

    # The engine that served it received the attempt span as its parent, and the tracestate.
    sim = traced.sims[0 if engine == "e0" else 1]
    (headers,) = received(sim, "obs-stream")
    assert headers["traceparent"] == f"00-{trace}-{attempt['span_id']}-01"
    assert headers["tracestate"] == "vendor=abc"
    assert collector.resources[-1]["service.name"] == "narwhal-e2e"

    line = access_line(traced.log, "obs-stream")
    assert line["trace_id"] == trace
    assert (line["status"], line["outcome"], line["reason"]) == (200, "completed", None)
    assert line["route"] == "/v1/chat/completions" and line["model"] == MODEL
    assert line["stream"] is True and line["client"].startswith("127.0.0.1:")
    assert (line["engines"], line["attempts"]) == ([engine], 1)
    assert line["prompt_tokens"] == attrs["gen_ai.usage.input_tokens"]
    assert line["output_tokens"] == attrs["gen_ai.usage.output_tokens"]
    assert line["queue_wait_s"] == 0.0
    assert 0 < line["ttft_s"] <= line["total_s"]
    assert line["tpot_s"] is None or line["tpot_s"] > 0
    assert line["time"].endswith("Z")


def test_refused_requests_are_traced_and_logged(traced: Fleet, collector: Collector) -> None:
    # After parsing: a model nobody serves (404).
    parent, trace = traceparent(2)
    body = {**chat("no such model"), "model": "not-served"}
    status, _, _ = http(traced.base, "POST", "/v1/chat/completions", body,
                        {"traceparent": parent, "x-request-id": "obs-404"})
    assert status == 404
    (server,) = collector.trace(trace, 1)
    assert server["name"] == "POST /v1/chat/completions"
    assert server["attrs"]["narwhal.outcome"] == "invalid_requests"
    assert server["attrs"]["narwhal.reason"] == "model_not_found"
    assert server["attrs"]["http.response.status_code"] == 404
    assert server["status"] == Status.STATUS_CODE_UNSET  # a client error, not the server's
    line = access_line(traced.log, "obs-404")
    assert (line["status"], line["outcome"], line["reason"]) == (
        404, "invalid_requests", "model_not_found")
    assert (line["engines"], line["attempts"], line["model"]) == ([], 0, None)

    # At intake, from its declared length alone: too large (413), no body read.
    parent, trace = traceparent(3)
    status, _, _ = http(traced.base, "POST", "/v1/chat/completions", b"x" * 70000,
                        {"traceparent": parent, "x-request-id": "obs-413"})
    assert status == 413
    (server,) = collector.trace(trace, 1)
    assert server["attrs"]["narwhal.reason"] == "request_too_large"
    assert server["attrs"]["http.response.status_code"] == 413
    line = access_line(traced.log, "obs-413")
    assert (line["status"], line["outcome"], line["reason"]) == (
        413, "invalid_requests", "request_too_large")


def test_a_retried_request_has_one_span_per_attempt_each_sent_to_its_engine(
    traced: Fleet, collector: Collector,
) -> None:
    traced.proxy.mode = "fault:http_500"  # e0 answers 500: its attempts are retried on e1
    try:
        retried = None
        for n in range(10, 20):  # least_loaded rotates ties: one of these goes to e0 first
            parent, trace = traceparent(n)
            rid = f"obs-retry-{n}"
            status, _, raw = http(traced.base, "POST", "/v1/chat/completions",
                                  chat("retry me", max_tokens=4),
                                  {"traceparent": parent, "x-request-id": rid})
            assert status == 200, raw
            if access_line(traced.log, rid)["attempts"] == 2:
                retried = (rid, trace)
                break
        assert retried is not None, "no request was placed on the failing engine first"
    finally:
        traced.proxy.mode = "pass"
    rid, trace = retried
    spans = collector.trace(trace, 6)
    server = server_span(spans)
    assert server["attrs"]["narwhal.retries"] == 1
    assert server["attrs"]["narwhal.engines"] == ["e0", "e1"]
    assert server["attrs"]["narwhal.outcome"] == "completed"
    first, second = attempts_of(spans)
    assert first["parent"] == second["parent"] == server["span_id"]
    assert first["attrs"]["narwhal.engine"] == "e0" and second["attrs"]["narwhal.engine"] == "e1"
    assert first["attrs"]["narwhal.attempt.outcome"] == "status_5xx"
    assert first["attrs"]["error.type"] == "status_5xx"
    assert first["status"] == Status.STATUS_CODE_ERROR
    assert second["attrs"]["narwhal.attempt.outcome"] == "ok"
    assert first["end"] <= second["start"]
    # each engine got its own attempt's span in traceparent
    (h0,) = received(traced.sims[0], rid)
    (h1,) = received(traced.sims[1], rid)
    assert h0["traceparent"] == f"00-{trace}-{first['span_id']}-01"
    assert h1["traceparent"] == f"00-{trace}-{second['span_id']}-01"
    line = access_line(traced.log, rid)
    assert (line["engines"], line["attempts"], line["status"]) == (["e0", "e1"], 2, 200)


def test_narwhal_starts_the_trace_when_the_client_sends_none(
    traced: Fleet, collector: Collector,
) -> None:
    status, _, _ = http(traced.base, "POST", "/v1/completions",
                        {"model": MODEL, "prompt": f"{MARK} no trace", "max_tokens": 3},
                        {"x-request-id": "obs-root"})
    assert status == 200
    trace = access_line(traced.log, "obs-root")["trace_id"]
    spans = collector.trace(trace, 5)
    server = server_span(spans)
    assert server["parent"] == ""  # a root span
    assert server["name"] == f"text_completion {MODEL}"
    (attempt,) = attempts_of(spans)
    sim = traced.sims[0 if attempt["attrs"]["narwhal.engine"] == "e0" else 1]
    (headers,) = received(sim, "obs-root")
    assert headers["traceparent"] == f"00-{trace}-{attempt['span_id']}-01"
    assert "tracestate" not in headers


def test_one_access_log_line_per_counted_outcome(traced: Fleet) -> None:
    # Runs after the module's other tests: every request the router counted has its line.
    counters = Counters(traced.base)
    for i in range(5):
        assert http(traced.base, "POST", "/v1/chat/completions", chat(f"count {i}"),
                    {"x-request-id": f"obs-count-{i}"})[0] == 200
    assert http(traced.base, "POST", "/v1/chat/completions", b"{not json",
                {"x-request-id": "obs-count-bad"})[0] == 400
    delta = counters.settled()
    assert delta["narwhal_offered_total"] == 6
    m = counters.before
    offered = m["narwhal_offered_total"] + 6

    def all_written() -> list[dict[str, Any]] | None:
        lines = access_lines(traced.log)
        return lines if len(lines) >= offered else None

    lines = wait_for(all_written, 10)
    assert len(lines) == offered
    assert len({x["request_id"] for x in lines}) == len(lines)
    assert access_line(traced.log, "obs-count-bad")["reason"] == "invalid_json"


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "narwhal.json"


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL string of the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (key in ("expr", "definition")
                                           or (key == "query" and "narwhal_" in value)):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


def _exposed(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Every series name /metrics exposes (a histogram family as _bucket, _sum, _count; a
    family without samples yet by its TYPE line), and the labels of those with samples."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
            names.update(name + suffix for suffix in suffixes)
        elif line and not line.startswith("#"):
            name, _, rest = line.rsplit(" ", 1)[0].partition("{")
            names.add(name)
            labels.setdefault(name, set()).update(
                pair.split("=", 1)[0] for pair in rest.rstrip("}").split(",") if pair)
    return names, labels


def test_the_dashboard_queries_only_what_the_router_exposes(traced: Fleet) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(_queries(dashboard))
    assert len(queries) > 20
    _, _, raw = http(traced.base, "GET", "/metrics")
    exposed, labelled = _exposed(raw.decode())
    used = {m for q in queries for m in re.findall(r"\bnarwhal_[a-z0-9_]+", q)}
    assert used - exposed == set(), "the dashboard queries metrics /metrics lacks"
    # every family the issue names is on the dashboard
    for family in ("narwhal_offered_total", "narwhal_completed_total", "narwhal_rejected_total",
                   "narwhal_refused_total", "narwhal_retained_requests",
                   "narwhal_ttft_seconds_bucket", "narwhal_tpot_seconds_bucket",
                   "narwhal_queue_wait_seconds_bucket", "narwhal_engine_inflight",
                   "narwhal_engine_up", "narwhal_engine_ejected", "narwhal_engine_drift",
                   "narwhal_engine_learned_tpot_seconds"):
        assert family in used, family
    # The labels a query selects or groups by are ones its series carry (Prometheus adds
    # instance and job; model marks per-model samples), where the router has samples to tell.
    checked = 0
    for query in queries:
        metrics = set(re.findall(r"\bnarwhal_[a-z0-9_]+", query))
        if not all(m in labelled for m in metrics):
            continue
        known = set().union(*(labelled[m] for m in metrics)) | {"instance", "job", "model"}
        labels = set(re.findall(r"([a-z_]+)=~?\"", query))
        for group in re.findall(r"by \(([^)]*)\)", query):
            labels |= {x.strip() for x in group.split(",")}
        assert labels <= known, (query, labels - known)
        checked += 1
    assert checked > 20


# -- tracing off: pass-through; two workers: one line per request -----------------------------
def test_two_workers_log_each_request_once_and_pass_the_trace_context_through(
    tmp_path: Path,
) -> None:
    sims = [start_sim(*FAST), start_sim(*FAST)]
    proxy = FaultProxy(int(sims[0].url.rsplit(":", 1)[1]), mode="fault:http_500")
    log = tmp_path / "access.log"
    config = router_config([proxy.url, sims[1].url], health=HEALTH, admission={"mode": "open"},
                           scheduling={"policy": "least_loaded"},
                           logging={"access_log": True, "format": "text",
                                    "access_log_file": str(log)})
    router = start_router(tmp_path, config, "--workers", "2")
    try:
        wait_for(lambda: http(router.url, "GET", "/ready")[0] == 200, 15)
        counters = Counters(router.url)
        # Tracing off: every attempt, a retried one's too, carries the client's context as is.
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        both = None
        for n in range(8):
            rid = f"pass-{n}"
            assert http(router.url, "POST", "/v1/chat/completions", chat("pass"),
                        {"traceparent": parent, "tracestate": "a=1,b=2",
                         "x-request-id": rid})[0] == 200
            got = received(sims[0], rid) + received(sims[1], rid)
            assert got and all(h["traceparent"] == parent and h["tracestate"] == "a=1,b=2"
                               for h in got)
            if received(sims[0], rid):
                both = got
        assert both is not None and len(both) == 2  # e0 failed it, e1 served it
        proxy.mode = "pass"
        ids = [f"w2-{n}" for n in range(40)]
        for n, rid in enumerate(ids):  # fresh connections: both workers answer some
            body = chat(f"worker {n}") if n % 4 else {**chat("x"), "model": "nope"}
            assert http(router.url, "POST", "/v1/chat/completions", body,
                        {"x-request-id": rid})[0] in (200, 404)
        offered = counters.settled()["narwhal_offered_total"]
        assert offered == 48
    finally:
        router.stop()  # the workers write out what they hold as they stop
        proxy.close()
        for s in sims:
            s.stop()
    lines = [dict(pair.split("=", 1) for pair in line.split(" "))
             for line in log.read_text().splitlines()]
    assert sorted(x["request_id"] for x in lines) == sorted(
        [f"pass-{n}" for n in range(8)] + ids)
    assert all(set(x) >= FIELDS for x in lines)
    assert sum(x["status"] == "404" and x["reason"] == "model_not_found" for x in lines) == 10
    assert {x["outcome"] for x in lines} == {"completed", "invalid_requests"}
    assert "trace_id" not in lines[0]


def test_two_workers_each_export_their_requests_traces(
    tmp_path: Path, collector: Collector,
) -> None:
    sims = [start_sim(*FAST), start_sim(*FAST)]
    config = router_config([s.url for s in sims], health=HEALTH, admission={"mode": "open"},
                           tracing={"otlp_endpoint": collector.url})
    router = start_router(tmp_path, config, "--workers", "2")
    try:
        wait_for(lambda: http(router.url, "GET", "/ready")[0] == 200, 15)
        for n in range(50, 62):  # fresh connections: both workers answer some
            parent, trace = traceparent(n)
            assert http(router.url, "POST", "/v1/chat/completions", chat("two", stream=True),
                        {"traceparent": parent, "x-request-id": f"w2t-{n}"})[0] == 200
            spans = collector.trace(trace, 5)
            (attempt,) = attempts_of(spans)
            assert server_span(spans)["parent"] == "00f067aa0ba902b7"
            sim = sims[int(attempt["attrs"]["narwhal.engine"][1:])]
            (headers,) = received(sim, f"w2t-{n}")
            assert headers["traceparent"] == f"00-{trace}-{attempt['span_id']}-01"
    finally:
        router.stop()
        for s in sims:
            s.stop()


# -- the collector down ------------------------------------------------------------------------
def test_the_router_serves_as_before_with_the_collector_down(tmp_path: Path) -> None:
    sim = start_sim(*FAST)
    log = tmp_path / "access.log"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = router_config([sim.url], health=HEALTH, admission={"mode": "open"},
                           tracing={"otlp_endpoint": dead},
                           logging={"access_log": True, "format": "json",
                                    "access_log_file": str(log)})
    router = start_router(tmp_path, config)
    try:
        wait_for(lambda: http(router.url, "GET", "/ready")[0] == 200, 15)
        counters = Counters(router.url)
        for i in range(30):
            status, _, raw = http(router.url, "POST", "/v1/chat/completions",
                                  chat(f"dark {i}", stream=True, max_tokens=4),
                                  {"x-request-id": f"dark-{i}"})
            assert status == 200 and sse_done(raw), raw
        delta = counters.settled()
        assert delta["narwhal_completed_total"] == 30
        # The export thread tried, failed and said so (once: it is rate-limited).
        wait_for(lambda: any("OTLP collector" in line for line in router.lines), 10)
        assert http(router.url, "GET", "/ready")[0] == 200
    finally:
        router.stop()
        sim.stop()
    assert sum("OTLP collector" in line for line in router.lines) == 1
    lines = access_lines(log)
    assert len(lines) == 30 and all(x["trace_id"] and x["status"] == 200 for x in lines)


# -- both legs of a disaggregated request --------------------------------------------------------
def test_both_legs_of_a_disaggregated_request_carry_their_attempt_span(
    tmp_path: Path, collector: Collector,
) -> None:
    prefill, decode = start_sim(*FAST, "--role", "prefill"), start_sim(*FAST, "--role", "decode")
    engines = [{"name": "p0", "url": prefill.url, "role": "prefill"},
               {"name": "d0", "url": decode.url, "role": "decode"}]
    config = router_config([], engines=engines, health=HEALTH, admission={"mode": "open"},
                           tracing={"otlp_endpoint": collector.url})
    router = start_router(tmp_path, config)
    try:
        wait_for(lambda: http(router.url, "GET", "/ready")[0] == 200, 15)
        parent, trace = traceparent(40)
        status, _, raw = http(router.url, "POST", "/v1/chat/completions",
                              chat("split me", stream=True, max_tokens=4),
                              {"traceparent": parent, "x-request-id": "obs-split"})
        assert status == 200 and sse_done(raw), raw
        spans = collector.trace(trace, 6)
        server = server_span(spans)
        first, second = attempts_of(spans)
        assert [a["attrs"]["narwhal.engine.role"] for a in (first, second)] == [
            "prefill", "decode"]
        assert first["parent"] == second["parent"] == server["span_id"]
        assert server["attrs"]["narwhal.engines"] == ["p0", "d0"]
        assert server["attrs"]["narwhal.retries"] == 0
        assert by_name(spans)["narwhal.placement"][0]["attrs"]["narwhal.decode_engine"] == "d0"
        (hp,) = received(prefill, "obs-split")
        (hd,) = received(decode, "obs-split")
        assert hp["traceparent"] == f"00-{trace}-{first['span_id']}-01"
        assert hd["traceparent"] == f"00-{trace}-{second['span_id']}-01"
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


# -- log formats and the missing extra -----------------------------------------------------------
def test_json_log_format_for_the_router_and_its_access_log_on_stderr(tmp_path: Path) -> None:
    sim = start_sim(*FAST)
    config = router_config([sim.url], health=HEALTH, admission={"mode": "open"},
                           logging={"access_log": True, "format": "json"})
    router = start_router(tmp_path, config)
    try:
        wait_for(lambda: http(router.url, "GET", "/ready")[0] == 200, 15)
        assert http(router.url, "POST", "/v1/chat/completions", chat("stderr"),
                    {"x-request-id": "obs-stderr"})[0] == 200

        def parsed() -> list[dict[str, Any]]:
            return [json.loads(line) for line in list(router.lines)
                    if not line.startswith("narwhal serving")]

        wait_for(lambda: any(x.get("request_id") == "obs-stderr" for x in parsed()), 10)
        wait_for(lambda: any(x.get("logger") == "narwhal.health" for x in parsed()), 10)
    finally:
        router.stop()
        sim.stop()
    lines = parsed()  # every line but the ready line is JSON: the router's and the access log's
    own = [x for x in lines if "logger" in x]
    assert own and all({"time", "level", "logger", "message"} <= set(x) for x in own)
    (access,) = [x for x in lines if x.get("request_id") == "obs-stderr"]
    assert set(access) >= FIELDS


def test_log_format_flag_overrides_the_file_for_the_routers_own_lines(tmp_path: Path) -> None:
    sim = start_sim(*FAST)
    config = router_config([sim.url], health=HEALTH, logging={"format": "text"})
    router = start_router(tmp_path, config, "--log-format", "json")
    try:
        wait_for(lambda: any(line.startswith("{") and "narwhal.health" in line
                             for line in router.lines), 15)
    finally:
        router.stop()
        sim.stop()
    own = [json.loads(line) for line in router.lines if "narwhal.health" in line]
    assert own and all(x["logger"] == "narwhal.health" for x in own)


def test_tracing_without_the_sdk_fails_at_start_naming_the_extra(tmp_path: Path) -> None:
    config = tmp_path / "narwhal.yaml"
    config.write_text("model: m\nengines: [{name: a0, url: 'http://127.0.0.1:9'}]\n"
                      "tracing: {otlp_endpoint: 'http://127.0.0.1:4318'}\n")
    # A None entry in sys.modules makes `import opentelemetry...` fail, as without the extra.
    code = ("import sys; sys.modules['opentelemetry'] = None; from narwhal.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "serve", "--config", str(config),
                           "--port", "0"], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "pip install 'narwhal[otel]'" in done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stdout
