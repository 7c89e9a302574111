"""Pure-Python reference of ``narwhal_core::chunked``: an engine's chunked body decoded, the
client's framed. Byte-at-a-time and plain, for tests only."""

from __future__ import annotations

from collections.abc import Callable

MAX_SIZE_LINE = 4096
MAX_TRAILERS = 65536
HEX = b"0123456789abcdefABCDEF"


class ChunkError(Exception):
    """Malformed chunked framing; the message is the Rust ``ChunkError``'s."""


class ChunkedDecoder:
    """One chunked body, fed reads split anywhere; ``on_data`` gets each piece of data."""

    def __init__(self) -> None:
        self.st = "size_start"
        self.remaining = 0  # data left in the chunk (the size while in the size line)
        self.seen = 0  # bytes of the size line, or of the trailers

    @property
    def done(self) -> bool:
        return self.st == "done"

    def feed(self, data: bytes, on_data: Callable[[bytes], None]) -> None:
        i = 0
        while i < len(data):
            st, b = self.st, data[i : i + 1]
            if st == "data":
                take = min(len(data) - i, self.remaining)
                on_data(data[i : i + take])
                i += take
                self.remaining -= take
                if self.remaining == 0:
                    self.st = "data_cr"
                continue
            if st in ("size_start", "size"):
                if b in HEX:
                    if self.remaining >> 60:
                        raise ChunkError("invalid chunk size")
                    self.remaining = self.remaining * 16 + int(b, 16)
                    self.st = "size"
                    self.line_byte()
                elif st == "size_start":
                    raise ChunkError("invalid chunk size")
                elif b == b"\r":
                    self.st = "size_lf"
                elif b in (b";", b" ", b"\t"):
                    self.st = "ext"
                    self.line_byte()
                else:
                    raise ChunkError("invalid chunk size")
            elif st == "ext":
                if b == b"\r":
                    self.st = "size_lf"
                elif b in (b"\n", b"\0"):
                    raise ChunkError("invalid chunk size")
                else:
                    self.line_byte()
            elif st == "size_lf":
                if b != b"\n":
                    raise ChunkError("invalid chunk size")
                self.seen = 0
                self.st = "data" if self.remaining else "trailer_start"
            elif st in ("data_cr", "data_lf"):
                if b != (b"\r" if st == "data_cr" else b"\n"):
                    raise ChunkError("chunk data not followed by CRLF")
                self.st = "data_lf" if st == "data_cr" else "size_start"
            elif st in ("trailer_start", "trailer"):
                if b == b"\r":
                    self.st = "end_lf" if st == "trailer_start" else "trailer_lf"
                elif b in (b"\n", b"\0"):
                    raise ChunkError("invalid trailer section")
                else:
                    self.st = "trailer"
                    self.seen += 1
                    if self.seen > MAX_TRAILERS:
                        raise ChunkError("invalid trailer section")
            elif st in ("trailer_lf", "end_lf"):
                if b != b"\n":
                    raise ChunkError("invalid trailer section")
                self.st = "done" if st == "end_lf" else "trailer_start"
            else:
                raise ChunkError("bytes after the end of the body")
            i += 1

    def line_byte(self) -> None:
        self.seen += 1
        if self.seen > MAX_SIZE_LINE:
            raise ChunkError("chunk size line too long")


def frame_chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (nothing for empty data)."""
    return b"%x\r\n%b\r\n" % (len(data), data) if data else b""
