//! Stopping an epoch gracefully: [`StopHandle`].
//!
//! ```
//! let stop = ferrofeed_core::StopHandle::default();
//! stop.stop();
//! assert!(stop.is_stopped());
//! ```
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Stops a pipeline's epochs at the next batch, from another thread or a
/// signal handler.
///
/// A [`StopHandle`] is a shared flag. Once it is set, the pipeline's epoch
/// iterator ends at the next batch boundary — also while the consumer is
/// waiting for a batch — having yielded only whole batches, so its
/// [`state()`](crate::EpochIter::state) resumes exactly after the last batch
/// delivered and [`EpochSummary::stopped`](crate::EpochSummary::stopped)
/// tells the stop from a finished epoch. Setting the flag is one atomic
/// store, so it is safe in a signal handler: hand [`StopHandle::flag`] to
/// `signal_hook::flag::register(SIGTERM, flag)` (or set it from any thread).
/// The flag stays set until [`StopHandle::reset`]: every later epoch of the
/// pipeline ends at once until then.
///
/// ```
/// use ferrofeed_core::prelude::*;
/// let p = Pipeline::builder(FnSource::new(1000, |i| Ok(i as i64)))
///     .batch_size(10)
///     .collate(StackCollate::new().column::<i64>("x"))
///     .build()
///     .unwrap();
/// let stop = p.stop_handle();
/// let mut it = p.epoch(0);
/// let mut seen = 0;
/// while let Some(b) = it.next() {
///     seen += b.unwrap().len();
///     if seen == 30 {
///         stop.stop(); // e.g. from a SIGTERM handler
///     }
/// }
/// assert_eq!(seen, 30);
/// assert!(it.summary().stopped && !it.summary().completed);
/// let state = it.state();
/// drop(it);
/// stop.reset();
/// let rest: usize = p.resume(&state).unwrap().map(|b| b.unwrap().len()).sum();
/// assert_eq!(seen + rest, 1000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// A handle that is not set.
    pub fn new() -> Self {
        StopHandle::default()
    }
    /// Asks the running epoch (and every later one, until [`reset`](Self::reset))
    /// to end at the next batch.
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    /// Clears the request, so that epochs run again.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Release);
    }
    /// The flag itself, for code that sets an `Arc<AtomicBool>` (such as
    /// `signal_hook::flag::register`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}
