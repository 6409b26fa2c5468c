//! Locks that survive a panic elsewhere: a stage that panics while another
//! thread holds one of the engine's locks must not take the pipeline down
//! with a poisoned mutex, since every value behind these locks stays valid
//! across a panic (counters, queues, logs).
//!
//! ```
//! use std::sync::Mutex;
//! use ferrofeed_core::sync::LockExt;
//! let m = std::sync::Arc::new(Mutex::new(1));
//! let m2 = m.clone();
//! let _ = std::thread::spawn(move || {
//!     let _g = m2.lock().unwrap();
//!     panic!("poisons the mutex");
//! })
//! .join();
//! assert!(m.lock().is_err(), "poisoned");
//! assert_eq!(*m.lock_unpoisoned(), 1, "still usable");
//! ```
use std::sync::{Mutex, MutexGuard};

/// [`Mutex::lock`] that takes the guard of a poisoned mutex as it is.
pub trait LockExt<T> {
    /// Locks, ignoring poisoning.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T> LockExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
