"""Admin routes: maintenance waves, engine drain, HA role, reload, engines added and
removed; bearer token required."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from narwhal.errors import Refusal
from narwhal.fleet.engine import Engine
from narwhal.fleet.ha import StaticRole
from narwhal.fleet.maintenance import UnknownWave
from narwhal.fleet.state import RouterState
from narwhal.server.exchange import Request, Responder
from narwhal.server.responses import refusal_response

if TYPE_CHECKING:
    from narwhal.fleet.shared_admin import SharedAdmin

_ROLES = ("active", "standby")
_DRAIN_PREFIX = "/admin/engines/"
_DRAIN_SUFFIX = "/drain"


class FleetChanges(Protocol):
    """What changes the fleet (``control.fleet.FleetControl``); each raises Refusal when the
    change cannot be made, and returns the fleet as it now is."""

    def reload(self) -> dict[str, Any]: ...
    def add_engine(self, entry: object) -> dict[str, Any]: ...
    def remove_engine(self, name: str) -> dict[str, Any]: ...
    def describe(self) -> dict[str, Any]: ...


class _Conflict(Exception):
    """The request is well-formed but the router's configuration decides otherwise (409)."""


class AdminApi:
    """``/admin/...``: absent (404) when no admin token is configured; otherwise every path
    needs ``Authorization: Bearer <token>`` (401 before anything else is looked at).

    * ``POST /admin/maintenance`` ``{"waves": ["a"], "enabled": true}`` (``"*"``: every wave)
    * ``POST /admin/engines/{name}/drain`` ``{"enabled": true}``
    * ``POST /admin/role`` ``{"role": "active" | "standby"}`` (409 with a lease backend)
    * ``GET /admin/state``: role, lease and epoch, maintenance, drains, monitoring
    * ``POST /admin/reload``: re-read the configuration file (400 naming the problem when it
      is invalid or changes a key that needs a restart; nothing changes then)
    * ``POST /admin/engines`` (one engine entry): add an engine; ``DELETE
      /admin/engines/{name}``: drain it and take it out; ``GET /admin/fleet``: the fleet
    """

    def __init__(self, token: str | None, state: RouterState, engines: Sequence[Engine],
                 shared: SharedAdmin | None = None, fleet: FleetChanges | None = None):
        """``shared``: the admin state file of several workers serving one port."""
        self._token = (token or "").encode()
        self.state = state
        self.engines = engines
        self.shared = shared
        self.fleet = fleet
        self._routes: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
            "/admin/maintenance": ("POST", self._maintenance),
            "/admin/role": ("POST", self._role),
            "/admin/state": ("GET", lambda _body: self.state.describe()),
        }
        if fleet is not None:
            self._routes.update({
                "/admin/reload": ("POST", lambda _body: fleet.reload()),
                "/admin/engines": ("POST", fleet.add_engine),
                "/admin/fleet": ("GET", lambda _body: fleet.describe()),
            })

    async def handle(self, request: Request, responder: Responder) -> None:
        try:
            self._authorize(request)
            method, action = self._route(request.path)
            if request.method != method:
                raise Refusal("method_not_allowed", headers=((b"Allow", method.encode()),))
            body = self._body(request) if method == "POST" and request.path != "/admin/reload" \
                else None
            result = action(body)
        except Refusal as ref:
            status, headers, out = refusal_response(ref)
            responder.send(status, out, headers)
            return
        except _Conflict as exc:
            status, headers, out = refusal_response(Refusal("conflict", str(exc), param="role"))
            responder.send(status, out, headers)
            return
        if method == "POST" and self.shared is not None:
            self.shared.publish()  # the other workers take the same state
        responder.send(200, orjson.dumps(result))

    # -- checks ---------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if not self._token:
            raise Refusal("not_found", f"No route for {request.path}")
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self._token
        ):
            raise Refusal("unauthorized")

    def _route(self, path: str) -> tuple[str, Callable[[Any], dict[str, Any]]]:
        route = self._routes.get(path)
        if route is not None:
            return route
        if path.startswith(_DRAIN_PREFIX) and path.endswith(_DRAIN_SUFFIX):
            name = path[len(_DRAIN_PREFIX) : -len(_DRAIN_SUFFIX)]
            for engine in self.engines:
                if engine.name == name:
                    return "POST", lambda body, engine=engine: self._drain(engine, body)
            raise Refusal("not_found", f"No engine named {name!r}")
        fleet = self.fleet
        if fleet is not None and path.startswith(_DRAIN_PREFIX) and "/" not in path[
                len(_DRAIN_PREFIX):]:
            name = path[len(_DRAIN_PREFIX):]
            return "DELETE", lambda _body: fleet.remove_engine(name)
        raise Refusal("not_found", f"No route for {path}")

    @staticmethod
    def _body(request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(request.body or b"")
        except orjson.JSONDecodeError:
            raise Refusal("invalid_json", "The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise Refusal("invalid_request", "The request body must be a JSON object.")
        return body

    @staticmethod
    def _enabled(body: dict[str, Any]) -> bool:
        enabled = body.get("enabled")
        if type(enabled) is not bool:
            raise Refusal("invalid_request", "'enabled' must be true or false.", param="enabled")
        return enabled

    # -- actions --------------------------------------------------------------------------
    def _maintenance(self, body: dict[str, Any]) -> dict[str, Any]:
        maintenance = self.state.maintenance
        waves = body.get("waves")
        if not isinstance(waves, list) or not waves:
            raise Refusal("invalid_request", "'waves' must be a non-empty list of wave names.",
                          param="waves")
        for i, wave in enumerate(waves):
            if not isinstance(wave, str):
                raise Refusal("invalid_request", "Wave names are strings.", param=f"waves[{i}]")
        enabled = self._enabled(body)
        try:
            resolved = maintenance.resolve(waves)
        except UnknownWave as exc:
            known = ", ".join(maintenance.waves)
            raise Refusal("invalid_request", f"{exc} (configured waves: {known}; '*' means all).",
                          param=f"waves[{exc.index}]") from None
        maintenance.set(resolved, enabled)
        return {"maintenance": maintenance.describe()}

    def _drain(self, engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
        self.state.maintenance.drain(engine, self._enabled(body))
        return {"engine": engine.name, "draining": engine.draining, "state": engine.state}

    def _role(self, body: dict[str, Any]) -> dict[str, Any]:
        role = body.get("role")
        if role not in _ROLES:
            raise Refusal("invalid_request", "'role' must be \"active\" or \"standby\".",
                          param="role")
        ha = self.state.ha
        if not isinstance(ha, StaticRole):
            raise _Conflict(
                "The role is decided by the lease backend (ha.lease.backend); stop this "
                "instance or the lease holder to move the role."
            )
        ha.set_role(role)
        return {"ha": ha.describe()}
