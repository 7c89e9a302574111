"""What the engine is sent: the client's body rewritten for the relay or for a prefill leg.

Narwhal always streams from the engine and asks token-ID engines for IDs every token. It
asks for usage only where it needs it: to assemble a non-streaming answer, or to count
output on engines without token IDs (then the client's own choice is restored on the way
back). A disaggregated request's prefill leg (vLLM NIXL proxy protocol) gets the client's
body with ``max_tokens: 1`` (and ``max_completion_tokens: 1`` where sent), ``stream:
false``, no ``stream_options`` / ``min_tokens`` / ``min_completion_tokens``, and
``kv_transfer_params`` asking for a remote decode.
"""

from __future__ import annotations

from typing import Any

import orjson

from narwhal.request.parse import Parsed

ROUTE_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
"""The engine path of each completion route."""

REMOTE_DECODE: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
_PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")


def engine_body(parsed: Parsed, *, token_ids: bool,
                kv_params: dict[str, Any] | None = None) -> tuple[bytes, bool]:
    """The body sent to the engine, and whether the usage frame must be dropped.

    ``token_ids``: the engine returns validated token IDs (``return_token_ids``).
    ``kv_params``: a disaggregated decode leg carries the prefill engine's reply verbatim.
    """
    body: dict[str, Any] = dict(parsed.body)
    if kv_params is not None:
        body["kv_transfer_params"] = kv_params
    body["stream"] = True
    drop_usage = False
    if token_ids:
        body["return_token_ids"] = True
        body["stream_interval"] = 1
    if not parsed.stream:
        body["stream_options"] = {"include_usage": True}
    elif not token_ids and not parsed.include_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
        drop_usage = True
    return orjson.dumps(body), drop_usage


def prefill_body(parsed: Parsed) -> bytes:
    """The prefill leg's body (TOY_PROXY step 2)."""
    body: dict[str, Any] = {k: v for k, v in parsed.body.items() if k not in _PREFILL_DROPPED}
    body["kv_transfer_params"] = dict(REMOTE_DECODE)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return orjson.dumps(body)
