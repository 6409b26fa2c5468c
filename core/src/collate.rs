//! Collate: how the samples of a batch become a columnar [`Batch`].
//!
//! [`StackCollate`] stacks components that implement [`Collatable`] into
//! `[N, ...]` tensors, each sample writing straight into its row of the batch
//! buffer. A custom collate is a small [`Collate`] impl.
//!
//! ```
//! use ferrofeed_core::{Collatable, Collate, Component, StackCollate, Table};
//! use ferrofeed_core::BatchRows;
//!
//! #[derive(Clone)]
//! struct Pixel([u8; 3]);
//! impl Component for Pixel { fn nbytes(&self) -> usize { 3 } }
//! impl Collatable for Pixel {
//!     type Elem = u8;
//!     fn shape(&self) -> Vec<usize> { vec![3] }
//!     fn write(&self, out: &mut [u8]) { out.copy_from_slice(&self.0) }
//! }
//! let mut table = Table::with_indices(vec![0, 1]);
//! table.insert_column(vec![Pixel([0; 3]), Pixel([1; 3])]);
//! let rows = BatchRows::new(&table, 0..2);
//! let batch = StackCollate::new().column::<Pixel>("rgb").collate(&rows).unwrap();
//! assert_eq!(batch.get("rgb").unwrap().shape(), &[2, 3]);
//! ```
use std::sync::Arc;

use crate::batch::{Batch, BufferPool, BufferSource, Element, Tensor};
use crate::component::{Component, ComponentId};
use crate::table::BatchRows;

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
    /// Builds the batch. `rows` is never empty.
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError>;
}

/// Work on whole batches after collate, in the same worker (so it overlaps
/// with the consumer's use of earlier batches): pinning, host-to-device
/// copies, batch-level augmentation.
pub trait BatchStage: Send + Sync + 'static {
    /// Processes one batch in place.
    fn process(&self, batch: &mut Batch) -> Result<(), crate::error::BoxError>;
}

impl<F> BatchStage for F
where
    F: Fn(&mut Batch) -> Result<(), crate::error::BoxError> + Send + Sync + 'static,
{
    fn process(&self, batch: &mut Batch) -> Result<(), crate::error::BoxError> {
        self(batch)
    }
}

/// A component that can be stacked into a tensor column.
pub trait Collatable: Component {
    /// The tensor element type.
    type Elem: Element;
    /// Shape of one row (empty for a scalar).
    fn shape(&self) -> Vec<usize>;
    /// Writes the row into `out` (exactly `shape().product()` elements).
    fn write(&self, out: &mut [Self::Elem]);
    /// Whether `self` and `other` have the same shape (override to avoid
    /// building two shapes).
    fn same_shape(&self, other: &Self) -> bool {
        self.shape() == other.shape()
    }
}

trait Column: Send + Sync {
    fn id(&self) -> ComponentId;
    fn name(&self) -> &Arc<str>;
    fn build(&self, rows: &BatchRows<'_>, pool: &dyn BufferSource) -> Result<Tensor, CollateError>;
}

struct StackColumn<T> {
    name: Arc<str>,
    _p: std::marker::PhantomData<fn() -> T>,
}

impl<T: Collatable> Column for StackColumn<T> {
    fn id(&self) -> ComponentId {
        ComponentId::of::<T>()
    }
    fn name(&self) -> &Arc<str> {
        &self.name
    }
    fn build(&self, rows: &BatchRows<'_>, pool: &dyn BufferSource) -> Result<Tensor, CollateError> {
        let values = rows.column::<T>().ok_or_else(|| CollateError {
            sample: None,
            message: format!("component {} is missing", ComponentId::of::<T>()),
        })?;
        let first = values.first().ok_or_else(|| CollateError {
            sample: None,
            message: "empty batch".into(),
        })?;
        let row_shape = first.shape();
        let row_len: usize = row_shape.iter().product();
        let mut shape = Vec::with_capacity(row_shape.len() + 1);
        shape.push(values.len());
        shape.extend_from_slice(&row_shape);
        // Every element is written below, so a recycled buffer needs no clearing.
        let mut tensor = Tensor::uninit_from(pool, <T::Elem as Element>::DTYPE, &shape);
        let data = tensor.as_slice_mut::<T::Elem>().map_err(|e| CollateError {
            sample: None,
            message: e.to_string(),
        })?;
        for (i, (c, out)) in values
            .iter()
            .zip(data.chunks_exact_mut(row_len.max(1)))
            .enumerate()
        {
            if i > 0 && !c.same_shape(first) {
                let (odd, common) = odd_one_out(values);
                return Err(CollateError {
                    sample: Some(odd),
                    message: format!(
                        "column `{}`: shape {:?} differs from the {:?} of the batch's other samples",
                        self.name,
                        values[odd].shape(),
                        common
                    ),
                });
            }
            c.write(out);
        }
        Ok(tensor)
    }
}

/// In a batch whose rows differ in shape: the first row whose shape is not
/// the most common one (ties go to the shape seen first), and that shape.
/// Blaming the row that differs from the first instead would blame every
/// good row of a batch whose first row is the odd one.
fn odd_one_out<T: Collatable>(values: &[T]) -> (usize, Vec<usize>) {
    // (a row of the shape, rows of it), in order of first appearance.
    let mut shapes: Vec<(usize, usize)> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        match shapes.iter_mut().find(|(r, _)| values[*r].same_shape(v)) {
            Some((_, n)) => *n += 1,
            None => shapes.push((i, 1)),
        }
    }
    let mut common = shapes.first().map_or(0, |s| s.0);
    let mut best = 0;
    for &(r, n) in &shapes {
        if n > best {
            (common, best) = (r, n);
        }
    }
    let odd = (0..values.len())
        .find(|&i| !values[i].same_shape(&values[common]))
        .unwrap_or(0);
    (odd, values[common].shape())
}

/// Stacks one component type per column, into buffers recycled from a
/// pool once the batches holding them are dropped.
pub struct StackCollate {
    columns: Vec<Box<dyn Column>>,
    pool: Arc<dyn BufferSource>,
}

impl Default for StackCollate {
    fn default() -> Self {
        StackCollate {
            columns: Vec::new(),
            pool: BufferPool::for_collate(),
        }
    }
}

impl StackCollate {
    /// No columns yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Takes the memory of large columns from `source` (e.g. a pool of
    /// page-locked buffers) instead of the default recycling pool.
    pub fn buffers(mut self, source: Arc<dyn BufferSource>) -> Self {
        self.pool = source;
        self
    }

    /// Adds column `name` stacking component `T`.
    pub fn column<T: Collatable>(mut self, name: &str) -> Self {
        self.columns.push(Box::new(StackColumn::<T> {
            name: Arc::from(name),
            _p: std::marker::PhantomData,
        }));
        self
    }
}

impl Collate for StackCollate {
    fn reads(&self) -> Vec<ComponentId> {
        self.columns.iter().map(|c| c.id()).collect()
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let mut batch = Batch::new(Vec::new());
        for c in &self.columns {
            batch.insert(Arc::clone(c.name()), c.build(rows, self.pool.as_ref())?);
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
            fn same_shape(&self, _: &Self) -> bool { true }
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
    fn same_shape(&self, other: &Self) -> bool {
        self.len() == other.len()
    }
}
