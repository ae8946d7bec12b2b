//! The loop over a pass's root objects, owned by the framework (docs/architecture.md "The life
//! of a run"): which roots a run takes and in what order (this shard's, by name, from where the
//! last budget-limited run stopped when the pass resumes by the pass Lease), the budget, poison
//! isolation (src/pass/poison.rs) when the pass asks for it, each root's errors kept to that
//! root, and the cursor the next run resumes after. A pass says only what one root's turn is
//! ([`Roots`]): observe → plan → apply → record stays in its own files.
//!
//! Finalizers follow kube-runtime's `finalizer` helper: a live root is *applied*, a deleting one
//! the pass still holds is *cleaned up*, and any other deleting root gets no turn ([`Phase`]);
//! what "holds" means is the pass's (its finalizer, or work left such as schema's bindings).

use std::fmt::Display;

use super::Shard;
use super::budget::{Budget, Exhausted};
use super::poison::{Tracker, Verdict};

/// What a root's turn does, decided from the root alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Live: bring it and what it owns to its spec (adding the pass's finalizer first).
    Apply,
    /// Deleting, and the pass still holds it (its finalizer, or what it owns): clean up.
    Cleanup,
    /// Deleting with nothing left for the pass: no turn, no budget, the cursor stays.
    Done,
}

impl Phase {
    /// kube-runtime's split: `deleting` roots are cleaned up only while the pass `holds` them.
    pub fn of(deleting: bool, holds: bool) -> Self {
        match (deleting, holds) {
            (false, _) => Self::Apply,
            (true, true) => Self::Cleanup,
            (true, false) => Self::Done,
        }
    }
}

/// What a pass knows of one root before its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Gone since the run observed it: no turn, no budget.
    Absent,
    /// Nothing to do this run (unchanged between full sweeps): counted done, no budget, and
    /// the resume point does not move.
    Unchanged,
    /// Due, at this generation (poison isolation records it).
    Due { generation: i64, phase: Phase },
}

/// Why a turn ended early.
#[derive(Debug)]
pub enum TurnError<E> {
    /// The root failed: logged and counted; the others go on, the next run retries it.
    Failed(E),
    /// The budget ran out inside the turn (a pass that takes items per write): the walk stops.
    Exhausted(Exhausted),
}

impl<E> From<Exhausted> for TurnError<E> {
    fn from(e: Exhausted) -> Self {
        Self::Exhausted(e)
    }
}

/// A pass's side of the walk: one root's turn.
pub trait Roots {
    type Error: Display;
    /// What the walk should do with `name`; may count what the pass reports (e.g. unchanged).
    fn look(&mut self, name: &str) -> Look;
    /// A root two runs in a row died on (only in a walk [`Walk::isolated`]): not contacted;
    /// the pass says so where it reports.
    fn quarantined(&mut self, name: &str, generation: i64) -> impl Future<Output = ()> {
        let _ = (name, generation);
        async {}
    }
    /// A live root ([`Phase::Apply`]).
    fn apply(&mut self, name: &str) -> impl Future<Output = Result<(), TurnError<Self::Error>>>;
    /// A deleting root the pass still holds ([`Phase::Cleanup`]); a pass that never says
    /// `Cleanup` has none.
    fn cleanup(&mut self, name: &str) -> impl Future<Output = Result<(), TurnError<Self::Error>>> {
        let _ = name;
        async { Ok(()) }
    }
}

/// How the walk spends the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Items {
    /// One item per root that is due (schema: a Connection is the unit of work).
    PerRoot,
    /// The turn takes its own items (per write); the walk only checks some are left.
    PerWrite,
}

/// The walk of one run: this shard's roots, in order, and how they are guarded.
#[derive(Clone, Debug)]
pub struct Walk {
    /// The kind logs and poison isolation name roots by (`Connection`).
    kind: &'static str,
    order: Vec<String>,
    /// Where the last run stopped: kept when this one stops before working on any root.
    resume_after: Option<String>,
    items: Items,
    /// Whether roots are isolated against poison (a root two runs died on is skipped).
    poison: bool,
}

/// How a walk ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walked {
    /// Roots whose turn came and went, unchanged ones included.
    pub done: u64,
    /// Roots whose turn failed.
    pub failed: u64,
    /// The last root worked on: the next run resumes after it when this one stopped.
    pub last: Option<String>,
    /// Why the walk stopped before its last root.
    pub stopped: Option<Exhausted>,
    /// Roots left for the next run.
    pub left: u64,
}

impl Walk {
    /// This shard's `names`, sorted, starting after `resume_after` and wrapping around, so a
    /// budget-limited schedule reaches every root in turn. A pass whose order carries meaning
    /// (the first Grant pins a cluster) passes no `resume_after`.
    pub fn new(
        kind: &'static str,
        names: impl IntoIterator<Item = String>,
        shard: Option<Shard>,
        resume_after: Option<&str>,
    ) -> Self {
        let mut order: Vec<String> = names
            .into_iter()
            .filter(|n| super::shard::owns(shard, n))
            .collect();
        order.sort();
        order.dedup();
        if let Some(after) = resume_after {
            let split = order.partition_point(|n| n.as_str() <= after);
            order.rotate_left(split);
        }
        Self {
            kind,
            order,
            resume_after: resume_after.map(str::to_string),
            items: Items::PerRoot,
            poison: false,
        }
    }

    /// Spend the budget as `items` says (default: [`Items::PerRoot`]).
    pub fn items(mut self, items: Items) -> Self {
        self.items = items;
        self
    }

    /// Isolate roots against poison: a root two runs in a row died on is skipped until it
    /// changes (src/pass/poison.rs).
    pub fn isolated(mut self) -> Self {
        self.poison = true;
        self
    }

    /// The roots in the order they are walked.
    pub fn order(&self) -> &[String] {
        &self.order
    }

    /// How poison isolation names root `name`.
    pub fn item(&self, name: &str) -> String {
        super::poison::item(self.kind, None, name)
    }

    /// Walk the roots until the last, or until the budget or the deadline ends the run.
    pub async fn run<R: Roots>(&self, budget: &Budget, poison: &Tracker, roots: &mut R) -> Walked {
        let mut walked = Walked::default();
        for (i, name) in self.order.iter().enumerate() {
            let (generation, phase) = match roots.look(name) {
                Look::Absent => continue,
                Look::Unchanged => {
                    walked.done += 1;
                    continue;
                }
                Look::Due {
                    phase: Phase::Done, ..
                } => continue,
                Look::Due { generation, phase } => (generation, phase),
            };
            let spent = match self.items {
                Items::PerRoot => budget.take(),
                Items::PerWrite => budget.check(),
            };
            if let Err(why) = spent {
                self.stop(&mut walked, why, i);
                break;
            }
            match self.turn(poison, roots, name, generation, phase).await {
                Err(TurnError::Exhausted(why)) => {
                    self.stop(&mut walked, why, i);
                    break;
                }
                Err(TurnError::Failed(e)) => {
                    tracing::warn!(kind = self.kind, name = %name, error = %e, "not reconciled; the next run retries");
                    walked.failed += 1;
                }
                Ok(()) => {}
            }
            walked.done += 1;
            walked.last = Some(name.clone());
        }
        walked
    }

    /// The walk stops at root `i`: it and those after it are left, and a run that worked on no
    /// root keeps the cursor it started from (else the next would start over at the first).
    fn stop(&self, walked: &mut Walked, why: Exhausted, i: usize) {
        walked.stopped = Some(why);
        walked.left = (self.order.len() - i) as u64;
        if walked.last.is_none() {
            walked.last.clone_from(&self.resume_after);
        }
    }

    /// One root's turn, inside poison isolation when the walk has it.
    async fn turn<R: Roots>(
        &self,
        poison: &Tracker,
        roots: &mut R,
        name: &str,
        generation: i64,
        phase: Phase,
    ) -> Result<(), TurnError<R::Error>> {
        let item = self.item(name);
        if self.poison {
            if poison.check(&item, generation) == Verdict::Quarantined {
                tracing::warn!(kind = self.kind, name = %name, generation, "skipped: two runs in a row died while working on it (docs/operations.md \"Poison items\")");
                roots.quarantined(name, generation).await;
                return Ok(());
            }
            poison.enter(&item, generation).await;
        }
        let result = match phase {
            Phase::Apply => roots.apply(name).await,
            Phase::Cleanup => roots.cleanup(name).await,
            Phase::Done => Ok(()), // never walked: `run` skips it
        };
        if self.poison {
            poison.leave(&item);
        }
        result
    }
}

impl Walked {
    /// The run's stop, for the summary and the pass Lease: where the next run resumes.
    pub fn stopped(&self, what: &str) -> Option<super::Stopped> {
        self.stopped.as_ref().map(|why| super::Stopped {
            message: format!(
                "stopped early ({why:?}); {} {what} left for the next run",
                self.left
            ),
            resume_after: self.last.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
