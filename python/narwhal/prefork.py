"""The parent of ``narwhal serve --workers N``: forks the workers, passes SIGTERM and SIGINT on
to them, bounds their shutdown and reaps them.

* The parent's signal handlers are in place before the first fork, so a stop signal during
  start-up stops the workers started so far. A worker starts with the default actions (a
  SIGTERM before it installs its own handler ends it at once: it serves nothing yet).
* After the first stop signal, a worker still running ``grace_s`` + ``EXIT_MARGIN_S`` later is
  killed (SIGKILL) and reaped; the parent then returns 1. Nothing the workers do can keep the
  parent waiting past that bound (a worker Linux cannot kill is abandoned after
  ``KILL_WAIT_S``, logged).
* SIGHUP goes on to one worker, which reloads the configuration and shares the change
  with the others.
* Each worker asks Linux for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``): a parent
  killed outright leaves no worker serving; each drains and exits on its own.

The parent waits in ``select`` on a pipe the signal handlers write to
(``signal.set_wakeup_fd``): SIGCHLD, SIGTERM and SIGINT all wake it, none is lost between
two waits, and it reaps only its workers' PIDs (other children, such as the demo's simulated
engines, are left to their owner).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable

log = logging.getLogger("narwhal")

EXIT_MARGIN_S = 1.0
"""After the stop signal, a worker gets the grace period and this long to exit."""
KILL_WAIT_S = 1.0
"""How long a killed worker may take to be reaped before the parent leaves without it."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HANDLED = (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1

Worker = Callable[[int, Callable[[], None]], None]
"""``worker(n, ready)`` runs worker ``n`` in the child until it is done; ``ready()`` says it
serves."""


class Prefork:
    """Forks ``count`` workers and waits until every one has exited; ``run`` returns the
    parent's exit status.

    ``on_ready()``: every worker serves (not called when stopped first). ``on_lost()``: a
    worker exited with a failure or was killed (after it is reaped: give its share back).
    """

    def __init__(self, count: int, worker: Worker, *, grace_s: float,
                 on_ready: Callable[[], None], on_lost: Callable[[], object]) -> None:
        self.count = count
        self.worker = worker
        self.kill_after_s = grace_s + EXIT_MARGIN_S
        self.on_ready = on_ready
        self.on_lost = on_lost
        self.pids: dict[int, int] = {}  # running workers: pid -> worker number
        self.ready = 0
        self.status = 0
        self.start_failed = False  # a worker exited before every worker was ready
        self.stop_at: float | None = None  # monotonic time of the first stop signal
        self.killed_at: float | None = None
        self._signals: list[int] = []

    def run(self) -> int:
        ready_r, ready_w = os.pipe()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _HANDLED}
        previous_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            for n in range(self.count):
                if any(sig != signal.SIGHUP for sig in self._signals):
                    break  # stopped while starting: no more workers
                try:
                    self._fork(n, ready_w, (ready_r, wake_r, wake_w))
                except OSError as exc:
                    log.error("cannot start worker %d: %s", n, exc)
                    self.start_failed = True
                    self.status = 1
                    self._stop()
                    break
            os.close(ready_w)
            self._wait(ready_r, wake_r)
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for fd in (ready_r, wake_r, wake_w):
                os.close(fd)
        return self.status

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)  # the wakeup fd wakes the wait; it acts on this

    # -- the children -----------------------------------------------------------------------
    def _fork(self, n: int, ready_w: int, parent_fds: tuple[int, ...]) -> None:
        parent = os.getpid()
        # Blocked across the fork: the child resets its handlers before any can run there.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for sig in _HANDLED:
                    signal.signal(sig, signal.SIG_DFL)
                # A reload before the worker serves is moot (it reads the file as it is).
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
                for fd in parent_fds:
                    os.close(fd)
                _die_with_parent(parent)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                self.worker(n, lambda: _say_ready(ready_w))
                code = 0
            except BaseException:
                log.exception("worker %d failed", n)
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.pids[pid] = n

    # -- the parent's wait ------------------------------------------------------------------
    def _wait(self, ready_r: int, wake_r: int) -> None:
        watched = [wake_r, ready_r]
        while self.pids:
            due = self._deadline()
            timeout = None if due is None else max(0.0, due - time.monotonic())
            readable, _, _ = select.select(watched, [], [], timeout)
            if ready_r in readable:
                self._read_ready(ready_r, watched)
            if wake_r in readable:
                _drain(wake_r)
            self._reap()
            if self._signals:
                stop = any(sig != signal.SIGHUP for sig in self._signals)
                reload = signal.SIGHUP in self._signals
                self._signals.clear()
                if stop:
                    self._stop()
                elif reload:
                    self._reload()
            due = self._deadline()
            if self.pids and due is not None and time.monotonic() >= due:
                self._overdue()

    def _read_ready(self, ready_r: int, watched: list[int]) -> None:
        got = os.read(ready_r, self.count)
        if not got:
            watched.remove(ready_r)  # every worker has exited or closed it
            return
        self.ready += len(got)
        if self.ready == self.count and self.stop_at is None:
            self.on_ready()

    def _reap(self) -> None:
        for pid in list(self.pids):
            try:
                done, wait_status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, wait_status = pid, 0
            if done == 0:
                continue
            n = self.pids.pop(pid)
            code = os.waitstatus_to_exitcode(wait_status)
            if code != 0:
                self.on_lost()
            if self.stop_at is not None:
                continue
            if self.ready < self.count:
                log.error("worker %d (pid %d) exited during start-up (status %d)", n, pid, code)
                self.start_failed = True
                self.status = 1
                self._stop()
            elif code != 0:
                log.error("worker %d (pid %d) exited (status %d)", n, pid, code)
                self.status = 1

    def _reload(self) -> None:
        """SIGHUP: one worker (the lowest-numbered running) reloads the configuration; it
        shares the result with the others as every fleet change is shared."""
        if self.stop_at is not None or not self.pids:
            return
        pid = min(self.pids, key=lambda p: self.pids[p])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)

    def _stop(self) -> None:
        """Pass a stop on to every worker; the first one starts the exit deadline."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _deadline(self) -> float | None:
        if self.stop_at is None:
            return None
        if self.killed_at is None:
            return self.stop_at + self.kill_after_s
        return self.killed_at + KILL_WAIT_S

    def _overdue(self) -> None:
        self.status = 1
        if self.killed_at is None:
            self.killed_at = time.monotonic()
            for pid, n in self.pids.items():
                log.error("worker %d (pid %d) did not exit within %.1f s of the stop signal; "
                          "killing it", n, pid, self.kill_after_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        for pid, n in self.pids.items():
            log.error("worker %d (pid %d) survived SIGKILL for %.1f s; leaving it", n, pid,
                      KILL_WAIT_S)
        self.pids.clear()


def _say_ready(fd: int) -> None:
    os.write(fd, b"r")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def _die_with_parent(parent: int) -> None:
    """Ask Linux for SIGTERM when the parent dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(0)
