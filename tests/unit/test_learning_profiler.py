"""Profiling against a scripted engine on a real loopback socket; supervision and state file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvloop

from narwhal.config import Config, parse_config
from narwhal.fleet.engine import Health
from narwhal.learning import Learning
from narwhal.learning.latency import PrefillModel
from narwhal.learning.persistence import read_state, write_section
from narwhal.learning.profiler import ProfileError, Profiler

MODEL = "m"


def run(main: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return uvloop.run(bounded())


class FakeEngine:
    """A vLLM-like completion stream: prefill = overhead + tokens / rate, then one token per
    ``tpot``. ``ids`` picks what each event carries as ``token_ids``."""

    def __init__(self, overhead: float = 0.02, rate: float = 20_000.0, tpot: float = 0.005,
                 ids: str = "good") -> None:
        self.overhead, self.rate, self.tpot, self.ids = overhead, rate, tpot, ids
        self.requests: list[dict[str, Any]] = []
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> FakeEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def _event(self, i: int, last: bool) -> bytes:
        ids: Any = {"good": [100 + i], "bool": [True], "missing": None}[self.ids]
        choice: dict[str, Any] = {"index": 0, "text": f" t{i}", "logprobs": None,
                                  "finish_reason": "length" if last else None}
        if ids is not None:
            choice["token_ids"] = ids
        data = b"data: " + orjson.dumps({"id": "cmpl-1", "object": "text_completion",
                                         "created": 1, "model": MODEL,
                                         "choices": [choice]}) + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = json.loads(await reader.readexactly(length))
                self.requests.append(body)
                await asyncio.sleep(self.overhead + len(body["prompt"]) / self.rate)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                n = body["max_tokens"]
                for i in range(n):
                    if i:
                        await asyncio.sleep(self.tpot)
                    writer.write(self._event(i, i == n - 1))
                    await writer.drain()
                writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def config(url: str, **extra: Any) -> Config:
    return parse_config({"model": MODEL, "engines": [{"name": "e0", "url": url}], **extra})


def learning_for(cfg: Config) -> Learning:
    from narwhal.fleet.engine import Engine
    from narwhal.upstream.client import EngineClient

    engines = [Engine(i, c, EngineClient(c.url)) for i, c in enumerate(cfg.engines)]
    return Learning(engines, cfg)


def test_profile_fits_the_engine_and_probes_are_well_formed() -> None:
    async def main() -> None:
        fake = await FakeEngine(overhead=0.02, rate=20_000.0, tpot=0.005).start()
        learning = learning_for(config(fake.url))
        engine = learning.engines[0]
        try:
            profile = await Profiler(MODEL).profile(engine, learning.learned[0].load)
        finally:
            await engine.client.close()
            await fake.close()
        # The fake engine's times are sleeps: a busy host can only add to them, so the bounds
        # are tight below and looser above (a wrong fit lands far outside either way).
        assert 17_000.0 <= profile.prefill.tokens_per_s <= 23_000.0
        assert 0.016 <= profile.prefill.overhead_s <= 0.04
        assert 0.0045 <= profile.tpot_s <= 0.008
        lengths = [len(r["prompt"]) for r in fake.requests]
        # a warm-up, then the ladder; lengths predicted under 0.3 s are probed twice
        assert lengths == [16, 16, 16, 64, 64, 256, 256, 1024, 1024, 2048, 2048]
        first = fake.requests[1]
        assert fake.requests[1]["prompt"] != fake.requests[2]["prompt"]
        assert first["stream"] is True and first["return_token_ids"] is True
        assert first["stream_interval"] == 1 and first["max_tokens"] == 8
        assert first["model"] == MODEL and first["ignore_eos"] is True
        # fresh prompts every time: no prefix cache can shorten a probe
        assert fake.requests[0]["prompt"] != fake.requests[1]["prompt"]
        assert learning.learned[0].load.prefill == [] and learning.learned[0].load.decoding() == 0

    run(main)


def test_slow_engine_skips_probes_over_the_cap() -> None:
    async def main() -> None:
        fake = await FakeEngine(overhead=0.005, rate=1000.0, tpot=0.001).start()
        learning = learning_for(config(fake.url))
        try:
            profile = await Profiler(MODEL).profile(learning.engines[0], learning.learned[0].load)
        finally:
            await learning.engines[0].client.close()
            await fake.close()
        assert [len(r["prompt"]) for r in fake.requests] == [16, 16, 16, 64, 64, 256, 256]
        assert profile.prefill.tokens_per_s == pytest.approx(1000.0, rel=0.1)

    run(main)


@pytest.mark.parametrize("ids", ["bool", "missing"])
def test_invalid_token_ids_fail_the_measurement(ids: str) -> None:
    async def main() -> None:
        fake = await FakeEngine(ids=ids).start()
        learning = learning_for(config(fake.url))
        try:
            with pytest.raises(ProfileError) as info:
                await Profiler(MODEL).profile(learning.engines[0], learning.learned[0].load)
        finally:
            await learning.engines[0].client.close()
            await fake.close()
        assert info.value.code == "malformed_engine_output"
        assert learning.learned[0].load.prefill == []

    run(main)


def test_failed_profile_is_reported_and_retried_until_it_succeeds() -> None:
    async def main() -> None:
        fake = await FakeEngine(ids="bool", tpot=0.001).start()
        learning = learning_for(config(fake.url, admission={"mode": "predictive"}))
        engine = learning.engines[0]
        engine.health = Health.HEALTHY
        try:
            await learning.start()  # waits for the first attempt: it fails
            learned = learning.describe(engine)
            assert learned is not None
            assert learned["prefill_tokens_per_s"] is None
            assert learned["profile"]["failures"] == 1
            assert learned["profile"]["error"].startswith("malformed_engine_output")
            fake.ids = "good"
            deadline = time.monotonic() + 5.0
            while not learning.profiled(engine) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            learned = learning.describe(engine)
            assert learned is not None and learned["profile"]["error"] is None
            assert learned["profile"]["reason"] == "join" and learned["profiled_at"] > 0
            families = {m.name: m for m in learning.metric_families()}
            outcomes = {s.labels["outcome"]: s.value
                        for s in families["narwhal_engine_profiles"].samples}
            assert outcomes == {"ok": 1.0, "failed": 1.0}
        finally:
            await learning.stop()
            await engine.client.close()
            await fake.close()

    run(main)


def test_state_file_round_trip_keeps_other_keys(tmp_path: Path) -> None:
    path = str(tmp_path / "state.json")
    write_section(path, "fleet", {"drained": ["e1"]})
    cfg = config("http://127.0.0.1:9", state_file=path)
    first = learning_for(cfg)
    first.learned[0].prefill = PrefillModel(0.015, 12_345.0)
    first.learned[0].tpot.reset(0.012)
    for _ in range(20):
        first.output.observe("chat", 100, 25)
    assert first.supervisor.save()
    state = read_state(path)
    assert state["fleet"] == {"drained": ["e1"]}
    assert state["learned"]["engines"]["e0"]["prefill_tokens_per_s"] == 12_345.0

    second = learning_for(cfg)
    learned = second.describe(second.engines[0])
    assert learned is not None
    assert (learned["prefill_tokens_per_s"], learned["prefill_overhead_s"]) == (12_345.0, 0.015)
    assert learned["tpot_s"] == pytest.approx(0.012)
    assert learned["profile"]["reason"] == "restored"
    assert second.output.expected("chat", 100) == pytest.approx(first.output.expected("chat", 100))

    moved = learning_for(config("http://127.0.0.1:10", state_file=path))  # another engine now
    assert not moved.profiled(moved.engines[0])


def test_unreadable_state_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    cfg = config("http://127.0.0.1:9", state_file=str(path))
    learning = learning_for(cfg)
    assert not learning.profiled(learning.engines[0])
    assert learning.supervisor.save()  # replaced by a valid file
    assert read_state(str(path))["learned"]["version"] == 1
