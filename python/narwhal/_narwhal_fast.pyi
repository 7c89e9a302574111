"""Typed stubs for the Rust extension narwhal._narwhal_fast (checked with mypy.stubtest)."""

import os
from collections.abc import Callable, Sequence
from typing import Any, final

__all__ = [
    "BUILD_PROFILE",
    "Board",
    "PrefixIndex",
    "PrefixProbe",
    "Slot",
    "SpanEncoder",
    "StreamError",
    "StreamSession",
    "Ticket",
    "__version__",
    "acquire_slot",
]

__version__: str
BUILD_PROFILE: str
"""The Cargo profile kind the extension was compiled with: "release" or "debug"."""

# --- accounting board (rust/narwhal_core/src/counters.rs) --------------------------------

@final
class Board:
    """Counters, gauges, histograms and slots; private, or a shared /dev/shm file.

    path None: private to this process. path given: create=True makes a fresh file
    (replacing a stale one; the parent, before starting workers), create=False attaches
    to it (each worker) and checks magic, layout version, size and engine count.
    Raises OSError (file) or ValueError (layout; engines outside 1..4096; all 64 process
    rows held by live processes).
    """

    def __new__(
        cls, engines: int = 256, path: str | os.PathLike[str] | None = None, create: bool = True
    ) -> Board: ...
    def arrive(self, retention_limit: int) -> tuple[Ticket, bool]:
        """One offered request: offered += 1 and retained += 1, atomically. The bool:
        whether it took a retention place (fewer than retention_limit admitted requests
        were retained); either way the ticket is retained until finished."""
    def acquire_slot(
        self, engine: int, phase: str, limit: int, total_limit: int | None = None
    ) -> Slot | None:
        """phase "prefill" | "decode": a slot if fewer than limit of that phase (and, given
        total_limit, fewer than total_limit of both phases together) are in flight on the
        engine (checked and taken atomically across processes), else None."""
    def queued(self) -> int:
        """Requests waiting in the admission queues of every process (lock-free)."""
    def inflight(self, engine: int) -> tuple[int, int]:
        """(prefill, decode) in flight on the engine across every process (lock-free)."""
    def set_engine_up(self, engine: int, up: bool) -> None: ...
    def observe(self, histogram: str, value: float) -> None:
        """histogram: "ttft" | "tpot" | "queue_wait" | "e2e" | "output_tokens" (seconds or
        tokens). ValueError on an unknown name or a non-finite value."""
    def snapshot(self) -> dict[str, Any]:
        """The board at one instant (counters, reasons and engines read under the lock):
        offered, unsized_offered, offered_prompt_tokens, retained, retention_held, queued,
        cancelled, completed: int; rejected, refused, invalid_requests, expired, failed:
        dict[reason, int] (nonzero only); engines: list[{"prefill": int, "decode": int,
        "up": bool}] by index; histograms: {name: {"buckets": [(le, cumulative count), ...
        ending with (inf, count)], "sum": float, "count": int}}; reaped (dead workers'
        requests finished as cancelled, included in cancelled), workers (processes holding
        a row), lock_steals: int."""
    def reap_dead(self) -> int:
        """Finishes the requests of processes that died holding them (as cancelled), gives
        back their queue places and slots; returns the requests reaped. Runs on every
        attach; the parent should call it when a worker exits."""
    def unlink(self) -> None:
        """Remove the shared file (the parent, at shutdown); no-op when private or gone."""
    @property
    def engines(self) -> int: ...
    @property
    def path(self) -> str | None: ...

@final
class Ticket:
    """One retained request: a guard. Dropping it unfinished finishes it as cancelled."""

    def sized(self, prompt_tokens: int) -> None:
        """Marks it sized; offered_prompt_tokens += prompt_tokens (first call only)."""
    def enqueue(self, queue_limit: int) -> bool:
        """Takes a queue place if queued < queue_limit (atomic). True if held (a second
        call does not take another); False once finished."""
    def dequeue(self) -> None:
        """Gives the queue place back; idempotent."""
    def finish(self, cls: str, reason: str | None = None) -> bool:
        """Exactly once: counts cls{reason}, releases retention and queue places, counts
        unsized_offered if sized() never ran. cls: rejected | refused | invalid_requests |
        expired | failed (reason = a SPEC §12 error code or engine_rejected) | cancelled |
        completed (no reason). False if already finished; ValueError on a bad cls/reason."""
    @property
    def finished(self) -> bool: ...
    @property
    def admitted(self) -> bool:
        """Whether arrive() gave it a retention place."""
    @property
    def queued(self) -> bool: ...

@final
class Slot:
    """One phase slot on one engine: a guard. Dropping it releases it."""

    def release(self) -> bool:
        """Idempotent: True the first time."""
    @property
    def released(self) -> bool: ...
    @property
    def engine(self) -> int: ...
    @property
    def phase(self) -> str: ...

def acquire_slot(board: Board, engine: int, phase: str, limit: int) -> Slot | None:
    """Same as board.acquire_slot(engine, phase, limit)."""

# --- stream core (rust/narwhal_core/src/session.rs and friends) ---------------------------

class StreamError(ValueError):
    """An engine stream failed or cannot be assembled. code: malformed_engine_output |
    unsupported_engine_field | engine_error; message: what was wrong."""

    code: str
    message: str

@final
class StreamSession:
    """One engine attempt's response body, fed one network read at a time.

    route "chat" | "completion" (ValueError otherwise). assemble: build one non-streaming
    body (finish()) instead of forwarding events. expose_token_ids: the client asked for
    return_token_ids (else token_ids/prompt_token_ids become null and ID-only chat events
    are dropped). drop_usage: drop usage-only frames (a finish event waits for the dropped
    frame's system_fingerprint, placed last in it as vLLM does without usage; it goes out
    with the next output whatever that is). require_token_ids: every event
    carrying generated output must carry a valid token_ids list. prompt_tokens: for usage
    computed when the engine sends none. strip_reasoning (chat): the client sent
    include_reasoning false and the engine was asked with reasoning; as vLLM with its parsers
    on, reasoning leaves every delta (events left empty are dropped), token_ids and logprobs
    are null everywhere (prompt_token_ids still follow expose_token_ids), while the IDs are
    still validated and counted. echo: the client sent echo true; chat: vLLM's echo chunk
    (prompt text right after the role chunk, no IDs) is accepted without IDs and not
    counted, and the assembled content is never null; completions: the echo chunk's
    prompt_token_ids, which vLLM sends even when not asked, are kept. model: the name the
    client sent (an alias): the top-level model of every event, where it names another
    model, and of the assembled body becomes it (None: as the engine sent it).
    """

    def __new__(
        cls,
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
    ) -> StreamSession: ...
    def feed(self, data: bytes) -> tuple[bytes, int, int]:
        """One engine read (de-chunked body bytes, any split). Returns (bytes to write to
        the client now, b"" when assembling; token IDs validated in this read, or without
        require_token_ids the events carrying output; state 0 open, 1 done ([DONE] seen),
        2 failed). After done or failed: (b"", 0, state)."""
    def finish(self) -> bytes:
        """Assemble mode: the vLLM-shaped non-streaming body. StreamError (engine_error,
        malformed_engine_output, unsupported_engine_field) when the stream reported an
        error, failed, ended before [DONE], or a tool call lacks an id or name; ValueError
        when not assembling."""
    def start_pump(self, writer: Callable[[bytes], object], tally: Any = None) -> None:
        """Pump the engine's raw chunked body from a chunk boundary on: each pump() writes
        the client's chunk to ``writer`` (the client transport's write) and adds its tokens
        to ``tally.tokens`` (an object with an int ``tokens``, read now)."""
    def stop_pump(self) -> None:
        """Drop the writer and the tally."""
    def pump(self, data: bytes) -> int:
        """One raw engine read of a chunked body (any split): de-chunked and fed as by feed().
        While the state stays open its output goes to the writer as one chunk of the
        client's chunked body. Returns flags: 1 the body's last chunk arrived, 2 malformed
        chunked framing (framing_error says how; with 1: bytes after the end), 4 tokens
        came while watch_tokens was set (now cleared), 8 the state changed in this read
        (nothing written, not counted: last_read() holds it), 16 the writer raised (no more
        writes). 0: nothing for the caller to do."""
    def last_read(self) -> tuple[bytes, int, int]:
        """The last feed or pump as feed() returns it (the output unframed)."""
    watch_tokens: bool
    """pump() reports (flag 4) the next read with tokens, once."""
    @property
    def last_token_at(self) -> float:
        """time.monotonic() of the last pumped read that had tokens; 0.0 before any."""
    @property
    def framing_error(self) -> str | None:
        """Why pump() found the chunked framing malformed."""
    def enable_resume(self) -> None:
        """Keep what resuming the answer on another engine needs (prompt and generated IDs,
        the first event's id/created/model/index), and stop (state failed, code
        engine_error, nothing written; engine_error holds the event) at an engine error
        event while the answer can resume. Call before the first feed."""
    def resume_point(self) -> tuple[bytes, int] | None:
        """(the continuation's token-ID prompt as a JSON list: prompt IDs then generated
        IDs; the number generated), or None when the answer cannot resume (not enabled,
        finished, or its output so far is more than plain generated text on one choice)."""
    def resume(self) -> bool:
        """Read the continuation engine's completion stream from its first byte on: its
        events come out in this stream's shape (same id, created, model, choice index; its
        usage counts the prompt once and sums completion tokens). False when it cannot."""
    @property
    def failure(self) -> tuple[str, str] | None:
        """(code, message) once failed."""
    @property
    def engine_error(self) -> bytes | None:
        """The raw JSON of the first engine error event."""
    @property
    def output_tokens(self) -> int:
        """The engine's usage completion_tokens when it sent usage, else validated IDs (or
        events carrying output without require_token_ids)."""
    @property
    def engine_usage_completion_tokens(self) -> int | None: ...
    @property
    def engine_prompt_tokens(self) -> int | None:
        """The prompt's length as the engine counted it: the first prompt_token_ids list
        seen, or usage.prompt_tokens (which wins); None until the engine said."""
    @property
    def engine_cached_tokens(self) -> int | None:
        """usage.prompt_tokens_details.cached_tokens (the engine's prefix-cache hit), when
        the engine's usage carried it as a nonnegative integer; else None."""
    @property
    def events(self) -> int:
        """Events accepted so far, not counting [DONE]."""
    @property
    def started(self) -> bool:
        """At least one event was accepted."""
    @property
    def state(self) -> int:
        """0 open, 1 done, 2 failed."""

# --- prefix index (rust/narwhal_core/src/prefix.rs) --------------------------------------

@final
class PrefixProbe:
    """One prompt's chained chunk hashes and the leading chunks each engine held."""

    @property
    def chunks(self) -> int:
        """Full chunks of the prompt's text (a partial last chunk is not indexed)."""
    def matched(self, engine: int) -> int:
        """Leading chunks ``engine`` held when probed (0 out of range)."""

@final
class PrefixIndex:
    """Per engine, a bounded LRU of chained chunk hashes (an approximate radix tree over
    the prompt text's ``chunk_bytes``-byte chunks); one engine per capacity (hashes)."""

    def __new__(cls, capacities: list[int], chunk_bytes: int = 64) -> PrefixIndex: ...
    @property
    def chunk_bytes(self) -> int:
        """The chunk size in bytes (rounded up to a multiple of 8)."""
    def probe(self, text: str) -> PrefixProbe:
        """Hash the text's chunks and match them on every engine."""
    def insert(self, engine: int, probe: PrefixProbe) -> int:
        """A placement on ``engine``: its chunks become the most recent there (the last
        ``capacity`` of them when longer); return the leading chunks held before."""
    def forget(self, engine: int, probe: PrefixProbe, keep: int) -> None:
        """The engine reported holding only the first ``keep`` chunks: forget the rest."""
    def reset(self, engine: int, capacity: int) -> None:
        """A new engine in slot ``engine`` (the index grows to hold it): it holds nothing."""
    def set_capacity(self, engine: int, capacity: int) -> None:
        """Resize one engine's index, evicting the least recently placed."""
    def state(self, engine: int) -> tuple[int, int, int, int] | None:
        """``(blocks held, capacity, chunks placed, of them matched)``; None out of range."""

@final
class SpanEncoder:
    """Finished requests' spans to OTLP protobuf (``opentelemetry.proto.trace.v1``), for one
    resource and instrumentation scope; the internal spans' IDs come from ``seed``."""
    def __new__(cls, resource: list[tuple[str, object]], scope: str, version: str, *,
                seed: int) -> SpanEncoder: ...
    def encode(self, record: tuple[Any, ...]) -> bytes:
        """A finished request's spans from its ``Observation.span_record()`` (the layout is
        ``narwhal.observe.observation.SpanRecord``): ``ScopeSpans.spans`` fields, server span
        last."""
    def request(self, spans: Sequence[bytes]) -> bytes:
        """The ``ExportTraceServiceRequest`` around ``spans`` (``encode`` outputs)."""
