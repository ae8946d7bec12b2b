//! Local stand-ins for Slack and a SCIM bridge, faithful to the documented behaviour kbind must
//! survive (cursor pages that run short or empty while more remain, `ok:false` errors, the three
//! throttle shapes, SCIM ListResponse quirks), a kcp front for a plain apiserver, and a
//! fault-injecting proxy. Used by kbind's tests, benchmarks and demo; never in a job: kbind has
//! this crate as a dev-dependency only, and this crate does not depend on kbind.

#![forbid(unsafe_code)]

pub mod faults;
pub mod kcp;
pub mod pushgateway;
pub mod scim;
pub mod slack;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// One injected misbehaviour, consumed by the next matching request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 429 with `Retry-After: secs`, or without the header.
    TooManyRequests { retry_after: Option<u64> },
    /// HTTP 200 `{"ok":false,"error":"ratelimited"}` (Slack's third shape).
    OkFalseRatelimited,
    /// HTTP 200 `{"ok":false,"error":<code>}`.
    OkFalse(String),
    /// HTTP status with a body (e.g. 500, or 401 with a SCIM error).
    Status(u16, String),
    /// HTTP status with raw bytes as the body, sent as is (e.g. a proxy's non-UTF-8 error
    /// page): no JSON, no SCIM error envelope.
    Bytes(u16, Vec<u8>),
}

/// Knobs and counters shared by a fake's handlers.
#[derive(Debug, Default)]
pub struct Control {
    /// Faults keyed by method (Slack method name or SCIM path kind); `*` matches any.
    faults: BTreeMap<String, VecDeque<Fault>>,
    calls: BTreeMap<String, u64>,
    /// First and last call per method, for achieved-rate figures.
    spans: BTreeMap<String, (std::time::Instant, std::time::Instant)>,
    /// Requests refused by tier-limit emulation, per method.
    tier_rejections: BTreeMap<String, u64>,
    /// Authorization headers seen, to assert what a client sent where.
    pub seen_auth: Vec<String>,
    /// The largest page size a client asked for (Slack `limit`, SCIM `count`).
    pub largest_page_asked: u64,
}

impl Control {
    pub fn push_fault(&mut self, method: &str, fault: Fault) {
        self.faults
            .entry(method.to_string())
            .or_default()
            .push_back(fault);
    }

    fn next_fault(&mut self, method: &str) -> Option<Fault> {
        for key in [method, "*"] {
            if let Some(f) = self.faults.get_mut(key).and_then(VecDeque::pop_front) {
                return Some(f);
            }
        }
        None
    }

    fn count(&mut self, method: &str) {
        *self.calls.entry(method.to_string()).or_default() += 1;
        let now = std::time::Instant::now();
        self.spans
            .entry(method.to_string())
            .and_modify(|s| s.1 = now)
            .or_insert((now, now));
    }

    /// Time between the first and the last call of `method`.
    pub fn span(&self, method: &str) -> std::time::Duration {
        self.spans
            .get(method)
            .map(|(a, b)| b.duration_since(*a))
            .unwrap_or_default()
    }

    /// Requests of `method` refused by the tier-limit emulation (429).
    pub fn tier_rejections(&self, method: &str) -> u64 {
        self.tier_rejections.get(method).copied().unwrap_or(0)
    }

    pub fn total_tier_rejections(&self) -> u64 {
        self.tier_rejections.values().sum()
    }

    fn asked_page(&mut self, n: u64) {
        self.largest_page_asked = self.largest_page_asked.max(n);
    }

    pub fn calls(&self, method: &str) -> u64 {
        self.calls.get(method).copied().unwrap_or(0)
    }

    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }
}

static SPACES: [u8; 64 << 10] = [b' '; 64 << 10];

/// A hostile response body made on the fly and never held whole by the fake: `head`, then
/// JSON whitespace until the body is `bytes` long, then `tail` — a valid JSON document of any
/// size. It is sent `chunk` bytes at a time, one chunk every `every` (zero: as fast as the client
/// reads), so it can be a slow drip, a huge body, or both. No `Content-Length` unless
/// `declare_length`.
#[derive(Clone, Debug)]
pub struct Generated {
    pub bytes: u64,
    pub chunk: usize,
    pub every: std::time::Duration,
    pub declare_length: bool,
}

impl Generated {
    /// `bytes` as fast as the client reads them.
    pub fn huge(bytes: u64) -> Self {
        Self {
            bytes,
            chunk: 64 << 10,
            every: std::time::Duration::ZERO,
            declare_length: false,
        }
    }

    /// `bytes` at about `per_second` bytes a second, in 64 KiB chunks.
    pub fn drip(bytes: u64, per_second: u64) -> Self {
        let chunk = 64u64 << 10;
        Self {
            bytes,
            chunk: chunk as usize,
            every: std::time::Duration::from_secs_f64(chunk as f64 / per_second.max(1) as f64),
            declare_length: false,
        }
    }

    /// The body: `head`, whitespace, `tail`.
    pub(crate) fn response(
        &self,
        content_type: &str,
        head: String,
        tail: String,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        let head = bytes::Bytes::from(head);
        let tail = bytes::Bytes::from(tail);
        let total = self.bytes.max((head.len() + tail.len()) as u64);
        let chunk = self.chunk.max(1) as u64;
        let every = self.every;
        let fill_end = total - tail.len() as u64;
        let stream = futures::stream::unfold(0u64, move |sent| {
            let (head, tail) = (head.clone(), tail.clone());
            async move {
                if sent >= total {
                    return None;
                }
                if !every.is_zero() {
                    tokio::time::sleep(every).await;
                }
                let end = (sent + chunk).min(total);
                let h = head.len() as u64;
                let piece = if sent >= h && end <= fill_end && end - sent <= SPACES.len() as u64 {
                    bytes::Bytes::from_static(&SPACES[..(end - sent) as usize])
                } else {
                    let mut out = Vec::with_capacity((end - sent) as usize);
                    if sent < h {
                        out.extend_from_slice(&head[sent as usize..end.min(h) as usize]);
                    }
                    let (fs, fe) = (sent.max(h), end.min(fill_end));
                    if fe > fs {
                        out.resize(out.len() + (fe - fs) as usize, b' ');
                    }
                    let ts = sent.max(fill_end);
                    if end > ts {
                        out.extend_from_slice(
                            &tail[(ts - fill_end) as usize..(end - fill_end) as usize],
                        );
                    }
                    bytes::Bytes::from(out)
                };
                Some((Ok::<_, std::convert::Infallible>(piece), end))
            }
        });
        let mut r = (
            [(axum::http::header::CONTENT_TYPE, content_type.to_string())],
            axum::body::Body::from_stream(stream),
        )
            .into_response();
        if self.declare_length {
            r.headers_mut()
                .insert(axum::http::header::CONTENT_LENGTH, total.into());
        }
        r
    }
}

/// Install ring as the process-wide rustls provider, as kbind does (reqwest is built without
/// one). Idempotent.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Lock a mutex, recovering from poisoning (a panicked handler must not wedge the fake).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running fake server; dropping the handle stops it.
pub struct Running<S> {
    pub addr: SocketAddr,
    pub state: Arc<S>,
    task: tokio::task::JoinHandle<()>,
}

impl<S> Running<S> {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn serve<S: Send + Sync + 'static>(
    router: axum::Router,
    state: Arc<S>,
    port: u16,
) -> std::io::Result<Running<S>> {
    serve_at(router, state, SocketAddr::from(([127, 0, 0, 1], port))).await
}

/// [`serve`] on another address: the real node's namespace (`kbind-fake-upstreams --host`).
pub(crate) async fn serve_at<S: Send + Sync + 'static>(
    router: axum::Router,
    state: Arc<S>,
    addr: SocketAddr,
) -> std::io::Result<Running<S>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(Running { addr, state, task })
}
