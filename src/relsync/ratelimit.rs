//! Upstream pacing and throttle handling.
//!
//! Requests are paced *below* the upstream's published limit (`--pace`, by default 90% of each
//! Slack method's tier, one bucket per source and method, burst 1), so a healthy pass never
//! meets a 429; 1.0 is for an operator whose Slack app is kbind's alone (docs/relsync.md). When one
//! comes anyway — 429 with `Retry-After`, 429 without it, or Slack's HTTP 200
//! `{"ok":false,"error":"ratelimited"}` — the method is paused for the advised time (or the
//! framework's jittered exponential backoff, `pass::backoff`, from 1 s) for every task of this
//! source, and the request is retried. A
//! wait that would outlast the source's turn (its share of the pass deadline, see `limits`) is
//! not taken: the source stops there and saves its cursor, and the next run continues.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::limits::Turn;
use crate::pass::backoff::Backoff;
use crate::pass::lock;

/// `--pace`'s default: the share of each published limit kbind uses, leaving a tenth to other
/// clients of the same app (and to requests a delayed network bunches together).
pub const DEFAULT_PACE: f64 = 0.9;

/// How much of the published limits a pass uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// `--pace`: the share of each published limit, in (0, 1].
    pub pace: f64,
    /// `--upstream-rate-scale`: multiplies every published limit (tests and benchmarks against
    /// stand-ins that enforce scaled limits; 1 against real services).
    pub scale: f64,
}

/// `--pace`: a share of the published limit above 0 and at most 1.
pub fn parse_pace(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err(format!(
            "a share of each upstream's published rate limit, above 0 and at most 1 (e.g. 0.9), not {s:?}"
        )),
    }
}
/// Retries of one request after throttling before it counts as a scope error.
const MAX_RETRIES: u32 = 6;
/// The wait after a throttle: the server's advice, floored at 1 s and capped at 5 minutes, or a
/// step of 1 s doubling per attempt up to a minute (each wait half a step to a step).
const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
    .honouring(Duration::from_secs(1), Duration::from_secs(300));

/// Why a request was not (re)sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Throttled {
    #[error("waiting {wait:?} for {method} would outlast this source's share of the pass deadline")]
    Deadline { method: String, wait: Duration },
    #[error("{method} still rate limited after {MAX_RETRIES} retries")]
    GaveUp { method: String },
}

/// One source's pacer: a GCRA bucket per method, plus a shared pause after a throttle.
pub struct Pacer {
    /// Published per-minute limit per method; methods not listed get `default_per_min`.
    tiers: HashMap<&'static str, u32>,
    default_per_min: u32,
    rate: Rate,
    turn: Arc<Turn>,
    buckets: Mutex<HashMap<String, Arc<DefaultDirectRateLimiter>>>,
    /// The buckets' clock: a wait is computed on the same clock the bucket reads.
    clock: DefaultClock,
    paused_until: Mutex<HashMap<String, Instant>>,
    /// Throttle responses seen (for the summary and the benchmark).
    throttles: std::sync::atomic::AtomicU64,
}

impl Pacer {
    pub fn new(
        tiers: HashMap<&'static str, u32>,
        default_per_min: u32,
        rate: Rate,
        turn: Arc<Turn>,
    ) -> Self {
        let or_one = |v: f64| if v > 0.0 && v.is_finite() { v } else { 1.0 };
        Self {
            tiers,
            default_per_min,
            rate: Rate {
                pace: or_one(rate.pace).min(1.0),
                scale: or_one(rate.scale),
            },
            turn,
            buckets: Mutex::default(),
            clock: DefaultClock::default(),
            paused_until: Mutex::default(),
            throttles: Default::default(),
        }
    }

    /// The pacing period for `method`: one request per this interval.
    pub fn period(&self, method: &str) -> Duration {
        let per_sec = self.published(method) * self.rate.pace * self.rate.scale / 60.0;
        Duration::from_secs_f64(1.0 / per_sec)
    }

    /// The published per-minute limit of `method`.
    fn published(&self, method: &str) -> f64 {
        let per_min = self.tiers.get(method).copied();
        f64::from(per_min.unwrap_or(self.default_per_min).max(1))
    }

    /// Burst capacity: one request at Slack's real tiers (at most 1.5/s), a twentieth of a
    /// second's worth at scaled rates, and never more than the limit's share `--pace` leaves
    /// unused (so 1 at pace 1.0). Without any slack a waiter that wakes a few ms late loses that
    /// slot for good; with it the sustained rate is still the pace and no window of the limit
    /// ever holds more than the limit.
    fn burst(&self, method: &str) -> NonZeroU32 {
        let per_sec = 1.0 / self.period(method).as_secs_f64();
        let spare = self.published(method) * (1.0 - self.rate.pace);
        NonZeroU32::new((per_sec / 20.0).min(spare) as u32).unwrap_or(NonZeroU32::MIN)
    }

    fn bucket(&self, method: &str) -> Arc<DefaultDirectRateLimiter> {
        let mut b = lock(&self.buckets);
        b.entry(method.to_string())
            .or_insert_with(|| {
                let quota = Quota::with_period(self.period(method))
                    .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
                    .allow_burst(self.burst(method));
                Arc::new(RateLimiter::direct_with_clock(quota, self.clock.clone()))
            })
            .clone()
    }

    /// The source's turn every wait of this pacer ends with.
    pub fn turn(&self) -> &Turn {
        &self.turn
    }

    /// Wait `d` unless that would outlast the turn.
    pub async fn wait(&self, method: &str, d: Duration) -> Result<(), Throttled> {
        if d.is_zero() {
            return Ok(());
        }
        if self.turn.would_cross(d) {
            return Err(Throttled::Deadline {
                method: method.to_string(),
                wait: d,
            });
        }
        tokio::time::sleep(d).await;
        Ok(())
    }

    /// Throttle responses seen so far.
    pub fn throttles(&self) -> u64 {
        self.throttles.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wait for this method's turn.
    pub async fn pace(&self, method: &str) -> Result<(), Throttled> {
        loop {
            let paused = lock(&self.paused_until)
                .get(method)
                .copied()
                .and_then(|t| t.checked_duration_since(Instant::now()));
            if let Some(d) = paused {
                self.wait(method, d).await?;
                continue;
            }
            let bucket = self.bucket(method);
            match bucket.check() {
                Ok(()) => return Ok(()),
                Err(not_until) => {
                    let d = not_until.wait_time_from(self.clock.now());
                    self.wait(method, d).await?;
                }
            }
        }
    }

    /// The upstream throttled attempt number `attempt` (0-based): pause the method for the
    /// advised time, or back off exponentially, then let the caller retry.
    pub async fn throttled(
        &self,
        method: &str,
        attempt: u32,
        retry_after: Option<Duration>,
    ) -> Result<(), Throttled> {
        self.throttles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if attempt >= MAX_RETRIES {
            return Err(Throttled::GaveUp {
                method: method.to_string(),
            });
        }
        let d = BACKOFF.wait(attempt, retry_after);
        lock(&self.paused_until)
            .entry(method.to_string())
            .and_modify(|t| *t = (*t).max(Instant::now() + d))
            .or_insert(Instant::now() + d);
        if self.turn.would_cross(d) {
            return Err(Throttled::Deadline {
                method: method.to_string(),
                wait: d,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::Budget;

    fn whole(budget: Budget) -> Arc<Turn> {
        Arc::new(Turn::whole(Arc::new(budget)))
    }

    fn rate(pace: f64, scale: f64) -> Rate {
        Rate { pace, scale }
    }

    #[test]
    fn throttle_waits() {
        let s = Duration::from_secs;
        for attempt in [0, 3, 30] {
            let w = BACKOFF.wait(attempt, None);
            assert!(
                w >= Duration::from_millis(500) && w <= s(60),
                "{attempt}: {w:?}"
            );
        }
        assert!(
            BACKOFF.wait(3, None) >= s(4),
            "doubling: half of 8 s at the least"
        );
        assert_eq!(
            BACKOFF.wait(0, Some(Duration::ZERO)),
            s(1),
            "advice floored"
        );
        assert_eq!(BACKOFF.wait(5, Some(s(7))), s(7), "advice wins");
        assert_eq!(BACKOFF.wait(0, Some(s(3600))), s(300), "advice capped");
    }

    #[test]
    fn pacing_stays_below_the_tier() {
        let p = Pacer::new(
            HashMap::from([("conversations.members", 100)]),
            20,
            rate(DEFAULT_PACE, 1.0),
            whole(Budget::unlimited()),
        );
        // 100/min at 90% is one request every 2/3 s; 20/min at 90% every 3.33 s.
        assert_eq!(p.period("conversations.members").as_millis(), 666);
        assert_eq!(p.period("users.list").as_millis(), 3333);
        assert_eq!(
            p.burst("conversations.members").get(),
            1,
            "strict at real tiers"
        );
        let scaled = Pacer::new(
            HashMap::from([("conversations.members", 100)]),
            20,
            rate(DEFAULT_PACE, 60.0),
            whole(Budget::unlimited()),
        );
        // 90/s sustained, burst 4: any one-second window holds at most 94 < 100.
        assert_eq!(scaled.burst("conversations.members").get(), 4);
    }

    #[test]
    fn pace_sets_the_share_and_leaves_no_burst_at_one() {
        // (pace, scale, period in ms, burst) for a 100/min method.
        let cases = [
            (1.0, 1.0, 600, 1),
            (0.5, 1.0, 1200, 1),
            (1.0, 60.0, 10, 1),
            (0.99, 60.0, 10, 1),
            (0.95, 60.0, 10, 4),
            (DEFAULT_PACE, 60.0, 11, 4),
        ];
        for (pace, scale, period, burst) in cases {
            let p = Pacer::new(
                HashMap::from([("conversations.members", 100)]),
                20,
                rate(pace, scale),
                whole(Budget::unlimited()),
            );
            let m = "conversations.members";
            assert_eq!(p.period(m).as_millis(), period, "{pace} x{scale}");
            assert_eq!(p.burst(m).get(), burst, "{pace} x{scale}");
            // A window of the limit (a minute, over the scale) never holds more than the limit:
            // the paced rate over it plus what the burst adds beyond strict spacing.
            let window = 60.0 / scale;
            let most = window / p.period(m).as_secs_f64() + f64::from(burst - 1);
            assert!(most <= 100.0 + 1e-9, "{pace} x{scale}: {most}");
        }
    }

    #[test]
    fn pace_is_a_share_above_0_and_at_most_1() {
        for ok in ["1", "0.9", " 0.5 ", "1.0", "0.01"] {
            assert!(parse_pace(ok).is_ok(), "{ok}");
        }
        for bad in ["0", "1.1", "-0.5", "NaN", "inf", "90%", ""] {
            let e = parse_pace(bad).unwrap_err();
            assert!(e.contains("at most 1"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn a_wait_past_the_deadline_is_refused() {
        let p = Pacer::new(
            HashMap::new(),
            20,
            rate(DEFAULT_PACE, 1.0),
            whole(Budget::new(None, Duration::from_secs(20))),
        );
        assert!(
            p.throttled("m", 0, Some(Duration::from_secs(1)))
                .await
                .is_ok()
        );
        assert!(matches!(
            p.throttled("m", 0, Some(Duration::from_secs(120))).await,
            Err(Throttled::Deadline { .. })
        ));
        assert!(matches!(
            p.throttled("m", MAX_RETRIES, None).await,
            Err(Throttled::GaveUp { .. })
        ));
    }
}
