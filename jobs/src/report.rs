//! The end-of-run report: a per-stage table on stdout and `--report-json`.
//!
//! ```text
//! stage     workers  samples   busy  mean ms   p99 ms
//! decode          2     2048   97%     1.81     3.10
//! ```
use std::collections::BTreeMap;

use ferrofeed_core::{Bottleneck, StageReport, Timeline};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct SkippedEntry {
    pub index: Option<u64>,
    pub path: Option<String>,
    pub stage: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct EpochEntry {
    pub epoch: u64,
    pub samples: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub domain: String,
    pub samples: u64,
    pub batches: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    pub skipped: Vec<SkippedEntry>,
    pub workers: BTreeMap<String, usize>,
    pub cpus_available: f64,
    pub cpu_source: String,
    pub memory_bytes: u64,
    pub memory_source: String,
    pub peak_bytes_in_flight: u64,
    pub max_bytes_in_flight: u64,
    pub data_stall_seconds: f64,
    pub stages: Vec<StageReport>,
    pub bottleneck: Option<Bottleneck>,
    /// Queue fill, bytes in flight, throughput and workers over the run.
    pub timeline: Timeline,
    /// Each epoch's samples and wall time (the first one includes the
    /// pipeline's warm-up).
    pub epochs: Vec<EpochEntry>,
    /// Domain figures (text: tokens, padding waste…), printed as `key: value`.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

pub fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

pub fn print_table(r: &Report) {
    // What a remote run cost in egress, on the summary line.
    let remote = r.extra.get("remote").map_or(String::new(), |m| {
        let mb = |k: &str| m.get(k).and_then(|v| v.as_u64()).unwrap_or(0) as f64 / 1e6;
        format!(
            "; {:.1} MB downloaded, {:.1} MB from the local cache",
            mb("bytes_downloaded"),
            mb("bytes_from_cache")
        )
    });
    println!(
        "ferrofeed {}: {} samples in {} batches, {:.2} s — {:.1} samples/s{remote}",
        r.domain, r.samples, r.batches, r.seconds, r.samples_per_s
    );
    println!(
        "resources: {} CPUs ({}), memory {} ({})",
        r.cpus_available,
        r.cpu_source,
        mib(r.memory_bytes),
        r.memory_source
    );
    println!(
        "{:<12} {:>7} {:>9} {:>6} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "stage", "workers", "samples", "busy", "mean ms", "p50 ms", "p99 ms", "errors", "queue"
    );
    for s in &r.stages {
        println!(
            "{:<12} {:>7} {:>9} {:>5.0}% {:>9.3} {:>9.3} {:>9.3} {:>7} {:>7}",
            s.name,
            s.workers,
            s.samples,
            s.busy_fraction * 100.0,
            s.mean_ms,
            s.p50_ms,
            s.p99_ms,
            s.errors,
            s.input_queue_fill
                .map_or("-".to_string(), |f| format!("{:.0}%", f * 100.0))
        );
    }
    if let Some(b) = &r.bottleneck {
        println!("bottleneck: {}", b.advice);
    }
    println!(
        "peak bytes in flight: {} (budget {}); consumer waited {:.2} s for data",
        mib(r.peak_bytes_in_flight),
        mib(r.max_bytes_in_flight),
        r.data_stall_seconds
    );
    for (k, v) in &r.extra {
        println!("{k}: {v}");
    }
    if !r.skipped.is_empty() {
        println!("skipped {} samples:", r.skipped.len());
        for s in &r.skipped {
            println!(
                "  sample {} ({}) in stage `{}`: {}",
                s.index.map_or("-".to_string(), |i| i.to_string()),
                s.path.as_deref().unwrap_or("-"),
                s.stage,
                s.error
            );
        }
    }
}
