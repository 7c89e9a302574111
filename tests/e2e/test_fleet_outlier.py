"""Outlier ejection end to end (issue 13, item 4): a client whose requests make every engine
fail takes no engine out; an engine that corrupts every answer is ejected while its peers
serve; the ejection cap holds. Real router and simulator processes, raw HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_support import (
    Counters,
    FaultProxy,
    chat,
    complete,
    engines,
    envelope,
    fleet_config,
    ready,
    start_sim_on,
)
from procs import Proc, metrics, start_router

pytestmark = pytest.mark.timeout(180)

INTERVAL = 0.5
EVICT = 3  # consecutive transport failures that eject; base ejection time EVICT * INTERVAL
BAD_REQUESTS = 30
ASKS = 16  # fresh connections: with --workers 2, both workers answer some of them


def _health(**extra: Any) -> dict[str, Any]:
    return {"interval_s": INTERVAL, "timeout_s": 0.5, "failures_to_evict": EVICT,
            "successes_to_restore": 2, "monitoring_stale_s": 10.0, **extra}


class Fleet:
    """``n`` simulators; the first ``faulty`` are reached through fault proxies."""

    def __init__(self, tmp: Path, n: int, *, faulty: int = 0, workers: int = 1,
                 **health: Any):
        self.sims = [start_sim_on(0) for _ in range(n)]
        self.proxies = [FaultProxy(int(s.url.rsplit(":", 1)[1])) for s in self.sims[:faulty]]
        urls = [p.url for p in self.proxies] + [s.url for s in self.sims[faulty:]]
        self.router: Proc = start_router(
            tmp, fleet_config(urls, health=_health(**health)), "--workers", str(workers))
        self.url = self.router.url

    def close(self) -> None:
        self.router.stop()
        for p in self.proxies:
            p.close()
        for s in self.sims:
            s.stop()


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[list[Fleet]]:
    made: list[Fleet] = []
    try:
        yield made
    finally:
        for f in made:
            f.close()


def _events(raw: bytes) -> list[Any]:
    return [json.loads(b[6:]) if b[6:] != b"[DONE]" else "[DONE]"
            for b in raw.split(b"\n\n") if b.startswith(b"data: ")]


def _assert_served(status: int, raw: bytes, stream: bool) -> None:
    assert status == 200, raw
    if stream:
        events = _events(raw)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]), raw


def _ejected(view: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(n for n, e in view.items() if e["ejection"]["state"] != "closed")


# -- (a) a bad client ejects nobody ----------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])
def test_requests_that_make_every_engine_fail_eject_no_engine(
    fleets: list[Fleet], tmp_path: Path, workers: int
) -> None:
    fleet = Fleet(tmp_path, 2, workers=workers)
    fleets.append(fleet)
    counters = Counters(fleet.url)
    bad_answers: list[tuple[int, bytes]] = []
    good_answers: list[tuple[int, bytes, bool]] = []
    bad_done = threading.Event()

    def bad_client() -> None:
        # Every engine emits Boolean token IDs for these: malformed output on each attempt.
        try:
            for _ in range(BAD_REQUESTS):
                status, _, raw = complete(fleet.url, chat("Tell me [[fault:bool_ids:0]]"))
                bad_answers.append((status, raw))
        finally:
            bad_done.set()

    def good_client() -> None:
        i = 0
        while not bad_done.is_set() or i < BAD_REQUESTS:
            stream = i % 2 == 0
            status, _, raw = complete(fleet.url, chat(stream=stream))
            good_answers.append((status, raw, stream))
            i += 1

    threads = [threading.Thread(target=bad_client), threading.Thread(target=good_client)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(bad_answers) == BAD_REQUESTS
    for status, raw in bad_answers:
        assert status == 502, raw
        assert envelope(raw)["code"] == "malformed_engine_output"
    for status, raw, stream in good_answers:  # the other client never noticed
        _assert_served(status, raw, stream)

    # Nobody ejected, on any worker; each bad request failed on both engines.
    for _ in range(ASKS):
        view = engines(fleet.url)
        assert _ejected(view) == [], view
        counts = [view[n]["failures"]["malformed_engine_output"] for n in ("e0", "e1")]
        assert counts[0] == counts[1] <= BAD_REQUESTS, view
        assert all(view[n]["ejection"]["ejections"] == {"transport": 0, "content": 0}
                   for n in view)
        if workers == 1:
            assert counts == [BAD_REQUESTS, BAD_REQUESTS]
    assert ready(fleet.url) == (200, {"ready": True})
    for i in range(4):  # and plain requests still go through
        status, _, raw = complete(fleet.url, chat(stream=i % 2 == 0))
        _assert_served(status, raw, i % 2 == 0)

    good = len(good_answers) + 4
    delta = counters.settled()
    assert delta["narwhal_offered_total"] == BAD_REQUESTS + good
    assert delta['narwhal_failed_total{reason="malformed_engine_output"}'] == BAD_REQUESTS
    assert delta["narwhal_completed_total"] == good
    assert not any(k.startswith("narwhal_rejected_total") for k in delta), delta
    if workers == 1:
        m = metrics(fleet.url)
        for name in ("e0", "e1"):
            key = f'narwhal_engine_attempt_failures_total{{engine="{name}",' \
                  'reason="malformed_engine_output"}'
            assert m[key] == BAD_REQUESTS
            assert m[f'narwhal_engine_ejected{{engine="{name}"}}'] == 0


# -- (b) an engine that corrupts every answer ------------------------------------------------
@pytest.mark.parametrize(("fault", "streams"), [("bool_ids:0", False),
                                                ("malformed_json:0", True)])
def test_an_engine_corrupting_every_answer_is_ejected_while_its_peers_serve(
    fleets: list[Fleet], tmp_path: Path, fault: str, streams: bool
) -> None:
    fleet = Fleet(tmp_path, 3, faulty=1)
    fleets.append(fleet)
    proxy = fleet.proxies[0]
    proxy.mode = f"fault:{fault}"
    counters = Counters(fleet.url)
    sent = 0
    # Attempts on e0 fail before anything reaches the client and are retried on a peer, so
    # every client is served; once e0 has failed clearly more often than its peers, it goes.
    while engines(fleet.url)["e0"]["ejection"]["state"] == "closed":
        assert sent < 120, engines(fleet.url)["e0"]
        stream = streams and sent % 2 == 0
        status, _, raw = complete(fleet.url, chat(stream=stream))
        _assert_served(status, raw, stream)
        sent += 1
    view = engines(fleet.url)
    e0 = view["e0"]
    assert e0["ejection"]["kind"] == "content" and e0["state"] == "circuit_open", e0
    assert e0["health"] == "healthy"  # its probes pass: only ejection holds it out
    reason = "malformed_engine_output"
    assert e0["failures"][reason] == proxy.posts and e0["attempts"] == proxy.posts
    for name in ("e1", "e2"):
        assert view[name]["ejection"]["state"] == "closed"
        assert view[name]["failures"][reason] == 0 and view[name]["state"] == "healthy"

    # The peers serve; e0 sees nothing but its half-open trials, each of which fails and
    # ejects it again.
    posts, ejections = proxy.posts, e0["ejection"]["ejections"]["content"]
    for i in range(12):
        stream = streams and i % 2 == 0
        status, _, raw = complete(fleet.url, chat(stream=stream))
        _assert_served(status, raw, stream)
        sent += 1
    after = engines(fleet.url)["e0"]["ejection"]
    assert proxy.posts - posts == after["ejections"]["content"] - ejections
    assert _ejected(engines(fleet.url)) == ["e0"]
    delta = counters.settled()
    assert delta["narwhal_offered_total"] == sent
    assert delta["narwhal_completed_total"] == sent  # each retried request counted once
    m = metrics(fleet.url)
    assert m['narwhal_engine_ejections_total{engine="e0",kind="content"}'] >= 1
    assert m['narwhal_engine_ejected{engine="e0"}'] == 1


# -- (c) the cap -----------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "bad", "percent", "most"), [(4, 3, 50, 2), (2, 2, 100, 1)])
def test_the_ejection_cap_holds(
    fleets: list[Fleet], tmp_path: Path, n: int, bad: int, percent: int, most: int
) -> None:
    fleet = Fleet(tmp_path, n, faulty=bad, max_ejected_percent=percent)
    fleets.append(fleet)
    for proxy in fleet.proxies:
        proxy.mode = "fault:http_500"  # their probes still pass
    counters = Counters(fleet.url)
    sent = 0
    seen_most = 0
    answers: dict[tuple[int, str | None], int] = {}
    for _ in range(60):
        status, _, raw = complete(fleet.url)
        sent += 1
        code = None if status == 200 else envelope(raw)["code"]
        answers[(status, code)] = answers.get((status, code), 0) + 1
        view = engines(fleet.url)
        out = _ejected(view)
        assert len(out) <= most, view
        seen_most = max(seen_most, len(out))
        assert ready(fleet.url) == (200, {"ready": True})
    assert seen_most == most
    # Some requests met two failing engines (502); none found no engine at all (503).
    assert set(answers) <= {(200, None), (502, "engine_error")}, answers
    view = engines(fleet.url)
    held = [e for name, e in view.items() if int(name[1:]) < bad and
            e["ejection"]["ejections"]["transport"] == 0]
    assert held and all(e["ejection"]["capped"]["transport"] >= 1 for e in held), view
    assert all(view[f"e{i}"]["failures"]["status_5xx"] >= EVICT for i in range(bad))
    delta = counters.settled()
    assert delta["narwhal_offered_total"] == sent
    assert delta.get("narwhal_completed_total", 0) == answers.get((200, None), 0)
    assert delta.get('narwhal_failed_total{reason="engine_error"}', 0) == answers.get(
        (502, "engine_error"), 0)
    m = metrics(fleet.url)
    assert sum(m[f'narwhal_engine_ejected{{engine="e{i}"}}'] for i in range(n)) <= most
    assert sum(m[f'narwhal_engine_ejections_capped_total{{engine="e{i}",kind="transport"}}']
               for i in range(n)) >= 1
