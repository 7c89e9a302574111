"""Several router instances sharing one fleet through Redis (``cluster:``; docs/operations.md).

``sync.py`` (``ClusterSync``: the sync task, shared documents, reporting), ``quota.py``
(per-engine quotas and ``EngineLimits``, the limits placement passes to the board),
``peers.py`` (the other instances' published load), ``store.py`` (Redis keys and scripts),
``locks.py`` (one instance profiles an engine at a time), ``admin.py`` (admin state).
"""

from __future__ import annotations

from narwhal.config import Cluster
from narwhal.fleet.ha import MissingExtra


def check_backend(cluster: Cluster) -> None:
    """Raise MissingExtra, naming the extra, when ``cluster.backend`` is redis and the Redis
    client is not installed: at start-up, before any worker."""
    if cluster.backend != "redis":
        return
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(
            "cluster.backend is 'redis' but the Redis client is not installed; "
            "install the extra: pip install 'narwhal[redis]'"
        ) from exc
