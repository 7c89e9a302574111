"""Write-side flow control of one client connection: pause/resume hooks and drain()."""

from __future__ import annotations

from collections.abc import Callable

from narwhal.http1 import WriteGate


class FlowControl(WriteGate):
    """Tracks whether the client's transport buffer is over its high-water mark.

    The transport calls ``pause_writing``/``resume_writing`` on the protocol, which forwards
    them here. Two kinds of listeners exist: coroutines awaiting :meth:`drain`, and a pair
    of plain callbacks (set by the relay) that pause and resume reading from the engine, so
    a slow client slows the engine stream without an await per token.
    """

    __slots__ = ("_on_pause", "_on_resume")

    def __init__(self) -> None:
        super().__init__()
        self._on_pause: Callable[[], None] | None = None
        self._on_resume: Callable[[], None] | None = None

    def set_listener(
        self, on_pause: Callable[[], None] | None, on_resume: Callable[[], None] | None
    ) -> None:
        """Install (or with ``None``, remove) the relay's pause/resume callbacks."""
        self._on_pause = on_pause
        self._on_resume = on_resume
        if on_pause is not None and self.write_paused:
            on_pause()

    def pause_writing(self) -> None:
        if self.write_paused:
            return
        self.write_paused = True
        if self._on_pause is not None:
            self._on_pause()

    def resume_writing(self) -> None:
        if not self.write_paused:
            return
        super().resume_writing()
        if self._on_resume is not None:
            self._on_resume()

    def release(self) -> None:
        """Connection lost: release every waiter so nothing hangs on a dead socket."""
        super().release()
        self._on_pause = None
        self._on_resume = None
