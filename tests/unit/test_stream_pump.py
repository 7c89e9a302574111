"""Property tests of the raw-body fast path: ``StreamSession.pump`` (chunked decoding, the
client's chunk framing, flags, the token tally) against its Python oracle and against
``feed`` on the same stream de-chunked, on arbitrary chunk sizes and read splits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_stream_props import OPTIONS, SETTINGS, stream

from narwhal._narwhal_fast import StreamSession
from reference import stream_oracle
from reference.chunked_oracle import ChunkedDecoder

BODY_ENDED, MALFORMED, TOKENS, STATE = (stream_oracle.BODY_ENDED, stream_oracle.MALFORMED,
                                        stream_oracle.TOKENS, stream_oracle.STATE)


class Tally:
    tokens = 0


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` in chunks of drawn sizes, sizes in either case, with extensions and trailers."""
    wire, pos = b"", 0
    while pos < len(body):
        n = draw(st.integers(1, max(1, len(body) - pos)))
        size = b"%x" % n if draw(st.booleans()) else b"%X" % n
        if draw(st.integers(0, 5)) == 0:
            size = b"0" + size
        ext = draw(st.sampled_from([b"", b";a=1", b' ;name="v"', b"\t;x"]))
        wire += size + ext + b"\r\n" + body[pos : pos + n] + b"\r\n"
        pos += n
    trailers = draw(st.sampled_from([b"", b"x-t: 1\r\n", b"a: b\r\nc: d\r\n"]))
    return wire + b"0\r\n" + trailers + b"\r\n"


def cut(draw: st.DrawFn, data: bytes) -> list[bytes]:
    points = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=8)))
    points = [p for p in points if p < len(data)]
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@st.composite
def pumped_stream(draw: st.DrawFn, route: str) -> tuple[dict[str, Any], bytes, list[bytes]]:
    opts, reads = draw(stream(route))
    body = b"".join(reads)
    wire = draw(chunked(body))
    if draw(st.integers(0, 4)) == 0:  # a framing fault, or bytes after the end
        at = draw(st.integers(0, len(wire)))
        wire = wire[:at] + draw(st.sampled_from([b"x", b"\n", b"HTTP/1.1 200"])) + wire[at:]
    return opts, body, cut(draw, wire)


def pump_all(cls: Any, route: str, opts: dict[str, Any], reads: list[bytes],
             watch: bool) -> dict[str, Any]:
    s, written, tally = cls(route, **opts), [], Tally()
    tally.tokens = 3
    s.start_pump(written.append, tally)
    s.watch_tokens = watch
    flags, state_read = [], None
    for r in reads:
        flags.append(s.pump(r))
        if flags[-1] & STATE:
            state_read = s.last_read()  # what the caller takes on this flag
    return {"flags": flags, "written": written, "tally": tally.tokens,
            "state_read": state_read, "last_read": s.last_read(), "framing_error": s.framing_error,
            "watch": s.watch_tokens, "timed": s.last_token_at > 0,
            "failure": s.failure and s.failure[0], "output_tokens": s.output_tokens,
            "events": s.events, "state": s.state}


def dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    ChunkedDecoder().feed(data, out.append)
    return b"".join(out)


def check(route: str, case: tuple[dict[str, Any], bytes, list[bytes]], watch: bool) -> None:
    opts, body, reads = case
    rust = pump_all(StreamSession, route, opts, reads, watch)
    assert rust == pump_all(stream_oracle.StreamSession, route, opts, reads, watch)
    if any(f & MALFORMED for f in rust["flags"]):
        return
    # Unbroken framing: the client gets what feed() gives for the de-chunked body, framed,
    # plus the read that changed the state (left to the caller), and nothing after it.
    fed = stream_oracle.StreamSession(route, **opts)
    out, tokens, state = fed.feed(body)
    states = [i for i, f in enumerate(rust["flags"]) if f & STATE]
    assert len(states) == (1 if state else 0)
    written = b"".join(dechunk(w) for w in rust["written"])
    tail = rust["state_read"][0] if states else b""
    assert written + tail == out
    assert rust["state"] == state
    assert bool(rust["flags"][-1] & BODY_ENDED)
    if not states:
        assert rust["tally"] == 3 + tokens
        assert any(f & TOKENS for f in rust["flags"]) == (watch and tokens > 0)


@SETTINGS
@given(pumped_stream("chat"), st.booleans())
def test_chat_pump_matches_the_oracle_and_feed(
        case: tuple[dict[str, Any], bytes, list[bytes]], watch: bool) -> None:
    check("chat", case, watch)


@SETTINGS
@given(pumped_stream("completion"), st.booleans())
def test_completion_pump_matches_the_oracle_and_feed(
        case: tuple[dict[str, Any], bytes, list[bytes]], watch: bool) -> None:
    check("completion", case, watch)


@SETTINGS
@given(st.binary(max_size=120), st.data(), OPTIONS)
def test_arbitrary_framing_matches_the_oracle(body: bytes, data: st.DataObject,
                                              opts: dict[str, Any]) -> None:
    wire = data.draw(st.sampled_from([b"", b"5\r\n", b"1a;x\r\n", b"0\r\n"])) + body
    reads = cut(data.draw, wire)
    assert pump_all(StreamSession, "chat", opts, reads, True) == pump_all(
        stream_oracle.StreamSession, "chat", opts, reads, True)


def test_a_failing_writer_stops_writing() -> None:
    """The client transport closed under the pump: flag 16 once, no more writes."""
    for cls in (StreamSession, stream_oracle.StreamSession):
        calls = []

        def closed(data: bytes, calls: list[bytes] = calls) -> None:
            calls.append(data)
            raise RuntimeError("handler is closed")

        s = cls("chat", assemble=False, expose_token_ids=True, drop_usage=False,
                require_token_ids=False)
        s.start_pump(closed)
        event = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        framed = b"%x\r\n%b\r\n" % (len(event), event)
        assert s.pump(framed) == stream_oracle.WRITE_FAILED
        assert s.pump(framed) == 0
        assert len(calls) == 1


# -- the fast path in the real router (in process, sockets replaced) -----------------------

def relay_answers(fast: bool, tokens: int, pause_at: int | None = None) -> tuple[bytes, int, int]:
    """The client's bytes for a streamed answer of ``tokens`` one-token reads (the engine of
    ``benches/bench_relay_read.py``), the engine reads the relay saw in Python
    (``Relay._on_data`` calls), and the times the engine was paused. ``pause_at``: the
    client stops reading after that many events, for 10 ms."""
    from benches import bench_relay_read

    from narwhal.flow.relay import Relay

    python_reads = 0
    original = Relay._on_data

    def counting(self: Relay, data: bytes) -> None:
        nonlocal python_reads
        python_reads += 1
        original(self, data)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Relay, "_on_data", counting)
        mp.setattr(Relay, "fast_reads", fast)
        bench = bench_relay_read.make_bench()
        try:
            python_reads = 0
            bench.pauses = 0  # type: ignore[attr-defined]
            bench.reads = bench_relay_read.answer(tokens)  # type: ignore[attr-defined]
            if pause_at is not None:
                client, protocol = bench.transport, bench.protocol
                write = client.write

                def slow_write(data: Any) -> None:
                    write(data)
                    if client.data.count(b"data: ") == pause_at:
                        protocol.pause_writing()
                        bench.loop.call_later(0.01, protocol.resume_writing)

                mp.setattr(client, "write", slow_write)
            bench.run(1)
            return bytes(bench.transport.data), python_reads, bench.pauses  # type: ignore[attr-defined]
        finally:
            bench.close()


def test_the_router_answers_the_same_bytes_on_the_fast_path() -> None:
    fast, python_reads, _ = relay_answers(True, 40)
    slow, all_reads, _ = relay_answers(False, 40)
    assert fast == slow and fast.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert all_reads == 43  # role, 40 words, finish, [DONE]
    assert python_reads == 1  # the first read starts the client's answer; the rest pump


def test_back_pressure_pauses_the_engine_on_the_fast_path() -> None:
    answer, python_reads, pauses = relay_answers(True, 40, pause_at=10)
    assert pauses == 1 and python_reads == 1
    assert answer == relay_answers(False, 40)[0]
