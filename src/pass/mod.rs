//! The pass framework every job shares: one bounded pass (observe → plan → apply → record),
//! guarded by a Lease, limited by a budget and a deadline, reported as one summary line.

pub mod args;
pub mod backoff;
pub mod budget;
pub mod client;
pub mod concurrency;
#[cfg(feature = "crash-points")]
pub mod crash;
pub mod descriptor;
pub mod duration;
pub mod error;
pub mod events;
pub mod finalizer;
pub mod lease;
pub mod list;
pub mod metrics;
mod page_items;
pub mod poison;
pub mod progress;
pub mod retry;
pub mod runner;
pub mod shard;
pub mod status;
pub mod status_code;
pub mod summary;
pub mod sweep;
pub mod walk;
pub mod writes;

pub use args::{CommonArgs, OutputFormat};
pub use budget::Budget;
pub use error::PassError;
pub use runner::{PassContext, run};
pub use shard::Shard;
pub use status_code::StatusCode;
pub use summary::{Outcome, PlannedWrite, Stopped, Summary};

/// Lock `m`, recovering from poisoning: a task that panicked holding it must not wedge the pass.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
