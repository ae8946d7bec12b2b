//! The one retry schedule every pass and client uses: exponential, capped, jittered, with the
//! server's `Retry-After` taking precedence, and never a wait that ends past the deadline.
//!
//! **Jitter: equal jitter.** The wait before retry `n` is drawn uniformly from
//! `[step/2, step]`, where `step = base · 2ⁿ` capped at `cap`. Full jitter (`[0, step]`) spreads
//! clients a little more, but may draw a wait near zero: an immediate resend to a server that
//! just said it is overloaded, which for a throttled upstream burns one of the few retries a
//! request has. Equal jitter keeps at least half of every step — the retries still span the
//! same order of time — while the parallel tasks of a pass (and the pods of several
//! CronJobs) that failed together stop retrying in lockstep.
//!
//! Guarantees ([`Backoff::wait`]): a computed wait is never above `cap` and never below
//! `min(base, cap) / 2`; a `Retry-After` wins over the computed wait, clamped to the bounds
//! the caller names ([`Backoff::honouring`]); [`Backoff::within`] refuses any wait that would
//! end at or past the deadline.
//!
//! The random source is a small xorshift generator seeded from the clock and the process id:
//! jitter needs spread, not unpredictability.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A capped, jittered exponential schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first step (the wait before the first retry is between half of it and it).
    pub base: Duration,
    /// No computed wait is longer.
    pub cap: Duration,
    /// A `Retry-After` is clamped into `[min, max]` (by default `[0, cap]`).
    pub advice_min: Duration,
    pub advice_max: Duration,
}

impl Backoff {
    /// `base` doubling per retry, capped at `cap`; a `Retry-After` capped at `cap` too.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            advice_min: Duration::ZERO,
            advice_max: cap,
        }
    }

    /// Clamp a server's `Retry-After` into `[min, max]` instead of `[0, cap]`.
    pub const fn honouring(self, min: Duration, max: Duration) -> Self {
        Self {
            advice_min: min,
            advice_max: max,
            ..self
        }
    }

    /// The un-jittered step before retry `attempt` (0-based): `base · 2^attempt`, capped.
    pub fn step(&self, attempt: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.cap)
    }

    /// The wait before retry `attempt`: the server's advice when it gave one (clamped), else a
    /// draw from `[step/2, step]`.
    pub fn wait(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(advised) = retry_after {
            return advised.max(self.advice_min).min(self.advice_max);
        }
        let step = self.step(attempt);
        let half = step / 2;
        let spread = u64::try_from((step - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(random_below(spread.saturating_add(1)))
    }

    /// [`Backoff::wait`], or `None` when that wait would end at or past `deadline`: the caller
    /// gives up now rather than sleep into the time it needs to record where it stopped.
    pub fn within(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        let wait = self.wait(attempt, retry_after);
        (!crosses(deadline, Instant::now(), wait)).then_some(wait)
    }
}

/// Whether waiting `wait` from `now` ends at or past `deadline` (never, without one).
pub fn crosses(deadline: Option<Instant>, now: Instant, wait: Duration) -> bool {
    deadline.is_some_and(|d| now + wait >= d)
}

/// Parse a `Retry-After` header: integer seconds (the form Slack and the Kubernetes API server
/// send). HTTP-dates are not used by the services kbind reads and count as absent.
pub fn parse_retry_after(v: Option<&str>) -> Option<Duration> {
    v?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

static STATE: AtomicU64 = AtomicU64::new(0);

/// A number in `[0, n)` (0 when `n` is 0), from a process-wide xorshift64 generator.
fn random_below(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let step = |mut x: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let prev = STATE
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
            Some(step(if s == 0 { seed() } else { s }))
        })
        .unwrap_or_else(|s| s);
    let x = step(if prev == 0 { seed() } else { prev });
    x % n
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let s = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x2545_F491_4F6C_DD1D;
    if s == 0 { 1 } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn waits_stay_between_half_a_step_and_the_cap() {
        let b = Backoff::new(MS(200), Duration::from_secs(5));
        for attempt in 0..40 {
            let step = b.step(attempt);
            assert!(step <= b.cap, "step {attempt} above the cap");
            for _ in 0..200 {
                let w = b.wait(attempt, None);
                assert!(
                    w <= step && w <= b.cap,
                    "attempt {attempt}: {w:?} above {step:?}"
                );
                assert!(
                    w >= step / 2,
                    "attempt {attempt}: {w:?} below half of {step:?}"
                );
                assert!(w >= MS(100), "never below half the base");
            }
        }
        assert_eq!(
            b.step(40),
            b.cap,
            "a late attempt waits the cap, not an overflow"
        );
    }

    #[test]
    fn waits_are_spread() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let draws: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| b.wait(3, None)).collect();
        assert!(draws.len() > 10, "jittered: {} distinct of 50", draws.len());
    }

    #[test]
    fn retry_after_wins_within_its_bounds() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
            .honouring(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(
            b.wait(0, Some(Duration::from_secs(7))),
            Duration::from_secs(7)
        );
        assert_eq!(
            b.wait(9, Some(Duration::from_secs(7))),
            Duration::from_secs(7),
            "over the computed step"
        );
        assert_eq!(
            b.wait(0, Some(Duration::ZERO)),
            Duration::from_secs(1),
            "floored"
        );
        assert_eq!(
            b.wait(0, Some(Duration::from_secs(3600))),
            Duration::from_secs(300),
            "capped"
        );
        let plain = Backoff::new(MS(200), Duration::from_secs(5));
        assert_eq!(
            plain.wait(0, Some(Duration::from_secs(3600))),
            Duration::from_secs(5),
            "capped at the cap by default"
        );
    }

    #[test]
    fn no_wait_crosses_the_deadline() {
        let b = Backoff::new(MS(200), Duration::from_secs(5));
        assert!(b.within(0, None, None).is_some(), "no deadline");
        let soon = Instant::now() + MS(50);
        assert_eq!(b.within(0, None, Some(soon)), None);
        assert_eq!(
            b.within(
                0,
                Some(Duration::from_secs(2)),
                Some(Instant::now() + Duration::from_secs(1))
            ),
            None,
            "advice past the deadline is not taken"
        );
        let later = Instant::now() + Duration::from_secs(30);
        assert!(
            b.within(3, Some(Duration::from_secs(2)), Some(later))
                .is_some()
        );
        let now = Instant::now();
        assert!(
            crosses(Some(now + MS(10)), now, MS(10)),
            "ending exactly at the deadline crosses it"
        );
        assert!(!crosses(None, now, Duration::from_secs(3600)));
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(
            parse_retry_after(Some(" 30 ")),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(parse_retry_after(Some("soon")), None);
        assert_eq!(parse_retry_after(None), None);
    }
}
