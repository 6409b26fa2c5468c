//! Traces: a Chrome/Perfetto trace of every stage's work — one track per
//! worker thread, one slice per sample per stage, one slice per collated
//! batch, and a flow arrow from the worker that built each batch to the
//! consumer that received it. Load the JSON in `ui.perfetto.dev` or
//! `chrome://tracing`. The number of events is bounded; past the bound
//! events are counted, not kept.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! let p = Pipeline::builder(FnSource::new(10, |i| Ok(i as i64)))
//!     .map("inc", |x: i64, _: &StageCtx| Ok(x + 1))
//!     .batch_size(5)
//!     .trace(10_000)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! assert_eq!(p.epoch(0).count(), 2);
//! let json = p.trace_json().unwrap();
//! assert!(json.contains("\"traceEvents\"") && json.contains("\"inc\""));
//! ```
use crate::sync::LockExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// One recorded event.
#[derive(Debug, Clone)]
pub(crate) struct TraceEvent {
    pub name: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub index: u64,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A slice of work on one sample.
    Sample,
    /// A collated batch (`index` = its flow id).
    Batch,
    /// The consumer received a batch (`index` = its flow id).
    Received,
}

/// Collects events from every worker.
pub(crate) struct TraceSink {
    pub t0: Instant,
    max: usize,
    names: Vec<String>,
    threads: Mutex<Vec<(u32, String)>>,
    events: Mutex<Vec<TraceEvent>>,
    /// Counter samples: `(ns, track, values)`.
    counters: Mutex<Vec<(u64, String, serde_json::Value)>>,
    dropped: AtomicU64,
}

impl TraceSink {
    pub(crate) fn new(max: usize, names: Vec<String>) -> Self {
        TraceSink {
            t0: Instant::now(),
            max,
            names,
            threads: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            counters: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        }
    }
    pub(crate) fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.t0).as_nanos() as u64
    }
    pub(crate) fn name_thread(&self, tid: u32, name: String) {
        if let Ok(mut t) = self.threads.lock() {
            t.push((tid, name));
        }
    }
    /// Moves a worker's buffered events in, keeping the bound.
    pub(crate) fn flush(&self, buf: &mut Vec<TraceEvent>) {
        if buf.is_empty() {
            return;
        }
        let mut ev = self.events.lock_unpoisoned();
        let room = self.max.saturating_sub(ev.len());
        if buf.len() > room {
            self.dropped
                .fetch_add((buf.len() - room) as u64, Ordering::Relaxed);
            buf.truncate(room);
        }
        ev.append(buf);
    }
    /// Records a counter sample (a Perfetto counter track per `name`, one
    /// series per key of `values`), within the same bound as the events.
    pub(crate) fn counter(&self, ts_ns: u64, name: &str, values: serde_json::Value) {
        let mut c = self.counters.lock_unpoisoned();
        if c.len() < self.max {
            c.push((ts_ns, name.to_string(), values));
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
    /// The trace as Chrome trace-event JSON.
    pub(crate) fn to_json(&self) -> String {
        let events = self.events.lock_unpoisoned();
        let threads = self.threads.lock_unpoisoned();
        let us = |ns: u64| ns as f64 / 1e3;
        let mut out: Vec<serde_json::Value> = Vec::with_capacity(events.len() + threads.len() + 2);
        out.push(serde_json::json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "ferrofeed"}}));
        out.push(serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "consumer"}}));
        for (tid, name) in threads.iter() {
            out.push(serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}));
        }
        for e in events.iter() {
            let name = self.names.get(e.name as usize).map_or("?", String::as_str);
            match e.kind {
                Kind::Sample => out.push(serde_json::json!({
                    "name": name, "cat": "stage", "ph": "X", "pid": 1, "tid": e.tid,
                    "ts": us(e.ts_ns), "dur": us(e.dur_ns), "args": {"index": e.index}
                })),
                Kind::Batch => {
                    out.push(serde_json::json!({
                        "name": "collate", "cat": "batch", "ph": "X", "pid": 1, "tid": e.tid,
                        "ts": us(e.ts_ns), "dur": us(e.dur_ns), "args": {"batch": e.index}
                    }));
                    out.push(serde_json::json!({
                        "name": "batch", "cat": "flow", "ph": "s", "id": e.index, "pid": 1,
                        "tid": e.tid, "ts": us(e.ts_ns + e.dur_ns)
                    }));
                }
                Kind::Received => {
                    out.push(serde_json::json!({
                        "name": "batch", "cat": "flow", "ph": "f", "bp": "e", "id": e.index,
                        "pid": 1, "tid": 0, "ts": us(e.ts_ns)
                    }));
                    out.push(serde_json::json!({
                        "name": "batch received", "cat": "batch", "ph": "i", "s": "t", "pid": 1,
                        "tid": 0, "ts": us(e.ts_ns), "args": {"batch": e.index}
                    }));
                }
            }
        }
        let counters = self.counters.lock_unpoisoned();
        for (ts, name, values) in counters.iter() {
            out.push(serde_json::json!({
                "name": name, "ph": "C", "pid": 1, "ts": us(*ts), "args": values
            }));
        }
        serde_json::json!({
            "traceEvents": out,
            "displayTimeUnit": "ms",
            "otherData": {"dropped_events": self.dropped.load(Ordering::Relaxed)}
        })
        .to_string()
    }
}

/// A flow id for a batch: its epoch and position.
pub(crate) fn flow_id(epoch: u64, pos: (u64, u64)) -> u64 {
    crate::rng::derive_seed(&[epoch, pos.0, pos.1]) >> 12
}
