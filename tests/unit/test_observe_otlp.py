"""The OTLP/HTTP export: the span encoding's reference (tests/reference/otlp_oracle.py, which
the Rust encoder matches byte for byte: test_observe_spans.py) decodes with opentelemetry-proto
to the spans the SDK would hold; the export thread posts batches, dropping them (without
raising) while the collector is down."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from narwhal._narwhal_fast import SpanEncoder
from narwhal.observe import otlp
from narwhal.observe.otlp import OtlpHttpExporter
from reference.otlp_oracle import Encoder

TRACE = 0x0AF7651916CD43DD8448EB211C80319C
SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def value_of(any_value: AnyValue) -> object:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def spans() -> list[ReadableSpan]:
    client = SpanContext(TRACE, 0xB7AD6B7169203331, True, SAMPLED)
    server = SpanContext(TRACE, 0x1111, False, SAMPLED)
    return [
        ReadableSpan(
            "chat m", server, parent=client, kind=SpanKind.SERVER,
            attributes={"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 12,
                        "narwhal.ttft_s": 0.25, "narwhal.stream": True,
                        "narwhal.engines": ["e0", "e1"], "big": 2**40, "negative": -3},
            events=(Event("first_token", timestamp=1_700_000_000_500_000_000),),
            status=Status(StatusCode.ERROR, "engine_error"),
            start_time=1_700_000_000_000_000_000, end_time=1_700_000_001_000_000_000,
        ),
        ReadableSpan(
            "chat m", SpanContext(TRACE, 0x2222, False, SAMPLED),
            parent=SpanContext(TRACE, 0x1111, False, SAMPLED), kind=SpanKind.CLIENT,
            attributes={"narwhal.engine": "e0"},
            start_time=1_700_000_000_100_000_000, end_time=1_700_000_000_900_000_000,
        ),
        ReadableSpan(
            "narwhal.sizing", SpanContext(TRACE, 0x3333, False, SAMPLED),
            parent=SpanContext(TRACE, 0x1111, False, SAMPLED),
            start_time=1_700_000_000_000_000_001, end_time=1_700_000_000_000_000_002,
        ),
    ]


def decode(data: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    return request


def test_encoded_spans_decode_to_what_the_sdk_holds() -> None:
    encoder = Encoder({"service.name": "narwhal", "service.version": "1"}, "narwhal", "0.1.0")
    request = decode(encoder.request(encoder.readable(spans())))
    (resource_spans,) = request.resource_spans
    resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
    assert resource == {"service.name": "narwhal", "service.version": "1"}
    (scope_spans,) = resource_spans.scope_spans
    assert (scope_spans.scope.name, scope_spans.scope.version) == ("narwhal", "0.1.0")
    server, attempt, sizing = scope_spans.spans
    assert server.trace_id == TRACE.to_bytes(16, "big")
    assert server.span_id == (0x1111).to_bytes(8, "big")
    assert server.parent_span_id == (0xB7AD6B7169203331).to_bytes(8, "big")
    assert server.name == "chat m" and server.kind == PbSpan.SPAN_KIND_SERVER
    assert (server.start_time_unix_nano, server.end_time_unix_nano) == (
        1_700_000_000_000_000_000, 1_700_000_001_000_000_000)
    assert {kv.key: value_of(kv.value) for kv in server.attributes} == {
        "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 12, "narwhal.ttft_s": 0.25,
        "narwhal.stream": True, "narwhal.engines": ["e0", "e1"], "big": 2**40, "negative": -3}
    assert [(e.name, e.time_unix_nano) for e in server.events] == [
        ("first_token", 1_700_000_000_500_000_000)]
    assert (server.status.code, server.status.message) == (
        PbStatus.STATUS_CODE_ERROR, "engine_error")
    # flags: sampled, and "the parent is remote" known and true for the server span
    assert server.flags == 0x01 | 0x100 | 0x200
    assert attempt.kind == PbSpan.SPAN_KIND_CLIENT and attempt.flags == 0x01 | 0x100
    assert attempt.parent_span_id == (0x1111).to_bytes(8, "big")
    assert attempt.status.code == PbStatus.STATUS_CODE_UNSET
    assert sizing.kind == PbSpan.SPAN_KIND_INTERNAL and not sizing.attributes


def test_a_large_batch_round_trips() -> None:
    encoder = Encoder({"service.name": "narwhal"}, "narwhal", "0.1.0")
    batch = spans() * 300
    request = decode(encoder.request(encoder.readable(batch)))
    assert len(request.resource_spans[0].scope_spans[0].spans) == len(batch)
    # the Rust encoder's request around the same spans, given in parts, is the same bytes
    rust = SpanEncoder([("service.name", "narwhal")], "narwhal", "0.1.0", seed=1)
    parts = [encoder.readable(spans()) for _ in range(300)]
    assert rust.request(parts) == encoder.request(b"".join(parts))


def exporter_encoder() -> SpanEncoder:
    return SpanEncoder([("service.name", "narwhal")], "narwhal", "0.1.0", seed=1)


class Collector(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies: list[tuple[str, str, bytes]] = []


class Handler(http.server.BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.bodies.append((self.path, self.headers["content-type"], body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_export_thread_posts_protobuf_to_v1_traces(collector: Collector) -> None:
    port = collector.server_address[1]
    encoder = Encoder({"service.name": "narwhal"}, "narwhal", "0.1.0")
    exporter = OtlpHttpExporter(f"http://127.0.0.1:{port}", exporter_encoder())
    exporter.submit(encoder.readable(spans()))  # one request's spans
    exporter.submit(encoder.readable(spans()[:1]))
    exporter.close(5.0)  # sends what is queued, then stops
    assert exporter.exported == 2 and exporter.dropped == 0
    assert [(p, t) for p, t, _ in collector.bodies] == [
        ("/v1/traces", "application/x-protobuf")]
    assert len(decode(collector.bodies[0][2]).resource_spans[0].scope_spans[0].spans) == 4
    # an endpoint that already names the traces path is used as it is
    other = OtlpHttpExporter(f"http://127.0.0.1:{port}/otlp/v1/traces", exporter_encoder())
    other.close(1.0)
    assert other.path == "/otlp/v1/traces"


def test_a_collector_that_is_down_drops_batches_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with Collector() as closed:  # a port nothing listens on once it is closed
        port = closed.server_address[1]
    encoder = Encoder({}, "narwhal", "0.1.0")
    exporter = OtlpHttpExporter(f"http://127.0.0.1:{port}", exporter_encoder(), timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="narwhal.tracing"):
        for _ in range(3):
            assert exporter.export([encoder.readable(spans())]) is False
        exporter.close(1.0)
    assert exporter.dropped == 3 and exporter.exported == 0
    warnings = [r for r in caplog.records if r.name == "narwhal.tracing"]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0].getMessage()


def test_past_the_queue_bound_new_requests_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "MAX_QUEUED", 5)
    exporter = OtlpHttpExporter("http://127.0.0.1:9", exporter_encoder())
    exporter.close(5.0)  # nothing queued: the thread stops, and what comes later waits
    for _ in range(8):
        exporter.submit(b"x")
    assert exporter.dropped == 3


def test_a_post_takes_what_was_queued_when_the_thread_woke(collector: Collector) -> None:
    """What the loop queues while a post is under way waits for the next wake: a busy
    router posts every SEND_EVERY_S or SEND_AFTER requests, not once per few requests."""
    port = collector.server_address[1]
    encoder = Encoder({"service.name": "narwhal"}, "narwhal", "0.1.0")
    exporter = OtlpHttpExporter(f"http://127.0.0.1:{port}", exporter_encoder())
    exporter.close(5.0)  # the thread is stopped: this test calls send itself
    one = encoder.readable(spans()[:1])
    for _ in range(5):
        exporter.submit(one)
    exporter.send(3)
    assert exporter.exported == 3 and exporter.queued == 2
    exporter.send()
    assert exporter.exported == 5 and len(collector.bodies) == 2


def test_a_post_holds_at_most_max_post_bytes(collector: Collector,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    port = collector.server_address[1]
    encoder = Encoder({"service.name": "narwhal"}, "narwhal", "0.1.0")
    one = encoder.readable(spans()[:1])
    monkeypatch.setattr(otlp, "MAX_POST_BYTES", 3 * len(one))
    exporter = OtlpHttpExporter(f"http://127.0.0.1:{port}", exporter_encoder())
    exporter.close(5.0)
    for _ in range(7):
        exporter.submit(one)
    exporter.send()
    assert exporter.exported == 7 and exporter.queued == 0
    sizes = [len(decode(body).resource_spans[0].scope_spans[0].spans)
             for _, _, body in collector.bodies]
    assert sizes == [3, 3, 1]
