"""The route table: completion routes to the completion flow, information and admin routes to
their handlers; every other path is 404 and every wrong method 405, in the error envelope."""

from __future__ import annotations

from narwhal.api.admin import AdminApi
from narwhal.api.auth import PROTECTED_ROUTES, ClientAuth
from narwhal.api.info import INFO_ROUTES, InfoRoutes
from narwhal.errors import Refusal
from narwhal.flow.completion import COMPLETION_ROUTES, CompletionFlow, early
from narwhal.flow.context import RequestContext
from narwhal.server.exchange import EarlyResponse, Request, Responder
from narwhal.server.responses import error_body

_AUTH_MESSAGE = "A valid API key is required (Authorization: Bearer <key>)."


class Router:
    """Implements the HTTP server's App protocol for Narwhal."""

    def __init__(self, flow: CompletionFlow, info: InfoRoutes, admin: AdminApi,
                 auth: ClientAuth | None = None):
        self.flow = flow
        self.info = info
        self.admin = admin
        self.auth = auth

    def on_headers(self, request: Request) -> None:
        # Refused before accounting: a request without a valid client key is not a
        # completion the router takes (not offered, not counted).
        auth = self.auth
        if auth and request.path in PROTECTED_ROUTES and not auth.allows(
            request.headers.get("authorization")
        ):
            raise early(Refusal("unauthorized", _AUTH_MESSAGE))
        route = COMPLETION_ROUTES.get(request.path)
        if route is not None and request.method == "POST":
            self.flow.on_headers(request, route)

    def on_body_too_large(self, request: Request) -> EarlyResponse:
        return self.flow.on_body_too_large(request)

    def on_abandon(self, request: Request, *, malformed: bool = False) -> None:
        self.flow.on_abandon(request, malformed=malformed)

    async def handle(self, request: Request, responder: Responder) -> None:
        ctx = request.state
        if isinstance(ctx, RequestContext):
            await self.flow.run(request, responder, ctx)
            return
        path = request.path
        if path.startswith("/admin/"):
            await self.admin.handle(request, responder)
        elif path in COMPLETION_ROUTES or (path in INFO_ROUTES and request.method != "GET"):
            _plain_error(responder, 405, "method_not_allowed", "Method not allowed")
        elif path in INFO_ROUTES:
            self.info.handle(path, responder)
        else:
            _plain_error(responder, 404, "not_found", f"No route for {path}")


def _plain_error(responder: Responder, status: int, code: str, message: str) -> None:
    responder.send(status, error_body(message, "invalid_request_error", None, code))
