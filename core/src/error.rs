//! Errors and error policies.
//!
//! Every failure that reaches the user is a [`SampleError`] naming the
//! sample's dataset index, its path or key when the source has one, and the
//! stage. A pipeline-wide [`ErrorPolicy`] (overridable per stage) decides
//! whether a failing sample stops the epoch, is skipped and reported, or is
//! retried first.
//!
//! ```
//! use ferrofeed_core::ErrorPolicy;
//! assert_eq!("skip".parse::<ErrorPolicy>().unwrap(), ErrorPolicy::Skip);
//! assert!(matches!("retry:3".parse::<ErrorPolicy>().unwrap(), ErrorPolicy::Retry { attempts: 3, .. }));
//! assert!("sometimes".parse::<ErrorPolicy>().is_err());
//! ```
use std::fmt;
use std::time::Duration;

/// The error type stages and sources return: any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What happens when a stage (or the source) fails on a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// The iterator yields the error and the epoch stops (the default).
    #[default]
    Fail,
    /// The sample is dropped from its batch, counted and listed in the
    /// epoch's summary.
    Skip,
    /// Run the stage again, up to `attempts` more times, waiting `backoff`
    /// (doubled after each try); if it still fails, apply `then`.
    Retry {
        /// Extra attempts after the first failure.
        attempts: u32,
        /// Wait before the first retry; doubled for each following one.
        backoff: Duration,
        /// What to do when every attempt failed: `Fail` or `Skip`.
        then: RetryThen,
    },
}

/// The policy applied once retries are exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryThen {
    /// Stop the epoch with the error.
    Fail,
    /// Skip the sample and report it.
    Skip,
}

/// What the error policy makes of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Run the step again after this backoff.
    Retry(Duration),
    /// Drop the sample, report it in the summary, go on.
    Skip,
    /// Stop the epoch with this error.
    Stop,
}

impl ErrorPolicy {
    /// The one place fail/skip/retry is decided, for every step that can
    /// fail — a stage's row, a shard open, a source item, collate, batch
    /// stages, inspect: after `failures` failed attempts of it (1: the
    /// first run failed), retry with doubling backoff while the policy's
    /// retries last, then skip or stop. Steps that cannot run again ask
    /// with `u32::MAX` (see [`final_verdict`](Self::final_verdict)).
    pub(crate) fn verdict(&self, failures: u32) -> Verdict {
        match *self {
            ErrorPolicy::Retry { attempts, .. } if failures <= attempts => {
                Verdict::Retry(self.backoff(failures))
            }
            _ if self.skips() => Verdict::Skip,
            _ => Verdict::Stop,
        }
    }
    /// The verdict for a step that cannot be retried.
    pub(crate) fn final_verdict(&self) -> Verdict {
        self.verdict(u32::MAX)
    }
    /// `Retry { attempts, backoff: 10 ms, then: Fail }`.
    pub fn retry(attempts: u32) -> Self {
        ErrorPolicy::Retry {
            attempts,
            backoff: Duration::from_millis(10),
            then: RetryThen::Fail,
        }
    }
    pub(crate) fn attempts(&self) -> u32 {
        match self {
            ErrorPolicy::Retry { attempts, .. } => *attempts,
            _ => 0,
        }
    }
    pub(crate) fn skips(&self) -> bool {
        matches!(
            self,
            ErrorPolicy::Skip
                | ErrorPolicy::Retry {
                    then: RetryThen::Skip,
                    ..
                }
        )
    }
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        match self {
            ErrorPolicy::Retry { backoff, .. } => {
                backoff.saturating_mul(1u32 << attempt.min(16).saturating_sub(1))
            }
            _ => Duration::ZERO,
        }
    }
}

impl std::str::FromStr for ErrorPolicy {
    type Err = String;
    /// `fail`, `skip`, `retry:N` (then fail) or `retry:N:skip`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(ErrorPolicy::Fail),
            "skip" => Ok(ErrorPolicy::Skip),
            _ => {
                let rest = s.strip_prefix("retry:").ok_or_else(|| {
                    format!("unknown error policy `{s}`: expected fail, skip or retry:N")
                })?;
                let (n, then) = match rest.split_once(':') {
                    Some((n, "skip")) => (n, RetryThen::Skip),
                    Some((n, "fail")) => (n, RetryThen::Fail),
                    Some((_, other)) => {
                        return Err(format!(
                            "unknown policy after retries `{other}`: expected fail or skip"
                        ))
                    }
                    None => (rest, RetryThen::Fail),
                };
                let attempts = n
                    .parse::<u32>()
                    .map_err(|_| format!("retry count `{n}` is not a whole number"))?;
                // The wait doubles per attempt (10 ms first): past this many
                // a failing sample would hold its worker for hours.
                if attempts > MAX_RETRIES {
                    return Err(format!(
                        "retry:{attempts}: at most {MAX_RETRIES} retries (the wait doubles each time)"
                    ));
                }
                Ok(ErrorPolicy::Retry {
                    attempts,
                    backoff: Duration::from_millis(10),
                    then,
                })
            }
        }
    }
}

impl fmt::Display for ErrorPolicy {
    /// As [`FromStr`](std::str::FromStr) reads it: `fail`, `skip`,
    /// `retry:N` or `retry:N:skip`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorPolicy::Fail => f.write_str("fail"),
            ErrorPolicy::Skip => f.write_str("skip"),
            ErrorPolicy::Retry {
                attempts,
                then: RetryThen::Fail,
                ..
            } => write!(f, "retry:{attempts}"),
            ErrorPolicy::Retry {
                attempts,
                then: RetryThen::Skip,
                ..
            } => write!(f, "retry:{attempts}:skip"),
        }
    }
}

/// The most retries `retry:N` may ask for.
pub const MAX_RETRIES: u32 = 12;

/// What went wrong with a sample.
#[derive(Debug, Clone)]
pub enum ErrorKind {
    /// The stage or source returned an error (its message chain).
    Failed(String),
    /// The stage panicked; the panic message.
    Panicked(String),
    /// The stage ran longer than its timeout.
    TimedOut(Duration),
    /// A component the stage reads was not on the sample.
    MissingComponent(&'static str),
    /// The pipeline cannot run (a worker is stuck after a timeout, or a
    /// worker thread died).
    Pipeline(String),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Failed(m) => f.write_str(m),
            ErrorKind::Panicked(m) => write!(f, "panicked: {m}"),
            ErrorKind::TimedOut(d) => write!(f, "timed out after {:.3} s", d.as_secs_f64()),
            ErrorKind::MissingComponent(c) => write!(f, "component {c} is missing"),
            ErrorKind::Pipeline(m) => f.write_str(m),
        }
    }
}

/// A failure tied to one sample and one stage.
#[derive(Debug, Clone, thiserror::Error)]
pub struct SampleError {
    /// Dataset index of the sample (`None` for failures of a whole shard or
    /// of the pipeline itself).
    pub index: Option<u64>,
    /// The sample's path or key, when the source knows one.
    pub path: Option<String>,
    /// The stage that failed (`source` for reads, `collate` for batching).
    pub stage: String,
    /// What went wrong.
    pub kind: ErrorKind,
    /// How many times the stage ran on this sample.
    pub attempts: u32,
}

impl fmt::Display for SampleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.index, &self.path) {
            (Some(i), Some(p)) => write!(f, "sample {i} ({p})")?,
            (Some(i), None) => write!(f, "sample {i}")?,
            // A file, shard or stream item named by its path alone.
            (None, Some(p)) => f.write_str(p)?,
            (None, None) => f.write_str("pipeline")?,
        }
        write!(f, " failed in stage `{}`", self.stage)?;
        if self.attempts > 1 {
            write!(f, " after {} attempts", self.attempts)?;
        }
        write!(f, ": {}", self.kind)
    }
}

impl SampleError {
    /// The one constructor: the sample's index and key (path) when known,
    /// the stage, what went wrong and after how many attempts.
    pub(crate) fn new(
        index: Option<u64>,
        path: Option<String>,
        stage: impl Into<String>,
        kind: ErrorKind,
        attempts: u32,
    ) -> Self {
        SampleError {
            index,
            path,
            stage: stage.into(),
            kind,
            attempts,
        }
    }
    /// A stage's or source's error, after one attempt.
    pub(crate) fn from_box(
        index: Option<u64>,
        path: Option<String>,
        stage: &str,
        err: &BoxError,
    ) -> Self {
        SampleError::new(
            index,
            path,
            stage,
            ErrorKind::Failed(error_chain(err.as_ref())),
            1,
        )
    }
    /// A failure of the pipeline itself (a worker gone, a broken plan).
    pub(crate) fn pipeline(msg: String) -> Self {
        SampleError::new(None, None, "pipeline", ErrorKind::Pipeline(msg), 1)
    }
}

/// An error that running the step again cannot cure: the data itself is
/// bad (an empty file, a corrupt image). `retry:N` does not retry it; the
/// policy after the retries applies at once. Its message is the inner
/// error's.
///
/// ```
/// use ferrofeed_core::{is_permanent, BoxError, Permanent};
/// let e: BoxError = Permanent::wrap("empty file".into());
/// assert!(is_permanent(e.as_ref()));
/// assert_eq!(e.to_string(), "empty file");
/// assert!(!is_permanent(BoxError::from("connection reset").as_ref()));
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Permanent(pub BoxError);

impl Permanent {
    /// `e`, marked permanent (once: an error already marked is kept).
    pub fn wrap(e: BoxError) -> BoxError {
        if is_permanent(e.as_ref()) {
            e
        } else {
            Box::new(Permanent(e))
        }
    }
}

/// Whether `err`, or an error in its chain, is [`Permanent`].
pub fn is_permanent(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<Permanent>().is_some() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// `outer: cause: root cause`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(c) = cur {
        let cs = c.to_string();
        if !s.contains(&cs) {
            s.push_str(": ");
            s.push_str(&cs);
        }
        cur = c.source();
    }
    s
}

/// A plan that `build()` refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A stage reads a component that neither the source nor an earlier
    /// stage writes (or that an earlier stage consumed).
    #[error("stage `{stage}` reads component {component}, which {reason}")]
    MissingComponent {
        /// The stage.
        stage: String,
        /// The component's type name.
        component: String,
        /// Why it is not there.
        reason: String,
    },
    /// Batch size 0.
    #[error("batch size must be at least 1")]
    ZeroBatchSize,
    /// A stage was given zero workers.
    #[error("stage `{0}` has 0 workers: give it at least 1 (or Parallelism::Auto)")]
    ZeroWorkers(String),
    /// No collate function was given.
    #[error("no collate: call .collate(...) to say how samples become a batch")]
    NoCollate,
    /// Two stages share a name.
    #[error("two stages are named `{0}`: stage names must be unique")]
    DuplicateStage(String),
    /// A setting the source kind cannot use.
    #[error("`{setting}` does not apply to a {kind} source: {hint}")]
    NotForSource {
        /// The builder setting.
        setting: &'static str,
        /// `map-style` or `iterable`.
        kind: &'static str,
        /// What to use instead.
        hint: &'static str,
    },
    /// A byte budget of zero.
    #[error("max_bytes_in_flight must be at least 1 byte")]
    ZeroBudget,
    /// Another option is out of range.
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_policies() {
        assert_eq!("fail".parse::<ErrorPolicy>(), Ok(ErrorPolicy::Fail));
        let p: ErrorPolicy = "retry:2:skip".parse().unwrap();
        assert_eq!(p.attempts(), 2);
        assert!(p.skips());
        assert!("retry:x".parse::<ErrorPolicy>().is_err());
        assert!("retry:12".parse::<ErrorPolicy>().is_ok());
        assert!("retry:1000000000".parse::<ErrorPolicy>().is_err());
        assert!("retry:2:maybe".parse::<ErrorPolicy>().is_err());
    }

    #[test]
    fn display_names_everything() {
        let e = SampleError {
            index: Some(17),
            path: Some("a/b.jpg".into()),
            stage: "decode".into(),
            kind: ErrorKind::Failed("bad marker".into()),
            attempts: 3,
        };
        assert_eq!(
            e.to_string(),
            "sample 17 (a/b.jpg) failed in stage `decode` after 3 attempts: bad marker"
        );
    }
}
