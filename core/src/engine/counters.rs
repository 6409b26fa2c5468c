//! The engine's live counters: per-stage atomics the workers add to once
//! per task, and a lock-free latency histogram (8 buckets per power of two,
//! ±4.5%), read into [`StageReport`](crate::StageReport)s.
//!
//! ```text
//! worker: LocalStats ──flush per task──▶ StageMetrics { samples, busy_ns, latency, … } ──▶ StageReport
//! ```
use std::sync::atomic::{AtomicU64, Ordering};

const BUCKETS: usize = 256;

/// A lock-free latency histogram with 8 buckets per power of two (±4.5%).
pub(crate) struct Histogram {
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
    n: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            n: AtomicU64::new(0),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < 8 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros() as usize; // ≥ 3
    let frac = ((ns >> (log - 3)) & 7) as usize;
    ((log - 2) * 8 + frac).min(BUCKETS - 1)
}

fn bucket_mid(b: usize) -> u64 {
    if b < 8 {
        return b as u64;
    }
    let log = b / 8 + 2;
    let frac = (b % 8) as u64;
    let lo = (8 + frac) << (log - 3);
    lo + (1u64 << (log - 3)) / 2
}

impl Histogram {
    /// Records one duration in nanoseconds.
    pub(crate) fn record(&self, ns: u64) {
        self.record_n(ns, 1);
    }
    /// Records `count` durations of `ns` nanoseconds each.
    pub(crate) fn record_n(&self, ns: u64, count: u64) {
        if count == 0 {
            return;
        }
        self.counts[bucket_of(ns)].fetch_add(count, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns * count, Ordering::Relaxed);
        self.n.fetch_add(count, Ordering::Relaxed);
    }
    /// Number of records.
    pub(crate) fn count(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }
    /// Mean in nanoseconds (0 when empty).
    pub(crate) fn mean(&self) -> f64 {
        let n = self.count();
        if n == 0 {
            0.0
        } else {
            self.sum_ns.load(Ordering::Relaxed) as f64 / n as f64
        }
    }
    /// The `q`-quantile in nanoseconds (0 when empty).
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let target = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for (b, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            if acc >= target {
                return bucket_mid(b);
            }
        }
        bucket_mid(BUCKETS - 1)
    }
    /// Clears the histogram.
    pub(crate) fn reset(&self) {
        for c in self.counts.iter() {
            c.store(0, Ordering::Relaxed);
        }
        self.sum_ns.store(0, Ordering::Relaxed);
        self.n.store(0, Ordering::Relaxed);
    }
}

/// Live counters of one stage.
#[derive(Default)]
pub(crate) struct StageMetrics {
    /// Samples that went through (successfully).
    pub(crate) samples: AtomicU64,
    /// Failed runs (each retry counts).
    pub(crate) errors: AtomicU64,
    /// Samples skipped here.
    pub(crate) skipped: AtomicU64,
    /// Retries made.
    pub(crate) retries: AtomicU64,
    /// Estimated busy time of all workers, ns.
    pub(crate) busy_ns: AtomicU64,
    /// Per-sample latency.
    pub(crate) latency: Histogram,
    /// Sum of the input queue's fill (‰) seen at each receive, and how many
    /// receives (only for the first stage of a segment after the first).
    pub(crate) queue_fill_permille: AtomicU64,
    /// Receives counted in `queue_fill_permille`.
    pub(crate) queue_samples: AtomicU64,
}

impl StageMetrics {
    pub(crate) fn reset(&self) {
        for a in [
            &self.samples,
            &self.errors,
            &self.skipped,
            &self.retries,
            &self.busy_ns,
            &self.queue_fill_permille,
            &self.queue_samples,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        self.latency.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = Histogram::default();
        for us in 1..=100 {
            h.record(us * 1000);
        }
        let p50 = h.quantile(0.5) as f64 / 1e3;
        assert!((45.0..=56.0).contains(&p50), "p50 {p50} µs");
        assert_eq!(h.count(), 100);
        h.reset();
        assert_eq!(h.count(), 0);
    }
}
