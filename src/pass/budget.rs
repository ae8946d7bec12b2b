//! `--max-items` and `--deadline`: a pass asks before each unit of work, and near the deadline
//! stops taking new work so it can finish what is in flight and persist its cursor. SIGTERM (a
//! CronJob pod past `activeDeadlineSeconds`, a node drain) ends the budget the same way, and so
//! does losing the pass Lease (docs/operations.md, "The pass Lease").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Budget {
    max_items: Option<u64>,
    used: AtomicU64,
    start: Instant,
    deadline: Duration,
    terminated: AtomicBool,
    lease_lost: AtomicBool,
    /// Items the pass plans to handle this run, for progress lines; 0: not said.
    planned: AtomicU64,
}

/// Why a pass stopped taking work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exhausted {
    MaxItems,
    Deadline,
    /// The process was asked to stop (SIGTERM).
    Terminated,
    /// The pass Lease is no longer ours: another run took it, or it expired unrenewed.
    LeaseLost,
}

/// What a summary's "stopped early (…)" says.
impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exhausted::MaxItems => "--max-items reached",
            Exhausted::Deadline => "deadline near",
            Exhausted::Terminated => "SIGTERM received",
            Exhausted::LeaseLost => "pass Lease lost",
        })
    }
}

impl Budget {
    pub fn new(max_items: Option<u64>, deadline: Duration) -> Self {
        Self {
            max_items,
            used: AtomicU64::new(0),
            start: Instant::now(),
            deadline,
            terminated: AtomicBool::new(false),
            lease_lost: AtomicBool::new(false),
            planned: AtomicU64::new(0),
        }
    }

    pub fn unlimited() -> Self {
        Self::new(None, Duration::from_secs(365 * 24 * 3600))
    }

    /// The margin kept before the deadline for finishing in-flight work and recording status:
    /// a tenth of the deadline, between 1 s and 30 s.
    fn margin(&self) -> Duration {
        (self.deadline / 10).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    /// Stop taking work now, as at the deadline: no time remains.
    pub fn terminate(&self) {
        self.terminated.store(true, Ordering::SeqCst);
    }

    /// Stop taking work now, as at the deadline, because the pass Lease was lost.
    pub fn lose_lease(&self) {
        self.lease_lost.store(true, Ordering::SeqCst);
    }

    fn out_of_time(&self) -> Option<Exhausted> {
        if self.lease_lost.load(Ordering::SeqCst) {
            Some(Exhausted::LeaseLost)
        } else if self.terminated.load(Ordering::SeqCst) {
            Some(Exhausted::Terminated)
        } else if self.remaining().is_zero() {
            Some(Exhausted::Deadline)
        } else {
            None
        }
    }

    /// Time left before the pass must stop taking work.
    pub fn remaining(&self) -> Duration {
        if self.terminated.load(Ordering::SeqCst) || self.lease_lost.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        self.deadline
            .saturating_sub(self.margin())
            .saturating_sub(self.start.elapsed())
    }

    /// Check without consuming: is there time (and items) left for more work?
    pub fn check(&self) -> Result<(), Exhausted> {
        if let Some(why) = self.out_of_time() {
            return Err(why);
        }
        if let Some(max) = self.max_items
            && self.used.load(Ordering::SeqCst) >= max
        {
            return Err(Exhausted::MaxItems);
        }
        Ok(())
    }

    /// Take one item of budget.
    pub fn take(&self) -> Result<(), Exhausted> {
        if let Some(why) = self.out_of_time() {
            return Err(why);
        }
        match self.max_items {
            None => {
                self.used.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Some(max) => self
                .used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    (u < max).then_some(u + 1)
                })
                .map(|_| ())
                .map_err(|_| Exhausted::MaxItems),
        }
    }

    /// Whether a wait of `d` would cross the point where work must stop.
    pub fn would_cross_deadline(&self, d: Duration) -> bool {
        d >= self.remaining()
    }

    /// Say how many items this run plans to handle (for the progress lines,
    /// src/pass/progress.rs); may be called again as the plan grows.
    pub fn plan(&self, items: u64) {
        self.planned.store(items, Ordering::Relaxed);
    }

    /// What the pass planned, else `--max-items`; `None` when neither is known.
    pub fn planned(&self) -> Option<u64> {
        match self.planned.load(Ordering::Relaxed) {
            0 => self.max_items,
            n => Some(self.max_items.map_or(n, |m| n.min(m))),
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_run_out() {
        let b = Budget::new(Some(2), Duration::from_secs(600));
        assert!(b.take().is_ok());
        assert!(b.check().is_ok());
        assert!(b.take().is_ok());
        assert_eq!(b.take(), Err(Exhausted::MaxItems));
        assert_eq!(b.check(), Err(Exhausted::MaxItems));
        assert_eq!(b.used(), 2);
    }

    #[test]
    fn deadline_keeps_a_margin() {
        // A 1 s deadline has a 1 s margin: no time for work at all.
        let b = Budget::new(None, Duration::from_secs(1));
        assert_eq!(b.take(), Err(Exhausted::Deadline));
        let b = Budget::new(None, Duration::from_secs(600));
        assert!(b.take().is_ok());
        assert!(b.would_cross_deadline(Duration::from_secs(600)));
        assert!(!b.would_cross_deadline(Duration::from_secs(1)));
    }

    #[test]
    fn termination_ends_the_budget_like_the_deadline() {
        let b = Budget::new(None, Duration::from_secs(600));
        assert!(b.take().is_ok());
        b.terminate();
        assert_eq!(b.take(), Err(Exhausted::Terminated));
        assert_eq!(b.check(), Err(Exhausted::Terminated));
        assert!(b.remaining().is_zero());
        assert!(b.would_cross_deadline(Duration::from_millis(1)));
    }

    #[test]
    fn a_lost_lease_ends_the_budget_and_says_so() {
        let b = Budget::new(None, Duration::from_secs(600));
        assert!(b.take().is_ok());
        b.lose_lease();
        assert_eq!(b.take(), Err(Exhausted::LeaseLost));
        assert_eq!(b.check(), Err(Exhausted::LeaseLost));
        assert!(b.remaining().is_zero());
        b.terminate();
        assert_eq!(
            b.check(),
            Err(Exhausted::LeaseLost),
            "the Lease is the reason"
        );
    }
}
