"""``python benches/harness/stages.py serve --config FILE``: Narwhal with timing probes.

Profiling aid for ``python -m benches.harness --stages``: runs ``narwhal serve`` with a few
router methods wrapped (by name, from outside; a name that no longer exists is skipped) to
time the stages between a request's arrival and its first token, plus the event loop's lag.
On exit it writes one line per stage (count, p50, p90, p99, mean in ms) to $NARWHAL_STAGES.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

SAMPLES: defaultdict[str, list[float]] = defaultdict(list)


def _wrap_async(module: str, qualname: str, stage: Callable[[tuple[Any, ...]], str]) -> None:
    try:
        cls_name, meth = qualname.split(".")
        cls = getattr(importlib.import_module(module), cls_name)
        original = getattr(cls, meth)
    except (ImportError, AttributeError, ValueError):
        SAMPLES[f"(probe missing: {module}.{qualname})"] = []
        return

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            SAMPLES[stage(args)].append(time.perf_counter() - t0)

    setattr(cls, meth, timed)


def _wrap_first_token() -> None:
    try:
        relay = importlib.import_module("narwhal.flow.relay").Relay
        original = relay._first_token
    except (ImportError, AttributeError):
        SAMPLES["(probe missing: Relay._first_token)"] = []
        return

    @functools.wraps(original)
    def first(self: Any, now: float, *args: Any, **kwargs: Any) -> Any:
        with_arrival = getattr(getattr(self, "ctx", None), "arrival", None)
        if with_arrival is not None:
            SAMPLES["arrival -> first token at the router"].append(now - with_arrival)
        if getattr(self, "dispatched_at", 0.0):
            SAMPLES["engine dispatch -> first token"].append(now - self.dispatched_at)
        return original(self, now, *args, **kwargs)

    relay._first_token = first


def _wrap_handler_start() -> None:
    try:
        flow = importlib.import_module("narwhal.flow.completion").CompletionFlow
        original = flow.run
    except (ImportError, AttributeError):
        SAMPLES["(probe missing: CompletionFlow.run)"] = []
        return

    @functools.wraps(original)
    async def run(self: Any, request: Any, responder: Any, ctx: Any) -> Any:
        lag = asyncio.get_running_loop().time() - ctx.arrival
        SAMPLES["arrival -> handler task runs"].append(lag)
        return await original(self, request, responder, ctx)

    flow.run = run


async def _loop_lag() -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(0.001)
        SAMPLES["event loop lag (1 ms sleep overshoot)"].append(loop.time() - t - 0.001)


def _install() -> None:
    _wrap_handler_start()
    _wrap_async(
        "narwhal.admission.sizing", "EngineSizer.size", lambda a: "prompt sizing (engine /tokenize)"
    )
    _wrap_async(
        "narwhal.admission.gate", "AdmissionQueue.place", lambda a: "admission and placement"
    )
    _wrap_async(
        "narwhal.upstream.pool",
        "EngineClient.open",
        lambda a: f"engine request -> response headers ({a[2] if len(a) > 2 else '?'})",
    )
    _wrap_first_token()
    serve = importlib.import_module("narwhal.serve")
    run_worker = serve.run_worker

    @functools.wraps(run_worker)
    async def with_lag(*args: Any, **kwargs: Any) -> Any:
        task = asyncio.get_running_loop().create_task(_loop_lag())
        try:
            return await run_worker(*args, **kwargs)
        finally:
            task.cancel()

    serve.run_worker = with_lag


def _report() -> None:
    path = os.environ.get("NARWHAL_STAGES")
    if not path:
        return
    lines = []
    for name, values in sorted(SAMPLES.items()):
        v = sorted(values)
        n = len(v)
        if not n:
            lines.append(f"{name}\t0")
            continue

        def q(p: float, v: list[float] = v, n: int = n) -> float:
            return 1000.0 * v[min(n - 1, int(p * n))]

        mean = 1000.0 * sum(v) / n
        lines.append(f"{name}\t{n}\t{q(0.5):.2f}\t{q(0.9):.2f}\t{q(0.99):.2f}\t{mean:.2f}")
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def read(path: str) -> list[tuple[str, int, list[float]]]:
    """The stage lines back: (stage, count, [p50, p90, p99, mean])."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                name, count, *rest = line.rstrip("\n").split("\t")
                rows.append((name, int(count), [float(x) for x in rest]))
    except OSError:
        pass
    return rows


if __name__ == "__main__":
    _install()
    atexit.register(_report)
    from narwhal.cli import main

    sys.exit(main(sys.argv[1:]))
