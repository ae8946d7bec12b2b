//! The walk's slots, and fetching ahead while the snapshot is read.
//!
//! A large window diffs against one snapshot of what SpiceDB holds (`apply::snapshot`), read
//! while the first scopes are fetched upstream. A scope that has its members before the snapshot
//! is there must wait for it. Holding its walk slot while it waits stalled the walk for as long
//! as the export ran (seconds at 200k relationships), with the upstream's pace unused: so a
//! waiting scope gives its slot back, and the walk fetches on, as long as the members held by
//! waiting scopes stay under a budget. Past the budget a scope waits in its slot, as before, so
//! memory stays bounded however large the channels are (docs/performance.md "relsync").

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Members that scopes waiting for the snapshot may hold between them (about 200 bytes each
/// while a scope waits: its desired relationships).
pub const WAITING_MEMBERS: usize = 64 * 1024;

/// How many scopes the walk keeps started beyond its slots, so scopes past a waiting one can be
/// fetched; their results are taken in order.
pub const AHEAD_SCOPES: usize = 512;

/// The walk's slots (its `--concurrency`) and the budget of members waiting outside them.
pub struct Slots {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    budget: usize,
}

/// A scope's slot; `None` while it waits outside it.
pub type Slot = Option<OwnedSemaphorePermit>;

impl Slots {
    pub fn new(concurrency: usize, budget: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            waiting: AtomicUsize::new(0),
            budget,
        }
    }

    /// Wait for a slot (in the order asked: the semaphore is fair).
    pub async fn take(&self) -> Slot {
        // The semaphore is never closed, so this is always a permit.
        self.slots.clone().acquire_owned().await.ok()
    }

    /// Reserve room for `members` waiting outside a slot; false when it would pass the budget.
    /// An empty scope always fits.
    pub fn reserve(&self, members: usize) -> bool {
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (members == 0 || w + members <= self.budget).then_some(w + members)
            })
            .is_ok()
    }

    pub fn release(&self, members: usize) {
        self.waiting.fetch_sub(members, Ordering::SeqCst);
    }

    /// Run `wait` outside the scope's slot when `members` fit the budget (taking a slot again
    /// after), else inside it.
    pub async fn outside<T>(
        &self,
        slot: &mut Slot,
        members: usize,
        wait: impl Future<Output = T>,
    ) -> T {
        if !self.reserve(members) {
            return wait.await;
        }
        *slot = None;
        let out = wait.await;
        self.release(members);
        *slot = self.take().await;
        out
    }

    #[cfg(test)]
    fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_admits_members_up_to_its_size_and_always_an_empty_scope() {
        let s = Slots::new(2, 100);
        assert!(s.reserve(60));
        assert!(!s.reserve(41), "60 + 41 passes the budget");
        assert!(s.reserve(40));
        assert!(s.reserve(0), "an empty scope holds nothing");
        assert!(!s.reserve(1));
        s.release(60);
        assert!(s.reserve(60));
    }

    #[test]
    fn a_scope_larger_than_the_whole_budget_waits_in_its_slot() {
        let s = Slots::new(1, 10);
        assert!(!s.reserve(11));
    }

    #[tokio::test]
    async fn a_scope_waiting_outside_frees_its_slot_and_takes_one_again() {
        let s = Arc::new(Slots::new(1, 100));
        let mut slot = s.take().await;
        assert_eq!(s.available(), 0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s2 = s.clone();
        let waiter = tokio::spawn(async move {
            let got = s2.outside(&mut slot, 10, rx).await;
            (got.is_ok(), slot)
        });
        // While it waits, another scope gets the one slot.
        let other = tokio::time::timeout(std::time::Duration::from_secs(5), s.take())
            .await
            .expect("the waiting scope gave its slot back");
        assert!(other.is_some());
        drop(other);
        tx.send(()).expect("the waiter is alive");
        let (got, slot) = waiter.await.expect("no panic");
        assert!(got && slot.is_some(), "it holds a slot again after waiting");
        assert_eq!(s.available(), 0);
        drop(slot);
        assert_eq!(s.available(), 1);
        assert!(s.reserve(100), "its members were released");
    }

    #[tokio::test]
    async fn over_the_budget_a_scope_keeps_its_slot_while_it_waits() {
        let s = Arc::new(Slots::new(1, 5));
        let mut slot = s.take().await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.outside(&mut slot, 10, rx).await.is_ok() });
        tokio::task::yield_now().await;
        let other = tokio::time::timeout(std::time::Duration::from_millis(200), s.take()).await;
        assert!(other.is_err(), "the slot stayed taken");
        tx.send(()).expect("the waiter is alive");
        assert!(waiter.await.expect("no panic"));
    }
}
