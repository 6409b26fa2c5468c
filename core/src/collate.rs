//! Collate: how the samples of a batch become a columnar [`Batch`].
//!
//! [`StackCollate`] stacks components that implement [`Collatable`] into
//! `[N, ...]` tensors, each sample writing straight into its row of the batch
//! buffer. A custom collate is a small [`Collate`] impl.
//!
//! ```
//! use ferrofeed_core::{Batch, Collatable, Collate, Component, Sample, StackCollate};
//!
//! #[derive(Clone)]
//! struct Pixel([u8; 3]);
//! impl Component for Pixel { fn nbytes(&self) -> usize { 3 } }
//! impl Collatable for Pixel {
//!     type Elem = u8;
//!     fn shape(&self) -> Vec<usize> { vec![3] }
//!     fn write(&self, out: &mut [u8]) { out.copy_from_slice(&self.0) }
//! }
//! let mut samples: Vec<Sample> = (0..2).map(|i| {
//!     let mut s = Sample::new(i);
//!     s.insert(Pixel([i as u8; 3]));
//!     s
//! }).collect();
//! let batch = StackCollate::new().column::<Pixel>("rgb").collate(&mut samples).unwrap();
//! assert_eq!(batch.get("rgb").unwrap().shape(), &[2, 3]);
//! ```
use crate::batch::{Batch, Element, Tensor};
use crate::component::{Component, ComponentId};
use crate::sample::Sample;

/// A collate failure; `sample` is the position (in the batch) of the sample
/// at fault, when one is.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct CollateError {
    /// Position of the offending sample within the batch.
    pub sample: Option<usize>,
    /// What went wrong.
    pub message: String,
}

/// Turns the samples of one batch into a [`Batch`]. The engine fills in the
/// batch's dataset indices.
pub trait Collate: Send + Sync + 'static {
    /// Components the collate reads (checked by `build()`).
    fn reads(&self) -> Vec<ComponentId>;
    /// Builds the batch. `samples` is never empty.
    fn collate(&self, samples: &mut [Sample]) -> Result<Batch, CollateError>;
}

/// A component that can be stacked into a tensor column.
pub trait Collatable: Component {
    /// The tensor element type.
    type Elem: Element;
    /// Shape of one row (empty for a scalar).
    fn shape(&self) -> Vec<usize>;
    /// Writes the row into `out` (exactly `shape().product()` elements).
    fn write(&self, out: &mut [Self::Elem]);
}

trait Column: Send + Sync {
    fn id(&self) -> ComponentId;
    fn name(&self) -> &str;
    fn build(&self, samples: &[Sample]) -> Result<Tensor, CollateError>;
}

struct StackColumn<T> {
    name: String,
    _p: std::marker::PhantomData<fn() -> T>,
}

impl<T: Collatable> Column for StackColumn<T> {
    fn id(&self) -> ComponentId {
        ComponentId::of::<T>()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn build(&self, samples: &[Sample]) -> Result<Tensor, CollateError> {
        let missing = |i: usize| CollateError {
            sample: Some(i),
            message: format!("component {} is missing", ComponentId::of::<T>()),
        };
        let first = samples.first().ok_or_else(|| CollateError {
            sample: None,
            message: "empty batch".into(),
        })?;
        let row_shape = first.get::<T>().ok_or_else(|| missing(0))?.shape();
        let row_len: usize = row_shape.iter().product();
        let mut shape = Vec::with_capacity(row_shape.len() + 1);
        shape.push(samples.len());
        shape.extend_from_slice(&row_shape);
        let mut tensor = Tensor::zeros(<T::Elem as Element>::DTYPE, &shape);
        let data = tensor.as_slice_mut::<T::Elem>().map_err(|e| CollateError {
            sample: None,
            message: e.to_string(),
        })?;
        for (i, s) in samples.iter().enumerate() {
            let c = s.get::<T>().ok_or_else(|| missing(i))?;
            let shp = c.shape();
            if shp != row_shape {
                return Err(CollateError {
                    sample: Some(i),
                    message: format!(
                        "column `{}`: shape {:?} differs from the batch's {:?}",
                        self.name, shp, row_shape
                    ),
                });
            }
            c.write(&mut data[i * row_len..(i + 1) * row_len]);
        }
        Ok(tensor)
    }
}

/// Stacks one component type per column.
#[derive(Default)]
pub struct StackCollate {
    columns: Vec<Box<dyn Column>>,
}

impl StackCollate {
    /// No columns yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds column `name` stacking component `T`.
    pub fn column<T: Collatable>(mut self, name: &str) -> Self {
        self.columns.push(Box::new(StackColumn::<T> {
            name: name.to_string(),
            _p: std::marker::PhantomData,
        }));
        self
    }
}

impl Collate for StackCollate {
    fn reads(&self) -> Vec<ComponentId> {
        self.columns.iter().map(|c| c.id()).collect()
    }
    fn collate(&self, samples: &mut [Sample]) -> Result<Batch, CollateError> {
        let mut batch = Batch::new(Vec::new());
        for c in &self.columns {
            batch.insert(c.name(), c.build(samples)?);
        }
        Ok(batch)
    }
}

macro_rules! scalar_collatable {
    ($($t:ty),+) => {
        $(impl Collatable for $t {
            type Elem = $t;
            fn shape(&self) -> Vec<usize> { Vec::new() }
            fn write(&self, out: &mut [$t]) { out[0] = *self; }
        })+
    };
}
scalar_collatable!(u8, i16, i32, i64, f32, f64);

impl<T: Element + std::fmt::Debug> Collatable for Vec<T> {
    type Elem = T;
    fn shape(&self) -> Vec<usize> {
        vec![self.len()]
    }
    fn write(&self, out: &mut [T]) {
        out.copy_from_slice(self);
    }
}
