//! The accounting board: request counters, gauges, histograms and slot guards in one region shared by every worker process.
//!
//! Every update that bears on the invariant `offered == Σ terminal + retained` (arrival,
//! finish, the queue and the per-engine phase slots) happens under the region's lock, and
//! [`Board::snapshot`] reads under the same lock, so no reader ever sees a half-applied
//! transition and every limit is checked and taken atomically across processes.
//! Histograms, prompt-token sums and `up` gauges are lock-free. Requests and phase slots
//! are guards ([`Ticket`], [`Slot`]) whose drop finishes (as `cancelled`) or releases.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::histogram::{Histogram, HistogramCells, HistogramSnapshot};
use crate::shm::{Region, ShmError};

/// Bumped whenever the layout below changes; attaching to another version fails.
pub const LAYOUT_VERSION: u32 = 1;
/// The most engine indexes a board can hold.
pub const MAX_ENGINES: usize = 65_536;

/// Why a board operation failed.
#[derive(Debug, Error)]
pub enum BoardError {
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error("a board holds 1..={MAX_ENGINES} engines, not {0}")]
    EngineCount(usize),
    #[error("engine index {index} is outside this board's {engines} engines")]
    EngineIndex { index: usize, engines: usize },
    #[error("unknown terminal class {0:?}")]
    UnknownClass(String),
    #[error("unknown reason {0:?}")]
    UnknownReason(String),
    #[error("terminal class {0:?} needs a reason")]
    MissingReason(&'static str),
    #[error("terminal class {0:?} takes no reason")]
    UnexpectedReason(&'static str),
    #[error("unknown histogram {0:?}")]
    UnknownHistogram(String),
    #[error("unknown phase {0:?} (prefill or decode)")]
    UnknownPhase(String),
    #[error("histogram value {0} is not finite")]
    NotFinite(f64),
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }
    };
}

named_enum!(
    /// The `reason` label of a terminal class: SPEC §12's error codes plus `engine_rejected`.
    Reason {
        InvalidJson => "invalid_json",
        InvalidRequest => "invalid_request",
        ModelNotFound => "model_not_found",
        InvalidSamplingWidth => "invalid_sampling_width",
        UnsupportedOption => "unsupported_option",
        RequestTooLarge => "request_too_large",
        RetentionFull => "retention_full",
        QueueFull => "queue_full",
        AdmissionWaitExpired => "admission_wait_expired",
        DeadlineExpired => "deadline_expired",
        TtftBudgetExceeded => "ttft_budget_exceeded",
        PromptExceedsTtftBudget => "prompt_exceeds_ttft_budget",
        BackendUnavailable => "backend_unavailable",
        RouterStandby => "router_standby",
        RouterFenced => "router_fenced",
        Maintenance => "maintenance",
        MonitoringDegraded => "monitoring_degraded",
        EngineError => "engine_error",
        UnsupportedEngineField => "unsupported_engine_field",
        MalformedEngineOutput => "malformed_engine_output",
        EngineRejected => "engine_rejected",
    }
);

named_enum!(
    /// Terminal classes counted by reason.
    Class {
        Rejected => "rejected",
        Refused => "refused",
        InvalidRequests => "invalid_requests",
        Expired => "expired",
        Failed => "failed",
    }
);

named_enum!(
    /// A request's phase on an engine.
    Phase {
        Prefill => "prefill",
        Decode => "decode",
    }
);

const N_REASONS: usize = 21;
const N_CLASSES: usize = 5;
const _: () = assert!(Reason::ALL.len() == N_REASONS && Class::ALL.len() == N_CLASSES);

/// How a request ended: a class with a reason, or `cancelled` / `completed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Terminal {
    WithReason(Class, Reason),
    Cancelled,
    Completed,
}

impl Terminal {
    /// Parses a class name and optional reason (`cancelled`/`completed` take none, the
    /// other classes need one).
    pub fn parse(class: &str, reason: Option<&str>) -> Result<Terminal, BoardError> {
        let bare = match class {
            "cancelled" => Some(Terminal::Cancelled),
            "completed" => Some(Terminal::Completed),
            _ => None,
        };
        if let Some(terminal) = bare {
            return match reason {
                None => Ok(terminal),
                Some(_) => Err(BoardError::UnexpectedReason(terminal.class_name())),
            };
        }
        let class = Class::parse(class).ok_or_else(|| BoardError::UnknownClass(class.into()))?;
        let reason = reason.ok_or(BoardError::MissingReason(class.as_str()))?;
        let reason =
            Reason::parse(reason).ok_or_else(|| BoardError::UnknownReason(reason.into()))?;
        Ok(Terminal::WithReason(class, reason))
    }

    pub fn class_name(self) -> &'static str {
        match self {
            Terminal::WithReason(class, _) => class.as_str(),
            Terminal::Cancelled => "cancelled",
            Terminal::Completed => "completed",
        }
    }
}

/// Request totals; every field but `offered_prompt_tokens` changes only under the lock.
#[repr(C)]
struct Totals {
    offered: AtomicU64,
    retained: AtomicU64,
    /// Retained requests that were admitted under the retention limit.
    retention_held: AtomicU64,
    queued: AtomicU64,
    unsized_offered: AtomicU64,
    cancelled: AtomicU64,
    completed: AtomicU64,
    /// Lock-free (no invariant involves it).
    offered_prompt_tokens: AtomicU64,
    terminal: [[AtomicU64; N_REASONS]; N_CLASSES],
}

/// The fixed part of the region's body; the engine cells follow it.
#[repr(C)]
struct Body {
    totals: Totals,
    histograms: [HistogramCells; 5],
}

/// One engine's gauges: phase slots under the lock, `up` lock-free.
#[repr(C)]
struct EngineCell {
    prefill: AtomicU64,
    decode: AtomicU64,
    up: AtomicU64,
    _pad: AtomicU64,
}

impl EngineCell {
    fn inflight(&self, phase: Phase) -> &AtomicU64 {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }
}

fn body_len(engines: usize) -> usize {
    std::mem::size_of::<Body>() + engines * std::mem::size_of::<EngineCell>()
}

/// Adds under the lock: a plain load and store (the lock orders all writers).
fn add(cell: &AtomicU64, n: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// Subtracts one under the lock, never below zero.
fn sub1(cell: &AtomicU64) {
    cell.store(
        cell.load(Ordering::Relaxed).saturating_sub(1),
        Ordering::Relaxed,
    );
}

/// The accounting board. Cheap to clone (one shared region).
#[derive(Clone)]
pub struct Board {
    region: Arc<Region>,
    engines: usize,
}

impl Board {
    /// A board private to this process.
    pub fn private(engines: usize) -> Result<Board, BoardError> {
        let engines = check_engines(engines)?;
        let region = Region::private(body_len(engines), LAYOUT_VERSION, engines as u32);
        Ok(Board::from_region(region, engines))
    }

    /// Creates the shared board file at `path` (zeroed), replacing any stale one.
    pub fn create(path: &Path, engines: usize) -> Result<Board, BoardError> {
        let engines = check_engines(engines)?;
        let region = Region::create(path, body_len(engines), LAYOUT_VERSION, engines as u32)?;
        Ok(Board::from_region(region, engines))
    }

    /// Maps the shared board file at `path`, checking its header against this build.
    pub fn attach(path: &Path, engines: usize) -> Result<Board, BoardError> {
        let engines = check_engines(engines)?;
        let region = Region::attach(path, body_len(engines), LAYOUT_VERSION, engines as u32)?;
        Ok(Board::from_region(region, engines))
    }

    fn from_region(region: Region, engines: usize) -> Board {
        assert!(region.body_len() >= body_len(engines));
        Board {
            region: Arc::new(region),
            engines,
        }
    }

    fn body(&self) -> &Body {
        // SAFETY: the region's body holds `body_len(engines)` bytes, 8-aligned (page + 64),
        // and `Body` is all atomics: valid for any bits (zero included), shared-mutable.
        unsafe { &*(self.region.body().as_ptr() as *const Body) }
    }

    fn engine_cells(&self) -> &[EngineCell] {
        // SAFETY: as for `body`; the engine cells follow `Body` (a multiple of 8 bytes).
        unsafe {
            let first = self.region.body().as_ptr().add(std::mem::size_of::<Body>());
            std::slice::from_raw_parts(first as *const EngineCell, self.engines)
        }
    }

    fn engine(&self, index: usize) -> Result<&EngineCell, BoardError> {
        self.engine_cells()
            .get(index)
            .ok_or(BoardError::EngineIndex {
                index,
                engines: self.engines,
            })
    }

    /// The number of engine indexes.
    pub fn engines(&self) -> usize {
        self.engines
    }

    /// The shared file's path, `None` when private.
    pub fn path(&self) -> Option<&Path> {
        self.region.path()
    }

    /// One offered request: `offered += 1`, `retained += 1`, atomically. The flag says
    /// whether it took a retention place (fewer than `retention_limit` admitted requests
    /// were retained); a request that did not is still retained until it is finished,
    /// normally at once as `rejected{retention_full}`.
    pub fn arrive(&self, retention_limit: u64) -> (Ticket, bool) {
        let totals = &self.body().totals;
        let admitted = {
            let _lock = self.region.lock();
            add(&totals.offered, 1);
            add(&totals.retained, 1);
            let admitted = totals.retention_held.load(Ordering::Relaxed) < retention_limit;
            if admitted {
                add(&totals.retention_held, 1);
            }
            admitted
        };
        let ticket = Ticket {
            board: self.clone(),
            holds_retention: admitted,
            sized: false,
            queued: false,
            finished: false,
        };
        (ticket, admitted)
    }

    /// Takes a phase slot on `engine` if fewer than `limit` are in flight there.
    pub fn acquire_slot(
        &self,
        engine: usize,
        phase: Phase,
        limit: u64,
    ) -> Result<Option<Slot>, BoardError> {
        let cell = self.engine(engine)?.inflight(phase);
        let acquired = {
            let _lock = self.region.lock();
            let free = cell.load(Ordering::Relaxed) < limit;
            if free {
                add(cell, 1);
            }
            free
        };
        Ok(acquired.then(|| Slot {
            board: self.clone(),
            engine,
            phase,
            released: false,
        }))
    }

    /// Sets an engine's `up` gauge.
    pub fn set_engine_up(&self, engine: usize, up: bool) -> Result<(), BoardError> {
        self.engine(engine)?
            .up
            .store(u64::from(up), Ordering::Relaxed);
        Ok(())
    }

    /// Records one value in a histogram (lock-free).
    pub fn observe(&self, histogram: Histogram, value: f64) -> Result<(), BoardError> {
        if !value.is_finite() {
            return Err(BoardError::NotFinite(value));
        }
        self.body().histograms[histogram as usize].observe(histogram, value);
        Ok(())
    }

    /// Everything at one instant: totals, reasons and engine gauges are read under the
    /// lock (so the invariant holds in every snapshot); histograms lock-free after.
    pub fn snapshot(&self) -> Snapshot {
        let totals = &self.body().totals;
        let read = |cell: &AtomicU64| cell.load(Ordering::Relaxed);
        let mut snap = {
            let _lock = self.region.lock();
            Snapshot {
                offered: read(&totals.offered),
                retained: read(&totals.retained),
                retention_held: read(&totals.retention_held),
                queued: read(&totals.queued),
                unsized_offered: read(&totals.unsized_offered),
                offered_prompt_tokens: read(&totals.offered_prompt_tokens),
                cancelled: read(&totals.cancelled),
                completed: read(&totals.completed),
                terminal: std::array::from_fn(|c| {
                    std::array::from_fn(|r| read(&totals.terminal[c][r]))
                }),
                engines: self
                    .engine_cells()
                    .iter()
                    .map(|e| EngineSnapshot {
                        prefill: read(&e.prefill),
                        decode: read(&e.decode),
                        up: read(&e.up) != 0,
                    })
                    .collect(),
                histograms: Vec::new(),
                lock_steals: 0,
            }
        };
        let cells = &self.body().histograms;
        snap.histograms = Histogram::ALL
            .iter()
            .map(|&h| cells[h as usize].snapshot(h))
            .collect();
        snap.lock_steals = self.region.steals();
        snap
    }

    /// Removes the shared file (the parent, at shutdown); mappings stay valid.
    pub fn unlink(&self) -> Result<(), BoardError> {
        Ok(self.region.unlink()?)
    }
}

fn check_engines(engines: usize) -> Result<usize, BoardError> {
    if (1..=MAX_ENGINES).contains(&engines) {
        Ok(engines)
    } else {
        Err(BoardError::EngineCount(engines))
    }
}

/// One retained request. Finishing is exactly-once; dropping an unfinished ticket
/// finishes it as `cancelled` (a safety net: the router finishes explicitly).
pub struct Ticket {
    board: Board,
    holds_retention: bool,
    sized: bool,
    queued: bool,
    finished: bool,
}

impl Ticket {
    /// Marks the request sized and adds its prompt tokens (first call only; ignored once
    /// finished).
    pub fn sized(&mut self, prompt_tokens: u64) {
        if self.sized || self.finished {
            return;
        }
        self.sized = true;
        let totals = &self.board.body().totals;
        totals
            .offered_prompt_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
    }

    /// Takes a queue place if fewer than `queue_limit` requests are queued. True if this
    /// ticket holds one (already held: true, no second place); false once finished.
    pub fn enqueue(&mut self, queue_limit: u64) -> bool {
        if self.queued {
            return true;
        }
        if self.finished {
            return false;
        }
        let queued = &self.board.body().totals.queued;
        let _lock = self.board.region.lock();
        if queued.load(Ordering::Relaxed) < queue_limit {
            add(queued, 1);
            self.queued = true;
        }
        self.queued
    }

    /// Gives the queue place back (idempotent).
    pub fn dequeue(&mut self) {
        if !self.queued {
            return;
        }
        let _lock = self.board.region.lock();
        sub1(&self.board.body().totals.queued);
        self.queued = false;
    }

    /// Ends the request: counts its terminal class, releases its retention and queue
    /// places, and counts it unsized if it never was sized. False if already finished.
    pub fn finish(&mut self, terminal: Terminal) -> bool {
        if self.finished {
            return false;
        }
        let totals = &self.board.body().totals;
        {
            let _lock = self.board.region.lock();
            match terminal {
                Terminal::WithReason(class, reason) => {
                    add(&totals.terminal[class as usize][reason as usize], 1)
                }
                Terminal::Cancelled => add(&totals.cancelled, 1),
                Terminal::Completed => add(&totals.completed, 1),
            }
            sub1(&totals.retained);
            if self.holds_retention {
                sub1(&totals.retention_held);
            }
            if self.queued {
                sub1(&totals.queued);
            }
            if !self.sized {
                add(&totals.unsized_offered, 1);
            }
        }
        self.finished = true;
        self.queued = false;
        true
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether the request took a retention place on arrival.
    pub fn holds_retention(&self) -> bool {
        self.holds_retention
    }

    pub fn is_queued(&self) -> bool {
        self.queued
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.finish(Terminal::Cancelled);
    }
}

/// One phase slot on one engine; released exactly once (dropping releases).
pub struct Slot {
    board: Board,
    engine: usize,
    phase: Phase,
    released: bool,
}

impl Slot {
    /// Gives the slot back. True the first time, false after.
    pub fn release(&mut self) -> bool {
        if self.released {
            return false;
        }
        let cell = self.board.engine_cells()[self.engine].inflight(self.phase);
        {
            let _lock = self.board.region.lock();
            sub1(cell);
        }
        self.released = true;
        true
    }

    pub fn is_released(&self) -> bool {
        self.released
    }

    pub fn engine(&self) -> usize {
        self.engine
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

/// One engine's gauges in a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    pub prefill: u64,
    pub decode: u64,
    pub up: bool,
}

/// The board at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub offered: u64,
    pub retained: u64,
    /// Retained requests holding a retention place (admitted under the limit).
    pub retention_held: u64,
    pub queued: u64,
    pub unsized_offered: u64,
    pub offered_prompt_tokens: u64,
    pub cancelled: u64,
    pub completed: u64,
    terminal: [[u64; N_REASONS]; N_CLASSES],
    pub engines: Vec<EngineSnapshot>,
    pub histograms: Vec<HistogramSnapshot>,
    /// Locks taken over from dead holders (see `shm::Region::lock`).
    pub lock_steals: u64,
}

impl Snapshot {
    /// The count for one class and reason.
    pub fn terminal(&self, class: Class, reason: Reason) -> u64 {
        self.terminal[class as usize][reason as usize]
    }

    /// A class's nonzero reasons, in [`Reason::ALL`] order.
    pub fn reasons(&self, class: Class) -> impl Iterator<Item = (Reason, u64)> + '_ {
        let row = &self.terminal[class as usize];
        Reason::ALL
            .iter()
            .map(|&r| (r, row[r as usize]))
            .filter(|&(_, n)| n > 0)
    }

    /// All finished requests, over every terminal class.
    pub fn terminal_total(&self) -> u64 {
        let by_reason: u64 = self.terminal.iter().flatten().sum();
        by_reason + self.cancelled + self.completed
    }

    /// `offered == Σ terminal + retained`.
    pub fn invariant_holds(&self) -> bool {
        self.offered == self.terminal_total() + self.retained
    }
}
