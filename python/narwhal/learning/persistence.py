"""The state file: one small JSON object, each top-level key owned by one part of the router.

Learning owns the key ``"learned"``; other parts (maintenance and drain flags) may keep
their own keys in the same file. A write reads the file, replaces only its own key and
puts the whole object back atomically (a temporary file in the same folder, fsync, then
``os.replace``), so a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Any

import orjson

log = logging.getLogger("narwhal.state")

MAX_STATE_BYTES = 4 << 20


def read_state(path: str) -> dict[str, Any]:
    """The whole state object; empty when the file is missing, unreadable or not an object."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read state file %s: %s", path, exc)
        return {}
    if len(raw) > MAX_STATE_BYTES:
        log.warning("state file %s is over %d bytes; ignored", path, MAX_STATE_BYTES)
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        log.warning("state file %s is not JSON (%s); ignored", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def read_section(path: str, key: str) -> Any:
    """The value stored under ``key``, or None."""
    return read_state(path).get(key)


def write_section(path: str, key: str, value: Any) -> bool:
    """Store ``value`` under ``key``, keeping every other key; atomic. False on failure."""
    data = read_state(path)
    data[key] = value
    folder = os.path.dirname(os.path.abspath(path))
    try:
        payload = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        fd, tmp = tempfile.mkstemp(prefix=".narwhal-state-", dir=folder)
    except (OSError, TypeError) as exc:
        log.warning("cannot write state file %s: %s", path, exc)
        return False
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write state file %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
