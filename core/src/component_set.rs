//! [`ComponentSet`]: the components a stage reads or writes together — `()`,
//! one component, or a tuple of up to six — moved in and out of a
//! [`Table`] a column at a time.
//!
//! ```
//! use ferrofeed_core::{ComponentSet, Table};
//! let mut t = Table::with_indices(vec![0, 1]);
//! <(i64, String)>::put_rows(vec![(1, "a".into()), (2, "b".into())], &mut t);
//! let back: Vec<(i64, String)> = ComponentSet::take_rows(&mut t).unwrap();
//! assert_eq!(back[1], (2, "b".to_string()));
//! ```
use crate::component::{Component, ComponentId};
use crate::table::Table;

/// A set of components read or written together by a stage: `()`, a single
/// component, or a tuple of up to six. Within a task, samples are stored as a
/// [`Table`] — one column per component type — and a set moves in and out of
/// it a column at a time.
pub trait ComponentSet: Send + Clone + 'static {
    /// The component ids in this set, in order.
    fn ids() -> Vec<ComponentId>;
    /// Moves these columns out of `table` as one value per row; on a
    /// missing column returns its id (the table is left unchanged).
    fn take_rows(table: &mut Table) -> Result<Vec<Self>, ComponentId>;
    /// Inserts one value per row as columns, replacing any of the same type.
    /// `rows.len()` must equal `table.len()`.
    fn put_rows(rows: Vec<Self>, table: &mut Table);
}

impl ComponentSet for () {
    fn ids() -> Vec<ComponentId> {
        Vec::new()
    }
    fn take_rows(table: &mut Table) -> Result<Vec<Self>, ComponentId> {
        Ok(vec![(); table.len()])
    }
    fn put_rows(_: Vec<Self>, _: &mut Table) {}
}

impl<A: Component> ComponentSet for A {
    fn ids() -> Vec<ComponentId> {
        vec![ComponentId::of::<A>()]
    }
    fn take_rows(table: &mut Table) -> Result<Vec<Self>, ComponentId> {
        table.take_column::<A>().ok_or_else(ComponentId::of::<A>)
    }
    fn put_rows(rows: Vec<Self>, table: &mut Table) {
        table.insert_column(rows);
    }
}

macro_rules! tuple_set {
    ($(($t:ident, $v:ident)),+) => {
        impl<$($t: Component),+> ComponentSet for ($($t,)+) {
            fn ids() -> Vec<ComponentId> {
                vec![$(ComponentId::of::<$t>()),+]
            }
            fn take_rows(table: &mut Table) -> Result<Vec<Self>, ComponentId> {
                $(
                    if !table.contains::<$t>() {
                        return Err(ComponentId::of::<$t>());
                    }
                )+
                $(let $v = table.take_column::<$t>().ok_or_else(ComponentId::of::<$t>)?.into_iter();)+
                let zipped = crate::component_set::zip_rows!($($v),+);
                Ok(zipped.collect())
            }
            #[allow(non_snake_case)]
            fn put_rows(rows: Vec<Self>, table: &mut Table) {
                $(let mut $v: Vec<$t> = Vec::with_capacity(rows.len());)+
                for ($($t,)+) in rows {
                    $($v.push($t);)+
                }
                $(table.insert_column($v);)+
            }
        }
    };
}

/// Zips column iterators into an iterator of tuples.
macro_rules! zip_rows {
    ($a:ident) => {
        $a.map(|a| (a,))
    };
    ($a:ident, $b:ident) => {
        $a.zip($b)
    };
    ($a:ident, $b:ident, $c:ident) => {
        $a.zip($b).zip($c).map(|((a, b), c)| (a, b, c))
    };
    ($a:ident, $b:ident, $c:ident, $d:ident) => {
        $a.zip($b)
            .zip($c)
            .zip($d)
            .map(|(((a, b), c), d)| (a, b, c, d))
    };
    ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident) => {
        $a.zip($b)
            .zip($c)
            .zip($d)
            .zip($e)
            .map(|((((a, b), c), d), e)| (a, b, c, d, e))
    };
    ($a:ident, $b:ident, $c:ident, $d:ident, $e:ident, $f:ident) => {
        $a.zip($b)
            .zip($c)
            .zip($d)
            .zip($e)
            .zip($f)
            .map(|(((((a, b), c), d), e), f)| (a, b, c, d, e, f))
    };
}
pub(crate) use zip_rows;

tuple_set!((A, a));
tuple_set!((A, a), (B, b));
tuple_set!((A, a), (B, b), (C, c));
tuple_set!((A, a), (B, b), (C, c), (D, d));
tuple_set!((A, a), (B, b), (C, c), (D, d), (E, e));
tuple_set!((A, a), (B, b), (C, c), (D, d), (E, e), (F, f));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::tests::Label;

    #[test]
    fn tuples_take_all_or_nothing() {
        let mut t = Table::with_indices(vec![0, 1]);
        t.insert_column(vec![Label(3), Label(4)]);
        let missing = <(Label, String)>::take_rows(&mut t).unwrap_err();
        assert_eq!(missing, ComponentId::of::<String>());
        assert!(
            t.contains::<Label>(),
            "a failed take leaves the table whole"
        );
        t.insert_column(vec![String::from("x"), String::from("y")]);
        let rows = <(Label, String)>::take_rows(&mut t).unwrap();
        assert_eq!(rows[1], (Label(4), "y".to_string()));
        assert!(!t.contains::<Label>());
        <(Label, String)>::put_rows(rows, &mut t);
        assert_eq!(t.get::<String>(0).map(String::as_str), Some("x"));
    }
}
