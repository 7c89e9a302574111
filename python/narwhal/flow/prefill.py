"""The prefill leg of a disaggregated request (vLLM NIXL proxy protocol).

The prefill engine gets the client's body rewritten by ``request.engine_body.prefill_body``;
its reply's ``kv_transfer_params`` go verbatim into the decode leg's body. Both legs carry
one ``X-Request-Id``. The leg opens like any attempt (``flow.attempt.dispatch``: connect
errors, 5xx and an engine refusing the router's key may be retried on another prefill
engine; the engine's own 4xx goes to the client unchanged), then reads the whole reply
within the request's header deadline. A reply without usable ``kv_transfer_params`` is a
failure another prefill engine may not have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.flow.attempt import CANCELLED, Ended, Retry, dispatch
from narwhal.server.exchange import Responder
from narwhal.upstream.client import UpstreamError


async def prefill_leg(
    engine: Engine,
    path: str,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    headers_by: float,
    responder: Responder,
) -> dict[str, Any] | Ended:
    """One prefill attempt: the engine's ``kv_transfer_params``, or how the request ended."""
    opened = await dispatch(engine, path, body, headers, headers_by=headers_by,
                            responder=responder, header_timeout=False)
    if isinstance(opened, Ended):
        return opened
    loop = asyncio.get_running_loop()
    try:
        data = await asyncio.wait_for(opened.read_all(), max(0.0, headers_by - loop.time()))
    except asyncio.TimeoutError:
        opened.abort()
        raise Refusal("deadline_expired") from None
    except UpstreamError as exc:
        if responder.disconnected:
            return Ended(CANCELLED)
        raise Retry("reset", f"prefill reply cut off: {exc.kind}") from None
    try:
        reply = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise Retry("malformed_engine_output", "the prefill reply is not JSON") from None
    kv = reply.get("kv_transfer_params") if isinstance(reply, dict) else None
    if not isinstance(kv, dict):
        raise Retry("malformed_engine_output", "the prefill reply has no kv_transfer_params")
    return kv
