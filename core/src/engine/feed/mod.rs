//! The two source kinds as feeds the first segment's workers pull tasks
//! from, one file each (as crossbeam-channel keeps one file per flavor):
//! [`map`] and [`iterable`]. A worker asks [`Work`](super::messages::Work)
//! which kind the epoch runs and pulls from that feed until it is empty.
//!
//! ```text
//! Work::Map  { plan }                 → map::run_map_source: claim k batches, admit, read, stages, forward
//! Work::Iter { order, interleave, .. } → iterable::run_iter_source: claim a group, read parts, stages, forward
//!                                        slices::read_sliced: a part read and run a quarter batch at a time
//! ```

pub(crate) mod iterable;
pub(crate) mod map;
pub(crate) mod slices;
