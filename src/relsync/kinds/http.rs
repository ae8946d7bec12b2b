//! What every kind's requests share ([`Http`]) and the one way they read an upstream:
//! [`get_json`], a paced, bounded, resent-on-transient-failure GET; and the page bounds of a
//! listing (`pageSize`, `--max-pages`).

use std::time::Duration;

use reqwest::Url;
use serde_json::Value;

use super::KindError;
use crate::pass::backoff::{Backoff, parse_retry_after};
use crate::relsync::auth::Token;
use crate::relsync::limits::{Limits, MAX_PAGE_SIZE, show_duration};
use crate::relsync::ratelimit::Pacer;
use crate::upstream::{self, UpstreamError, read_capped, show_bytes};

/// What every kind's requests share: the client, the pacer (and through it the source's turn),
/// the token and the bounds.
pub(crate) struct Http {
    pub client: reqwest::Client,
    pub pacer: Pacer,
    pub token: Token,
    pub limits: Limits,
}

/// One page-size parameter as sent: the source's `pageSize`, between 1 and [`MAX_PAGE_SIZE`].
pub(crate) fn page_size(configured: u32) -> u32 {
    configured.clamp(1, MAX_PAGE_SIZE)
}

/// Counts the pages of one listing against `--max-pages`.
pub(crate) struct PageCount {
    n: usize,
    max: usize,
}

impl PageCount {
    pub fn new(limits: &Limits) -> Self {
        Self {
            n: 0,
            max: limits.max_pages.max(1),
        }
    }

    /// Count one more page about to be asked for; an error past the cap.
    pub fn next(&mut self, method: &str) -> Result<(), KindError> {
        if self.n >= self.max {
            return Err(KindError::TooManyPages {
                method: method.to_string(),
                message: format!(
                    "more than {} pages (--max-pages): the server keeps saying there is more",
                    self.max
                ),
            });
        }
        self.n += 1;
        Ok(())
    }
}

/// Resends of a read that failed in transit or met a 5xx.
const TRANSIENT_RETRIES: u32 = 3;
/// The waits before them: from 500 ms, doubling, jittered (see `pass::backoff`).
const RESEND_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(2));

/// A paced GET returning (HTTP status, JSON body), retrying the three throttle shapes. The
/// token rides in the Authorization header only; error text names the URL without its query.
///
/// Bounded (docs/relsync.md "Bounds"): each attempt, connect to the last byte of the body,
/// within `--request-timeout` (one that got no answer at all is resent like a dropped
/// connection; one whose body was still arriving is not); the body read only up to
/// `--max-response-bytes`; every attempt,
/// resend wait and rate-limit wait within the source's turn. A request the turn cuts off is
/// [`KindError::OutOfTime`], which stops the source (its cursor is kept) rather than failing it.
pub(crate) async fn get_json(
    http: &Http,
    method: &str,
    url: Url,
    slack_style: bool,
) -> Result<(u16, Value), KindError> {
    let mut bare = url.clone();
    bare.set_query(None);
    let get = Get { http, method, bare };
    let pacer = &http.pacer;
    let turn = pacer.turn();
    let limits = &http.limits;
    let mut attempt = 0;
    let mut transient = 0;
    loop {
        pacer.pace(method).await?;
        let started = tokio::time::Instant::now();
        let by = started + limits.request_timeout;
        let sent = http
            .client
            .get(url.clone())
            .bearer_auth(http.token.expose())
            .send();
        // No answer at all within the bound is a stall, resent like a dropped connection; an
        // answer whose body is still arriving at the bound (a drip) is not resent.
        let resp = tokio::select! {
            r = tokio::time::timeout_at(by, sent) => match r {
                Err(_) => {
                    let why = format!(
                        "no answer within --request-timeout {}",
                        show_duration(limits.request_timeout)
                    );
                    get.resend(&mut transient, why)?.await;
                    continue;
                }
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    get.resend(&mut transient, e.to_string())?.await;
                    continue;
                }
            },
            () = turn.over() => return Err(get.out_of_time()),
        };
        let status = resp.status().as_u16();
        if upstream::server_hiccup(status) && transient < TRANSIENT_RETRIES {
            get.resend(&mut transient, format!("HTTP {status}"))?.await;
            continue;
        }
        if upstream::throttled(status) {
            let ra = parse_retry_after(
                resp.headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            );
            pacer.throttled(method, attempt, ra).await?;
            attempt += 1;
            continue;
        }
        let Some(body) = get.body(resp, by, &mut transient).await? else {
            continue;
        };
        if slack_style
            && body.get("ok") == Some(&Value::Bool(false))
            && body.get("error").and_then(Value::as_str) == Some("ratelimited")
        {
            pacer.throttled(method, attempt, None).await?;
            attempt += 1;
            continue;
        }
        return Ok((status, body));
    }
}

/// One GET of [`get_json`]: what its attempts share, and the errors they end with (naming the
/// URL without its query).
struct Get<'a> {
    http: &'a Http,
    method: &'a str,
    bare: Url,
}

impl Get<'_> {
    fn out_of_time(&self) -> KindError {
        KindError::OutOfTime {
            method: self.method.to_string(),
            message: format!(
                "GET {}: cut off when this source's {} share of the pass deadline ran out",
                self.bare,
                show_duration(self.http.pacer.turn().share())
            ),
        }
    }

    fn timed_out(&self) -> KindError {
        KindError::TimedOut {
            method: self.method.to_string(),
            message: format!(
                "GET {}: no complete answer within --request-timeout {}",
                self.bare,
                show_duration(self.http.limits.request_timeout)
            ),
        }
    }

    /// Every request here is a read: one that failed in transit, or met a server error, is
    /// simply sent again, a few times, before it counts against its scope. The wait before a
    /// resend is taken only if the turn has time for it.
    fn resend(
        &self,
        transient: &mut u32,
        message: String,
    ) -> Result<tokio::time::Sleep, KindError> {
        let wait = RESEND_BACKOFF.wait(*transient, None);
        *transient += 1;
        if *transient > TRANSIENT_RETRIES {
            return Err(KindError::Transport {
                method: self.method.to_string(),
                message: format!("GET {}: {message}", self.bare),
            });
        }
        if self.http.pacer.turn().would_cross(wait) {
            return Err(self.out_of_time());
        }
        Ok(tokio::time::sleep(wait))
    }

    /// The answer's JSON body, read within `by` and `--max-response-bytes`; `None` when the body
    /// broke off and the request is to be sent again (after the resend wait).
    async fn body(
        &self,
        resp: reqwest::Response,
        by: tokio::time::Instant,
        transient: &mut u32,
    ) -> Result<Option<Value>, KindError> {
        let status = resp.status().as_u16();
        let limits = &self.http.limits;
        if resp.status().is_redirection() {
            return Err(KindError::Upstream {
                method: self.method.to_string(),
                message: format!("GET {}: HTTP {status} redirect not followed", self.bare),
            });
        }
        let read = read_capped(resp, limits.max_response_bytes);
        let bytes = tokio::select! {
            r = tokio::time::timeout_at(by, read) => match r {
                Err(_) => return Err(self.timed_out()),
                Ok(Ok(b)) => b,
                Ok(Err(UpstreamError::TooLarge { .. })) => {
                    return Err(KindError::TooLarge {
                        method: self.method.to_string(),
                        message: format!(
                            "GET {}: HTTP {status}: the answer is larger than the {} cap (--max-response-bytes); nothing of it was used",
                            self.bare,
                            show_bytes(limits.max_response_bytes)
                        ),
                    });
                }
                Ok(Err(e)) => {
                    self.resend(transient, e.to_string())?.await;
                    return Ok(None);
                }
            },
            () = self.http.pacer.turn().over() => return Err(self.out_of_time()),
        };
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(Some(v)),
            Err(_) => Err(KindError::Upstream {
                method: self.method.to_string(),
                message: format!("GET {}: HTTP {status}, body is not JSON", self.bare),
            }),
        }
    }
}
