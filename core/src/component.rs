//! Components: the typed pieces of data a sample carries.
//!
//! A component is any `Clone + Send + Sync` type that can say how many bytes
//! it holds (for the byte budget). Stages name the components they read and
//! write through [`ComponentSet`]s: a single component type, `()`, or a tuple.
//!
//! ```
//! use ferrofeed_core::{Component, ComponentSet};
//!
//! #[derive(Clone)]
//! struct Label(i64);
//! impl Component for Label {
//!     fn nbytes(&self) -> usize { 8 }
//! }
//! let ids = <(Label, Vec<u8>)>::ids();
//! assert_eq!(ids.len(), 2);
//! assert!(ids[0].name().ends_with("Label"));
//! ```
use std::any::{Any, TypeId};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::table::Table;

/// A typed piece of data carried by a sample (bytes, an image, a label...).
pub trait Component: Any + Send + Sync + Clone {
    /// Bytes this component holds (heap and inline); drives the byte budget.
    fn nbytes(&self) -> usize;

    /// A one-line summary (type, shape, statistics) used by `inspect`.
    fn describe(&self) -> String {
        format!("{} bytes", self.nbytes())
    }
}

/// The identity of a component type: its `TypeId` and a readable name.
#[derive(Clone, Copy)]
pub struct ComponentId {
    id: TypeId,
    name: &'static str,
}

impl ComponentId {
    /// The id of component type `T`.
    pub fn of<T: Component>() -> Self {
        ComponentId {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }
    /// The full type name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The type name without its module path.
    pub fn short_name(&self) -> &'static str {
        short_type_name(self.name)
    }
}

impl PartialEq for ComponentId {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for ComponentId {}

impl fmt::Debug for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}
impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// `a::b::Foo<c::Bar>` → `Foo<Bar>`.
pub(crate) fn short_type_name(full: &'static str) -> &'static str {
    let head = full.split('<').next().unwrap_or(full);
    match head.rfind("::") {
        Some(pos) => &full[pos + 2..],
        None => full,
    }
}

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
                let zipped = crate::component::zip_rows!($($v),+);
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

macro_rules! pod_component {
    ($($t:ty),+) => {
        $(impl Component for $t {
            fn nbytes(&self) -> usize { std::mem::size_of::<$t>() }
            fn describe(&self) -> String { format!("{:?}", self) }
        })+
    };
}
pod_component!(bool, u8, u16, u32, u64, usize, i8, i16, i32, i64, f32, f64);

impl Component for String {
    fn nbytes(&self) -> usize {
        self.capacity() + std::mem::size_of::<String>()
    }
    fn describe(&self) -> String {
        let mut s: String = self.chars().take(60).collect();
        if s.len() < self.len() {
            s.push('…');
        }
        format!("{:?} ({} bytes)", s, self.len())
    }
}

impl Component for PathBuf {
    fn nbytes(&self) -> usize {
        self.as_os_str().len() + std::mem::size_of::<PathBuf>()
    }
    fn describe(&self) -> String {
        self.display().to_string()
    }
}

/// `len N [first six…]`.
fn describe_slice<T: fmt::Debug>(s: &[T]) -> String {
    let head = &s[..s.len().min(6)];
    format!(
        "len {} {:?}{}",
        s.len(),
        head,
        if s.len() > 6 { "…" } else { "" }
    )
}

impl<T: bytemuck::Pod + Send + Sync + fmt::Debug> Component for Vec<T> {
    fn nbytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>() + std::mem::size_of::<Vec<T>>()
    }
    fn describe(&self) -> String {
        describe_slice(self)
    }
}

impl<T: bytemuck::Pod + Send + Sync + fmt::Debug> Component for Arc<[T]> {
    fn nbytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
    fn describe(&self) -> String {
        describe_slice(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct Label(i64);
    impl Component for Label {
        fn nbytes(&self) -> usize {
            8
        }
    }

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

    #[test]
    fn short_names() {
        assert_eq!(ComponentId::of::<Label>().short_name(), "Label");
        assert_eq!(ComponentId::of::<Vec<u8>>().short_name(), "Vec<u8>");
    }
}
