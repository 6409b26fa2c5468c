//! `Loader`: one domain job, iterated an epoch at a time from Python.
//!
//! ```text
//! for batch in loader: …   # epoch 0, then 1, … ; loader.epoch(e) picks one
//! ```
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::ops::ControlFlow;

use ferrofeed_core::{Batch, ErrorKind, PipelineState, SampleError, StopHandle, Tensor};
use ferrofeed_jobs::keywords::{self, KeywordError};
use ferrofeed_jobs::{Job, JobError, Pin, Report, RunFigures};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::array::Array;
use crate::compose::{BatchStages, PyBatch};

/// Settings of the command's run loop that a loader has no use for.
const RUN_LOOP_ONLY: [&str; 1] = ["dump"];

/// The keywords `domain`'s loader takes (its settings' fields) and whether
/// each takes a value.
#[pyfunction]
pub fn flags(domain: &str) -> PyResult<Vec<(String, bool)>> {
    let f = keywords::keywords(domain).ok_or_else(|| {
        PyValueError::new_err(format!(
            "domain: {domain:?} is not one of vision, text, audio"
        ))
    })?;
    Ok(f.into_iter()
        .filter(|(n, _)| !RUN_LOOP_ONLY.contains(n))
        .map(|(n, v)| (n.to_string(), v))
        .collect())
}

/// The settings of one group, by name: `"common"` (every domain's),
/// `"remote"`, or a domain's own (`"vision"`, `"text"`, `"audio"`).
#[pyfunction]
pub fn setting_names(group: &str) -> PyResult<Vec<&'static str>> {
    use keywords::field_names;
    Ok(match group {
        "common" => field_names::<ferrofeed_jobs::CommonSettings>(),
        "remote" => field_names::<ferrofeed_jobs::RemoteSettings>(),
        "vision" => field_names::<ferrofeed_jobs::vision::VisionOptions>(),
        "text" => field_names::<ferrofeed_jobs::text::TextOptions>(),
        "audio" => field_names::<ferrofeed_jobs::audio::AudioOptions>(),
        other => {
            return Err(PyValueError::new_err(format!(
                "group: {other:?} is not common, remote, vision, text or audio"
            )))
        }
    }
    .to_vec())
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
    /// Stops the epoch and joins its thread, with the GIL released for the
    /// wait: the epoch's workers may be inside a Python stage, waiting for
    /// it (a loader dropped or restarted mid-epoch would otherwise hang).
    fn finish_released(self) {
        Python::attach(|py| py.detach(move || self.finish()));
    }

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
pub(crate) enum Output {
    Torch,
    Numpy,
}

/// A ferrofeed pipeline for one domain, iterated an epoch at a time.
#[pyclass(module = "ferrofeed._ferrofeed")]
pub struct Loader {
    job: Arc<Job>,
    extras: Extras,
    /// What batches become.
    output: Output,
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

/// A keyword's Python value as the JSON value its setting reads: a bool,
/// number, text, path (as text), `None` (the default) or a list of them.
fn json_value(key: &str, v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    use serde_json::Value;
    if v.is_none() {
        return Ok(Value::Null);
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        if let Ok(n) = v.extract::<u64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = v.extract::<i64>() {
            return Ok(Value::from(n));
        }
        return Err(PyValueError::new_err(format!(
            "{key}: {} is out of range",
            v.repr()?
        )));
    }
    if v.is_instance_of::<PyFloat>() {
        let f: f64 = v.extract()?;
        return serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err(format!("{key}: {f} is not a finite number")));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Value::String(v.extract()?));
    }
    if v.hasattr("__fspath__")? {
        return Ok(Value::String(
            v.call_method0("__fspath__")?.extract::<String>()?,
        ));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> = v.try_iter()?.collect::<PyResult<_>>()?;
        return items
            .iter()
            .map(|x| json_value(key, x))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    Err(PyTypeError::new_err(format!(
        "{key}: expected a str, int, float, bool or path, got {}",
        v.get_type().name()?
    )))
}

/// A path given as `str` or `os.PathLike`.
fn path_value(v: &Bound<'_, PyAny>) -> PyResult<String> {
    if v.is_instance_of::<PyString>() {
        return v.extract();
    }
    if v.hasattr("__fspath__")? {
        return v.call_method0("__fspath__")?.extract();
    }
    Err(PyTypeError::new_err(format!(
        "path: expected a str or path, got {}",
        v.get_type().name()?
    )))
}

fn keyword_error(e: KeywordError) -> PyErr {
    match e {
        KeywordError::Domain(d) => {
            PyValueError::new_err(format!("domain: {d:?} is not one of vision, text, audio"))
        }
        // Text where a number goes (`batch_size="64"`) is a bad value, as
        // torch's DataLoader has it; anything else of the wrong type (a
        // list, text for a switch) a TypeError.
        KeywordError::Type { message, key }
            if message.starts_with("invalid type: string") && !message.contains("boolean") =>
        {
            PyValueError::new_err(format!("{key}: {message}"))
        }
        e @ (KeywordError::Unknown { .. } | KeywordError::Type { .. }) => {
            PyTypeError::new_err(e.to_string())
        }
        e @ KeywordError::Value { .. } => PyValueError::new_err(e.to_string()),
    }
}

pub(crate) fn job_error(e: JobError) -> PyErr {
    match e {
        JobError::Io { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(format!("{}: {source}", path.display()))
        }
        JobError::Usage(m) => PyValueError::new_err(as_keywords(&m)),
        e => PyValueError::new_err(e.to_string()),
    }
}

/// A message that names settings as flags (`--batch-size`) with their
/// keyword names instead (`batch_size`).
fn as_keywords(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("--") {
        let (before, flag) = rest.split_at(at);
        out.push_str(before);
        let body = &flag[2..];
        let end = body
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(body.len());
        if end == 0 || !body.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.push_str("--");
            rest = body;
            continue;
        }
        out.push_str(&body[..end].replace('-', "_"));
        rest = &body[end..];
    }
    out.push_str(rest);
    out
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

/// What [`parse_options`] read.
pub(crate) struct Parsed {
    pub settings: keywords::DomainSettings,
    pub output: Output,
    pub device: Option<String>,
}

/// What a composed pipeline (`ferrofeed.Pipeline`) adds to a loader.
#[derive(Default)]
pub(crate) struct Extras {
    /// Python exceptions by sample, for `SampleError.__cause__`.
    pub raised: Option<crate::compose::Raised>,
    /// `.map_batches` stages, run on the driver thread.
    pub batch_stages: Option<Arc<crate::compose::BatchStages>>,
    /// Each Python stage's figures, reset with each epoch.
    pub figures: Vec<Arc<crate::compose::GilFigures>>,
}

/// A loader's keywords, read: the domain's settings (with the loader's
/// own defaults: quiet, as many epochs as it is iterated), the output kind
/// and the device.
pub(crate) fn parse_options(
    py: Python<'_>,
    domain: &str,
    path: Option<Bound<'_, PyAny>>,
    options: Option<Bound<'_, PyDict>>,
) -> PyResult<Parsed> {
    if keywords::keywords(domain).is_none() {
        return Err(PyValueError::new_err(format!(
            "domain: {domain:?} is not one of vision, text, audio"
        )));
    }
    let path = match &path {
        None => None,
        Some(p) if p.is_none() => None,
        Some(p) => Some(path_value(p)?),
    };
    if let Some(p) = &path {
        if !p.contains("://") && !std::path::Path::new(p).exists() {
            return Err(PyFileNotFoundError::new_err(format!(
                "path: {p}: no such file or directory"
            )));
        }
    }
    let mut kw = serde_json::Map::new();
    let mut output = None;
    let mut device = None;
    let mut pin: Option<Pin> = None;
    if let Some(opts) = &options {
        for (k, v) in opts.iter() {
            let key: String = k
                .extract()
                .map_err(|_| PyTypeError::new_err("option names must be strings"))?;
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
                            PyTypeError::new_err("device: expected None, \"cuda\" or \"cuda:N\"")
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
                "pin_memory" => {
                    pin = Some(if v.is_instance_of::<PyBool>() {
                        if v.extract::<bool>()? {
                            Pin::Auto
                        } else {
                            Pin::Off
                        }
                    } else if v.is_instance_of::<PyString>() {
                        match v.extract::<String>()?.as_str() {
                            "auto" => Pin::Auto,
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
                k if RUN_LOOP_ONLY.contains(&k) => {
                    return Err(PyValueError::new_err(format!(
                        "{key}: a setting of the command's run loop; a loader runs one epoch per iteration (use loader.epoch(e)) and hands batches to you"
                    )));
                }
                _ => {
                    let value = json_value(&key, &v)?;
                    kw.insert(key, value);
                }
            }
        }
    }
    let mut settings =
        keywords::from_keywords(domain, path.map(Into::into), &kw).map_err(keyword_error)?;
    let common = settings.common_mut();
    if !kw.contains_key("quiet") {
        common.quiet = true;
    }
    // A loader runs as many epochs as it is iterated: unless told how
    // many are planned, the job is set up for more than one (vision's
    // scan index pays from the second epoch on).
    if !kw.contains_key("epochs") {
        common.epochs = u64::MAX;
    }
    if let Some(p) = pin {
        settings.set_pin(p);
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
    Ok(Parsed {
        settings,
        output,
        device,
    })
}

#[pymethods]
impl Loader {
    /// Builds the job for `domain` from `options` (the settings as
    /// keywords, plus `output`, `pin_memory` and `device`).
    #[new]
    #[pyo3(signature = (domain, path=None, options=None))]
    fn new(
        py: Python<'_>,
        domain: &str,
        path: Option<Bound<'_, PyAny>>,
        options: Option<Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let o = parse_options(py, domain, path, options)?;
        let settings = o.settings;
        let job = py.detach(move || settings.build()).map_err(job_error)?;
        Loader::with_job(py, job, o.output, o.device, Extras::default())
    }

    /// A `ferrofeed.Pipeline`'s loader: `spec` is what `Pipeline.build()`
    /// checked (source, settings, native stages, Python stages, collate).
    #[staticmethod]
    fn from_pipeline(py: Python<'_>, spec: Bound<'_, PyDict>) -> PyResult<Self> {
        crate::compose::build(py, &spec)
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
                let err = sample_error(py, &e);
                // A Python stage's own exception is the error's cause.
                let own = self
                    .extras
                    .raised
                    .as_ref()
                    .zip(e.index)
                    .and_then(|(r, i)| r.lock().ok()?.remove(&i));
                if let Some(cause) = own {
                    err.set_cause(py, Some(PyErr::from_value(cause.into_bound(py))));
                }
                Err(err)
            }
            Some(Msg::End(report, state, completed)) => {
                let epoch = run.epoch;
                if let Some(r) = self.run.take() {
                    r.finish_released();
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
            r.finish_released();
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
        // With the GIL released: the epoch's workers may be inside a Python
        // stage, waiting for it. They leave their stages before the
        // pipeline (and its threads) go.
        let run = self.run.take();
        let job = Arc::clone(&self.job);
        Python::attach(|py| {
            py.detach(move || {
                if let Some(r) = run {
                    r.finish();
                }
                job.pipeline.stop_and_wait(Duration::from_secs(10));
            })
        });
    }
}

impl Loader {
    /// A loader over `job`, its batches as `output` (on `device`), with
    /// what a composed pipeline adds.
    pub(crate) fn with_job(
        py: Python<'_>,
        job: Job,
        output: Output,
        device: Option<String>,
        extras: Extras,
    ) -> PyResult<Self> {
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
            extras,
            output,
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

    /// Starts epoch `epoch` (or the pending resume) on a driver thread,
    /// stopping any epoch in progress first.
    fn start(&mut self, epoch: u64) {
        if let Some(r) = self.run.take() {
            r.finish_released();
        }
        let resume = self.pending.take();
        let epoch = resume.as_ref().map_or(epoch, |s| s.epoch);
        let (tx, rx) = flume::bounded(1);
        let job = Arc::clone(&self.job);
        let stop = job.pipeline.stop_handle();
        let limit = job.common.limit_batches;
        for f in &self.extras.figures {
            f.reset();
        }
        let post = self.extras.batch_stages.clone();
        let thread = std::thread::Builder::new()
            .name("ferrofeed-epoch".into())
            .spawn(move || drive(&job, epoch, resume, limit, post.as_deref(), &tx))
            .ok();
        self.run = Some(Run {
            rx,
            stop,
            thread,
            epoch,
        });
    }

    fn to_python(&self, py: Python<'_>, mut batch: Batch) -> PyResult<Py<PyDict>> {
        if let Some(PyBatch(cols)) = batch.attached::<PyBatch>() {
            return self.python_batch(py, cols.bind(py), batch.indices());
        }
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

    /// A batch collated in Python: its columns, numpy arrays made torch
    /// tensors (sharing memory) when the output is torch, and `indices`.
    fn python_batch(
        &self,
        py: Python<'_>,
        cols: &Bound<'_, PyDict>,
        indices: &[u64],
    ) -> PyResult<Py<PyDict>> {
        let d = PyDict::new(py);
        let np = py.import("numpy")?;
        let ndarray = np.getattr("ndarray")?;
        let torch = (self.output == Output::Torch)
            .then(|| py.import("torch"))
            .transpose()?;
        for (k, v) in cols.iter() {
            let v = match &torch {
                Some(t) if v.is_instance(&ndarray)? => {
                    let t = t.call_method1(
                        "from_numpy",
                        (np.call_method1("ascontiguousarray", (v,))?,),
                    )?;
                    match &self.device {
                        Some(dev) => {
                            let kw = PyDict::new(py);
                            kw.set_item("non_blocking", true)?;
                            t.call_method("to", (dev.as_str(),), Some(&kw))?
                        }
                        None => t,
                    }
                }
                _ => v,
            };
            d.set_item(k, v)?;
        }
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let n = idx.len();
        let t = self
            .convert
            .bind(py)
            .call1((Bound::new(py, Array::new(Tensor::from_slice(&idx, &[n])))?,))?;
        d.set_item("indices", t)?;
        Ok(d.unbind())
    }

    /// After an epoch: the `save_state`, `report_json`, `report_html` and
    /// `trace` files, when those options were given.
    fn write_files(&self) -> PyResult<()> {
        match &self.report {
            Some(r) => self
                .job
                .write_outputs(r, &self.state)
                .map_err(|e| PyRuntimeError::new_err(e.to_string())),
            None => Ok(()),
        }
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
    post: Option<&BatchStages>,
    tx: &flume::Sender<Msg>,
) {
    job.pipeline.reset_metrics();
    // `limit_batches=0` delivers nothing.
    if limit == Some(0) {
        let state = resume.unwrap_or_else(|| job.pipeline.epoch_state_start(epoch));
        let _ = tx.send(Msg::End(
            Box::new(job.report(RunFigures::default())),
            Box::new(state),
            false,
        ));
        return;
    }
    let mut batches = 0u64;
    let mut gone = false;
    let this_epoch = resume.as_ref().map_or(epoch, |s| s.epoch);
    // A loader may always be iterated again: remote data reads ahead into
    // the next epoch.
    let done = job.run_epoch(epoch, resume.as_ref(), true, |item, it| {
        let item = match (item, post) {
            (Ok(mut b), Some(post)) => {
                let first = b.indices().first().copied();
                let number = b.position().0;
                match post.run(&mut b, this_epoch, number) {
                    Ok(()) => Ok(b),
                    Err(message) => Err(SampleError {
                        index: first,
                        path: None,
                        stage: "map_batches".into(),
                        kind: ErrorKind::Failed(message),
                        attempts: 1,
                    }),
                }
            }
            (item, _) => item,
        };
        let msg = match item {
            Ok(b) => Msg::Batch(Box::new(b), Box::new(it.state())),
            Err(e) => Msg::Error(Box::new(e), Box::new(it.state())),
        };
        if tx.send(msg).is_err() {
            gone = true;
            return Ok(ControlFlow::Break(()));
        }
        batches += 1;
        Ok(if limit.is_some_and(|l| batches >= l) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    });
    if gone {
        return;
    }
    let done = match done {
        Ok(d) => d,
        Err(e) => {
            let err = SampleError {
                index: None,
                path: None,
                stage: "resume".into(),
                kind: ErrorKind::Failed(e.to_string()),
                attempts: 1,
            };
            let state = resume.unwrap_or_else(|| job.pipeline.epoch_state_start(epoch));
            let _ = tx.send(Msg::Error(Box::new(err), Box::new(state)));
            return;
        }
    };
    let s = &done.summary;
    let report = job.report(RunFigures {
        samples: s.samples,
        batches: s.batches,
        seconds: s.seconds,
        skipped: s.skipped.clone(),
        stall_seconds: s.wait_seconds,
        epochs: vec![done.entry.clone()],
    });
    let _ = tx.send(Msg::End(
        Box::new(report),
        Box::new(done.state),
        s.completed,
    ));
}
