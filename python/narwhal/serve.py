"""Running the router: one process, or several worker processes on one port sharing a board."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import uvloop

from narwhal._narwhal_fast import Board
from narwhal.app import Narwhal
from narwhal.config import Config
from narwhal.server.http import HttpServer, ServerLimits

log = logging.getLogger("narwhal")


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
) -> None:
    """Serve until SIGTERM/SIGINT, then drain in-flight requests within the grace period."""
    loop = asyncio.get_running_loop()
    narwhal = Narwhal(config, board, worker_wake=wake_fds)
    server = HttpServer(
        narwhal.router,
        limits_of(config),
        loop,
        log_exception=lambda req: log.exception("handler failed for %s", req.path),
    )
    bound = await server.listen(config.listen.host, port, reuse_port=reuse_port)
    await narwhal.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    on_ready(bound)
    await stop.wait()
    narwhal.drain()
    await server.shutdown(config.serving.shutdown_grace_s)
    await narwhal.stop()


def _ready_line(config: Config, port: int, workers: int, extra: str = "") -> str:
    return (
        f"narwhal serving {config.model} on http://{config.listen.host}:{port} "
        f"({len(config.engines)} engines, {workers} worker{'s' if workers > 1 else ''}){extra}"
    )


def serve(config: Config, *, workers: int = 1, extra: str = "") -> int:
    """Run the router in the foreground. Prints one line when ready to serve."""
    if workers <= 1:
        board = Board(engines=max(1, len(config.engines)))

        def ready(port: int) -> None:
            print(_ready_line(config, port, 1, extra), flush=True)

        uvloop.run(
            run_worker(config, board, port=config.listen.port, reuse_port=False, on_ready=ready)
        )
        return 0
    return _serve_workers(config, workers, extra)


def _serve_workers(config: Config, workers: int, extra: str) -> int:
    """Pre-fork N workers that bind one port with SO_REUSEPORT and share one board in /dev/shm."""
    path = f"/dev/shm/narwhal-{os.getpid()}.board"
    board = Board(engines=max(1, len(config.engines)), path=path, create=True)
    # Hold the port (found here when 0 is asked) so every worker binds the same one.
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((config.listen.host, config.listen.port))
    port = holder.getsockname()[1]
    read_end, write_end = os.pipe()
    wake_pipes = [os.pipe() for _ in range(workers)]
    children: list[int] = []
    for n in range(workers):
        pid = os.fork()
        if pid == 0:  # worker
            os.close(read_end)
            wake_fds = (wake_pipes[n][0], [w for i, (_, w) in enumerate(wake_pipes) if i != n])
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 0
            try:
                shared = Board(engines=max(1, len(config.engines)), path=path, create=False)

                def ready(_port: int) -> None:
                    os.write(write_end, b"r")

                uvloop.run(
                    run_worker(
                        config,
                        shared,
                        port=port,
                        reuse_port=True,
                        on_ready=ready,
                        wake_fds=wake_fds,
                    )
                )
            except BaseException:
                log.exception("worker failed")
                code = 1
            os._exit(code)
        children.append(pid)
    os.close(write_end)
    got = 0
    while got < workers:
        chunk = os.read(read_end, workers)
        if not chunk:
            break
        got += len(chunk)
    if got < workers:
        _stop_children(children)
        board.unlink()
        print("narwhal: a worker failed to start", file=sys.stderr)
        return 1
    print(_ready_line(config, port, workers, extra), flush=True)

    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    for pid in children:
        while True:
            try:
                _, code = os.waitpid(pid, 0)
                break
            except ChildProcessError:
                code = 0
                break
            except InterruptedError:
                continue
        if code != 0:
            board.reap_dead()  # a worker that died holding requests gives its share back
            if not stopping:
                status = 1
    holder.close()
    board.unlink()
    with contextlib.suppress(OSError):
        os.unlink(f"{path}.admin.json")
    return status


def _stop_children(children: list[int]) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


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
