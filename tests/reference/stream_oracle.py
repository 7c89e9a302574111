"""Pure-Python reference of the Rust StreamSession: readable and slow, for tests only.

Same interface and semantics as ``narwhal._narwhal_fast.StreamSession``. Where exposure
rewrites an event it re-serialises the JSON compactly (``json.dumps`` with
``ensure_ascii=False``), so byte equality with the Rust path holds for canonical compact
engine JSON, which is what the property tests generate.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

from .assemble_oracle import Assembler
from .chunked_oracle import ChunkedDecoder, ChunkError, frame_chunk
from .oracle_json import (
    OUTPUT_KEYS,
    U64_MAX,
    StreamError,
    delta_of,
    dumps,
    is_uint,
    malformed,
    noun,
    want,
)
from .resume_oracle import Resume

MAX_EVENT_BYTES = 16 << 20
OPEN, DONE, FAILED = 0, 1, 2
# pump() flags (narwhal_core::session::pump_flags)
BODY_ENDED, MALFORMED, TOKENS, STATE, WRITE_FAILED = 1, 2, 4, 8, 16
DONE_BYTES = b"data: [DONE]\n\n"
_EOL = re.compile(rb"[\r\n]")


class SseFramer:
    """text/event-stream lines (LF, CRLF, CR; split anywhere) into (payload, data lines)."""

    def __init__(self) -> None:
        self.line = b""
        self.data: list[bytes] = []
        self.skip_lf = False

    def data_len(self) -> int:
        return sum(map(len, self.data)) + max(0, len(self.data) - 1)

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, int]]:
        pos = 0
        if self.skip_lf and chunk:
            pos = 1 if chunk[:1] == b"\n" else 0
            self.skip_lf = False
        while pos < len(chunk):
            m = _EOL.search(chunk, pos)
            if m is None:
                self.line += chunk[pos:]
                if len(self.line) + self.data_len() > MAX_EVENT_BYTES:
                    raise malformed(f"engine event exceeds {MAX_EVENT_BYTES} bytes")
                return
            eol = nxt = m.start()
            nxt += 1
            if chunk[eol] == 0x0D:
                if eol + 1 == len(chunk):
                    self.skip_lf = True
                elif chunk[eol + 1] == 0x0A:
                    nxt += 1
            line, self.line = self.line + chunk[pos:eol], b""
            event = self.line_done(line)
            if event is not None:
                yield event
            if self.data_len() > MAX_EVENT_BYTES:
                raise malformed(f"engine event exceeds {MAX_EVENT_BYTES} bytes")
            pos = nxt

    def line_done(self, line: bytes) -> tuple[bytes, int] | None:
        if not line:
            if not self.data:
                return None
            event = (b"\n".join(self.data), len(self.data))
            self.data = []
            return event
        if line.startswith(b"data:"):
            value = line[5:]
        elif line == b"data":
            value = b""
        else:
            return None  # comments, event:/id:/retry:, unknown fields
        self.data.append(value[1:] if value.startswith(b" ") else value)
        return None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_event(payload: bytes) -> dict[str, Any]:
    """JSON, UTF-8 and the field types the router reads (the Rust parser's checks)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed("engine event is not valid UTF-8") from None
    try:
        ev = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise malformed(f"engine event is not valid: {e}") from None
    if not isinstance(ev, dict):
        raise malformed("engine event is not valid: not an object")
    want(ev.get("usage"), dict, "usage")
    for c in want(ev.get("choices"), list, "choices") or []:
        if not isinstance(c, dict):
            raise malformed("engine event is not valid: each choice must be an object")
        want(c.get("text"), str, "text")
        want(c.get("finish_reason"), str, "finish_reason")
        delta = want(c.get("delta"), dict, "delta") or {}
        for key in ("role", "content", "reasoning", "reasoning_content", "refusal"):
            want(delta.get(key), str, f"delta.{key}")
        want(delta.get("tool_calls"), list, "delta.tool_calls")
        want(delta.get("function_call"), dict, "delta.function_call")
    return ev


def is_error(ev: dict[str, Any]) -> bool:
    return ev.get("error") is not None or ev.get("object") == "error"


def error_message(ev: dict[str, Any]) -> str:
    err = ev.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    if isinstance(err, str):
        return err
    if isinstance(ev.get("message"), str):
        return str(ev["message"])
    return "engine reported an error"


def validate_ids(ids: object, what: str) -> int:
    """A list of nonnegative integers within u64; returns how many."""
    if not isinstance(ids, list):
        raise malformed(f"{what} must be a list of nonnegative integers, got {noun(ids)}")
    for i, v in enumerate(ids):
        if isinstance(v, bool):
            raise malformed(f"{what}[{i}] is a Boolean ({json.dumps(v)}), not an integer")
        if isinstance(v, float):
            raise malformed(f"{what}[{i}] is not an integer ({v!r})")
        if not isinstance(v, int):
            kind = "a nested list" if isinstance(v, list) else noun(v)
            raise malformed(f"{what}[{i}] is {kind}, not an integer")
        if v < 0:
            raise malformed(f"{what}[{i}] is negative ({v})")
        if v > U64_MAX:
            raise malformed(f"{what}[{i}] exceeds the 64-bit range ({v})")
    return len(ids)


def carries_output(choice: dict[str, Any]) -> bool:
    delta = delta_of(choice)
    return choice.get("text") is not None or (
        delta.get("role") is None and any(delta.get(k) is not None for k in OUTPUT_KEYS)
    )


def is_usage_only(ev: dict[str, Any]) -> bool:
    return ev.get("usage") is not None and ev.get("choices") == []


def is_id_only(ev: dict[str, Any]) -> bool:
    choices = ev.get("choices") or []
    return (
        ev.get("usage") is None
        and len(choices) > 0
        and all(
            c.get("finish_reason") is None
            and c.get("logprobs") is None
            and all(v is None for v in delta_of(c).values())
            for c in choices
        )
    )


REASONING_KEYS = ("reasoning", "reasoning_content")


def is_emptied_by_strip(ev: dict[str, Any]) -> bool:
    """include_reasoning false: no choice keeps a finish reason or a non-reasoning value."""
    choices = ev.get("choices") or []
    return len(choices) > 0 and all(
        c.get("finish_reason") is None
        and all(v is None for k, v in delta_of(c).items() if k not in REASONING_KEYS)
        for c in choices
    )


def is_echo_chunk(choice: dict[str, Any]) -> bool:
    """vLLM's chat echo chunk: content only, no IDs, no finish reason."""
    delta = delta_of(choice)
    return (
        choice.get("token_ids") is None
        and choice.get("finish_reason") is None
        and delta.get("content") is not None
        and all(v is None for k, v in delta.items() if k != "content")
    )


def sse(payload: bytes) -> bytes:
    return b"data: " + payload.replace(b"\n", b"\ndata: ") + b"\n\n"


class StreamSession:
    """One engine attempt: feed() each network read; same interface as the Rust class."""

    def __init__(
        self,
        route: str,
        *,
        assemble: bool,
        expose_token_ids: bool,
        drop_usage: bool,
        require_token_ids: bool,
        prompt_tokens: int = 0,
        strip_reasoning: bool = False,
        echo: bool = False,
        model: str | None = None,
    ) -> None:
        if route not in ("chat", "completion"):
            raise ValueError(f'route must be "chat" or "completion", got {route!r}')
        self.chat = route == "chat"
        self.assemble, self.expose, self.drop_usage = assemble, expose_token_ids, drop_usage
        self.require, self.prompt_tokens = require_token_ids, prompt_tokens
        self.strip = self.chat and strip_reasoning
        self.echo, self.echo_open = echo, self.chat and echo
        self.framer = SseFramer()
        self.asm = (
            Assembler(self.chat, expose_token_ids, strip_reasoning=self.strip, echo=echo)
            if assemble
            else None
        )
        self.model = model  # the client's name for the model: every `model` reads it
        if self.asm is not None and model is not None:
            self.asm.meta["model"] = model
        self.state = OPEN
        self.failure: tuple[str, str] | None = None
        self.engine_error: bytes | None = None
        self.engine_error_message: str | None = None
        self.engine_usage_completion_tokens: int | None = None
        self.engine_prompt_tokens: int | None = None  # the first prompt ID list, or usage
        self.engine_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
        self.events = self.ids_total = self.output_events = 0
        self.out = bytearray()
        self.held = b""  # drop_usage: the last finish event, waiting for a fingerprint
        self.read_count = 0
        self.resume_state: Resume | None = None  # with enable_resume()
        # pump(): the engine body's chunked framing, the client's writer, the token tally
        self.decoder = ChunkedDecoder()
        self.framing_error: str | None = None
        self.watch_tokens = False
        self.writer: Any = None
        self.tally: Any = None
        self.tally_tokens = 0
        self.last_token_at = 0.0
        self.clock: Any = None  # time.monotonic, unless a test sets another

    @property
    def output_tokens(self) -> int:
        if self.engine_usage_completion_tokens is not None:
            return self.engine_usage_completion_tokens
        return self.ids_total if self.require else self.output_events

    @property
    def started(self) -> bool:
        return self.events > 0

    # -- resuming on another engine (resume_oracle.py) -------------------------------------
    def enable_resume(self) -> None:
        """Keep what a continuation needs; hold back an engine error event while the answer
        can still go on (state failed, code engine_error, nothing written)."""
        self.resume_state = Resume()

    def resume_point(self) -> tuple[bytes, int] | None:
        """(the continuation's token-ID prompt as a JSON list, IDs generated so far); None
        when finished, failed on the engine's output (only a break or a held-back error event
        can go on), or the answer is more than plain generated text."""
        r = self.resume_state
        if r is None or self.state == DONE or not r.ready():
            return None
        if self.failure is not None and self.failure[0] != "engine_error":
            return None
        return r.prompt_json(), self.ids_total

    def resume(self) -> bool:
        """Read the continuation engine's completion stream from its first byte on."""
        if self.resume_point() is None:
            return False
        assert self.resume_state is not None
        self.framer = SseFramer()
        self.state, self.failure = OPEN, None
        self.engine_error = self.engine_error_message = None
        self.resume_state.begin(self.ids_total)
        return True

    # -- reading the engine ----------------------------------------------------------------
    def feed(self, data: bytes) -> tuple[bytes, int, int]:
        self.out, self.read_count = bytearray(), 0
        self.feed_piece(data)
        return bytes(self.out), self.read_count, self.state

    def feed_piece(self, data: bytes) -> None:
        if self.state == OPEN:
            try:
                for payload, lines in self.framer.feed(data):
                    if not self.on_event(payload, lines):
                        break
            except StreamError as e:
                self.fail(e)

    # -- pumping the raw chunked body (the fast path) --------------------------------------
    def start_pump(self, writer: Any, tally: Any = None) -> None:
        self.tally_tokens = tally.tokens if tally is not None else 0
        self.writer, self.tally = writer, tally
        self.decoder, self.framing_error = ChunkedDecoder(), None

    def stop_pump(self) -> None:
        self.writer = self.tally = None

    def pump(self, data: bytes) -> int:
        """One raw read of the chunked body: fed as by feed(); while the state stays open the
        output is written framed as the client's chunk, else left in last_read()."""
        self.out, self.read_count = bytearray(), 0
        before, flags = self.state, 0
        try:
            self.decoder.feed(data, self.feed_piece)
        except ChunkError as e:
            flags |= MALFORMED
            self.framing_error = str(e)
        if self.decoder.done:
            flags |= BODY_ENDED
        if self.state != before:
            return flags | STATE
        tokens = self.read_count
        if tokens:
            if self.watch_tokens:
                self.watch_tokens = False
                flags |= TOKENS
            self.last_token_at = (self.clock or time.monotonic)()
            if self.tally is not None:
                self.tally_tokens += tokens
                self.tally.tokens = self.tally_tokens
        if self.out and self.writer is not None:
            try:
                self.writer(frame_chunk(bytes(self.out)))
            except Exception:
                self.writer = None
                flags |= WRITE_FAILED
        return flags

    def last_read(self) -> tuple[bytes, int, int]:
        return bytes(self.out), self.read_count, self.state

    def fail(self, e: StreamError) -> None:
        self.release_held()
        self.state, self.failure = FAILED, (e.code, e.message)

    def release_held(self) -> None:
        self.out += self.held
        self.held = b""

    def on_event(self, payload: bytes, lines: int) -> bool:
        if payload == b"[DONE]":
            self.state = DONE
            if not self.assemble:
                self.release_held()
                self.out += DONE_BYTES
            return False
        try:
            if self.resume_state is not None and self.resume_state.continuing:
                self.process_continued(payload, lines)
            else:
                self.process(payload, lines)
        except StreamError as e:
            self.fail(e)
            return False
        return True

    def process_continued(self, payload: bytes, lines: int) -> None:
        """A continuation engine's event, in this stream's shape first (errors as they are)."""
        ev = parse_event(payload)
        assert self.resume_state is not None
        if is_error(ev):
            self.process(payload, lines)
        else:
            self.process(self.resume_state.rewrite(ev, self.chat), 1)

    def process(self, payload: bytes, lines: int) -> None:
        ev = parse_event(payload)
        if is_error(ev):
            if self.engine_error is None:
                self.engine_error, self.engine_error_message = payload, error_message(ev)
            if self.resume_state is not None and self.resume_state.ready():
                # Held back: the answer may go on on another engine.
                raise StreamError("engine_error", error_message(ev))
            if not self.assemble:
                self.release_held()
                self.out += sse(payload)
            self.events += 1
            return
        ids, carrying, prompt = self.check_ids(ev)
        usage = ev.get("usage") or {}
        completion_tokens = usage.get("completion_tokens")
        if completion_tokens is not None and not is_uint(completion_tokens):
            raise malformed(
                f"usage.completion_tokens must be a nonnegative integer, got {completion_tokens!r}"
            )
        if self.asm is not None:
            self.asm.prepare(ev)
        if self.resume_state is not None:
            self.resume_state.accept(ev)  # nothing below fails or has edited the event yet
        if self.asm is not None:
            self.asm.apply(ev)
        else:
            self.expose_event(payload, ev)
        self.events += 1
        self.ids_total += ids
        self.output_events += carrying
        self.read_count += ids if self.require else int(carrying)
        if completion_tokens is not None:
            self.engine_usage_completion_tokens = completion_tokens
        if self.engine_prompt_tokens is None:
            self.engine_prompt_tokens = prompt
        if is_uint(usage.get("prompt_tokens")):
            self.engine_prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and is_uint(details.get("cached_tokens")):
            self.engine_cached_tokens = details["cached_tokens"]

    def check_ids(self, ev: dict[str, Any]) -> tuple[int, bool, int | None]:
        """(IDs, the event carries output, the length of its first prompt ID list)."""
        prompt = None
        if ev.get("prompt_token_ids") is not None:
            prompt = validate_ids(ev["prompt_token_ids"], "prompt_token_ids")
        ids, carrying = 0, False
        for c in ev.get("choices") or []:
            out = carries_output(c) and not (self.echo_open and is_echo_chunk(c))
            carrying |= out
            if c.get("token_ids") is not None:
                ids += validate_ids(c["token_ids"], "token_ids")
            elif out and self.require:
                raise malformed(
                    "an event carrying generated output has no token_ids (missing or null)"
                )
            if c.get("prompt_token_ids") is not None:
                count = validate_ids(c["prompt_token_ids"], "prompt_token_ids")
                prompt = count if prompt is None else prompt
        if carrying:
            self.echo_open = False
        return ids, carrying, prompt

    def expose_event(self, payload: bytes, ev: dict[str, Any]) -> None:
        if self.drop_usage:
            if is_usage_only(ev):
                fp = ev.get("system_fingerprint")
                if fp is not None and self.held:  # where vLLM puts it without usage
                    end = self.held.rindex(b"}")
                    stamp = b',"system_fingerprint":' + dumps(fp)
                    self.held = self.held[:end] + stamp + self.held[end:]
                self.release_held()
                return
            self.release_held()
        written = self.exposed(payload, ev)
        finishes = any(c.get("finish_reason") is not None for c in ev.get("choices") or [])
        if self.drop_usage and ev.get("system_fingerprint") is None and finishes:
            self.held = written
        else:
            self.out += written

    def exposed(self, payload: bytes, ev: dict[str, Any]) -> bytes:
        """The event as the client sees it (b"" when it would not have had it)."""
        renamed = self.model is not None and ev.get("model") not in (None, self.model)
        if renamed:
            ev["model"] = self.model
        if self.strip:
            if is_emptied_by_strip(ev):
                return b""
        elif self.expose:
            return sse(dumps(ev) if renamed else payload)
        elif self.chat and is_id_only(ev):
            return b""
        nulled = ["token_ids"]
        if self.strip:
            nulled.append("logprobs")
        if not self.expose and (self.chat or not self.echo):
            nulled.append("prompt_token_ids")  # completions echo: vLLM sends them unasked
        rewrite = renamed
        if not self.expose and ev.get("prompt_token_ids") is not None:
            ev["prompt_token_ids"], rewrite = None, True
        for c in ev.get("choices") or []:
            delta = c.get("delta")
            if self.strip and isinstance(delta, dict):
                for key in REASONING_KEYS:
                    if delta.get(key) is not None:
                        del delta[key]
                        rewrite = True
            for key in nulled:
                if c.get(key) is not None:
                    c[key], rewrite = None, True
        return sse(dumps(ev) if rewrite else payload)

    def finish(self) -> bytes:
        if self.asm is None:
            raise ValueError("finish() is only available in assemble mode")
        if self.engine_error_message is not None:
            raise StreamError("engine_error", self.engine_error_message)
        if self.failure is not None:
            raise StreamError(*self.failure)
        if self.state != DONE:
            raise malformed("engine stream ended before [DONE]")
        return self.asm.body(self.prompt_tokens, self.output_tokens)
