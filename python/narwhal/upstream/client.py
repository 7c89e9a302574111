"""The upstream HTTP/1.1 client to engines: the names the relay and the fleet import."""

from narwhal.upstream.pool import EngineClient
from narwhal.upstream.response import UpstreamError, UpstreamResponse

__all__ = ["EngineClient", "UpstreamError", "UpstreamResponse"]
