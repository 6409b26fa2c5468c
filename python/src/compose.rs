//! `ferrofeed.Pipeline` on the engine: Python stages (`.map`) as engine
//! stages on the worker threads, a Python source (`source.sequence`), a
//! Python collate, and the batch-level Python stages (`.map_batches`) run
//! on the epoch's driver thread in batch order. Native stages stay typed:
//! an ImageFolder pipeline is the vision job's own source, read and decode
//! (see `ferrofeed_jobs::vision::build_with`), and its samples cross into
//! Python at the first Python stage.
//!
//! ```text
//! image_folder ─ read ─ decode ─ [normalize] ─ map(f) ─ map(g) ─ collate ─▶ driver: map_batches(h) ─▶ batch
//! sequence(obj) ──────────────────────────── map(f) ─ collate ─▶ …
//! ```
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferrofeed_core::{
    Batch, BatchRows, BoxError, Collate, CollateError, Component, ComponentId, ComponentSet, Stage,
    StageCtx, Tensor,
};
use ferrofeed_stages::Label;
use ferrofeed_vision::{Image, NormalizedImage};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rand::RngCore;

use crate::array::Array;
use crate::dropin::attach_kept;

/// A sample in Python: its components as a dict, and what it is
/// estimated to weigh.
#[derive(Clone)]
pub struct PyRow(Arc<Py<PyDict>>, usize);

impl Component for PyRow {
    fn nbytes(&self) -> usize {
        self.1
    }
}

/// A batch collated in Python, attached to the engine's batch.
pub struct PyBatch(pub Py<PyDict>);

/// The Python exceptions raised for each sample (by dataset index), so the
/// `SampleError` the user gets has the original as its `__cause__`; and
/// keeping one (the drop-in's own).
pub(crate) use crate::dropin::{stash, Raised};

/// What a Python stage did: its calls and the time it held the GIL.
#[derive(Debug)]
pub struct GilFigures {
    pub name: String,
    nanos: AtomicU64,
    calls: AtomicU64,
}

impl GilFigures {
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(GilFigures {
            name: name.to_string(),
            nanos: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        })
    }

    fn add(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(ns, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// `{"calls": …, "gil_seconds": …}` so far.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "calls": self.calls.load(Ordering::Relaxed),
            "gil_seconds": self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        })
    }

    /// Starts counting again (a new epoch).
    pub fn reset(&self) {
        self.nanos.store(0, Ordering::Relaxed);
        self.calls.store(0, Ordering::Relaxed);
    }
}

/// What a sample dict weighs: its arrays' and bytes' sizes, 64 bytes for
/// anything else.
fn weigh(d: &Bound<'_, PyDict>) -> usize {
    d.values()
        .iter()
        .map(|v| {
            v.getattr("nbytes")
                .ok()
                .and_then(|n| n.extract::<usize>().ok())
                .or_else(|| {
                    v.len()
                        .ok()
                        .filter(|_| v.is_instance_of::<pyo3::types::PyBytes>())
                })
                .unwrap_or(64)
        })
        .sum::<usize>()
        + 64
}

/// Typed components that become a sample dict at the first Python stage.
pub trait IntoRow: ComponentSet {
    /// The sample as a dict (arrays as numpy arrays).
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>>;
}

/// A `[3, H, W]` numpy view of an HWC buffer.
fn chw<'py>(np: &Bound<'py, PyAny>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let py = np.py();
    np.call_method1("asarray", (Bound::new(py, Array::new(t))?,))?
        .call_method1("transpose", ((2, 0, 1),))
}

impl IntoRow for (Image, Label) {
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (img, label) = self;
        let (h, w) = (img.height as usize, img.width as usize);
        let d = PyDict::new(py);
        d.set_item("image", chw(np, Tensor::from_slice(&img.data, &[h, w, 3]))?)?;
        d.set_item("label", label.0)?;
        Ok(d)
    }
}

impl IntoRow for (NormalizedImage, Label) {
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (img, label) = self;
        let (h, w) = (img.height as usize, img.width as usize);
        let d = PyDict::new(py);
        let t = Tensor::from_slice(&img.data, &[3, h, w]);
        d.set_item(
            "image",
            np.call_method1("asarray", (Bound::new(py, Array::new(t))?,))?,
        )?;
        d.set_item("label", label.0)?;
        Ok(d)
    }
}

impl IntoRow for ferrofeed_text::Tokens {
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ids: Vec<i64> = self.0.iter().map(|&t| i64::from(t)).collect();
        let n = ids.len();
        let d = PyDict::new(py);
        let t = Tensor::from_slice(&ids, &[n]);
        d.set_item(
            "input_ids",
            np.call_method1("asarray", (Bound::new(py, Array::new(t))?,))?,
        )?;
        Ok(d)
    }
}

impl IntoRow for ferrofeed_audio::ChunkFeatures {
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let f = self.features;
        let shape = if self.channels > 1 {
            vec![self.channels, f.bins / self.channels.max(1), f.frames]
        } else {
            vec![f.bins, f.frames]
        };
        let d = PyDict::new(py);
        let t = Tensor::from_slice(&f.data, &shape);
        d.set_item(
            "features",
            np.call_method1("asarray", (Bound::new(py, Array::new(t))?,))?,
        )?;
        d.set_item("length", self.valid)?;
        d.set_item("chunk_start", self.start)?;
        Ok(d)
    }
}

impl IntoRow for PyRow {
    fn into_dict<'py>(
        self,
        py: Python<'py>,
        _np: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        // A copy, so a function that changes its argument in place cannot
        // change what a retry is given.
        self.0.bind(py).copy()
    }
}

/// `.map(fn)`: `fn(sample, rng) -> dict` on the engine's worker threads.
pub struct PyMap<I> {
    f: Py<PyAny>,
    name: String,
    raised: Raised,
    figures: Arc<GilFigures>,
    /// For the first Python stage: the component naming each sample
    /// (`path`, `key`), added to the dict it makes.
    sample_name: Option<ferrofeed_jobs::SampleName>,
    _in: std::marker::PhantomData<fn(I)>,
}

impl<I> PyMap<I> {
    pub fn new(f: Py<PyAny>, name: &str, raised: Raised, figures: Arc<GilFigures>) -> Self {
        PyMap {
            f,
            name: name.to_string(),
            raised,
            figures,
            sample_name: None,
            _in: std::marker::PhantomData,
        }
    }

    /// Adds each sample's name (its file or shard member) to its dict.
    pub fn named(mut self, name: Option<ferrofeed_jobs::SampleName>) -> Self {
        self.sample_name = name;
        self
    }
}

impl<I: IntoRow> Stage for PyMap<I> {
    type In = I;
    type Out = PyRow;
    fn process(&self, x: I, ctx: &StageCtx) -> Result<PyRow, BoxError> {
        // (seed, epoch, index, stage): the same numbers on any worker.
        let seed = ctx.rng().next_u64();
        let index = ctx.index();
        attach_kept(|py| {
            let held = Instant::now();
            let out = (|| -> PyResult<Result<PyRow, String>> {
                let np = py.import("numpy")?;
                let sample = x.into_dict(py, &np)?;
                if let Some(n) = &self.sample_name {
                    if let Some(v) = (n.of)(index) {
                        sample.set_item(n.component, v)?;
                    }
                }
                let rng = np.getattr("random")?.call_method1("default_rng", (seed,))?;
                let got = self.f.bind(py).call1((sample, rng))?;
                let Ok(d) = got.cast::<PyDict>() else {
                    return Ok(Err(format!(
                        "stage {:?} returned {}, not a dict of components",
                        self.name,
                        got.get_type().name()?
                    )));
                };
                let bytes = weigh(d);
                Ok(Ok(PyRow(Arc::new(d.clone().unbind()), bytes)))
            })();
            self.figures.add(held);
            match out {
                Ok(Ok(row)) => Ok(row),
                Ok(Err(msg)) => Err(msg.into()),
                Err(e) => Err(stash(&self.raised, index, py, e).into()),
            }
        })
    }
}

/// `source.sequence(obj)`: sample `i` is `obj[i]` (a dict's keys become
/// components, anything else the component `item`).
pub fn sequence_item(
    obj: &Py<PyAny>,
    i: u64,
    raised: &Raised,
    figures: &GilFigures,
) -> Result<PyRow, BoxError> {
    attach_kept(|py| {
        let held = Instant::now();
        let out = (|| -> PyResult<PyRow> {
            let v = obj.bind(py).get_item(i)?;
            let d = match v.cast::<PyDict>() {
                Ok(d) => d.copy()?,
                Err(_) => {
                    let d = PyDict::new(py);
                    d.set_item("item", v)?;
                    d
                }
            };
            let bytes = weigh(&d);
            Ok(PyRow(Arc::new(d.unbind()), bytes))
        })();
        figures.add(held);
        out.map_err(|e| stash(raised, i, py, e).into())
    })
}

/// `source.iterable(factory)`: shard `s` of `num_shards` is the iterator
/// `factory(s, num_shards)` returns; its items become samples as
/// `source.sequence`'s do. Shards are split across ranks and workers as tar
/// shards are.
pub struct PyIterable {
    pub factory: Arc<Py<PyAny>>,
    pub num_shards: usize,
    pub raised: Raised,
    pub figures: Arc<GilFigures>,
}

/// A sample dict from one item a Python source gave.
fn row_of(v: &Bound<'_, PyAny>) -> PyResult<PyRow> {
    let py = v.py();
    let d = match v.cast::<PyDict>() {
        Ok(d) => d.copy()?,
        Err(_) => {
            let d = PyDict::new(py);
            d.set_item("item", v)?;
            d
        }
    };
    let bytes = weigh(&d);
    Ok(PyRow(Arc::new(d.unbind()), bytes))
}

impl ferrofeed_core::IterableSource for PyIterable {
    type Output = PyRow;
    fn num_shards(&self) -> usize {
        self.num_shards
    }
    fn shard_key(&self, shard: usize) -> String {
        format!("shard {shard} of {}", self.num_shards)
    }
    fn open(&self, shard: usize) -> Result<ferrofeed_core::ShardIter<PyRow>, BoxError> {
        let index = ferrofeed_core::stream_index(shard, 0);
        let it = attach_kept(|py| -> Result<Py<PyAny>, BoxError> {
            let held = Instant::now();
            let out = self
                .factory
                .bind(py)
                .call1((shard, self.num_shards))
                .and_then(|r| r.try_iter().map(|i| i.into_any().unbind()));
            self.figures.add(held);
            out.map_err(|e| stash(&self.raised, index, py, e).into())
        })?;
        let (raised, figures) = (Arc::clone(&self.raised), Arc::clone(&self.figures));
        let mut n = 0u64;
        let mut done = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if done {
                return None;
            }
            let at = ferrofeed_core::stream_index(shard, n);
            n += 1;
            attach_kept(|py| {
                let held = Instant::now();
                let got = it.bind(py).call_method0("__next__");
                let out = match got {
                    Ok(v) => Some(row_of(&v).map_err(|e| stash(&raised, at, py, e).into())),
                    Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => {
                        done = true;
                        None
                    }
                    Err(e) => {
                        // An iterator that raised is spent.
                        done = true;
                        Some(Err(stash(&raised, at, py, e).into()))
                    }
                };
                figures.add(held);
                out
            })
        })))
    }
}

/// The collate of a pipeline with Python stages: `collate(samples) ->
/// dict` (the package's default, or the user's `.collate(fn)`).
pub struct PyCollate {
    pub f: Py<PyAny>,
    pub raised: Raised,
    pub figures: Arc<GilFigures>,
}

impl Collate for PyCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<PyRow>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let items = rows.column::<PyRow>().ok_or_else(|| CollateError {
            sample: None,
            message: "no samples to collate".into(),
        })?;
        let first = rows.indices().first().copied().unwrap_or(0);
        attach_kept(|py| {
            let held = Instant::now();
            let out = PyList::new(py, items.iter().map(|r| r.0.bind(py)))
                .and_then(|l| self.f.bind(py).call1((l,)));
            self.figures.add(held);
            match out {
                Ok(b) => match b.cast::<PyDict>() {
                    Ok(d) => {
                        let mut batch = Batch::new(rows.indices().to_vec());
                        batch.attach(PyBatch(d.clone().unbind()));
                        Ok(batch)
                    }
                    Err(_) => Err(CollateError {
                        sample: None,
                        message: format!(
                            "collate returned {}, not a dict of columns",
                            b.get_type()
                                .name()
                                .map_or_else(|_| "?".into(), |n| n.to_string())
                        ),
                    }),
                },
                Err(e) => {
                    // The Python side names the sample at fault (one of
                    // another shape, a component another sample lacks).
                    let blamed = crate::dropin::blamed(py, &e, items.len());
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

/// `.map_batches(fn)` stages, run on the driver thread on each batch in
/// order: `fn(batch, rng) -> dict`, `rng` from (seed, epoch, batch number,
/// stage).
pub struct BatchStages {
    pub stages: Vec<(String, Py<PyAny>, Arc<GilFigures>)>,
    pub seed: u64,
    pub raised: Raised,
}

/// A stage name as a number for seeds (FNV-1a).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl BatchStages {
    /// Runs every stage on `batch` (the `number`-th of epoch `epoch`).
    pub fn run(&self, batch: &mut Batch, epoch: u64, number: u64) -> Result<(), String> {
        let Some(PyBatch(d)) = batch.attached::<PyBatch>() else {
            return Ok(());
        };
        let out = Python::attach(|py| -> PyResult<Result<Py<PyDict>, String>> {
            let np = py.import("numpy")?;
            let mut cur = d.bind(py).clone();
            for (name, f, figures) in &self.stages {
                let held = Instant::now();
                let seed =
                    ferrofeed_core::rng::derive_seed(&[self.seed, epoch, number, name_hash(name)]);
                let rng = np.getattr("random")?.call_method1("default_rng", (seed,))?;
                let got = f.bind(py).call1((cur, rng));
                figures.add(held);
                let got = got?;
                match got.cast::<PyDict>() {
                    Ok(next) => cur = next.clone(),
                    Err(_) => {
                        return Ok(Err(format!(
                            "stage {name:?} returned {}, not a dict of columns",
                            got.get_type().name()?
                        )))
                    }
                }
            }
            Ok(Ok(cur.unbind()))
        });
        match out {
            Ok(Ok(d)) => {
                batch.attach(PyBatch(d));
                Ok(())
            }
            Ok(Err(m)) => Err(m),
            Err(e) => {
                // Kept under the batch's first sample, for the error's cause.
                let first = batch.indices().first().copied().unwrap_or(0);
                Err(Python::attach(|py| stash(&self.raised, first, py, e)))
            }
        }
    }
}

/// A transform given in full: `("train", size, (scale_lo, scale_hi),
/// (ratio_lo, ratio_hi), flip_p)` or `("eval", resize, size)` with
/// `resize` a side or `(height, width)`.
fn transform_of(t: &Bound<'_, PyAny>) -> PyResult<ferrofeed_vision::Transform> {
    use ferrofeed_vision::{ResizeTo, Transform};
    let kind: String = t.get_item(0)?.extract()?;
    Ok(match kind.as_str() {
        "train" => {
            let (_, size, scale, ratio, flip_p): (String, u32, (f64, f64), (f64, f64), f64) =
                t.extract()?;
            Transform::Train {
                size,
                scale,
                ratio,
                flip_p,
            }
        }
        "eval" => {
            let resize = t.get_item(1)?;
            let resize = match resize.extract::<u32>() {
                Ok(side) => ResizeTo::Shorter(side),
                Err(_) => {
                    let (height, width): (u32, u32) = resize.extract()?;
                    ResizeTo::Exact { height, width }
                }
            };
            Transform::Eval {
                resize,
                size: t.get_item(2)?.extract()?,
            }
        }
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "transform: {other:?} is not train or eval"
            )))
        }
    })
}

/// A spec's Python stages and collate, each with its figures (added to
/// `figures`, for the report).
#[allow(clippy::type_complexity)]
fn python_parts(
    maps: Vec<(String, Py<PyAny>)>,
    collate: Py<PyAny>,
    raised: &Raised,
    figures: &mut Vec<Arc<GilFigures>>,
) -> (Vec<(String, Py<PyAny>, Arc<GilFigures>)>, PyCollate) {
    let stages: Vec<(String, Py<PyAny>, Arc<GilFigures>)> = maps
        .into_iter()
        .map(|(n, f)| {
            let fig = GilFigures::new(&n);
            (n, f, fig)
        })
        .collect();
    figures.extend(stages.iter().map(|(_, _, f)| Arc::clone(f)));
    let collate_figures = GilFigures::new("collate");
    figures.push(Arc::clone(&collate_figures));
    let collate = PyCollate {
        f: collate,
        raised: Arc::clone(raised),
        figures: collate_figures,
    };
    (stages, collate)
}

/// The Python stages `maps` after a typed prefix whose components are `I`
/// (the first stage turns them into a dict), then the Python collate.
fn python_tail<I: IntoRow>(
    mut b: ferrofeed_core::PipelineBuilder,
    opts: ferrofeed_core::StageOptions,
    maps: Vec<(String, Py<PyAny>, Arc<GilFigures>)>,
    collate: PyCollate,
    raised: &Raised,
    sample_name: Option<ferrofeed_jobs::SampleName>,
) -> Result<ferrofeed_core::PipelineBuilder, ferrofeed_jobs::JobError> {
    let mut maps = maps.into_iter();
    let (name, f, fig) = match maps.next() {
        Some(m) => m,
        None => {
            let same = Python::attach(|py| -> PyResult<Py<PyAny>> {
                Ok(py.eval(c"lambda sample, rng: sample", None, None)?.unbind())
            })
            .map_err(|e| ferrofeed_jobs::JobError::Usage(e.to_string()))?;
            ("to_python".to_string(), same, GilFigures::new("to_python"))
        }
    };
    b = b.stage_with(
        &name,
        opts,
        PyMap::<I>::new(f, &name, Arc::clone(raised), fig).named(sample_name),
    );
    for (name, f, fig) in maps {
        b = b.stage_with(
            &name,
            opts,
            PyMap::<PyRow>::new(f, &name, Arc::clone(raised), fig),
        );
    }
    Ok(b.collate(collate))
}

/// Reads a `Pipeline.build()` spec and builds its loader.
///
/// `spec`: `source` (`("image_folder", path)` or `("sequence", obj)`),
/// `settings` (the pipeline's keywords), `stage_options` (the native
/// stages' keywords: `decode_image`'s, `tokenize`'s, or `None`), `normalize` (`(mean, std)` or `None`), `maps` and
/// `batch_maps` (lists of `(name, fn)`), `collate` (a function, or `None`
/// for the native collate) and `seed`.
pub fn build(py: Python<'_>, spec: &Bound<'_, PyDict>) -> PyResult<crate::loader::Loader> {
    use crate::loader::{parse_options, Extras, Loader};
    use ferrofeed_jobs::keywords::DomainSettings;
    use pyo3::exceptions::PyValueError;

    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        spec.get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("pipeline spec: no {k:?}")))
    };
    let (kind, what): (String, Bound<'_, PyAny>) = get("source")?.extract()?;
    let settings = get("settings")?.cast_into::<PyDict>()?;
    let stage_options = get("stage_options")?;
    let normalize: Option<([f32; 3], [f32; 3])> = get("normalize")?.extract()?;
    let maps: Vec<(String, Py<PyAny>)> = get("maps")?.extract()?;
    let batch_maps: Vec<(String, Py<PyAny>)> = get("batch_maps")?.extract()?;
    let collate: Option<Py<PyAny>> = get("collate")?.extract()?;
    let transform = match spec.get_item("transform")? {
        Some(t) if !t.is_none() => Some(transform_of(&t)?),
        _ => None,
    };
    // `Some(false)`: decode without EXIF orientation (as PIL's loader).
    let exif: Option<bool> = match spec.get_item("exif")? {
        Some(v) if !v.is_none() => Some(v.extract()?),
        _ => None,
    };
    let raised: Raised = Arc::default();
    let mut figures: Vec<Arc<GilFigures>> = Vec::new();

    let opts = settings.copy()?;
    if !stage_options.is_none() {
        for (k, v) in stage_options.cast::<PyDict>()?.iter() {
            opts.set_item(k, v)?;
        }
    }
    let (job, output, device) = match kind.as_str() {
        "image_folder" | "files" | "shards" => {
            // files: (root, classes, [(path, label)]), read as listed.
            let (path, files) = if kind == "files" {
                let (root, classes, list): (String, Vec<String>, Vec<(std::path::PathBuf, i64)>) =
                    what.extract()?;
                let root_obj = pyo3::types::PyString::new(py, &root).into_any();
                (
                    root_obj,
                    Some(ferrofeed_stages::ImageFolder::from_files(
                        root, classes, list,
                    )),
                )
            } else {
                (what, None)
            };
            let parsed = parse_options(py, "vision", Some(path), Some(opts))?;
            let DomainSettings::Vision(vs) = parsed.settings else {
                return Err(PyValueError::new_err("image_folder: not a vision source"));
            };
            let stage_opts = ferrofeed_core::StageOptions::new().workers(vs.common.workers);
            let parts = collate.map(|c| python_parts(maps, c, &raised, &mut figures));
            let r = Arc::clone(&raised);
            let tail: ferrofeed_jobs::vision::Tail = Box::new(move |b, pool, sample_name| {
                let normalized = normalize.is_some();
                let b = match normalize {
                    Some((mean, std)) => b.stage_with(
                        "normalize",
                        stage_opts,
                        ferrofeed_vision::Normalize { mean, std },
                    ),
                    None => b,
                };
                let Some((stages, collate)) = parts else {
                    let c = ferrofeed_core::StackCollate::new().buffers(pool);
                    let c = if normalized {
                        c.column::<NormalizedImage>("images")
                    } else {
                        c.column::<Image>("images")
                    };
                    return Ok(b.collate(c.column::<Label>("labels")));
                };
                let name = Some(sample_name);
                if normalized {
                    python_tail::<(NormalizedImage, Label)>(b, stage_opts, stages, collate, &r, name)
                } else {
                    python_tail::<(Image, Label)>(b, stage_opts, stages, collate, &r, name)
                }
            });
            let custom = ferrofeed_jobs::vision::Custom {
                files,
                transform,
                tail: Some(tail),
                decode: exif.map(|apply_exif| ferrofeed_vision::DecodeOptions {
                    apply_exif,
                    ..Default::default()
                }),
            };
            let job = py
                .detach(move || ferrofeed_jobs::vision::build_with(vs, custom))
                .map_err(crate::loader::job_error)?;
            (job, parsed.output, parsed.device)
        }
        "text_lines" => {
            let parsed = parse_options(py, "text", Some(what), Some(opts))?;
            let DomainSettings::Text(ts) = parsed.settings else {
                return Err(PyValueError::new_err("text_lines: not a text source"));
            };
            let stage_opts = ferrofeed_core::StageOptions::new().workers(ts.common.workers);
            let tail: Option<ferrofeed_jobs::text::Tail> = collate.map(|c| {
                let (stages, c) = python_parts(maps, c, &raised, &mut figures);
                let r = Arc::clone(&raised);
                Box::new(move |b| {
                    python_tail::<ferrofeed_text::Tokens>(b, stage_opts, stages, c, &r, None)
                }) as ferrofeed_jobs::text::Tail
            });
            let job = py
                .detach(move || ferrofeed_jobs::text::build_with(ts, tail))
                .map_err(crate::loader::job_error)?;
            (job, parsed.output, parsed.device)
        }
        "audio" => {
            let parsed = parse_options(py, "audio", Some(what), Some(opts))?;
            let DomainSettings::Audio(aset) = parsed.settings else {
                return Err(PyValueError::new_err("audio: not an audio source"));
            };
            let stage_opts = ferrofeed_core::StageOptions::new().workers(aset.common.workers);
            let tail: Option<ferrofeed_jobs::audio::Tail> = collate.map(|c| {
                let (stages, c) = python_parts(maps, c, &raised, &mut figures);
                let r = Arc::clone(&raised);
                Box::new(move |b, name| {
                    python_tail::<ferrofeed_audio::ChunkFeatures>(
                        b,
                        stage_opts,
                        stages,
                        c,
                        &r,
                        Some(name),
                    )
                }) as ferrofeed_jobs::audio::Tail
            });
            let job = py
                .detach(move || ferrofeed_jobs::audio::build_with(aset, tail))
                .map_err(crate::loader::job_error)?;
            (job, parsed.output, parsed.device)
        }
        "sequence" | "iterable" => {
            let parsed = parse_options(py, "vision", None, Some(opts))?;
            let common = parsed.settings.common().clone();
            let source_figures = GilFigures::new("source");
            figures.push(Arc::clone(&source_figures));
            let r = Arc::clone(&raised);
            let mut b = if kind == "sequence" {
                let obj: Py<PyAny> = what.unbind();
                let len = obj.bind(py).len()? as u64;
                let source = ferrofeed_core::FnSource::new(len, move |i: u64| {
                    sequence_item(&obj, i, &r, &source_figures)
                });
                ferrofeed_core::Pipeline::builder(source)
            } else {
                let (factory, num_shards): (Py<PyAny>, usize) = what.extract()?;
                ferrofeed_core::Pipeline::builder_iterable(PyIterable {
                    factory: Arc::new(factory),
                    num_shards,
                    raised: r,
                    figures: source_figures,
                })
            };
            let stage_opts = ferrofeed_core::StageOptions::new().workers(common.workers);
            let collate = collate.ok_or_else(|| {
                PyValueError::new_err(
                    "sequence(): its samples are Python objects and need a Python collate",
                )
            })?;
            let (stages, collate) = python_parts(maps, collate, &raised, &mut figures);
            for (name, f, fig) in stages {
                b = b.stage_with(
                    &name,
                    stage_opts,
                    PyMap::<PyRow>::new(f, &name, Arc::clone(&raised), fig),
                );
            }
            let b = b.batch_size(common.batch_size).collate(collate);
            let resources = ferrofeed_core::Resources::detect();
            let cpus = resources.workers();
            let build = move || -> Result<ferrofeed_jobs::Job, ferrofeed_jobs::JobError> {
                common.check()?;
                common.check_outputs()?;
                let b = common.configure(b, &resources, cpus)?;
                let pipeline = b
                    .build()
                    .map_err(|e| ferrofeed_jobs::JobError::Usage(e.to_string()))?;
                Ok(ferrofeed_jobs::Job::new(
                    "pipeline",
                    pipeline,
                    common,
                    || Ok(Vec::new()),
                    resources,
                ))
            };
            let job = py.detach(build).map_err(crate::loader::job_error)?;
            (job, parsed.output, parsed.device)
        }
        other => return Err(PyValueError::new_err(format!(
            "source: {other:?} is not image_folder, files, shards, text_lines, audio, sequence or iterable"
        ))),
    };
    let seed = job.common.seed;
    let batch_stages = if batch_maps.is_empty() {
        None
    } else {
        let stages: Vec<(String, Py<PyAny>, Arc<GilFigures>)> = batch_maps
            .into_iter()
            .map(|(n, f)| {
                let fig = GilFigures::new(&n);
                (n, f, fig)
            })
            .collect();
        figures.extend(stages.iter().map(|(_, _, f)| Arc::clone(f)));
        Some(Arc::new(BatchStages {
            stages,
            seed,
            raised: Arc::clone(&raised),
        }))
    };
    let mut job = job;
    // The report names each Python stage with the time it held the GIL.
    let shown: Vec<Arc<GilFigures>> = figures.clone();
    let domain_extra = std::mem::replace(&mut job.extra, Box::new(|_| Default::default()));
    job.extra = Box::new(move |seconds| {
        let mut m = domain_extra(seconds);
        let stages: serde_json::Map<String, serde_json::Value> =
            shown.iter().map(|f| (f.name.clone(), f.json())).collect();
        m.insert("python_stages".into(), serde_json::Value::Object(stages));
        m
    });
    Loader::with_job(
        py,
        job,
        output,
        device,
        Extras {
            raised: Some(raised),
            batch_stages,
            figures,
        },
    )
}
