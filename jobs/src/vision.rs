//! `ferrofeed vision`, `inspect vision` and `make-dataset vision`.
//!
//! ```text
//! ferrofeed vision DIR --transform train --size 224 --batch-size 64
//! ```
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrofeed_core::{BoxError, Parallelism, Pipeline, PipelineBuilder, Source, StageOptions};
use ferrofeed_stages::{ImageFolder, ReadFile, ShardOpen, StreamedShards, TarShards};
use ferrofeed_vision::jpeg::ScanIndex;
use ferrofeed_vision::ImageCache;
use ferrofeed_vision::{synth, DecodeOptions, DecodeTransform, Image, Transform, IMAGE_EXTENSIONS};
use serde_json::json;

use ferrofeed_stages::remote::{Download, Remote, RemoteFiles, View};

use crate::job::{IndexEntry, Job, JobError};
use crate::remote::{self, RemoteSettings};
use crate::{CommonSettings, Pin};

/// What the vision job does after decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum TransformArg {
    /// Decode only (all images must share one size).
    None,
    /// Resize the shorter side to --resize, center-crop --size.
    Eval,
    /// RandomResizedCrop(--size) + horizontal flip.
    Train,
}

/// The vision job's own settings (decode, transforms, caches).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct VisionOptions {
    /// What to do after decoding (default: train; `inspect`: eval).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub transform: Option<TransformArg>,
    /// Output side.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = VisionOptions::default().size))]
    pub size: u32,
    /// Eval resize: N sets the shorter side (torchvision `Resize(N)`), HxW
    /// the exact height and width (`Resize((H, W))`).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = VisionOptions::default().resize, value_name = "N|HxW"))]
    #[serde(deserialize_with = "crate::de::resize")]
    pub resize: ferrofeed_vision::ResizeTo,
    /// Refuse images whose header claims more pixels.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = VisionOptions::default().max_pixels))]
    pub max_pixels: u64,
    /// WebDataset shards read as a stream: each epoch the shards in a
    /// seeded order, each opened when a worker reaches it (a remote shard
    /// downloaded in that order, decoding starting with the first shard
    /// instead of after the last), samples mixed through a shuffle buffer
    /// of `--shuffle-buffer` samples instead of a global shuffle.
    #[cfg_attr(feature = "cli", arg(long))]
    pub stream_shards: bool,
    /// With `--stream-shards`: samples mixed at once (0: a quarter of the
    /// byte budget over 256 KiB, at most 1,024).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = VisionOptions::default().shuffle_buffer, value_name = "N"))]
    pub shuffle_buffer: usize,
    /// Keep decoded images in an LRU cache of this many bytes (e.g. 2GiB), so
    /// later epochs skip decoding.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse_size, value_name = "SIZE"))]
    #[serde(deserialize_with = "crate::de::opt_size")]
    pub cache_bytes: Option<usize>,
    /// Keep decoded images on disk in this folder, keyed by the encoded
    /// bytes and the decode settings (for datasets larger than RAM): later
    /// epochs and runs read pixels instead of decoding. Atomic writes,
    /// checked entries, shared by processes; `--cache-bytes` sits in front.
    /// A decoded image weighs ~9× its JPEG: this pays where the disk reads
    /// faster than the decoders make pixels (NVMe, costly decodes).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub image_cache: Option<PathBuf>,
    /// Cap on the image cache folder (bytes, or with a unit: 16GiB); least
    /// recently used entries go.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse_size, value_name = "SIZE", default_value_t = VisionOptions::default().image_cache_size))]
    #[serde(deserialize_with = "crate::de::size")]
    pub image_cache_size: usize,
    /// Byte cap of the scan index (where each JPEG's MCUs start, ~9 KB per
    /// 500×375 image), which from the second epoch on lets a crop decode
    /// only its own part of the image; 0 turns it off. Default: 1/16 of the
    /// memory the process may use (cgroup limits included), at most 1GiB.
    /// Not used with --epochs 1.
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::settings::size_or_zero, value_name = "SIZE"))]
    #[serde(deserialize_with = "crate::de::opt_size_or_zero")]
    pub scan_index: Option<usize>,
    /// Decode JPEGs with libjpeg's fast integer IDCT and box chroma
    /// upsampling (tf.image's `INTEGER_FAST`, without fancy upsampling):
    /// a few % more images/s, pixels a few levels from the default's.
    #[cfg_attr(feature = "cli", arg(long))]
    pub fast_decode: bool,
    /// Batch buffers in page-locked memory: `auto` when a CUDA device is
    /// there (else host memory, said once), `strict` (or an error), `off`.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value_t = VisionOptions::default().pin))]
    pub pin: Pin,
}

impl Default for VisionOptions {
    fn default() -> Self {
        VisionOptions {
            transform: None,
            size: 224,
            resize: ferrofeed_vision::ResizeTo::Shorter(256),
            max_pixels: 100_000_000,
            stream_shards: false,
            shuffle_buffer: 0,
            cache_bytes: None,
            image_cache: None,
            image_cache_size: 16 << 30,
            scan_index: None,
            fast_decode: false,
            pin: Pin::Auto,
        }
    }
}

impl crate::settings::InspectOptions for VisionOptions {}

/// Everything the vision job is built from: the dataset, the vision
/// settings and the shared ones. `Default` is a bare `ferrofeed`'s run:
/// the embedded dataset, train transform.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct VisionSettings {
    /// ImageFolder root or folder of WebDataset shards; default: the embedded dataset.
    pub path: Option<PathBuf>,
    /// The vision settings.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub vision: VisionOptions,
    /// The settings every domain shares.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: CommonSettings,
}

#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct InspectArgs {
    /// ImageFolder root or folder of shards; default: the embedded dataset.
    pub path: Option<PathBuf>,
    /// Dataset index of the sample.
    #[cfg_attr(feature = "cli", arg(long))]
    pub index: u64,
    /// Write a PNG of the image after each stage into this folder.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub out: Option<PathBuf>,
    /// Epoch (random transforms depend on it).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub epoch: u64,
    /// Seed.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    #[cfg_attr(feature = "cli", command(flatten))]
    pub vision: VisionOptions,
}

/// Size of the embedded default dataset.
pub const DEFAULT_COUNT: u64 = 2048;

/// The embedded default dataset, generated on first use.
fn default_dataset(quiet: bool) -> Result<PathBuf, JobError> {
    let dir = crate::cache_dir().join(format!("vision-synth-v3-seed0-n{DEFAULT_COUNT}"));
    if !dir.is_dir() {
        if !quiet {
            eprintln!(
                "generating the default vision dataset ({DEFAULT_COUNT} JPEGs) into {} …",
                dir.display()
            );
        }
        synth::write_dataset(&dir, DEFAULT_COUNT, 0, ferrofeed_core::available_cpus())
            .map_err(JobError::io(&dir))?;
    }
    Ok(dir)
}

#[derive(Clone)]
enum Dataset {
    Folder(ImageFolder),
    Shards(Arc<TarShards>),
    /// An ImageFolder tree under a URL, downloaded as the epoch reads it.
    Remote(RemoteFiles),
    /// WebDataset shards read shard by shard (`--stream-shards`); when
    /// remote, the object index of each shard, for the read-ahead.
    Streamed(StreamedShards, Option<Vec<usize>>),
}

/// A dataset and, when it is remote, its downloads and the local links its
/// shards are read through.
struct Opened {
    ds: Dataset,
    remote: Option<Arc<Remote>>,
    view: Option<Arc<View>>,
}

fn open_dataset(path: &Path, r: &RemoteSettings, stream: bool) -> Result<Opened, JobError> {
    if remote::is_url(path) {
        return open_remote(path, r, stream);
    }
    if stream {
        return Ok(Opened {
            ds: open_streamed(path)?,
            remote: None,
            view: None,
        });
    }
    Ok(Opened {
        ds: open_local(path)?,
        remote: None,
        view: None,
    })
}

/// Local WebDataset shards for `--stream-shards`: a `.tar` file, or the
/// `.tar` files of a folder in name order.
fn open_streamed(path: &Path) -> Result<Dataset, JobError> {
    let tars: Vec<PathBuf> = if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        let entries = std::fs::read_dir(path)
            .map_err(|e| JobError::Usage(format!("{}: {e}", path.display())))?;
        let mut t: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tar"))
            .collect();
        t.sort();
        t
    };
    if tars.is_empty()
        || !tars
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "tar"))
    {
        return Err(JobError::Usage(format!(
            "{}: --stream-shards reads WebDataset shards (.tar files), and there are none",
            path.display()
        )));
    }
    Ok(Dataset::Streamed(
        StreamedShards::local(tars, IMAGE_EXTENSIONS),
        None,
    ))
}

/// WebDataset shards (every `.tar` object) are downloaded in parallel and
/// indexed; otherwise the URL is an ImageFolder tree, `<class>/<file>`
/// under the prefix, read object by object.
fn open_remote(path: &Path, r: &RemoteSettings, stream: bool) -> Result<Opened, JobError> {
    let remote = remote::open(path, r)?;
    let url = remote.url().text.clone();
    let tars = remote::with_extension(&remote, &["tar"]);
    if stream {
        if tars.is_empty() {
            return Err(JobError::Usage(format!(
                "{url}: --stream-shards reads WebDataset shards (.tar objects), and there are none"
            )));
        }
        let names = tars
            .iter()
            .map(|&i| remote.objects()[i].url.clone())
            .collect();
        let (r, objects) = (Arc::clone(&remote), tars.clone());
        let open: ShardOpen = Arc::new(move |s| {
            let i = *objects
                .get(s)
                .ok_or_else(|| BoxError::from(format!("no shard {s}")))?;
            Ok(r.open_stream(i)?)
        });
        return Ok(Opened {
            ds: Dataset::Streamed(
                StreamedShards::new(names, open, IMAGE_EXTENSIONS),
                Some(tars),
            ),
            remote: Some(remote),
            view: None,
        });
    }
    if !tars.is_empty() {
        let view = remote::materialize(&remote, &tars, "shards")?;
        let names = tars
            .iter()
            .map(|&i| remote.objects()[i].url.clone())
            .collect();
        let t = TarShards::open(view.paths(), IMAGE_EXTENSIONS)
            .map_err(|e| JobError::Usage(view.to_url(&e.to_string())))?
            .with_names(names);
        if t.is_empty() {
            return Err(JobError::Usage(format!(
                "{url}: the shards hold no samples"
            )));
        }
        return Ok(Opened {
            ds: Dataset::Shards(Arc::new(t)),
            remote: Some(remote),
            view: Some(view),
        });
    }
    let mut by_class: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, o) in remote.objects().iter().enumerate() {
        let rel = remote.relative_key(&o.key);
        let Some((class, _)) = rel.split_once('/') else {
            continue;
        };
        let ok = rel
            .rsplit_once('.')
            .is_some_and(|(_, x)| IMAGE_EXTENSIONS.iter().any(|e| e.eq_ignore_ascii_case(x)));
        if !class.starts_with('.') {
            let files = by_class.entry(class.to_string()).or_default();
            if ok {
                files.push(i);
            }
        }
    }
    if by_class.is_empty() {
        return Err(JobError::Usage(format!(
            "{url}: no class folders (expected <class>/<file> under the prefix, or .tar shards)"
        )));
    }
    let items: Vec<(usize, i64)> = by_class
        .values()
        .enumerate()
        .flat_map(|(label, files)| files.iter().map(move |&i| (i, label as i64)))
        .collect();
    if items.is_empty() {
        return Err(JobError::Usage(format!(
            "{url}: no files with extension {} under the class folders",
            IMAGE_EXTENSIONS.join("/")
        )));
    }
    Ok(Opened {
        ds: Dataset::Remote(RemoteFiles::new(Arc::clone(&remote), items)),
        remote: Some(remote),
        view: None,
    })
}

fn open_local(path: &Path) -> Result<Dataset, JobError> {
    if path.is_file() && path.extension().is_some_and(|e| e == "tar") {
        let shards = vec![path.to_path_buf()];
        let t = TarShards::open(&shards, IMAGE_EXTENSIONS)
            .map_err(|e| JobError::Usage(e.to_string()))?;
        return Ok(Dataset::Shards(Arc::new(t)));
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| JobError::Usage(format!("{}: {e}", path.display())))?;
    let mut tars: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tar"))
        .collect();
    if !tars.is_empty() {
        tars.sort();
        let t =
            TarShards::open(&tars, IMAGE_EXTENSIONS).map_err(|e| JobError::Usage(e.to_string()))?;
        if t.is_empty() {
            return Err(JobError::Usage(format!(
                "{}: the shards hold no samples",
                path.display()
            )));
        }
        return Ok(Dataset::Shards(Arc::new(t)));
    }
    ImageFolder::scan(path, IMAGE_EXTENSIONS)
        .map(Dataset::Folder)
        .map_err(|e| JobError::Usage(e.to_string()))
}

fn transform_of(opts: &VisionOptions, default: TransformArg) -> Result<Transform, JobError> {
    let t = match opts.transform.unwrap_or(default) {
        TransformArg::None => Transform::None,
        TransformArg::Eval => Transform::Eval {
            resize: opts.resize,
            size: opts.size,
        },
        TransformArg::Train => Transform::train(opts.size),
    };
    t.validate().map_err(JobError::Usage)?;
    if !matches!(t, Transform::None) {
        // The output size is the user's own number: a huge one is refused
        // like a decompression bomb, not met with an allocation.
        let px = u64::from(opts.size).pow(2);
        if px > opts.max_pixels {
            return Err(JobError::Usage(format!(
                "--size {} makes {px}-pixel outputs, over --max-pixels {}",
                opts.size, opts.max_pixels
            )));
        }
    }
    Ok(t)
}

/// The decoder settings the vision flags ask for.
/// The on-disk image cache the flags ask for.
fn image_cache(
    opts: &VisionOptions,
) -> Result<Option<Arc<ferrofeed_vision::ImageDiskCache>>, JobError> {
    match &opts.image_cache {
        None => Ok(None),
        Some(dir) => ferrofeed_vision::ImageDiskCache::open(dir, opts.image_cache_size as u64)
            .map(Some)
            .map_err(|e| JobError::Usage(format!("--image-cache {}: {e}", dir.display()))),
    }
}

fn decode_options(opts: &VisionOptions) -> DecodeOptions {
    DecodeOptions {
        max_pixels: opts.max_pixels,
        fast: opts.fast_decode,
        ..Default::default()
    }
}

/// Refuses a batch of `--size` outputs that could not fit in this
/// machine's memory (one batch is built per worker, and the consumer holds
/// more).
fn check_batch_bytes(
    t: &Transform,
    size: u32,
    batch: usize,
    memory_bytes: u64,
) -> Result<(), JobError> {
    if matches!(t, Transform::None) {
        return Ok(());
    }
    let bytes = (batch as u64).saturating_mul(3 * u64::from(size).pow(2));
    if bytes > memory_bytes / 4 {
        return Err(JobError::Usage(format!(
            "a batch of {batch} images at --size {size} is {} MiB, over a quarter of the {} MiB of memory \
             this process may use: lower --size or --batch-size",
            bytes >> 20,
            memory_bytes >> 20
        )));
    }
    Ok(())
}

fn builder_for(ds: &Dataset, stage: DecodeTransform, workers: Parallelism) -> PipelineBuilder {
    let opts = StageOptions::new().workers(workers);
    match ds {
        Dataset::Folder(f) => Pipeline::builder(f.clone().into_source())
            .stage_with("read", opts, ReadFile::default())
            .stage_with("decode", opts, stage),
        Dataset::Shards(t) => Pipeline::builder(Arc::clone(t)).stage_with("decode", opts, stage),
        Dataset::Streamed(t, _) => {
            Pipeline::builder_iterable(t.clone()).stage_with("decode", opts, stage)
        }
        Dataset::Remote(f) => Pipeline::builder(f.clone())
            .stage_with(
                "download",
                opts,
                Download {
                    remote: Arc::clone(f.remote()),
                },
            )
            .stage_with("decode", opts, stage),
    }
}

fn index_entries(ds: &Dataset) -> Result<Vec<IndexEntry>, JobError> {
    Ok(match ds {
        Dataset::Folder(f) => f
            .files()
            .iter()
            .enumerate()
            .map(|(i, (p, l))| IndexEntry {
                index: i as u64,
                path: p.display().to_string(),
                label: Some(*l),
                chunk_start: None,
            })
            .collect(),
        Dataset::Shards(t) => (0..t.len())
            .map(|i| IndexEntry {
                index: i,
                path: t.key(i).unwrap_or_default(),
                label: t.get(i).ok().map(|(_, l)| l.0),
                chunk_start: None,
            })
            .collect(),
        Dataset::Remote(f) => (0..f.len())
            .map(|i| IndexEntry {
                index: i,
                path: f.key(i).unwrap_or_default(),
                label: f.get(i).ok().map(|(_, l)| l.0),
                chunk_start: None,
            })
            .collect(),
        // Every shard read (a remote one downloaded) to list its samples
        // under their stream indices; a shard that cannot be read is left
        // out here (the run reports it).
        Dataset::Streamed(t, _) => (0..t.names().len())
            .filter_map(|s| t.entries(s).ok().map(|e| (s, e)))
            .flat_map(|(s, entries)| {
                entries
                    .into_iter()
                    .enumerate()
                    .map(move |(i, (path, label))| IndexEntry {
                        index: ferrofeed_core::stream_index(s, i as u64),
                        path,
                        label,
                        chunk_start: None,
                    })
            })
            .collect(),
    })
}

/// What follows the decode stage in place of the vision collate (stages of
/// a front end's own and its collate), given the builder and the batch
/// buffers the settings ask for.
pub type Tail = Box<
    dyn FnOnce(
            PipelineBuilder,
            Arc<dyn ferrofeed_core::BufferSource>,
            crate::SampleName,
        ) -> Result<PipelineBuilder, JobError>
        + Send,
>;

/// Each sample's file (`path`) or shard member (`key`), by dataset index.
fn sample_name(ds: &Dataset) -> crate::SampleName {
    match ds {
        Dataset::Folder(f) => {
            let files = Arc::new(f.files().to_vec());
            crate::SampleName {
                component: "path",
                of: Arc::new(move |i| {
                    let (p, _) = files.get(usize::try_from(i).ok()?)?;
                    Some(p.display().to_string())
                }),
            }
        }
        Dataset::Shards(t) => {
            let t = Arc::clone(t);
            crate::SampleName {
                component: "key",
                of: Arc::new(move |i| t.key(i)),
            }
        }
        Dataset::Remote(f) => {
            let f = f.clone();
            crate::SampleName {
                component: "path",
                of: Arc::new(move |i| f.key(i)),
            }
        }
        Dataset::Streamed(t, _) => {
            let names = Arc::new(t.names().to_vec());
            crate::SampleName {
                component: "key",
                of: Arc::new(move |i| {
                    let shard = usize::try_from(i >> ferrofeed_core::STREAM_POSITION_BITS).ok()?;
                    let n = i & ((1u64 << ferrofeed_core::STREAM_POSITION_BITS) - 1);
                    Some(format!("{}#{n}", names.get(shard)?))
                }),
            }
        }
    }
}

/// The vision job `a` describes.
pub fn build(a: VisionSettings) -> Result<Job, JobError> {
    build_with(a, Custom::default())
}

/// What a front end composing its own pipeline changes in the vision job.
#[derive(Default)]
pub struct Custom {
    /// The files and labels to read, instead of scanning `path` (a
    /// torchvision dataset's own list).
    pub files: Option<ImageFolder>,
    /// The transform, instead of the one `transform`/`size`/`resize` ask
    /// for (crop scale and ratio ranges, flip probability of its own).
    pub transform: Option<Transform>,
    /// Stages and a collate after the decode stage, instead of the vision
    /// collate.
    pub tail: Option<Tail>,
    /// Decoder settings, instead of the flags' (torchvision's PIL loader
    /// does not apply EXIF orientation).
    pub decode: Option<DecodeOptions>,
}

/// The vision job `a` describes, changed as `with` says: the same sampler,
/// read and decode stages, so the same images reach the tail.
pub fn build_with(a: VisionSettings, with: Custom) -> Result<Job, JobError> {
    a.common.check()?;
    a.common.check_outputs()?;
    let Custom {
        files,
        transform: custom_transform,
        tail,
        decode: custom_decode,
    } = with;
    let opened = match files {
        Some(f) => Opened {
            ds: Dataset::Folder(f),
            remote: None,
            view: None,
        },
        None => {
            let path = match &a.path {
                Some(p) => p.clone(),
                None => default_dataset(a.common.quiet)?,
            };
            open_dataset(&path, &a.common.remote, a.vision.stream_shards)?
        }
    };
    if a.vision.shuffle_buffer > 0 && !a.vision.stream_shards {
        return Err(JobError::Usage(
            "--shuffle-buffer is for --stream-shards (shards read as a stream)".into(),
        ));
    }
    let ds = opened.ds.clone();
    let transform = match custom_transform {
        Some(t) => {
            t.validate().map_err(JobError::Usage)?;
            t
        }
        None => transform_of(&a.vision, TransformArg::Train)?,
    };
    let mut stage = DecodeTransform {
        transform,
        decode: custom_decode.unwrap_or_else(|| decode_options(&a.vision)),
        cache: a.vision.cache_bytes.map(ImageCache::new),
        disk: image_cache(&a.vision)?,
        seek: None,
    };
    let c = &a.common;
    let resources = ferrofeed_core::Resources::detect();
    // Marks pay for themselves from the second epoch on.
    let index_bytes = a.vision.scan_index.unwrap_or(
        usize::try_from((resources.memory_bytes / 16).min(1 << 30)).unwrap_or(usize::MAX),
    );
    if c.epochs > 1 && index_bytes > 0 {
        stage.seek = Some(ScanIndex::new(index_bytes));
    }
    let scan_index = stage.seek.clone();
    for w in &resources.warnings {
        tracing::warn!("{w}: falling back");
    }
    let out_side = match stage.transform {
        Transform::Eval { size, .. } | Transform::Train { size, .. } => size,
        Transform::None => a.vision.size,
    };
    if u64::from(out_side).pow(2) > a.vision.max_pixels {
        return Err(JobError::Usage(format!(
            "a {out_side}-pixel side makes outputs over --max-pixels {}",
            a.vision.max_pixels
        )));
    }
    check_batch_bytes(
        &stage.transform,
        out_side,
        a.common.batch_size,
        resources.memory_bytes,
    )?;
    let cpus = resources.workers();
    // A batch being built per worker, one waiting and two held by the
    // consumer; past that a batch waits up to 50 ms for a buffer, then takes
    // ordinary memory.
    let pool = a.vision.pin.pool(c.workers.resolve(cpus), 1)?;
    let disk = stage.disk.clone();
    let run_transform = stage.transform;
    let b = builder_for(&ds, stage, c.workers).batch_size(c.batch_size);
    let mut b = match tail {
        None => b.collate(ferrofeed_vision::collate().buffers(pool)),
        Some(tail) => tail(b, pool, sample_name(&ds))?,
    };
    if let Dataset::Streamed(t, _) = &ds {
        let shards = t.names().len();
        b = b.interleave((shards / (8 * c.workers.resolve(cpus)).max(1)).clamp(1, 16));
    }
    let mut b = c.configure(b, &resources, cpus)?;
    if let (Dataset::Streamed(..), true) = (&ds, c.shuffle) {
        // Encoded images wait in the buffer before the byte budget counts
        // them: a quarter of the budget at 256 KiB each, unless given.
        let budget = c.max_bytes_in_flight.unwrap_or(resources.default_budget());
        let items = match a.vision.shuffle_buffer {
            0 => (budget / 4 / (256 << 10)).clamp(1, 1024),
            n => n,
        };
        b = b.shuffle_buffer(items);
    }
    let pipeline = b.build().map_err(|e| JobError::Usage(e.to_string()))?;
    let streamed = matches!(ds, Dataset::Streamed(..));
    // What the dataset is, for the states it saves: its samples' paths and
    // labels (a streamed dataset's shards, which are not read for it).
    let identity: Vec<(String, Option<i64>)> = match &ds {
        Dataset::Streamed(t, _) => t.names().iter().map(|n| (n.clone(), None)).collect(),
        other => index_entries(other)?
            .into_iter()
            .map(|e| (e.path, e.label))
            .collect(),
    };
    let ds_images = ds.clone();
    // The strip uses the eval transform when the settings allow one (the
    // same pixels every run), else the run's own.
    let strip = (
        transform_of(&a.vision, TransformArg::Eval).unwrap_or(run_transform),
        decode_options(&a.vision),
    );
    let index = move || index_entries(&ds);
    let extra = move |_seconds: f64| {
        let mut m = BTreeMap::new();
        if let Some(s) = &scan_index {
            m.insert("scan_index_images".to_string(), json!(s.images()));
            m.insert("scan_index_bytes".to_string(), json!(s.bytes()));
            // Decodes that found every mark they needed / that parsed some.
            m.insert("scan_index_hits".to_string(), json!(s.hits()));
            m.insert("scan_index_misses".to_string(), json!(s.misses()));
        }
        if let Some(d) = &disk {
            m.insert("image_cache_hits".to_string(), json!(d.folder().hits()));
            m.insert("image_cache_misses".to_string(), json!(d.folder().misses()));
            m.insert(
                "image_cache_bytes_read".to_string(),
                json!(d.folder().bytes_read()),
            );
            m.insert(
                "image_cache_bytes_written".to_string(),
                json!(d.folder().bytes_written()),
            );
        }
        m
    };
    let mut job = Job::new("vision", pipeline, a.common.clone(), index, resources);
    job.extra = Box::new(extra);
    job.images = Some(Box::new(move || stage_images(&ds_images, strip)));
    if streamed {
        job.item_name = Some("item");
    }
    attach_remote(&mut job, opened);
    let identity: Vec<(String, Option<i64>)> = identity
        .into_iter()
        .map(|(p, l)| (job.show(&p), l))
        .collect();
    job.identify(&identity);
    Ok(job)
}

/// Read-ahead in each epoch's order for a remote tree; the report's
/// `remote` figures; the shards' local links kept for the job's life.
fn attach_remote(job: &mut Job, opened: Opened) {
    if let (Dataset::Streamed(_, Some(objects)), Some(remote)) = (&opened.ds, &opened.remote) {
        // The epoch's shard order, as objects: downloaded in that order
        // ahead of the workers, and the next epoch's first ones after.
        let (objects, remote) = (objects.clone(), Arc::clone(remote));
        job.epoch_start = Box::new(move |p, e, more| {
            let order = |e| {
                p.shard_order(e).map(|o| {
                    o.into_iter()
                        .filter_map(|s| objects.get(s).copied())
                        .collect::<Vec<_>>()
                })
            };
            if let Some(now) = order(e) {
                remote.schedule(now, if more { order(e + 1) } else { None });
            }
        });
    }
    if let Dataset::Remote(files) = &opened.ds {
        let files = files.clone();
        job.epoch_start = Box::new(move |p, e, more| {
            let order = |e| {
                p.plan(e)
                    .and_then(Result::ok)
                    .map(|plan| files.objects_in(&plan.indices))
            };
            if let Some(now) = order(e) {
                files
                    .remote()
                    .schedule(now, if more { order(e + 1) } else { None });
            }
        });
    }
    if let Some(remote) = opened.remote {
        job.set_remote(remote);
    }
    if let Some(view) = opened.view {
        job.show_path = Some(Arc::new(move |p: &str| view.to_url(p)));
    }
}

/// The first four samples as they leave each stage that makes an image,
/// as PNGs; a sample that fails is left out.
fn stage_images(
    ds: &Dataset,
    (transform, decode): (Transform, DecodeOptions),
) -> Vec<(String, Vec<u8>)> {
    let stage = DecodeTransform {
        transform,
        decode,
        cache: None,
        disk: None,
        seek: None,
    };
    let Ok(pipeline) = builder_for(ds, stage, Parallelism::Fixed(1))
        .collate(ferrofeed_vision::collate())
        .build()
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for index in 0..4 {
        let _ = pipeline.inspect_with(index, 0, |stage, table| {
            if let Some(img) = table.get::<Image>(0) {
                let mut png = Vec::new();
                let enc = ::image::codecs::png::PngEncoder::new(&mut png);
                if ::image::ImageEncoder::write_image(
                    enc,
                    &img.data,
                    img.width,
                    img.height,
                    ::image::ExtendedColorType::Rgb8,
                )
                .is_ok()
                {
                    out.push((format!("sample {index} after {stage}"), png));
                }
            }
        });
    }
    out
}

/// `inspect vision`: pulls sample `a.index` through every stage and
/// returns what each made (and, with `out`, the PNGs it wrote).
pub fn inspect(a: InspectArgs) -> Result<String, JobError> {
    let path = match &a.path {
        Some(p) => p.clone(),
        None => default_dataset(false)?,
    };
    let opened = open_dataset(&path, &RemoteSettings::default(), a.vision.stream_shards)?;
    let ds = opened.ds.clone();
    let transform = transform_of(&a.vision, TransformArg::Eval)?;
    let stage = DecodeTransform {
        transform,
        decode: decode_options(&a.vision),
        cache: None,
        disk: None,
        seek: None,
    };
    let pipeline = builder_for(&ds, stage, Parallelism::Fixed(1))
        .seed(a.seed)
        .collate(ferrofeed_vision::collate())
        .build()
        .map_err(|e| JobError::Usage(e.to_string()))?;
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).map_err(JobError::io(out))?;
    }
    let mut written: Vec<PathBuf> = Vec::new();
    let mut write_err: Option<JobError> = None;
    let report = pipeline.inspect_with(a.index, a.epoch, |stage, table| {
        let (Some(out), Some(img)) = (&a.out, table.get::<Image>(0)) else {
            return;
        };
        let p = out.join(format!("{:02}_{stage}.png", written.len()));
        match ::image::save_buffer(
            &p,
            &img.data,
            img.width,
            img.height,
            ::image::ExtendedColorType::Rgb8,
        ) {
            Ok(()) => written.push(p),
            Err(e) => {
                write_err.get_or_insert(JobError::Usage(format!("{}: {e}", p.display())));
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e);
    }
    let mut text = report.to_string();
    for p in written {
        text.push_str(&format!("wrote {}\n", p.display()));
    }
    Ok(text)
}

/// `make-dataset vision`.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct MakeVisionArgs {
    #[cfg_attr(feature = "cli", command(flatten))]
    pub common: crate::MakeArgs,
    /// Resample every image to exactly WxH (e.g. 6000x4000 for camera-sized
    /// photos); default: about 500×375, varying.
    #[cfg_attr(feature = "cli", arg(long, value_name = "WxH", value_parser = parse_image_size))]
    pub image_size: Option<(u32, u32)>,
}

/// `WxH` as `make-dataset vision --image-size` takes it.
pub fn parse_image_size(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?}: expected WxH, e.g. 2400x1800");
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (u32, u32) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    // JPEG's limit is 65,535 per side; past 100 MP a decoder's default
    // --max-pixels refuses the images anyway.
    if w == 0 || h == 0 || w > 65_535 || h > 65_535 || u64::from(w) * u64::from(h) > 100_000_000 {
        return Err(format!("{s}: each side 1–65535 and at most 100 MP"));
    }
    Ok((w, h))
}

/// `make-dataset vision`: writes the synthetic ImageFolder tree; returns
/// what it wrote.
pub fn make_dataset(m: &MakeVisionArgs) -> Result<String, JobError> {
    let a = &m.common;
    crate::settings::check_count(a.count)?;
    let t = std::time::Instant::now();
    synth::write_dataset_sized(
        &a.dir,
        a.count,
        a.seed,
        ferrofeed_core::available_cpus(),
        m.image_size,
    )
    .map_err(JobError::io(&a.dir))?;
    Ok(format!(
        "wrote {} images in {} classes to {} in {:.1} s",
        a.count,
        synth::CLASSES,
        a.dir.display(),
        t.elapsed().as_secs_f64()
    ))
}
