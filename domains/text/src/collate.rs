//! Text collates: dynamic padding and packing.
//!
//! [`PadCollate`] pads each batch to its own longest sequence (optionally up
//! to a multiple of 8 for tensor cores): `input_ids` and `attention_mask`,
//! both int64 `[N, L]`. [`PackCollate`] concatenates the batch's sequences,
//! each followed by an end-of-sequence token, and cuts the stream into rows of
//! `row_len` — no padding but in the last row — with `document_ids` int64
//! `[R, row_len]` saying which of the batch's samples each token came from
//! (-1 on padding), for block-diagonal attention. Both count real and padded
//! tokens in a shared [`PaddingStats`].
//!
//! ```
//! use ferrofeed_core::{Collate, Table};
//! use ferrofeed_core::BatchRows;
//! use ferrofeed_text::{PadCollate, Tokens};
//! let mut t = Table::with_indices(vec![0, 1]);
//! t.insert_column(vec![Tokens(vec![101, 7, 102]), Tokens(vec![101, 102])]);
//! let c = PadCollate::new(0);
//! let b = c.collate(&BatchRows::new(&t, 0..2)).unwrap();
//! assert_eq!(b.get("input_ids").unwrap().as_slice::<i64>().unwrap(), &[101, 7, 102, 101, 102, 0]);
//! assert_eq!(b.get("attention_mask").unwrap().as_slice::<i64>().unwrap(), &[1, 1, 1, 1, 1, 0]);
//! assert_eq!(c.stats().waste(), 1.0 / 6.0);
//! ```
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrofeed_core::BatchRows;
use ferrofeed_core::{Batch, BufferSource, Collate, CollateError, ComponentId, DType, Tensor};

use crate::tokenize::Tokens;

/// Real and padding tokens collated so far.
#[derive(Debug, Default)]
pub struct PaddingStats {
    real: AtomicU64,
    pad: AtomicU64,
}

impl PaddingStats {
    /// Tokens that came from samples.
    pub fn real_tokens(&self) -> u64 {
        self.real.load(Ordering::Relaxed)
    }
    /// Padding tokens added.
    pub fn pad_tokens(&self) -> u64 {
        self.pad.load(Ordering::Relaxed)
    }
    /// pad tokens / all tokens (0 when nothing was collated).
    pub fn waste(&self) -> f64 {
        let (r, p) = (self.real_tokens(), self.pad_tokens());
        if r + p == 0 {
            0.0
        } else {
            p as f64 / (r + p) as f64
        }
    }
    /// Starts counting again.
    pub fn reset(&self) {
        self.real.store(0, Ordering::Relaxed);
        self.pad.store(0, Ordering::Relaxed);
    }
    fn add(&self, real: usize, pad: usize) {
        self.real.fetch_add(real as u64, Ordering::Relaxed);
        self.pad.fetch_add(pad as u64, Ordering::Relaxed);
    }
}

fn tokens<'a>(rows: &BatchRows<'a>) -> Result<&'a [Tokens], CollateError> {
    rows.column::<Tokens>().ok_or_else(|| CollateError {
        sample: None,
        message: "no Tokens column (tokenize before collating)".into(),
    })
}

/// Where a collate's tensors come from: `None`, the heap.
#[derive(Clone, Default)]
struct Buffers(Option<Arc<dyn BufferSource>>);

impl std::fmt::Debug for Buffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Buffers(pool)"
        } else {
            "Buffers(heap)"
        })
    }
}

/// A zeroed int64 tensor, from `pool` when one is set (page-locked buffers
/// for device copies) else from the heap.
fn i64_tensor(pool: Option<&Arc<dyn BufferSource>>, shape: &[usize]) -> Tensor {
    match pool {
        None => Tensor::zeros(DType::I64, shape),
        Some(p) => {
            let mut t = Tensor::uninit_from(p.as_ref(), DType::I64, shape);
            t.as_bytes_mut().fill(0);
            t
        }
    }
}

fn slice(t: &mut Tensor) -> Result<&mut [i64], CollateError> {
    t.as_slice_mut::<i64>().map_err(|e| CollateError {
        sample: None,
        message: e.to_string(),
    })
}

/// Pads each batch to its longest sequence.
#[derive(Debug, Clone)]
pub struct PadCollate {
    pad_id: u32,
    multiple: usize,
    stats: Arc<PaddingStats>,
    pool: Buffers,
}

impl PadCollate {
    /// Pads with `pad_id`.
    pub fn new(pad_id: u32) -> Self {
        PadCollate {
            pad_id,
            multiple: 1,
            stats: Arc::default(),
            pool: Buffers(None),
        }
    }
    /// Builds batches in buffers from `source` (e.g. a pool of page-locked
    /// buffers) instead of the heap.
    pub fn buffers(mut self, source: Arc<dyn BufferSource>) -> Self {
        self.pool = Buffers(Some(source));
        self
    }
    /// Rounds the padded length up to a multiple of `m` (e.g. 8).
    pub fn pad_to_multiple_of(mut self, m: usize) -> Self {
        self.multiple = m.max(1);
        self
    }
    /// The shared padding counters.
    pub fn stats(&self) -> Arc<PaddingStats> {
        Arc::clone(&self.stats)
    }
}

impl Collate for PadCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<Tokens>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let toks = tokens(rows)?;
        let longest = toks.iter().map(|t| t.0.len()).max().unwrap_or(0);
        let l = (longest.div_ceil(self.multiple) * self.multiple).max(1);
        let n = toks.len();
        let mut ids = i64_tensor(self.pool.0.as_ref(), &[n, l]);
        let mut mask = i64_tensor(self.pool.0.as_ref(), &[n, l]);
        {
            let (ids_s, mask_s) = (slice(&mut ids)?, slice(&mut mask)?);
            for (r, t) in toks.iter().enumerate() {
                let row = &mut ids_s[r * l..(r + 1) * l];
                for (o, &i) in row.iter_mut().zip(&t.0) {
                    *o = i64::from(i);
                }
                row[t.0.len()..].fill(i64::from(self.pad_id));
                mask_s[r * l..r * l + t.0.len()].fill(1);
            }
        }
        let real: usize = toks.iter().map(|t| t.0.len()).sum();
        self.stats.add(real, n * l - real);
        let mut b = Batch::new(Vec::new());
        b.insert("input_ids", ids);
        b.insert("attention_mask", mask);
        Ok(b)
    }
}

/// Packs a batch's sequences into full rows.
#[derive(Debug, Clone)]
pub struct PackCollate {
    row_len: usize,
    eos_id: u32,
    pad_id: u32,
    stats: Arc<PaddingStats>,
    pool: Buffers,
}

impl PackCollate {
    /// Rows of `row_len` tokens; `eos_id` follows every sequence that does not
    /// already end with it; `pad_id` fills the last row.
    pub fn new(row_len: usize, eos_id: u32, pad_id: u32) -> Self {
        PackCollate {
            row_len: row_len.max(1),
            eos_id,
            pad_id,
            stats: Arc::default(),
            pool: Buffers(None),
        }
    }
    /// Builds batches in buffers from `source` instead of the heap.
    pub fn buffers(mut self, source: Arc<dyn BufferSource>) -> Self {
        self.pool = Buffers(Some(source));
        self
    }
    /// The shared padding counters.
    pub fn stats(&self) -> Arc<PaddingStats> {
        Arc::clone(&self.stats)
    }
}

impl Collate for PackCollate {
    fn reads(&self) -> Vec<ComponentId> {
        vec![ComponentId::of::<Tokens>()]
    }
    fn collate(&self, rows: &BatchRows<'_>) -> Result<Batch, CollateError> {
        let toks = tokens(rows)?;
        let mut stream: Vec<(i64, i64)> = Vec::new();
        for (d, t) in toks.iter().enumerate() {
            stream.extend(t.0.iter().map(|&i| (i64::from(i), d as i64)));
            if t.0.last() != Some(&self.eos_id) {
                stream.push((i64::from(self.eos_id), d as i64));
            }
        }
        let l = self.row_len;
        let r = stream.len().div_ceil(l).max(1);
        let mut ids = i64_tensor(self.pool.0.as_ref(), &[r, l]);
        let mut mask = i64_tensor(self.pool.0.as_ref(), &[r, l]);
        let mut docs = i64_tensor(self.pool.0.as_ref(), &[r, l]);
        {
            let ids_s = slice(&mut ids)?;
            ids_s.fill(i64::from(self.pad_id));
            for (o, &(i, _)) in ids_s.iter_mut().zip(&stream) {
                *o = i;
            }
            slice(&mut mask)?[..stream.len()].fill(1);
            let docs_s = slice(&mut docs)?;
            docs_s.fill(-1);
            for (o, &(_, d)) in docs_s.iter_mut().zip(&stream) {
                *o = d;
            }
        }
        self.stats.add(stream.len(), r * l - stream.len());
        let mut b = Batch::new(Vec::new());
        b.insert("input_ids", ids);
        b.insert("attention_mask", mask);
        b.insert("document_ids", docs);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrofeed_core::Table;

    fn table(seqs: &[&[u32]]) -> Table {
        let mut t = Table::with_indices((0..seqs.len() as u64).collect());
        t.insert_column(seqs.iter().map(|s| Tokens(s.to_vec())).collect());
        t
    }

    #[test]
    fn padding_to_a_multiple() {
        let t = table(&[&[1, 2, 3], &[4]]);
        let c = PadCollate::new(9).pad_to_multiple_of(8);
        let b = c.collate(&BatchRows::new(&t, 0..2)).unwrap();
        let ids = b.get("input_ids").unwrap();
        assert_eq!(ids.shape(), &[2, 8]);
        let v = ids.as_slice::<i64>().unwrap();
        assert_eq!(&v[..8], &[1, 2, 3, 9, 9, 9, 9, 9]);
        assert_eq!(&v[8..10], &[4, 9]);
        assert_eq!(c.stats().real_tokens(), 4);
        assert_eq!(c.stats().pad_tokens(), 12);
    }

    #[test]
    fn packing_fills_rows_and_marks_documents() {
        let t = table(&[&[1, 2, 3], &[4, 5, 99], &[6]]);
        let c = PackCollate::new(4, 99, 0);
        let b = c.collate(&BatchRows::new(&t, 0..3)).unwrap();
        // 1 2 3 99 | 4 5 99 6 | 99 pad pad pad
        let ids = b.get("input_ids").unwrap();
        assert_eq!(ids.shape(), &[3, 4]);
        assert_eq!(
            ids.as_slice::<i64>().unwrap(),
            &[1, 2, 3, 99, 4, 5, 99, 6, 99, 0, 0, 0]
        );
        assert_eq!(
            b.get("document_ids").unwrap().as_slice::<i64>().unwrap(),
            &[0, 0, 0, 0, 1, 1, 1, 2, 2, -1, -1, -1]
        );
        assert_eq!(
            b.get("attention_mask").unwrap().as_slice::<i64>().unwrap(),
            &[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
        );
        assert_eq!(c.stats().waste(), 3.0 / 12.0);
    }
}
