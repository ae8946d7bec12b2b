//! Which Grants a run works on (docs/issue.md "Full sweeps"). With `--full-sweep-every`, a run
//! works on every Grant only when the last full sweep is that old; runs in between work only
//! on Grants that changed or wait for something a run can now do (a heartbeat to pin, an
//! approval given), so the CronJob can run every minute, and a consumer's first heartbeat is
//! pinned within a minute, while token rotation and drift repair keep the full sweep's pace.

use crate::api::iam::{APPROVE_CONSUMER_CLUSTER, APPROVE_HANDOVER, Grant, REVOKE_FINALIZER};
use crate::issue::record::{CONSUMER_PINNED, READY};

use super::{HANDOVER_APPROVAL_REQUIRED, Heartbeat, candidates};
use crate::issue::render::GrantRef;

/// Why `g` is worked on in a run that works only on what changed; `None`: nothing of it
/// changed, and nothing it waits for can have come (its heartbeats: `heartbeats`).
pub fn changed(g: &Grant, heartbeats: &[Heartbeat]) -> Option<&'static str> {
    let has_fin = crate::pass::finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER);
    if g.metadata.deletion_timestamp.is_some() {
        return has_fin.then_some("deleting");
    }
    if !has_fin {
        return Some("new");
    }
    let status = g.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation);
    if observed.is_none() || observed != g.metadata.generation {
        return Some("spec changed");
    }
    let annotation = |key: &str| {
        g.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let reason = |ty: &str| {
        status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ty)
                .map(|c| c.reason.as_str())
        })
    };
    if reason(READY) == Some(HANDOVER_APPROVAL_REQUIRED) && annotation(APPROVE_HANDOVER).is_some() {
        return Some("a hand-over approved");
    }
    if status.is_some_and(|s| s.consumer_cluster.is_some()) {
        return None;
    }
    let grant = GrantRef {
        name: g.metadata.name.as_deref().unwrap_or_default(),
        uid: "",
        created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
    };
    let uids = candidates(grant, heartbeats);
    if uids.is_empty() {
        return None;
    }
    // A UID waiting for a person (or taken by another Grant) is looked at again only once a
    // person approved one of them; a full sweep still looks at it.
    match reason(CONSUMER_PINNED) {
        Some("ApprovalRequired" | "ConsumerClusterTaken") => annotation(APPROVE_CONSUMER_CLUSTER)
            .filter(|a| uids.iter().any(|u| u == a))
            .map(|_| "a pin approved"),
        _ => Some("a heartbeat to pin"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn grant(v: serde_json::Value) -> Grant {
        let mut base = json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": "g", "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": [REVOKE_FINALIZER]},
            "spec": {"export": "e", "consumer": "c", "tokenTTL": "1h", "namespaces": ["a"]},
            "status": {"observedGeneration": 2, "conditions": []}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn cond(ty: &str, reason: &str) -> serde_json::Value {
        json!({"type": ty, "status": "False", "reason": reason, "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn beat(uid: &str, at: &str) -> Heartbeat {
        Heartbeat {
            created: at.parse::<Timestamp>().unwrap(),
            name: "kbind-grant-g".into(),
            cluster: Some(uid.into()),
        }
    }

    #[test]
    fn a_grant_is_worked_on_between_full_sweeps_only_when_a_run_can_do_something() {
        let later = [beat("u1", "2026-01-02T00:00:00Z")];
        let before = [beat("u1", "2025-12-31T00:00:00Z")];
        let pinned = json!({"status": {"consumerCluster": "u1"}});
        let approval = |key: &str, v: &str| json!({"metadata": {"annotations": {key: v}}});
        let waiting =
            |reason: &str| json!({"status": {"conditions": [cond(CONSUMER_PINNED, reason)]}});
        let cases: Vec<(&str, serde_json::Value, &[Heartbeat], Option<&str>)> = vec![
            ("settled, pinned", pinned.clone(), &later, None),
            (
                "new",
                json!({"metadata": {"finalizers": []}}),
                &[],
                Some("new"),
            ),
            (
                "spec changed",
                json!({"metadata": {"generation": 3}}),
                &[],
                Some("spec changed"),
            ),
            (
                "never recorded",
                json!({"status": {"observedGeneration": null}}),
                &[],
                Some("spec changed"),
            ),
            (
                "deleting",
                json!({"metadata": {"deletionTimestamp": "2026-01-03T00:00:00Z"}}),
                &[],
                Some("deleting"),
            ),
            (
                "deleted, revoked",
                json!({"metadata": {"deletionTimestamp": "2026-01-03T00:00:00Z", "finalizers": []}}),
                &[],
                None,
            ),
            ("no heartbeat yet", json!({}), &[], None),
            (
                "a heartbeat to pin",
                waiting("WaitingForHeartbeat"),
                &later,
                Some("a heartbeat to pin"),
            ),
            ("a heartbeat older than the Grant", json!({}), &before, None),
            (
                "waiting for a person",
                waiting("ApprovalRequired"),
                &later,
                None,
            ),
            (
                "another UID approved",
                {
                    let mut v = waiting("ApprovalRequired");
                    merge(&mut v, approval(APPROVE_CONSUMER_CLUSTER, "u2"));
                    v
                },
                &later,
                None,
            ),
            (
                "approved",
                {
                    let mut v = waiting("ApprovalRequired");
                    merge(&mut v, approval(APPROVE_CONSUMER_CLUSTER, "u1"));
                    v
                },
                &later,
                Some("a pin approved"),
            ),
            (
                "taken, not approved",
                waiting("ConsumerClusterTaken"),
                &later,
                None,
            ),
            (
                "hand-over waiting",
                {
                    let mut v = json!({"status": {"conditions": [cond(READY, HANDOVER_APPROVAL_REQUIRED)]}});
                    merge(&mut v, pinned.clone());
                    v
                },
                &[],
                None,
            ),
            (
                "hand-over approved",
                {
                    let mut v = json!({"status": {"conditions": [cond(READY, HANDOVER_APPROVAL_REQUIRED)]}});
                    merge(&mut v, pinned.clone());
                    merge(&mut v, approval(APPROVE_HANDOVER, "a"));
                    v
                },
                &[],
                Some("a hand-over approved"),
            ),
        ];
        for (what, patch, beats, want) in cases {
            assert_eq!(changed(&grant(patch), beats), want, "{what}");
        }
    }
}
