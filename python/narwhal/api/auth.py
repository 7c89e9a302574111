"""Client API keys: the bearer-token check on completion routes and ``/v1/models``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

PROTECTED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class ClientAuth:
    """Accepts ``Authorization: Bearer <key>`` for one of the configured keys.

    Keys are kept as SHA-256 digests and every digest is compared with
    ``hmac.compare_digest`` (no early exit), so the time taken says nothing about a key's
    content, length or position. No keys at all (the variable unset or empty) refuses
    everything: a configured but missing secret fails closed.
    """

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]):
        self._digests = tuple(_digest(k) for k in keys)

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries a configured key."""
        if not authorization:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        candidate = _digest(token.strip()) if scheme.lower() == "bearer" else b""
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(digest, candidate)
        return ok and bool(candidate)
