"""The Rust span encoder (``SpanEncoder``, rust/narwhal_core/src/otlp.rs) writes, byte for
byte, what the readable Python reference (tests/reference/otlp_oracle.py) writes for the same
finished request, over requests that reach every stage or stop at any, with and without a
client's trace, retries, a disaggregated pair, refusals and failures; and what it writes
decodes with ``opentelemetry-proto``."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from narwhal._narwhal_fast import SpanEncoder
from narwhal.config import EngineConfig
from narwhal.observe.observation import Observation, Observer, SpanRecord
from narwhal.observe.tracecontext import Sampler
from reference import otlp_oracle

RESOURCE: list[tuple[str, object]] = [
    ("service.name", "narwhal"), ("service.version", "0.1.0"), ("telemetry.sdk.language", "python"),
    ("host.cpus", 2), ("deployment.canary", False), ("region.zones", ("a", "b")),
    ("load.share", 0.5)]
INTERNAL_SPANS = ("narwhal.sizing", "narwhal.admission_wait", "narwhal.placement")


def decode(data: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    return request


class Recording:
    """The tracer a test's Observer holds: encodes each finished request with the Rust
    encoder and the oracle (with the internal span IDs the Rust encoder drew)."""

    def __init__(self) -> None:
        self.sampler = Sampler(1.0)
        self.encoder = self
        self.rust = SpanEncoder(RESOURCE, "narwhal", "0.1.0",
                                seed=int.from_bytes(os.urandom(8), "little"))
        self.oracle = otlp_oracle.Encoder(dict(RESOURCE), "narwhal", "0.1.0")
        self.pairs: list[tuple[bytes, bytes]] = []
        self.finishing: Observation | None = None  # the oracle reads the observation itself

    def start(self, headers: dict[str, str]) -> Any:
        return self.sampler.start(headers)

    def encode(self, record: SpanRecord) -> bytes:
        observation = self.finishing
        assert observation is not None and record == observation.span_record()
        got = self.rust.encode(record)
        spans = decode(self.rust.request([got])).resource_spans[0].scope_spans[0].spans
        drawn = {s.name: int.from_bytes(s.span_id, "big") for s in spans}
        ids = [drawn.get(name, 0) for name in INTERNAL_SPANS]
        self.pairs.append((got, otlp_oracle.encode(self.oracle, observation, ids)))
        return got

    def submit(self, spans: bytes) -> None:
        pass


ENGINES = [
    EngineConfig(name="e0", url="http://10.0.0.1:8000"),
    EngineConfig(name="gpu-b", url="http://[::1]:9001", role="prefill"),
    EngineConfig(name="gpu-c", url="http://engine.local:80", role="decode"),
]
outcomes = st.sampled_from(["ok", "neutral", "transport", "engine_error", "timeout", ""])
attempt = st.tuples(st.sampled_from(ENGINES), outcomes, st.booleans())


@st.composite
def journeys(draw: st.DrawFn) -> dict[str, Any]:
    stage = draw(st.integers(0, 4))  # how far it got: arrived, parsed, sized, placed, attempts
    return {
        "traceparent": draw(st.sampled_from(
            [None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "garbage"])),
        "tracestate": draw(st.sampled_from([None, "vendor=x"])),
        "path": draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"])),
        "route": draw(st.sampled_from(["chat", "completion"])),
        "model": draw(st.text(min_size=1, max_size=300)),
        "stage": stage,
        "prompt_tokens": draw(st.integers(0, 2**40)),
        "queue_wait_s": draw(st.floats(0, 100)),
        "decode_engine": draw(st.sampled_from([None, "gpu-c"])),
        "attempts": draw(st.lists(attempt, max_size=3)) if stage >= 4 else [],
        "first_token": draw(st.booleans()),
        "output_tokens": draw(st.integers(0, 10_000)),
        "cls": draw(st.sampled_from(["ok", "failed", "expired", "neutral", "refused"])),
        "reason": draw(st.sampled_from([None, "", "queue_full", "engine_error"])),
        "status": draw(st.sampled_from([0, 200, 429, 503])),
        "request_id": draw(st.text(min_size=1, max_size=40)),
    }


def run(journey: dict[str, Any], tracer: Recording) -> None:
    headers = {k: journey[k] for k in ("traceparent", "tracestate") if journey[k] is not None}
    request = SimpleNamespace(headers=headers, path=journey["path"], peer=("127.0.0.1", 5))
    obs = Observer(None, cast(Any, tracer)).begin(cast(Any, request), journey["request_id"])
    stage = journey["stage"]
    if stage >= 1:
        obs.parsed(cast(Any, SimpleNamespace(route=journey["route"], model=journey["model"],
                                             stream=True)))
    if stage >= 2:
        obs.sized(journey["prompt_tokens"])
    if stage >= 3:
        obs.placed(journey["queue_wait_s"], "e0", journey["decode_engine"])
    for engine, outcome, judged in journey["attempts"]:
        obs.attempt_begin(engine, [(b"x-request-id", b"r")])
        if journey["first_token"]:
            obs.first_token()
        if judged:
            obs.attempt_end(outcome)
    if stage >= 4:
        obs.output(journey["output_tokens"], 0.5)
    tracer.finishing = obs
    obs.finish(journey["cls"], journey["reason"], journey["status"])


@settings(max_examples=300, deadline=None)
@given(journeys())
def test_the_rust_encoder_writes_what_the_oracle_writes(journey: dict[str, Any]) -> None:
    tracer = Recording()
    run(journey, tracer)
    ((got, want),) = tracer.pairs
    assert got == want
    assert tracer.rust.request([got]) == tracer.oracle.request(want)


def test_a_whole_journey_decodes_with_its_parentage() -> None:
    tracer = Recording()
    run({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
         "tracestate": None, "path": "/v1/chat/completions", "route": "chat", "model": "m",
         "stage": 4, "prompt_tokens": 12, "queue_wait_s": 0.25, "decode_engine": None,
         "attempts": [(ENGINES[0], "transport", True), (ENGINES[0], "ok", True)],
         "first_token": True, "output_tokens": 64, "cls": "ok", "reason": None,
         "status": 200, "request_id": "abc"}, tracer)
    ((got, _),) = tracer.pairs
    request = decode(tracer.rust.request([got, got]))
    (resource_spans,) = request.resource_spans
    assert {kv.key for kv in resource_spans.resource.attributes} == {k for k, _ in RESOURCE}
    spans = resource_spans.scope_spans[0].spans
    assert len(spans) == 12  # the same request twice: six spans each
    server = spans[5]
    assert server.name == "chat m" and server.parent_span_id == bytes.fromhex("b7ad6b7169203331")
    assert all(s.parent_span_id == server.span_id for s in spans[:5])
    assert len({s.span_id for s in spans[:6]}) == 6
    retry, ok = spans[3], spans[4]
    attributes = {kv.key: kv.value for kv in retry.attributes}
    assert attributes["error.type"].string_value == "transport"
    assert attributes["server.address"].string_value == "10.0.0.1"
    assert {kv.key: kv.value.int_value for kv in ok.attributes}["narwhal.attempt"] == 2
    server_attributes = {kv.key: kv.value for kv in server.attributes}
    assert server_attributes["narwhal.retries"].int_value == 1
    assert [e.name for e in server.events] == ["first_token"]


def test_resource_values_of_another_kind_are_refused() -> None:
    with pytest.raises(TypeError, match="attribute value"):
        SpanEncoder([("x", object())], "narwhal", "0.1.0", seed=1)
