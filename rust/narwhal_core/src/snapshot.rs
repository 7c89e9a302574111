//! The board as read at one instant, and the invariant it must satisfy.

use crate::histogram::HistogramSnapshot;
use crate::outcome::{Class, Reason, N_CLASSES, N_REASONS};

/// One engine's gauges in a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineSnapshot {
    pub prefill: u64,
    pub decode: u64,
    pub up: bool,
}

/// The board at one instant (totals and engines read under the lock).
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
    pub(crate) terminal: [[u64; N_REASONS]; N_CLASSES],
    pub engines: Vec<EngineSnapshot>,
    pub histograms: Vec<HistogramSnapshot>,
    /// Requests of dead workers finished as `cancelled` by `Board::reap_dead` (included in
    /// `cancelled`).
    pub reaped: u64,
    /// Processes holding a row (attached and not reaped).
    pub workers: u64,
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
