"""The simulated engine's batch scheduler: FIFO prefill, then decode steps over the batch.

Prefills run one at a time in arrival order, each taking ``prefill_overhead +
uncached prompt tokens / prefill_tokens_per_s`` (the prefix cache, ``prefix_cache.py``, is
on with ``kv_cache_tokens``), so queued prefill work adds up; the prefill emits
the first token. Decoding runs in steps on one timer: each step gives every running request
one token and lasts ``tpot + tpot_growth * (running - 1)``. Two timer chains in total, no
task or sleep per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from narwhal.sim.prefix_cache import PrefixCache
from narwhal.sim.settings import SimSettings


class Job(Protocol):
    """One engine request (one choice) as the scheduler sees it."""

    prompt_tokens: int

    def advance(self) -> bool:
        """Produce the next token; return True when the job leaves the batch."""
        ...


class Batch(Protocol):
    """Coalesces the writes made during one engine callback (see ``http.WriteBatch``)."""

    def hold(self) -> None: ...
    def release(self) -> None: ...


class _NoBatch:
    def hold(self) -> None:
        pass

    def release(self) -> None:
        pass


# uvloop's clock and timers have 1 ms resolution: shorter steps run in bursts per firing.
TIMER_RESOLUTION = 0.001
ZERO_TPOT_BURST = 8  # steps per callback when the step time is 0 (as fast as possible)
MAX_BURST = 64


class Engine:
    """Owns the waiting queue, the prefill slot and the running batch."""

    def __init__(self, settings: SimSettings, loop: asyncio.AbstractEventLoop,
                 batch: Batch | None = None) -> None:
        self._settings = settings
        self._loop = loop
        self._batch: Batch = batch if batch is not None else _NoBatch()
        self._waiting: deque[Job] = deque()
        self._prefilling: Job | None = None
        self._prefill_handle: asyncio.TimerHandle | None = None
        self._running: dict[Job, None] = {}
        self._step_handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._clock = 0.0  # scheduled time of the last decode step
        self._burst = 1  # decode steps the next callback runs
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.peak_running = 0  # most requests decoding at once (since start or reset_peaks)
        self.peak_waiting = 0  # most requests queued or in prefill at once
        self.prefix_cache = PrefixCache(settings.kv_cache_tokens)

    @property
    def num_waiting(self) -> int:
        """Requests not yet prefilled (queued or in prefill)."""
        return len(self._waiting) + (self._prefilling is not None)

    @property
    def num_running(self) -> int:
        """Requests decoding."""
        return len(self._running)

    def submit(self, job: Job) -> None:
        self._waiting.append(job)
        if self._prefilling is None:
            self._start_prefill()
        self.peak_waiting = max(self.peak_waiting, self.num_waiting)

    def reset_peaks(self) -> None:
        self.peak_running = self.num_running
        self.peak_waiting = self.num_waiting

    def abort(self, job: Job) -> None:
        """Remove a job wherever it is (idempotent)."""
        if job in self._running:
            del self._running[job]
        elif job is self._prefilling:
            if self._prefill_handle is not None:
                self._prefill_handle.cancel()
            self._prefilling = self._prefill_handle = None
            self._start_prefill()
        else:
            with contextlib.suppress(ValueError):
                self._waiting.remove(job)

    def close(self) -> None:
        """Stop both timers and forget every job."""
        for handle in (self._prefill_handle, self._step_handle):
            if handle is not None:
                handle.cancel()
        self._prefill_handle = self._step_handle = None
        self._prefilling = None
        self._waiting.clear()
        self._running.clear()

    # -- prefill
    def _start_prefill(self) -> None:
        if not self._waiting:
            return
        job = self._waiting.popleft()
        self._prefilling = job
        s = self._settings
        # A decode engine's remote-prefilled job pays only the overhead (the KV transfer).
        tokens = 0 if getattr(job, "kv_ready", False) else job.prompt_tokens
        cache = self.prefix_cache
        if tokens and cache.enabled:
            ids = getattr(job, "prompt_ids", None)
            if ids is not None:  # prefill time only for the uncached tokens
                cached = cache.admit(ids)
                job.cached_tokens = cached  # type: ignore[attr-defined]
                tokens -= cached
        duration = s.prefill_overhead_ms / 1000.0 + tokens / s.prefill_tokens_per_s
        self._prefill_handle = self._loop.call_at(self._loop.time() + duration, self._prefilled)

    def _prefilled(self) -> None:
        job = self._prefilling
        self._prefilling = self._prefill_handle = None
        if job is not None:
            self.prompt_tokens_total += job.prompt_tokens
            self.generation_tokens_total += 1
            self._batch.hold()
            try:
                if not job.advance():
                    self._running[job] = None
                    self.peak_running = max(self.peak_running, len(self._running))
                    self._schedule_step(fresh=True)
            finally:
                self._batch.release()
        self._start_prefill()

    # -- decode
    def _step_time(self) -> float:
        s = self._settings
        return (s.tpot_ms + s.tpot_growth_ms * max(0, len(self._running) - 1)) / 1000.0

    def _schedule_step(self, fresh: bool = False) -> None:
        if self._step_handle is not None or not self._running:
            return
        step = self._step_time()
        burst = 1
        if step < TIMER_RESOLUTION:
            burst = ZERO_TPOT_BURST if step <= 0 else min(MAX_BURST,
                                                          int(TIMER_RESOLUTION / step))
        self._burst = burst
        now = self._loop.time()
        at = now + step * burst if fresh else max(self._clock + step * burst, now)
        self._clock = at
        if at <= now:
            self._step_handle = self._loop.call_soon(self._step)
        else:
            self._step_handle = self._loop.call_at(at, self._step)

    def _step(self) -> None:
        self._step_handle = None
        running = self._running
        self._batch.hold()
        try:
            for _ in range(self._burst):
                if not running:
                    break
                batch = tuple(running)
                for job in batch:
                    if job in running and job.advance():
                        running.pop(job, None)
                self.generation_tokens_total += len(batch)
        finally:
            self._batch.release()
        self._schedule_step()
