//! Bounded retries of transient failures for every Kubernetes client a pass builds.
//!
//! kube's built-in retry sleeps for whatever `Retry-After` a server sends (a confused proxy can
//! park a pass for an hour, past its deadline) and never retries a dropped connection or a body
//! cut off mid-read. A batch pass has a deadline and one shot per schedule, so this layer:
//! - retries 429 and 503 for every verb (the server refused the request before acting on it),
//!   honouring `Retry-After` up to [`Policy::max_delay`], else waiting the jittered
//!   [`Backoff`] schedule;
//! - retries reads (GET/HEAD) also on other 5xx (a 504 write may have landed), transport errors
//!   and truncated bodies, which it
//!   detects by reading the whole body before handing the response on (passes never watch);
//! - never retries a write whose outcome is unknown (a reset after sending a POST): that failure
//!   reaches the pass, which records it, and the next run observes what actually happened;
//! - bounds each attempt as a whole (connect, headers and body) by `--request-timeout`, and no
//!   attempt or wait outlives the pass deadline by more than [`DEADLINE_GRACE`] (the time a pass
//!   needs to record where it stopped);
//! - reads at most [`MAX_RESPONSE_BYTES`] of a body: a hostile server's endless LIST page or
//!   `/openapi/v3` document fails that request instead of exhausting the pod's memory.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::backoff::{self, Backoff, parse_retry_after};
use super::page_items;

/// The most a response body may hold. A body is decoded whole, to several times its size (a
/// CRD to some 50 times: docs/performance.md "Memory"), and a pass runs in 256 MiB; a LIST page
/// past it is asked for again in halves (src/pass/list.rs), so only a single object or an
/// OpenAPI document this large fails.
pub const MAX_RESPONSE_BYTES: usize = 32 << 20;

/// A response refused before it is decoded. Not transient: the same request would bring the
/// same answer, so it is never resent as is (a LIST asks again for smaller pages:
/// src/pass/list.rs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("response body larger than {0} bytes; refused")]
    TooLarge(usize),
    #[error(
        "the server returned more than {0} items in a page that asked for at most {0}; refused"
    )]
    TooManyItems(usize),
}

impl Refused {
    /// The refusal behind a client error, if that is what it is.
    pub fn of(e: &kube::Error) -> Option<&Refused> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(r) = c.downcast_ref::<Refused>() {
                return Some(r);
            }
            cause = c.source();
        }
        None
    }
}

/// The `limit` a LIST request asked for.
fn asked_limit(uri: &http::Uri) -> Option<usize> {
    uri.query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("limit="))?
        .parse()
        .ok()
}

/// How long past the pass deadline a request may still run: long enough to record status and
/// release the Lease, short enough that the CronJob's `activeDeadlineSeconds` never has to kill
/// the pod.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(10);

/// The pass's bounds, set once per process by the runner (one process is one pass).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// When the pass deadline falls.
    pub deadline: Instant,
    /// `--request-timeout`: the most one attempt may take, start to last body byte.
    pub request_timeout: Duration,
}

static LIMITS: OnceLock<Limits> = OnceLock::new();

/// 429s this process has received, from any server: the write limiter halves its in-flight
/// limit when this grows (src/pass/concurrency.rs).
static THROTTLED: AtomicU64 = AtomicU64::new(0);

/// How many 429 responses this process has received so far.
pub fn throttled() -> u64 {
    THROTTLED.load(Ordering::Relaxed)
}

/// Record the pass's bounds for every client it builds (first call wins).
pub fn set_limits(limits: Limits) {
    let _ = LIMITS.set(limits);
}

/// How long the next attempt may take: `--request-timeout`, cut so it ends by the deadline plus
/// its grace.
fn attempt_bound(l: Option<&Limits>, now: Instant) -> Option<Duration> {
    let l = l?;
    let left = (l.deadline + DEADLINE_GRACE).saturating_duration_since(now);
    Some(l.request_timeout.min(left).max(Duration::from_millis(100)))
}

/// Whether waiting `wait` and trying again would start an attempt past the deadline.
fn wait_crosses_deadline(l: Option<&Limits>, now: Instant, wait: Duration) -> bool {
    backoff::crosses(l.map(|l| l.deadline), now, wait)
}

/// How many times and how long to retry.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// First backoff step; doubles per retry (each wait jittered, see [`Backoff`]).
    pub base: Duration,
    /// Cap on any one wait, `Retry-After` included.
    pub max_delay: Duration,
    /// The most a response body may hold.
    pub max_body: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            retries: 4,
            base: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_body: MAX_RESPONSE_BYTES,
        }
    }
}

/// What to do after one attempt.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Done,
    RetryAfter(Duration),
}

impl Policy {
    fn backoff(&self) -> Backoff {
        Backoff::new(self.base, self.max_delay)
    }

    /// The decision for a response status (`None` for a transport error or a cut-off body).
    fn verdict(
        &self,
        method: &Method,
        status: Option<StatusCode>,
        retry_after: Option<&str>,
        attempt: u32,
    ) -> Verdict {
        if attempt >= self.retries {
            return Verdict::Done;
        }
        let read = method == Method::GET || method == Method::HEAD;
        let retry = match status {
            None => read,
            Some(s) => {
                matches!(
                    s,
                    StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
                ) || (read && s.is_server_error())
            }
        };
        if !retry {
            return Verdict::Done;
        }
        Verdict::RetryAfter(self.backoff().wait(attempt, parse_retry_after(retry_after)))
    }
}

/// Tower layer applying [`Policy`]; the inner service must be cheap to clone (a `Buffer`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryLayer(pub Policy);

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;
    fn layer(&self, inner: S) -> Retry<S> {
        Retry {
            inner,
            policy: self.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Retry<S> {
    inner: S,
    policy: Policy,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<Body>> for Retry<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The clone is not ready; the one polled ready is taken for the first attempt.
        let clone = self.inner.clone();
        let mut svc = std::mem::replace(&mut self.inner, clone);
        let policy = self.policy;
        Box::pin(async move {
            let method = req.method().clone();
            let limit = asked_limit(req.uri()).filter(|_| method == Method::GET);
            let mut attempt = 0;
            let mut req = Some(req);
            loop {
                // A body that cannot be cloned (a stream) gets exactly one attempt.
                let this = req.take().ok_or("request consumed")?;
                let again = clone_request(&this);
                let answer = attempt_once(&mut svc, this, policy.max_body).await;
                let (verdict, outcome) = judge(&policy, &method, limit, attempt, answer);
                let verdict = match verdict {
                    Verdict::RetryAfter(wait)
                        if wait_crosses_deadline(LIMITS.get(), Instant::now(), wait) =>
                    {
                        Verdict::Done
                    }
                    v => v,
                };
                match (verdict, again) {
                    (Verdict::RetryAfter(wait), Some(next)) => {
                        tracing::debug!(%method, attempt, ?wait, "transient failure; retrying");
                        tokio::time::sleep(wait).await;
                        attempt += 1;
                        req = Some(next);
                    }
                    _ => return outcome,
                }
            }
        })
    }
}

/// One attempt's answer: its status, `Retry-After`, head, and body (read whole, up to the limit).
type Answer = (
    StatusCode,
    Option<String>,
    http::response::Parts,
    Result<Bytes, BoxError>,
);

/// Send one attempt and read its whole body, within the attempt's time bound.
async fn attempt_once<S, B>(
    svc: &mut S,
    req: Request<Body>,
    max_body: usize,
) -> Result<Answer, BoxError>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let attempt = async {
        let s = svc.ready().await.map_err(Into::into)?;
        let resp = s.call(req).await.map_err(Into::into)?;
        let status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            THROTTLED.fetch_add(1, Ordering::Relaxed);
        }
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let (parts, body) = resp.into_parts();
        let collected = http_body_util::Limited::new(body, max_body).collect().await;
        Ok::<_, BoxError>((status, retry_after, parts, collected.map(|b| b.to_bytes())))
    };
    match attempt_bound(LIMITS.get(), Instant::now()) {
        Some(bound) => match tokio::time::timeout(bound, attempt).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no complete answer within {bound:?} (--request-timeout, or the pass deadline)"
            )
            .into()),
        },
        None => attempt.await,
    }
}

/// What an attempt's answer means: whether to try again, and what the caller gets if not.
fn judge(
    policy: &Policy,
    method: &Method,
    limit: Option<usize>,
    attempt: u32,
    answer: Result<Answer, BoxError>,
) -> (Verdict, Result<Response<Body>, BoxError>) {
    match answer {
        Ok((status, _, _, Ok(b)))
            if status.is_success() && limit.is_some_and(|n| page_items::more_than(&b, n)) =>
        {
            let n = limit.unwrap_or_default();
            (Verdict::Done, Err(Refused::TooManyItems(n).into()))
        }
        Ok((status, retry_after, parts, Ok(b))) => (
            policy.verdict(method, Some(status), retry_after.as_deref(), attempt),
            Ok(Response::from_parts(parts, Body::from(b))),
        ),
        Ok((_, _, _, Err(e))) => {
            if e.is::<http_body_util::LengthLimitError>() {
                (
                    Verdict::Done,
                    Err(Refused::TooLarge(policy.max_body).into()),
                )
            } else {
                (policy.verdict(method, None, None, attempt), Err(e))
            }
        }
        Err(e) => (policy.verdict(method, None, None, attempt), Err(e)),
    }
}

fn clone_request(req: &Request<Body>) -> Option<Request<Body>> {
    let body = req.body().try_clone()?;
    let mut out = Request::new(body);
    *out.method_mut() = req.method().clone();
    *out.uri_mut() = req.uri().clone();
    *out.version_mut() = req.version();
    *out.headers_mut() = req.headers().clone();
    *out.extensions_mut() = req.extensions().clone();
    Some(out)
}

#[cfg(test)]
mod tests;
