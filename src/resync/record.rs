//! What resync records on each binding, pure: the per-API counts and the `Conflicts` condition
//! of a synced binding, `InstancesReleased` on a released one. Only the fields resync owns
//! (docs/resync.md; the contract's "Who writes what"). The writes themselves are in `mod.rs`
//! (synced bindings) and `release.rs` (deleting ones).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{BindingRef, Counts};
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::condition::{CONFLICTS, CONSUMER_PINNED, INSTANCES_RELEASED};

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
        let mut msg = format!(
            "objects not synced because of a conflict (see their core.kbind.io/conflict annotation): {}",
            detail.join(", ")
        );
        if b.adopt_refused {
            msg.push_str(&format!("; conflictPolicy Adopt is not in effect: Connection {}'s spec.adoptionNamespaces does not let this namespace adopt provider objects kbind did not create", b.connection));
        }
        conds.set_condition(
            CONFLICTS,
            S::True,
            "ConflictsFound",
            &msg,
            b.generation,
            now,
        )
    } else {
        conds.set_condition(CONFLICTS, S::False, "NoConflicts", "", b.generation, now)
    };
    let changed_pin = consumer_pinned(&mut conds, b, mine, complete, now);
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
    if !changed_cond && !changed_pin && !changed_counts {
        return None;
    }
    let apis: Vec<Value> = mine
        .iter()
        .map(|(api, c)| json!({"name": api, "inSync": c.in_sync, "pending": c.pending, "conflictCount": c.conflicts, "denied": c.denied, "rejected": c.rejected, "orphaned": c.orphaned}))
        .collect();
    let conflicts: Vec<_> = conds
        .into_iter()
        .filter(|c| c.type_ == CONFLICTS || c.type_ == CONSUMER_PINNED)
        .collect();
    let mut resync = json!({"lastPassTime": now.to_string()});
    if complete {
        resync["lastCompleteTime"] = json!(now.to_string());
    }
    Some(json!({"boundAPIs": apis, "conditions": conflicts, "resync": resync}))
}

/// The `ConsumerPinned` reason while the provider refuses this consumer's writes unpinned.
pub const NOT_PINNED: &str = "NotPinned";

/// `ConsumerPinned`: False `NotPinned` while the provider's Grant refuses this consumer's
/// writes for want of a pinned consumer cluster, naming what to do; True `Pinned` once a whole
/// run met no such refusal. Never added to a binding that never met one. Whether it changed.
fn consumer_pinned(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    b: &BindingRef,
    mine: &[(&String, &Counts)],
    complete: bool,
    now: Timestamp,
) -> bool {
    let unpinned: i64 = mine.iter().map(|(_, c)| c.unpinned).sum();
    if unpinned > 0 {
        let msg = format!(
            "the provider refuses this consumer's writes ({unpinned} objects) until its Grant pins this cluster: the Connection's Secret must name the Grant (bind with the kubeconfig kbind issue wrote, or kbind bind --grant-secret), kbind resync then labels its heartbeat with it, and the provider's next kbind issue run pins it"
        );
        return conds.set_condition(
            CONSUMER_PINNED,
            S::False,
            NOT_PINNED,
            &msg,
            b.generation,
            now,
        );
    }
    let seen = conds.iter().any(|c| c.type_ == CONSUMER_PINNED);
    seen && complete
        && conds.set_condition(CONSUMER_PINNED, S::True, "Pinned", "", b.generation, now)
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
    instances_released(conds)
}

/// `InstancesReleased=False ConnectionQuarantined` for a deleting ClusterBinding whose provider
/// copies must be marked orphaned first, through a Connection this run may not contact: the
/// unbind waits, and says what ends the wait. `None` when it says so already.
pub fn held_status(b: &BindingRef, now: Timestamp) -> Option<Value> {
    let mut conds = b.status.conditions.clone();
    let message = format!(
        "waiting: Connection {} is quarantined (two runs of kbind resync in a row died syncing \
         through it), so the provider copies cannot be marked {}={} yet; change the \
         Connection's spec or clear the quarantine on the kbind-resync Lease (with \
         -<i>-of-<n> when sharded; docs/operations.md \"Poison items\") and the next run \
         finishes the unbind",
        b.connection,
        crate::api::keys::ORPHANED,
        crate::api::keys::ORPHANED_UNBOUND
    );
    conds
        .set_condition(
            INSTANCES_RELEASED,
            S::False,
            "ConnectionQuarantined",
            &message,
            b.generation,
            now,
        )
        .then(|| instances_released(conds))
}

/// The status resync applies on a deleting binding: its `InstancesReleased` condition alone.
fn instances_released(
    conds: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Value {
    let owned: Vec<_> = conds
        .into_iter()
        .filter(|c| c.type_ == INSTANCES_RELEASED)
        .collect();
    json!({"conditions": owned})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BindingKey;
    use crate::api::conditions::Conditions;
    use crate::api::core::{BindingStatus, ConflictPolicy, OrphanPolicy};

    fn binding(
        conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    ) -> BindingRef {
        BindingRef {
            key: BindingKey {
                namespace: None,
                name: "b".into(),
            },
            connection: "c".into(),
            apis: vec!["widgets.example.org".into()],
            policy: ConflictPolicy::Fail,
            adopt_refused: false,
            admitted: true,
            orphans: OrphanPolicy::Keep,
            deleting: false,
            has_cleanup: false,
            uid: "u".into(),
            created: None,
            generation: Some(1),
            status: BindingStatus {
                conditions,
                ..Default::default()
            },
        }
    }

    fn pinned_after(
        b: &BindingRef,
        counts: Counts,
        complete: bool,
    ) -> (Option<Value>, Option<(String, String)>) {
        let api = "widgets.example.org".to_string();
        let out = binding_status(b, &[(&api, &counts)], complete, Timestamp::UNIX_EPOCH);
        let cond = out.as_ref().and_then(|v| {
            v["conditions"].as_array()?.iter().find_map(|c| {
                (c["type"] == CONSUMER_PINNED).then(|| {
                    (
                        c["status"].as_str().unwrap_or_default().to_string(),
                        c["reason"].as_str().unwrap_or_default().to_string(),
                    )
                })
            })
        });
        (out, cond)
    }

    /// Unpinned refusals make `ConsumerPinned=False NotPinned` naming what to do; a whole run
    /// without them turns it True; a binding that never met one never gets the condition; and
    /// an unchanged state writes nothing.
    #[test]
    fn consumer_pinned_follows_the_grants_refusals() {
        let refused = Counts {
            denied: 2,
            unpinned: 2,
            ..Default::default()
        };
        let (out, cond) = pinned_after(&binding(vec![]), refused.clone(), true);
        assert_eq!(cond, Some(("False".into(), "NotPinned".into())));
        let msg = out.unwrap()["conditions"].to_string();
        assert!(
            msg.contains("--grant-secret") && msg.contains("2 objects"),
            "{msg}"
        );

        let mut conds = vec![];
        conds.set_condition(
            CONFLICTS,
            S::False,
            "NoConflicts",
            "",
            Some(1),
            Timestamp::UNIX_EPOCH,
        );
        let never = binding(conds.clone());
        let synced = Counts {
            in_sync: 2,
            ..Default::default()
        };
        let (_, cond) = pinned_after(&never, synced.clone(), true);
        assert_eq!(cond, None, "never refused: no condition");

        let mut was = conds.clone();
        let (out, _) = pinned_after(&binding(vec![]), refused.clone(), true);
        let c: k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition =
            serde_json::from_value(out.unwrap()["conditions"][1].clone()).unwrap();
        was.push(c);
        let refused_before = binding(was);
        // Still refused, same counts: nothing to write.
        let mut before = refused_before.clone();
        before.status.bound_apis = vec![
            serde_json::from_value(serde_json::json!({
            "name": "widgets.example.org", "inSync": 0, "pending": 0, "conflictCount": 0,
            "denied": 2, "rejected": 0, "orphaned": 0}))
            .unwrap(),
        ];
        assert_eq!(pinned_after(&before, refused, true).0, None);
        // A partial run that met no refusal proves nothing yet.
        let (_, cond) = pinned_after(&refused_before, synced.clone(), false);
        assert_eq!(cond, Some(("False".into(), "NotPinned".into())));
        // A whole run without one: pinned.
        let (_, cond) = pinned_after(&refused_before, synced, true);
        assert_eq!(cond, Some(("True".into(), "Pinned".into())));
    }

    /// A Binding asking for Adopt where its Connection does not let it adopt: its conflicts say
    /// why Adopt is not in effect, and name the Connection's field.
    #[test]
    fn conflicts_under_a_refused_adopt_say_so() {
        let conflicts = Counts {
            conflicts: 1,
            ..Default::default()
        };
        let msg = |b: &BindingRef| {
            let (out, _) = pinned_after(b, conflicts.clone(), true);
            out.unwrap()["conditions"][0]["message"].to_string()
        };
        let mut b = binding(vec![]);
        assert!(!msg(&b).contains("adoptionNamespaces"), "{}", msg(&b));
        b.adopt_refused = true;
        let m = msg(&b);
        assert!(
            m.contains("widgets.example.org: 1")
                && m.contains("Connection c's spec.adoptionNamespaces"),
            "{m}"
        );
    }

    /// A deleting binding held by its quarantined Connection says so once, naming the Connection
    /// and how to end the wait; held again, nothing changes; released, the condition turns True.
    #[test]
    fn a_binding_held_by_a_quarantined_connection_says_so_once() {
        let mut b = binding(vec![]);
        b.deleting = true;
        let out = held_status(&b, Timestamp::UNIX_EPOCH).expect("first time: written");
        let c = &out["conditions"][0];
        assert_eq!(out["conditions"].as_array().map(Vec::len), Some(1), "{out}");
        assert_eq!(
            (&c["type"], &c["status"], &c["reason"]),
            (
                &json!("InstancesReleased"),
                &json!("False"),
                &json!("ConnectionQuarantined")
            )
        );
        let m = c["message"].as_str().unwrap();
        for needle in [
            "Connection c is quarantined",
            "Poison items",
            "kbind-resync Lease",
        ] {
            assert!(m.contains(needle), "{needle}: {m}");
        }
        b.status.conditions = serde_json::from_value(out["conditions"].clone()).unwrap();
        assert_eq!(held_status(&b, Timestamp::UNIX_EPOCH), None, "unchanged");
        let released = released_status(&b, Timestamp::UNIX_EPOCH);
        assert_eq!(released["conditions"][0]["status"], "True");
    }
}
