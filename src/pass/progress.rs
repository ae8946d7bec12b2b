//! Progress of a long pass: one info line every [`EVERY`] while the pass runs, with the items
//! done (budget items taken: Connections for schema, instance writes for resync, bindings for
//! claims, scopes for relsync), the items planned when the pass said ([`Budget::plan`]) or else
//! `--max-items`, and the requests sent so far. A pass shorter than [`EVERY`] logs none.
//! (docs/operations.md, "Logs".)

use std::sync::Arc;
use std::time::Duration;

use super::budget::Budget;
use super::client::RequestCounter;

/// How often a running pass logs its progress.
pub const EVERY: Duration = Duration::from_secs(30);

/// One progress report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub items_done: u64,
    /// What the pass planned, else `--max-items`; `None` when neither is known.
    pub items_planned: Option<u64>,
    pub requests: u64,
    pub writes: u64,
    pub elapsed_secs: u64,
}

impl Snapshot {
    fn take(budget: &Budget, counter: &RequestCounter) -> Self {
        Self {
            items_done: budget.used(),
            items_planned: budget.planned(),
            requests: counter.total(),
            writes: counter.writes(),
            elapsed_secs: budget.elapsed().as_secs(),
        }
    }
}

/// The reporter; dropping it (or [`Progress::stop`]) stops the lines.
pub struct Progress {
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Log a progress line for `pass` every [`EVERY`].
    pub fn start(pass: &'static str, budget: Arc<Budget>, counter: Arc<RequestCounter>) -> Self {
        Self::start_with(EVERY, budget, counter, move |s| {
            let planned = s
                .items_planned
                .map_or_else(|| "?".to_string(), |p| p.to_string());
            tracing::info!(
                pass,
                items_done = s.items_done,
                items_planned = %planned,
                requests = s.requests,
                writes = s.writes,
                elapsed_secs = s.elapsed_secs,
                "progress: {}/{planned} items after {}s",
                s.items_done,
                s.elapsed_secs
            );
        })
    }

    /// As [`Progress::start`], reporting to `sink` every `every`.
    pub fn start_with(
        every: Duration,
        budget: Arc<Budget>,
        counter: Arc<RequestCounter>,
        sink: impl Fn(Snapshot) + Send + 'static,
    ) -> Self {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sink(Snapshot::take(&budget, &counter));
            }
        });
        Self { task }
    }

    pub fn stop(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(start_paused = true)]
    async fn a_line_every_period_with_items_done_and_planned_and_none_after_stop() {
        let budget = Arc::new(Budget::new(Some(100), Duration::from_secs(3600)));
        let counter = Arc::new(RequestCounter::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let p = Progress::start_with(EVERY, budget.clone(), counter, move |s| {
            crate::pass::lock(&sink).push((s.items_done, s.items_planned));
        });
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(
            crate::pass::lock(&seen).is_empty(),
            "nothing before the first period"
        );
        for _ in 0..3 {
            budget.take().unwrap();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        budget.plan(40);
        budget.take().unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            *crate::pass::lock(&seen),
            [(3, Some(100)), (4, Some(40))],
            "max-items until the pass plans"
        );
        p.stop();
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(crate::pass::lock(&seen).len(), 2, "no line after stop");
    }
}
