//! kbind: batch reconcilers for cross-cluster API binding, permission-claim upkeep and
//! directory-to-SpiceDB sync, each one bounded pass run as a Kubernetes CronJob.

#![forbid(unsafe_code)]

pub mod api;
pub mod bindings;
pub mod claims;
pub mod cli;
pub mod connection;
pub mod crds;
pub mod pass;
pub mod relsync;
pub mod resync;
pub mod schema;
pub mod scrub;
pub mod secrets;
pub mod upstream;

/// Install ring as the process-wide rustls provider (reqwest is built without one so only ring
/// is linked). Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
