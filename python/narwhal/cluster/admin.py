"""Admin state across the instances of a cluster: maintenance waves, drains and role.

After an admin change at one instance the cluster publishes its admin state as the shared
document ``admin``; every other member (each worker of each instance) applies it at its next
sync. The document has the shape of the workers' shared admin file
(``fleet/shared_admin.py``), which keeps the workers of one instance alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from narwhal.fleet.shared_admin import SharedAdmin, apply_state
from narwhal.fleet.state import RouterState

log = logging.getLogger("narwhal.cluster")

ADMIN_DOC = "admin"


class ClusterAdmin(SharedAdmin):
    """The admin API's publisher with a cluster: the workers' file (``inner``, when several
    workers serve one port) and the cluster document."""

    def __init__(self, inner: SharedAdmin | None, state: RouterState,
                 publish: Callable[[str, Any], None]) -> None:
        super().__init__(inner.path if inner is not None else "", state, lambda: None)
        self.inner = inner
        self.publish_doc = publish

    def publish(self) -> None:
        if self.inner is not None:
            self.inner.publish()
        self.publish_doc(ADMIN_DOC, self.snapshot())

    def apply(self) -> None:
        if self.inner is not None:
            self.inner.apply()

    def received(self, doc: Any) -> None:
        """Another instance's admin state arrived."""
        if isinstance(doc, dict):
            apply_state(self.state, doc)
            log.info("admin state from another instance applied: %s", doc)
