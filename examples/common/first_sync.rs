//! What the time-to-first-sync benchmarks share (`bench_first_sync`, `bench_first_sync_service`).

use std::time::{Duration, Instant};

use serde_json::Value;

/// A number from the environment, or `default`.
pub fn number(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Poll `f` every 100 ms until it gives a value; panics naming `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Seconds from applying a binding to its object on the provider, scaled to a 60 s period:
/// the wait for the next tick and every whole period after it scale with the period; the rest
/// (the passes' own work, the apiserver establishing a CRD, a look of the first-sync window)
/// does not, so it is kept as measured.
pub fn scaled(took: Duration, applied: Duration, period: Duration) -> f64 {
    let p = period.as_secs_f64();
    let wait = p - applied.as_secs_f64() % p;
    // Up before the next tick: the runs already under way at this one took it (a binding
    // applied just after a tick, seen by that tick's schema and resync's window).
    if took.as_secs_f64() <= wait {
        return took.as_secs_f64();
    }
    let rest = took.as_secs_f64() - wait;
    let whole = (rest / p).floor();
    (wait + whole * p) * 60.0 / p + (rest - whole * p)
}

/// The `p` percentile of `v` (nearest rank).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let at = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[at.min(v.len() - 1)]
}

/// Requests and writes of one run.
#[derive(Default, Clone, Copy)]
pub struct Cost {
    pub requests: u64,
    pub writes: u64,
}

/// The cost of a run, from its summary.
pub fn cost(s: &Value) -> Cost {
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    Cost {
        requests: n("requests"),
        writes: n("data_writes") + n("bookkeeping_writes"),
    }
}
