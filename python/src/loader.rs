//! `Loader`: one domain job, iterated an epoch at a time from Python.
//!
//! ```text
//! for batch in loader: …   # epoch 0, then 1, … ; loader.epoch(e) picks one
//! ```
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferrofeed::jobs::{self, BuildError, CliError, EpochEntry, FlagKind, Job, Report, RunFigures};
use ferrofeed_core::{Batch, ErrorKind, PipelineState, SampleError, StopHandle, Tensor};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use crate::array::Array;

/// Options the package takes beyond the command's flags.
const OWN: [&str; 3] = ["output", "pin_memory", "device"];

/// Flags of the command's run loop that a loader has no use for.
const RUN_LOOP_ONLY: [&str; 1] = ["dump"];

/// The long flags of `domain` a loader takes (as keywords) and whether each
/// takes a value.
#[pyfunction]
pub fn flags(domain: &str) -> PyResult<Vec<(String, bool)>> {
    let f = jobs::flags(domain).ok_or_else(|| {
        PyValueError::new_err(format!(
            "domain: {domain:?} is not one of vision, text, audio"
        ))
    })?;
    Ok(f.into_iter()
        .map(|(n, k)| (n.replace('-', "_"), k == FlagKind::Value))
        .filter(|(n, _)| !RUN_LOOP_ONLY.contains(&n.as_str()))
        .collect())
}

/// What the driver thread sends: a batch and the state after it, the error
/// that stopped the epoch, or the epoch's end.
enum Msg {
    Batch(Box<Batch>, Box<PipelineState>),
    Error(Box<SampleError>, Box<PipelineState>),
    End(Box<Report>, Box<PipelineState>, bool),
}

/// An epoch in progress on its driver thread.
struct Run {
    rx: flume::Receiver<Msg>,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    epoch: u64,
}

impl Run {
    /// Stops the epoch and joins its thread.
    fn finish(mut self) {
        self.stop.stop();
        drop(std::mem::replace(&mut self.rx, flume::bounded(0).1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stop.reset();
    }
}

/// The output kind of a batch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    Torch,
    Numpy,
}

/// A ferrofeed pipeline for one domain, iterated an epoch at a time.
#[pyclass(module = "ferrofeed._ferrofeed")]
pub struct Loader {
    job: Arc<Job>,
    /// `torch.from_dlpack` or `numpy.asarray`, looked up once.
    convert: Py<PyAny>,
    /// `"cuda"`/`"cuda:N"`: batches are moved there (non-blocking from
    /// pinned memory).
    device: Option<String>,
    /// The epoch the next `iter()` runs.
    next_epoch: u64,
    /// A state to resume from at the next `iter()`.
    pending: Option<PipelineState>,
    run: Option<Run>,
    /// The state after the last batch handed out (or at the next epoch's
    /// start when no epoch is running).
    state: PipelineState,
    report: Option<Report>,
    /// The process that made the loader: after `os.fork()` its threads
    /// exist only there.
    pid: u32,
}

/// The error every use of a loader raises in a child forked after it was
/// made: its threads stayed in the parent.
fn forked(pid: u32) -> PyErr {
    PyRuntimeError::new_err(format!(
        "this loader was created in process {pid}; after os.fork() its threads exist only \
         there: create the loader in this process (or fork before creating it)"
    ))
}

/// The Python value of a keyword as a flag's text.
fn flag_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if v.is_instance_of::<PyBool>() {
        return Ok(if v.extract::<bool>()? {
            "true"
        } else {
            "false"
        }
        .into());
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(v.extract::<i128>()?.to_string());
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(v.extract::<f64>()?.to_string());
    }
    if v.is_instance_of::<PyString>() {
        return v.extract::<String>();
    }
    if v.hasattr("__fspath__")? {
        return v.call_method0("__fspath__")?.extract::<String>();
    }
    Err(PyTypeError::new_err(format!(
        "{key}: expected a str, int, float, bool or path, got {}",
        v.get_type().name()?
    )))
}

fn keyword(flag: &str) -> String {
    flag.trim_start_matches('-').replace('-', "_")
}

fn build_error(e: BuildError) -> PyErr {
    match e {
        BuildError::Domain(d) => {
            PyValueError::new_err(format!("domain: {d:?} is not one of vision, text, audio"))
        }
        BuildError::Unknown { domain, flag } => PyTypeError::new_err(format!(
            "{domain}() got an unexpected keyword argument '{}'",
            keyword(&flag)
        )),
        BuildError::Value { flag, message } => {
            PyValueError::new_err(format!("{}: {}", keyword(&flag), message))
        }
        BuildError::Job(CliError::Io { path, source })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            PyFileNotFoundError::new_err(format!("{}: {source}", path.display()))
        }
        BuildError::Job(e) => PyValueError::new_err(e.to_string()),
    }
}

/// `ferrofeed.SampleError(message, index, path, stage)`.
fn sample_error(py: Python<'_>, e: &SampleError) -> PyErr {
    let made = py.import("ferrofeed").and_then(|m| {
        let cls = m.getattr("SampleError")?;
        cls.call1((e.to_string(), e.index, e.path.clone(), e.stage.clone()))
    });
    match made {
        Ok(obj) => PyErr::from_value(obj),
        Err(err) => err,
    }
}

fn torch_available(py: Python<'_>) -> bool {
    py.import("torch").is_ok()
}

#[pymethods]
impl Loader {
    /// Builds the job for `domain` from `options` (the subcommand's flags as
    /// keywords, plus `output`, `pin_memory` and `device`).
    #[new]
    #[pyo3(signature = (domain, path=None, options=None))]
    fn new(
        py: Python<'_>,
        domain: &str,
        path: Option<Bound<'_, PyAny>>,
        options: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let known = jobs::flags(domain).ok_or_else(|| {
            PyValueError::new_err(format!(
                "domain: {domain:?} is not one of vision, text, audio"
            ))
        })?;
        let numeric = jobs::numeric_flags(domain).unwrap_or_default();
        let path = match &path {
            None => None,
            Some(p) if p.is_none() => None,
            Some(p) => Some(flag_value("path", p)?),
        };
        if let Some(p) = &path {
            if !p.contains("://") && !std::path::Path::new(p).exists() {
                return Err(PyFileNotFoundError::new_err(format!(
                    "path: {p}: no such file or directory"
                )));
            }
        }
        let mut args: Vec<String> = Vec::new();
        let mut output = None;
        let mut device = None;
        let mut pin: Option<String> = None;
        let mut quiet = true;
        if let Some(opts) = &options {
            for (k, v) in opts.iter() {
                let key: String = k
                    .extract()
                    .map_err(|_| PyTypeError::new_err("option names must be strings"))?;
                if OWN.contains(&key.as_str()) {
                    match key.as_str() {
                        "output" => {
                            let o: String = v.extract().map_err(|_| {
                                PyTypeError::new_err("output: expected \"torch\" or \"numpy\"")
                            })?;
                            output = Some(match o.as_str() {
                                "torch" => Output::Torch,
                                "numpy" => Output::Numpy,
                                _ => {
                                    return Err(PyValueError::new_err(format!(
                                        "output: {o:?} is not \"torch\" or \"numpy\""
                                    )))
                                }
                            });
                        }
                        "device" => {
                            if !v.is_none() {
                                let d: String = v.extract().map_err(|_| {
                                    PyTypeError::new_err(
                                        "device: expected None, \"cuda\" or \"cuda:N\"",
                                    )
                                })?;
                                let ok = d == "cuda"
                                    || d.strip_prefix("cuda:")
                                        .is_some_and(|n| n.parse::<u32>().is_ok());
                                if !ok {
                                    return Err(PyValueError::new_err(format!(
                                        "device: {d:?} is not \"cuda\" or \"cuda:N\""
                                    )));
                                }
                                device = Some(d);
                            }
                        }
                        _ => {
                            pin = Some(if v.is_instance_of::<PyBool>() {
                                if v.extract::<bool>()? { "auto" } else { "off" }.to_string()
                            } else if v.is_instance_of::<PyString>() {
                                match v.extract::<String>()?.as_str() {
                                    "auto" => "auto".to_string(),
                                    other => {
                                        return Err(PyValueError::new_err(format!(
                                            "pin_memory: {other:?} is not \"auto\", True or False"
                                        )))
                                    }
                                }
                            } else {
                                return Err(PyTypeError::new_err(format!(
                                    "pin_memory: expected \"auto\", True or False, got {}",
                                    v.get_type().name()?
                                )));
                            });
                        }
                    }
                    continue;
                }
                let flag = key.replace('_', "-");
                let Some((_, kind)) = known.iter().find(|(n, _)| *n == flag) else {
                    return Err(PyTypeError::new_err(format!(
                        "{domain}() got an unexpected keyword argument '{key}'"
                    )));
                };
                if RUN_LOOP_ONLY.contains(&key.as_str()) {
                    return Err(PyValueError::new_err(format!(
                        "{key}: a setting of the command's run loop; a loader runs one epoch per iteration (use loader.epoch(e)) and hands batches to you"
                    )));
                }
                match kind {
                    FlagKind::Switch => {
                        if !v.is_instance_of::<PyBool>() {
                            return Err(PyTypeError::new_err(format!(
                                "{key}: expected True or False, got {}",
                                v.get_type().name()?
                            )));
                        }
                        let on = v.extract::<bool>()?;
                        if key == "quiet" {
                            quiet = on;
                        } else if on {
                            args.push(format!("--{flag}"));
                        }
                    }
                    FlagKind::Value => {
                        if v.is_none() {
                            continue;
                        }
                        // A number given as text (`batch_size="64"`) is
                        // refused, as torch's DataLoader does.
                        if numeric.contains(&flag) && v.is_instance_of::<PyString>() {
                            return Err(PyValueError::new_err(format!(
                                "{key}: expected a number, got str {}",
                                v.repr()?
                            )));
                        }
                        // One argument, so a negative value is not read
                        // as a flag.
                        args.push(format!("--{flag}={}", flag_value(&key, &v)?));
                    }
                }
            }
        }
        if quiet {
            args.push("--quiet".into());
        }
        // A loader runs as many epochs as it is iterated: unless told how
        // many are planned, the job is set up for more than one (vision's
        // scan index pays from the second epoch on).
        if !args.iter().any(|a| a.starts_with("--epochs=")) {
            args.push("--epochs".into());
            args.push(u64::MAX.to_string());
        }
        if let Some(p) = pin {
            if known.iter().any(|(n, _)| n == "pin") {
                args.push("--pin".into());
                args.push(p);
            }
        }
        let output = match output {
            Some(Output::Torch) if !torch_available(py) => {
                return Err(PyValueError::new_err(
                    "output: \"torch\" needs torch, which does not import here",
                ))
            }
            Some(o) => o,
            None if torch_available(py) => Output::Torch,
            None => Output::Numpy,
        };
        if let Some(d) = &device {
            if output != Output::Torch {
                return Err(PyValueError::new_err(
                    "device: batches go to a device as torch tensors; set output=\"torch\"",
                ));
            }
            let cuda = py.import("torch")?.getattr("cuda")?;
            let n: usize = cuda.call_method0("device_count")?.extract()?;
            let want = d
                .strip_prefix("cuda:")
                .and_then(|i| i.parse::<usize>().ok())
                .unwrap_or(0);
            if want >= n {
                return Err(PyRuntimeError::new_err(format!(
                    "device: {d:?}, but torch sees {n} CUDA device(s)"
                )));
            }
        }
        let domain_s = domain.to_string();
        let job = py
            .detach(move || jobs::build(&domain_s, path.as_deref(), &args))
            .map_err(build_error)?;
        let mut pending = None;
        if let Some(file) = &job.common.resume {
            if !file.exists() {
                return Err(PyFileNotFoundError::new_err(format!(
                    "resume: {}: no such file",
                    file.display()
                )));
            }
            pending = Some(
                PipelineState::read(file)
                    .map_err(|e| PyValueError::new_err(format!("resume: {e}")))?,
            );
        }
        let state = match &pending {
            Some(s) => s.clone(),
            None => job.pipeline.epoch_state_start(0),
        };
        let convert = match output {
            Output::Torch => py.import("torch")?.getattr("from_dlpack")?,
            Output::Numpy => py.import("numpy")?.getattr("asarray")?,
        }
        .unbind();
        Ok(Loader {
            job: Arc::new(job),
            convert,
            device,
            next_epoch: state.epoch,
            pending,
            run: None,
            state,
            report: None,
            pid: std::process::id(),
        })
    }

    /// Batches per epoch on this rank (`None` is never returned for the
    /// built-in domains; an iterable source whose length is unknown
    /// raises `TypeError`, as `len()` of an unsized iterable does).
    fn __len__(&self) -> PyResult<usize> {
        let n = self
            .job
            .pipeline
            .epoch_hint(self.next_epoch)
            .ok_or_else(|| PyTypeError::new_err("this loader's epochs have no known length"))?;
        // `limit_batches` caps what an epoch delivers.
        Ok(match self.job.common.limit_batches {
            Some(l) => n.min(usize::try_from(l).unwrap_or(usize::MAX)),
            None => n,
        })
    }

    /// Starts the next epoch (or the resumed one) and returns the loader.
    fn __iter__(mut slf: PyRefMut<'_, Self>) -> PyResult<PyRefMut<'_, Self>> {
        if slf.pid != std::process::id() {
            return Err(forked(slf.pid));
        }
        let epoch = match &slf.run {
            Some(r) => r.epoch + 1,
            None => slf.next_epoch,
        };
        slf.start(epoch);
        Ok(slf)
    }

    /// Iterates epoch `e` (the following `iter()` runs `e + 1`).
    fn epoch(mut slf: PyRefMut<'_, Self>, e: u64) -> PyResult<PyRefMut<'_, Self>> {
        if slf.pid != std::process::id() {
            return Err(forked(slf.pid));
        }
        slf.pending = None;
        slf.start(e);
        Ok(slf)
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyDict>>> {
        if self.pid != std::process::id() {
            return Err(forked(self.pid));
        }
        let Some(run) = &self.run else {
            return Ok(None);
        };
        let rx = run.rx.clone();
        let msg = loop {
            let got = py.detach(|| rx.recv_timeout(Duration::from_millis(50)));
            match got {
                Ok(m) => break Some(m),
                Err(flume::RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(flume::RecvTimeoutError::Disconnected) => break None,
            }
        };
        match msg {
            Some(Msg::Batch(batch, state)) => {
                self.state = *state;
                Ok(Some(self.to_python(py, *batch)?))
            }
            Some(Msg::Error(e, state)) => {
                self.state = *state;
                Err(sample_error(py, &e))
            }
            Some(Msg::End(report, state, completed)) => {
                let epoch = run.epoch;
                if let Some(r) = self.run.take() {
                    r.finish();
                }
                self.report = Some(*report);
                self.next_epoch = epoch + 1;
                // A finished epoch's state is the next one's start.
                self.state = if completed {
                    self.job.pipeline.epoch_state_start(epoch + 1)
                } else {
                    *state
                };
                self.write_files()?;
                Ok(None)
            }
            None => {
                self.run.take();
                Err(PyRuntimeError::new_err(
                    "the epoch's driver thread ended unexpectedly",
                ))
            }
        }
    }

    /// The position after the last batch handed out, as a JSON-ready dict;
    /// `load_state_dict` on a loader with the same options continues there.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = py.import("json")?;
        json.call_method1("loads", (self.state.to_json(),))
    }

    /// Makes the next iteration continue where `state` was taken.
    fn load_state_dict(&mut self, py: Python<'_>, state: Bound<'_, PyAny>) -> PyResult<()> {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (state,))?
            .extract()?;
        let s = PipelineState::from_json(&text)
            .map_err(|e| PyValueError::new_err(format!("state: {e}")))?;
        // Checked against this loader's dataset and settings now, not at
        // the next iteration.
        self.job
            .pipeline
            .resume(&s)
            .map_err(|e| PyValueError::new_err(format!("state: {e}")))?;
        if let Some(r) = self.run.take() {
            r.finish();
        }
        self.next_epoch = s.epoch;
        self.state = s.clone();
        self.pending = Some(s);
        Ok(())
    }

    /// The report of the last finished epoch (the command's `--report-json`
    /// fields), or `None` before one has finished.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match &self.report {
            None => Ok(None),
            Some(r) => {
                let json = serde_json::to_string(r)
                    .map_err(|e| PyRuntimeError::new_err(format!("report: {e}")))?;
                Ok(Some(py.import("json")?.call_method1("loads", (json,))?))
            }
        }
    }

    /// Writes the last finished epoch's report as one self-contained HTML
    /// page (the command's `--report-html`) to `path`.
    fn report_html(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let Some(r) = &self.report else {
            return Err(PyRuntimeError::new_err(
                "report_html: no epoch has finished yet",
            ));
        };
        let job = Arc::clone(&self.job);
        let page = py.detach(|| job.report_page(r).render());
        std::fs::write(&path, page).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                PyFileNotFoundError::new_err(format!("path: {}: {e}", path.display()))
            }
            _ => PyRuntimeError::new_err(format!("path: {}: {e}", path.display())),
        })
    }

    /// Stops the running epoch, if any, and joins its threads.
    fn close(&mut self, py: Python<'_>) {
        if self.pid != std::process::id() {
            std::mem::forget(self.run.take());
            return;
        }
        if let Some(r) = self.run.take() {
            py.detach(move || r.finish());
        }
    }

    /// The domain's name.
    #[getter]
    fn domain(&self) -> &'static str {
        self.job.domain
    }

    /// The epoch the next `iter()` runs.
    #[getter]
    fn next_epoch(&self) -> u64 {
        match &self.run {
            Some(r) => r.epoch + 1,
            None => self.next_epoch,
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child: the threads to stop and join are the
            // parent's. Joining them would wait forever; leave them be.
            std::mem::forget(self.run.take());
            std::mem::forget(Arc::clone(&self.job));
            return;
        }
        if let Some(r) = self.run.take() {
            r.finish();
        }
    }
}

impl Loader {
    /// Starts epoch `epoch` (or the pending resume) on a driver thread,
    /// stopping any epoch in progress first.
    fn start(&mut self, epoch: u64) {
        if let Some(r) = self.run.take() {
            r.finish();
        }
        let resume = self.pending.take();
        let epoch = resume.as_ref().map_or(epoch, |s| s.epoch);
        let (tx, rx) = flume::bounded(1);
        let job = Arc::clone(&self.job);
        let stop = job.pipeline.stop_handle();
        let limit = job.common.limit_batches;
        let thread = std::thread::Builder::new()
            .name("ferrofeed-epoch".into())
            .spawn(move || drive(&job, epoch, resume, limit, &tx))
            .ok();
        self.run = Some(Run {
            rx,
            stop,
            thread,
            epoch,
        });
    }

    fn to_python(&self, py: Python<'_>, mut batch: Batch) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        let names: Vec<String> = batch.columns().map(|(n, _)| n.to_string()).collect();
        let idx: Vec<i64> = batch.indices().iter().map(|&i| i as i64).collect();
        let f = self.convert.bind(py);
        let kw = match &self.device {
            Some(_) => {
                let kw = PyDict::new(py);
                kw.set_item("non_blocking", true)?;
                Some(kw)
            }
            None => None,
        };
        let convert = |a: Array| -> PyResult<Bound<'_, PyAny>> {
            let t = f.call1((Bound::new(py, a)?,))?;
            match (&self.device, &kw) {
                (Some(dev), Some(kw)) => t.call_method("to", (dev.as_str(),), Some(kw)),
                _ => Ok(t),
            }
        };
        for name in names {
            if let Some(t) = batch.remove(&name) {
                d.set_item(name, convert(Array::new(t))?)?;
            }
        }
        let n = idx.len();
        d.set_item(
            "indices",
            convert(Array::new(Tensor::from_slice(&idx, &[n])))?,
        )?;
        Ok(d.unbind())
    }

    /// After an epoch: `save_state`, `report_json` and `trace` files, when
    /// those options were given.
    fn write_files(&self) -> PyResult<()> {
        let c = &self.job.common;
        let io = |what: &str, p: &std::path::Path, e: std::io::Error| {
            PyRuntimeError::new_err(format!("{what}: {}: {e}", p.display()))
        };
        if let Some(p) = &c.save_state {
            std::fs::write(p, self.state.to_json()).map_err(|e| io("save_state", p, e))?;
        }
        if let (Some(p), Some(r)) = (&c.report_json, &self.report) {
            let json = serde_json::to_string(r).unwrap_or_default();
            std::fs::write(p, json).map_err(|e| io("report_json", p, e))?;
        }
        if let (Some(p), Some(r)) = (&c.report_html, &self.report) {
            std::fs::write(p, self.job.report_page(r).render())
                .map_err(|e| io("report_html", p, e))?;
        }
        if let (Some(p), Some(json)) = (&c.trace, self.job.pipeline.trace_json()) {
            std::fs::write(p, json).map_err(|e| io("trace", p, e))?;
        }
        Ok(())
    }
}

/// The driver thread: runs one epoch and sends each batch with the state
/// after it, then the epoch's report. Ends early when the loader stops it
/// or drops the receiver.
fn drive(
    job: &Job,
    epoch: u64,
    resume: Option<PipelineState>,
    limit: Option<u64>,
    tx: &flume::Sender<Msg>,
) {
    let p = &job.pipeline;
    p.reset_metrics();
    // A loader may always be iterated again: remote data reads ahead into
    // the next epoch.
    (job.epoch_start)(p, epoch, true);
    let mut it = match &resume {
        Some(s) => match p.resume(s) {
            Ok(it) => it,
            Err(e) => {
                let err = SampleError {
                    index: None,
                    path: None,
                    stage: "resume".into(),
                    kind: ErrorKind::Failed(e.to_string()),
                    attempts: 1,
                };
                let _ = tx.send(Msg::Error(Box::new(err), Box::new(s.clone())));
                return;
            }
        },
        None => p.epoch(epoch),
    };
    let mut batches = 0u64;
    // `limit_batches=0` delivers nothing.
    while limit.is_none_or(|l| batches < l) {
        let Some(item) = it.next() else { break };
        let msg = match item {
            Ok(b) => Msg::Batch(Box::new(b), Box::new(it.state())),
            Err(e) => Msg::Error(Box::new(job.shown_error(e)), Box::new(it.state())),
        };
        if tx.send(msg).is_err() {
            return;
        }
        batches += 1;
    }
    let s = it.summary().clone();
    let state = it.state();
    drop(it);
    (job.epoch_end)(epoch);
    let report = job.report(RunFigures {
        samples: s.samples,
        batches: s.batches,
        seconds: s.seconds,
        skipped: s.skipped.clone(),
        stall_seconds: s.wait_seconds,
        epochs: vec![EpochEntry {
            epoch,
            samples: s.samples,
            seconds: s.seconds,
            samples_per_s: s.samples as f64 / s.seconds.max(1e-9),
        }],
    });
    let _ = tx.send(Msg::End(Box::new(report), Box::new(state), s.completed));
}
