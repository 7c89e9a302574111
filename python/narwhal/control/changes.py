"""What a new configuration changes: the keys that need a restart, the engine list it makes
from its sources, and which board slot each engine takes. Pure functions of plain data."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from narwhal.config import MAX_ENGINES, Config

LIVE_KEYS = frozenset({
    "serving.http_retention_limit", "serving.request_timeout_s", "serving.max_migrations",
    "admission.queue_limit", "admission.max_wait_s", "admission.ttft_budget_s",
    "admission.drift_threshold",
    "scheduling.policy", "scheduling.affinity_prefix_chars",
    "health.interval_s", "health.timeout_s", "health.failures_to_evict",
    "health.successes_to_restore", "health.monitoring_stale_s", "health.max_ejected_percent",
    "models[].ttft_budget_s",
})
"""Keys a reload changes in a running router (besides ``engines``). Every other key needs a
restart: a reload that changes one is refused with a message naming it."""


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _leaves(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
    else:
        yield path, value


def restart_keys(old: Config, new: Config) -> list[str]:
    """The keys whose change ``new`` asks for that only a restart can make, in file order."""
    changed = []
    for f in dataclasses.fields(Config):
        if f.name == "engines":
            continue  # engines change live
        if f.name == "models":
            if [(m.name, m.aliases) for m in old.models] != [(m.name, m.aliases)
                                                             for m in new.models]:
                changed.append("models")
            continue
        before = dict(_leaves(getattr(old, f.name), f.name))
        after = dict(_leaves(getattr(new, f.name), f.name))
        changed += [key for key, value in after.items()
                    if key not in LIVE_KEYS and before.get(key) != value]
    return changed


def engine_entries(data: Mapping[str, Any], added: Sequence[Mapping[str, Any]],
                   removed: Sequence[str], discovered: Sequence[Mapping[str, Any]]
                   ) -> list[Mapping[str, Any]]:
    """The fleet's engine entries: the file's, those added through the admin API, those
    discovery found; minus those removed through the admin API. A later source's entry
    with a name already listed is left out (the file wins, then the admin API)."""
    out: list[Mapping[str, Any]] = []
    seen: set[object] = set()
    gone = set(removed)
    for source in (data.get("engines") or (), added, discovered):
        for entry in source:
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if name in seen or name in gone:
                continue
            seen.add(name)
            out.append(entry)
    return out


def assign_slots(engines: Sequence[tuple[str, str]], current: Mapping[str, tuple[int, str]],
                 used: int, busy: Mapping[int, bool]) -> tuple[dict[str, tuple[int, str]], int]:
    """Board slots for ``engines`` (name, url pairs): an engine keeps its slot while its
    name and URL stay; a new one (or one whose URL changed: a removal plus an addition)
    takes a slot never used before, and once all ``MAX_ENGINES`` have been used, a slot no
    engine holds and nothing is in flight on (``busy[slot]``). ``current``: name -> (slot,
    url); ``used``: the slots handed out so far (the high-water mark). Raises ValueError
    when no slot is free."""
    kept = {name: current[name] for name, url in engines
            if name in current and current[name][1] == url}
    taken = {slot for slot, _ in kept.values()}
    out: dict[str, tuple[int, str]] = {}
    for name, url in engines:
        if name in kept:
            out[name] = kept[name]
            continue
        if used < MAX_ENGINES:
            slot, used = used, used + 1
        else:
            free = [k for k in range(MAX_ENGINES)
                    if k not in taken and not busy.get(k, False)]
            if not free:
                raise ValueError(f"no free engine slot (at most {MAX_ENGINES} engines, "
                                 "counting those still finishing requests)")
            slot = free[0]
        taken.add(slot)
        out[name] = (slot, url)
    return out, used
