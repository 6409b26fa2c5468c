//! Stages: systems that read some components of a sample and write others.
//!
//! A stage declares what it reads (`In`) and writes (`Out`) as
//! [`ComponentSet`]s. The components it reads are moved out of the sample
//! (so a decoder frees the encoded bytes); its outputs are added. A stage is
//! either a closure (`builder.map(...)`) or a small trait impl:
//!
//! ```
//! use ferrofeed_core::{BoxError, Stage, StageCtx};
//! use rand::Rng;
//!
//! struct Jitter(f32);
//! impl Stage for Jitter {
//!     type In = f32;
//!     type Out = f32;
//!     fn process(&self, x: f32, ctx: &StageCtx) -> Result<f32, BoxError> {
//!         Ok(x + ctx.rng().random_range(-self.0..self.0))
//!     }
//! }
//! ```
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::component::ComponentId;
use crate::component_set::ComponentSet;
use crate::error::{error_chain, ErrorKind};
use crate::error::{BoxError, ErrorPolicy};
use crate::rng::{derive_seed, sample_rng, SampleRng};
use crate::table::Table;
use std::time::Duration;

/// How many workers a stage runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// As many as the CPUs this process may use.
    Auto,
    /// Exactly this many (I/O-bound stages may exceed the CPU count).
    Fixed(usize),
}

/// The most workers one stage may have: each is a thread with its own
/// stack, and far more than this is refused by name (`--workers 20000`)
/// instead of failing deep in thread creation.
pub const MAX_WORKERS: usize = 1024;

impl Parallelism {
    /// The worker count, resolving `Auto` with `cpus`.
    pub fn resolve(self, cpus: usize) -> usize {
        match self {
            Parallelism::Auto => cpus.max(1),
            Parallelism::Fixed(n) => n,
        }
    }
}

impl std::str::FromStr for Parallelism {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Parallelism::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if n > MAX_WORKERS => Err(format!(
                "{n} workers is more than the {MAX_WORKERS} a stage may have"
            )),
            Ok(n) => Ok(Parallelism::Fixed(n)),
            Err(_) => Err(format!("`{s}` is neither `auto` nor a worker count")),
        }
    }
}

impl std::fmt::Display for Parallelism {
    /// As [`FromStr`](std::str::FromStr) reads it: `auto` or the count.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Parallelism::Auto => f.write_str("auto"),
            Parallelism::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// What a stage knows about the sample it is processing.
pub struct StageCtx<'a> {
    pub(crate) index: u64,
    pub(crate) epoch: u64,
    pub(crate) seed: u64,
    pub(crate) salt: u64,
    pub(crate) attempt: u32,
    pub(crate) cancel: &'a AtomicBool,
}

impl<'a> StageCtx<'a> {
    /// A context outside any pipeline (for tests and one-off calls).
    pub fn detached(index: u64, epoch: u64, seed: u64, cancel: &'a AtomicBool) -> Self {
        StageCtx {
            index,
            epoch,
            seed,
            salt: 0,
            attempt: 0,
            cancel,
        }
    }
    /// Dataset index of the sample.
    pub fn index(&self) -> u64 {
        self.index
    }
    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// The pipeline's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// 0 on the first try, then 1, 2… on retries.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// An RNG that depends only on `(seed, epoch, sample index, stage name)`:
    /// the same numbers whichever worker runs the sample, in every run.
    pub fn rng(&self) -> SampleRng {
        sample_rng(derive_seed(&[self.seed, self.epoch, self.index, self.salt]))
    }
    /// Whether the epoch was abandoned; long stages should check it and return.
    pub fn should_stop(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// A system over samples: takes `In` from the sample, returns `Out`.
pub trait Stage: Send + Sync + 'static {
    /// Components read (moved out of the sample).
    type In: ComponentSet;
    /// Components written.
    type Out: ComponentSet;
    /// Processes one sample.
    fn process(&self, input: Self::In, ctx: &StageCtx) -> Result<Self::Out, BoxError>;
}

/// A closure as a stage (see `PipelineBuilder::map`).
pub struct FnStage<F, I, O, E> {
    f: F,
    _p: PhantomData<fn(I) -> Result<O, E>>,
}

impl<F, I, O, E> FnStage<F, I, O, E> {
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        FnStage { f, _p: PhantomData }
    }
}

impl<F, I, O, E> Stage for FnStage<F, I, O, E>
where
    F: Fn(I, &StageCtx) -> Result<O, E> + Send + Sync + 'static,
    I: ComponentSet,
    O: ComponentSet,
    E: Into<BoxError> + 'static,
{
    type In = I;
    type Out = O;
    fn process(&self, input: I, ctx: &StageCtx) -> Result<O, BoxError> {
        (self.f)(input, ctx).map_err(Into::into)
    }
}

/// What a stage run over a table may read: the epoch, seed, cancel flag
/// and how many retries its policy allows.
pub(crate) struct RunEnv<'a> {
    pub epoch: u64,
    pub seed: u64,
    pub cancel: &'a AtomicBool,
    pub retries: u32,
    /// Call `Exec::begin`/`end` around every row (timeouts watched, or a
    /// slow stage timed on every row); otherwise never.
    pub every_row: bool,
}

/// What becomes of a row whose stage failed, as the engine's policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowFate {
    /// Run the stage on it again (the engine has waited the backoff).
    Retry,
    /// Drop the row and go on.
    Skip,
    /// Stop: this row's batch and everything after it are dropped.
    Stop,
}

/// The engine's side of a stage run: timing, retries, failures.
pub(crate) trait Exec {
    fn begin(&mut self, row: usize, index: u64);
    fn end(&mut self);
    /// Row `index` failed its `attempts`-th run; `may_retry` says whether
    /// its input was kept for another. The engine applies the policy.
    fn fail(&mut self, index: u64, kind: ErrorKind, attempts: u32, may_retry: bool) -> RowFate;
}

pub(crate) type RunFn =
    Box<dyn Fn(&mut Table, &RunEnv<'_>, &mut dyn Exec) -> Result<(), ComponentId> + Send + Sync>;

/// Erases a stage into "take the input columns, run every row, put the
/// output columns". Rows that fail are dropped (`Skip`) or end the task at
/// their batch (`Stop`); with retries left, a row's input is cloned first.
pub(crate) fn erase<S: Stage>(stage: S, salt: u64) -> RunFn {
    Box::new(move |table, env, exec| {
        let input = S::In::take_rows(table)?;
        let n = input.len();
        let mut out: Vec<S::Out> = Vec::with_capacity(n);
        let mut keep: Option<Vec<bool>> = None;
        let mut stop: Option<usize> = None;
        for (row, x) in input.into_iter().enumerate() {
            let index = table.indices()[row];
            let mut attempt = 0u32;
            let mut x = Some(x);
            loop {
                let arg = if attempt < env.retries {
                    x.clone()
                } else {
                    x.take()
                };
                let Some(arg) = arg else { break };
                let ctx = StageCtx {
                    index,
                    epoch: env.epoch,
                    seed: env.seed,
                    salt,
                    attempt,
                    cancel: env.cancel,
                };
                if env.every_row {
                    exec.begin(row, index);
                }
                let r = catch_unwind(AssertUnwindSafe(|| stage.process(arg, &ctx)));
                if env.every_row {
                    exec.end();
                }
                let (kind, permanent) = match r {
                    Ok(Ok(o)) => {
                        out.push(o);
                        break;
                    }
                    Ok(Err(e)) => (
                        ErrorKind::Failed(error_chain(e.as_ref())),
                        crate::error::is_permanent(e.as_ref()),
                    ),
                    Err(p) => (ErrorKind::Panicked(panic_message(p.as_ref())), false),
                };
                let may_retry =
                    !permanent && attempt < env.retries && !env.cancel.load(Ordering::Relaxed);
                match exec.fail(index, kind, attempt + 1, may_retry) {
                    RowFate::Retry => {
                        attempt += 1;
                        continue;
                    }
                    RowFate::Skip => keep.get_or_insert_with(|| vec![true; n])[row] = false,
                    RowFate::Stop => stop = Some(row),
                }
                break;
            }
            if stop.is_some() {
                break;
            }
        }
        if let Some(r) = stop {
            let cut = table.batch_of(r).start;
            let alive = keep
                .as_ref()
                .map_or(cut, |k| k[..cut].iter().filter(|&&b| b).count());
            out.truncate(alive);
            if let Some(k) = &mut keep {
                k.truncate(cut);
            }
            table.truncate(cut);
        }
        if let Some(k) = keep {
            table.retain(&k);
        }
        S::Out::put_rows(out, table);
        Ok(())
    })
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Per-stage options: workers, error policy override, timeout.
#[derive(Debug, Clone, Copy)]
pub struct StageOptions {
    pub(crate) workers: Parallelism,
    pub(crate) on_error: Option<ErrorPolicy>,
    pub(crate) timeout: Option<Duration>,
}

impl Default for StageOptions {
    fn default() -> Self {
        StageOptions {
            workers: Parallelism::Auto,
            on_error: None,
            timeout: None,
        }
    }
}

impl StageOptions {
    /// Defaults: `Auto` workers, the pipeline's policy, no timeout.
    pub fn new() -> Self {
        Self::default()
    }
    /// Worker count.
    pub fn workers(mut self, p: Parallelism) -> Self {
        self.workers = p;
        self
    }
    /// Error policy for this stage only.
    pub fn on_error(mut self, p: ErrorPolicy) -> Self {
        self.on_error = Some(p);
        self
    }
    /// A run longer than this becomes a timeout error naming the stage and
    /// sample (the epoch stops: a stuck worker cannot be reclaimed).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}
