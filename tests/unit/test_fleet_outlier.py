"""Outlier ejection: the transport and content detectors, the ejection cap and the reporting,
over real Engine objects and a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from narwhal.config import EngineConfig, Health
from narwhal.config.loader import parse_config
from narwhal.config.schema import ConfigError
from narwhal.fleet import outlier as out
from narwhal.fleet.engine import Engine
from narwhal.fleet.engine import Health as State
from narwhal.fleet.health import HealthMonitor
from narwhal.fleet.outlier import (
    CONTENT_KINDS,
    FAILURE_KINDS,
    TRANSPORT_KINDS,
    EjectionState,
    Fleet,
    Outlier,
    kind_for_code,
    metric_families,
)
from narwhal.upstream.client import EngineClient

BASE = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_fleet(n: int, *, percent: int = 50, threshold: int = 3,
               roles: list[str] | None = None) -> tuple[list[Engine], Clock, list[str]]:
    """``n`` healthy engines joined into one fleet; ``changes`` logs "name:state" notices."""
    clock = Clock()
    engines: list[Engine] = []
    fleet = Fleet(engines, threshold=threshold, base_s=BASE, max_ejected_percent=percent,
                  clock=clock)
    changes: list[str] = []
    for i in range(n):
        cfg = EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9000 + i}",
                           role=(roles[i] if roles else "mixed"))  # type: ignore[arg-type]
        engine = Engine(i, cfg, EngineClient(cfg.url))
        engine.health = State.HEALTHY
        engines.append(engine)

        def notify(engine: Engine = engine) -> None:
            changes.append(f"{engine.name}:{engine.breaker.state.value}")

        engine.breaker.join(fleet, engine, notify)
    return engines, clock, changes


def ejected(engines: list[Engine]) -> list[str]:
    return [e.name for e in engines if e.breaker.ejected]


def record(engine: Engine, kind: str, times: int = 1) -> None:
    for _ in range(times):
        engine.breaker.record(kind)


# -- the interface ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["", "OK", "engine_error", "timeout", True, False, None])
def test_record_accepts_only_the_known_kinds(kind: object) -> None:
    (e0,), _, _ = make_fleet(1)
    with pytest.raises(ValueError, match="unknown attempt verdict"):
        e0.breaker.record(kind)  # type: ignore[arg-type]
    assert e0.breaker.attempts == 0


def test_kind_tuples_partition_the_failures() -> None:
    assert set(TRANSPORT_KINDS) | set(CONTENT_KINDS) == set(FAILURE_KINDS)
    assert not set(TRANSPORT_KINDS) & set(CONTENT_KINDS)
    assert {"ok", "neutral", *FAILURE_KINDS} == out.KINDS


@pytest.mark.parametrize(("code", "kind"), [
    ("malformed_engine_output", "malformed_engine_output"),
    ("unsupported_engine_field", "unsupported_engine_field"),
    ("engine_error", "engine_error_event")])
def test_kind_for_code(code: str, kind: str) -> None:
    assert kind_for_code(code) == kind


def test_kind_for_code_refuses_other_codes() -> None:
    with pytest.raises(ValueError):
        kind_for_code("deadline_expired")


# -- transport: consecutive failures ---------------------------------------------------------
@pytest.mark.parametrize("kind", TRANSPORT_KINDS)
def test_consecutive_transport_failures_eject_and_an_ok_resets_the_count(kind: str) -> None:
    engines, _, changes = make_fleet(2)
    e0 = engines[0]
    record(e0, kind, 2)
    record(e0, "ok")
    record(e0, kind, 2)
    assert not e0.breaker.ejected and e0.serves()
    record(e0, kind)
    assert e0.breaker.state is EjectionState.OPEN and not e0.serves()
    assert e0.breaker.kind == "transport" and changes == ["e0:open"]
    assert e0.breaker.failures[kind] == 5 and e0.breaker.attempts == 6


def test_content_failures_and_neutral_verdicts_do_not_count_as_consecutive() -> None:
    engines, _, _ = make_fleet(2)
    e0 = engines[0]
    record(e0, "reset", 2)
    record(e0, "malformed_engine_output")
    record(e0, "neutral", 5)
    assert e0.breaker.consecutive == 2 and not e0.breaker.ejected
    record(e0, "connect")
    assert e0.breaker.kind == "transport"


def test_neutral_counts_for_nothing() -> None:
    engines, _, _ = make_fleet(2, threshold=1)
    record(engines[0], "neutral", 20)
    assert not engines[0].breaker.ejected
    assert engines[0].breaker.attempts == 20 and sum(engines[0].breaker.failures.values()) == 0


# -- ejection time and the half-open trial ---------------------------------------------------
def test_ejection_then_one_trial_that_returns_it() -> None:
    engines, clock, changes = make_fleet(2, threshold=1)
    b = engines[0].breaker
    record(engines[0], "status_5xx")
    clock.now += BASE - 0.1
    assert not b.allows()
    clock.now += 0.2
    assert b.allows() and b.describe() == "half_open"
    b.begin()  # the trial goes out
    assert not b.allows()  # nobody else until its verdict
    b.record("ok")
    assert b.state is EjectionState.CLOSED and b.allows() and b.kind is None
    assert changes == ["e0:open", "e0:closed"]


def test_failed_trial_ejects_again_for_longer_up_to_the_cap_factor() -> None:
    engines, clock, _ = make_fleet(2, threshold=1)
    b = engines[0].breaker
    b.record("connect")
    times = [b.ejected_for]
    for _ in range(out.MAX_FACTOR + 2):
        clock.now += b.ejected_for
        assert b.allows()
        b.begin()
        b.record("header_timeout")
        times.append(b.ejected_for)
    assert times[:3] == [BASE, 2 * BASE, 3 * BASE]
    assert max(times) == out.MAX_FACTOR * BASE and times[-1] == out.MAX_FACTOR * BASE
    assert b.ejected_total["transport"] == len(times)


def test_ejection_count_decays_while_back_in_service() -> None:
    engines, clock, _ = make_fleet(2, threshold=1)
    b = engines[0].breaker
    b.record("reset")
    clock.now += BASE
    b.begin()
    b.record("reset")  # second ejection: 2 * BASE
    clock.now += 2 * BASE
    b.begin()
    b.record("ok")
    clock.now += 1.5 * BASE  # one step of decay
    b.record("reset")
    assert b.ejected_for == 2 * BASE  # (2 - 1) + 1
    clock.now += 2 * BASE
    b.begin()
    b.record("ok")
    clock.now += 100 * BASE  # fully decayed
    b.record("reset")
    assert b.ejected_for == BASE


def test_trial_without_verdict_frees_the_trial() -> None:
    engines, clock, _ = make_fleet(2, threshold=1)
    b = engines[0].breaker
    b.record("reset")
    clock.now += BASE
    b.begin()
    assert not b.allows()
    b.record("neutral")  # the client went away: no verdict
    assert b.allows()
    b.begin()
    clock.now += BASE  # a lost verdict holds the trial for one base time only
    assert b.allows()


def test_late_verdicts_while_ejected_change_nothing() -> None:
    engines, _, _ = make_fleet(2, threshold=1)
    b = engines[0].breaker
    b.record("reset")
    b.record("ok")  # an attempt dispatched before the ejection
    b.record("reset")
    assert b.state is EjectionState.OPEN and b.ejected_total["transport"] == 1


def test_begin_outside_an_ejection_does_nothing() -> None:
    engines, _, _ = make_fleet(2)
    engines[0].breaker.begin()
    assert engines[0].breaker.allows()


# -- content: judged against the peers -------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("kind", CONTENT_KINDS)
def test_when_every_engine_fails_alike_nobody_is_ejected(n: int, kind: str) -> None:
    engines, clock, _ = make_fleet(n, percent=100)
    for round_ in range(60):  # the bad client's requests, interleaved with good ones
        for e in engines:
            record(e, kind)
            if round_ % 2:
                record(e, "ok")
        clock.now += 0.5
    assert ejected(engines) == []
    assert all(e.breaker.failures[kind] == 60 for e in engines)


def test_a_bad_client_alone_ejects_nobody() -> None:
    engines, _, _ = make_fleet(3, percent=100)
    for _ in range(50):
        for e in engines:
            record(e, "malformed_engine_output")
    assert ejected(engines) == []


def test_uneven_shares_of_a_bad_clients_requests_eject_nobody() -> None:
    # Placement is never exactly even: one engine gets twice the bad requests of another.
    engines, _, _ = make_fleet(3, percent=100)
    e0, e1, e2 = engines
    for _ in range(10):
        record(e0, "malformed_engine_output", 4)
        record(e1, "malformed_engine_output", 2)
        record(e2, "malformed_engine_output", 2)
        for e in engines:
            record(e, "ok", 4)
    assert ejected(engines) == []


@pytest.mark.parametrize("kind", CONTENT_KINDS)
@pytest.mark.parametrize("n", [2, 3])
def test_an_engine_failing_every_answer_is_ejected_while_its_peers_serve(
    n: int, kind: str
) -> None:
    engines, _, changes = make_fleet(n)
    bad, peers = engines[0], engines[1:]
    for i in range(out.MIN_VOLUME):
        assert not bad.breaker.ejected, i  # not before it has enough answers
        for p in peers:
            record(p, "ok")  # its failed attempts' retries, and their own traffic
        record(bad, kind)
    assert ejected(engines) == ["e0"] and bad.breaker.kind == "content"
    assert changes == ["e0:open"]
    assert all(p.serves() for p in peers)


def test_content_outlier_needs_peers_with_volume() -> None:
    engines, _, _ = make_fleet(2)
    record(engines[1], "ok", out.MIN_VOLUME - 1)
    record(engines[0], "malformed_engine_output", 50)
    assert ejected(engines) == []
    record(engines[1], "ok")
    record(engines[0], "malformed_engine_output")
    assert ejected(engines) == ["e0"]


def test_a_single_engine_is_never_ejected_for_content_or_transport() -> None:
    engines, _, _ = make_fleet(1, percent=100)
    record(engines[0], "malformed_engine_output", 100)
    record(engines[0], "reset", 100)
    assert ejected(engines) == []
    lone = Outlier("alone")  # not joined to any fleet
    for kind in FAILURE_KINDS:
        lone.record(kind)
        lone.record(kind)
        lone.record(kind)
    assert not lone.ejected and lone.allows()


def test_a_modest_excess_is_not_clearly_more() -> None:
    engines, _, _ = make_fleet(2)
    for _ in range(20):  # 40 % against 20 %: twice as often, not three times
        record(engines[0], "malformed_engine_output", 2)
        record(engines[0], "ok", 3)
        record(engines[1], "malformed_engine_output", 1)
        record(engines[1], "ok", 4)
    assert ejected(engines) == []


def test_old_answers_leave_the_window() -> None:
    engines, clock, _ = make_fleet(2)
    record(engines[1], "ok", 50)
    record(engines[0], "malformed_engine_output", out.MIN_VOLUME - 1)
    clock.now += out.WINDOW_S + 1
    record(engines[1], "ok", 50)
    record(engines[0], "malformed_engine_output")  # alone in the window: too few to judge
    assert ejected(engines) == []
    assert engines[0].breaker.window.totals(clock.now) == (1, 1)


def test_content_ejection_trial_and_a_fresh_start() -> None:
    engines, clock, _ = make_fleet(2)
    bad, good = engines
    record(good, "ok", 20)
    record(bad, "malformed_engine_output", out.MIN_VOLUME)
    assert bad.breaker.kind == "content"
    clock.now += BASE
    bad.breaker.begin()
    record(bad, "unsupported_engine_field")  # the trial fails on content: out again
    assert bad.breaker.state is EjectionState.OPEN and bad.breaker.ejected_for == 2 * BASE
    clock.now += 2 * BASE
    bad.breaker.begin()
    record(bad, "ok")
    assert not bad.breaker.ejected
    # Back in service, it is judged on what it does from now on.
    record(bad, "malformed_engine_output", out.MIN_VOLUME - 1)
    assert not bad.breaker.ejected
    record(bad, "malformed_engine_output")
    assert bad.breaker.ejected


def test_a_transport_ejected_engine_that_answers_its_trial_returns() -> None:
    engines, clock, _ = make_fleet(2, threshold=1)
    b = engines[0].breaker
    b.record("connect")
    clock.now += BASE
    b.begin()
    b.record("malformed_engine_output")  # it answers: content is judged apart
    assert not b.ejected


# -- the cap ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "percent", "most"), [
    (4, 50, 2), (2, 50, 1), (3, 50, 1), (5, 50, 2), (2, 100, 1), (4, 100, 3), (10, 10, 1),
    (4, 0, 0), (1, 100, 0)])
def test_never_more_than_the_cap(n: int, percent: int, most: int) -> None:
    engines, _, _ = make_fleet(n, percent=percent, threshold=1)
    for e in engines:
        record(e, "reset", 3)
    assert len(ejected(engines)) == most
    held = [e for e in engines if not e.breaker.ejected]
    assert all(e.breaker.capped["transport"] == 1 for e in held)  # once per episode
    assert any(e.serves() for e in engines)


def test_the_last_engine_passing_its_probes_stays() -> None:
    engines, _, _ = make_fleet(4, percent=100, threshold=1)
    for e in engines[1:]:
        e.health = State.UNHEALTHY
    record(engines[1], "connect")  # failing its probes: ejecting it changes nothing
    assert ejected(engines) == ["e1"]
    record(engines[0], "connect", 5)
    assert not engines[0].breaker.ejected and engines[0].serves()
    engines[2].health = State.HEALTHY  # another passes its probes again: now it may go
    record(engines[0], "connect")
    assert engines[0].breaker.ejected


def test_drained_and_maintenance_engines_do_not_count_as_placeable() -> None:
    engines, _, _ = make_fleet(3, percent=100, threshold=1)
    engines[1].draining = True
    engines[2].maintenance = True
    record(engines[0], "reset", 3)
    assert not engines[0].breaker.ejected


def test_the_last_engine_of_a_role_stays() -> None:
    engines, _, _ = make_fleet(4, percent=100, threshold=1,
                               roles=["prefill", "prefill", "decode", "decode"])
    for e in engines:
        record(e, "reset")
    assert sorted(ejected(engines)) == ["e0", "e2"]


def test_a_capped_engine_is_ejected_once_a_slot_frees() -> None:
    engines, clock, _ = make_fleet(2, threshold=1)
    e0, e1 = engines
    record(e0, "reset")
    record(e1, "reset")
    assert ejected(engines) == ["e0"] and e1.breaker.capped["transport"] == 1
    clock.now += BASE
    e0.breaker.begin()
    record(e0, "ok")  # e0 returns
    record(e1, "reset")  # still failing: now it may go
    assert ejected(engines) == ["e1"]


def test_content_ejection_respects_the_cap() -> None:
    engines, _, _ = make_fleet(3)
    e0, e1, e2 = engines
    record(e2, "ok", 40)
    record(e0, "malformed_engine_output", out.MIN_VOLUME)
    assert ejected(engines) == ["e0"]
    record(e1, "malformed_engine_output", 40)
    assert ejected(engines) == ["e0"] and e1.breaker.capped["content"] == 1


# -- reporting -------------------------------------------------------------------------------
def test_describe_shows_attempts_failures_and_the_ejection() -> None:
    engines, _, _ = make_fleet(2, threshold=2)
    e0 = engines[0]
    record(e0, "ok", 3)
    record(e0, "malformed_engine_output")
    record(e0, "status_5xx", 2)
    d = e0.describe({"prefill": 0, "decode": 0})
    assert d["attempts"] == 6 and d["breaker"] == "open" and d["state"] == "circuit_open"
    assert d["failures"] == {**dict.fromkeys(FAILURE_KINDS, 0), "malformed_engine_output": 1,
                             "status_5xx": 2}
    ej = d["ejection"]
    assert ej["state"] == "open" and ej["kind"] == "transport" and ej["remaining_s"] == BASE
    assert ej["ejections"] == {"transport": 1, "content": 0}
    assert ej["window"]["answers"] == 4 and ej["window"]["content_failures"] == 1


def test_metric_families() -> None:
    engines, _, _ = make_fleet(2, threshold=1)
    record(engines[0], "ok")
    record(engines[0], "connect")
    record(engines[1], "engine_error_event", 2)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in metric_families(engines) for s in fam.samples}
    assert samples[("narwhal_engine_attempts_total", (("engine", "e0"),))] == 2
    assert samples[("narwhal_engine_attempt_failures_total",
                    (("engine", "e0"), ("reason", "connect")))] == 1
    assert samples[("narwhal_engine_attempt_failures_total",
                    (("engine", "e1"), ("reason", "engine_error_event")))] == 2
    assert samples[("narwhal_engine_ejections_total",
                    (("engine", "e0"), ("kind", "transport")))] == 1
    assert samples[("narwhal_engine_ejected", (("engine", "e0"),))] == 1
    assert samples[("narwhal_engine_ejected", (("engine", "e1"),))] == 0
    assert samples[("narwhal_engine_ejections_capped_total",
                    (("engine", "e1"), ("kind", "content")))] == 0


# -- wiring ----------------------------------------------------------------------------------
def test_health_monitor_joins_the_fleet_with_its_settings() -> None:
    cfgs = [EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9100 + i}") for i in range(2)]
    engines = [Engine(i, c, EngineClient(c.url)) for i, c in enumerate(cfgs)]
    changed: list[str] = []
    monitor = HealthMonitor(engines, Health(interval_s=0.5, failures_to_evict=4,
                                            max_ejected_percent=100),
                            lambda e: changed.append(e.name))
    fleet = monitor.outliers
    assert (fleet.threshold, fleet.base_s, fleet.max_ejected_percent) == (4, 2.0, 100)
    for e in engines:
        e.health = State.HEALTHY
    record(engines[1], "reset", 4)
    assert engines[1].breaker.ejected and changed == ["e1"]


def test_max_ejected_percent_config() -> None:
    base = {"model": "m", "engines": [{"name": "a", "url": "http://h:1"}]}
    assert parse_config(base).health.max_ejected_percent == 50
    for bad in (-1, 101, 50.5, True):
        with pytest.raises(ConfigError, match=r"health\.max_ejected_percent"):
            parse_config({**base, "health": {"max_ejected_percent": bad}})


def test_ejection_end_wakes_placement() -> None:
    async def run() -> list[str]:
        engines: list[Engine] = []
        fleet = Fleet(engines, threshold=1, base_s=0.05)
        seen: list[str] = []
        for i in range(2):
            cfg = EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{9200 + i}")
            engine = Engine(i, cfg, EngineClient(cfg.url))
            engine.health = State.HEALTHY
            engines.append(engine)
        b = engines[0].breaker
        b.join(fleet, engines[0], lambda: seen.append(b.state.value))
        b.record("reset")
        await asyncio.sleep(0.15)
        return seen

    assert asyncio.run(run()) == ["open", "half_open"]
