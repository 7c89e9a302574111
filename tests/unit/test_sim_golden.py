"""Golden bytes: the simulator's answers to the captured vLLM 0.32 requests, masked, equal the
captures (``tests/data/transcripts``) event for event and header for header."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.simproc import Harness, RawResponse

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data/transcripts"


@dataclass
class Section:
    title: str
    path: str
    body: dict[str, Any]
    status: int = 0
    headers: list[str] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)  # SSE events or the one JSON body


def load_sections() -> list[Section]:
    sections: list[Section] = []
    for name in ("chat_stream.txt", "completions.txt", "nonstream.txt"):
        current: Section | None = None
        in_head = False
        for raw in (TRANSCRIPTS / name).read_bytes().split(b"\n"):
            line = raw.rstrip(b"\r")
            if line.startswith(b"################"):
                current = None
                title = line.strip(b"# ").decode()
                continue
            if line.startswith(b"$ curl"):
                text = line.decode()
                url = next(w for w in text.split() if w.startswith("http://"))
                data = text.split(" -d ", 1)[1].strip().strip("'")
                current = Section(title, "/" + url.split("/", 3)[3], orjson.loads(data))
                sections.append(current)
                in_head = False
                continue
            if current is None:
                continue
            if line.startswith(b"HTTP/1.1 "):
                current.status = int(line.split()[1])
                in_head = True
            elif in_head:
                if line:
                    current.headers.append(line.decode().split(":", 1)[0].lower())
                else:
                    in_head = False
            elif line.startswith((b"data: ", b"{")):
                current.lines.append(line)
    return sections


SECTIONS = load_sections()
UNSUPPORTED = {"n=2": "n=1 only"}
# Lists as long as the prompt (the simulator's tokenizer is not the captured model's).
PROMPT_LONG = ("top_logprobs", "prompt_logprobs")


def mask(value: Any, key: str = "") -> Any:
    """Replace what legitimately differs (ids, times, text, token ids, numbers) by markers."""
    if isinstance(value, dict):
        if key == "top_logprobs" or (value and all(isinstance(v, float) for v in value.values())):
            return f"<top:{len(value)}>"
        if key == "prompt_logprobs":  # {token id: {logprob, rank, decoded_token}}
            return f"<prompt:{len(value)}:{[list(v) for v in value.values()]}>"
        return {k: mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if key in ("token_ids", "prompt_token_ids", "bytes", "text_offset", "token_logprobs",
                   "tokens"):
            return "<list>"
        masked = [mask(v, key) for v in value]
        if key in PROMPT_LONG:  # each run of equal entries once: the shape, not the length
            return [v for i, v in enumerate(masked) if i == 0 or v != masked[i - 1]]
        return masked
    if key == "id" and isinstance(value, str):
        return value.rsplit("-", 1)[0] + "-<id>"
    if key in ("content", "text", "token", "system_fingerprint") and isinstance(value, str):
        return "<str>"
    if key in ("created", "prompt_tokens", "total_tokens", "completion_tokens") or isinstance(
            value, float):
        return 0
    return value


def masked(line: bytes) -> bytes:
    prefix = b"data: " if line.startswith(b"data: ") else b""
    payload = line[len(prefix):]
    if payload == b"[DONE]":
        return line
    return prefix + orjson.dumps(mask(orjson.loads(payload)))


def canonical(line: bytes) -> bool:
    """Compact JSON, raw UTF-8: what pydantic's model_dump_json and Starlette write."""
    payload = line[6:] if line.startswith(b"data: ") else line
    return payload == b"[DONE]" or orjson.dumps(orjson.loads(payload)) == payload


def run(section: Section) -> RawResponse:
    async def go() -> RawResponse:
        harness = Harness()
        try:
            response, _ = await harness.request("POST", section.path, section.body)
            return response
        finally:
            harness.close()

    return asyncio.run(go())


def by_choice(lines: list[bytes]) -> list[bytes]:
    """Order events by choice index (stable), for multi-prompt streams whose interleaving
    depends on timing."""
    def index(line: bytes) -> int:
        if line == b"data: [DONE]":
            return 1 << 30
        choices = orjson.loads(line[6:]).get("choices") or [{"index": 1 << 29}]
        return int(choices[0]["index"])

    return sorted(lines, key=index)


def test_transcripts_were_found() -> None:
    assert len(SECTIONS) == 11
    assert all(s.status == 200 and s.lines for s in SECTIONS)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("section", SECTIONS, ids=[s.title[:60] for s in SECTIONS])
def test_bytes_match_capture(section: Section) -> None:
    skip = [why for marker, why in UNSUPPORTED.items() if marker in section.title]
    if skip:
        pytest.skip(skip[0])
    response = run(section)
    assert response.complete and response.status == section.status
    names = [name for name, _ in response.headers]
    assert names == section.headers
    streaming = section.body.get("stream") is True
    if streaming:
        assert response.chunks is not None
        ours = [c.rstrip(b"\n") for c in response.chunks]
        # One SSE event per HTTP chunk, each ending with a blank line.
        assert all(c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in response.chunks)
    else:
        ours = [response.body]
    assert all(canonical(line) for line in ours)
    assert all(canonical(line) for line in section.lines)
    want = [masked(line) for line in section.lines]
    got = [masked(line) for line in ours]
    if isinstance(section.body.get("prompt"), list) and isinstance(section.body["prompt"][0], str):
        want, got = by_choice(want), by_choice(got)
    assert got == want


@pytest.mark.timeout(30)
def test_n_above_one_is_refused_in_vllm_error_shape() -> None:
    section = next(s for s in SECTIONS if "n=2" in s.title)
    response = run(section)
    assert response.status == 400
    error = response.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == "n"
