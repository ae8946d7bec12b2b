//! A loopback proxy that injects faults, at a configured rate, between kbind and a real server
//! (an apiserver, the SpiceDB gateway, the Slack or SCIM stand-in). Tests point kbind at the
//! proxy's plain-HTTP URL; the proxy forwards to the upstream (HTTPS with any certificate, since
//! it only ever talks to loopback servers the harness started).
//!
//! The faults are the ones a pass meets in production, and where each strikes matters: a 500,
//! 503 or 429 answered by the proxy means the upstream never saw the request (a load balancer, an
//! overloaded apiserver); a stall, a truncated body or a late reset happens *after* the upstream
//! acted, so the client cannot know whether its write landed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use super::lock;

/// One kind of injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Injected {
    /// 500 from the proxy; the upstream never saw the request.
    Internal,
    /// 503 from the proxy; the upstream never saw the request.
    Unavailable,
    /// 429 with `Retry-After: 1`; the upstream never saw the request.
    TooMany,
    /// The connection is reset before the request is forwarded.
    ResetBefore,
    /// The request is forwarded, then the connection is reset instead of answering.
    ResetAfter,
    /// The request is forwarded, then nothing comes back until the client gives up.
    Stall,
    /// The request is forwarded; the response promises its full length and stops half-way.
    Truncated,
    /// The request is forwarded; the response arrives, late.
    Slow,
}

impl Injected {
    pub const ALL: [Injected; 8] = [
        Injected::Internal,
        Injected::Unavailable,
        Injected::TooMany,
        Injected::ResetBefore,
        Injected::ResetAfter,
        Injected::Stall,
        Injected::Truncated,
        Injected::Slow,
    ];
}

/// How often and how hard to misbehave.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Fraction of requests that get a fault (0.05 = 5%).
    pub rate: f64,
    /// Seed of the fault sequence, printed by tests. The same seed gives the same sequence of
    /// draws; with concurrent requests, which request meets which draw can still differ.
    pub seed: u64,
    /// Faults to choose from, uniformly.
    pub kinds: Vec<Injected>,
    /// How long a stall lasts before the proxy closes the connection (longer than the client's
    /// request timeout).
    pub stall: Duration,
    /// Delay of a slow response (shorter than the client's request timeout).
    pub slow: Duration,
    /// API groups the upstream is made to look as if it did not serve: a request under
    /// `/apis/<group>` is forwarded with the group renamed to one no server has, so the real
    /// upstream answers as a cluster without that group's CRDs would (a 404). Discovery
    /// (`/apis`) still lists them.
    pub hidden_groups: Vec<String>,
    /// Added to every request before it is forwarded (also to injected answers): a network's
    /// round trip between a job and its apiserver, for benchmarks (`BENCH_LATENCY`).
    pub delay: Duration,
}

impl FaultConfig {
    pub fn rate(rate: f64, seed: u64) -> Self {
        Self {
            rate,
            seed,
            kinds: Injected::ALL.to_vec(),
            stall: Duration::from_secs(4),
            slow: Duration::from_millis(700),
            hidden_groups: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// No faults; every request delayed by `delay` (a fixed round trip).
    pub fn latency(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::rate(0.0, 1)
        }
    }
}

/// Requests the proxy answers itself with a 403 Status carrying `message`, whatever the rate: an
/// upstream whose error text quotes what it should not (a token, a signed URL), for tests that
/// follow such text to every place kbind could print it.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub method: http::Method,
    /// Matched against the request's path (query string included).
    pub path_contains: String,
    pub message: String,
}

/// What the proxy did, for the tests' figures.
#[derive(Debug, Default)]
pub struct FaultStats {
    requests: AtomicU64,
    /// Requests answered by a [`Refusal`].
    refused: AtomicU64,
    injected: std::sync::Mutex<BTreeMap<Injected, u64>>,
    /// Every distinct User-Agent a client sent (none: `""`).
    user_agents: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl FaultStats {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    pub fn injected(&self) -> BTreeMap<Injected, u64> {
        lock(&self.injected).clone()
    }
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
    pub fn total_injected(&self) -> u64 {
        lock(&self.injected).values().sum()
    }
    /// The distinct User-Agent headers seen so far (`""` for a request without one).
    pub fn user_agents(&self) -> std::collections::BTreeSet<String> {
        lock(&self.user_agents).clone()
    }
}

struct Proxy {
    upstream: String,
    refusal: Arc<std::sync::Mutex<Option<Refusal>>>,
    http: reqwest::Client,
    config: FaultConfig,
    /// The current rate as f64 bits: tests set up with faults off, then turn them on.
    rate: Arc<AtomicU64>,
    stats: Arc<FaultStats>,
    draws: AtomicU64,
    /// Requests met with faults on while none was injected yet (`u64::MAX` once one was): the
    /// first fault comes by the [`max_gap`]th request.
    since_fault: AtomicU64,
}

/// A running fault proxy; dropping it stops it.
pub struct FaultProxy {
    pub addr: SocketAddr,
    pub stats: Arc<FaultStats>,
    rate: Arc<AtomicU64>,
    refusal: Arc<std::sync::Mutex<Option<Refusal>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listen on 127.0.0.1 and forward to `upstream` (e.g. `https://127.0.0.1:6443`).
    pub async fn start(upstream: &str, config: FaultConfig) -> std::io::Result<Self> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(std::io::Error::other)?;
        let stats = Arc::new(FaultStats::default());
        let rate = Arc::new(AtomicU64::new(config.rate.to_bits()));
        let refusal = Arc::new(std::sync::Mutex::new(None));
        let proxy = Arc::new(Proxy {
            refusal: refusal.clone(),
            upstream: upstream.trim_end_matches('/').to_string(),
            http,
            config,
            rate: rate.clone(),
            stats: stats.clone(),
            draws: AtomicU64::new(0),
            since_fault: AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Closing with SO_LINGER 0 sends a reset, not a polite FIN.
                let _ = stream.set_zero_linger();
                let proxy = proxy.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let proxy = proxy.clone();
                        async move { proxy.handle(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            stats,
            rate,
            refusal,
            task,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Refuse the requests `refusal` names from the next request on (`None`: forward them again).
    pub fn refuse(&self, refusal: Option<Refusal>) {
        *lock(&self.refusal) = refusal;
    }

    /// Change the fault rate from the next request on.
    pub fn set_rate(&self, rate: f64) {
        self.rate.store(rate.to_bits(), Ordering::Relaxed);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why the proxy dropped a connection: an injected fault, or the upstream failing.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("injected {0}")]
    Injected(&'static str),
    #[error("upstream: {0}")]
    Upstream(String),
}

type ProxyBody = BoxBody<Bytes, ProxyError>;

fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

/// splitmix64: a reproducible sequence from the seed, no RNG dependency.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A JSON error body shaped like a Kubernetes Status (other clients just see JSON).
fn status_body(code: StatusCode, reason: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("injected fault: {reason}"), "reason": reason, "code": code.as_u16()});
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The most requests in a row without a fault at `rate`: ⌈1/rate⌉ (none when faults are off).
pub fn max_gap(rate: f64) -> Option<u64> {
    (rate > 0.0).then(|| (1.0 / rate.min(1.0)).ceil() as u64)
}

fn hop_by_hop(name: &header::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "host" | "upgrade"
    )
}

impl Proxy {
    /// A fault at the configured rate; and if the draws brought none by the [`max_gap`]th request,
    /// that one: a test that makes that many requests meets at least one fault whatever the
    /// draws (so a fault test cannot pass without faults), at one extra fault in all.
    fn draw(&self) -> Option<Injected> {
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let a = mix(self.config.seed ^ mix(n));
        let roll = (a >> 11) as f64 / (1u64 << 53) as f64;
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        let gap = max_gap(rate).filter(|_| !self.config.kinds.is_empty())?;
        let since = self.since_fault.load(Ordering::Relaxed);
        let due = since != u64::MAX && since + 1 >= gap;
        if roll >= rate && !due {
            if since != u64::MAX {
                self.since_fault.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        self.since_fault.store(u64::MAX, Ordering::Relaxed);
        let i = (mix(a) % self.config.kinds.len() as u64) as usize;
        self.config.kinds.get(i).copied()
    }

    async fn handle(&self, req: Request<Incoming>) -> Result<Response<ProxyBody>, ProxyError> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let agent = req
            .headers()
            .get(header::USER_AGENT)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        lock(&self.stats.user_agents).insert(agent);
        if !self.config.delay.is_zero() {
            tokio::time::sleep(self.config.delay).await;
        }
        if let Some(r) = self.refused(&req) {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": r.message, "reason": "Forbidden", "code": 403});
            let mut resp = Response::new(full(body.to_string()));
            *resp.status_mut() = StatusCode::FORBIDDEN;
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            return Ok(resp);
        }
        let fault = self.draw();
        if let Some(f) = fault {
            *lock(&self.stats.injected).entry(f).or_default() += 1;
        }
        match fault {
            Some(Injected::Internal) => {
                return Ok(status_body(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                ));
            }
            Some(Injected::Unavailable) => {
                return Ok(status_body(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                ));
            }
            Some(Injected::TooMany) => {
                let mut r = status_body(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests");
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                return Ok(r);
            }
            Some(Injected::ResetBefore) => return Err(ProxyError::Injected("reset")),
            _ => {}
        }
        let (status, headers, body) = self.forward(req).await?;
        match fault {
            Some(Injected::ResetAfter) => return Err(ProxyError::Injected("reset")),
            Some(Injected::Stall) => {
                tokio::time::sleep(self.config.stall).await;
                return Err(ProxyError::Injected("stall"));
            }
            Some(Injected::Slow) => tokio::time::sleep(self.config.slow).await,
            _ => {}
        }
        let truncated = fault == Some(Injected::Truncated) && body.len() > 1;
        let len = body.len();
        let out = if truncated {
            let half = body.slice(..len / 2);
            let frames: Vec<Result<Frame<Bytes>, ProxyError>> = vec![
                Ok(Frame::data(half)),
                Err(ProxyError::Injected("truncation")),
            ];
            StreamBody::new(futures::stream::iter(frames)).boxed()
        } else {
            full(body)
        };
        let mut resp = Response::new(out);
        *resp.status_mut() = status;
        for (k, v) in &headers {
            if !hop_by_hop(k) {
                resp.headers_mut().append(k.clone(), v.clone());
            }
        }
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
        Ok(resp)
    }

    /// The refusal that answers `req`, if one is set and matches it.
    fn refused(&self, req: &Request<Incoming>) -> Option<Refusal> {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        lock(&self.refusal)
            .as_ref()
            .filter(|r| r.method == req.method() && path.contains(&r.path_contains))
            .cloned()
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), ProxyError> {
        let up = |e: &dyn std::fmt::Display| ProxyError::Upstream(e.to_string());
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map_err(|e| up(&e))?.to_bytes();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let path = hide_groups(path, &self.config.hidden_groups);
        let mut out = self
            .http
            .request(parts.method.clone(), format!("{}{path}", self.upstream))
            .body(body);
        for (k, v) in &parts.headers {
            if !hop_by_hop(k) {
                out = out.header(k, v);
            }
        }
        let resp = out.send().await.map_err(|e| up(&e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| up(&e))?;
        Ok((status, headers, bytes))
    }
}

/// `path` with a hidden group renamed to one no server serves (see `FaultConfig::hidden_groups`).
fn hide_groups(path: &str, hidden: &[String]) -> String {
    for g in hidden {
        let prefix = format!("/apis/{g}");
        if let Some(rest) = path.strip_prefix(&prefix)
            && (rest.is_empty() || rest.starts_with('/') || rest.starts_with('?'))
        {
            return format!("/apis/{g}.hidden.invalid{rest}");
        }
    }
    path.to_string()
}

/// `kubeconfig` (its text) aimed at `url`, a proxy of this module, instead of its own server: the
/// proxy speaks plain HTTP on loopback, so the CA goes too. The credentials stay as they are.
pub fn kubeconfig_via(kubeconfig: &str, url: &str) -> String {
    let without_ca: Vec<&str> = kubeconfig
        .lines()
        .filter(|l| !l.trim_start().starts_with("certificate-authority-data:"))
        .collect();
    with_server(&without_ca.join("\n"), url)
}

/// `kubeconfig` (its text) with its cluster's `server:` replaced by `server`, everything else
/// (CA, credentials) as it is: a kubeconfig that points somewhere else, for tests of what kbind
/// does with it.
pub fn with_server(kubeconfig: &str, server: &str) -> String {
    kubeconfig
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                format!("    server: {server}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_groups_are_renamed_and_nothing_else() {
        let hidden = vec!["core.kbind.io".to_string()];
        assert_eq!(
            hide_groups("/apis/core.kbind.io/v1alpha1/connections?limit=5", &hidden),
            "/apis/core.kbind.io.hidden.invalid/v1alpha1/connections?limit=5"
        );
        for same in ["/apis/core.kbind.iox/v1", "/api/v1/pods", "/apis"] {
            assert_eq!(hide_groups(same, &hidden), same);
        }
    }

    #[test]
    fn the_rate_is_honoured_and_every_kind_is_drawn() {
        crate::install_crypto_provider();
        let p = Proxy {
            upstream: String::new(),
            refusal: Arc::default(),
            http: reqwest::Client::new(),
            config: FaultConfig::rate(0.05, 7),
            rate: Arc::new(AtomicU64::new(0.05f64.to_bits())),
            stats: Arc::default(),
            draws: AtomicU64::new(0),
            since_fault: AtomicU64::new(0),
        };
        let mut seen = BTreeMap::new();
        let n = 20_000;
        for _ in 0..n {
            if let Some(f) = p.draw() {
                *seen.entry(f).or_insert(0u32) += 1;
            }
        }
        let total: u32 = seen.values().sum();
        assert!((800..1300).contains(&total), "about 5% of {n}: {total}");
        assert_eq!(seen.len(), Injected::ALL.len(), "{seen:?}");
    }

    #[test]
    fn the_first_fault_comes_by_the_gap_whatever_the_draws() {
        assert_eq!(max_gap(0.05), Some(20));
        assert_eq!(max_gap(0.3), Some(4));
        assert_eq!(max_gap(0.0), None);
        crate::install_crypto_provider();
        for seed in 0..200 {
            let p = Proxy {
                upstream: String::new(),
                refusal: Arc::default(),
                http: reqwest::Client::new(),
                config: FaultConfig::rate(0.05, seed),
                rate: Arc::new(AtomicU64::new(0.05f64.to_bits())),
                stats: Arc::default(),
                draws: AtomicU64::new(0),
                since_fault: AtomicU64::new(0),
            };
            let first = (1..=20).find(|_| p.draw().is_some());
            assert!(first.is_some(), "seed {seed}: no fault in 20 requests");
        }
    }
}
