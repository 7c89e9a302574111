"""Cluster quotas: the fair split of a limit by demand, and the claim script against a real
redis-server (a quota grows only into room nobody claims; a claim covers what is in use;
a dead instance's claim comes back after its TTL)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.cluster.quota import EngineLimits, fair_target, fallback_share
from narwhal.cluster.store import RedisStore


def test_fair_target_splits_by_demand_and_shares_what_nobody_wants() -> None:
    assert fair_target(6, {"a": 0, "b": 0, "c": 0}, "a") == 2
    assert fair_target(6, {"a": 10, "b": 0, "c": 0}, "a") == 4  # b and c keep one each
    assert fair_target(6, {"a": 10, "b": 0, "c": 0}, "b") == 1
    assert fair_target(6, {"a": 10, "b": 10}, "a") == 3
    assert fair_target(7, {"a": 2, "b": 1}, "a") == 2 + 2  # 4 unwanted: 2 each
    # fewer slots than instances: the first in id order go without
    assert [fair_target(2, {"a": 5, "b": 5, "c": 5}, k) for k in "abc"] == [0, 1, 1]


@settings(deadline=None)  # a GC pause or a preempted CI host is not a failure
@given(st.integers(0, 64), st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 100),
                                           min_size=1))
def test_fair_targets_never_sum_over_the_limit(limit: int, wants: dict[str, int]) -> None:
    targets = {me: fair_target(limit, wants, me) for me in wants}
    assert sum(targets.values()) == limit
    assert all(t >= 0 for t in targets.values())


def test_fallback_share() -> None:
    assert fallback_share(6, 3) == 2 and fallback_share(3, 3) == 1
    assert fallback_share(2, 3) == 1  # never zero: the instance keeps serving
    assert fallback_share(6, 0) == 6


def test_engine_limits_shared_between_mappings(tmp_path: object) -> None:
    path = f"{tmp_path}/board.cluster"
    writer, reader = EngineLimits(4, path), EngineLimits(4, path)
    writer.set(2, 1, 5)
    assert reader.decode(2) == 5 and reader.prefill(2) == 0 and reader.decode(9) == 0
    writer.close()
    reader.close()


@pytest.fixture
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port),
                                                                        timeout=0.2):
                break
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(5)


# a's claims must outlive the steps between them and b's checks on a slow or preempted host
A_TTL_MS = 800


def test_claims_grow_only_into_free_room_and_a_dead_instance_gives_its_back(
        redis_url: str) -> None:
    async def run() -> None:
        store = RedisStore(redis_url, "unit", 1.0)
        try:
            # a takes 4 of 6; b asks for 6 but only 2 are free.
            grants, _ = await store.claim("a", A_TTL_MS, {"e/d": [6, 0, 0, 4, 4]})
            assert grants == {"e/d": 4}
            grants, claims = await store.claim("b", 10_000, {"e/d": [6, 0, 0, 6, 6]})
            assert grants == {"e/d": 2} and claims["a"]["e/d"] == [4, 4]
            # a is told to shrink to 1 but still runs 3: its claim stays at what it may use
            # (the quota in force, 4) until it reports the lower one in force.
            grants, _ = await store.claim("a", A_TTL_MS, {"e/d": [6, 4, 3, 1, 1]})
            assert grants == {"e/d": 1}
            grants, claims = await store.claim("b", 10_000, {"e/d": [6, 2, 2, 6, 6]})
            assert grants == {"e/d": 2} and claims["a"]["e/d"][0] == 4
            grants, _ = await store.claim("a", A_TTL_MS, {"e/d": [6, 1, 3, 1, 1]})
            _, claims = await store.claim("b", 10_000, {"e/d": [6, 2, 2, 6, 6]})
            assert claims["a"]["e/d"][0] == 3  # max(in force 1, in use 3)
            # a dies: after its TTL its claim is gone and b may take everything.
            await asyncio.sleep(A_TTL_MS / 1000 + 0.1)
            grants, claims = await store.claim("b", 10_000, {"e/d": [6, 2, 2, 6, 6]})
            assert grants == {"e/d": 6} and "a" not in claims
        finally:
            await store.close()

    asyncio.run(run())


def test_documents_are_versioned_and_read_once(redis_url: str) -> None:
    async def run() -> None:
        store = RedisStore(redis_url, "unit", 1.0)
        try:
            v1 = await store.publish("admin", "m1", {"draining": ["e0"]})
            v2 = await store.publish("admin", "m2", {"draining": []})
            assert v2 > v1
            _, loads, docs = await store.sync("m3", 1000, {"instance": "i3"}, 0)
            assert docs == [("admin", {"v": v2, "origin": "m2", "doc": {"draining": []}})]
            assert loads["m3"][1] == {"instance": "i3"}
            _, _, docs = await store.sync("m3", 1000, {"instance": "i3"}, v2)
            assert docs == []
        finally:
            await store.close()

    asyncio.run(run())
