"""Running the router: one process, or several worker processes on one port sharing a board."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import uvloop

from narwhal._narwhal_fast import Board
from narwhal.app import Narwhal, model_board_paths
from narwhal.cluster import check_backend as check_cluster
from narwhal.config import MAX_ENGINES, Config
from narwhal.fleet.ha import MissingExtra
from narwhal.prefork import Prefork
from narwhal.server.exchange import ServerLimits
from narwhal.server.listener import HttpServer

log = logging.getLogger("narwhal")

GC_YOUNG_OBJECTS = 10_000
"""Allocations between young-generation collections (the default is 700)."""


def settle_gc() -> None:
    """Once start-up is done: what it made (modules, configuration, the learned state) lives
    as long as the process, so it is frozen out of the collector's scans, and the young
    generation is sized so a collection comes every few hundred requests rather than every
    ~20 (700 objects was about 18 requests' allocations in benches/bench_request.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_OBJECTS, 10, 10)


def limits_of(config: Config) -> ServerLimits:
    s = config.serving
    return ServerLimits(
        header_timeout_s=s.header_timeout_s,
        keepalive_timeout_s=s.keepalive_timeout_s,
        max_header_bytes=s.max_header_bytes,
        max_headers=s.max_headers,
        max_request_bytes=s.max_request_bytes,
        write_buffer_high_bytes=s.write_buffer_high_bytes,
    )


async def run_worker(
    config: Config,
    board: Board,
    *,
    port: int,
    reuse_port: bool,
    on_ready: Callable[[int], None],
    wake_fds: tuple[int, list[int]] | None = None,
    config_path: str | None = None,
    leader: bool = True,
    overrides: Callable[[Config], Config] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain in-flight requests within the grace period;
    SIGHUP reloads the configuration file."""
    loop = asyncio.get_running_loop()
    narwhal = Narwhal(config, board, worker_wake=wake_fds, config_path=config_path,
                      leader=leader, overrides=overrides)
    server = HttpServer(
        narwhal.router,
        limits_of(config),
        loop,
        log_exception=lambda req: log.exception("handler failed for %s", req.path),
    )
    bound = await server.listen(config.listen.host, port, reuse_port=reuse_port)
    await narwhal.start()
    settle_gc()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, narwhal.reload)
    on_ready(bound)
    await stop.wait()
    narwhal.drain()
    await server.shutdown(config.serving.shutdown_grace_s)
    await narwhal.stop()


def _ready_line(config: Config, port: int, workers: int, extra: str = "") -> str:
    return (
        f"narwhal serving {', '.join(m.name for m in config.served_models)} on "
        f"http://{config.listen.host}:{port} "
        f"({len(config.engines)} engines, {workers} worker{'s' if workers > 1 else ''}){extra}"
    )


def serve(config: Config, *, workers: int = 1, extra: str = "",
          config_path: str | None = None,
          overrides: Callable[[Config], Config] | None = None) -> int:
    """Run the router in the foreground. Prints one line when ready to serve.
    ``config_path``: the file ``config`` was read from (SIGHUP and ``/admin/reload`` re-read
    it; ``overrides``, the command line's, apply to what it reads). The board has a slot for
    every engine the fleet may hold (engines come and go)."""
    try:
        check_cluster(config.cluster)  # the narwhal[redis] extra, before any worker
    except MissingExtra as exc:
        print(f"narwhal: {exc}", file=sys.stderr)
        return 2
    if workers <= 1:
        board = Board(engines=MAX_ENGINES)

        def ready(port: int) -> None:
            print(_ready_line(config, port, 1, extra), flush=True)

        uvloop.run(
            run_worker(config, board, port=config.listen.port, reuse_port=False, on_ready=ready,
                       config_path=config_path, overrides=overrides)
        )
        return 0
    return _serve_workers(config, workers, extra, config_path, overrides)


def _serve_workers(config: Config, workers: int, extra: str, config_path: str | None,
                   overrides: Callable[[Config], Config] | None) -> int:
    """Pre-fork N workers that bind one port with SO_REUSEPORT and share one board in /dev/shm."""
    path = f"/dev/shm/narwhal-{os.getpid()}.board"
    board = Board(engines=MAX_ENGINES, path=path, create=True)
    # Per-model metrics: each model's board beside the main one (the workers attach).
    models = [Board(engines=1, path=p, create=True) for p in model_board_paths(config, path)]
    # Hold the port (found here when 0 is asked) so every worker binds the same one.
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((config.listen.host, config.listen.port))
    port = holder.getsockname()[1]
    wake_pipes = [os.pipe() for _ in range(workers)]

    def worker(n: int, ready: Callable[[], None]) -> None:
        wake_fds = (wake_pipes[n][0], [w for i, (_, w) in enumerate(wake_pipes) if i != n])
        shared = Board(engines=MAX_ENGINES, path=path, create=False)
        uvloop.run(
            run_worker(
                config,
                shared,
                port=port,
                reuse_port=True,
                on_ready=lambda _port: ready(),
                wake_fds=wake_fds,
                config_path=config_path,
                leader=n == 0,
                overrides=overrides,
            )
        )

    def all_ready() -> None:
        print(_ready_line(config, port, workers, extra), flush=True)

    def lost() -> None:  # a worker that died holding requests gives its share back
        for each in (board, *models):
            each.reap_dead()

    parent = Prefork(workers, worker, grace_s=config.serving.shutdown_grace_s,
                     on_ready=all_ready, on_lost=lost)
    status = parent.run()
    if parent.start_failed:
        print("narwhal: a worker failed to start", file=sys.stderr)
    holder.close()
    for each in (board, *models):
        each.unlink()
    for suffix in (".admin.json", ".fleet.json", ".fleet.json.lock", ".learned.json", ".cluster"):
        with contextlib.suppress(OSError):
            os.unlink(f"{path}{suffix}")
    return status


def start_demo_engines(
    model: str, count: int = 2
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Start simulated engines (``python -m narwhal.sim``) serving ``model`` on free ports."""
    procs: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    for _ in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "narwhal.sim", "--host", "127.0.0.1", "--port", "0",
             "--model", model, "--exit-with-parent"],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if "http://" not in line:
            stop_processes(procs)
            raise RuntimeError(f"simulated engine did not start: {line!r}")
        urls.append(line[line.index("http://") :].split()[0])
    return procs, urls


def stop_processes(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
