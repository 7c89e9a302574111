"""One completion-route request in flight: its choices as engine jobs, emission and faults.

``ChoiceJob.advance`` is the per-token path: it bumps a counter and, when an event is due,
splices pre-serialised bytes (``frames``) into one transport write. When the client's
socket buffer is full, tokens keep coming but stay unsent and go out merged into one
multi-token event on resume — what vLLM does when its HTTP consumer falls behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from narwhal.sim import errors, faults
from narwhal.sim import segments as sg
from narwhal.sim.directives import TRIGGER_FAULTS, Fault
from narwhal.sim.engine import Engine
from narwhal.sim.frames import DONE, Choice, Frames
from narwhal.sim.http import Exchange
from narwhal.sim.stats import Record, Stats

NEVER = -1


class ChoiceJob(Choice):
    """One choice being generated; the engine calls :meth:`advance` once per token."""

    __slots__ = ("due", "finish", "interval", "kv_ready", "produced", "resp", "tokens", "total",
                 "trigger_at")

    def __init__(self, resp: Response, index: int, prompt_ids: list[int], tokens: list[sg.Tok],
                 finish: str, interval: int, echo: str | None = None) -> None:
        super().__init__(index, prompt_ids, echo)
        self.resp = resp
        self.tokens = tokens
        self.total = len(tokens)
        self.finish = finish
        self.produced = 0
        self.interval = interval
        self.due = 1 if resp.stream else self.total + 1  # the first output is sent at once
        self.trigger_at = NEVER
        self.kv_ready = False  # the prompt's KV cache came from a prefill engine (decode role)

    def advance(self) -> bool:
        i = self.produced + 1
        self.produced = i
        if i == self.trigger_at:
            return self.resp.trigger(self)
        if i >= self.total:
            self.resp.finish_choice(self)
            return True
        if i >= self.due and not self.resp.paused:
            self.resp.emit(self)
        return False

    def pending(self) -> list[sg.Tok]:
        return self.tokens[self.sent : self.produced]


class Response:
    """Drives one HTTP exchange from the engine's tokens to the last byte."""

    def __init__(self, *, engine: Engine, stats: Stats, record: Record, exchange: Exchange,
                 stream: bool, frames: Frames | None, fault: Fault | None,
                 build_body: Callable[[list[ChoiceJob]], bytes] | None = None,
                 details: bool = False) -> None:
        self.engine = engine
        self.details = details  # report prompt_tokens_details.cached_tokens
        self.stats = stats
        self.record = record
        self.exchange = exchange
        self.stream = stream
        self.frames = frames
        self.fault = fault
        self.build_body = build_body
        self.choices: list[ChoiceJob] = []
        self.paused = exchange.paused
        self.ended = False
        self.malformed = False  # non-streaming malformed_json
        self._remaining = 0
        self._deferred: list[ChoiceJob] = []
        self._delay: asyncio.TimerHandle | None = None

    def add(self, choice: ChoiceJob) -> None:
        self.choices.append(choice)

    # -- lifecycle
    def begin(self, delay_s: float = 0.0) -> None:
        """Send headers (streaming) and hand the choices to the engine."""
        self.exchange.listener = self
        if delay_s > 0:
            loop = asyncio.get_running_loop()
            self._delay = loop.call_later(delay_s, self._go)
        else:
            self._go()

    def _go(self) -> None:
        self._delay = None
        if self.ended:
            return
        if self.stream:
            self.exchange.start()
        self._remaining = len(self.choices)
        fault = self.fault
        if fault is not None and fault.name in TRIGGER_FAULTS and self.choices:
            if fault.arg == 0:
                if not self._act(fault.name):
                    return
            else:
                self.choices[0].trigger_at = fault.arg
        for choice in self.choices:
            self.engine.submit(choice)

    def _outcome(self) -> str:
        return self.fault.label if self.fault is not None else "completed"

    def _end(self, outcome: str) -> None:
        if not self.ended:
            self.ended = True
            self.stats.end(self.record, outcome)

    def _abort_choices(self) -> None:
        for choice in self.choices:
            self.engine.abort(choice)

    # -- emission
    def emit(self, choice: ChoiceJob) -> None:
        assert self.frames is not None
        events = self.frames.events(choice, choice.pending(), None)
        choice.due = choice.produced + choice.interval
        self.exchange.write_events(events)

    def finish_choice(self, choice: ChoiceJob) -> None:
        if self.ended:
            return
        if not self.stream:
            self._remaining -= 1
            if self._remaining == 0:
                assert self.build_body is not None
                body = self.build_body(self.choices)
                if self.malformed:
                    body = body[: len(body) // 2]
                self.exchange.send(200, body)
                self._end(self._outcome())
            return
        if self.paused:
            self._deferred.append(choice)
            return
        assert self.frames is not None
        events = self.frames.events(choice, choice.pending(), choice.finish)
        self._remaining -= 1
        if self._remaining > 0:
            self.exchange.write_events(events)
            return
        if self.frames.opts.include_usage:
            prompt = sum(c.prompt_tokens for c in self.choices)
            cached = sum(c.cached_tokens for c in self.choices) if self.details else 0
            events.append(self.frames.usage_frame(prompt, sum(c.total for c in self.choices),
                                                  cached))
        events.append(DONE)
        self.exchange.end(events)
        self._end(self._outcome())

    # -- faults that act mid-stream
    def trigger(self, choice: ChoiceJob) -> bool:
        """The fault's token count was reached; return True when the choice leaves the batch."""
        assert self.fault is not None
        name = self.fault.name
        last = choice.produced >= choice.total
        if name in ("malformed_json", "bad_sse"):
            if not last and self.stream:
                self.emit(choice)
            self._act(name)
            if last:
                self.finish_choice(choice)
            return last
        if self.stream and choice.sent < choice.produced:
            self.emit(choice)
        self._act(name)
        return True

    def _act(self, name: str) -> bool:
        """Do what the fault says; return False when the response is over."""
        ex = self.exchange
        if name in ("malformed_json", "bad_sse"):
            if self.stream:  # one well-framed HTTP chunk whose SSE content is broken
                ex.write_events([faults.MALFORMED_EVENT if name == "malformed_json"
                                 else faults.BAD_SSE])
            elif name == "malformed_json":
                self.malformed = True
            return True
        self._abort_choices()
        self._end(self._outcome())
        if name == "reset_mid_stream":
            ex.listener = None
            ex.reset()
        elif name == "hang_mid_stream":
            ex.hang()
        elif name == "close_mid_stream":
            ex.listener = None
            if self.stream:
                ex.end()  # the body's last chunk, no [DONE]
            else:
                ex.close()
        elif name == "bad_chunk":
            ex.listener = None
            ex.start()  # non-streaming: chunked headers, so that the framing can break
            ex.write_raw(faults.BAD_CHUNK)
            ex.close()
        elif name == "error_event":
            if self.stream:
                ex.end([errors.error_event(), DONE])
            else:
                ex.send(500, errors.internal().body())
        return False

    # -- Listener (flow control and disconnects)
    def on_pause(self) -> None:
        self.paused = True

    def on_resume(self) -> None:
        self.paused = False
        if self.ended:
            return
        for choice in self.choices:
            if choice.sent < choice.produced < choice.total and choice.produced >= choice.due:
                self.emit(choice)
                if self.paused:
                    return
        deferred, self._deferred = self._deferred, []
        for choice in deferred:
            self.finish_choice(choice)

    def on_close(self) -> None:
        if self._delay is not None:
            self._delay.cancel()
            self._delay = None
        if not self.ended:
            self._abort_choices()
            self.ended = True
            self.stats.end(self.record, "aborted")
        else:
            self.stats.client_left(self.record)
