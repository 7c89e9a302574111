"""Byte-level fault payloads: mangled token-ID fields, broken events, unsupported deltas."""

from __future__ import annotations

import secrets

from narwhal.sim import segments as sg
from narwhal.sim import tokenizer

# A chunk cut off in the middle of its JSON (still one SSE event).
MALFORMED_EVENT = (
    b'data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"tru\n\n'
)
# Not an HTTP chunk: a size line that is not hexadecimal (the connection closes after it).
BAD_CHUNK = b"zz\r\nthis is not a chunk\r\n"
# Lines that are not SSE fields and an event whose data line lacks the "data:" field name.
BAD_SSE = b'garbage framing {"choices":[]}\r\nstill no field\n\ndata {"broken":\n\n'


def ids_field(name: str, ids: list[int]) -> bytes:
    """The ``,"token_ids":...`` member of a choice as fault ``name`` renders it."""
    if name == "missing_ids":
        return b""
    if name == "null_ids":
        return b',"token_ids":null'
    if name == "bool_ids":
        return b',"token_ids":[' + b",".join(b"true" for _ in ids or [0]) + b"]"
    if name == "negative_ids":
        return b',"token_ids":[' + b",".join(b"%d" % -(i + 1) for i in ids or [0]) + b"]"
    if name == "float_ids":
        return b',"token_ids":[' + b",".join(b"%d.0" % i for i in ids or [1]) + b"]"
    if name == "string_ids":
        return b',"token_ids":[' + b",".join(b'"%d"' % i for i in ids or [1]) + b"]"
    raise ValueError(name)


def ids_value(name: str, ids: list[int]) -> object:
    """The same fault as a JSON value, for non-streaming bodies (``...`` means drop the key)."""
    if name == "missing_ids":
        return ...
    if name == "null_ids":
        return None
    if name == "bool_ids":
        return [True for _ in ids or [0]]
    if name == "negative_ids":
        return [-(i + 1) for i in ids or [0]]
    if name == "float_ids":
        return [float(i) for i in ids or [1]]
    if name == "string_ids":
        return [str(i) for i in ids or [1]]
    raise ValueError(name)


def payload_token(name: str) -> sg.Tok:
    """A token whose delta carries a field Narwhal does not support (audio, annotations...)."""
    if name == "audio":
        audio = {"id": "a", "data": "UklGRiQAAABXQVZFZm10IBAAAAABAAEA", "expires_at": 1,
                 "transcript": "hi"}
        seg = sg.whole("audio", {"audio": audio}, meta=audio)
        return (seg, tokenizer.piece_id(" hi"), b"", "")
    if name == "annotations":
        notes = [{"type": "url_citation", "url_citation": {
            "start_index": 0, "end_index": 4, "title": "Example", "url": "https://example.com/"}}]
        seg = sg.whole("annotations", {"content": " see", "annotations": notes}, meta=notes)
        return (seg, tokenizer.piece_id(" see"), b"", " see")
    if name == "custom_tool":
        call = {"id": f"chatcmpl-tool-{secrets.token_hex(8)}", "type": "custom", "index": 0,
                "custom": {"name": "shell", "input": "ls -la"}}
        seg = sg.whole("custom_tool", {"tool_calls": [call]}, meta=call)
        return (seg, tokenizer.piece_id("shell"), b"", "")
    raise ValueError(name)
