//! Batches: a columnar table of named tensors plus the dataset indices of the
//! samples in it.
//!
//! A [`Tensor`] is a contiguous buffer with a shape and a [`DType`]. Its
//! storage is inline for tensors of at most 64 bytes (a batch of scalars
//! costs no allocation), 64-byte-aligned owned memory otherwise, or any
//! [`HostBuffer`] (for instance a page-locked buffer from a recycling pool).
//!
//! ```
//! use ferrofeed_core::{Tensor, DType};
//! let mut t = Tensor::zeros(DType::I64, &[2, 3]);
//! t.as_slice_mut::<i64>().unwrap()[4] = 9;
//! assert_eq!(t.shape(), &[2, 3]);
//! assert_eq!(t.as_slice::<i64>().unwrap(), &[0, 0, 0, 0, 9, 0]);
//! assert!(t.as_slice::<f32>().is_err(), "the dtype is checked");
//! ```
use std::fmt;
use std::sync::Arc;

use crate::budget::Lease;
use crate::sync::LockExt;

/// Element types a tensor can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// `uint8`
    U8,
    /// `int16`
    I16,
    /// `int32`
    I32,
    /// `int64`
    I64,
    /// `float32`
    F32,
    /// `float64`
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::I16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }
    /// The NumPy type string (`|u1`, `<i8`, `<f4`…), little-endian.
    pub fn numpy_descr(self) -> &'static str {
        match self {
            DType::U8 => "|u1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }
    /// The usual name (`uint8`, `float32`…).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is a tensor element.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
}
macro_rules! element {
    ($($t:ty => $d:ident),*) => {
        $(impl Element for $t {
            const DTYPE: DType = DType::$d;
        })*
    };
}
element!(u8 => U8, i16 => I16, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Memory a tensor can live in besides its own allocation (pinned host
/// memory from a pool, a memory map…). Dropping it returns it to its owner.
pub trait HostBuffer: Send + Sync {
    /// The bytes (at least the tensor's length; 8-byte aligned).
    fn as_bytes(&self) -> &[u8];
    /// The bytes, mutably.
    fn as_bytes_mut(&mut self) -> &mut [u8];
    /// Whether the memory is page-locked (pinned) for fast device copies.
    fn is_pinned(&self) -> bool {
        false
    }
}

/// Where collate gets the memory of large tensors: a recycling pool of
/// ordinary memory ([`BufferPool`]) or of page-locked memory (the stage
/// library's pinned pool).
pub trait BufferSource: Send + Sync {
    /// A buffer of at least `bytes` bytes, 8-byte aligned, contents
    /// unspecified. It goes back to its source when dropped.
    fn take(&self, bytes: usize) -> Box<dyn HostBuffer>;
}

impl BufferSource for BufferPool {
    fn take(&self, bytes: usize) -> Box<dyn HostBuffer> {
        Box::new(Pooled {
            buf: self.take_lines(bytes.div_ceil(64)),
            pool: Arc::clone(&self.inner),
        })
    }
}

/// A pool of reusable 64-byte-aligned host buffers. A buffer taken from it
/// goes back when the tensor holding it is dropped, so steady-state batches
/// cost no allocation and no page faults. At most `max_free` idle buffers
/// are kept.
///
/// ```
/// use ferrofeed_core::{BufferPool, DType, Tensor};
/// let pool = BufferPool::new(2);
/// let t = Tensor::uninit_in(&pool, DType::U8, &[1000]);
/// drop(t);
/// assert_eq!(pool.idle(), 1);
/// let again = Tensor::uninit_in(&pool, DType::U8, &[800]);
/// assert_eq!(pool.idle(), 0, "the idle buffer was reused");
/// # drop(again);
/// ```
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    free: std::sync::Mutex<Vec<Vec<Line>>>,
    max_free: usize,
}

impl BufferPool {
    /// A pool keeping at most `max_free` idle buffers.
    pub fn new(max_free: usize) -> Self {
        BufferPool {
            inner: Arc::new(PoolInner {
                free: std::sync::Mutex::new(Vec::new()),
                max_free,
            }),
        }
    }
    /// The pool a collate recycles its batch buffers through unless given
    /// another source: up to 8 idle buffers.
    pub fn for_collate() -> Arc<dyn BufferSource> {
        Arc::new(BufferPool::new(8))
    }
    /// Idle buffers held.
    pub fn idle(&self) -> usize {
        self.inner.free.lock().map(|f| f.len()).unwrap_or_default()
    }
    fn take_lines(&self, lines: usize) -> Vec<Line> {
        let mut free = self.inner.free.lock_unpoisoned();
        // The smallest idle buffer that is large enough.
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= lines)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            // Kept whole (a tensor reads only its own length): a 64-row
            // buffer lent to a 38-row batch still serves the next 64 rows.
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                zeroed_lines(lines)
            }
        }
    }
}

struct Pooled {
    buf: Vec<Line>,
    pool: Arc<PoolInner>,
}

impl HostBuffer for Pooled {
    fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.buf)
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.buf)
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if let Ok(mut free) = self.pool.free.lock() {
            if free.len() < self.pool.max_free {
                free.push(buf);
            }
        }
    }
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);
// SAFETY: plain bytes.
unsafe impl bytemuck::Zeroable for Line {}
unsafe impl bytemuck::Pod for Line {}

/// `n` zeroed lines from the allocator's zeroed path: fresh pages from
/// the kernel are zero already and are not touched here, so a new batch
/// buffer's pages are faulted in once, by the collate's writes, instead
/// of once by a fill and written again.
fn zeroed_lines(n: usize) -> Vec<Line> {
    bytemuck::allocation::zeroed_vec(n)
}

enum Storage {
    Inline([u64; 8]),
    Owned(Vec<Line>),
    External(Box<dyn HostBuffer>),
}

/// At most this many dimensions.
pub const MAX_DIMS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
struct Shape {
    dims: [usize; MAX_DIMS],
    len: u8,
}

impl Shape {
    fn new(dims: &[usize]) -> Shape {
        assert!(
            dims.len() <= MAX_DIMS,
            "tensors have at most {MAX_DIMS} dimensions"
        );
        let mut s = Shape {
            dims: [0; MAX_DIMS],
            len: dims.len() as u8,
        };
        s.dims[..dims.len()].copy_from_slice(dims);
        s
    }
    fn as_slice(&self) -> &[usize] {
        &self.dims[..self.len as usize]
    }
}

/// A contiguous, row-major n-dimensional array.
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    len_bytes: usize,
    storage: Storage,
}

/// Asking for a tensor's data as the wrong element type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor holds {actual}, not {requested}")]
pub struct DTypeMismatch {
    /// The tensor's dtype.
    pub actual: DType,
    /// The requested dtype.
    pub requested: DType,
}

impl Tensor {
    /// A zero-filled tensor.
    ///
    /// # Panics
    /// With more than [`MAX_DIMS`] dimensions.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let len_bytes = shape.iter().product::<usize>() * dtype.size();
        let storage = if len_bytes <= 64 {
            Storage::Inline([0; 8])
        } else {
            Storage::Owned(zeroed_lines(len_bytes.div_ceil(64)))
        };
        Tensor {
            dtype,
            shape: Shape::new(shape),
            len_bytes,
            storage,
        }
    }

    /// A tensor whose buffer comes from `pool` (returned when the tensor is
    /// dropped). Its contents are unspecified — whatever the buffer held
    /// before — so the caller must write every element.
    ///
    /// # Panics
    /// With more than [`MAX_DIMS`] dimensions.
    pub fn uninit_in(pool: &BufferPool, dtype: DType, shape: &[usize]) -> Tensor {
        let len_bytes = shape.iter().product::<usize>() * dtype.size();
        if len_bytes <= 64 {
            return Tensor::zeros(dtype, shape);
        }
        Tensor::uninit_from(pool, dtype, shape)
    }

    /// A tensor over a buffer from any [`BufferSource`] (contents
    /// unspecified; tensors of at most 64 bytes stay inline and zeroed).
    ///
    /// # Panics
    /// With more than [`MAX_DIMS`] dimensions, or if the source returns a
    /// buffer smaller than asked.
    pub fn uninit_from(source: &dyn BufferSource, dtype: DType, shape: &[usize]) -> Tensor {
        let len_bytes = shape.iter().product::<usize>() * dtype.size();
        if len_bytes <= 64 {
            return Tensor::zeros(dtype, shape);
        }
        let buf = source.take(len_bytes);
        assert!(
            buf.as_bytes().len() >= len_bytes,
            "buffer source returned a short buffer"
        );
        Tensor {
            dtype,
            shape: Shape::new(shape),
            len_bytes,
            storage: Storage::External(buf),
        }
    }

    /// A tensor holding a copy of `data`.
    ///
    /// # Panics
    /// If `data.len()` differs from the product of `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Tensor {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "data length and shape disagree"
        );
        let mut t = Tensor::zeros(T::DTYPE, shape);
        t.as_bytes_mut()
            .copy_from_slice(bytemuck::cast_slice::<T, u8>(data));
        t
    }

    /// A tensor over external memory (e.g. a pinned buffer). Fails when the
    /// buffer is shorter than the shape needs or misaligned for the dtype.
    pub fn from_host_buffer(
        dtype: DType,
        shape: &[usize],
        buffer: Box<dyn HostBuffer>,
    ) -> Result<Tensor, String> {
        let len_bytes = shape.iter().product::<usize>() * dtype.size();
        let bytes = buffer.as_bytes();
        if bytes.len() < len_bytes {
            return Err(format!(
                "buffer holds {} bytes, the tensor needs {len_bytes}",
                bytes.len()
            ));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(dtype.size()) {
            return Err("buffer is not aligned for the dtype".into());
        }
        Ok(Tensor {
            dtype,
            shape: Shape::new(shape),
            len_bytes,
            storage: Storage::External(buffer),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }
    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        self.len_bytes
    }
    /// Whether the data lives in page-locked memory.
    pub fn is_pinned(&self) -> bool {
        match &self.storage {
            Storage::Inline(_) | Storage::Owned(_) => false,
            Storage::External(b) => b.is_pinned(),
        }
    }

    /// The raw bytes (native endianness).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Inline(a) => &bytemuck::cast_slice::<u64, u8>(a)[..self.len_bytes],
            Storage::Owned(v) => &bytemuck::cast_slice::<Line, u8>(v)[..self.len_bytes],
            Storage::External(b) => &b.as_bytes()[..self.len_bytes],
        }
    }
    /// The raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len_bytes;
        match &mut self.storage {
            Storage::Inline(a) => &mut bytemuck::cast_slice_mut::<u64, u8>(a)[..n],
            Storage::Owned(v) => &mut bytemuck::cast_slice_mut::<Line, u8>(v)[..n],
            Storage::External(b) => &mut b.as_bytes_mut()[..n],
        }
    }
    /// The data as `&[T]`; errors when `T` is not the tensor's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], DTypeMismatch> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice(self.as_bytes()))
    }
    /// The data as `&mut [T]`; errors when `T` is not the tensor's dtype.
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T], DTypeMismatch> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice_mut(self.as_bytes_mut()))
    }
    fn check<T: Element>(&self) -> Result<(), DTypeMismatch> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(DTypeMismatch {
                actual: self.dtype,
                requested: T::DTYPE,
            })
        }
    }

    /// Keeps the first `n` rows (the leading dimension); used when samples
    /// are dropped from a batch after its buffer was sized.
    pub fn truncate_rows(&mut self, n: usize) {
        if self.shape.len > 0 {
            let first = self.shape.dims[0];
            if n < first {
                let row = self.len_bytes / first.max(1);
                self.shape.dims[0] = n;
                self.len_bytes = row * n;
            }
        }
    }

    /// The `.npy` (version 1.0) encoding of this tensor.
    pub fn to_npy(&self) -> Vec<u8> {
        let dims = self.shape();
        let shape = match dims.len() {
            0 => "()".to_string(),
            1 => format!("({},)", dims[0]),
            _ => format!(
                "({})",
                dims.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut header = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
            self.dtype.numpy_descr(),
            shape
        );
        // magic(6) + version(2) + len(2) + header + '\n' is a multiple of 64.
        let total = 10 + header.len() + 1;
        header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
        header.push('\n');
        let mut out = Vec::with_capacity(10 + header.len() + self.len_bytes);
        out.extend_from_slice(b"\x93NUMPY\x01\x00");
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(self.as_bytes());
        out
    }
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        let mut t = Tensor::zeros(self.dtype, self.shape());
        t.as_bytes_mut().copy_from_slice(self.as_bytes());
        t
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {:?})", self.dtype, self.shape())
    }
}

/// A batch: named tensors (columns) and the dataset index of each row.
pub struct Batch {
    columns: smallvec::SmallVec<[(Arc<str>, Tensor); 2]>,
    indices: smallvec::SmallVec<[u64; 4]>,
    pub(crate) lease: Option<std::sync::Arc<Lease>>,
    /// Position in the epoch: (plan batch, 0) for map-style sources, (shard
    /// position, part) for iterable ones.
    pub(crate) pos: (u64, u64),
    /// Values attached by batch stages (e.g. device copies of the columns).
    extras: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("indices", &self.indices)
            .field("columns", &self.columns)
            .finish()
    }
}

impl Batch {
    /// A batch with no columns for the given dataset indices.
    pub fn new(indices: Vec<u64>) -> Batch {
        Batch {
            columns: smallvec::SmallVec::new(),
            indices: indices.into(),
            lease: None,
            pos: (0, 0),
            extras: Vec::new(),
        }
    }
    /// Adds (or replaces) a column.
    pub fn insert(&mut self, name: impl Into<Arc<str>>, tensor: Tensor) {
        let name = name.into();
        if let Some(c) = self.columns.iter_mut().find(|(n, _)| **n == *name) {
            c.1 = tensor;
        } else {
            self.columns.push((name, tensor));
        }
    }
    /// The column called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.columns
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, t)| t)
    }
    /// The column called `name`, mutably.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.columns
            .iter_mut()
            .find(|(n, _)| &**n == name)
            .map(|(_, t)| t)
    }
    /// Removes and returns a column.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        let pos = self.columns.iter().position(|(n, _)| &**n == name)?;
        Some(self.columns.remove(pos).1)
    }
    /// All columns in insertion order.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.columns.iter().map(|(n, t)| (&**n, t))
    }
    /// Attaches a value of type `T` (replacing one of the same type).
    pub fn attach<T: std::any::Any + Send + Sync>(&mut self, value: T) {
        self.extras.retain(|e| !e.is::<T>());
        self.extras.push(Box::new(value));
    }
    /// The attached value of type `T`.
    pub fn attached<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.extras.iter().find_map(|e| e.downcast_ref::<T>())
    }
    /// The batch's position in its epoch's plan: the plan batch for
    /// map-style sources, `(shard group position, part)` for iterable ones
    /// (a group is one shard unless `interleave` is set).
    pub fn position(&self) -> (u64, u64) {
        self.pos
    }
    /// Dataset index of each row.
    pub fn indices(&self) -> &[u64] {
        &self.indices
    }
    pub(crate) fn set_indices(&mut self, indices: &[u64]) {
        self.indices = smallvec::SmallVec::from_slice(indices);
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// Bytes held by the columns.
    pub fn nbytes(&self) -> usize {
        self.columns.iter().map(|(_, t)| t.nbytes()).sum::<usize>() + self.indices.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_parsable() {
        let t = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3]);
        let npy = t.to_npy();
        assert_eq!(&npy[..6], b"\x93NUMPY");
        let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&npy[10..10 + hlen]).unwrap();
        assert!(header.contains("'descr': '<i8'") && header.contains("(2, 3)"));
        assert_eq!(
            &npy[10 + hlen..],
            bytemuck::cast_slice::<i64, u8>(&[1, 2, 3, 4, 5, 6])
        );
        let one = Tensor::from_slice(&[7u8], &[1]).to_npy();
        assert!(std::str::from_utf8(&one[10..]).unwrap().contains("(1,)"));
    }

    #[test]
    fn a_pooled_buffer_lent_to_a_short_tensor_still_serves_a_full_one() {
        let pool = BufferPool::new(4);
        let full = Tensor::uninit_in(&pool, DType::F32, &[64, 1000]);
        let at = full.as_bytes().as_ptr();
        drop(full);
        let short = Tensor::uninit_in(&pool, DType::F32, &[38, 1000]);
        assert_eq!(short.as_bytes().len(), 38 * 4000);
        assert_eq!(short.as_bytes().as_ptr(), at);
        drop(short);
        // The next full batch gets the same memory, not a new allocation.
        let again = Tensor::uninit_in(&pool, DType::F32, &[64, 1000]);
        assert_eq!(again.as_bytes().as_ptr(), at);
        assert_eq!(pool.idle(), 0);
        assert!(Tensor::zeros(DType::U8, &[1 << 20])
            .as_bytes()
            .iter()
            .all(|&b| b == 0));
    }

    #[test]
    fn storage_is_aligned() {
        let t = Tensor::zeros(DType::F64, &[30]);
        assert_eq!(t.as_bytes().as_ptr() as usize % 64, 0);
        let small = Tensor::zeros(DType::F64, &[3]);
        assert_eq!(small.as_bytes().as_ptr() as usize % 8, 0);
    }

    #[test]
    fn truncate_rows_shrinks_leading_dim() {
        let mut t = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6], &[3, 2]);
        t.truncate_rows(2);
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4]);
    }
}
