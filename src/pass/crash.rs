//! Test-only crash knobs: with `KBIND_CRASH_AFTER_WRITES=N` the process aborts right after its
//! Nth data write, and with `KBIND_CRASH_AT_ITEM=<item>` as it starts work on that root object
//! (`Connection/<name>`), so crash-point and poison tests can stop a real run at a chosen
//! moment; an abort skips every destructor, which is the point. Compiled only with the `crash-points` feature, which
//! only kbind's own dev-dependency on itself enables (Cargo.toml): `cargo build --bin kbind`,
//! release or not, contains no knob (hack/test.sh checks the binary's strings).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
static WRITES: AtomicU64 = AtomicU64::new(0);

pub const ENV: &str = "KBIND_CRASH_AFTER_WRITES";

/// Record one data write; aborts the process when the knob says so.
pub fn data_write() {
    let n = WRITES.fetch_add(1, Ordering::SeqCst) + 1;
    let limit = LIMIT.get_or_init(|| std::env::var(ENV).ok().and_then(|v| v.parse().ok()));
    if limit.is_some_and(|l| n >= l) {
        eprintln!("kbind: {ENV}={n} reached, aborting (test crash point)");
        std::process::abort();
    }
}

pub const AT_ITEM_ENV: &str = "KBIND_CRASH_AT_ITEM";

/// Work on `item` starts; aborts the process when the knob names it.
pub fn entering(item: &str) {
    if std::env::var(AT_ITEM_ENV).is_ok_and(|v| v == item) {
        eprintln!("kbind: {AT_ITEM_ENV}={item} reached, aborting (test crash point)");
        std::process::abort();
    }
}
