"""Where the fleet document lives: the configuration a router runs with, its engines' board
slots, and the engines added, removed and discovered at run time.

One process keeps it in memory. Several workers on one port share it in a small JSON file
beside the shared board: a change is a read-modify-write under an exclusive ``flock`` (so
two workers changing the fleet at once take turns and the second sees the first's change),
written by atomic rename, and the peers are woken to apply it. Every worker applies the same
document, so every worker has the same engines in the same slots.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from typing import Any

import orjson

Document = dict[str, Any]
"""``generation`` (int, +1 per change), ``data`` (the configuration file's document),
``added`` (engine entries added through the admin API), ``removed`` (names removed through
it), ``discovered`` (engine entries from discovery), ``slots`` (name -> [slot, url]),
``used`` (slots handed out so far)."""


def empty_document(data: dict[str, Any]) -> Document:
    return {"generation": 0, "data": data, "added": [], "removed": [], "discovered": [],
            "slots": {}, "used": 0}


class MemoryStore:
    """The document of a router running as one process."""

    def __init__(self, document: Document) -> None:
        self.document = document

    def read(self) -> Document:
        return self.document

    def update(self, change: Callable[[Document], Document | None]) -> Document | None:
        """Apply ``change`` (which returns the new document, or None for no change); the new
        document, or None when nothing changed."""
        new = change(self.document)
        if new is not None:
            self.document = new
        return new


class FileStore:
    """The document shared by the workers of one router (see the module docstring)."""

    def __init__(self, path: str, initial: Document) -> None:
        self.path = path
        self.lock_path = f"{path}.lock"
        with self._locked():
            if self._load() is None:
                self._write(initial)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self) -> Document | None:
        try:
            with open(self.path, "rb") as src:
                document = orjson.loads(src.read())
        except (OSError, orjson.JSONDecodeError):
            return None
        return document if isinstance(document, dict) else None

    def _write(self, document: Document) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as out:
            out.write(orjson.dumps(document))
        os.replace(tmp, self.path)

    def read(self) -> Document:
        document = self._load()
        if document is None:
            raise OSError(f"the fleet document {self.path} is missing or unreadable")
        return document

    def update(self, change: Callable[[Document], Document | None]) -> Document | None:
        with self._locked():
            new = change(self.read())
            if new is not None:
                self._write(new)
        return new

    def unlink(self) -> None:
        for path in (self.path, self.lock_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
