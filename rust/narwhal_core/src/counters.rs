//! The accounting board: request counters, gauges, histograms and slot guards in one region shared by every worker process.
//!
//! Every update that bears on the invariant `offered == Σ terminal + retained` (arrival,
//! sizing, finish, the queue and the per-engine phase slots) happens under the region's
//! lock, and [`Board::snapshot`] reads under the same lock, so no reader ever sees a
//! half-applied transition and every limit is checked and taken atomically across
//! processes. Histograms and `up` gauges are lock-free. Requests and phase slots are guards
//! ([`Ticket`], [`Slot`]) whose drop finishes (as `cancelled`) or releases; each process's
//! share is also kept in its row (`workers.rs`) so a dead worker's share can be reaped.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::histogram::{Histogram, HistogramCells};
pub use crate::outcome::{Class, NameError, Phase, Reason, Terminal};
use crate::outcome::{N_CLASSES, N_REASONS};
use crate::shm::{Region, ShmError};
pub use crate::snapshot::{EngineSnapshot, Snapshot};
use crate::workers::{self, Row, RowEngine, MAX_ROWS};

/// Bumped whenever the layout below changes; attaching to another version fails.
pub const LAYOUT_VERSION: u32 = 1;
/// The most engine indexes a board can hold.
pub const MAX_ENGINES: usize = 4096;

/// Why a board operation failed.
#[derive(Debug, Error)]
pub enum BoardError {
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("a board holds 1..={MAX_ENGINES} engines, not {0}")]
    EngineCount(usize),
    #[error("engine index {index} is outside this board's {engines} engines")]
    EngineIndex { index: usize, engines: usize },
    #[error("histogram value {0} is not finite")]
    NotFinite(f64),
    #[error("all {MAX_ROWS} process rows of the board are held by live processes")]
    NoFreeRow,
}

/// Request totals; changed only under the lock.
#[repr(C)]
pub(crate) struct Totals {
    pub(crate) offered: AtomicU64,
    pub(crate) retained: AtomicU64,
    /// Retained requests that were admitted under the retention limit.
    pub(crate) retention_held: AtomicU64,
    pub(crate) queued: AtomicU64,
    pub(crate) unsized_offered: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) offered_prompt_tokens: AtomicU64,
    pub(crate) reaped: AtomicU64,
    terminal: [[AtomicU64; N_REASONS]; N_CLASSES],
}

/// The fixed part of the region's body; engine cells, then per-row engine cells, follow.
#[repr(C)]
struct Body {
    totals: Totals,
    histograms: [HistogramCells; 5],
    rows: [Row; MAX_ROWS],
}

/// One engine's gauges: phase slots under the lock, `up` lock-free.
#[repr(C)]
pub(crate) struct EngineCell {
    pub(crate) prefill: AtomicU64,
    pub(crate) decode: AtomicU64,
    up: AtomicU64,
}

fn body_len(engines: usize) -> usize {
    use std::mem::size_of;
    size_of::<Body>() + engines * (size_of::<EngineCell>() + MAX_ROWS * size_of::<RowEngine>())
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

fn add32(cell: &AtomicU32, n: i32) {
    cell.store(
        cell.load(Ordering::Relaxed).saturating_add_signed(n),
        Ordering::Relaxed,
    );
}

/// The accounting board. Cheap to clone (one shared region).
#[derive(Clone)]
pub struct Board {
    region: Arc<Region>,
    engines: usize,
    row: usize,
}

impl Board {
    /// A board private to this process.
    pub fn private(engines: usize) -> Result<Board, BoardError> {
        let n = check_engines(engines)?;
        Board::with_region(
            Region::private(body_len(engines), LAYOUT_VERSION, n),
            engines,
        )
    }

    /// Creates the shared board file at `path` (zeroed), replacing any stale one.
    pub fn create(path: &Path, engines: usize) -> Result<Board, BoardError> {
        let n = check_engines(engines)?;
        Board::with_region(
            Region::create(path, body_len(engines), LAYOUT_VERSION, n)?,
            engines,
        )
    }

    /// Maps the shared board file at `path`, checking its header against this build, and
    /// reaps the rows of dead processes before claiming this process's row.
    pub fn attach(path: &Path, engines: usize) -> Result<Board, BoardError> {
        let n = check_engines(engines)?;
        Board::with_region(
            Region::attach(path, body_len(engines), LAYOUT_VERSION, n)?,
            engines,
        )
    }

    fn with_region(region: Region, engines: usize) -> Result<Board, BoardError> {
        assert!(region.body_len() >= body_len(engines));
        let mut board = Board {
            region: Arc::new(region),
            engines,
            row: 0,
        };
        let me = board.region.pid();
        board.reap_dead();
        let row = {
            let _lock = board.region.lock();
            workers::claim(&board.body().rows, me)
        };
        board.row = row.ok_or(BoardError::NoFreeRow)?;
        Ok(board)
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

    /// Row `row`'s per-engine cells.
    fn row_engines(&self, row: usize) -> &[RowEngine] {
        use std::mem::size_of;
        let offset = size_of::<Body>() + self.engines * size_of::<EngineCell>();
        // SAFETY: as for `body`; MAX_ROWS blocks of `engines` cells follow the engine cells.
        unsafe {
            let first = self.region.body().as_ptr().add(offset) as *const RowEngine;
            std::slice::from_raw_parts(first.add(row * self.engines), self.engines)
        }
    }

    fn my_row(&self) -> &Row {
        &self.body().rows[self.row]
    }

    fn check_engine(&self, index: usize) -> Result<(), BoardError> {
        match index < self.engines {
            true => Ok(()),
            false => Err(BoardError::EngineIndex {
                index,
                engines: self.engines,
            }),
        }
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
        let (totals, row) = (&self.body().totals, self.my_row());
        let admitted = {
            let _lock = self.region.lock();
            add(&totals.offered, 1);
            add(&totals.retained, 1);
            add(&row.retained, 1);
            add(&row.unsized_live, 1);
            let admitted = totals.retention_held.load(Ordering::Relaxed) < retention_limit;
            if admitted {
                add(&totals.retention_held, 1);
                add(&row.retention_held, 1);
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
        self.acquire_slot_within(engine, phase, limit, u64::MAX)
    }

    /// Takes a phase slot on `engine` if fewer than `limit` of that phase and fewer than
    /// `total_limit` of both phases together are in flight there (checked and taken under
    /// the lock, so the bounds hold across processes).
    pub fn acquire_slot_within(
        &self,
        engine: usize,
        phase: Phase,
        limit: u64,
        total_limit: u64,
    ) -> Result<Option<Slot>, BoardError> {
        self.check_engine(engine)?;
        let (cell, mine) = self.slot_cells(engine, phase);
        let engine_cell = &self.engine_cells()[engine];
        let acquired = {
            let _lock = self.region.lock();
            let total = engine_cell.prefill.load(Ordering::Relaxed)
                + engine_cell.decode.load(Ordering::Relaxed);
            let free = cell.load(Ordering::Relaxed) < limit && total < total_limit;
            if free {
                add(cell, 1);
                add32(mine, 1);
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

    fn slot_cells(&self, engine: usize, phase: Phase) -> (&AtomicU64, &AtomicU32) {
        let (cell, mine) = (
            &self.engine_cells()[engine],
            &self.row_engines(self.row)[engine],
        );
        match phase {
            Phase::Prefill => (&cell.prefill, &mine.prefill),
            Phase::Decode => (&cell.decode, &mine.decode),
        }
    }

    /// Requests in flight on `engine` in each phase, `(prefill, decode)`, across every
    /// process (a lock-free read: each value is exact, the pair may straddle a change).
    pub fn inflight(&self, engine: usize) -> Result<(u64, u64), BoardError> {
        self.check_engine(engine)?;
        let cell = &self.engine_cells()[engine];
        Ok((
            cell.prefill.load(Ordering::Relaxed),
            cell.decode.load(Ordering::Relaxed),
        ))
    }

    /// Requests waiting in the admission queues of every process (a lock-free read).
    pub fn queued(&self) -> u64 {
        self.body().totals.queued.load(Ordering::Relaxed)
    }

    /// Sets an engine's `up` gauge.
    pub fn set_engine_up(&self, engine: usize, up: bool) -> Result<(), BoardError> {
        self.check_engine(engine)?;
        self.engine_cells()[engine]
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

    /// Finishes the requests of processes that died holding them (as `cancelled`), gives
    /// back their places and slots, and frees their rows. Returns the requests reaped.
    /// Runs on every attach; the parent may also call it when a worker exits.
    pub fn reap_dead(&self) -> u64 {
        let me = self.region.pid();
        let body = self.body();
        let dead = workers::dead_rows(&body.rows, me);
        if dead.is_empty() {
            return 0;
        }
        let _lock = self.region.lock();
        let mut reaped = 0;
        for (index, pid) in dead {
            let row = &body.rows[index];
            if row.pid.load(Ordering::Relaxed) == pid {
                let cells = (self.row_engines(index), &body.totals, self.engine_cells());
                reaped += workers::reap(row, cells.0, cells.1, cells.2);
            }
        }
        reaped
    }

    /// Everything at one instant: totals, reasons and engine gauges are read under the
    /// lock (so the invariant holds in every snapshot); histograms lock-free after.
    pub fn snapshot(&self) -> Snapshot {
        let body = self.body();
        let totals = &body.totals;
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
                        up: false,
                    })
                    .collect(),
                histograms: Vec::new(),
                reaped: read(&totals.reaped),
                workers: body
                    .rows
                    .iter()
                    .filter(|r| r.pid.load(Ordering::Relaxed) != 0)
                    .count() as u64,
                lock_steals: 0,
            }
        };
        for (snap, cell) in snap.engines.iter_mut().zip(self.engine_cells()) {
            snap.up = read(&cell.up) != 0;
        }
        snap.histograms = Histogram::ALL
            .iter()
            .map(|&h| body.histograms[h as usize].snapshot(h))
            .collect();
        snap.lock_steals = self.region.steals();
        snap
    }

    /// Removes the shared file (the parent, at shutdown); mappings stay valid.
    pub fn unlink(&self) -> Result<(), BoardError> {
        Ok(self.region.unlink()?)
    }
}

fn check_engines(engines: usize) -> Result<u32, BoardError> {
    match (1..=MAX_ENGINES).contains(&engines) {
        true => Ok(engines as u32),
        false => Err(BoardError::EngineCount(engines)),
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
        let (totals, row) = (&self.board.body().totals, self.board.my_row());
        let _lock = self.board.region.lock();
        add(&totals.offered_prompt_tokens, prompt_tokens);
        sub1(&row.unsized_live);
        self.sized = true;
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
        let (queued, row) = (&self.board.body().totals.queued, self.board.my_row());
        let _lock = self.board.region.lock();
        if queued.load(Ordering::Relaxed) < queue_limit {
            add(queued, 1);
            add(&row.queued, 1);
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
        sub1(&self.board.my_row().queued);
        self.queued = false;
    }

    /// Ends the request: counts its terminal class, releases its retention and queue
    /// places, and counts it unsized if it never was sized. False if already finished.
    pub fn finish(&mut self, terminal: Terminal) -> bool {
        if self.finished {
            return false;
        }
        let (totals, row) = (&self.board.body().totals, self.board.my_row());
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
            sub1(&row.retained);
            if self.holds_retention {
                sub1(&totals.retention_held);
                sub1(&row.retention_held);
            }
            if self.queued {
                sub1(&totals.queued);
                sub1(&row.queued);
            }
            if !self.sized {
                add(&totals.unsized_offered, 1);
                sub1(&row.unsized_live);
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
        let (cell, mine) = self.board.slot_cells(self.engine, self.phase);
        {
            let _lock = self.board.region.lock();
            sub1(cell);
            add32(mine, -1);
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
