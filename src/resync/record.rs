//! What resync records on each binding, pure: the per-API counts and the `Conflicts` condition
//! of a synced binding, `InstancesReleased` on a released one. Only the fields resync owns
//! (docs/resync.md; the contract's "Who writes what"). The writes themselves are in `mod.rs`
//! (synced bindings) and `release.rs` (deleting ones).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{BindingRef, Counts};
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::condition::{CONFLICTS, INSTANCES_RELEASED};

/// The status to apply on `b` for its per-API counts `mine` (this run's), or `None` when neither
/// the counts nor the Conflicts condition changed. `complete`: the run went over everything.
pub fn binding_status(
    b: &BindingRef,
    mine: &[(&String, &Counts)],
    complete: bool,
    now: Timestamp,
) -> Option<Value> {
    let total_conflicts: i64 = mine.iter().map(|(_, c)| c.conflicts).sum();
    let mut conds = b.status.conditions.clone();
    let changed_cond = if total_conflicts > 0 {
        let detail: Vec<String> = mine
            .iter()
            .filter(|(_, c)| c.conflicts > 0)
            .map(|(a, c)| format!("{a}: {}", c.conflicts))
            .collect();
        conds.set_condition(CONFLICTS, S::True, "ConflictsFound", &format!("objects not synced because of a conflict (see their core.kbind.io/conflict annotation): {}", detail.join(", ")), b.generation, now)
    } else {
        conds.set_condition(CONFLICTS, S::False, "NoConflicts", "", b.generation, now)
    };
    let changed_counts = mine.iter().any(|(api, c)| {
        let prev = b.status.bound_apis.iter().find(|x| &&x.name == api);
        let got = prev.map(|p| {
            (
                p.in_sync,
                p.pending,
                p.conflict_count,
                p.denied,
                p.rejected,
                p.orphaned,
            )
        });
        got != Some((
            Some(c.in_sync),
            Some(c.pending),
            Some(c.conflicts),
            Some(c.denied),
            Some(c.rejected),
            Some(c.orphaned),
        ))
    });
    if !changed_cond && !changed_counts {
        return None;
    }
    let apis: Vec<Value> = mine
        .iter()
        .map(|(api, c)| json!({"name": api, "inSync": c.in_sync, "pending": c.pending, "conflictCount": c.conflicts, "denied": c.denied, "rejected": c.rejected, "orphaned": c.orphaned}))
        .collect();
    let conflicts: Vec<_> = conds.into_iter().filter(|c| c.type_ == CONFLICTS).collect();
    let mut resync = json!({"lastPassTime": now.to_string()});
    if complete {
        resync["lastCompleteTime"] = json!(now.to_string());
    }
    Some(json!({"boundAPIs": apis, "conditions": conflicts, "resync": resync}))
}

/// `InstancesReleased=True` for a deleting binding whose instances are released.
pub fn released_status(b: &BindingRef, now: Timestamp) -> Value {
    let mut conds = b.status.conditions.clone();
    conds.set_condition(
        INSTANCES_RELEASED,
        S::True,
        "Released",
        "instance finalizers released; provider copies left in place",
        b.generation,
        now,
    );
    let owned: Vec<_> = conds
        .into_iter()
        .filter(|c| c.type_ == INSTANCES_RELEASED)
        .collect();
    json!({"conditions": owned})
}
