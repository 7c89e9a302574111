"""One engine attempt's opening, shared by the relay and the prefill leg.

``dispatch`` sends the request and waits for the engine's response headers, bounded by the
request's header deadline and by the engine's ``header_timeout_s``. What can come of it:

* the engine's 200: the response, whose body the caller consumes;
* a failure another engine may not have (connect error, no headers within the engine's
  header timeout, a 5xx, the engine refusing the router's own credentials): ``Retry``;
* the request's header deadline passing: ``Refusal("deadline_expired")``;
* the request ending here: the client left (the engine request is aborted), or the engine
  refused the request itself (its 4xx goes to the client unchanged): an ``Ended`` outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.server.exchange import Responder
from narwhal.upstream.client import UpstreamError, UpstreamResponse

log = logging.getLogger("narwhal.attempt")

Outcome = tuple[str, "str | None"]
"""A request's terminal (class, reason), as the board counts it."""

CANCELLED: Outcome = ("cancelled", None)
ENGINE_REJECTED: Outcome = ("invalid_requests", "engine_rejected")


class Retry(Exception):
    """The attempt failed before the engine answered, in a way another engine may not.
    ``kind`` is the failure as the engine's outlier detection counts it."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


class Ended:
    """The request ended during the attempt's opening; ``outcome`` is its terminal count."""

    __slots__ = ("outcome",)

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


async def dispatch(
    engine: Engine,
    path: str,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    headers_by: float,
    responder: Responder,
    header_timeout: bool = True,
) -> UpstreamResponse | Ended:
    """Open one attempt on ``engine`` (see the module's docstring). ``header_timeout``:
    apply the engine's ``header_timeout_s`` (a non-streaming prefill leg answers only after
    its prefill, so it waits for the request's deadline alone)."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    left = headers_by - now
    if left <= 0:
        raise Refusal("deadline_expired")
    limit = engine.config.header_timeout_s if header_timeout else left
    try:
        upstream = await engine.client.open("POST", path, body, headers,
                                            timeout_s=min(left, limit))
    except UpstreamError as exc:
        if exc.kind == "timeout":
            if loop.time() >= headers_by - 1e-3:
                raise Refusal("deadline_expired") from None
            raise Retry("header_timeout", f"engine {engine.name}: no response headers "
                                          f"within {limit:g} s") from None
        raise Retry("reset" if exc.kind == "reset" else "connect",
                    f"engine {engine.name}: {exc}") from None
    if responder.disconnected:
        upstream.abort()
        return Ended(CANCELLED)
    status = upstream.status
    if status == 200:
        return upstream
    if status >= 500:
        upstream.abort()
        raise Retry("status_5xx", f"engine {engine.name} answered {status}")
    if status in (401, 403):
        # The engine refused the router's key, not the client's; its body may echo that key.
        upstream.abort()
        log.error("engine %s refused the router's credentials (HTTP %d): check its api_key_env",
                  engine.name, status)
        raise Retry("auth_rejected", f"engine {engine.name} answered {status}")
    return await _pass_through(upstream, responder)


async def _pass_through(upstream: UpstreamResponse, responder: Responder) -> Ended:
    """The engine's own 4xx before its stream: to the client unchanged, not retried."""
    try:
        data = await upstream.read_all()
    except UpstreamError:
        raise Refusal("engine_error", "The engine's error response was cut off") from None
    content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
    responder.send(upstream.status, data, content_type=content_type)
    return Ended(ENGINE_REJECTED)
