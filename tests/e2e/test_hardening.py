"""HTTP hardening with raw sockets against a real router: smuggling shapes, limits, slow
clients, pipelining floods and hostile JSON each get a clear 4xx and a closed or clean
connection, and the router serves normally afterwards."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_support import http, wait_for
from procs import MODEL, Proc, invariant_holds, metrics, start_sim
from test_faults_engine import Leaks, fault_router, rss_bytes, sim_stats

pytestmark = pytest.mark.timeout(120)

HEADER_TIMEOUT_S = 1.0
KEEPALIVE_S = 3.0  # well past body_case's 1.5 s of quiet: its connection is seen open
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
).encode()
POST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    sim = start_sim("--tpot-ms", "1")
    router = fault_router(
        tmp_path_factory.mktemp("harden"),
        [sim],
        serving={
            "header_timeout_s": HEADER_TIMEOUT_S,
            "keepalive_timeout_s": KEEPALIVE_S,
            "max_request_bytes": 65536,
        },
    )
    try:
        yield sim, router
    finally:
        router.stop()
        sim.stop()


def connect(router: Proc, timeout: float = 10.0) -> socket.socket:
    host, port = router.url[len("http://") :].split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def exchange(router: Proc, data: bytes, timeout: float = 10.0) -> tuple[bytes, bool, float]:
    """Send ``data``; read until the router closes or goes quiet: (bytes, closed, seconds)."""
    started = time.monotonic()
    with connect(router, timeout) as sock:
        sock.sendall(data)
        out, closed = b"", False
        try:
            while chunk := sock.recv(65536):
                out += chunk
            closed = True
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    return out, closed, time.monotonic() - started


def still_serving(router: Proc) -> None:
    status, _, raw = http(router.url, "POST", "/v1/chat/completions", BODY)
    assert status == 200, raw
    assert invariant_holds(metrics(router.url))


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def statuses_of(raw: bytes) -> list[int]:
    """The status of every response on a connection, in order."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


def error_code(raw: bytes) -> str:
    code: str = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]["code"]
    return code


SMUGGLING = {
    "content-length and transfer-encoding": POST
    + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
    "transfer-encoding and content-length": POST
    + b"transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
    "two different content-lengths": POST + b"content-length: 5\r\ncontent-length: 6\r\n\r\nabcdef",
    "the same content-length twice": POST + b"content-length: 2\r\ncontent-length: 2\r\n\r\n{}",
    "content-length list": POST + b"content-length: 5, 5\r\n\r\nabcde",
    "content-length with sign": POST + b"content-length: +5\r\n\r\nabcde",
    "negative content-length": POST + b"content-length: -5\r\n\r\nabcde",
    "content-length overflow": POST + b"content-length: 99999999999999999999999\r\n\r\n",
    "chunk size not hex": POST + b"transfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "chunk size overflow": POST
    + b"transfer-encoding: chunked\r\n\r\nffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
    "chunk size negative": POST + b"transfer-encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
    "chunk without its CRLF": POST + b"transfer-encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
    "unknown transfer coding": POST + b"transfer-encoding: gzip\r\n\r\nabc",
    "chunked not last": POST + b"transfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "lookalike chunked": POST + b"transfer-encoding: xchunked\r\n\r\n0\r\n\r\n",
    "obs-fold continuation": b"GET /health HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n b\r\n\r\n",
    "obs-fold content-length": POST + b"x-a: 1\r\ncontent-length:\r\n 5\r\n\r\nabcde",
    "space before the colon": b"GET /health HTTP/1.1\r\nhost : x\r\n\r\n",
    "NUL in a header value": b"GET /health HTTP/1.1\r\nhost: x\x00y\r\n\r\n",
    "bare LF line ends": b"GET /health HTTP/1.1\nhost: x\n\n",
    "bare CR line ends": b"GET /health HTTP/1.1\rhost: x\r\r",
    "control byte in the method": b"G\x01T /health HTTP/1.1\r\nhost: x\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
}


@pytest.mark.parametrize("name", list(SMUGGLING))
def test_ambiguous_framing_is_refused_and_closed(fleet: tuple[Proc, Proc], name: str) -> None:
    _, router = fleet
    out, closed, _ = exchange(router, SMUGGLING[name])
    assert status_of(out) == 400, out
    assert error_code(out) == "bad_request"
    assert b"connection: close" in out and closed
    assert out.count(b"HTTP/1.1") == 1  # nothing after the refusal was read as a request
    still_serving(router)


def test_header_limits_answer_431(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(101))
    cases = {
        "too many headers": b"GET /health HTTP/1.1\r\n" + many + b"\r\n",
        "one huge header": b"GET /health HTTP/1.1\r\nx-big: " + b"a" * 70000 + b"\r\n\r\n",
        "huge URL": b"GET /health?" + b"a" * 70000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",
        "huge completion headers": POST + b"x-big: " + b"a" * 70000 + b"\r\n\r\n",
    }
    for name, data in cases.items():
        out, closed, _ = exchange(router, data)
        assert status_of(out) == 431, (name, out[:200])
        assert error_code(out) == "header_too_large" and closed, name
    exactly = b"".join(b"x-h%d: v\r\n" % i for i in range(99))
    out, _, _ = exchange(router, b"GET /health HTTP/1.1\r\nhost: x\r\n" + exactly + b"\r\n", 1.0)
    assert status_of(out) == 200
    still_serving(router)


@pytest.mark.parametrize(
    "parts",
    [
        [b"GET /health HTTP/1.1\r\nho"],  # headers that never end
        [b"G", b"E", b"T", b" ", b"/", b"h", b"e", b"a", b"l"],  # a trickle, a byte at a time
        [POST + b"content-length: 100\r\n\r\n{"],  # a body that never ends
        [POST + b"content-length: 100\r\n\r\n{", b'"', b"m"],  # a body trickling in
        [b""],  # a connection that never sends anything
    ],
    ids=["headers", "header-trickle", "body", "body-trickle", "idle"],
)
def test_slow_clients_are_closed(fleet: tuple[Proc, Proc], parts: list[bytes]) -> None:
    _, router = fleet
    leaks = Leaks(router, [fleet[0]])
    started = time.monotonic()
    with connect(router, timeout=10) as sock:
        try:
            for part in parts:
                sock.sendall(part)
                time.sleep(0.3)
            got = sock.recv(65536)  # blocks until the router closes
        except (BrokenPipeError, ConnectionResetError):  # closed while the client still sent
            got = b""
        took = time.monotonic() - started
    assert got == b"", got
    limit = KEEPALIVE_S if parts == [b""] else HEADER_TIMEOUT_S
    assert limit - 0.1 < took < limit + 0.3 * len(parts) + 1.5, took
    leaks.check()  # a body left hanging was counted cancelled and released its retention slot
    still_serving(router)


def test_pipelined_flood_is_answered_in_order(fleet: tuple[Proc, Proc]) -> None:
    _, router = fleet
    paths = [b"/health", b"/v1/models", b"/nope"] * 400
    data = b"".join(b"GET %b HTTP/1.1\r\nhost: x\r\n\r\n" % p for p in paths)
    data += b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    out, closed, _ = exchange(router, data, timeout=30)
    assert closed
    statuses = statuses_of(out)
    assert statuses == [200, 200, 404] * 400 + [200]
    # completions pipelined between other requests: answered in order, every one counted
    before = metrics(router.url)["narwhal_offered_total"]
    one = POST + b"content-length: %d\r\n\r\n%b" % (len(BODY), BODY)
    data = (one + b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n") * 40 + b"GET /health HTTP/1.1\r\n"
    out, closed, _ = exchange(router, data + b"connection: close\r\n\r\n", timeout=30)
    statuses = statuses_of(out)
    assert statuses == [200, 404] * 40 + [200]
    assert metrics(router.url)["narwhal_offered_total"] - before == 40
    still_serving(router)


def test_pipelined_refusals_do_not_overflow_the_stack(
    fleet: tuple[Proc, Proc], tmp_path: Path
) -> None:
    """Thousands of refusals answered at arrival, queued behind one exchange (regression:
    they ran by recursion; the router hit RecursionError and dropped the connection)."""
    standby = fault_router(tmp_path, [fleet[0]], ha={"role": "standby"})
    try:
        one = POST + b"content-length: %d\r\n\r\n%b" % (len(BODY), BODY)
        data = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n" + one * 3000
        data += b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        out, closed, _ = exchange(standby, data, timeout=30)
        assert closed
        assert statuses_of(out) == [200] + [503] * 3000 + [200]
        m = metrics(standby.url)
        assert m['narwhal_rejected_total{reason="router_standby"}'] == 3000
        assert invariant_holds(m)
        assert not any("Traceback" in line for line in standby.lines)
    finally:
        standby.stop()


def test_a_client_that_never_reads_cannot_grow_router_memory(fleet: tuple[Proc, Proc]) -> None:
    """Pipelined /metrics requests from a client that reads nothing: the router answers only
    while the client's buffer drains (regression: it answered everything into memory)."""
    _, router = fleet
    pid = router.proc.pid
    request = b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n" * 200
    rss_before = rss_bytes(pid)
    sock = connect(router)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    until = time.monotonic() + 4
    while time.monotonic() < until:
        try:
            sock.send(request)
        except BlockingIOError:
            time.sleep(0.05)
    grown = rss_bytes(pid) - rss_before
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
    sock.close()
    assert grown < 8 << 20, grown
    still_serving(router)


def body_case(router: Proc, body: bytes) -> tuple[int, bytes, bool]:
    data = POST + b"content-length: %d\r\n\r\n%b" % (len(body), body)
    out, closed, _ = exchange(router, data, timeout=1.5)
    return status_of(out), out.partition(b"\r\n\r\n")[2], closed


HOSTILE_BODIES = {
    "invalid UTF-8": (b'{"model": "\xff\xfe", "messages": []}', "invalid_json"),
    "deeply nested arrays": (b"[" * 30000 + b"]" * 30000, "invalid_json"),
    "deeply nested objects": (b'{"a":' * 10000 + b"1" + b"}" * 10000, "invalid_json"),
    "a huge exponent": (BODY.replace(b'"max_tokens": 2', b'"max_tokens": 1e400'), "invalid_json"),
    "NaN": (BODY.replace(b'"max_tokens": 2', b'"max_tokens": NaN'), "invalid_json"),
    "a huge integer": (
        BODY.replace(b'"max_tokens": 2', b'"max_tokens": 999999999999999999999999999'),
        "invalid_request",
    ),
    "a huge negative integer": (
        BODY.replace(b'"max_tokens": 2', b'"max_tokens": -99999999999999999999999999'),
        "invalid_request",
    ),
    "a lone surrogate": (BODY.replace(b'"hi"', b'"\\ud800"'), None),
    "an empty body": (b"", "invalid_json"),
    "a JSON string": (b'"hello"', "invalid_request"),
    "trailing garbage": (BODY + b"}", "invalid_json"),
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_json_is_a_clean_400(fleet: tuple[Proc, Proc], name: str) -> None:
    _, router = fleet
    body, code = HOSTILE_BODIES[name]
    status, raw, closed = body_case(router, body)
    if code is None:
        assert status in (200, 400), raw  # the engine's business: the router passes it on
    else:
        assert status == 400, raw
        assert json.loads(raw)["error"]["code"] == code
    assert not closed  # the connection stays usable
    still_serving(router)


def test_duplicate_keys_mean_what_the_engine_reads(fleet: tuple[Proc, Proc]) -> None:
    """The last duplicate wins in the router, and the engine receives the router's reading,
    so the two can never disagree about a field (no parser differential)."""
    sim, router = fleet
    body = BODY.replace(b'"max_tokens": 2', b'"max_tokens": 3, "stream": true, "max_tokens": 5')
    body = body.replace(b'"stream": true', b'"stream": true, "stream": false')
    status, raw, _ = body_case(router, body)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["object"] == "chat.completion"  # stream: false, the last one
    assert answer["usage"]["completion_tokens"] == 5
    sent = wait_for(lambda: [r for r in sim_stats(sim)["recent"] if r["body"].get("max_tokens")])
    assert sent[-1]["body"]["max_tokens"] == 5
    assert raw.count(b'"max_tokens"') == 0


@pytest.mark.parametrize(
    "upgrade",
    [
        b"connection: upgrade\r\nupgrade: websocket",
        b"connection: Upgrade, HTTP2-Settings\r\n"
        b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA",
    ],
    ids=["websocket", "h2c"],
)
def test_upgrade_requests_are_answered_then_closed(
    fleet: tuple[Proc, Proc], upgrade: bytes
) -> None:
    """The router ignores Upgrade (as RFC 9110 allows): the request gets its answer over
    HTTP/1.1, then the connection closes (regression: it was closed with no answer at all,
    so ``curl --http2`` against the router got an empty reply)."""
    _, router = fleet
    out, closed, _ = exchange(
        router, b"GET /health HTTP/1.1\r\nhost: x\r\n" + upgrade + b"\r\n\r\n"
    )
    assert statuses_of(out) == [200] and closed
    assert b"connection: close" in out


def test_garbage_after_a_request_answers_it_first(fleet: tuple[Proc, Proc]) -> None:
    """A valid request, then bytes that are not HTTP: the request is answered, then the 400,
    then the connection closes (regression: the connection closed with neither)."""
    _, router = fleet
    one = POST + b"content-length: %d\r\n\r\n%b" % (len(BODY), BODY)
    out, closed, _ = exchange(router, one + b"\x00\x01 not http\r\n\r\n")
    assert statuses_of(out) == [200, 400] and closed
    # HTTP/1.0 without Content-Length: an empty body, then the JSON is not a request line
    out, closed, _ = exchange(router, b"POST /v1/chat/completions HTTP/1.0\r\n\r\n" + BODY)
    assert statuses_of(out) == [400] and closed
    assert b'"code":"invalid_json"' in out
    still_serving(router)
