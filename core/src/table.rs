//! [`Table`]: the samples of one task stored column-wise — one column per
//! component type, one row per sample — as an ECS stores entities of one
//! archetype. Stages move whole columns in and out, so a sample costs no
//! allocation of its own however many stages it passes.
//!
//! ```
//! use ferrofeed_core::Table;
//! let mut t = Table::with_indices(vec![10, 11, 12]);
//! t.insert_column(vec![1i64, 2, 3]);
//! assert_eq!(t.get::<i64>(1), Some(&2));
//! assert_eq!(t.column::<i64>().unwrap(), &[1, 2, 3]);
//! let taken: Vec<i64> = t.take_column().unwrap();
//! assert!(!t.contains::<i64>());
//! assert_eq!((taken.len(), t.len()), (3, 3));
//! ```
use std::any::{Any, TypeId};
use std::ops::Range;

use crate::component::{short_type_name, Component};

pub(crate) trait AnyColumn: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    fn nbytes(&self) -> usize;
    fn nbytes_range(&self, range: Range<usize>) -> usize;
    fn retain_mask(&mut self, keep: &[bool]);
    fn truncate(&mut self, n: usize);
    fn describe(&self, row: usize) -> String;
    fn clone_box(&self) -> Box<dyn AnyColumn>;
    /// Moves `other`'s rows after these; `other` back if its type differs.
    fn append_box(&mut self, other: Box<dyn AnyColumn>) -> Result<(), Box<dyn AnyColumn>>;
    /// Splits off the rows from `at` on.
    fn split_off_box(&mut self, at: usize) -> Box<dyn AnyColumn>;
    /// An empty column of the same type.
    fn empty_like(&self) -> Box<dyn AnyColumn>;
    /// Moves row `row` to the end of `out` (the last row takes its place);
    /// false, moving nothing, if `out`'s type differs.
    fn swap_remove_to(&mut self, row: usize, out: &mut dyn AnyColumn) -> bool;
}

impl<T: Component> AnyColumn for Vec<T> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
    fn nbytes(&self) -> usize {
        self.iter().map(Component::nbytes).sum()
    }
    fn nbytes_range(&self, range: Range<usize>) -> usize {
        self[range].iter().map(Component::nbytes).sum()
    }
    fn retain_mask(&mut self, keep: &[bool]) {
        let mut i = 0;
        self.retain(|_| {
            let k = keep.get(i).copied().unwrap_or(false);
            i += 1;
            k
        });
    }
    fn truncate(&mut self, n: usize) {
        Vec::truncate(self, n);
    }
    fn describe(&self, row: usize) -> String {
        self.get(row).map(Component::describe).unwrap_or_default()
    }
    fn clone_box(&self) -> Box<dyn AnyColumn> {
        Box::new(self.clone())
    }
    fn append_box(&mut self, other: Box<dyn AnyColumn>) -> Result<(), Box<dyn AnyColumn>> {
        if other.as_any().downcast_ref::<Vec<T>>().is_none() {
            return Err(other);
        }
        if let Ok(mut v) = other.into_any().downcast::<Vec<T>>() {
            self.append(&mut v);
        }
        Ok(())
    }
    fn split_off_box(&mut self, at: usize) -> Box<dyn AnyColumn> {
        Box::new(self.split_off(at.min(self.len())))
    }
    fn empty_like(&self) -> Box<dyn AnyColumn> {
        Box::new(Vec::<T>::new())
    }
    fn swap_remove_to(&mut self, row: usize, out: &mut dyn AnyColumn) -> bool {
        match out.as_any_mut().downcast_mut::<Vec<T>>() {
            Some(v) if row < self.len() => {
                v.push(self.swap_remove(row));
                true
            }
            _ => false,
        }
    }
}

struct Column {
    id: TypeId,
    name: &'static str,
    data: Box<dyn AnyColumn>,
}

/// Samples stored column-wise, with their dataset indices and the batch
/// boundaries of the task they belong to.
pub struct Table {
    indices: Vec<u64>,
    batch_ends: Vec<usize>,
    columns: Vec<Column>,
}

impl Clone for Table {
    fn clone(&self) -> Self {
        Table {
            indices: self.indices.clone(),
            batch_ends: self.batch_ends.clone(),
            columns: self
                .columns
                .iter()
                .map(|c| Column {
                    id: c.id,
                    name: c.name,
                    data: c.data.clone_box(),
                })
                .collect(),
        }
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("rows", &self.indices.len())
            .field(
                "columns",
                &self.columns.iter().map(|c| c.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Table {
    /// An empty table (no rows, no columns).
    pub fn new() -> Self {
        Table::with_indices(Vec::new())
    }

    /// Rows for the given dataset indices, as one batch, with no columns.
    pub fn with_indices(indices: Vec<u64>) -> Self {
        let n = indices.len();
        Table {
            indices,
            batch_ends: if n == 0 { Vec::new() } else { vec![n] },
            columns: Vec::new(),
        }
    }

    pub(crate) fn with_batches(indices: Vec<u64>, batch_ends: Vec<usize>) -> Self {
        Table {
            indices,
            batch_ends,
            columns: Vec::new(),
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// Dataset index of every row.
    pub fn indices(&self) -> &[u64] {
        &self.indices
    }
    /// The row ranges of the batches in this table.
    pub fn batches(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut start = 0;
        self.batch_ends.iter().map(move |&end| {
            let r = start..end;
            start = end;
            r
        })
    }
    /// The row range of the batch holding `row`.
    pub fn batch_of(&self, row: usize) -> Range<usize> {
        self.batches()
            .find(|r| r.contains(&row))
            .unwrap_or(row..row + 1)
    }

    fn find(&self, id: TypeId) -> Option<usize> {
        self.columns.iter().position(|c| c.id == id)
    }

    /// Whether a column of `T` exists.
    pub fn contains<T: Component>(&self) -> bool {
        self.find(TypeId::of::<T>()).is_some()
    }
    /// The column of `T`.
    pub fn column<T: Component>(&self) -> Option<&[T]> {
        let i = self.find(TypeId::of::<T>())?;
        self.columns[i]
            .data
            .as_any()
            .downcast_ref::<Vec<T>>()
            .map(Vec::as_slice)
    }
    /// The column of `T`, mutably.
    pub fn column_mut<T: Component>(&mut self) -> Option<&mut [T]> {
        let i = self.find(TypeId::of::<T>())?;
        self.columns[i]
            .data
            .as_any_mut()
            .downcast_mut::<Vec<T>>()
            .map(Vec::as_mut_slice)
    }
    /// Row `row` of the column of `T`.
    pub fn get<T: Component>(&self, row: usize) -> Option<&T> {
        self.column::<T>()?.get(row)
    }
    /// Removes and returns the column of `T`.
    pub fn take_column<T: Component>(&mut self) -> Option<Vec<T>> {
        let i = self.find(TypeId::of::<T>())?;
        let c = self.columns.swap_remove(i);
        c.data.into_any().downcast::<Vec<T>>().ok().map(|b| *b)
    }
    /// Adds (or replaces) the column of `T`.
    ///
    /// # Panics
    /// If `values.len()` differs from the number of rows: columns are
    /// always whole.
    pub fn insert_column<T: Component>(&mut self, values: Vec<T>) {
        assert_eq!(
            values.len(),
            self.len(),
            "column {} has {} rows, the table {}",
            short_type_name(std::any::type_name::<T>()),
            values.len(),
            self.len()
        );
        let id = TypeId::of::<T>();
        let col = Column {
            id,
            name: short_type_name(std::any::type_name::<T>()),
            data: Box::new(values),
        };
        match self.find(id) {
            Some(i) => self.columns[i] = col,
            None => self.columns.push(col),
        }
    }
    /// Bytes held by all components (for the byte budget).
    pub fn nbytes(&self) -> usize {
        self.columns.iter().map(|c| c.data.nbytes()).sum::<usize>() + self.indices.len() * 8
    }
    /// Bytes held by the components of rows `range`.
    pub fn nbytes_rows(&self, range: Range<usize>) -> usize {
        self.columns
            .iter()
            .map(|c| c.data.nbytes_range(range.clone()))
            .sum::<usize>()
            + range.len() * 8
    }
    /// `(component, summary)` of every column at `row`.
    pub fn describe(&self, row: usize) -> Vec<(&'static str, String)> {
        self.columns
            .iter()
            .map(|c| (c.name, c.data.describe(row)))
            .collect()
    }

    /// Keeps the rows whose `keep` entry is true (in every column).
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        for c in &mut self.columns {
            c.data.retain_mask(keep);
        }
        let mut new_ends = Vec::with_capacity(self.batch_ends.len());
        let mut kept = 0;
        let mut start = 0;
        for &end in &self.batch_ends {
            kept += keep[start.min(keep.len())..end.min(keep.len())]
                .iter()
                .filter(|&&k| k)
                .count();
            new_ends.push(kept);
            start = end;
        }
        let mut i = 0;
        self.indices.retain(|_| {
            let k = keep.get(i).copied().unwrap_or(false);
            i += 1;
            k
        });
        self.batch_ends = new_ends;
    }

    /// Moves the rows of `other` after these, as one batch with them. Both
    /// must hold the same components (an empty table with no columns takes
    /// `other`'s); otherwise nothing changes and the names of the two
    /// column sets are returned.
    pub(crate) fn append(&mut self, mut other: Table) -> Result<(), String> {
        if self.columns.is_empty() && self.is_empty() {
            let n = other.len();
            other.batch_ends = if n == 0 { Vec::new() } else { vec![n] };
            *self = other;
            return Ok(());
        }
        let names = |t: &Table| {
            t.columns
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let same = self.columns.len() == other.columns.len()
            && other.columns.iter().all(|c| self.find(c.id).is_some());
        if !same {
            return Err(format!("[{}] and [{}]", names(self), names(&other)));
        }
        for c in other.columns {
            if let Some(i) = self.find(c.id) {
                if let Err(back) = self.columns[i].data.append_box(c.data) {
                    // Unreachable: the ids matched. Keep the rows aligned.
                    drop(back);
                }
            }
        }
        self.indices.append(&mut other.indices);
        let n = self.indices.len();
        self.batch_ends = if n == 0 { Vec::new() } else { vec![n] };
        Ok(())
    }

    /// Removes the first `n` rows (all, if fewer) and returns them as a
    /// table of one batch; the rest stay, as one batch.
    pub(crate) fn split_front(&mut self, n: usize) -> Table {
        let n = n.min(self.len());
        let mut front = Table::with_indices(Vec::new());
        for c in &mut self.columns {
            let back = c.data.split_off_box(n);
            let head = std::mem::replace(&mut c.data, back);
            front.columns.push(Column {
                id: c.id,
                name: c.name,
                data: head,
            });
        }
        let rest = self.indices.split_off(n);
        front.indices = std::mem::replace(&mut self.indices, rest);
        front.batch_ends = if n == 0 { Vec::new() } else { vec![n] };
        let left = self.indices.len();
        self.batch_ends = if left == 0 { Vec::new() } else { vec![left] };
        front
    }

    /// Moves row `row` to the end of `out`, the last row taking its place
    /// here (as `Vec::swap_remove`); each table is left one batch. `out`
    /// must hold the same components, or be empty with none; otherwise, or
    /// when `row` is out of range, nothing moves and false is returned.
    pub(crate) fn swap_remove_into(&mut self, row: usize, out: &mut Table) -> bool {
        if row >= self.len() {
            return false;
        }
        if out.columns.is_empty() && out.is_empty() {
            out.columns = self
                .columns
                .iter()
                .map(|c| Column {
                    id: c.id,
                    name: c.name,
                    data: c.data.empty_like(),
                })
                .collect();
        }
        let same = self.columns.len() == out.columns.len()
            && self.columns.iter().all(|c| out.find(c.id).is_some());
        if !same {
            return false;
        }
        for c in &mut self.columns {
            if let Some(i) = out.find(c.id) {
                // The ids matched, so the types do too.
                c.data.swap_remove_to(row, out.columns[i].data.as_mut());
            }
        }
        out.indices.push(self.indices.swap_remove(row));
        out.batch_ends = vec![out.indices.len()];
        let left = self.indices.len();
        self.batch_ends = if left == 0 { Vec::new() } else { vec![left] };
        true
    }

    /// Keeps the first `n` rows; batches past them are dropped.
    pub(crate) fn truncate(&mut self, n: usize) {
        for c in &mut self.columns {
            c.data.truncate(n);
        }
        self.indices.truncate(n);
        self.batch_ends.retain(|&e| e <= n);
        if self.batch_ends.last().copied().unwrap_or(0) < n {
            self.batch_ends.push(n);
        }
    }
}

impl Default for Table {
    fn default() -> Self {
        Table::new()
    }
}

/// The rows of one batch, as the collate sees them.
pub struct BatchRows<'a> {
    table: &'a Table,
    range: Range<usize>,
}

impl<'a> BatchRows<'a> {
    /// Rows `range` of `table`.
    pub fn new(table: &'a Table, range: Range<usize>) -> Self {
        BatchRows { table, range }
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.range.len()
    }
    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
    /// Dataset index of each sample.
    pub fn indices(&self) -> &'a [u64] {
        &self.table.indices[self.range.clone()]
    }
    /// The values of component `T`, one per sample.
    pub fn column<T: Component>(&self) -> Option<&'a [T]> {
        self.table.column::<T>().map(|c| &c[self.range.clone()])
    }
    /// Sample `i`'s component `T`.
    pub fn get<T: Component>(&self, i: usize) -> Option<&'a T> {
        self.column::<T>()?.get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_remove_into_moves_one_row_of_every_column() {
        let mut a = Table::with_indices(vec![1, 2, 3]);
        a.insert_column(vec![10i64, 20, 30]);
        a.insert_column(vec!["a".to_string(), "b".to_string(), "c".to_string()]);
        let mut out = Table::new();
        assert!(a.swap_remove_into(0, &mut out));
        assert!(a.swap_remove_into(1, &mut out));
        assert_eq!(out.indices(), &[1, 2]);
        assert_eq!(out.column::<i64>().unwrap(), &[10, 20]);
        assert_eq!(out.column::<String>().unwrap(), &["a", "b"]);
        assert_eq!(out.batches().collect::<Vec<_>>(), vec![0..2]);
        assert_eq!(a.indices(), &[3]);
        assert_eq!(a.column::<String>().unwrap(), &["c"]);
        assert!(!a.swap_remove_into(1, &mut out), "out of range");
        let mut other = Table::with_indices(vec![9]);
        other.insert_column(vec![1u8]);
        assert!(!a.swap_remove_into(0, &mut other), "different components");
        assert_eq!((a.len(), other.len()), (1, 1), "unchanged");
    }

    #[test]
    fn append_and_split_front_move_whole_rows() {
        let mut a = Table::with_indices(vec![1, 2]);
        a.insert_column(vec![10i64, 20]);
        a.insert_column(vec!["a".to_string(), "b".to_string()]);
        let mut b = Table::with_indices(vec![3]);
        b.insert_column(vec!["c".to_string()]);
        b.insert_column(vec![30i64]);
        a.append(b).unwrap();
        assert_eq!(a.indices(), &[1, 2, 3]);
        assert_eq!(a.column::<i64>().unwrap(), &[10, 20, 30]);
        assert_eq!(a.batches().collect::<Vec<_>>(), vec![0..3]);
        let front = a.split_front(2);
        assert_eq!(front.indices(), &[1, 2]);
        assert_eq!(front.column::<String>().unwrap(), &["a", "b"]);
        assert_eq!(a.indices(), &[3]);
        assert_eq!(a.column::<i64>().unwrap(), &[30]);
        let mut empty = Table::new();
        empty.append(front).unwrap();
        assert_eq!(empty.len(), 2);
        let mut other = Table::with_indices(vec![9]);
        other.insert_column(vec![1u8]);
        assert!(empty.append(other).is_err(), "different components");
        assert_eq!(empty.len(), 2, "unchanged");
    }

    #[test]
    fn retain_and_truncate_keep_batches_aligned() {
        let mut t = Table::with_batches((0..7).collect(), vec![3, 5, 7]);
        t.insert_column((0..7).map(|i| i as i64 * 10).collect::<Vec<_>>());
        t.retain(&[true, false, true, true, true, false, true]);
        assert_eq!(t.indices(), &[0, 2, 3, 4, 6]);
        assert_eq!(t.column::<i64>().unwrap(), &[0, 20, 30, 40, 60]);
        assert_eq!(t.batches().collect::<Vec<_>>(), vec![0..2, 2..4, 4..5]);
        t.truncate(2);
        assert_eq!(t.batches().collect::<Vec<_>>(), vec![0..2]);
        assert_eq!(t.nbytes_rows(0..1), 16);
    }
}
