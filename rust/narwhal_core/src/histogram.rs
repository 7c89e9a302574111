//! Lock-free fixed-bucket histograms (queue wait, TTFT, TPOT, end-to-end, output tokens) laid out for shared memory.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket slots reserved per histogram in the layout (upper bounds plus `+Inf`).
pub const MAX_BUCKETS: usize = 32;

/// Request latencies (TTFT, queue wait): 1 ms … 60 s, fine at the low end.
const LATENCY: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
    1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
];
/// End-to-end: the latency buckets, then on to the default request timeout (600 s).
const E2E: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
    20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 450.0, 600.0,
];
/// Time per output token: 1 ms … 1 s.
const TPOT: &[f64] = &[
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
];
/// Output tokens: powers of two, 1 … 32768.
const TOKENS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0,
];

/// The board's histograms, in layout order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Histogram {
    Ttft,
    Tpot,
    QueueWait,
    E2e,
    OutputTokens,
}

impl Histogram {
    pub const ALL: [Histogram; 5] = [
        Histogram::Ttft,
        Histogram::Tpot,
        Histogram::QueueWait,
        Histogram::E2e,
        Histogram::OutputTokens,
    ];

    /// The name used by callers and in snapshots (`"ttft"`, `"queue_wait"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Histogram::Ttft => "ttft",
            Histogram::Tpot => "tpot",
            Histogram::QueueWait => "queue_wait",
            Histogram::E2e => "e2e",
            Histogram::OutputTokens => "output_tokens",
        }
    }

    pub fn parse(name: &str) -> Option<Histogram> {
        Histogram::ALL.into_iter().find(|h| h.as_str() == name)
    }

    /// Finite upper bounds, ascending; `+Inf` is implied after the last.
    pub fn bounds(self) -> &'static [f64] {
        match self {
            Histogram::Ttft | Histogram::QueueWait => LATENCY,
            Histogram::E2e => E2E,
            Histogram::Tpot => TPOT,
            Histogram::OutputTokens => TOKENS,
        }
    }

    /// The bucket a value falls in: the first bound `>= value`, else `+Inf` (index = len).
    pub fn bucket(self, value: f64) -> usize {
        self.bounds().partition_point(|&bound| bound < value)
    }
}

/// One histogram's cells in the shared layout: per-bucket (non-cumulative) counts and the
/// sum as f64 bits.
#[repr(C)]
pub struct HistogramCells {
    counts: [AtomicU64; MAX_BUCKETS],
    sum_bits: AtomicU64,
}

// Every table plus its `+Inf` bucket fits the reserved cells.
const _: () = assert!(LATENCY.len() < MAX_BUCKETS && E2E.len() < MAX_BUCKETS);
const _: () = assert!(TPOT.len() < MAX_BUCKETS && TOKENS.len() < MAX_BUCKETS);

impl HistogramCells {
    /// Records one finite value (lock-free; the sum uses a CAS loop on its bits).
    pub fn observe(&self, histogram: Histogram, value: f64) {
        self.counts[histogram.bucket(value)].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// Reads the cells. Counts are cumulative (Prometheus `le` buckets, `+Inf` last) and the
    /// count is the `+Inf` bucket, so the snapshot is self-consistent even while observers
    /// run; the sum may lag or lead by the values being recorded at that instant.
    pub fn snapshot(&self, histogram: Histogram) -> HistogramSnapshot {
        let bounds = histogram.bounds();
        let mut cumulative = Vec::with_capacity(bounds.len() + 1);
        let mut running = 0u64;
        for cell in &self.counts[..=bounds.len()] {
            running += cell.load(Ordering::Relaxed);
            cumulative.push(running);
        }
        let sum = f64::from_bits(self.sum_bits.load(Ordering::Relaxed));
        HistogramSnapshot {
            histogram,
            cumulative,
            sum,
            count: running,
        }
    }
}

/// A histogram as read at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    pub histogram: Histogram,
    /// Cumulative counts for each bound of [`Histogram::bounds`], then `+Inf`.
    pub cumulative: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells() -> Box<HistogramCells> {
        Box::new(HistogramCells {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_bits: AtomicU64::new(0),
        })
    }

    #[test]
    fn names_round_trip_and_bounds_ascend() {
        for h in Histogram::ALL {
            assert_eq!(Histogram::parse(h.as_str()), Some(h));
            let b = h.bounds();
            assert!(b.len() < MAX_BUCKETS);
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{h:?}");
        }
        assert_eq!(Histogram::parse("latency"), None);
        assert_eq!(Histogram::Ttft.bounds().first(), Some(&0.001));
        assert_eq!(Histogram::Ttft.bounds().last(), Some(&60.0));
        assert_eq!(Histogram::Tpot.bounds().last(), Some(&1.0));
        assert_eq!(Histogram::OutputTokens.bounds().last(), Some(&32768.0));
    }

    #[test]
    fn buckets_are_le_bounds() {
        let h = Histogram::OutputTokens;
        assert_eq!(h.bucket(0.0), 0);
        assert_eq!(h.bucket(1.0), 0);
        assert_eq!(h.bucket(1.5), 1);
        assert_eq!(h.bucket(32768.0), 15);
        assert_eq!(h.bucket(32769.0), 16);
        assert_eq!(h.bucket(-3.0), 0);
    }

    #[test]
    fn snapshot_is_cumulative() {
        let c = cells();
        for v in [0.0005, 0.001, 0.02, 100.0] {
            c.observe(Histogram::Ttft, v);
        }
        let s = c.snapshot(Histogram::Ttft);
        assert_eq!(s.cumulative.len(), LATENCY.len() + 1);
        assert_eq!(s.cumulative[0], 2);
        assert_eq!(s.cumulative[5], 3); // le 0.025
        assert_eq!(*s.cumulative.last().unwrap(), 4);
        assert_eq!(s.count, 4);
        assert!((s.sum - 100.0215).abs() < 1e-9);
    }
}
