//! Bounded write concurrency (`--write-concurrency`, docs/performance.md): a pass keeps up to N
//! objects' writes in flight, each object's own writes still one after another, in order.
//!
//! The limit adapts as TCP's congestion window does (additive increase, multiplicative
//! decrease): a 429 from a server halves it (floor 1), and it grows back by one after each
//! window of successes as long as the limit itself. The 429s are seen by the retry layer
//! (src/pass/retry.rs), which still retries them and honours `Retry-After`; the limiter only
//! decides how many objects are started. One halving per throttling event: the in-flight
//! objects that were started before the cut do not each cut again.
//!
//! [`Aimd`] is the pure bookkeeping (table-tested); [`InFlight`] runs futures under it.

use std::future::Future;
use std::num::NonZeroUsize;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

/// `--write-concurrency`: the flag of the passes that write many objects (schema, resync,
/// claims); relsync's `--concurrency` is another thing (scopes).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct WriteConcurrencyArgs {
    /// Objects whose writes may be in flight at once, per server (each object's own writes stay
    /// in order). A 429 halves it for the rest of the run (floor 1); it grows back by one per
    /// window of successes. 1 writes one object at a time, in order (deterministic). Dry runs
    /// plan one object at a time whatever this says.
    #[arg(long, default_value = "16", value_name = "N")]
    pub write_concurrency: NonZeroUsize,
}

impl Default for WriteConcurrencyArgs {
    fn default() -> Self {
        Self {
            write_concurrency: NonZeroUsize::new(16).unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// The adaptive in-flight limit (pure logic).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aimd {
    max: usize,
    limit: usize,
    /// Successes since the limit last changed.
    successes: usize,
    /// The throttle count (src/pass/retry.rs) already acted on.
    seen_throttles: u64,
}

impl Aimd {
    /// Start at `max`; `throttles` is the process's 429 count now (earlier ones are not ours).
    pub fn new(max: NonZeroUsize, throttles: u64) -> Self {
        Self {
            max: max.get(),
            limit: max.get(),
            successes: 0,
            seen_throttles: throttles,
        }
    }

    /// How many objects may be in flight now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// One object finished; `throttles` is the process's 429 count now. Any 429 since the last
    /// call halves the limit (once, however many there were); otherwise a success counts
    /// towards the window that raises the limit by one.
    pub fn finished(&mut self, throttles: u64) {
        if throttles > self.seen_throttles {
            self.seen_throttles = throttles;
            self.limit = (self.limit / 2).max(1);
            self.successes = 0;
            return;
        }
        if self.limit >= self.max {
            return;
        }
        self.successes += 1;
        if self.successes >= self.limit {
            self.limit += 1;
            self.successes = 0;
        }
    }
}

/// Futures (one per object) run under an [`Aimd`] limit; results come back as they finish.
/// The pass drives it from one task: it [`InFlight::push`]es while [`InFlight::has_room`],
/// else awaits [`InFlight::next`].
pub struct InFlight<F: Future> {
    running: FuturesUnordered<F>,
    aimd: Aimd,
    throttles: fn() -> u64,
}

impl<F: Future> InFlight<F> {
    /// Up to `max` at once, adapting to the process's 429s (src/pass/retry.rs).
    pub fn new(max: NonZeroUsize) -> Self {
        Self::with_throttles(max, super::retry::throttled)
    }

    /// As [`InFlight::new`], with the 429 count read from `throttles` (tests).
    pub fn with_throttles(max: NonZeroUsize, throttles: fn() -> u64) -> Self {
        Self {
            running: FuturesUnordered::new(),
            aimd: Aimd::new(max, throttles()),
            throttles,
        }
    }

    /// Whether another object may start now.
    pub fn has_room(&self) -> bool {
        self.running.len() < self.aimd.limit()
    }

    pub fn push(&mut self, f: F) {
        self.running.push(f);
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The limit now (for logs and tests).
    pub fn limit(&self) -> usize {
        self.aimd.limit()
    }

    /// The next finished object's result; `None` when nothing is in flight.
    pub async fn next(&mut self) -> Option<F::Output> {
        let out = self.running.next().await?;
        self.aimd.finished((self.throttles)());
        Some(out)
    }

    /// Make room for one more: wait for finished objects (handing each to `done`) until the
    /// limit allows another.
    pub async fn room(&mut self, mut done: impl FnMut(F::Output)) {
        while !self.has_room() {
            match self.next().await {
                Some(out) => done(out),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(v: usize) -> NonZeroUsize {
        NonZeroUsize::new(v).unwrap()
    }

    /// Each step: the 429 count the limiter sees when an object finishes; then the limit.
    #[test]
    fn the_limit_halves_on_429s_and_grows_back_one_per_window() {
        type Case = (&'static str, usize, Vec<(u64, usize)>);
        let cases: Vec<Case> = vec![
            ("no 429s: stays at max", 4, vec![(0, 4), (0, 4), (0, 4)]),
            ("a 429 halves", 16, vec![(1, 8)]),
            (
                "several 429s seen at once: one halving",
                16,
                vec![(5, 8), (5, 8)],
            ),
            (
                "each new 429 halves again, floor 1",
                8,
                vec![(1, 4), (2, 2), (3, 1), (4, 1)],
            ),
            (
                // At 2, a window is 2 successes; at 3, three.
                "grows back by one per window of successes",
                4,
                vec![(1, 2), (1, 2), (1, 3), (1, 3), (1, 3), (1, 4), (1, 4)],
            ),
            (
                "a 429 mid-window restarts the window",
                4,
                vec![(1, 2), (1, 2), (2, 1), (2, 2)],
            ),
            ("max 1: nothing to halve", 1, vec![(1, 1), (1, 1)]),
        ];
        for (what, max, steps) in cases {
            let mut a = Aimd::new(n(max), 0);
            assert_eq!(a.limit(), max, "{what}: starts at max");
            for (i, (throttles, want)) in steps.into_iter().enumerate() {
                a.finished(throttles);
                assert_eq!(a.limit(), want, "{what}: step {i}");
            }
        }
    }

    #[test]
    fn throttles_before_the_limiter_existed_are_not_its_own() {
        let mut a = Aimd::new(n(8), 7);
        a.finished(7);
        assert_eq!(a.limit(), 8);
        a.finished(8);
        assert_eq!(a.limit(), 4);
    }

    static THROTTLES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn throttles() -> u64 {
        THROTTLES.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn at_most_the_limit_runs_and_a_429_shrinks_it() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let job = |i: u64| {
            let (now, peak) = (now.clone(), peak.clone());
            async move {
                let c = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(c, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                if i == 3 {
                    THROTTLES.fetch_add(1, Ordering::SeqCst);
                }
                now.fetch_sub(1, Ordering::SeqCst);
                i
            }
        };
        let mut f = InFlight::with_throttles(n(4), throttles);
        let (mut done, mut limits) = (Vec::new(), Vec::new());
        for i in 0..20 {
            f.room(|o| done.push(o)).await;
            limits.push(f.limit());
            f.push(job(i));
        }
        while let Some(o) = f.next().await {
            done.push(o);
        }
        done.sort();
        assert_eq!(done, (0..20).collect::<Vec<_>>(), "every object ran once");
        assert_eq!(peak.load(Ordering::SeqCst), 4, "never more than the limit");
        // Halved to 2 when job 3 finished; by the next start one more success may have passed.
        assert!(
            limits.iter().min() < Some(&4),
            "the 429 cut the limit: {limits:?}"
        );
        assert_eq!(limits.last(), Some(&4), "and it grew back: {limits:?}");
    }
}
