"""The upstream HTTP/1.1 client to engines: the names the relay and the fleet import."""

from narwhal.upstream.connection import UpstreamError, UpstreamResponse
from narwhal.upstream.pool import EngineClient

__all__ = ["EngineClient", "UpstreamError", "UpstreamResponse"]
