//! How many downloads run at once (`--download-workers auto`): a hill
//! climb on the measured aggregate rate. Parallel downloads help where
//! each one waits on latency (many small objects) and only hurt where the
//! link is the limit: k downloads sharing it each finish k times later, so
//! the first shard of an epoch arrives late and its decoding waits. The
//! climb therefore starts low for large objects, adds one download while
//! that raises the rate over an interval by 5% or more, steps back after
//! a try that did not, and tries again a few seconds later. An interval in
//! which the read-ahead had nothing to start (the pipeline, not the
//! downloads, set the pace) is not judged.
//!
//! ```text
//! rate(k) measured ─▶ try k+1 ─▶ ≥ 1.05 × rate(k)? keep, try k+2 : back to k, hold 3 s
//! ```

use std::time::{Duration, Instant};

/// Shortest interval a rate is measured over.
const INTERVAL: Duration = Duration::from_millis(300);
/// How long a step back holds before the next try.
const HOLD: Duration = Duration::from_secs(3);

/// The climb's state.
#[derive(Debug)]
pub(crate) struct Climb {
    k: usize,
    max: usize,
    /// The rate measured at `k` (before a try), bytes/s.
    base: Option<f64>,
    /// `k` is a try above `base`'s count.
    trying: bool,
    hold_until: Option<Instant>,
    t0: Instant,
    bytes0: u64,
    starved: bool,
}

impl Climb {
    /// Starts at `k` downloads (at most `max`), with `bytes` counted so far.
    pub(crate) fn new(k: usize, max: usize, now: Instant, bytes: u64) -> Climb {
        Climb {
            k: k.clamp(1, max.max(1)),
            max: max.max(1),
            base: None,
            trying: false,
            hold_until: None,
            t0: now,
            bytes0: bytes,
            starved: false,
        }
    }

    /// The downloads to allow now, given the bytes downloaded so far and
    /// whether a download slot waited for work since the last call.
    pub(crate) fn step(&mut self, now: Instant, bytes: u64, starved: bool) -> usize {
        self.starved |= starved;
        let dt = now.saturating_duration_since(self.t0);
        if dt < INTERVAL {
            return self.k;
        }
        let rate = bytes.saturating_sub(self.bytes0) as f64 / dt.as_secs_f64();
        self.t0 = now;
        self.bytes0 = bytes;
        if std::mem::take(&mut self.starved) {
            return self.k;
        }
        match (self.trying, self.base) {
            (true, Some(base)) if rate < base * 1.05 => {
                // No better with one more: back, and hold.
                self.k = (self.k - 1).max(1);
                self.trying = false;
                self.base = Some(base.max(rate));
                self.hold_until = Some(now + HOLD);
            }
            (true, _) => {
                self.base = Some(rate);
                self.try_one_more();
            }
            (false, _) => {
                if self.hold_until.is_none_or(|t| now >= t) {
                    self.base = Some(rate);
                    self.try_one_more();
                }
            }
        }
        self.k
    }

    fn try_one_more(&mut self) {
        if self.k < self.max {
            self.k += 1;
            self.trying = true;
        } else {
            self.trying = false;
        }
    }

    /// The downloads allowed now.
    #[cfg(test)]
    pub(crate) fn k(&self) -> usize {
        self.k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the climb for `secs` of simulated time against a link whose
    /// aggregate rate with `k` downloads is `rate(k)`.
    fn settle(start: usize, rate: impl Fn(usize) -> f64, secs: u64) -> Vec<usize> {
        let t0 = Instant::now();
        let mut c = Climb::new(start, 32, t0, 0);
        let mut bytes = 0.0;
        let mut ks = Vec::new();
        let tick = Duration::from_millis(50);
        for i in 1..=(secs * 20) {
            bytes += rate(c.k()) * tick.as_secs_f64();
            ks.push(c.step(t0 + tick * i as u32, bytes as u64, false));
        }
        ks
    }

    #[test]
    fn a_link_bound_transfer_stays_at_few_downloads() {
        // 60 MB/s whatever the count: one try above the start, then back.
        let ks = settle(2, |_| 60e6, 30);
        assert!(ks.iter().all(|&k| k <= 3), "{ks:?}");
        let tries = ks.iter().filter(|&&k| k == 3).count();
        assert!(
            tries * 5 <= ks.len(),
            "{tries} of {} ticks above 2",
            ks.len()
        );
    }

    #[test]
    fn a_latency_bound_transfer_climbs_to_where_the_rate_stops_growing() {
        // Each download adds 5 MB/s up to 12 of them, then nothing.
        let ks = settle(2, |k| 5e6 * k.min(12) as f64, 30);
        let end = *ks.last().unwrap();
        assert!((11..=13).contains(&end), "ended at {end}: {ks:?}");
    }

    #[test]
    fn intervals_the_pipeline_paced_are_not_judged() {
        let t0 = Instant::now();
        let mut c = Climb::new(4, 32, t0, 0);
        // Nothing downloaded, but the read-ahead had nothing to start.
        for i in 1..=100u32 {
            c.step(t0 + Duration::from_millis(50) * i, 0, true);
        }
        assert_eq!(c.k(), 4);
    }
}
