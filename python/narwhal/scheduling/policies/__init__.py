"""Placement policies, one per module, chosen by name (``scheduling.policy``)."""

from __future__ import annotations

from collections.abc import Callable

from narwhal.scheduling.policies.base import Candidate, Policy
from narwhal.scheduling.policies.least_loaded import LeastLoaded
from narwhal.scheduling.policies.lowest_ttft import LowestTtft
from narwhal.scheduling.policies.prefix_affinity import PrefixAffinity, prefix_key

POLICIES: dict[str, Callable[[], Policy]] = {
    "lowest_ttft": LowestTtft,
    "prefix_affinity": PrefixAffinity,
    "least_loaded": LeastLoaded,
}


def make_policy(name: str) -> Policy:
    """A fresh policy by name; ValueError for an unknown one."""
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown placement policy {name!r}; known: {', '.join(POLICIES)}")
    return factory()


__all__ = ["POLICIES", "Candidate", "Policy", "make_policy", "prefix_key"]
