"""What a configuration key may hold: the per-field Rule, the value checks, and ConfigError."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_ENGINES = 256

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENGINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ConfigError(ValueError):
    """A configuration problem; the message names each bad key (dotted path) and its value."""

    def __init__(self, source: str, problems: Sequence[tuple[str, str]]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = [f"{key}: {text}" if key else text for key, text in self.problems]
        if len(lines) == 1:
            message = f"{source}: {lines[0]}"
        else:
            message = f"{source}: {len(lines)} problems:\n  " + "\n  ".join(lines)
        super().__init__(message)

    @property
    def key(self) -> str:
        """Dotted path of the first bad key ("" when the problem is the whole document)."""
        return self.problems[0][0] if self.problems else ""


@dataclass(frozen=True, slots=True)
class Rule:
    """How one key is checked: its kind, bounds, allowed values and extra string check."""

    kind: type  # int, float, str, or a section dataclass
    required: bool = False
    optional: bool = False  # null allowed (means "not set")
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[str], str | None] | None = None  # returns a problem, or None
    many: bool = False  # a list of `kind` (sections or scalars)
    min_items: int = 1
    max_items: int | None = None
    alternative: str | None = None  # a required key may be left out when this key is given


def rule(kind: type, **kw: Any) -> dict[str, Rule]:
    """Field metadata carrying the key's Rule: ``field(default=..., metadata=rule(int, ge=1))``."""
    return {"rule": Rule(kind, **kw)}


def env_name(value: str) -> str | None:
    """An environment variable name."""
    return None if _ENV_NAME.fullmatch(value) else "must be an environment variable name"


def engine_name(value: str) -> str | None:
    """A name safe in URL paths and metric labels."""
    if _ENGINE_NAME.fullmatch(value):
        return None
    return "must be 1-64 letters, digits, '.', '_' or '-' (it appears in URLs and metrics)"


def header_name(value: str) -> str | None:
    """An HTTP header field name (a token); matched without regard to case."""
    if value and all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in value):
        return None
    return "must be an HTTP header name (letters, digits, '-' and the like)"


def model_name(value: str) -> str | None:
    """A model name clients may send: no surrounding or control whitespace."""
    if value != value.strip() or any(ord(c) < 32 for c in value):
        return "must not start or end with spaces or hold control characters"
    return None


def wave_name(value: str) -> str | None:
    """Any wave name but the reserved ``*``."""
    return "'*' is reserved (it means every wave)" if value == "*" else None


def engine_url(value: str) -> str | None:
    """``http://host:port`` and nothing more."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme == "https":
        return "https engines are not supported yet; give the engine's plain http:// address"
    if parts.scheme != "http" or not parts.hostname:
        return "must be http://host:port"
    if not port:
        return "must name the port, 1-65535 (http://host:port)"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return "must be http://host:port with no path, query or credentials"
    return None


def otlp_url(value: str) -> str | None:
    """An OTLP/HTTP collector: ``http(s)://host:port``, optionally with a path."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be http://host:port (the collector's OTLP/HTTP address, e.g. port 4318)"
    if parts.query or parts.fragment or parts.username:
        return "must be http(s)://host:port[/path] with no query or credentials"
    return None


def lease_url(value: str) -> str | None:
    """A Redis connection URL."""
    if urlsplit(value).scheme in ("redis", "rediss", "unix"):
        return None
    return "must be a redis://, rediss:// or unix:// URL"
