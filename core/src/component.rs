//! Components: the typed pieces of data a sample carries.
//!
//! A component is any `Clone + Send + Sync` type that can say how many bytes
//! it holds (for the byte budget). Stages name the components they read and
//! write through [`ComponentSet`](crate::ComponentSet)s: a single component type, `()`, or a tuple.
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
pub(crate) mod tests {
    use super::*;

    /// A test component.
    #[derive(Clone, Debug, PartialEq)]
    pub(crate) struct Label(pub(crate) i64);
    impl Component for Label {
        fn nbytes(&self) -> usize {
            8
        }
    }

    #[test]
    fn short_names() {
        assert_eq!(ComponentId::of::<Label>().short_name(), "Label");
        assert_eq!(ComponentId::of::<Vec<u8>>().short_name(), "Vec<u8>");
    }
}
