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

use crate::sample::Sample;

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

/// Object-safe view of a component, stored inside a [`Sample`].
pub(crate) trait ErasedComponent: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
    fn clone_box(&self) -> Box<dyn ErasedComponent>;
    fn nbytes(&self) -> usize;
    fn describe(&self) -> String;
}

impl<T: Component> ErasedComponent for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
    fn clone_box(&self) -> Box<dyn ErasedComponent> {
        Box::new(self.clone())
    }
    fn nbytes(&self) -> usize {
        Component::nbytes(self)
    }
    fn describe(&self) -> String {
        Component::describe(self)
    }
}

/// A set of components read or written together by a stage: `()`, a single
/// component, or a tuple of up to six.
pub trait ComponentSet: Send + Clone + 'static {
    /// The component ids in this set, in order.
    fn ids() -> Vec<ComponentId>;
    /// Moves the components out of `sample`; on a missing one returns its id
    /// (the sample is left unchanged).
    fn take_from(sample: &mut Sample) -> Result<Self, ComponentId>;
    /// Inserts the components into `sample`, replacing any of the same type.
    fn put_into(self, sample: &mut Sample);
}

impl ComponentSet for () {
    fn ids() -> Vec<ComponentId> {
        Vec::new()
    }
    fn take_from(_: &mut Sample) -> Result<Self, ComponentId> {
        Ok(())
    }
    fn put_into(self, _: &mut Sample) {}
}

impl<A: Component> ComponentSet for A {
    fn ids() -> Vec<ComponentId> {
        vec![ComponentId::of::<A>()]
    }
    fn take_from(sample: &mut Sample) -> Result<Self, ComponentId> {
        sample.take::<A>().ok_or_else(ComponentId::of::<A>)
    }
    fn put_into(self, sample: &mut Sample) {
        sample.insert(self);
    }
}

macro_rules! tuple_set {
    ($($t:ident),+) => {
        impl<$($t: Component),+> ComponentSet for ($($t,)+) {
            fn ids() -> Vec<ComponentId> {
                vec![$(ComponentId::of::<$t>()),+]
            }
            fn take_from(sample: &mut Sample) -> Result<Self, ComponentId> {
                $(
                    if !sample.contains::<$t>() {
                        return Err(ComponentId::of::<$t>());
                    }
                )+
                Ok(($(sample.take::<$t>().ok_or_else(ComponentId::of::<$t>)?,)+))
            }
            #[allow(non_snake_case)]
            fn put_into(self, sample: &mut Sample) {
                let ($($t,)+) = self;
                $(sample.insert($t);)+
            }
        }
    };
}
tuple_set!(A);
tuple_set!(A, B);
tuple_set!(A, B, C);
tuple_set!(A, B, C, D);
tuple_set!(A, B, C, D, E);
tuple_set!(A, B, C, D, E, F);

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

impl<T: bytemuck::Pod + Send + Sync + fmt::Debug> Component for Vec<T> {
    fn nbytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>() + std::mem::size_of::<Vec<T>>()
    }
    fn describe(&self) -> String {
        let head: Vec<&T> = self.iter().take(6).collect();
        format!(
            "len {} {:?}{}",
            self.len(),
            head,
            if self.len() > 6 { "…" } else { "" }
        )
    }
}

impl<T: bytemuck::Pod + Send + Sync + fmt::Debug> Component for Arc<[T]> {
    fn nbytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
    fn describe(&self) -> String {
        let head: Vec<&T> = self.iter().take(6).collect();
        format!(
            "len {} {:?}{}",
            self.len(),
            head,
            if self.len() > 6 { "…" } else { "" }
        )
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
        let mut s = Sample::new(0);
        s.insert(Label(3));
        let missing = <(Label, String)>::take_from(&mut s).unwrap_err();
        assert_eq!(missing, ComponentId::of::<String>());
        assert!(
            s.contains::<Label>(),
            "a failed take leaves the sample whole"
        );
        s.insert(String::from("x"));
        let (l, t) = <(Label, String)>::take_from(&mut s).unwrap();
        assert_eq!((l, t.as_str()), (Label(3), "x"));
        assert!(!s.contains::<Label>());
    }

    #[test]
    fn short_names() {
        assert_eq!(ComponentId::of::<Label>().short_name(), "Label");
        assert_eq!(ComponentId::of::<Vec<u8>>().short_name(), "Vec<u8>");
    }
}
