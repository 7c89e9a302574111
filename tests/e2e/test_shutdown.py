"""Shutdown of a ``--workers 2`` router: a SIGTERM ends every process (main and workers) within
``shutdown_grace_s`` + 2 s: under streaming load, twenty times in a row; during start-up; with
a worker that cannot stop (the main process kills it); and the workers end by themselves
when the main process is killed outright. And the helpers fail a test that leaves a router
process running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from procs import (
    MODEL,
    Proc,
    group_members,
    invariant_holds,
    metrics,
    router_config,
    start_router,
    start_sim,
)

pytestmark = pytest.mark.timeout(150)

GRACE_S = 1.0
BOUND_S = GRACE_S + 2.0
"""The requirement: every process gone this long after the SIGTERM."""
ROUNDS = 20
CLIENTS = 3


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    started = [start_sim("--tpot-ms", "3", "--prefill-tokens-per-s", "100000") for _ in range(2)]
    try:
        yield started
    finally:
        for sim in started:
            sim.stop()


def config(sims: list[Proc], state_file: Path, **sections: Any) -> dict[str, Any]:
    return router_config(
        [s.url for s in sims],
        serving={"shutdown_grace_s": GRACE_S},
        state_file=str(state_file),  # later rounds start from the first round's profiles
        **sections,
    )


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of its stat) while it lives; None once it is
    gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def processes(router: Proc) -> dict[int, str]:
    """The router's main process and its workers, each with its start time."""
    found = {}
    for pid in (router.proc.pid, *router.workers()):
        started = start_time(pid)
        if started is not None:
            found[pid] = started
    return found


def wait_gone(router: Proc, pids: dict[int, str], since: float) -> float:
    """Seconds from ``since`` until the main process has exited and every one of ``pids``
    (the same processes: start times match) and of the router's group is gone; fails the
    test past ``BOUND_S``."""
    while True:
        left = [pid for pid, started in pids.items() if start_time(pid) == started]
        left += [pid for pid in group_members(router.proc.pid) if pid not in left]
        if router.proc.poll() is not None and not left:
            return time.monotonic() - since
        took = time.monotonic() - since
        assert took < BOUND_S, f"still running {took:.1f} s after SIGTERM: {left}"
        time.sleep(0.01)


class StreamingLoad:
    """Clients streaming chat completions through the openai SDK, one after another, until
    stopped. A stream that began (first chunk) must end with a finish reason: the drain
    lets in-flight requests finish. A request refused or unanswered as the router stops is
    not a stream."""

    def __init__(self, base: str, clients: int = CLIENTS) -> None:
        self.client = openai.OpenAI(
            base_url=base + "/v1", api_key="none", max_retries=0, timeout=10.0
        )
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.started = self.finished = 0
        self.cut: list[str] = []
        self.refused: list[str] = []  # for diagnosis
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            began = ended = False
            try:
                stream = self.client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Tell me about narwhals"}],
                    max_tokens=40,
                    stream=True,
                )
                for chunk in stream:
                    if not began:
                        began = True
                        with self.lock:
                            self.started += 1
                    ended = ended or any(c.finish_reason for c in chunk.choices)
            except (openai.APIConnectionError, openai.APIStatusError) as exc:
                if began:
                    with self.lock:
                        self.cut.append(repr(exc))
                else:
                    with self.lock:
                        self.refused.append(repr(exc)[:200])
                    time.sleep(0.02)  # refused or unanswered: the router is going
                continue
            with self.lock:
                if ended:
                    self.finished += 1
                elif began:
                    self.cut.append("stream ended without a finish reason")

    def wait_started(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.started < count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.started >= count, f"only {self.started} streams began: {self.refused[-3:]}"

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(15)
        self.client.close()


def test_twenty_sigterms_under_streaming_load_each_end_every_process(
    sims: list[Proc], tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    took: list[float] = []
    for n in range(ROUNDS):
        router = start_router(tmp_path, config(sims, state), "--workers", "2")
        load: StreamingLoad | None = None
        try:
            pids = processes(router)
            assert len(pids) == 3, f"round {n}: main process and 2 workers expected: {pids}"
            load = StreamingLoad(router.url)
            load.wait_started(CLIENTS + n % 4)  # a little later into the load each round
            assert invariant_holds(metrics(router.url))
            since = time.monotonic()
            router.signal(signal.SIGTERM)
            took.append(wait_gone(router, pids, since))
            assert router.proc.returncode == 0, "".join(router.lines[-20:])  # nobody was killed
            load.stop()
            assert not load.cut, f"round {n}: streams cut by the shutdown: {load.cut}"
            assert load.finished >= CLIENTS
        finally:
            if load is not None:
                load.stop()
            router.stop()
    print(f"exit after SIGTERM: max {max(took):.2f} s, mean {sum(took) / len(took):.2f} s")


def test_a_worker_that_cannot_stop_is_killed_within_the_bound(
    sims: list[Proc], tmp_path: Path
) -> None:
    router = start_router(tmp_path, config(sims, tmp_path / "state.json"), "--workers", "2")
    stopped = router.workers()[0]
    try:
        pids = processes(router)
        assert len(pids) == 3
        os.kill(stopped, signal.SIGSTOP)  # it can take no signal but SIGKILL now
        since = time.monotonic()
        router.signal(signal.SIGTERM)
        wait_gone(router, pids, since)
        assert router.proc.returncode == 1  # a worker had to be killed: not a clean stop
        log = "".join(router.lines)
        assert f"(pid {stopped}) did not exit within" in log, log
    finally:
        router.stop()


def test_sigterm_during_start_up_ends_every_process(tmp_path: Path) -> None:
    """An engine slow to profile (every probe takes 3 s) keeps predictive start-up waiting
    for its first profile: the workers exist, none serves yet, and SIGTERM still ends them
    all."""
    slow = start_sim("--prefill-overhead-ms", "3000", "--tpot-ms", "5")
    try:
        router = start_router(
            tmp_path,
            router_config([slow.url], serving={"shutdown_grace_s": GRACE_S}),
            "--workers",
            "2",
            wait_ready=False,
        )
        try:
            deadline = time.monotonic() + 15
            while len(router.workers()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # into the workers' start-up
            pids = processes(router)
            assert len(pids) == 3, pids
            assert not router.ready_line, "start-up ended before the SIGTERM"
            since = time.monotonic()
            router.signal(signal.SIGTERM)
            wait_gone(router, pids, since)
            assert not router.ready_line
            assert router.proc.returncode == 0, "".join(router.lines)
        finally:
            router.stop()
    finally:
        slow.stop()


def test_workers_end_when_the_main_process_is_killed(sims: list[Proc], tmp_path: Path) -> None:
    router = start_router(tmp_path, config(sims, tmp_path / "state.json"), "--workers", "2")
    try:
        pids = processes(router)
        assert len(pids) == 3
        since = time.monotonic()
        router.signal(signal.SIGKILL)  # no chance to pass anything on: Linux tells the workers
        wait_gone(router, pids, since)
    finally:
        router.stop()


LEAVER = """
import os
from pathlib import Path

from procs import router_config, start_router


def test_leaves_its_router_running(tmp_path):
    config = router_config([os.environ["LEAVER_ENGINE"]], admission={"mode": "open"})
    router = start_router(tmp_path, config, "--workers", "2")
    pids = [router.proc.pid, *router.workers()]
    Path(os.environ["LEAVER_PIDS"]).write_text(" ".join(map(str, pids)))
"""


def test_the_helpers_fail_a_test_that_leaves_a_router_running(
    sims: list[Proc], tmp_path: Path
) -> None:
    """The check in ``conftest.py``, run on a test that forgets its router: that test fails,
    and the router's main process and workers are gone afterwards."""
    here = Path(__file__).parent
    inner = tmp_path / "inner"
    inner.mkdir()
    for helper in ("conftest.py", "procs.py"):
        (inner / helper).write_text((here / helper).read_text())
    (inner / "test_leaver.py").write_text(LEAVER)
    pid_file = tmp_path / "pids"
    env = {**os.environ, "LEAVER_ENGINE": sims[0].url, "LEAVER_PIDS": str(pid_file)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(inner)],
        cwd=inner, env=env, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode != 0, run.stdout
    assert "1 passed, 1 error" in run.stdout, run.stdout
    assert "router processes left behind" in run.stdout, run.stdout
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 3
    assert not [pid for pid in pids if start_time(pid) is not None]
