"""The pure parts of changing a running router: which keys need a restart, the engine list
from its sources, board slots, the configuration as data, discovery's entries, and the
fleet document shared by workers."""

from __future__ import annotations

import dataclasses
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from narwhal.config import MAX_ENGINES, DnsDiscovery, EngineSettings, load_config, parse_config
from narwhal.config.loader import config_data
from narwhal.control.changes import assign_slots, engine_entries, restart_keys
from narwhal.control.discovery import dns_engine_name, dns_entries, file_entries
from narwhal.control.store import FileStore, empty_document

EXAMPLE = Path(__file__).resolve().parents[2] / "narwhal.example.yaml"


def base(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "engines": [{"name": "a", "url": "http://10.0.0.1:8000"}], **extra}


# -- the configuration as data ---------------------------------------------------------------
@pytest.mark.parametrize("data", [
    base(),
    base(serving={"max_migrations": 0}, cluster={"backend": "redis", "url": "redis://r:6379"}),
    {"models": [{"name": "x", "aliases": ["y"], "ttft_budget_s": 1.0}, {"name": "z"}],
     "engines": [{"name": "a", "url": "http://a:1", "models": ["x", "z"],
                  "token_timeout_s": None}]},
    {"model": "m", "discovery": {"dns": {"name": "svc", "engine": {"max_decode": 4}}}},
])
def test_config_data_round_trips(data: dict[str, Any]) -> None:
    config = parse_config(data)
    assert parse_config(config_data(config)) == config


def test_config_data_of_the_example_round_trips() -> None:
    config = load_config(EXAMPLE)
    assert parse_config(config_data(config)) == config
    assert "listen" not in config_data(config)  # every key at its default is left out


# -- restart keys ----------------------------------------------------------------------------
def test_live_keys_and_engines_need_no_restart() -> None:
    old = parse_config(base())
    new = parse_config({**base(admission={"ttft_budget_s": 5, "queue_limit": 3},
                               health={"interval_s": 2, "monitoring_stale_s": 20},
                               scheduling={"policy": "least_loaded"}),
                        "engines": [{"name": "b", "url": "http://10.0.0.2:8000"}]})
    assert restart_keys(old, new) == []


def test_restart_keys_are_named_in_file_order() -> None:
    old = parse_config(base())
    new = parse_config(base(listen={"port": 9}, admission={"mode": "open"},
                            serving={"max_headers": 5}, tracing={"service_name": "x"}))
    assert restart_keys(old, new) == ["listen.port", "serving.max_headers", "admission.mode",
                                      "tracing.service_name"]


def test_model_names_need_a_restart_but_budgets_do_not() -> None:
    def models(name: str, budget: float) -> Any:
        return parse_config({"models": [{"name": name, "ttft_budget_s": budget}],
                             "engines": [{"name": "a", "url": "http://a:1"}]})

    assert restart_keys(models("x", 1.0), models("x", 3.0)) == []
    assert restart_keys(models("x", 1.0), models("y", 1.0)) == ["models"]


# -- the engine list -------------------------------------------------------------------------
def test_engine_entries_file_wins_then_admin_then_discovery() -> None:
    data = {"engines": [{"name": "a", "url": "u1"}, {"name": "b", "url": "u2"}]}
    out = engine_entries(data, added=[{"name": "a", "url": "other"}, {"name": "c", "url": "u3"}],
                         removed=["b"],
                         discovered=[{"name": "c", "url": "dup"}, {"name": "d", "url": "u4"}])
    assert out == [{"name": "a", "url": "u1"}, {"name": "c", "url": "u3"},
                   {"name": "d", "url": "u4"}]


# -- slots -------------------------------------------------------------------------------------
def test_slots_are_kept_while_the_url_stays_and_new_ones_are_never_used_before() -> None:
    current = {"a": (0, "u0"), "b": (1, "u1")}
    slots, used = assign_slots([("b", "u1"), ("c", "u2"), ("a", "new")], current, 2, {})
    assert slots == {"b": (1, "u1"), "c": (2, "u2"), "a": (3, "new")}
    assert used == 4


def test_slots_are_reused_when_all_were_used_only_where_nothing_is_in_flight() -> None:
    current = {f"e{k}": (k, "u") for k in range(2, MAX_ENGINES)}
    slots, used = assign_slots([*((n, "u") for n in current), ("x", "v")], current,
                               MAX_ENGINES, {0: True})
    assert slots["x"] == (1, "v") and used == MAX_ENGINES
    with pytest.raises(ValueError, match="no free engine slot"):
        assign_slots([*((n, "u") for n in current), ("x", "v")], current, MAX_ENGINES,
                     {0: True, 1: True})


# -- discovery ---------------------------------------------------------------------------------
def test_dns_entries_name_engines_by_address_with_the_template() -> None:
    config = DnsDiscovery(name="svc", port=8001,
                          engine=dataclasses.replace(EngineSettings(), max_decode=4))
    entries = dns_entries(config, ["10.0.0.9", "fd00::1", "10.0.0.10", "10.0.0.9"])
    assert entries == [
        {"max_decode": 4, "name": "10.0.0.9", "url": "http://10.0.0.9:8001"},
        {"max_decode": 4, "name": "10.0.0.10", "url": "http://10.0.0.10:8001"},
        {"max_decode": 4, "name": "fd00--1", "url": "http://[fd00::1]:8001"},
    ]
    assert dns_engine_name("fd00::1") == "fd00--1"
    parsed = parse_config({"model": "m", "engines": entries})
    assert [e.host for e in parsed.engines] == ["10.0.0.9", "10.0.0.10", "fd00::1"]


def test_file_entries(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    path.write_text("- {name: a, url: 'http://a:1'}\n")
    assert file_entries(str(path)) == [{"name": "a", "url": "http://a:1"}]
    path.write_text("")
    assert file_entries(str(path)) == []
    path.write_text("name: a\n")
    with pytest.raises(ValueError, match="must be a YAML list"):
        file_entries(str(path))


# -- the shared document -------------------------------------------------------------------
def _bump(path: str, times: int) -> None:
    store = FileStore(path, empty_document({}))
    for _ in range(times):
        store.update(lambda doc: {**doc, "generation": doc["generation"] + 1})


def test_file_store_changes_are_serialised_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "fleet.json")
    FileStore(path, empty_document({"x": 1}))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_bump, args=(path, 50)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    store = FileStore(path, empty_document({}))  # an existing document is kept
    assert store.read()["generation"] == 150
    assert store.read()["data"] == {"x": 1}
    assert store.update(lambda doc: None) is None
    store.unlink()
    assert not Path(path).exists()
