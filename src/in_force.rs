//! A value in force that a reload swaps whole: the policy, the SMS and
//! email texts. A request holds one `Arc` to the end, so it never sees half
//! of a reload. An `ArcSwap`, not a `RwLock`: reading takes no lock whose
//! reader count every worker writes.

use std::sync::Arc;

use arc_swap::ArcSwap;

/// The `T` in force.
pub struct InForce<T>(ArcSwap<T>);

impl<T> InForce<T> {
    /// Start with `value` in force.
    pub fn new(value: T) -> Self {
        Self(ArcSwap::from_pointee(value))
    }

    /// The value in force; a reload does not change the one returned.
    pub fn current(&self) -> Arc<T> {
        self.0.load_full()
    }

    /// Put `value` in force; requests under way keep the old one.
    pub fn replace(&self, value: T) {
        self.0.store(Arc::new(value));
    }
}

impl<T> std::fmt::Debug for InForce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InForce").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_held_outlives_its_replacement() {
        let cell = InForce::new(String::from("old"));
        let held = cell.current();
        cell.replace(String::from("new"));
        assert_eq!(*held, "old");
        assert_eq!(*cell.current(), "new");
    }
}
