"""Profiling: probe an engine with prompts of known length and fit its latency model.

Each probe is a streaming text completion whose prompt is a list of fresh random token
IDs (so no prefix cache can shorten it), with ``max_tokens`` = 8 and ``ignore_eos``;
cheap lengths are probed twice and the faster kept.
Token-ID engines are asked for ``return_token_ids`` every token and their IDs are
validated by the Rust ``StreamSession``: a probe whose IDs fail validation fails the whole
measurement. Probes go straight to ``engine.client.open``: they are never client traffic.
They do enter the engine's projected load, so placement sees them, and a probe's prefill
is timed from when the engine could start on it (see ``EngineLoad.first_token``), so live
traffic ahead of it does not inflate the fit.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from narwhal._narwhal_fast import StreamSession
from narwhal.fleet.engine import Engine
from narwhal.learning.latency import FitError, PrefillModel, fit_prefill
from narwhal.learning.occupancy import Demand, EngineLoad, Track
from narwhal.learning.tpot import reads_tpot
from narwhal.upstream.client import UpstreamError

log = logging.getLogger("narwhal.learning")

PROBE_PROMPT_TOKENS = (16, 64, 256, 1024, 2048)
"""Prompt lengths probed, shortest first (one warm-up probe of the first length precedes)."""
PROBE_MAX_TOKENS = 8
PROBE_MAX_S = 0.5
"""A longer prompt is skipped when the fit so far predicts its prefill over this."""
CHEAP_PROBE_S = 0.3
"""Lengths predicted under this are probed twice and the faster kept: scheduling delays
(a busy host, a GC pause) only ever add time, so the minimum is the better measurement."""
PROBE_TIMEOUT_S = 10.0
QUIET_WAIT_S = 1.0
"""Before each probe, wait up to this long for the engine's placed prefill work to drain."""
ID_RANGE = (16, 1000)  # ordinary token IDs in every vocabulary (and in the simulator's)


class ProfileError(Exception):
    """The measurement failed; ``code`` says how (e.g. ``malformed_engine_output``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(slots=True)
class Probe:
    """One probe's measurement."""

    prompt_tokens: int
    prefill_s: float  # first token - when the engine could start on it
    ttft_s: float  # first token - dispatch
    tokens: int
    tpot_s: float | None
    batch: float


@dataclass(slots=True)
class Profile:
    """A finished profile: the fitted prefill model, TPOT, and the probes behind them."""

    prefill: PrefillModel
    tpot_s: float | None
    batch: float
    probes: list[Probe] = field(default_factory=list)


class Profiler:
    """Runs profiles; one instance serves the whole fleet."""

    def __init__(self, model: str, *, lengths: Sequence[int] = PROBE_PROMPT_TOKENS,
                 max_probe_s: float = PROBE_MAX_S, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.model = model
        self.lengths = tuple(lengths)
        self.max_probe_s = max_probe_s
        self.timeout_s = timeout_s
        self._rng = random.Random()

    async def profile(self, engine: Engine, load: EngineLoad,
                      previous: PrefillModel | None = None) -> Profile:
        """Probe ``engine`` and fit its model; raise ProfileError when that cannot be done."""
        await self._probe(engine, load, self.lengths[0], previous)  # warm-up: connection
        probes: list[Probe] = []
        for length in self.lengths:
            predicted = self._predict(probes, length) if probes else 0.0
            if predicted > self.max_probe_s:
                break
            try:
                probes.append(await self._probe(engine, load, length, previous))
                if predicted < CHEAP_PROBE_S:
                    probes.append(await self._probe(engine, load, length, previous))
            except ProfileError as exc:
                if exc.code != "engine_rejected" or len({p.prompt_tokens for p in probes}) < 2:
                    raise
                break  # a prompt over the engine's context: keep the shorter ones
        fastest: dict[int, float] = {}
        for p in probes:
            fastest[p.prompt_tokens] = min(p.prefill_s, fastest.get(p.prompt_tokens, p.prefill_s))
        try:
            prefill = fit_prefill(sorted(fastest.items()))
        except FitError as exc:
            raise ProfileError("profile_unfit", str(exc)) from None
        tpots = [p.tpot_s for p in probes if p.tpot_s is not None]
        batches = [p.batch for p in probes if p.tpot_s is not None]
        tpot = statistics.median(tpots) if tpots else None
        batch = statistics.median(batches) if batches else 1.0
        return Profile(prefill, tpot, batch, probes)

    @staticmethod
    def _predict(probes: Sequence[Probe], length: int) -> float:
        """Prefill of ``length`` tokens by the probes so far (a line once there are two)."""
        if len({p.prompt_tokens for p in probes}) >= 2:
            try:
                return fit_prefill([(p.prompt_tokens, p.prefill_s) for p in probes]).seconds(length)
            except FitError:
                pass
        last = max(probes, key=lambda p: p.prompt_tokens)
        return last.prefill_s * length / max(1, last.prompt_tokens)

    async def _quiet(self, load: EngineLoad) -> None:
        deadline = time.monotonic() + QUIET_WAIT_S
        while load.prefill_inflight() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def body(self, engine: Engine, prompt_tokens: int) -> bytes:
        """The probe request: a fresh random prompt of exactly ``prompt_tokens`` IDs."""
        lo, hi = ID_RANGE
        rng = self._rng
        body: dict[str, object] = {
            "model": engine.model or self.model,
            "prompt": [rng.randrange(lo, hi) for _ in range(prompt_tokens)],
            "max_tokens": PROBE_MAX_TOKENS,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if engine.token_ids:
            body["return_token_ids"] = True
            body["stream_interval"] = 1
        return orjson.dumps(body)

    async def _probe(self, engine: Engine, load: EngineLoad, prompt_tokens: int,
                     previous: PrefillModel | None) -> Probe:
        await self._quiet(load)
        cost = previous.seconds(prompt_tokens) if previous is not None else 0.0
        start = time.monotonic()
        demand = Demand(prompt_tokens, "completion", PROBE_MAX_TOKENS)
        track = Track(demand, engine.index, None, start, cost, load.prefill_wait(start) + cost)
        load.place(track)
        try:
            return await self._run(engine, load, track)
        finally:
            load.release(track, time.monotonic())

    async def _run(self, engine: Engine, load: EngineLoad, track: Track) -> Probe:
        loop = asyncio.get_running_loop()
        body = self.body(engine, track.demand.prompt_tokens)
        try:
            upstream = await engine.client.open("POST", "/v1/completions", body,
                                                timeout_s=self.timeout_s)
        except UpstreamError as exc:
            raise ProfileError("engine_error", f"probe failed before headers: {exc.kind}") from None
        if upstream.status != 200:
            upstream.abort()
            code = "engine_rejected" if 400 <= upstream.status < 500 else "engine_error"
            raise ProfileError(code, f"probe answered HTTP {upstream.status}")
        session = StreamSession("completion", assemble=False, expose_token_ids=True,
                                drop_usage=False, require_token_ids=engine.token_ids,
                                prompt_tokens=track.demand.prompt_tokens)
        reads: list[tuple[float, int]] = []
        done: asyncio.Future[None] = loop.create_future()
        service = 0.0
        finished = False  # [DONE] seen

        def fail(exc: ProfileError) -> None:
            if not done.done():
                done.set_exception(exc)

        def on_data(data: bytes) -> None:
            nonlocal service, finished
            if done.done():
                return
            _, tokens, state = session.feed(data)
            if tokens:
                now = time.monotonic()
                if not reads:
                    service = load.first_token(track, now, float(PROBE_MAX_TOKENS))
                reads.append((now, tokens))
            if state == 2:
                code, message = session.failure or ("malformed_engine_output", "bad stream")
                fail(ProfileError(code, message))
            elif state == 1:
                finished = True

        def on_end(exc: BaseException | None) -> None:
            if exc is not None:
                fail(ProfileError("engine_error", f"the probe stream failed: {exc}"))
            elif not finished:
                fail(ProfileError("engine_error", "the probe stream ended before [DONE]"))
            elif not done.done():
                done.set_result(None)

        upstream.set_sink(on_data, on_end)
        left = self.timeout_s - (time.monotonic() - track.placed_at)
        # A timer, not wait_for: no timeout type that differs by version, and a cancellation
        # that lands as the probe finishes is never dropped (wait_for on 3.11 drops it).
        timer = loop.call_later(max(0.0, left), fail,
                                ProfileError("engine_error", "the probe timed out"))
        try:
            await done
        except BaseException:
            upstream.abort()  # failed, timed out or cancelled: the connection is not reusable
            raise
        finally:
            timer.cancel()
        if not reads:
            raise ProfileError("malformed_engine_output", "the probe produced no tokens")
        load.release(track, time.monotonic())
        return Probe(
            prompt_tokens=track.demand.prompt_tokens,
            prefill_s=service,
            ttft_s=reads[0][0] - track.placed_at,
            tokens=sum(k for _, k in reads),
            tpot_s=reads_tpot(reads),
            batch=track.batch,
        )
