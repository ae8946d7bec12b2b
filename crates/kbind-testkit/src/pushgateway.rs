//! A Pushgateway stand-in kept only for what a real Prometheus Pushgateway cannot be made to do:
//! hang on a push (a push bounded by `--request-timeout`), or answer a 5xx (a proxy or ingress
//! in front of it). What kbind pushes, where and how, and what a real Pushgateway keeps or
//! refuses, is checked against the real one (tests/metrics.rs, tests/support/pushgateway.rs;
//! docs/testing.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::any;

use super::{Running, lock, serve};

#[derive(Debug, Default)]
pub struct Pushgateway {
    /// Requests received (counted on arrival, before any delay).
    pushes: AtomicUsize,
    /// Answer with this status instead of 200.
    pub status: Mutex<Option<u16>>,
    /// Hold each answer this long first (a Pushgateway that hangs).
    pub delay: Mutex<Option<std::time::Duration>>,
}

impl Pushgateway {
    /// How many requests arrived.
    pub fn pushes(&self) -> usize {
        self.pushes.load(Ordering::SeqCst)
    }
}

/// Serve the stand-in on a loopback port of its own.
pub async fn start() -> std::io::Result<Running<Pushgateway>> {
    let state = Arc::new(Pushgateway::default());
    let router = Router::new()
        .fallback(any(answer))
        .with_state(state.clone());
    serve(router, state, 0).await
}

async fn answer(State(pg): State<Arc<Pushgateway>>) -> StatusCode {
    pg.pushes.fetch_add(1, Ordering::SeqCst);
    let delay = *lock(&pg.delay);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let status = *lock(&pg.status);
    status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK)
}
