//! [`Sample`]: one entity flowing through the pipeline — a dataset index plus
//! the components stages have written so far.
//!
//! ```
//! use ferrofeed_core::Sample;
//! let mut s = Sample::new(42);
//! s.insert(7_i64);
//! assert_eq!(s.get::<i64>(), Some(&7));
//! assert_eq!(s.take::<i64>(), Some(7));
//! assert!(s.get::<i64>().is_none());
//! ```
use std::any::TypeId;

use crate::component::{short_type_name, Component, ErasedComponent};

struct Slot {
    id: TypeId,
    name: &'static str,
    value: Box<dyn ErasedComponent>,
}

/// An entity: its dataset index and its typed components (at most one per type).
pub struct Sample {
    index: u64,
    slots: Vec<Slot>,
}

impl Clone for Sample {
    fn clone(&self) -> Self {
        Sample {
            index: self.index,
            slots: self
                .slots
                .iter()
                .map(|s| Slot {
                    id: s.id,
                    name: s.name,
                    value: s.value.clone_box(),
                })
                .collect(),
        }
    }
}

impl std::fmt::Debug for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sample")
            .field("index", &self.index)
            .field(
                "components",
                &self.slots.iter().map(|s| s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Sample {
    /// An empty sample for dataset index `index`.
    pub fn new(index: u64) -> Self {
        Sample {
            index,
            slots: Vec::with_capacity(4),
        }
    }

    /// The dataset index of this sample.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Inserts `value`, replacing a component of the same type.
    pub fn insert<T: Component>(&mut self, value: T) {
        let id = TypeId::of::<T>();
        if let Some(slot) = self.slots.iter_mut().find(|s| s.id == id) {
            slot.value = Box::new(value);
        } else {
            self.slots.push(Slot {
                id,
                name: short_type_name(std::any::type_name::<T>()),
                value: Box::new(value),
            });
        }
    }

    /// A reference to the component of type `T`.
    pub fn get<T: Component>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.slots
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.value.as_any().downcast_ref())
    }

    /// A mutable reference to the component of type `T`.
    pub fn get_mut<T: Component>(&mut self) -> Option<&mut T> {
        let id = TypeId::of::<T>();
        self.slots
            .iter_mut()
            .find(|s| s.id == id)
            .and_then(|s| s.value.as_any_mut().downcast_mut())
    }

    /// Whether the sample carries a component of type `T`.
    pub fn contains<T: Component>(&self) -> bool {
        let id = TypeId::of::<T>();
        self.slots.iter().any(|s| s.id == id)
    }

    /// Removes and returns the component of type `T`.
    pub fn take<T: Component>(&mut self) -> Option<T> {
        let id = TypeId::of::<T>();
        let pos = self.slots.iter().position(|s| s.id == id)?;
        let slot = self.slots.swap_remove(pos);
        slot.value.into_any().downcast().ok().map(|b| *b)
    }

    /// Total bytes held by the components (for the byte budget).
    pub fn nbytes(&self) -> usize {
        self.slots.iter().map(|s| s.value.nbytes()).sum()
    }

    /// `(short type name, summary)` for each component, in insertion order.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        self.slots
            .iter()
            .map(|s| (s.name, s.value.describe()))
            .collect()
    }
}
