//! The accounting board under concurrency: the invariant in every snapshot, limits never exceeded, guards exactly-once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use narwhal_core::counters::{
    Board, BoardError, Class, NameError, Phase, Reason, Snapshot, Terminal,
};
use narwhal_core::histogram::Histogram;
use narwhal_core::shm::ShmError;

const RETENTION: u64 = 6;
const QUEUE: u64 = 2;
const SLOTS: u64 = 2;
const ENGINES: usize = 4;

/// A test file path under /dev/shm, removed when dropped (also when the test panics).
struct TempPath(PathBuf);

impl std::ops::Deref for TempPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn shm_path(name: &str) -> TempPath {
    let dir = if PathBuf::from("/dev/shm").is_dir() {
        "/dev/shm".into()
    } else {
        std::env::temp_dir()
    };
    TempPath(dir.join(format!("narwhal-board-{name}-{}", std::process::id())))
}

fn check_limits(s: &Snapshot) {
    assert!(
        s.invariant_holds(),
        "offered {} != terminal {} + retained {}",
        s.offered,
        s.terminal_total(),
        s.retained
    );
    assert!(
        s.retention_held <= RETENTION,
        "retention {}",
        s.retention_held
    );
    assert!(s.retention_held <= s.retained);
    assert!(s.queued <= QUEUE, "queued {}", s.queued);
    for e in &s.engines {
        assert!(e.prefill <= SLOTS && e.decode <= SLOTS, "{e:?}");
    }
}

fn assert_idle(s: &Snapshot) {
    assert_eq!((s.retained, s.retention_held, s.queued), (0, 0, 0));
    assert!(s.engines.iter().all(|e| e.prefill == 0 && e.decode == 0));
    assert!(s.invariant_holds());
}

/// One request's life, varied by `i`: holds places across iterations via `held`.
fn one_request(
    board: &Board,
    i: u64,
    held: &mut Vec<(
        narwhal_core::counters::Ticket,
        Vec<narwhal_core::counters::Slot>,
    )>,
) {
    let (mut ticket, admitted) = board.arrive(RETENTION);
    if !admitted {
        assert!(ticket.finish(Terminal::WithReason(Class::Rejected, Reason::RetentionFull)));
        return;
    }
    if !i.is_multiple_of(5) {
        ticket.sized(100);
    }
    if !ticket.enqueue(QUEUE) {
        ticket.finish(Terminal::WithReason(Class::Rejected, Reason::QueueFull));
        return;
    }
    let engine = (i as usize) % ENGINES;
    let prefill = board.acquire_slot(engine, Phase::Prefill, SLOTS).unwrap();
    ticket.dequeue();
    let Some(prefill) = prefill else {
        ticket.finish(Terminal::WithReason(
            Class::Expired,
            Reason::AdmissionWaitExpired,
        ));
        return;
    };
    let decode = board.acquire_slot(engine, Phase::Decode, SLOTS).unwrap();
    board
        .observe(Histogram::Ttft, (i % 100) as f64 / 1000.0)
        .unwrap();
    match (i % 7, decode) {
        (0, _) => drop(ticket), // safety net: cancelled
        (1, Some(d)) => held.push((ticket, vec![prefill, d])),
        (_, Some(_)) => assert!(ticket.finish(Terminal::Completed)),
        (_, None) => {
            assert!(ticket.finish(Terminal::WithReason(Class::Failed, Reason::EngineError)))
        }
    }
    if held.len() > 7 {
        held.remove(0);
    }
}

fn hammer(boards: Vec<Board>, per_thread: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let board = boards[0].clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                check_limits(&board.snapshot());
                reads += 1;
            }
            reads
        })
    };
    let start = Arc::new(Barrier::new(3));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let board = boards[t % boards.len()].clone();
            let start = start.clone();
            thread::spawn(move || {
                let mut held = Vec::new();
                start.wait();
                for i in 0..per_thread {
                    one_request(&board, i + t as u64, &mut held);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let end = boards[0].snapshot();
    assert_idle(&end);
    assert_eq!(end.offered, 3 * per_thread);
    assert!(end.completed > 0 && end.cancelled > 0);
    assert!(
        end.terminal(Class::Rejected, Reason::RetentionFull)
            + end.terminal(Class::Rejected, Reason::QueueFull)
            > 0
    );
    assert_eq!(
        end.histograms[0].count,
        end.completed + end.cancelled + end.terminal(Class::Failed, Reason::EngineError)
    );
}

#[test]
fn invariant_and_limits_hold_under_threads() {
    hammer(vec![Board::private(ENGINES).unwrap()], 50_000);
}

#[test]
fn invariant_and_limits_hold_across_two_mappings_of_one_file() {
    let path = shm_path("threads");
    let a = Board::create(&path, ENGINES).unwrap();
    let b = Board::attach(&path, ENGINES).unwrap();
    hammer(vec![a.clone(), b], 50_000);
    a.unlink().unwrap();
}

#[test]
fn limits_are_exact() {
    let board = Board::private(2).unwrap();
    let mut tickets: Vec<_> = (0..5).map(|_| board.arrive(3)).collect();
    let admitted: Vec<bool> = tickets.iter().map(|(_, ok)| *ok).collect();
    assert_eq!(admitted, [true, true, true, false, false]);
    let s = board.snapshot();
    assert_eq!((s.offered, s.retained, s.retention_held), (5, 5, 3));
    // a rejected arrival frees nothing it did not hold
    tickets[3]
        .0
        .finish(Terminal::WithReason(Class::Rejected, Reason::RetentionFull));
    assert!(!board.arrive(3).1);
    tickets[0].0.finish(Terminal::Completed);
    assert!(board.arrive(3).1);

    assert!(tickets[1].0.enqueue(1));
    assert_eq!(board.queued(), 1);
    assert!(tickets[1].0.enqueue(1), "holding a place already");
    assert!(!tickets[2].0.enqueue(1));
    assert_eq!(board.snapshot().queued, 1);
    tickets[1].0.dequeue();
    tickets[1].0.dequeue();
    assert_eq!(board.snapshot().queued, 0);
    assert!(tickets[2].0.enqueue(1));
    tickets[2].0.finish(Terminal::WithReason(
        Class::Refused,
        Reason::TtftBudgetExceeded,
    ));
    assert_eq!(
        board.snapshot().queued,
        0,
        "finish releases the queue place"
    );
    assert!(!tickets[2].0.enqueue(1), "finished tickets do not queue");

    let s1 = board.acquire_slot(1, Phase::Decode, 1).unwrap().unwrap();
    assert!(board.acquire_slot(1, Phase::Decode, 1).unwrap().is_none());
    assert!(board.acquire_slot(1, Phase::Prefill, 1).unwrap().is_some());
    assert!(board.acquire_slot(0, Phase::Decode, 0).unwrap().is_none());
    drop(s1);
    assert!(board.acquire_slot(1, Phase::Decode, 1).unwrap().is_some());
    assert!(matches!(
        board.acquire_slot(2, Phase::Decode, 1),
        Err(BoardError::EngineIndex {
            index: 2,
            engines: 2
        })
    ));
}

#[test]
fn a_total_limit_bounds_both_phases_together() {
    let board = Board::private(1).unwrap();
    let p1 = board
        .acquire_slot_within(0, Phase::Prefill, 4, 2)
        .unwrap()
        .unwrap();
    let d1 = board.acquire_slot(0, Phase::Decode, 4).unwrap().unwrap();
    assert_eq!(board.inflight(0).unwrap(), (1, 1));
    assert!(
        board
            .acquire_slot_within(0, Phase::Prefill, 4, 2)
            .unwrap()
            .is_none(),
        "two in flight of two allowed in all"
    );
    drop(d1);
    let p2 = board.acquire_slot_within(0, Phase::Prefill, 4, 2).unwrap();
    assert!(p2.is_some());
    assert_eq!(board.inflight(0).unwrap(), (2, 0));
    drop((p1, p2));
    assert_eq!(board.inflight(0).unwrap(), (0, 0));
    assert!(board.inflight(1).is_err());
}

#[test]
fn guards_are_exactly_once() {
    let board = Board::private(1).unwrap();
    let (mut t, _) = board.arrive(10);
    t.sized(40);
    t.sized(60);
    assert!(t.finish(Terminal::WithReason(
        Class::InvalidRequests,
        Reason::EngineRejected
    )));
    assert!(!t.finish(Terminal::Completed));
    assert!(t.is_finished());
    drop(t);
    let (t2, _) = board.arrive(10);
    drop(t2);
    let mut slot = board.acquire_slot(0, Phase::Prefill, 5).unwrap().unwrap();
    assert!(slot.release());
    assert!(!slot.release());
    assert!(slot.is_released());
    drop(slot);
    let s = board.snapshot();
    assert_eq!(s.offered_prompt_tokens, 40);
    assert_eq!(s.unsized_offered, 1, "only the dropped, never-sized ticket");
    assert_eq!(s.cancelled, 1);
    assert_eq!(s.completed, 0);
    assert_eq!(
        s.reasons(Class::InvalidRequests).collect::<Vec<_>>(),
        [(Reason::EngineRejected, 1)]
    );
    assert_eq!(s.reasons(Class::Failed).count(), 0);
    assert_idle(&s);
}

#[test]
fn guards_outlive_their_board_handle() {
    let board = Board::private(1).unwrap();
    let (ticket, _) = board.arrive(1);
    let slot = board.acquire_slot(0, Phase::Decode, 1).unwrap();
    let observer = board.clone();
    drop(board);
    drop(ticket);
    drop(slot);
    assert_idle(&observer.snapshot());
    assert_eq!(observer.snapshot().cancelled, 1);
}

#[test]
fn terminal_names_parse_strictly() {
    assert_eq!(
        Terminal::parse("completed", None).unwrap(),
        Terminal::Completed
    );
    assert_eq!(
        Terminal::parse("expired", Some("deadline_expired")).unwrap(),
        Terminal::WithReason(Class::Expired, Reason::DeadlineExpired)
    );
    assert!(matches!(
        Terminal::parse("completed", Some("x")),
        Err(NameError::UnexpectedReason("completed"))
    ));
    assert!(matches!(
        Terminal::parse("failed", None),
        Err(NameError::MissingReason("failed"))
    ));
    assert!(matches!(
        Terminal::parse("failed", Some("oops")),
        Err(NameError::UnknownReason(_))
    ));
    assert!(matches!(
        Terminal::parse("lost", None),
        Err(NameError::UnknownClass(_))
    ));
    for r in Reason::ALL {
        assert_eq!(Reason::parse(r.as_str()), Some(*r));
    }
    assert_eq!(Reason::ALL.len(), 21);
}

#[test]
fn engines_and_histograms() {
    let board = Board::private(3).unwrap();
    board.set_engine_up(2, true).unwrap();
    assert_eq!(
        board
            .snapshot()
            .engines
            .iter()
            .map(|e| e.up)
            .collect::<Vec<_>>(),
        [false, false, true]
    );
    assert!(board.set_engine_up(3, true).is_err());
    board.observe(Histogram::OutputTokens, 3.0).unwrap();
    assert!(matches!(
        board.observe(Histogram::Tpot, f64::NAN),
        Err(BoardError::NotFinite(_))
    ));
    let h = &board.snapshot().histograms[Histogram::OutputTokens as usize];
    assert_eq!(
        (h.count, h.sum, &h.cumulative[..3]),
        (1, 3.0, &[0, 0, 1][..])
    );
    assert!(matches!(Board::private(0), Err(BoardError::EngineCount(0))));
}

#[test]
fn attach_checks_the_layout() {
    let path = shm_path("layout");
    let board = Board::create(&path, 8).unwrap();
    let (_t, _) = board.arrive(1);
    let again = Board::attach(&path, 8).unwrap();
    assert_eq!(again.snapshot().retained, 1);
    assert!(matches!(
        Board::attach(&path, 9),
        Err(BoardError::Shm(ShmError::Engines {
            found: 8,
            expected: 9,
            ..
        }))
    ));
    let garbage = shm_path("garbage");
    std::fs::write(&garbage, [b'x'; 4096]).unwrap();
    let bad = Board::attach(&garbage, 8);
    assert!(matches!(
        bad,
        Err(BoardError::Shm(ShmError::BadMagic { .. }))
    ));
    board.unlink().unwrap();
    assert!(matches!(
        Board::attach(&path, 8),
        Err(BoardError::Shm(ShmError::Io { .. }))
    ));
}

const CHILD_ENV: &str = "NARWHAL_BOARD_TEST_CHILD";

/// Run as a child process by `a_dead_workers_share_is_reaped` (a no-op otherwise):
/// attaches, takes places and slots, and exits without dropping its guards.
#[test]
fn child_holds_and_dies() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let board = Board::attach(Path::new(&path), ENGINES).unwrap();
    let (mut sized, _) = board.arrive(10);
    sized.sized(5);
    let (mut queued, _) = board.arrive(10);
    assert!(queued.enqueue(10));
    let prefill = board.acquire_slot(1, Phase::Prefill, 10).unwrap().unwrap();
    let decode = board.acquire_slot(2, Phase::Decode, 10).unwrap().unwrap();
    std::mem::forget((sized, queued, prefill, decode));
    std::process::exit(0);
}

#[test]
fn a_dead_workers_share_is_reaped() {
    let path = shm_path("reap");
    let board = Board::create(&path, ENGINES).unwrap();
    let (mut mine, _) = board.arrive(10);
    let _my_slot = board.acquire_slot(1, Phase::Prefill, 10).unwrap().unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_and_dies", "--test-threads=1", "-q"])
        .env(CHILD_ENV, path.as_os_str())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let before = board.snapshot();
    assert_eq!((before.retained, before.queued, before.workers), (3, 1, 2));
    assert_eq!(
        (before.engines[1].prefill, before.engines[2].decode),
        (2, 1)
    );

    // attaching reaps the dead (as would the parent's `reap_dead` when a worker exits)
    let _worker = Board::attach(&path, ENGINES).unwrap();
    assert_eq!(board.reap_dead(), 0);
    let after = board.snapshot();
    assert!(after.invariant_holds());
    assert_eq!(
        (after.retained, after.retention_held, after.queued),
        (1, 1, 0)
    );
    assert_eq!(
        (
            after.cancelled,
            after.reaped,
            after.unsized_offered,
            after.workers
        ),
        (2, 2, 1, 1)
    );
    assert_eq!((after.engines[1].prefill, after.engines[2].decode), (1, 0));
    assert_eq!(after.offered_prompt_tokens, 5);
    mine.finish(Terminal::Completed);
    drop(_my_slot);
    assert_idle(&board.snapshot());
    board.unlink().unwrap();
}
