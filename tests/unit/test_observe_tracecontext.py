"""W3C Trace Context: reading a client's traceparent, sampling, and what an engine receives."""

from __future__ import annotations

import pytest

from narwhal.observe.tracecontext import Sampler, parse_traceparent

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def test_a_valid_traceparent_is_read() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == (int(TRACE, 16), int(SPAN, 16), True)
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00") == (int(TRACE, 16), int(SPAN, 16), False)
    # a later version may append fields; its first four are read as version 00's
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-03-extra") == (
        int(TRACE, 16), int(SPAN, 16), True)


@pytest.mark.parametrize("value", [
    "",
    "garbage",
    f"00-{TRACE}-{SPAN}",                      # too few fields
    f"00-{TRACE}-{SPAN}-01-extra",             # version 00 has exactly four
    f"ff-{TRACE}-{SPAN}-01",                   # version ff is invalid
    f"00-{TRACE.upper()}-{SPAN}-01",           # hex is lower case
    f"00-{'0' * 32}-{SPAN}-01",                # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",               # all-zero parent id
    f"00-{TRACE[:-1]}-{SPAN}-01",              # short trace id
    f"00-{TRACE}-{SPAN}-1",                    # short flags
    f"0x-{TRACE}-{SPAN}-01",
])
def test_a_malformed_traceparent_is_ignored(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_client_trace_is_continued_with_its_sampled_flag_and_tracestate() -> None:
    sampler = Sampler(0.0)  # the ratio applies only to traces Narwhal starts
    ctx = sampler.start({"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=x"})
    assert (ctx.trace_id, ctx.parent_id, ctx.sampled, ctx.state) == (
        int(TRACE, 16), int(SPAN, 16), True, "vendor=x")
    assert ctx.span_id not in (0, ctx.parent_id)
    unsampled = Sampler(1.0).start({"traceparent": f"00-{TRACE}-{SPAN}-00"})
    assert not unsampled.sampled


def test_without_a_valid_traceparent_narwhal_starts_the_trace() -> None:
    # a malformed traceparent's tracestate goes with it
    ctx = Sampler(1.0).start({"traceparent": "nonsense", "tracestate": "vendor=x"})
    assert ctx.parent_id == 0 and ctx.trace_id != 0 and ctx.sampled and ctx.state is None


def test_the_ratio_samples_that_share_of_new_traces() -> None:
    assert not any(Sampler(0.0).start({}).sampled for _ in range(200))
    assert all(Sampler(1.0).start({}).sampled for _ in range(200))
    sampled = sum(Sampler(0.25).start({}).sampled for _ in range(4000))
    assert 700 < sampled < 1300  # 1000 expected; the bounds are over 8 standard deviations


def test_the_engine_gets_the_attempt_span_as_parent() -> None:
    ctx = Sampler(1.0).start({"traceparent": f"00-{TRACE}-{SPAN}-01"})
    assert ctx.traceparent(0x1234) == f"00-{TRACE}-0000000000001234-01".encode()
    assert parse_traceparent(ctx.traceparent(0x1234).decode()) == (int(TRACE, 16), 0x1234, True)
    off = Sampler(1.0).start({"traceparent": f"00-{TRACE}-{SPAN}-00"})
    assert off.traceparent(7).endswith(b"-00")
