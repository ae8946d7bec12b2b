//! Bounds on what one answer from an upstream (Slack, a SCIM bridge) or from SpiceDB may cost,
//! and on one source's share of the pass (docs/relsync.md "Bounds"):
//! - `--max-response-bytes` (default 16Mi): a response body is read into memory only up to this
//!   cap, checked against `Content-Length` first and then while reading, so a larger answer
//!   fails its request with an error naming the cap and is never buffered whole. SpiceDB's read
//!   streams are not one body: each of their lines is bounded instead (the reads themselves
//!   are `upstream::read`).
//! - `--request-timeout`: one request, connect to the last byte of its body, takes at most this
//!   long (streams: each stall).
//! - `--max-pages` (default 10,000): pages of one paginated listing (an enumeration, one scope's
//!   members, the user list), so a server that never says "last page" cannot loop a pass.
//! - a source's turn: its equal share of what is left of the pass deadline (at least
//!   `--min-source-share`, 30 s); every request, retry wait and rate-limit wait of the source
//!   ends with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pass::Budget;
use crate::pass::budget::Exhausted;

/// `--max-response-bytes` default: 16 MiB per response (contract #11).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 16 << 20;
/// `--max-pages` default.
pub const DEFAULT_MAX_PAGES: usize = 10_000;
/// The largest page kbind asks of an upstream, whatever a source's `pageSize` says.
pub const MAX_PAGE_SIZE: u32 = 1000;

/// The bounds every upstream request of a pass obeys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_response_bytes: u64,
    pub request_timeout: Duration,
    pub max_pages: usize,
}

impl Limits {
    /// The bounds the pass's flags set.
    pub fn of(ctx: &crate::pass::PassContext, args: &super::args::RelsyncArgs) -> Self {
        Self {
            max_response_bytes: args.max_response_bytes,
            request_timeout: ctx.args.request_timeout,
            max_pages: args.max_pages,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            request_timeout: Duration::from_secs(60),
            max_pages: DEFAULT_MAX_PAGES,
        }
    }
}

const KI: u64 = 1 << 10;
const MAX_CAP: u64 = 4 << 30;

/// Parse a byte count: `16Mi`, `512Ki`, `1Gi`, or plain bytes; between 1Ki and 4Gi.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("Ki") {
        (n, KI)
    } else if let Some(n) = t.strip_suffix("Mi") {
        (n, KI * KI)
    } else if let Some(n) = t.strip_suffix("Gi") {
        (n, KI * KI * KI)
    } else {
        (t, 1)
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a byte count such as 16Mi, 512Ki or 1048576"))?;
    let bytes = n
        .checked_mul(mult)
        .filter(|b| (KI..=MAX_CAP).contains(b))
        .ok_or_else(|| format!("{s:?}: must be between 1Ki and 4Gi"))?;
    Ok(bytes)
}

/// Parse `--max-pages`: a whole number, at least 1.
pub fn parse_pages(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{s:?}: expected a number of pages, at least 1"))
}

/// A duration as a message shows it: whole seconds (`8s`), or milliseconds below one second.
pub fn show_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Each due source's share of what is left of the pass: an equal part for each of the
/// `sources_left`, at least `min`, at most what is left.
pub fn share(remaining: Duration, sources_left: usize, min: Duration) -> Duration {
    let n = u32::try_from(sources_left.max(1)).unwrap_or(u32::MAX);
    (remaining / n).max(min).min(remaining)
}

/// Why a source's turn stopped taking work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnEnd {
    /// The pass ran out (`--max-items`, its deadline, SIGTERM).
    Pass(Exhausted),
    /// This source's share of the deadline is used up.
    ShareUsed,
}

/// One source's turn in the pass: the pass budget, plus the end of the source's share of the
/// deadline. Everything the source does upstream — requests, retry and rate-limit waits — ends
/// with it.
#[derive(Debug)]
pub struct Turn {
    budget: Arc<Budget>,
    ends: Instant,
    share: Duration,
}

impl Turn {
    /// A turn of `share` starting now (never past the pass's own stop).
    pub fn new(budget: Arc<Budget>, share: Duration) -> Self {
        let share = share.min(budget.remaining());
        Self {
            ends: Instant::now() + share,
            budget,
            share,
        }
    }

    /// A turn as long as what is left of the pass (tests, a single source).
    pub fn whole(budget: Arc<Budget>) -> Self {
        let share = budget.remaining();
        Self::new(budget, share)
    }

    /// The length of this turn.
    pub fn share(&self) -> Duration {
        self.share
    }

    /// Time left in this turn.
    pub fn remaining(&self) -> Duration {
        self.budget
            .remaining()
            .min(self.ends.saturating_duration_since(Instant::now()))
    }

    /// Whether a wait of `d` would outlast the turn.
    pub fn would_cross(&self, d: Duration) -> bool {
        d >= self.remaining()
    }

    /// Take one item of the pass budget, if the turn has time left.
    pub fn take(&self) -> Result<(), TurnEnd> {
        self.budget.check().map_err(TurnEnd::Pass)?;
        if self.remaining().is_zero() {
            return Err(TurnEnd::ShareUsed);
        }
        self.budget.take().map_err(TurnEnd::Pass)
    }

    /// Resolves when the turn is over (its share used, the pass deadline, or SIGTERM, noticed
    /// within a quarter second).
    pub async fn over(&self) {
        loop {
            let left = self.remaining();
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_millis(250))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("16Mi"), Ok(16 << 20));
        assert_eq!(parse_bytes(" 512Ki "), Ok(512 << 10));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        for bad in [
            "",
            "16M",
            "16 Mi",
            "-1Mi",
            "1023",
            "5Gi",
            "99999999999999999999Gi",
            "Mi",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_pages("10000"), Ok(10_000));
        assert!(parse_pages("0").is_err() && parse_pages("-1").is_err());
        assert_eq!(show_duration(Duration::from_millis(8900)), "8s");
        assert_eq!(show_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn shares_are_equal_floored_and_never_past_the_pass() {
        let s = Duration::from_secs;
        assert_eq!(share(s(600), 4, s(30)), s(150));
        assert_eq!(share(s(600), 100, s(30)), s(30), "floored");
        assert_eq!(share(s(20), 2, s(30)), s(20), "never past what is left");
        assert_eq!(share(s(20), 2, s(5)), s(10));
        assert_eq!(share(s(20), 0, s(5)), s(20));
    }

    #[tokio::test]
    async fn a_turn_ends_at_its_share_or_with_the_pass() {
        let budget = Arc::new(Budget::new(None, Duration::from_secs(600)));
        let t = Turn::new(budget.clone(), Duration::from_millis(300));
        assert!(t.take().is_ok());
        assert!(t.would_cross(Duration::from_secs(1)));
        let started = Instant::now();
        t.over().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(t.take(), Err(TurnEnd::ShareUsed));
        // The pass ending (SIGTERM) ends every turn.
        let t = Turn::new(budget.clone(), Duration::from_secs(60));
        budget.terminate();
        assert_eq!(t.take(), Err(TurnEnd::Pass(Exhausted::Terminated)));
        tokio::time::timeout(Duration::from_secs(2), t.over())
            .await
            .unwrap();
    }
}
