//! Upstream pacing and throttle handling.
//!
//! Requests are paced *below* the upstream's published limit (90% of each Slack method's tier,
//! one bucket per source and method, burst 1), so a healthy pass never meets a 429. When one
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

/// Share of the published limit kbind uses.
const HEADROOM: f64 = 0.9;
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
    scale: f64,
    turn: Arc<Turn>,
    buckets: Mutex<HashMap<String, Arc<DefaultDirectRateLimiter>>>,
    /// The buckets' clock: a wait is computed on the same clock the bucket reads.
    clock: DefaultClock,
    paused_until: Mutex<HashMap<String, Instant>>,
    /// Throttle responses seen (for the summary and the benchmark).
    throttles: std::sync::atomic::AtomicU64,
}

impl Pacer {
    /// `scale` multiplies every published limit (1.0 in production; the benchmark and tests
    /// scale the fake's limits and ours together).
    pub fn new(
        tiers: HashMap<&'static str, u32>,
        default_per_min: u32,
        scale: f64,
        turn: Arc<Turn>,
    ) -> Self {
        Self {
            tiers,
            default_per_min,
            scale: if scale > 0.0 { scale } else { 1.0 },
            turn,
            buckets: Mutex::default(),
            clock: DefaultClock::default(),
            paused_until: Mutex::default(),
            throttles: Default::default(),
        }
    }

    /// The pacing period for `method`: one request per this interval.
    pub fn period(&self, method: &str) -> Duration {
        let per_min = self
            .tiers
            .get(method)
            .copied()
            .unwrap_or(self.default_per_min);
        let per_sec = f64::from(per_min.max(1)) * HEADROOM * self.scale / 60.0;
        Duration::from_secs_f64(1.0 / per_sec)
    }

    /// Burst capacity: one request at Slack's real tiers (at most 1.5/s), a twentieth of a
    /// second's worth at scaled rates. Without any slack a waiter that wakes a few ms late loses
    /// that slot for good; with it the sustained rate is still 90% and no one-second window ever
    /// holds more than the tier.
    fn burst(&self, method: &str) -> NonZeroU32 {
        let per_sec = 1.0 / self.period(method).as_secs_f64();
        NonZeroU32::new((per_sec / 20.0) as u32).unwrap_or(NonZeroU32::MIN)
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
            1.0,
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
            60.0,
            whole(Budget::unlimited()),
        );
        // 90/s sustained, burst 4: any one-second window holds at most 94 < 100.
        assert_eq!(scaled.burst("conversations.members").get(), 4);
    }

    #[tokio::test]
    async fn a_wait_past_the_deadline_is_refused() {
        let p = Pacer::new(
            HashMap::new(),
            20,
            1.0,
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
