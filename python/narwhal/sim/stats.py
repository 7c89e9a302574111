"""Request accounting for ``/sim/stats``: totals and the last 32 requests with their outcome."""

from __future__ import annotations

from collections import deque
from typing import Any

RECENT = 32


class Record:
    """One completion-route request as the test routes report it."""

    __slots__ = ("body", "headers", "outcome", "path")

    def __init__(self, path: str, headers: dict[str, str], body: Any) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.outcome: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "headers": self.headers, "body": self.body,
                "outcome": self.outcome or "running"}


class Stats:
    """Totals since start (or the last reset) and a ring of recent requests."""

    def __init__(self) -> None:
        self.received = 0
        self.completed = 0
        self.aborted = 0
        self.faulted = 0
        self.rejected = 0
        self.recent: deque[Record] = deque(maxlen=RECENT)

    def arrive(self, path: str, headers: dict[str, str], body: Any) -> Record:
        self.received += 1
        record = Record(path, headers, body)
        self.recent.append(record)
        return record

    def end(self, record: Record, outcome: str) -> None:
        """Set the outcome once: ``completed``, ``aborted``, ``rejected`` or ``fault:<name>``."""
        if record.outcome is not None:
            return
        record.outcome = outcome
        if outcome == "completed":
            self.completed += 1
        elif outcome == "aborted":
            self.aborted += 1
        elif outcome == "rejected":
            self.rejected += 1
        else:
            self.faulted += 1

    def client_left(self, record: Record) -> None:
        """The client disconnected before the response ended (counted even for faults)."""
        if record.outcome is None:
            self.end(record, "aborted")
        elif record.outcome.startswith("fault:"):
            self.aborted += 1

    def reset(self) -> None:
        self.received = self.completed = self.aborted = self.faulted = self.rejected = 0
        self.recent.clear()

    def as_json(self, running: int, waiting: int) -> dict[str, Any]:
        return {
            "received": self.received, "running": running, "waiting": waiting,
            "completed": self.completed, "aborted": self.aborted, "faulted": self.faulted,
            "rejected": self.rejected, "recent": [r.as_json() for r in self.recent],
        }
