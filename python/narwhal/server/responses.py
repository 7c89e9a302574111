"""The one place failures become HTTP: status lines, envelopes, Retry-After, mid-stream errors."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import overload

import orjson

from narwhal.errors import Refusal
from narwhal.errors.table import ROWS

Headers = list[tuple[bytes, bytes]]

STATUS_LINES: dict[int, bytes] = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus
}
"""Precomputed status lines for every standard status (all of Narwhal's own, and any an engine
passes through); `status_line` covers non-standard ones."""


def status_line(status: int) -> bytes:
    """The HTTP/1.1 status line for `status`, including non-standard codes (empty reason)."""
    line = STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"not an HTTP status: {status!r}")
        line = b"HTTP/1.1 %d \r\n" % status
    return line


def error_body(message: str, type: str, param: str | None, code: str | None) -> bytes:
    """The OpenAI error envelope, compact JSON."""
    return orjson.dumps(
        {"error": {"message": message, "type": type, "param": param, "code": code}}
    )


# Default-message, no-param bodies are the common shape under overload (429/503 storms).
_DEFAULT_BODIES: dict[str, bytes] = {
    code: error_body(row.message, row.type, None, code) for code, row in ROWS.items()
}
_RETRY_AFTER_1: tuple[bytes, bytes] = (b"Retry-After", b"1")


def refusal_response(ref: Refusal) -> tuple[int, Headers, bytes]:
    """Status, extra headers (Retry-After when the refusal carries one) and envelope body."""
    row = ref.row
    headers: Headers = []
    ra = ref.retry_after
    if ra is not None:
        headers.append(_RETRY_AFTER_1 if ra == 1 else (b"Retry-After", b"%d" % ra))
    if row.headers:
        headers.extend(row.headers)
    if ref.headers:
        headers.extend(ref.headers)
    if ref.param is None and ref.message is row.message:
        body = _DEFAULT_BODIES[ref.code]
    else:
        body = error_body(ref.message, row.type, ref.param, ref.code)
    return row.status, headers, body


@overload
def midstream_error_event(error: Refusal) -> bytes: ...
@overload
def midstream_error_event(
    error: str, type: str, code: int, param: str | None = None
) -> bytes: ...
def midstream_error_event(
    error: Refusal | str,
    type: str | None = None,
    code: int | None = None,
    param: str | None = None,
) -> bytes:
    """An error after response headers, in vLLM's own mid-stream form, then `[DONE]`.

    vLLM writes `json.dumps(ErrorResponse.model_dump())`: Python's default separators (with
    spaces) and ASCII escapes, and `code` is the integer status. A Refusal supplies message,
    type, param and status from itself.
    """
    if isinstance(error, Refusal):
        message = error.message
        type = error.row.type if type is None else type
        code = error.row.status if code is None else code
        param = error.param if param is None else param
    else:
        message = error
        if type is None or code is None:
            raise TypeError("midstream_error_event(str, ...) needs type and code")
    payload = json.dumps(
        {"error": {"message": message, "type": type, "param": param, "code": code}}
    )
    return b"data: " + payload.encode("ascii") + b"\n\ndata: [DONE]\n\n"
