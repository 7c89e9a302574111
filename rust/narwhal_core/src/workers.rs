//! Per-process rows: what each attached process holds (requests, queue places, phase slots), so a dead worker's share can be reaped.
//!
//! Every guard update also updates its process's row, under the board's lock. When a worker
//! dies without finishing its requests (SIGKILL, OOM), its row still says what it held:
//! [`reap`] finishes those requests as `cancelled` and gives their places and slots back, so
//! the invariant holds and no capacity leaks.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::counters::{EngineCell, Totals};
use crate::shm::process_alive;

/// Processes that can hold a row at once (workers, the parent, tools).
pub const MAX_ROWS: usize = 64;

/// One process's share of the board's gauges (changed only under the lock).
#[repr(C)]
pub(crate) struct Row {
    /// The owning process, 0 when free.
    pub(crate) pid: AtomicU32,
    _pad: AtomicU32,
    pub(crate) retained: AtomicU64,
    pub(crate) retention_held: AtomicU64,
    pub(crate) queued: AtomicU64,
    /// Retained requests not sized yet: they count as unsized if reaped.
    pub(crate) unsized_live: AtomicU64,
}

/// One process's phase slots on one engine.
#[repr(C)]
pub(crate) struct RowEngine {
    pub(crate) prefill: AtomicU32,
    pub(crate) decode: AtomicU32,
}

/// The row owned by `pid`, claiming a free one if it has none (call under the lock).
pub(crate) fn claim(rows: &[Row], pid: u32) -> Option<usize> {
    if let Some(index) = rows
        .iter()
        .position(|r| r.pid.load(Ordering::Relaxed) == pid)
    {
        return Some(index);
    }
    let index = rows
        .iter()
        .position(|r| r.pid.load(Ordering::Relaxed) == 0)?;
    rows[index].pid.store(pid, Ordering::Relaxed);
    Some(index)
}

/// Rows owned by processes that no longer exist, as (row, pid). Checks /proc, so call it
/// without the lock and confirm the pid under the lock before reaping.
pub(crate) fn dead_rows(rows: &[Row], me: u32) -> Vec<(usize, u32)> {
    rows.iter()
        .enumerate()
        .map(|(index, row)| (index, row.pid.load(Ordering::Relaxed)))
        .filter(|&(_, pid)| pid != 0 && pid != me && !process_alive(pid))
        .collect()
}

fn take(cell: &AtomicU64) -> u64 {
    cell.swap(0, Ordering::Relaxed)
}

fn give_back(cell: &AtomicU64, n: u64) {
    cell.store(
        cell.load(Ordering::Relaxed).saturating_sub(n),
        Ordering::Relaxed,
    );
}

/// Finishes a dead process's requests as `cancelled`, releases its places and slots, and
/// frees its row. Returns the requests reaped. Call under the lock.
pub(crate) fn reap(
    row: &Row,
    row_engines: &[RowEngine],
    totals: &Totals,
    engines: &[EngineCell],
) -> u64 {
    let retained = take(&row.retained);
    give_back(&totals.retained, retained);
    totals.cancelled.store(
        totals.cancelled.load(Ordering::Relaxed) + retained,
        Ordering::Relaxed,
    );
    totals.reaped.store(
        totals.reaped.load(Ordering::Relaxed) + retained,
        Ordering::Relaxed,
    );
    give_back(&totals.retention_held, take(&row.retention_held));
    give_back(&totals.queued, take(&row.queued));
    let never_sized = take(&row.unsized_live);
    totals.unsized_offered.store(
        totals.unsized_offered.load(Ordering::Relaxed) + never_sized,
        Ordering::Relaxed,
    );
    for (mine, engine) in row_engines.iter().zip(engines) {
        give_back(
            &engine.prefill,
            u64::from(mine.prefill.swap(0, Ordering::Relaxed)),
        );
        give_back(
            &engine.decode,
            u64::from(mine.decode.swap(0, Ordering::Relaxed)),
        );
    }
    row.pid.store(0, Ordering::Relaxed);
    retained
}
