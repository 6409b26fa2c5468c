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

use crate::component::{ComponentId, ComponentSet};
use crate::error::BoxError;
use crate::rng::{derive_seed, sample_rng, SampleRng};
use crate::sample::Sample;

/// How many workers a stage runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallelism {
    /// As many as the CPUs this process may use.
    Auto,
    /// Exactly this many (I/O-bound stages may exceed the CPU count).
    Fixed(usize),
}

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
        s.parse::<usize>()
            .map(Parallelism::Fixed)
            .map_err(|_| format!("`{s}` is neither `auto` nor a worker count"))
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

/// Why one run of a stage on a sample failed.
pub(crate) enum StageFail {
    Missing(ComponentId),
    Error(BoxError),
    Panic(String),
}

pub(crate) type RunFn =
    Box<dyn Fn(&mut Sample, &StageCtx, bool) -> Result<(), StageFail> + Send + Sync>;

/// Erases a stage into "take inputs, run, put outputs"; with `keep_input`
/// the inputs go back on the sample after a failure (for a retry).
pub(crate) fn erase<S: Stage>(stage: S) -> RunFn {
    Box::new(move |sample, ctx, keep_input| {
        let input = S::In::take_from(sample).map_err(StageFail::Missing)?;
        let backup = keep_input.then(|| input.clone());
        match catch_unwind(AssertUnwindSafe(|| stage.process(input, ctx))) {
            Ok(Ok(out)) => {
                out.put_into(sample);
                Ok(())
            }
            Ok(Err(e)) => {
                if let Some(b) = backup {
                    b.put_into(sample);
                }
                Err(StageFail::Error(e))
            }
            Err(payload) => {
                if let Some(b) = backup {
                    b.put_into(sample);
                }
                Err(StageFail::Panic(panic_message(payload.as_ref())))
            }
        }
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
