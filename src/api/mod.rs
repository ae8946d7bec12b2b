//! The custom resources kbind reads and writes, in the spec's vocabulary.
//!
//! Each group lives in its own module; `keys` holds every label, annotation and finalizer so no
//! pass spells a key twice.

pub mod binding_key;
pub mod catalog;
pub mod conditions;
pub mod core;
pub mod iam;
pub mod kcp;
pub mod keys;
pub mod providers;
pub mod relsync;

pub use binding_key::BindingKey;
/// The status of a condition, as metav1.Condition spells it.
pub use conditions::{ConditionStatus, Conditions};
