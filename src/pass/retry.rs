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
                let attempt_fut = async {
                    let s = svc.ready().await.map_err(Into::into)?;
                    let resp = s.call(this).await.map_err(Into::into)?;
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
                    let collected = http_body_util::Limited::new(body, policy.max_body)
                        .collect()
                        .await;
                    Ok::<_, BoxError>((status, retry_after, parts, collected))
                };
                let result = match attempt_bound(LIMITS.get(), Instant::now()) {
                    Some(bound) => match tokio::time::timeout(bound, attempt_fut).await {
                        Ok(r) => r,
                        Err(_) => Err(format!(
                            "no complete answer within {bound:?} (--request-timeout, or the pass deadline)"
                        )
                        .into()),
                    },
                    None => attempt_fut.await,
                };
                let result =
                    result.map(|(st, ra, parts, body)| (st, ra, parts, body.map(|b| b.to_bytes())));
                let (verdict, outcome) = match result {
                    Ok((status, _, _, Ok(b)))
                        if status.is_success()
                            && limit.is_some_and(|n| page_items::more_than(&b, n)) =>
                    {
                        let n = limit.unwrap_or_default();
                        (Verdict::Done, Err(Refused::TooManyItems(n).into()))
                    }
                    Ok((status, retry_after, parts, Ok(b))) => (
                        policy.verdict(&method, Some(status), retry_after.as_deref(), attempt),
                        Ok(Response::from_parts(parts, Body::from(b))),
                    ),
                    Ok((_, _, _, Err(e))) => {
                        if e.is::<http_body_util::LengthLimitError>() {
                            (
                                Verdict::Done,
                                Err(Refused::TooLarge(policy.max_body).into()),
                            )
                        } else {
                            (policy.verdict(&method, None, None, attempt), Err(e))
                        }
                    }
                    Err(e) => (policy.verdict(&method, None, None, attempt), Err(e)),
                };
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
mod tests {
    use super::*;

    const GET: Method = Method::GET;
    const POST: Method = Method::POST;
    const PATCH: Method = Method::PATCH;

    #[test]
    fn verdicts() {
        let p = Policy::default();
        let s = |c: u16| Some(StatusCode::from_u16(c).unwrap());
        let ms = Duration::from_millis;
        // `None`: done; `Some((lo, hi))`: retried after a wait in [lo, hi] (the backoff is
        // jittered: half a step to a step).
        type Case<'a> = (
            &'a str,
            Method,
            Option<StatusCode>,
            Option<&'a str>,
            u32,
            Option<(Duration, Duration)>,
        );
        let first = Some((ms(100), ms(200)));
        let cases: Vec<Case> = vec![
            ("ok read", GET, s(200), None, 0, None),
            ("not found", GET, s(404), None, 0, None),
            ("conflict write", PATCH, s(409), None, 0, None),
            ("429 write", PATCH, s(429), None, 0, first),
            (
                "429 honours Retry-After",
                POST,
                s(429),
                Some("2"),
                0,
                Some((ms(2000), ms(2000))),
            ),
            (
                "Retry-After capped",
                GET,
                s(503),
                Some("3600"),
                0,
                Some((ms(5000), ms(5000))),
            ),
            (
                "unparsable Retry-After falls back to backoff",
                GET,
                s(503),
                Some("soon"),
                2,
                Some((ms(400), ms(800))),
            ),
            ("500 read", GET, s(500), None, 1, Some((ms(200), ms(400)))),
            ("500 write: outcome unknown", POST, s(500), None, 0, None),
            ("reset read", GET, None, None, 0, first),
            ("reset write: outcome unknown", PATCH, None, None, 0, None),
            ("out of retries", GET, s(503), None, 4, None),
        ];
        for (what, m, st, ra, attempt, want) in cases {
            for _ in 0..20 {
                match (p.verdict(&m, st, ra, attempt), want) {
                    (Verdict::Done, None) => {}
                    (Verdict::RetryAfter(w), Some((lo, hi))) => {
                        assert!(lo <= w && w <= hi, "{what}: {w:?} not in [{lo:?}, {hi:?}]")
                    }
                    (got, want) => panic!("{what}: {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn backoff_is_capped() {
        let p = Policy::default();
        for attempt in [0, 3, 10, 40] {
            let w = p.backoff().wait(attempt, None);
            assert!(w <= Duration::from_secs(5), "{attempt}: {w:?}");
            assert!(w >= Duration::from_millis(100), "{attempt}: {w:?}");
        }
        assert_eq!(p.backoff().step(40), Duration::from_secs(5));
    }

    fn fast() -> RetryLayer {
        RetryLayer(Policy {
            retries: 2,
            base: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            max_body: 1024,
        })
    }

    #[test]
    fn attempts_and_waits_end_by_the_deadline() {
        let now = Instant::now();
        let l = Limits {
            deadline: now + Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
        };
        assert_eq!(
            attempt_bound(None, now),
            None,
            "no pass: kube's own timeouts only"
        );
        assert_eq!(
            attempt_bound(Some(&l), now),
            Some(Duration::from_secs(40)),
            "cut to the deadline plus its grace"
        );
        let late = now + Duration::from_secs(35);
        assert_eq!(attempt_bound(Some(&l), late), Some(Duration::from_secs(5)));
        let early = Limits {
            request_timeout: Duration::from_secs(2),
            ..l
        };
        assert_eq!(
            attempt_bound(Some(&early), now),
            Some(Duration::from_secs(2))
        );
        assert!(!wait_crosses_deadline(
            Some(&l),
            now,
            Duration::from_secs(5)
        ));
        assert!(wait_crosses_deadline(
            Some(&l),
            late,
            Duration::from_millis(1)
        ));
        assert!(!wait_crosses_deadline(
            None,
            late,
            Duration::from_secs(3600)
        ));
    }

    #[tokio::test]
    async fn a_body_over_the_cap_fails_once_and_is_not_retried() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut svc = fast().layer(mock);
        let get = Request::get("/openapi/v3").body(Body::empty()).unwrap();
        let call = tokio::spawn(async move { svc.ready().await?.call(get).await });
        let (_, send) = handle.next_request().await.unwrap();
        send.send_response(Response::new(Body::from(vec![b'x'; 4096])));
        let err = call.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("larger than 1024 bytes"), "{err}");
        assert!(
            !matches!(
                tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await,
                Ok(Some(_))
            ),
            "not sent again"
        );
    }

    #[tokio::test]
    async fn a_dropped_read_is_retried_and_a_dropped_write_is_not() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut svc = fast().layer(mock);
        let get = Request::get("/api/v1/namespaces")
            .body(Body::empty())
            .unwrap();
        let call = tokio::spawn(async move { svc.ready().await?.call(get).await });
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error("connection reset by peer");
        let (again, send) = handle.next_request().await.unwrap();
        assert_eq!(again.uri(), "/api/v1/namespaces", "the same request again");
        send.send_response(Response::new(Body::from(b"{}".to_vec())));
        let resp = call.await.unwrap().unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{}");

        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut svc = fast().layer(mock);
        let post = Request::post("/api/v1/namespaces")
            .body(Body::from(b"{\"kind\":\"Namespace\"}".to_vec()))
            .unwrap();
        let call = tokio::spawn(async move { svc.ready().await?.call(post).await });
        let (_, send) = handle.next_request().await.unwrap();
        send.send_error("connection reset by peer");
        let err = call.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("reset"), "{err}");
    }

    #[tokio::test]
    async fn a_throttled_write_is_sent_again_with_its_body() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut svc = fast().layer(mock);
        let patch = Request::patch("/apis/x/v1/things/a")
            .body(Body::from(b"{\"spec\":{}}".to_vec()))
            .unwrap();
        let call = tokio::spawn(async move { svc.ready().await?.call(patch).await });
        let (_, send) = handle.next_request().await.unwrap();
        let mut throttled = Response::new(Body::empty());
        *throttled.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        send.send_response(throttled);
        let (again, send) = handle.next_request().await.unwrap();
        let body = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"spec\":{}}");
        send.send_response(Response::new(Body::empty()));
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}
