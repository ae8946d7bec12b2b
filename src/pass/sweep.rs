//! Full sweeps between runs that work only on what changed (docs/schema.md "Full sweeps",
//! docs/issue.md "Full sweeps"): when the last full sweep is `--full-sweep-every` old, the
//! next run reconciles every root object; runs in between only what changed. The pass Lease
//! records when a run last swept fully (src/pass/lease.rs).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::summary::Sweep;

/// How much earlier than `every` a full sweep may come (at most a tenth of `every`).
pub const SLACK: Duration = Duration::from_secs(30);

/// Whether this run sweeps fully: always with `every` zero (the default), when no full sweep
/// is recorded, when the last one is `every` old, or when the record lies more than `every`
/// ahead (written by a clock that ran fast: it must not put sweeps off until it is reached).
/// "`every` old" allows [`SLACK`]: the record is when a run started, and the CronJob's next
/// run on that schedule starts a little early or late; without it, a sweep due every 5 minutes
/// on a 5-minute (or 1-minute) schedule would often come a period late.
pub fn due(every: Duration, swept_at: Option<Timestamp>, now: Timestamp) -> Sweep {
    let every = every.saturating_sub(SLACK.min(every / 10));
    let due = |at: Timestamp| {
        let since = now.duration_since(at);
        let ahead = at.duration_since(now);
        let at_least = |d: k8s_openapi::jiff::SignedDuration| {
            Duration::try_from(d).is_ok_and(|d: Duration| d >= every)
        };
        at_least(since) || ahead.is_positive() && at_least(ahead)
    };
    if every.is_zero() || swept_at.is_none_or(due) {
        Sweep::Full
    } else {
        Sweep::Changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_full_sweep_comes_when_due_or_when_none_is_recorded() {
        let five = Duration::from_secs(300);
        assert_eq!(due(Duration::ZERO, Some(t(1000)), t(1000)), Sweep::Full);
        assert_eq!(due(five, None, t(1000)), Sweep::Full);
        assert_eq!(due(five, Some(t(1000)), t(1269)), Sweep::Changed);
        // 30 s of slack: the CronJob's run 5 minutes later may start a second early.
        assert_eq!(due(five, Some(t(1000)), t(1270)), Sweep::Full);
        assert_eq!(due(five, Some(t(1000)), t(1299)), Sweep::Full);
        // A tenth of a short `every` at most.
        let minute = Duration::from_secs(60);
        assert_eq!(due(minute, Some(t(1000)), t(1053)), Sweep::Changed);
        assert_eq!(due(minute, Some(t(1000)), t(1054)), Sweep::Full);
        // A record a little ahead (clocks differ a little): not due yet; far ahead (a clock that
        // ran fast): due, or it would put every sweep off until the clock reached it.
        assert_eq!(due(five, Some(t(1100)), t(1000)), Sweep::Changed);
        assert_eq!(due(five, Some(t(1300)), t(1000)), Sweep::Full);
        assert_eq!(due(five, Some(t(1269)), t(1000)), Sweep::Changed);
        assert_eq!(due(five, Some(t(100_000)), t(1000)), Sweep::Full);
    }
}
