//! A Prometheus Pushgateway stand-in: records every push (method, path, content type, body) and
//! answers 200 (or the status it is told to), so a test can check what a pass pushed where.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::routing::any;

use super::{Running, lock, serve};

/// One request as the stand-in received it.
#[derive(Clone, Debug)]
pub struct Push {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    pub body: String,
}

#[derive(Debug, Default)]
pub struct Pushgateway {
    pub pushes: Mutex<Vec<Push>>,
    /// Answer with this status instead of 200.
    pub status: Mutex<Option<u16>>,
    /// Hold each answer this long first (a Pushgateway that hangs).
    pub delay: Mutex<Option<std::time::Duration>>,
}

impl Pushgateway {
    pub fn pushes(&self) -> Vec<Push> {
        lock(&self.pushes).clone()
    }
}

/// Serve the stand-in on a loopback port of its own.
pub async fn start() -> std::io::Result<Running<Pushgateway>> {
    let state = Arc::new(Pushgateway::default());
    let router = Router::new()
        .fallback(any(record))
        .with_state(state.clone());
    serve(router, state, 0).await
}

async fn record(
    State(pg): State<Arc<Pushgateway>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |h| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    lock(&pg.pushes).push(Push {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        content_type: header(header::CONTENT_TYPE),
        authorization: header(header::AUTHORIZATION),
        body: String::from_utf8_lossy(&body).to_string(),
    });
    let delay = *lock(&pg.delay);
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let status = *lock(&pg.status);
    status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK)
}
