//! kbind's integration tests, one module per area, built as one test binary: the 5,300 lines of
//! `support` are compiled once instead of once per area, there is one link instead of 26, and the
//! areas' tests share the test threads instead of waiting for each other binary by binary
//! (docs/testing.md "One test binary"). `tests/unscoped.rs` stays a binary of its own: its
//! tests wait for every other server test process to exit (`support::unscoped_lock`).
//!
//! One area: `cargo test --features servers --test suite <area>::`, e.g. `model::`.

#[path = "support/relsync_fx.rs"]
mod relsync_fx;
mod support;

mod bind;
mod claims;
mod crds;
mod deploy;
mod docs;
mod faults;
mod flow;
mod framework;
mod hostile;
mod image;
mod install;
mod issue;
mod kcp;
mod layering;
mod lease;
mod metrics;
mod model;
mod node;
mod operator;
mod relsync;
mod resync;
mod schema;
mod servers;
mod status;
mod uninstall;
mod visibility;
