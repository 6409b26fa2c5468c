//! The engine under `ferrofeed.torch.DataLoader` for map-style datasets: a
//! source whose sample `i` is the Python `fetch(i)` (the dataset's
//! `__getitem__`, on the engine's worker threads, each taking the GIL for
//! the call), a collate that calls the Python `collate(samples)`, and a
//! batch sampler that replays the batches the Python side drew from
//! torch's own samplers. The byte budget, ordering, error policy, per-stage
//! metrics and the consumer's stall time are the engine's.
//!
//! ```text
//! MapRunner(fetch, collate, workers, …).run(batches) → next() → (indices, batch) | error
//! ```
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrofeed_core::sync::LockExt;
use ferrofeed_core::{
    Batch, BatchRows, BatchSampler, BoxError, Collate, CollateError, Component, ComponentId,
    EpochPlan, ErrorPolicy, FnSource, Parallelism, Pipeline, PlanCtx, SampleError, StageOptions,
    StopHandle,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

/// A sample as the dataset returned it, with its estimated bytes.
#[derive(Clone)]
struct PyItem(Arc<Py<PyAny>>, usize);

impl Component for PyItem {
    fn nbytes(&self) -> usize {
        self.1
    }
}

/// A collated batch, attached to the engine's batch.
struct PyBatch(Py<PyAny>);

/// Python exceptions by the sample (or batch's first sample) they came
/// from, so the caller gets the dataset's own exception back.
pub(crate) type Raised = Arc<Mutex<HashMap<u64, Py<PyAny>>>>;

pub(crate) fn stash(raised: &Raised, index: u64, py: Python<'_>, e: PyErr) -> String {
    let text = e.to_string();
    raised
        .lock_unpoisoned()
        .insert(index, e.into_value(py).into_any());
    text
}

/// The position of the sample a failed collate blames (the Python side
/// sets `__ferrofeed_sample__` on the exception), when it is one of `n`.
pub(crate) fn blamed(py: Python<'_>, e: &PyErr, n: usize) -> Option<usize> {
    e.value(py)
        .getattr("__ferrofeed_sample__")
        .ok()
        .and_then(|v| v.extract::<usize>().ok())
        .filter(|&p| p < n)
}

thread_local! {
    /// Whether this engine thread holds a Python thread state of its own.
    static KEPT_STATE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `Python::attach` from an engine thread that keeps one Python thread
/// state for its whole life. Without it each attach makes a thread state
/// and deletes it again, so what the dataset keeps in a `threading.local`
/// (a file handle, a connection, a generator that `worker_init_fn` set up)
/// would be gone at the next sample.
pub(crate) fn attach_kept<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    KEPT_STATE.with(|kept| {
        if !kept.get() {
            kept.set(true);
            // SAFETY: only on a thread Python knows nothing of (no thread
            // state, so it cannot hold the GIL): PyGILState_Ensure makes its
            // thread state and takes the GIL, PyEval_SaveThread releases the
            // GIL and keeps the state, which later PyGILState_Ensure calls
            // on this thread reuse.
            unsafe {
                if pyo3::ffi::PyGILState_GetThisThreadState().is_null() {
                    let _ = pyo3::ffi::PyGILState_Ensure();
                    pyo3::ffi::PyEval_SaveThread();
                }
            }
        }
    });
    Python::attach(f)
}

/// Replays the batches set for each run.
struct Replay(Arc<Mutex<Vec<Vec<u64>>>>);

impl BatchSampler for Replay {
    fn plan(&self, _ctx: &PlanCtx) -> Result<EpochPlan, BoxError> {
        let batches = self.0.lock_unpoisoned().clone();
        let mut indices = Vec::new();
        let mut offsets = vec![0];
        for b in batches {
            indices.extend(b);
            offsets.push(indices.len());
        }
        Ok(EpochPlan {
            indices,
            offsets,
            padded: 0,
        })
    }
}

struct PyCollate {
    collate: Py<PyAny>,
    auto: bool,
    raised: Raised,
}

impl Collate for PyCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<PyItem>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let items = rows.column::<PyItem>().ok_or_else(|| CollateError {
            sample: None,
            message: "no samples to collate".into(),
        })?;
        let first = rows.indices().first().copied().unwrap_or(0);
        attach_kept(|py| {
            let out = if self.auto {
                let list = PyList::new(py, items.iter().map(|i| i.0.bind(py)));
                list.and_then(|l| self.collate.bind(py).call1((l,)))
            } else {
                self.collate.bind(py).call1((items[0].0.bind(py),))
            };
            match out {
                Ok(b) => {
                    let mut batch = Batch::new(rows.indices().to_vec());
                    batch.attach(PyBatch(b.unbind()));
                    Ok(batch)
                }
                Err(e) => {
                    // The Python side names the sample at fault (a None, one
                    // that fails alone, one of another shape); without a
                    // name the whole batch is at fault.
                    let blamed = blamed(py, &e, items.len()).or((items.len() == 1).then_some(0));
                    let at = blamed.map_or(first, |p| rows.indices()[p]);
                    Err(CollateError {
                        sample: blamed,
                        message: stash(&self.raised, at, py, e),
                    })
                }
            }
        })
    }
}

/// A delivered batch (its dataset indices and the collated object), or the
/// error that stopped the run.
type Delivery = Result<(Vec<u64>, Py<PyAny>), SampleError>;

/// An epoch's worth of work in progress.
struct Active {
    rx: flume::Receiver<Delivery>,
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<Option<ferrofeed_core::EpochSummary>>>,
}

/// A map-style dataset on the engine's threads.
#[pyclass(module = "ferrofeed._ferrofeed")]
pub struct MapRunner {
    pipeline: Arc<Pipeline>,
    plan: Arc<Mutex<Vec<Vec<u64>>>>,
    raised: Raised,
    run: Option<Active>,
    runs: u64,
    timeout: Option<Duration>,
    summary: Option<ferrofeed_core::EpochSummary>,
    /// The process that made it (its threads are not in a forked child).
    pid: u32,
}

/// What a forked child gets from a runner made before the fork.
fn forked(pid: u32) -> PyErr {
    PyRuntimeError::new_err(format!(
        "this DataLoader was created in process {pid}; after os.fork() its threads exist only \
         there: create the DataLoader in this process (or fork before creating it)"
    ))
}

impl MapRunner {
    fn finish(&mut self) {
        if let Some(mut a) = self.run.take() {
            a.stop.stop();
            drop(std::mem::replace(&mut a.rx, flume::bounded(0).1));
            if let Some(t) = a.thread.take() {
                if let Ok(s) = t.join() {
                    self.summary = s;
                }
            }
            a.stop.reset();
        }
    }
}

impl Drop for MapRunner {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child: joining the parent's threads would wait
            // forever.
            std::mem::forget(self.run.take());
            std::mem::forget(Arc::clone(&self.pipeline));
            return;
        }
        // With the GIL released: workers inside `__getitem__` or collate
        // wait for it before they can stop.
        Python::attach(|py| {
            py.detach(|| {
                self.finish();
                self.pipeline.stop_and_wait(Duration::from_secs(10));
            })
        });
    }
}

#[pymethods]
impl MapRunner {
    /// `fetch(i)` returns `(sample, nbytes)`; `collate` takes the list of
    /// a batch's samples (or one sample when `auto` is false).
    #[new]
    #[pyo3(signature = (fetch, collate, auto, workers, prefetch, max_bytes, ordered, on_error, timeout))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        fetch: Py<PyAny>,
        collate: Py<PyAny>,
        auto: bool,
        workers: usize,
        prefetch: usize,
        max_bytes: usize,
        ordered: bool,
        on_error: &str,
        timeout: f64,
    ) -> PyResult<Self> {
        let policy: ErrorPolicy = on_error
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("on_error: {e}")))?;
        let raised: Raised = Arc::default();
        let plan: Arc<Mutex<Vec<Vec<u64>>>> = Arc::default();
        let r = Arc::clone(&raised);
        let fetch = Arc::new(fetch);
        let source = FnSource::new(u64::MAX >> 1, move |i: u64| -> Result<PyItem, BoxError> {
            attach_kept(|py| match fetch.bind(py).call1((i,)) {
                Ok(out) => {
                    let (obj, bytes): (Py<PyAny>, usize) = out
                        .extract()
                        .map_err(|e: PyErr| -> BoxError { stash(&r, i, py, e).into() })?;
                    Ok(PyItem(Arc::new(obj), bytes))
                }
                Err(e) => Err(stash(&r, i, py, e).into()),
            })
        });
        let w = StageOptions::new().workers(Parallelism::Fixed(workers.max(1)));
        let mut b = Pipeline::builder(source)
            .map_with("getitem", w, |x: PyItem, _: &ferrofeed_core::StageCtx| {
                Ok(x)
            })
            .batch_sampler(Replay(Arc::clone(&plan)))
            .collate(PyCollate {
                collate,
                auto,
                raised: Arc::clone(&raised),
            })
            .on_error(policy)
            .min_task_samples(1)
            .prefetch(prefetch.max(1))
            .max_bytes_in_flight(max_bytes.max(1))
            .cpus(workers.max(1));
        if !ordered {
            b = b.unordered();
        }
        let pipeline = b
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(MapRunner {
            pipeline: Arc::new(pipeline),
            plan,
            raised,
            run: None,
            runs: 0,
            timeout: (timeout > 0.0).then(|| Duration::from_secs_f64(timeout)),
            summary: None,
            pid: std::process::id(),
        })
    }

    /// Starts running `batches` (lists of dataset indices), stopping any
    /// run in progress.
    fn start(&mut self, py: Python<'_>, batches: Vec<Vec<u64>>) -> PyResult<()> {
        if self.pid != std::process::id() {
            return Err(forked(self.pid));
        }
        py.detach(|| self.finish());
        *self.plan.lock_unpoisoned() = batches;
        self.raised.lock_unpoisoned().clear();
        let (tx, rx) = flume::bounded(1);
        let pipeline = Arc::clone(&self.pipeline);
        let stop = pipeline.stop_handle();
        let epoch = self.runs;
        self.runs += 1;
        let thread = std::thread::Builder::new()
            .name("ferrofeed-dataloader".into())
            .spawn(move || {
                pipeline.reset_metrics();
                let mut it = pipeline.epoch(epoch);
                for item in it.by_ref() {
                    let msg = item.map(|b| {
                        let idx = b.indices().to_vec();
                        let obj = b
                            .attached::<PyBatch>()
                            .map(|p| Python::attach(|py| p.0.clone_ref(py)));
                        (idx, obj)
                    });
                    let msg = match msg {
                        Ok((idx, Some(obj))) => Ok((idx, obj)),
                        Ok((_, None)) => continue,
                        Err(e) => Err(e),
                    };
                    if tx.send(msg).is_err() {
                        break;
                    }
                }
                Some(it.summary().clone())
            })
            .ok();
        self.run = Some(Active { rx, stop, thread });
        Ok(())
    }

    /// The next `(indices, batch)`, or `None` at the end of the run.
    /// Raises the dataset's (or collate's) own exception under `fail`, and
    /// `RuntimeError` when `timeout` passes first.
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<(Vec<u64>, Py<PyAny>)>> {
        if self.pid != std::process::id() {
            return Err(forked(self.pid));
        }
        let Some(a) = &self.run else {
            return Ok(None);
        };
        let rx = a.rx.clone();
        let t0 = Instant::now();
        loop {
            let got = py.detach(|| rx.recv_timeout(Duration::from_millis(50)));
            match got {
                Ok(Ok(b)) => return Ok(Some(b)),
                Ok(Err(e)) => {
                    let own = e
                        .index
                        .and_then(|i| self.raised.lock_unpoisoned().remove(&i));
                    return Err(match own {
                        Some(v) => PyErr::from_value(v.into_bound(py)),
                        None => PyRuntimeError::new_err(e.to_string()),
                    });
                }
                Err(flume::RecvTimeoutError::Timeout) => {
                    py.check_signals()?;
                    if let Some(t) = self.timeout {
                        if t0.elapsed() >= t {
                            return Err(PyRuntimeError::new_err(format!(
                                "DataLoader timed out after {} seconds",
                                t.as_secs_f64()
                            )));
                        }
                    }
                }
                Err(flume::RecvTimeoutError::Disconnected) => {
                    py.detach(|| self.finish());
                    return Ok(None);
                }
            }
        }
    }

    /// Stops the run in progress, joins its thread and waits (up to 10 s)
    /// for the engine's workers to leave `__getitem__` and collate, so that
    /// none calls into Python afterwards (the loader closes this way when
    /// the interpreter exits).
    fn close(&mut self, py: Python<'_>) {
        if self.pid != std::process::id() {
            return;
        }
        py.detach(|| {
            self.finish();
            self.pipeline.stop_and_wait(Duration::from_secs(10));
        });
    }

    /// The last run's figures: time in `__getitem__` and in collate, the
    /// consumer's stall, skipped samples, peak bytes in flight.
    fn report(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let stages = self.pipeline.stage_reports();
        let busy = |name: &str| {
            stages
                .iter()
                .find(|s| s.name == name)
                .map_or(0.0, |s| s.mean_ms * s.samples as f64 / 1e3)
        };
        let s = self.summary.clone().unwrap_or_default();
        let skipped: Vec<serde_json::Value> = s
            .skipped
            .iter()
            .map(|e| {
                serde_json::json!({"index": e.index, "stage": e.stage, "error": e.kind.to_string()})
            })
            .collect();
        let v = serde_json::json!({
            "batches": s.batches,
            "samples": s.samples,
            "seconds": s.seconds,
            "getitem_seconds": busy("getitem") + busy("source"),
            "collate_seconds": busy("collate"),
            "data_stall_seconds": s.wait_seconds,
            "skipped": skipped,
            "peak_bytes_in_flight": self.pipeline.budget().peak(),
            "max_bytes_in_flight": self.pipeline.budget().max(),
            "stages": serde_json::to_value(&stages).unwrap_or_default(),
        });
        Ok(py
            .import("json")?
            .call_method1("loads", (v.to_string(),))?
            .unbind())
    }
}
