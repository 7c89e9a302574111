"""``python -m narwhal.sim`` as a real process on a loopback port: the openai SDK, raw HTTP,
client disconnects, faults, run-time TPOT changes and clean shutdown."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import SimProcess, parse_response, wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MSG = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess("--tpot-ms", "2", "--prefill-overhead-ms", "1", "--output-len", "1000",
                    "--seed", "7") as proc:
        yield proc


@pytest.fixture
def client(sim: SimProcess) -> openai.OpenAI:
    reset(sim)
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="sim", max_retries=0, timeout=20)


def request(sim: SimProcess, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=20)
    try:
        payload = None if body is None else json.dumps(body).encode()
        conn.request(method, path, payload, {"content-type": "application/json",
                                             **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def stats(sim: SimProcess) -> dict[str, Any]:
    status, _, body = request(sim, "GET", "/sim/stats")
    assert status == 200
    result: dict[str, Any] = json.loads(body)
    return result


def reset(sim: SimProcess) -> None:
    assert request(sim, "POST", "/sim/reset")[0] == 200


def open_stream(sim: SimProcess, body: dict[str, Any], head: bytes = b"") -> socket.socket:
    """Send a chat request on a raw socket (extra header lines in ``head``); return it."""
    payload = json.dumps({"model": MODEL, "messages": MSG, "stream": True, **body}).encode()
    sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n%bcontent-length: %d"
                 b"\r\n\r\n%b" % (head, len(payload), payload))
    return sock


def event_times(sim: SimProcess, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> list[tuple[float, bytes]]:
    """Stream a request with http.client; return (arrival time, event line) pairs."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=20)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"content-type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200
        out = []
        for _ in range(100000):
            line = resp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                out.append((time.monotonic(), line.rstrip(b"\n")))
        return out
    finally:
        conn.close()


def test_ready_line_and_plain_routes(sim: SimProcess) -> None:
    assert sim.first_line == f"narwhal-sim listening on http://127.0.0.1:{sim.port}"
    status, headers, body = request(sim, "GET", "/health")
    assert status == 200 and body == b"" and headers["content-length"] == "0"
    status, _, body = request(sim, "GET", "/version")
    assert json.loads(body) == {"version": "0.32.0"}
    status, _, body = request(sim, "GET", "/nope")
    assert status == 404


def test_openai_streaming_chat(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=20, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 20
    ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra or {}).get(
        "token_ids") or []]
    assert len(ids) == 20


def test_openai_non_streaming_and_completions(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=MODEL, messages=MSG,  # type: ignore[arg-type]
                                          max_tokens=5)
    assert chat.choices[0].message.content and chat.usage is not None
    assert chat.usage.completion_tokens == 5 and chat.id.startswith("chatcmpl-")
    done = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6)
    assert done.choices[0].finish_reason == "length" and done.usage is not None
    assert done.usage.completion_tokens == 6
    parts = list(client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3,
                                           stream=True))
    assert sorted({p.choices[0].index for p in parts}) == [0, 1]
    assert [m.id for m in client.models.list()] == [MODEL]


def test_openai_tool_calls_assemble(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    chat = client.chat.completions.create(model=MODEL, messages=MSG,  # type: ignore[arg-type]
                                          tools=tools)
    call = chat.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "sim"}  # type: ignore[union-attr]
    assert chat.choices[0].finish_reason == "tool_calls"


def test_client_disconnect_counts_as_aborted(sim: SimProcess) -> None:
    reset(sim)
    sock = open_stream(sim, {"max_tokens": 5000, "ignore_eos": True})
    got = b""
    for _ in range(1000):
        got += sock.recv(65536)
        if got.count(b"data: ") >= 5:
            break
    assert wait_until(lambda: stats(sim)["running"] == 1)
    sock.close()
    assert wait_until(lambda: stats(sim)["aborted"] == 1)
    now = stats(sim)
    assert now["running"] == 0 and now["waiting"] == 0 and now["completed"] == 0
    assert now["recent"][-1]["outcome"] == "aborted"


def test_http_500_fault_through_the_sdk(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=MSG,  # type: ignore[arg-type]
                                       extra_headers={"X-Sim-Fault": "http_500"})
    assert info.value.status_code == 500
    # The next request, without the header, is served normally.
    assert client.chat.completions.create(model=MODEL, messages=MSG,  # type: ignore[arg-type]
                                          max_tokens=2).choices[0].message.content


def test_reset_mid_stream(sim: SimProcess) -> None:
    reset(sim)
    sock = open_stream(sim, {"max_tokens": 50, "return_token_ids": True},
                       b"x-sim-fault: reset_mid_stream:3\r\n")
    got, error = b"", None
    for _ in range(1000):
        try:
            data = sock.recv(65536)
        except ConnectionResetError as exc:
            error = exc
            break
        if not data:
            break
        got += data
    sock.close()
    assert isinstance(error, ConnectionResetError)
    r = parse_response(got)
    assert r.status == 200 and not r.complete
    assert stats(sim)["recent"][-1]["outcome"] == "fault:reset_mid_stream"


def test_malformed_json_and_error_event(sim: SimProcess) -> None:
    lines = [line for _, line in event_times(
        sim, {"model": MODEL, "messages": MSG, "max_tokens": 5, "stream": True},
        {"X-Sim-Fault": "malformed_json:1"})]
    broken = []
    for line in lines[:-1]:
        try:
            json.loads(line[6:])
        except json.JSONDecodeError:
            broken.append(line)
    assert len(broken) == 1 and lines[-1] == b"data: [DONE]"
    lines = [line for _, line in event_times(
        sim, {"model": MODEL, "messages": MSG, "max_tokens": 9, "stream": True},
        {"X-Sim-Fault": "error_event:2"})]
    assert lines[-2].startswith(b'data: {"error": {"message": "Internal server error"')
    assert lines[-1] == b"data: [DONE]" and len(lines) == 5


def test_sim_config_changes_tpot(sim: SimProcess) -> None:
    # ~58 gaps: a stall of the simulator or this reader (even ~0.5 s) moves no mean past
    # its bound.
    body = {"model": MODEL, "messages": MSG, "max_tokens": 61, "stream": True}

    def mean_gap() -> float:
        times = [t for t, _ in event_times(sim, body)][2:-1]  # after the first token
        return (times[-1] - times[0]) / (len(times) - 1)

    try:
        fast = mean_gap()
        status, _, cfg = request(sim, "POST", "/sim/config", {"tpot_ms": 25})
        assert status == 200 and json.loads(cfg)["tpot_ms"] == 25
        slow = mean_gap()
    finally:
        request(sim, "POST", "/sim/config", {"tpot_ms": 2})
    assert fast < 0.012 and 0.022 <= slow <= 0.05, (fast, slow)
    status, _, _ = request(sim, "POST", "/sim/config", {"tpot_ms": -1})
    assert status == 400


def test_metrics_report_running_requests(sim: SimProcess) -> None:
    reset(sim)
    assert request(sim, "POST", "/sim/config", {"tpot_ms": 20})[0] == 200
    try:
        socks = [open_stream(sim, {"max_tokens": 40}) for _ in range(3)]

        def running() -> bool:
            text = request(sim, "GET", "/metrics")[2].decode()
            return f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0' in text

        assert wait_until(running)
        for s in socks:
            s.close()
    finally:
        request(sim, "POST", "/sim/config", {"tpot_ms": 2})
    assert wait_until(lambda: stats(sim)["aborted"] == 3)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly(sig: int) -> None:
    proc = SimProcess("--tpot-ms", "5")
    with proc:
        assert request(proc, "GET", "/health")[0] == 200
        assert proc.stop(sig) == 0
    assert proc.proc is not None and proc.proc.returncode == 0


def test_exit_with_parent_leaves_no_orphan() -> None:
    spawner = ("import subprocess, sys\n"
               "p = subprocess.Popen([sys.executable, '-m', 'narwhal.sim', '--port', '0',"
               " '--exit-with-parent'], stdout=subprocess.PIPE)\n"
               "print(p.stdout.readline().decode().split()[-1], flush=True)\n")
    out = subprocess.run([sys.executable, "-c", spawner], capture_output=True, timeout=30,
                         check=True).stdout.decode().strip()
    port = int(out.rsplit(":", 1)[1])

    def gone() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return True
        return False

    assert wait_until(gone, timeout=10)
