"""Admin state shared by the worker processes of one router: maintenance, drains, role.

An admin request reaches one worker. That worker writes the resulting state to a small JSON
file beside the shared board (atomic rename) and wakes its peers, which apply the file, so
every worker refuses, drains and serves alike whichever of them answered the admin call.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from narwhal.fleet.ha import StaticRole

if TYPE_CHECKING:
    from narwhal.fleet.state import RouterState

log = logging.getLogger("narwhal.admin")


class SharedAdmin:
    """Publishes this worker's admin state and applies what a peer published."""

    def __init__(self, path: str, state: RouterState, notify_peers: Callable[[], None]):
        self.path = path
        self.state = state
        self.notify_peers = notify_peers

    def snapshot(self) -> dict[str, Any]:
        maintenance = self.state.maintenance
        role = self.state.ha.role if isinstance(self.state.ha, StaticRole) else None
        return {
            "waves": sorted(maintenance.active),
            "draining": sorted(e.name for e in maintenance.engines if e.draining),
            "role": role,
        }

    def publish(self) -> None:
        """After an admin change here: write the state, then wake the peers to read it."""
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as out:
                out.write(orjson.dumps(self.snapshot()))
            os.replace(tmp, self.path)
        except OSError:
            log.exception("could not share the admin state with the other workers")
            return
        self.notify_peers()

    def apply(self) -> None:
        """A peer published: take its state (idempotent; a missing file changes nothing)."""
        try:
            with open(self.path, "rb") as src:
                shared = orjson.loads(src.read())
        except (OSError, orjson.JSONDecodeError):
            return
        if isinstance(shared, dict):
            apply_state(self.state, shared)

    def unlink(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def apply_state(state: RouterState, shared: dict[str, Any]) -> None:
    """Make this worker's admin state ``shared`` (a ``snapshot()``; idempotent): the waves
    under maintenance, the drained engines, the role without a lease backend."""
    maintenance = state.maintenance
    waves = set(shared.get("waves", ()))
    if waves != maintenance.active:
        maintenance.set(maintenance.active - waves, False)
        maintenance.set(waves, True)
    draining = set(shared.get("draining", ()))
    for engine in maintenance.engines:
        maintenance.drain(engine, engine.name in draining)
    role = shared.get("role")
    if role is not None and isinstance(state.ha, StaticRole):
        state.ha.set_role(role)
