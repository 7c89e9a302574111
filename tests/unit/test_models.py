"""Several models behind one router: the catalog of names (models, aliases, adapters the
engines report), model resolution in parsing, eligibility and queueing by model, per-model
budgets, output lengths and metrics. End-to-end behaviour is in tests/e2e/test_models.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from fleet_helpers import chat, fleet
from prometheus_client.parser import text_string_to_metric_families

from narwhal._narwhal_fast import Board
from narwhal.admission.gate import AdmissionQueue
from narwhal.admission.predictive import PredictiveAdmission
from narwhal.api.metrics import build_registry, render
from narwhal.config import Config, parse_config
from narwhal.errors import Refusal
from narwhal.learning import Learning
from narwhal.request.deadlines import Deadlines
from narwhal.request.models import Catalog, Served, parse_cards
from narwhal.request.parse import parse_request
from narwhal.scheduling.placement import Scheduler

LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B"


def two_models(**llama: Any) -> Config:
    return parse_config({
        "models": [{"name": LLAMA, "aliases": ["llama-8b"], **llama}, {"name": QWEN}],
        "engines": [
            {"name": "a0", "url": "http://127.0.0.1:9101", "models": [LLAMA]},
            {"name": "a1", "url": "http://127.0.0.1:9102", "models": [LLAMA]},
            {"name": "b0", "url": "http://127.0.0.1:9103", "models": [QWEN]},
            {"name": "x0", "url": "http://127.0.0.1:9104"},  # every model
        ],
    })


def lora(name: str, parent: str | None, root: str = "/adapters/x") -> tuple[str, str | None,
                                                                          str | None]:
    return (name, parent, root)


# ---------------------------------------------------------------- the catalog


def test_names_aliases_and_the_engines_of_each_model() -> None:
    catalog = Catalog(two_models())
    llama, qwen = catalog.models
    assert catalog.resolve("llama-8b") is llama and catalog.resolve(LLAMA) is llama
    assert catalog.resolve("nope") is None
    assert llama.engines == frozenset({0, 1, 3}) and qwen.engines == frozenset({2, 3})
    assert catalog.labelled and not catalog.single
    assert catalog.names_on(0) == [LLAMA, "llama-8b"]
    assert catalog.names_on(3) == [LLAMA, "llama-8b", QWEN]
    assert [catalog.first_model(i) for i in range(4)] == [LLAMA, LLAMA, QWEN, LLAMA]


def test_one_model_is_the_single_fast_path() -> None:
    config = parse_config({"model": "m", "engines": [{"name": "a", "url": "http://h:1"}]})
    catalog = Catalog(config)
    assert catalog.single and not catalog.labelled
    assert catalog.models[0].engines is None  # every engine: no filtering per request


def test_adapters_come_and_go_with_the_engines_lists() -> None:
    catalog = Catalog(two_models())
    base = [lora(LLAMA, None, LLAMA)]
    assert catalog.engine_reported(0, [*base, lora("sql", LLAMA, "/a/sql")])
    assert not catalog.engine_reported(0, [*base, lora("sql", LLAMA, "/a/sql")])  # no change
    sql = catalog.resolve("sql")
    assert sql is not None and sql.adapter and sql.base is catalog.models[0]
    assert sql.engines == frozenset({0}) and sql.index == 0
    assert catalog.names_on(0)[-1] == "sql" and "sql" not in catalog.names_on(1)
    # parent given by alias; a second engine loads it too
    assert catalog.engine_reported(1, [lora("sql", "llama-8b")])
    assert sql.engines == frozenset({0, 1})
    catalog.engine_reported(0, base)
    assert sql.engines == frozenset({1}) and catalog.resolve("sql") is sql
    catalog.engine_reported(1, [])
    assert catalog.resolve("sql") is None  # gone from every engine: unknown (404)
    assert sql.engines == frozenset()
    catalog.engine_reported(1, [lora("sql", LLAMA)])
    assert catalog.resolve("sql") is sql  # back: the same object (queued requests hold it)


def test_adapters_that_cannot_be_served_are_ignored() -> None:
    catalog = Catalog(two_models())
    version = catalog.version
    catalog.engine_reported(2, [lora("a", LLAMA)])  # b0 does not serve llama
    catalog.engine_reported(0, [lora("llama-8b", LLAMA), lora(QWEN, LLAMA)])  # taken names
    catalog.engine_reported(0, [lora("b", "unknown-base")])
    assert catalog.version == version
    assert {"a", "b"} & set(catalog.names) == set()
    catalog.engine_reported(3, [lora("c", QWEN)])
    catalog.engine_reported(0, [lora("c", LLAMA)])  # another base's adapter elsewhere
    c = catalog.resolve("c")
    assert c is not None and c.base.name == QWEN and c.engines == frozenset({3})


def test_model_list_cards() -> None:
    catalog = Catalog(two_models())
    catalog.engine_reported(0, [lora("sql", LLAMA, "/a/sql")])
    cards = catalog.cards()
    assert [(c["id"], c["root"], c["parent"]) for c in cards] == [
        (LLAMA, LLAMA, None), ("llama-8b", LLAMA, None), (QWEN, QWEN, None),
        ("sql", "/a/sql", LLAMA)]
    assert all(c["object"] == "model" and c["owned_by"] == "narwhal" for c in cards)


def test_parse_cards_reads_the_openai_list_shape() -> None:
    data = {"object": "list", "data": [
        {"id": "m", "parent": None, "root": "/m"}, {"id": "a", "parent": "m", "root": "/a"},
        {"id": 3}, "junk", {"id": "b", "parent": ""}]}
    assert parse_cards(data) == [("m", None, "/m"), ("a", "m", "/a"), ("b", None, None)]
    assert parse_cards([]) is None and parse_cards({"data": 1}) is None


# ---------------------------------------------------------------- parsing


def test_an_alias_is_rewritten_for_the_engine_and_remembered() -> None:
    catalog = Catalog(two_models())
    p = parse_request("chat", chat("llama-8b"), model=catalog.names)
    assert p.model == LLAMA and p.body["model"] == LLAMA and p.alias == "llama-8b"
    assert p.served is catalog.models[0]
    p = parse_request("chat", chat(QWEN), model=catalog.names)
    assert p.model == QWEN and p.alias is None and p.served is catalog.models[1]


def test_unknown_names_and_unloaded_adapters_are_404() -> None:
    catalog = Catalog(two_models())
    for name in ("nope", "sql"):
        with pytest.raises(Refusal) as info:
            parse_request("chat", chat(name), model=catalog.names)
        assert (info.value.code, info.value.param, info.value.row.status) == (
            "model_not_found", "model", 404)
    catalog.engine_reported(0, [lora("sql", LLAMA)])
    p = parse_request("chat", chat("sql"), model=catalog.names)
    assert p.model == "sql" and p.alias is None and p.served is catalog.resolve("sql")


# ---------------------------------------------------------------- placement by model


def demand_for(sched: Scheduler, catalog: Catalog, model: str, tokens: int = 100) -> Any:
    return sched.demand(parse_request("chat", chat(model), model=catalog.names), tokens)


def test_eligibility_and_placement_follow_the_model() -> None:
    catalog, engines, _, sched = fleet(two_models())
    llama, qwen = catalog.models
    assert [e.name for e in sched.eligible(llama)] == ["a0", "a1", "x0"]
    assert [e.name for e in sched.eligible(qwen)] == ["b0", "x0"]
    assert len(sched.eligible()) == 4
    catalog.engine_reported(1, [lora("sql", LLAMA)])
    sql = catalog.resolve("sql")
    assert [e.name for e in sched.eligible(sql)] == ["a1"]
    for _ in range(10):
        placement = sched.try_place(demand=demand_for(sched, catalog, "sql"))
        assert placement is not None and placement.engine.name == "a1"
        sched.release(placement)
    for _ in range(10):
        placement = sched.try_place(demand=demand_for(sched, catalog, QWEN))
        assert placement is not None and placement.engine.name in ("b0", "x0")
        sched.release(placement)
    engines[1].draining = True
    assert sched.eligible(sql) == [] and sched.try_place(
        demand=demand_for(sched, catalog, "sql")) is None


def test_the_model_names_the_profiling_probes() -> None:
    _catalog, engines, _, _ = fleet(two_models())
    assert [e.model for e in engines] == [LLAMA, LLAMA, QWEN, LLAMA]


def test_a_full_model_does_not_hold_up_another_models_queue() -> None:
    config = parse_config({
        "models": [{"name": LLAMA}, {"name": QWEN}],
        "engines": [
            {"name": "a0", "url": "http://127.0.0.1:9101", "models": [LLAMA], "max_prefill": 1},
            {"name": "b0", "url": "http://127.0.0.1:9103", "models": [QWEN], "max_prefill": 1},
        ],
    })
    catalog, _engines, _, sched = fleet(config)
    board = sched.board
    queue = AdmissionQueue(sched, queue_limit=10, max_wait_s=5.0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop.time() + 5, loop.time() + 5)
        a_slot = board.acquire_slot(0, "prefill", 1)  # llama's only engine is full
        b_slot = board.acquire_slot(1, "prefill", 1)  # and qwen's, for now
        waiting = []
        for model in (LLAMA, QWEN, LLAMA, QWEN):
            ticket, _ = board.arrive(100)
            demand = demand_for(sched, catalog, model)
            demand.__enter__()
            waiting.append(asyncio.ensure_future(queue.place(ticket, deadlines, demand)))
        await asyncio.sleep(0)
        assert set(queue.queues) == {catalog.models[0], catalog.models[1]}
        assert b_slot is not None
        b_slot.release()
        queue.kick()  # qwen's head is placed although llama's older head cannot be
        await asyncio.sleep(0)
        assert [w.done() for w in waiting] == [False, True, False, False]
        placed, _ = waiting[1].result()
        assert placed.engine.name == "b0"
        sched.release(placed)
        queue.kick()
        await asyncio.sleep(0)
        assert [w.done() for w in waiting] == [False, True, False, True]
        assert a_slot is not None
        a_slot.release()
        queue.kick()
        await asyncio.sleep(0)
        assert waiting[0].done() and not waiting[2].done()  # FIFO within the model
        for w in waiting:
            if w.done():
                sched.release(w.result()[0])
        queue.kick()
        await asyncio.sleep(0)
        assert all(w.done() for w in waiting)
        for w in waiting[2:3]:
            sched.release(w.result()[0])
        assert queue.queues == {}

    asyncio.run(main())


# ---------------------------------------------------------------- budgets and learning


def test_each_model_has_its_own_budget_and_queue() -> None:
    catalog, _, learning, sched = fleet(two_models(ttft_budget_s=0.5))
    adm = PredictiveAdmission(two_models(ttft_budget_s=0.5).admission, learning, sched)

    def refused(model: str, tokens: int) -> str | None:
        try:
            adm.admit(parse_request("chat", chat(model), model=catalog.names), tokens)
        except Refusal as ref:
            return ref.code
        return None

    # 1000 tokens: 1.01 s of prefill, over llama's 0.5 s but within the default 2 s
    assert refused("llama-8b", 1000) == "prompt_exceeds_ttft_budget"
    assert refused(QWEN, 1000) is None
    catalog.engine_reported(0, [lora("sql", LLAMA)])
    assert refused("sql", 1000) == "prompt_exceeds_ttft_budget"  # the base model's budget
    # requests queued for llama do not count in qwen's projection
    for _ in range(6):
        demand_for(sched, catalog, LLAMA, 400).__enter__()
    assert learning.pending.count == 6
    assert learning.pending_for(catalog.models[1]).count == 0
    assert refused(LLAMA, 400) == "ttft_budget_exceeded"
    assert refused(QWEN, 400) is None


def test_output_lengths_are_learned_per_model_and_adapters_start_from_their_base() -> None:
    catalog, _, learning, _ = fleet(two_models())
    llama, qwen = catalog.models
    assert learning.lengths(llama) is learning.output.routes  # the first model: the default
    for _ in range(200):
        learning.lengths(qwen)["chat"].observe(100, 10)
    assert learning.lengths(qwen)["chat"].expected(100) < 20
    assert learning.lengths(llama)["chat"].expected(100) == pytest.approx(50, abs=5)
    catalog.engine_reported(3, [lora("q-lora", QWEN)])
    adapter = catalog.resolve("q-lora")
    assert adapter is not None
    assert learning.lengths(adapter)["chat"].expected(100) < 20  # a copy of qwen's
    for _ in range(300):
        learning.lengths(adapter)["chat"].observe(100, 90)
    assert learning.lengths(adapter)["chat"].expected(100) > 60
    assert learning.lengths(qwen)["chat"].expected(100) < 20
    stored = learning.output.as_json()
    assert set(stored["models"]) == {QWEN, "q-lora"}
    again = Learning([], None)
    again.output.load(orjson.loads(orjson.dumps(stored)))
    assert again.output.for_model("q-lora")["chat"].expected(100) > 60


# ---------------------------------------------------------------- metrics


def test_model_boards_add_labelled_samples_beside_the_totals() -> None:
    board, llama, qwen = Board(engines=1), Board(engines=1), Board(engines=1)
    registry = build_registry(board, lambda: ["a0"], models=[(LLAMA, llama), (QWEN, qwen)])
    for model_board, cls, reason in ((llama, "completed", None), (qwen, "rejected",
                                                                  "queue_full")):
        ticket, _ = board.arrive(10)
        model_ticket, _ = model_board.arrive(10)
        for t in (ticket, model_ticket):
            t.sized(5)
            t.finish(cls, reason)
        model_board.observe("ttft", 0.1)  # latencies go to the model's board only
    ticket, _ = board.arrive(10)  # a request without a model (a 404): totals only
    ticket.finish("invalid_requests", "model_not_found")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(render(registry).decode())
               for s in family.samples}
    assert samples[("narwhal_offered_total", ())] == 3
    assert samples[("narwhal_offered_total", (("model", LLAMA),))] == 1
    assert samples[("narwhal_offered_total", (("model", QWEN),))] == 1
    assert samples[("narwhal_completed_total", (("model", LLAMA),))] == 1
    assert samples[("narwhal_rejected_total", (("model", QWEN), ("reason", "queue_full")))] == 1
    assert samples[("narwhal_rejected_total", (("reason", "queue_full"),))] == 1
    assert ("narwhal_invalid_requests_total", (("model", LLAMA), ("reason", "model_not_found"))
            ) not in samples
    assert samples[("narwhal_retained_requests", (("model", QWEN),))] == 0
    board.observe("ttft", 0.3)  # a request without a model board (none in practice)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(render(registry).decode())
               for s in family.samples}
    assert samples[("narwhal_ttft_seconds_count", ())] == 3  # the sum of every board
    assert samples[("narwhal_ttft_seconds_sum", ())] == pytest.approx(0.5)
    assert samples[("narwhal_ttft_seconds_count", (("model", LLAMA),))] == 1
    assert samples[("narwhal_ttft_seconds_bucket", (("le", "0.1"), ("model", QWEN)))] == 1
    assert samples[("narwhal_ttft_seconds_bucket", (("le", "0.2"),))] == 2
    assert samples[("narwhal_e2e_seconds_count", (("model", LLAMA),))] == 0
    assert ("narwhal_queued_requests", (("model", LLAMA),)) not in samples  # not per model


def test_one_model_keeps_the_exposition_unlabelled() -> None:
    board = Board(engines=1)
    text = render(build_registry(board, lambda: ["a0"])).decode()
    assert "model=" not in text


def test_served_repr_and_placement_set() -> None:
    served = Served("x", 0, engines=frozenset({2}))
    assert repr(served) == "Served('x')" and served.on(2) and not served.on(1)
    assert Served("y", 0).on(7)
