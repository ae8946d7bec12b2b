//! What every client kbind builds for a service outside the Kubernetes API (Slack, a SCIM
//! bridge, SpiceDB's HTTP gateway) shares, written once (docs/relsync.md "Bounds"):
//! - [`client`]: the reqwest client rules — no redirects (a redirect would carry the credential
//!   to a host `allowedHosts` never admitted), no name that resolves to a link-local or metadata
//!   address ([`address`]), a connect timeout, a stall timeout, and ring as the rustls provider;
//! - [`transient`] / [`server_hiccup`] / [`throttled`]: which HTTP statuses are worth sending
//!   the same (retry-safe) request again for;
//! - [`read`]: a body read into memory only up to a cap, and a newline-delimited stream split
//!   into lines each within a cap.
//!
//! The whole-request bound (connect to the last byte of the body, `--request-timeout`) is the
//! caller's `tokio::time::timeout` around the send and [`read::read_capped`], not reqwest's
//! `timeout`: a SpiceDB read stream may run longer than one request as long as it keeps moving,
//! and an upstream read resends a request that got no answer at all but not one whose body was
//! still arriving. How long to wait before a resend is `pass::backoff`.
//!
//! This module imports no pass; the passes import it.

pub mod address;
pub mod read;

use std::time::Duration;

pub use read::{Lines, read_capped, show_bytes};

/// The longest a connection may take to open, however long `--request-timeout` is.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a client could not be built, or an answer not read.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// An answer (or one line of a stream) past the caller's cap.
    #[error("the answer is larger than the {} cap", show_bytes(*cap))]
    TooLarge { cap: u64 },
    /// The body broke off (a dropped connection, a stall): worth reading again. The text may
    /// name the URL: scrub it where it is printed.
    #[error("{0}")]
    Transport(#[source] reqwest::Error),
}

/// A client for one upstream: no redirects, a connection opened within
/// `min(request_timeout, 10 s)`, no read stalled for longer than `request_timeout`, and kbind's
/// User-Agent ([`crate::user_agent`]).
pub fn client(request_timeout: Duration) -> Result<reqwest::Client, UpstreamError> {
    crate::install_crypto_provider();
    reqwest::Client::builder()
        .user_agent(crate::user_agent())
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(std::sync::Arc::new(address::Refusing))
        .connect_timeout(request_timeout.min(MAX_CONNECT_TIMEOUT))
        .read_timeout(request_timeout)
        .build()
        .map_err(UpstreamError::Client)
}

/// The server, or a proxy in front of it, failed or was unavailable before acting on the
/// request: 500, 502, 503, 504. A read (or an idempotent write) may be sent again.
pub fn server_hiccup(status: u16) -> bool {
    matches!(status, 500 | 502 | 503 | 504)
}

/// The upstream refused the request for its rate: 429.
pub fn throttled(status: u16) -> bool {
    status == 429
}

/// Either: the same retry-safe request may well succeed after a wait.
pub fn transient(status: u16) -> bool {
    throttled(status) || server_hiccup(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The User-Agent as sent on the wire by the one builder every upstream client comes from.
    #[tokio::test]
    async fn upstream_clients_send_kbinds_user_agent() {
        let (url, server) = crate::record_one_request("{}");
        let c = client(Duration::from_secs(5)).unwrap();
        c.get(format!("{url}/api")).send().await.unwrap();
        let sent = crate::user_agent_lines(&server.join().unwrap());
        assert_eq!(sent, [crate::user_agent()]);
        assert!(sent[0].starts_with("kbind/"), "{sent:?}");
    }

    #[test]
    fn which_statuses_are_retried() {
        for s in [429, 500, 502, 503, 504] {
            assert!(transient(s), "{s}");
        }
        for s in [200, 301, 400, 401, 403, 404, 409, 413, 501, 505] {
            assert!(!transient(s), "{s}");
        }
        assert!(throttled(429) && !server_hiccup(429));
    }
}
