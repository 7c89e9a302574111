"""Admin routes: maintenance waves, engine drain, HA role; bearer token required."""

from __future__ import annotations

from typing import TYPE_CHECKING

from narwhal.server.http import Request, Responder
from narwhal.server.responses import error_body

if TYPE_CHECKING:
    from narwhal.api.router import Router


class AdminApi:
    """``/admin/...``: absent (404) when no admin token is configured."""

    def __init__(self, router: Router):
        self.router = router

    async def handle(self, request: Request, responder: Responder) -> None:
        responder.send(
            404, error_body(f"No route for {request.path}", "invalid_request_error", None, "not_found")
        )
