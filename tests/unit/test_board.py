"""The board through the binding: guards, limits, errors, two processes on one /dev/shm file."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from narwhal._narwhal_fast import Board, Slot, Ticket, acquire_slot

REASON_CLASSES = ("rejected", "refused", "invalid_requests", "expired", "failed")


def finished_total(snap: dict[str, Any]) -> int:
    by_reason = sum(sum(snap[cls].values()) for cls in REASON_CLASSES)
    return int(by_reason + snap["cancelled"] + snap["completed"])


def assert_consistent(snap: dict[str, Any]) -> None:
    assert snap["offered"] == finished_total(snap) + snap["retained"], snap


def assert_idle(snap: dict[str, Any]) -> None:
    assert_consistent(snap)
    assert snap["retained"] == snap["retention_held"] == snap["queued"] == 0
    assert all(e["prefill"] == e["decode"] == 0 for e in snap["engines"])


@pytest.fixture
def shm_path() -> Iterator[Path]:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    path = base / f"narwhal-test-board-{uuid.uuid4().hex}"
    yield path
    path.unlink(missing_ok=True)


def test_arrive_and_finish_keep_the_invariant() -> None:
    board = Board(engines=2)
    tickets = [board.arrive(2) for _ in range(3)]
    assert [admitted for _, admitted in tickets] == [True, True, False]
    assert [t.admitted for t, _ in tickets] == [True, True, False]
    snap = board.snapshot()
    assert (snap["offered"], snap["retained"], snap["retention_held"]) == (3, 3, 2)
    assert tickets[2][0].finish("rejected", "retention_full") is True
    assert tickets[2][0].finish("completed") is False
    assert tickets[2][0].finished
    tickets[0][0].sized(120)
    tickets[0][0].sized(999)
    assert tickets[0][0].finish("completed")
    assert tickets[1][0].finish("invalid_requests", "engine_rejected")
    snap = board.snapshot()
    assert snap["rejected"] == {"retention_full": 1}
    assert snap["invalid_requests"] == {"engine_rejected": 1}
    assert snap["refused"] == snap["expired"] == snap["failed"] == {}
    assert (snap["completed"], snap["cancelled"]) == (1, 0)
    assert snap["offered_prompt_tokens"] == 120
    assert snap["unsized_offered"] == 2
    assert_idle(snap)


def test_queue_places_are_checked_and_released() -> None:
    board = Board(engines=1)
    (a, _), (b, _) = board.arrive(10), board.arrive(10)
    assert a.enqueue(1) and a.queued
    assert a.enqueue(1), "a held place is not taken twice"
    assert not b.enqueue(1)
    assert board.snapshot()["queued"] == 1
    a.dequeue()
    a.dequeue()
    assert b.enqueue(1)
    b.finish("expired", "admission_wait_expired")
    assert not b.queued and board.snapshot()["queued"] == 0
    assert not b.enqueue(1), "a finished ticket does not queue"
    a.finish("refused", "ttft_budget_exceeded")
    assert_idle(board.snapshot())


def test_slots_are_guards() -> None:
    board = Board(engines=2)
    first = board.acquire_slot(1, "decode", 2)
    second = acquire_slot(board, 1, "decode", 2)
    assert isinstance(first, Slot) and isinstance(second, Slot)
    assert (first.engine, first.phase) == (1, "decode")
    assert board.acquire_slot(1, "decode", 2) is None
    assert board.acquire_slot(1, "prefill", 0) is None
    assert board.snapshot()["engines"][1] == {"prefill": 0, "decode": 2, "up": False}
    assert first.release() is True
    assert first.release() is False
    assert first.released
    del second
    assert_idle(board.snapshot())


def test_drop_is_a_safety_net() -> None:
    board = Board(engines=1)
    ticket, _ = board.arrive(5)
    assert ticket.enqueue(5)
    slot = board.acquire_slot(0, "prefill", 1)
    del ticket, slot
    snap = board.snapshot()
    assert (snap["cancelled"], snap["unsized_offered"]) == (1, 1)
    assert_idle(snap)

    cycle: list[Any] = []
    ticket, _ = board.arrive(5)
    cycle.extend([cycle, ticket, board.acquire_slot(0, "decode", 1)])
    del ticket, cycle
    gc.collect()
    snap = board.snapshot()
    assert snap["cancelled"] == 2
    assert_idle(snap)


def test_guards_outlive_the_board_object() -> None:
    board = Board(engines=1)
    ticket, _ = board.arrive(1)
    slot = board.acquire_slot(0, "decode", 1)
    del board  # the guards keep the region mapped on their own
    gc.collect()
    assert ticket.finish("completed")
    assert slot is not None and slot.release()


def test_bad_names_are_value_errors() -> None:
    board = Board(engines=2)
    ticket, _ = board.arrive(1)
    for cls, reason in [("lost", None), ("failed", None), ("failed", "oops"), ("completed", "x")]:
        with pytest.raises(ValueError):
            ticket.finish(cls, reason)
    assert not ticket.finished
    with pytest.raises(ValueError):
        board.acquire_slot(0, "generate", 1)
    with pytest.raises(ValueError):
        board.acquire_slot(2, "decode", 1)
    with pytest.raises(ValueError):
        board.set_engine_up(2, True)
    with pytest.raises(ValueError):
        board.observe("latency", 1.0)
    with pytest.raises(ValueError):
        board.observe("ttft", float("nan"))
    with pytest.raises(ValueError):
        Board(engines=0)
    assert ticket.finish("failed", "malformed_engine_output")


def test_histograms_and_engine_gauges() -> None:
    board = Board(engines=3)
    board.set_engine_up(2, True)
    for value in (0.0005, 0.001, 0.02, 100.0):
        board.observe("ttft", value)
    board.observe("output_tokens", 3)
    snap = board.snapshot()
    assert [e["up"] for e in snap["engines"]] == [False, False, True]
    ttft = snap["histograms"]["ttft"]
    assert ttft["buckets"][0] == (0.001, 2)
    assert ttft["buckets"][-2] == (60.0, 3)
    assert ttft["buckets"][-1] == (float("inf"), 4) and ttft["count"] == 4
    assert ttft["sum"] == pytest.approx(100.0215)
    assert snap["histograms"]["output_tokens"]["buckets"][:3] == [(1.0, 0), (2.0, 0), (4.0, 1)]
    assert set(snap["histograms"]) == {"ttft", "tpot", "queue_wait", "e2e", "output_tokens"}
    assert snap["histograms"]["tpot"]["buckets"][-2][0] == 1.0
    assert snap["histograms"]["output_tokens"]["buckets"][-2][0] == 32768.0


def test_shared_file_create_attach_unlink(shm_path: Path) -> None:
    parent = Board(engines=4, path=str(shm_path), create=True)
    assert parent.path == str(shm_path) and parent.engines == 4
    assert oct(shm_path.stat().st_mode & 0o777) == "0o600"
    worker = Board(engines=4, path=shm_path, create=False)
    ticket, _ = worker.arrive(1)
    assert parent.snapshot()["retained"] == 1
    with pytest.raises(ValueError, match="engines"):
        Board(engines=8, path=shm_path, create=False)
    ticket.finish("completed")
    parent.unlink()
    parent.unlink()
    assert not shm_path.exists()
    assert worker.snapshot()["completed"] == 1, "mappings outlive the file"
    with pytest.raises(FileNotFoundError):
        Board(engines=4, path=shm_path, create=False)
    shm_path.write_bytes(b"x" * 8192)
    with pytest.raises(ValueError, match="not a Narwhal board"):
        Board(engines=4, path=shm_path, create=False)


# --- two processes ------------------------------------------------------------------------

ENGINES, RETENTION, QUEUE, SLOTS, ROUNDS = 3, 5, 2, 2, 4000


def check_limits(snap: dict[str, Any]) -> None:
    assert_consistent(snap)
    assert snap["retention_held"] <= RETENTION and snap["queued"] <= QUEUE
    assert all(e["prefill"] <= SLOTS and e["decode"] <= SLOTS for e in snap["engines"])


def one_request(
    board: Board, i: int, held: list[tuple[Ticket, Slot, Slot]], tally: Counter[str]
) -> None:
    """One request's life; every fourth holds its places for a while."""
    ticket, admitted = board.arrive(RETENTION)
    tally["offered"] += 1
    outcome: tuple[str, str | None]
    if not admitted:
        outcome = ("rejected", "retention_full")
    elif not ticket.enqueue(QUEUE):
        outcome = ("rejected", "queue_full")
    else:
        ticket.sized(7)
        prefill = board.acquire_slot(i % ENGINES, "prefill", SLOTS)
        ticket.dequeue()
        decode = board.acquire_slot(i % ENGINES, "decode", SLOTS) if prefill else None
        if prefill is None or decode is None:
            outcome = ("expired", "admission_wait_expired")
        elif i % 4 == 0:
            held.append((ticket, prefill, decode))
            if len(held) > 3:
                old = held.pop(0)[0]
                old.finish("completed")
                tally["completed"] += 1
            return
        else:
            outcome = ("completed", None)
    ticket.finish(*outcome)
    tally[outcome[0] if outcome[1] is None else f"{outcome[0]}/{outcome[1]}"] += 1


def worker(path: str, start: Any, midway: Any, results: Any) -> None:
    board = Board(engines=ENGINES, path=path, create=False)
    held: list[tuple[Ticket, Slot, Slot]] = []
    tally: Counter[str] = Counter()
    start.wait()
    for i in range(ROUNDS):
        if i == ROUNDS // 2:
            # Both workers hold places here, whatever the host's scheduling did so far (a
            # worker's run takes milliseconds): the rest runs against the other's holdings,
            # and the parent has looked at the board while both were running.
            midway.wait()
        one_request(board, i, held, tally)
        if i % 16 == 0:
            check_limits(board.snapshot())
    for ticket, *_ in held:
        ticket.finish("completed")
        tally["completed"] += 1
    results.put((os.getpid(), dict(tally)))


def test_two_processes_share_limits_and_the_invariant(shm_path: Path) -> None:
    board = Board(engines=ENGINES, path=shm_path, create=True)
    ctx = multiprocessing.get_context("spawn")
    start, midway, results = ctx.Barrier(3), ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(str(shm_path), start, midway, results))
             for _ in range(2)]
    for proc in procs:
        proc.start()
    start.wait(timeout=60)
    check_limits(board.snapshot())  # the workers are running: they wait for us midway
    snapshots = 1
    midway.wait(timeout=60)
    while any(proc.is_alive() for proc in procs) and results.qsize() < 2:
        check_limits(board.snapshot())
        snapshots += 1
    tallies = [results.get(timeout=30)[1] for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert snapshots > 0
    total: Counter[str] = sum((Counter(t) for t in tallies), Counter())
    snap = board.snapshot()
    assert_idle(snap)
    assert snap["offered"] == total["offered"] == 2 * ROUNDS
    assert snap["completed"] == total["completed"]
    for cls in ("rejected", "expired"):
        expected = {k.split("/")[1]: n for k, n in total.items() if k.startswith(cls + "/")}
        assert snap[cls] == expected
    assert total["rejected/retention_full"] + total["rejected/queue_full"] > 0
    board.unlink()


def die_holding(path: str) -> None:
    """A worker killed while it holds requests, a queue place and slots."""
    board = Board(engines=ENGINES, path=path, create=False)
    kept = [board.arrive(RETENTION)[0] for _ in range(2)]
    kept[0].sized(11)
    assert kept[1].enqueue(QUEUE)
    kept += [board.acquire_slot(1, "prefill", SLOTS), board.acquire_slot(2, "decode", SLOTS)]
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_workers_share_is_reaped(shm_path: Path) -> None:
    board = Board(engines=ENGINES, path=shm_path, create=True)
    mine, _ = board.arrive(RETENTION)
    proc = multiprocessing.get_context("spawn").Process(target=die_holding, args=(str(shm_path),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    before = board.snapshot()
    assert (before["retained"], before["queued"], before["workers"]) == (3, 1, 2)
    assert before["engines"][1]["prefill"] == before["engines"][2]["decode"] == 1

    assert board.reap_dead() == 2
    assert board.reap_dead() == 0
    after = board.snapshot()
    assert_consistent(after)
    assert (after["retained"], after["retention_held"], after["queued"]) == (1, 1, 0)
    assert (after["cancelled"], after["reaped"], after["unsized_offered"]) == (2, 2, 1)
    assert after["workers"] == 1 and after["offered_prompt_tokens"] == 11
    mine.finish("completed")
    assert_idle(board.snapshot())
