//! The byte budget: a cap on the bytes held by samples and batches between
//! the source and the consumer.
//!
//! Work is admitted only while the bytes in flight plus the expected size of
//! the next task fit under the budget, so peak memory is set by the budget,
//! not by `workers × prefetch × sample size`. A task is charged its
//! expected size when it is admitted, before it has read anything, and its
//! charge grows if it outgrows that. The task the consumer needs next is
//! admitted once the consumer waits for it even if it does not fit, so a
//! budget smaller than one batch still makes progress (one task at a time)
//! instead of deadlocking.
//!
//! ```
//! use ferrofeed_core::ByteBudget;
//! let budget = ByteBudget::new(1000);
//! let a = budget.lease(600);
//! assert_eq!(budget.used(), 600);
//! drop(a);
//! assert_eq!(budget.used(), 0);
//! assert_eq!(budget.peak(), 600);
//! ```
use crate::sync::LockExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A shared byte budget with a high-water mark.
#[derive(Debug)]
pub struct ByteBudget {
    max: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl ByteBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            max,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        })
    }
    /// The cap in bytes.
    pub fn max(&self) -> usize {
        self.max
    }
    /// Bytes currently held.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
    /// Highest `used()` seen since creation or the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }
    /// Restarts the high-water mark from the current use.
    pub fn reset_peak(&self) {
        self.peak.store(self.used(), Ordering::Release);
    }

    /// Charges `bytes` without blocking; released when the lease drops.
    pub fn lease(self: &Arc<Self>, bytes: usize) -> Lease {
        self.charge(bytes);
        Lease {
            budget: Arc::clone(self),
            bytes,
        }
    }

    /// Charges `bytes` only if `bytes + headroom` more still fit under the
    /// cap (checked and charged in one step, so two callers cannot both
    /// take the last room).
    pub(crate) fn lease_if(self: &Arc<Self>, bytes: usize, headroom: usize) -> Option<Lease> {
        let need = bytes.saturating_add(headroom);
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            if used.saturating_add(need) > self.max {
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => used = now,
            }
        }
        self.peak.fetch_max(used + bytes, Ordering::AcqRel);
        Some(Lease {
            budget: Arc::clone(self),
            bytes,
        })
    }

    fn charge(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak.fetch_max(now, Ordering::AcqRel);
    }

    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.notify();
    }

    /// Wakes every thread waiting in [`wait_until`](Self::wait_until).
    pub(crate) fn notify(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _g = self.lock.lock_unpoisoned();
            self.cv.notify_all();
        }
    }

    /// Blocks until `ready()` holds; returns `false` if `cancel` was set first.
    pub(crate) fn wait_until(&self, cancel: &AtomicBool, mut ready: impl FnMut() -> bool) -> bool {
        if ready() {
            return true;
        }
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let mut guard = self.lock.lock_unpoisoned();
        let ok = loop {
            if cancel.load(Ordering::Acquire) {
                break false;
            }
            if ready() {
                break true;
            }
            // The timeout bounds the cost of a wake-up that raced the check.
            guard = match self.cv.wait_timeout(guard, Duration::from_millis(5)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        };
        drop(guard);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        ok
    }

    /// Whether `extra` more bytes fit under the cap.
    pub(crate) fn fits(&self, extra: usize) -> bool {
        self.used().saturating_add(extra) <= self.max
    }
}

/// Bytes charged to a budget; released on drop.
#[derive(Debug)]
pub struct Lease {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Lease {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// Raises the charge to `bytes` if it is below (never blocks).
    pub fn grow_to(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.resize(bytes);
        }
    }
    /// Changes the charge to `bytes` (never blocks).
    pub fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget.charge(bytes - self.bytes);
        } else {
            self.budget.release(self.bytes - bytes);
        }
        self.bytes = bytes;
    }
    /// Takes over `other`'s charge (of the same budget).
    pub fn absorb(&mut self, mut other: Lease) {
        self.bytes += std::mem::take(&mut other.bytes);
    }
    /// Moves `bytes` (at most what is held) into a new lease.
    pub fn split(&mut self, bytes: usize) -> Lease {
        let take = bytes.min(self.bytes);
        self.bytes -= take;
        Lease {
            budget: Arc::clone(&self.budget),
            bytes: take,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_and_split_keep_the_books() {
        let b = ByteBudget::new(100);
        let mut l = b.lease(10);
        l.resize(50);
        assert_eq!(b.used(), 50);
        let part = l.split(20);
        assert_eq!((l.bytes(), part.bytes(), b.used()), (30, 20, 50));
        drop(l);
        assert_eq!(b.used(), 20);
        drop(part);
        assert_eq!((b.used(), b.peak()), (0, 50));
    }

    #[test]
    fn a_conditional_lease_keeps_its_headroom() {
        let b = ByteBudget::new(100);
        let a = b.lease_if(60, 20).expect("60 + 20 fit in 100");
        assert!(b.lease_if(30, 20).is_none(), "60 + 30 + 20 > 100");
        let c = b.lease_if(20, 20).expect("60 + 20 + 20 fit");
        assert_eq!((b.used(), b.peak()), (80, 80));
        drop((a, c));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn waiters_wake_on_release_and_cancel() {
        let b = ByteBudget::new(100);
        let l = b.lease(100);
        let cancel = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| b.wait_until(&cancel, || b.fits(10)));
            std::thread::sleep(Duration::from_millis(20));
            drop(l);
            assert!(h.join().unwrap());
        });
        let _l = b.lease(100);
        cancel.store(true, Ordering::Release);
        assert!(!b.wait_until(&cancel, || b.fits(10)));
    }
}
