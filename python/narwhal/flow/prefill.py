"""The prefill leg of a disaggregated request (vLLM NIXL proxy protocol).

The prefill engine gets the client's body with ``max_tokens: 1`` (and
``max_completion_tokens: 1`` where sent), ``stream: false``, no ``stream_options`` /
``min_tokens`` / ``min_completion_tokens``, and ``kv_transfer_params`` asking for a remote
decode. Its reply's ``kv_transfer_params`` go verbatim into the decode leg's body. Both legs
carry one ``X-Request-Id``. A prefill leg that fails (connect error, 5xx, timeout, a reply
without usable ``kv_transfer_params``) is retried once on another prefill engine; an engine's
own 4xx goes to the client unchanged. The prefill slot is released when the leg ends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING, Any

import orjson

from narwhal.errors import Refusal
from narwhal.request.engine_body import ROUTE_PATHS, prefill_body
from narwhal.scheduling.disagg import replace_prefill
from narwhal.upstream.client import UpstreamError

if TYPE_CHECKING:
    from narwhal.flow.relay import Relay

log = logging.getLogger("narwhal.disagg")



def request_id(relay: Relay) -> str:
    """The one request id both legs carry: the client's ``X-Request-Id`` or a fresh one
    (16 hex digits, so the engine's response id reads ``chatcmpl-<16 hex>``)."""
    rid = relay.ctx.headers.get("x-request-id")
    if not rid:
        rid = secrets.token_hex(8)
        relay.ctx.headers["x-request-id"] = rid
    return rid


class _Failed(Exception):
    """The prefill leg failed in a way another prefill engine may not."""


async def run_prefill(relay: Relay) -> bool:
    """Run the prefill leg (retried once on another prefill engine) and move the relay to
    its decode engine. False when the request ended here (the engine's 4xx was passed on,
    or the client left); raises Refusal when no prefill leg can succeed."""
    split = relay.split
    assert split is not None
    request_id(relay)
    body = prefill_body(relay.parsed)
    while True:
        try:
            kv = await _leg(relay, body)
        except _Failed as exc:
            engine = relay.engine
            log.warning("prefill leg on %s failed: %s", engine.name, exc)
            relay._verdict(False)
            if relay.outcome is not None:
                return False
            loop = relay.loop
            if not relay.retry_allowed or loop.time() >= relay.deadlines.headers_by:
                raise Refusal("engine_error", "The prefill engine failed before responding") \
                    from None
            relay.retry_allowed = False
            other = replace_prefill(relay.router.scheduler, relay.track.demand, engine)
            if other is None:
                raise Refusal("engine_error",
                              "The prefill engine failed and no other was available") from None
            _end_prefill(relay, first_token=False)
            relay.engine, relay.prefill, relay.track = other
            relay.phase = "prefill"
            continue
        if kv is None:
            return False
        relay._verdict(True)
        _end_prefill(relay, first_token=True)
        router = relay.router
        relay.split = None
        relay.engine = split.engine
        relay.decode, split.slot = split.slot, None
        relay.phase = "decode"
        relay.track = router.learning.place(split.engine, relay.track.demand, None,
                                            prefill=False)
        relay.kv_params = kv
        relay.retry_allowed = False  # the KV cache waits on this decode engine only
        return True


def _end_prefill(relay: Relay, *, first_token: bool) -> None:
    """The prefill leg on the current engine is over: its slot and projection go back."""
    router = relay.router
    if relay.prefill is not None:
        relay.prefill.release()
        router.scheduler.leave(relay.engine, "prefill")
    relay.prefill = None
    relay.phase = None
    if first_token:
        router.learning.on_first_token(relay.track, relay.loop.time())
    router.learning.release(relay.track)
    router.queue.capacity_freed()


async def _leg(relay: Relay, body: bytes) -> dict[str, Any] | None:
    """One prefill attempt: the engine's ``kv_transfer_params``, or None when the request
    ended (4xx passed to the client, client gone)."""
    engine = relay.engine
    engine.breaker.begin()
    relay.judging = engine
    loop = relay.loop
    timeout = relay.deadlines.headers_by - loop.time()
    if timeout <= 0:
        raise Refusal("deadline_expired")
    headers = relay.router.forward_headers(relay.ctx)
    relay.dispatched_at = loop.time()
    try:
        upstream = await engine.client.open("POST", ROUTE_PATHS[relay.parsed.route], body, headers,
                                            timeout_s=timeout)
    except UpstreamError as exc:
        if exc.kind == "timeout" and loop.time() >= relay.deadlines.headers_by - 1e-3:
            raise Refusal("deadline_expired") from None
        raise _Failed(exc.kind) from None
    if relay.responder.disconnected:
        upstream.abort()
        relay._finish("cancelled", None)
        return None
    relay.upstream = upstream  # a client disconnect aborts it
    try:
        remaining = relay.deadlines.headers_by - loop.time()
        data = await asyncio.wait_for(upstream.read_all(), max(0.0, remaining))
    except asyncio.TimeoutError:
        upstream.abort()
        raise Refusal("deadline_expired") from None
    except UpstreamError as exc:
        if relay.outcome is not None:  # the client left
            return None
        raise _Failed(f"reply cut off: {exc.kind}") from None
    finally:
        relay.upstream = None
    status = upstream.status
    if status >= 500:
        raise _Failed(f"answered {status}")
    if status != 200:
        content_type = upstream.headers.get("content-type", "application/json")
        relay.responder.send(status, data, content_type=content_type.encode("latin-1"))
        relay._finish("invalid_requests", "engine_rejected")
        return None
    try:
        reply = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _Failed("the prefill reply is not JSON") from None
    kv = reply.get("kv_transfer_params") if isinstance(reply, dict) else None
    if not isinstance(kv, dict):
        raise _Failed("the prefill reply has no kv_transfer_params")
    return kv
