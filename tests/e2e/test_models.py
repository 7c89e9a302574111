"""Several models and LoRA adapters behind one router, end to end with the openai SDK: two base
models and two adapters over four simulated engines; an adapter loaded at run time routable
after the next probe round (and gone after unloading); aliases answered with the alias; 404
for an unknown name; per-model budgets refusing independently; the accounting invariant per
model and in total, with one worker and with two."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fleet_support import wait_for
from procs import Proc, get_json, http, metrics, router_config, start_router, start_sim

pytestmark = pytest.mark.timeout(120)

LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B"
ALIAS = "llama-8b"
SQL, QCHAT = "sql-lora", "qwen-chat"  # adapters: of llama on a0, of qwen on b0
LLAMA_BUDGET_S = 0.3  # llama's own TTFT budget; qwen keeps admission's (2 s)
LONG_PROMPT = 3000  # token IDs: ~0.6 s of prefill at 5000 tokens/s, between the two budgets
MARK = "models-e2e"
CLASSES = ("rejected", "refused", "invalid_requests", "expired", "failed", "cancelled",
           "completed")
SIM_FLAGS = ("--prefill-tokens-per-s", "5000", "--prefill-overhead-ms", "2", "--tpot-ms", "2",
             "--output-len", "4")


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Proc]]:
    flags = {
        "a0": ("--served-model-name", LLAMA, "--lora", f"{SQL}=/adapters/sql"),
        "a1": ("--served-model-name", LLAMA),
        "b0": ("--model", QWEN, "--lora", f"{QCHAT}=/adapters/qwen-chat"),
        "b1": ("--model", QWEN),
    }
    procs: dict[str, Proc] = {}
    try:
        for name, own in flags.items():
            procs[name] = start_sim(*SIM_FLAGS, *own)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def models_config(sims: dict[str, Proc]) -> dict[str, Any]:
    engines = [{"name": name, "url": sim.url, "dialect": "vllm",
                "models": [LLAMA if name.startswith("a") else QWEN]}
               for name, sim in sims.items()]
    config = router_config([], engines=engines,
                           scheduling={"policy": "least_loaded"},
                           admission={"mode": "predictive", "ttft_budget_s": 2.0})
    del config["model"]
    config["models"] = [{"name": LLAMA, "aliases": [ALIAS], "ttft_budget_s": LLAMA_BUDGET_S},
                        {"name": QWEN}]
    return config


def ready(router: Proc) -> Proc:
    wait_for(lambda: get_json(router.url + "/ready") == {"ready": True}, timeout=30)
    return router


@pytest.fixture(scope="module")
def router(sims: dict[str, Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_router(tmp_path_factory.mktemp("models"), models_config(sims))
    try:
        yield ready(proc)
    finally:
        proc.stop()


def client(router: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                         timeout=20)


def ask(c: openai.OpenAI, model: str, *, stream: bool = False, tokens: int = 0) -> str:
    """One chat request (or, with ``tokens``, a completion of that many prompt IDs); returns
    the ``model`` of the answer (every chunk's, when streamed, checked equal)."""
    if tokens:
        prompt = [100 + i % 800 for i in range(tokens)]
        return c.completions.create(model=model, prompt=prompt, max_tokens=2).model
    messages: Any = [{"role": "user", "content": f"{MARK} hello"}]
    if not stream:
        return c.chat.completions.create(model=model, messages=messages, max_tokens=4).model
    names = {chunk.model for chunk in c.chat.completions.create(
        model=model, messages=messages, max_tokens=4, stream=True)}
    assert len(names) == 1, names
    return names.pop()


def received(sim: Proc) -> list[str]:
    """The model names of the test's requests among the simulator's recent ones."""
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return [r["body"]["model"] for r in json.loads(raw)["recent"]
            if MARK in json.dumps(r["body"])]


def listed(sim: Proc) -> int:
    """How many times the simulator answered GET /v1/models (the router's probes)."""
    _, _, raw = http(sim.url, "GET", "/sim/stats")
    return int(json.loads(raw)["models_listed"])


def after_next_probe_round(sim: Proc) -> None:
    """Return once a probe round that began after now has been handled: the router probes in
    rounds, one after another, so when the engine sees a second listing request after now,
    the round of the first (which saw the engine as it is now) is over."""
    seen = listed(sim)
    wait_for(lambda: listed(sim) >= seen + 2, timeout=20)


def router_names(router: Proc) -> set[str]:
    return {card["id"] for card in get_json(router.url + "/v1/models")["data"]}


def engine_names(router: Proc) -> dict[str, list[str]]:
    return {e["name"]: e["models"] for e in get_json(router.url + "/engines")["engines"]}


def by_model(m: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per-model sums: offered, terminal (every outcome class) and retained."""
    out: dict[str, dict[str, float]] = {}
    for series, value in m.items():
        found = re.search(r'model="([^"]*)"', series)
        if found is None:
            continue
        name = series.split("{", 1)[0]
        sums = out.setdefault(found.group(1), {"offered": 0.0, "terminal": 0.0,
                                               "retained": 0.0, "completed": 0.0})
        if name == "narwhal_offered_total":
            sums["offered"] += value
        elif name == "narwhal_retained_requests":
            sums["retained"] += value
        elif name in {f"narwhal_{c}_total" for c in CLASSES}:
            sums["terminal"] += value
            if name == "narwhal_completed_total":
                sums["completed"] += value
    return out


def settled_invariant(router: Proc) -> dict[str, dict[str, float]]:
    """Wait until nothing is retained; then the invariant holds per model and in total, and
    the models' offered requests are the total's less those refused before a model was
    known (404s, malformed bodies). Returns the per-model sums."""
    m = wait_for(lambda: (lambda m: m if m.get("narwhal_retained_requests") == 0 else None)(
        metrics(router.url)), timeout=15)
    total_terminal = sum(v for k, v in m.items() for c in CLASSES
                         if k.split("{")[0] == f"narwhal_{c}_total" and "model=" not in k)
    assert m["narwhal_offered_total"] == total_terminal
    models = by_model(m)
    assert set(models) == {LLAMA, QWEN}
    for name, sums in models.items():
        assert sums["offered"] == sums["terminal"] + sums["retained"], (name, sums)
        assert sums["retained"] == 0
    no_model = sum(v for k, v in m.items()
                   if k.startswith("narwhal_invalid_requests_total{") and "model=" not in k)
    assert sum(s["offered"] for s in models.values()) == m["narwhal_offered_total"] - no_model
    return models


# ---------------------------------------------------------------- one worker


def test_model_list_names_models_aliases_and_adapters(router: Proc) -> None:
    cards = {m.id: m for m in client(router).models.list()}
    assert set(cards) == {LLAMA, ALIAS, QWEN, SQL, QCHAT}
    parents = {name: (card.model_extra or {}).get("parent") for name, card in cards.items()}
    assert parents == {LLAMA: None, ALIAS: None, QWEN: None, SQL: LLAMA, QCHAT: QWEN}
    assert (cards[SQL].model_extra or {}).get("root") == "/adapters/sql"
    assert engine_names(router) == {"a0": [LLAMA, ALIAS, SQL], "a1": [LLAMA, ALIAS],
                                    "b0": [QWEN, QCHAT], "b1": [QWEN]}


def test_each_name_reaches_only_its_engines_and_is_answered_as_sent(
        router: Proc, sims: dict[str, Proc]) -> None:
    for sim in sims.values():
        http(sim.url, "POST", "/sim/reset")
    c = client(router)
    for name in (LLAMA, ALIAS, QWEN, SQL, QCHAT):
        for stream in (False, True):
            for _ in range(3):
                assert ask(c, name, stream=stream) == name
    seen = {engine: received(sim) for engine, sim in sims.items()}
    # the engines got canonical names only, each on the engines that serve it
    assert set(seen["a0"]) <= {LLAMA, SQL} and set(seen["a1"]) == {LLAMA}
    assert set(seen["b0"]) <= {QWEN, QCHAT} and set(seen["b1"]) == {QWEN}
    assert seen["a0"].count(SQL) == 6 and seen["b0"].count(QCHAT) == 6
    assert sum(s.count(LLAMA) for s in seen.values()) == 12  # the name and its alias
    assert sum(s.count(QWEN) for s in seen.values()) == 6


def test_an_unknown_name_is_404(router: Proc) -> None:
    c = client(router)
    for name in ("gpt-4o", LLAMA.lower(), "qwen-chat-v2"):
        with pytest.raises(openai.NotFoundError) as info:
            ask(c, name)
        body: Any = info.value.body
        assert (body["code"], body["param"], body["type"]) == (
            "model_not_found", "model", "invalid_request_error")


def test_an_adapter_loaded_at_run_time_is_routable_after_one_probe_round(
        router: Proc, sims: dict[str, Proc]) -> None:
    a1 = sims["a1"]
    c = client(router)
    with pytest.raises(openai.NotFoundError):
        ask(c, "fresh")
    status, _, raw = http(a1.url, "POST", "/v1/load_lora_adapter",
                          {"lora_name": "fresh", "lora_path": "/adapters/fresh"})
    assert (status, raw) == (200, b"Success: LoRA adapter 'fresh' added successfully.")
    after_next_probe_round(a1)
    assert "fresh" in router_names(router) and "fresh" in engine_names(router)["a1"]
    http(a1.url, "POST", "/sim/reset")
    for stream in (False, True):
        assert ask(c, "fresh", stream=stream) == "fresh"
    assert received(a1) == ["fresh", "fresh"]  # only the engine that has it loaded
    # llama's other adapter, now loaded on a1 too, is placed on both engines
    http(a1.url, "POST", "/v1/load_lora_adapter", {"lora_name": SQL, "lora_path": "/a/sql"})
    after_next_probe_round(a1)
    for sim in sims.values():
        http(sim.url, "POST", "/sim/reset")
    for _ in range(8):
        assert ask(c, SQL) == SQL
    assert received(sims["a0"]).count(SQL) + received(a1).count(SQL) == 8
    assert received(a1).count(SQL) > 0 and received(sims["a0"]).count(SQL) > 0
    # unloaded: gone from the router after the next probe round, 404 again
    for name in ("fresh", SQL):
        status, _, _ = http(a1.url, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
        assert status == 200
    after_next_probe_round(a1)
    assert "fresh" not in router_names(router) and SQL in router_names(router)
    assert engine_names(router)["a1"] == [LLAMA, ALIAS]
    with pytest.raises(openai.NotFoundError):
        ask(c, "fresh")
    assert ask(c, SQL) == SQL  # still on a0


def test_per_model_budgets_refuse_independently(router: Proc) -> None:
    c = client(router)
    # the same long prompt: over llama's own budget (its alias and adapter share it), well
    # within qwen's (admission.ttft_budget_s)
    for name in (LLAMA, ALIAS, SQL):
        with pytest.raises(openai.RateLimitError) as info:
            ask(c, name, tokens=LONG_PROMPT)
        body: Any = info.value.body
        assert body["code"] == "prompt_exceeds_ttft_budget"
        assert info.value.response.headers.get("retry-after") is None
    for name in (QWEN, QCHAT):
        assert ask(c, name, tokens=LONG_PROMPT) == name
    assert ask(c, LLAMA, tokens=10) == LLAMA  # a short prompt fits llama's budget
    models = by_model(metrics(router.url))
    refused = metrics(router.url)
    llama_refused = sum(v for k, v in refused.items() if k.startswith("narwhal_refused_total{")
                        and f'model="{LLAMA}"' in k and "prompt_exceeds_ttft_budget" in k)
    qwen_refused = sum(v for k, v in refused.items() if k.startswith("narwhal_refused_total{")
                       and f'model="{QWEN}"' in k)
    assert llama_refused >= 3 and qwen_refused == 0
    assert models[QWEN]["completed"] > 0


def test_the_invariant_holds_per_model_and_in_total(router: Proc) -> None:
    settled_invariant(router)


# ---------------------------------------------------------------- two workers


def test_two_workers_count_per_model_across_processes(
        sims: dict[str, Proc], tmp_path: Path) -> None:
    router = ready(start_router(tmp_path, models_config(sims), "--workers", "2"))
    try:
        assert len(router.workers()) == 2
        sent = {LLAMA: 0, QWEN: 0}
        lock = threading.Lock()
        errors: list[Exception] = []

        def load(names: tuple[str, ...], base: str) -> None:
            c = client(router)  # each thread its own connections: both workers take some
            try:
                for _ in range(6):
                    for name in names:
                        assert ask(c, name, stream=name != ALIAS) == name
                        with lock:
                            sent[base] += 1
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=load, args=names)
                   for names in (((LLAMA, ALIAS, SQL), LLAMA), ((QWEN, QCHAT), QWEN))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        with pytest.raises(openai.NotFoundError):
            ask(client(router), "nope")
        models = settled_invariant(router)
        # every request counted once, under its base model, whichever worker served it
        assert {name: sums["completed"] for name, sums in models.items()} == sent
        assert {name: sums["offered"] for name, sums in models.items()} == sent
        # an adapter loaded at run time reaches every worker (each probes on its own)
        b1 = sims["b1"]
        http(b1.url, "POST", "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": "/l"})
        try:
            wait_for(lambda: all("late" in router_names(router) for _ in range(10)),
                     timeout=20)
            c = client(router)
            assert all(ask(c, "late") == "late" for _ in range(6))
        finally:
            http(b1.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "late"})
        models = settled_invariant(router)
        assert models[QWEN]["completed"] == sent[QWEN] + 6
    finally:
        router.stop()
    assert not list(Path("/dev/shm").glob(f"narwhal-{router.proc.pid}.board*"))
