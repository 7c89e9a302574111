"""The Rust prefix index against its Python oracle (tests/reference/prefix_oracle.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from narwhal._narwhal_fast import PrefixIndex
from reference import prefix_oracle

EXAMPLES = int(os.environ.get("NARWHAL_PROP_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Prompts share prefixes: a few stems, each extended by a few tails.
STEMS = ["", "You are a helpful assistant. " * 3, "system: route well\n" * 5, "日本語🙂" * 9]
PROMPT = st.builds(lambda s, t, n: STEMS[s] + t * n, st.integers(0, len(STEMS) - 1),
                   st.text(min_size=1, max_size=12), st.integers(0, 20))
OP = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 3), PROMPT),
    st.tuples(st.just("forget"), st.integers(0, 3), PROMPT, st.integers(0, 10)),
    st.tuples(st.just("capacity"), st.integers(0, 3), st.integers(0, 30)),
    st.tuples(st.just("probe"), st.integers(0, 3), PROMPT),
)


@SETTINGS
@given(st.lists(st.integers(0, 30), min_size=1, max_size=3), st.integers(1, 40),
       st.lists(OP, max_size=40))
def test_rust_index_matches_the_oracle(capacities: list[int], chunk: int,
                                       ops: list[Any]) -> None:
    rust, oracle = PrefixIndex(capacities, chunk), prefix_oracle.PrefixIndex(capacities, chunk)
    assert rust.chunk_bytes == oracle.chunk_bytes
    for op in ops:
        kind, engine = op[0], op[1]
        if kind == "capacity":
            rust.set_capacity(engine, op[2])
            oracle.set_capacity(engine, op[2])
            continue
        rp, op_ = rust.probe(op[2]), oracle.probe(op[2])
        assert rp.chunks == op_.chunks
        assert [rp.matched(e) for e in range(4)] == [op_.matched(e) for e in range(4)]
        if kind == "insert":
            assert rust.insert(engine, rp) == oracle.insert(engine, op_)
        elif kind == "forget":
            rust.forget(engine, rp, op[3])
            oracle.forget(engine, op_, op[3])
        assert [rust.state(e) for e in range(4)] == [oracle.state(e) for e in range(4)]


def test_hashes_match_byte_for_byte() -> None:
    text = "abcdefgh" * 40 + "é" * 13
    rust = PrefixIndex([100], 64)
    rust.insert(0, rust.probe(text))
    oracle = prefix_oracle.chunk_hashes(text.encode(), 64)
    assert rust.probe(text).chunks == len(oracle) == len(text.encode()) // 64


def test_a_shared_system_prompt_matches_across_conversations() -> None:
    system = "You are Narwhal's helpful assistant; answer briefly. " * 20
    index = PrefixIndex([1000, 1000])
    first = index.probe(system + "user: how do I route?")
    index.insert(1, first)
    other = index.probe(system + "user: something else entirely")
    shared = len(system.encode()) // 64
    assert other.matched(1) == shared and other.matched(0) == 0
    assert index.state(1) == (first.chunks, 1000, first.chunks, 0)
