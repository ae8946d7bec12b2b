//! Whether a run between full sweeps has anything to do (docs/issue.md "Full sweeps"). With
//! `--full-sweep-every`, a run sweeps fully when the last full sweep is that old; a run in
//! between reads only the Grants and heartbeats, and sweeps fully at once when a Grant is new,
//! changed, deleting, has a token due, or waits for something a run can now do (a heartbeat to
//! pin, an approval given); else it stops. So the CronJob can run every minute, and a
//! consumer's first heartbeat is pinned within a minute, while a quiet provider is read no
//! more than before. A change elsewhere (an Export, a namespace let go) waits for the full
//! sweep, as it waited for the next run before.

use crate::api::iam::{APPROVE_CONSUMER_CLUSTER, APPROVE_HANDOVER, Grant, REVOKE_FINALIZER};
use crate::issue::record::{CONSUMER_PINNED, READY};

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::{
    HANDOVER_APPROVAL_REQUIRED, Heartbeat, ISSUED, WAITING_FOR_HEARTBEAT, candidates, token_ttl,
};
use crate::issue::render::GrantRef;

/// Why `g` is worked on in a run that works only on what changed; `None`: nothing of it
/// changed, and nothing it waits for can have come but from elsewhere (an Export created, a
/// namespace let go), which the next full sweep sees (its heartbeats: `heartbeats`).
pub fn changed(
    g: &Grant,
    heartbeats: &[Heartbeat],
    (reissue_before, now): (Option<Duration>, Timestamp),
) -> Option<&'static str> {
    let has_fin = crate::pass::finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER);
    if g.metadata.deletion_timestamp.is_some() {
        return has_fin.then_some("deleting");
    }
    let status = g.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation);
    if observed.is_none() {
        return Some("new");
    }
    if observed != g.metadata.generation {
        return Some("spec changed");
    }
    // Recorded for this generation and still without its finalizer: blocked (an Export
    // missing, a namespace taken); what unblocks it changes elsewhere, and the full sweep
    // finds it.
    if !has_fin {
        return None;
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
    if handover_approved(g) {
        return Some("a hand-over approved");
    }
    // Only an issued Grant is pinned or has its token re-issued: a blocked one's heartbeat
    // and expiring token wait for what unblocks it (else it would make every run sweep).
    if reason(READY) != Some(ISSUED) {
        return None;
    }
    // A token due for re-issue: at the first run it is due, not at the next full sweep.
    if let (Some(expires), Ok(ttl)) = (
        status.and_then(|s| s.expires_at.as_ref()),
        token_ttl(&g.spec),
    ) {
        let before = reissue_before.unwrap_or(ttl / 3);
        let left = expires.0.duration_since(now);
        if left.is_negative() || Duration::try_from(left).is_ok_and(|l| l <= before) {
            return Some("a token due");
        }
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
    // A UID waiting for a person is looked at again only once a person approved it; one another
    // Grant holds never pins, approved or not; a full sweep still looks at both.
    match reason(CONSUMER_PINNED) {
        Some("ApprovalRequired") => annotation(APPROVE_CONSUMER_CLUSTER)
            .filter(|a| uids.iter().any(|u| u == a))
            .map(|_| "a pin approved"),
        Some("ConsumerClusterTaken") => None,
        _ => Some("a heartbeat to pin"),
    }
}

/// Whether `g` waits for a hand-over approval that now names a place its status asks about (an
/// approval of another place would change nothing, run after run).
fn handover_approved(g: &Grant) -> bool {
    let ready = g
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    let approved = g
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(APPROVE_HANDOVER));
    let (Some(c), Some(approved)) = (ready, approved) else {
        return false;
    };
    c.reason == HANDOVER_APPROVAL_REQUIRED
        && approved.split(',').map(str::trim).any(|a| {
            let asked = format!("{APPROVE_HANDOVER}={a}");
            c.message.ends_with(&asked) || c.message.contains(&format!("{asked};"))
        })
}

/// How long after it was issued a Grant still waiting for its first heartbeat is followed by
/// the pin window: onboarding (`kbind issue`, the kubeconfig handed over, `kbind bind`) mostly
/// happens within it, and past it a consumer's first pin takes the next run, as before.
pub const PIN_FOLLOW: Duration = Duration::from_secs(3600);

/// Whether the pin window (docs/issue.md "Pin window") follows `g`: issued, waiting for its
/// first heartbeat (none names a UID yet) since less than [`PIN_FOLLOW`] before `now`, its
/// status of this generation. A run that sees a heartbeat for it then sweeps at once, so the
/// consumer's first writes wait seconds for the pin, not a period.
pub fn awaits_pin(g: &Grant, heartbeats: &[Heartbeat], now: Timestamp) -> bool {
    let has_fin = crate::pass::finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER);
    let Some(status) = g.status.as_ref() else {
        return false;
    };
    if g.metadata.deletion_timestamp.is_some()
        || !has_fin
        || status.observed_generation != g.metadata.generation
        || status.consumer_cluster.is_some()
    {
        return false;
    }
    let condition = |ty: &str| status.conditions.iter().find(|c| c.type_ == ty);
    if condition(READY).map(|c| c.reason.as_str()) != Some(ISSUED) {
        return false;
    }
    if condition(CONSUMER_PINNED).is_none_or(|c| c.reason != WAITING_FOR_HEARTBEAT)
        || waited_an_hour(g, now)
    {
        return false;
    }
    !names_a_uid(g, heartbeats)
}

/// Whether the pin window follows `g` after a sweep worked on it: the sweep left it issued and
/// waiting for its first heartbeat (`waiting`: a Grant issued in this very sweep too, whose
/// kubeconfig may be handed over within seconds), and it has not waited an hour already.
pub fn follows_after_sweep(g: &Grant, waiting: bool, now: Timestamp) -> bool {
    waiting && !waited_an_hour(g, now)
}

/// Whether `g`'s recorded status has waited for its first heartbeat for [`PIN_FOLLOW`].
fn waited_an_hour(g: &Grant, now: Timestamp) -> bool {
    g.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONSUMER_PINNED))
        .filter(|c| c.reason == WAITING_FOR_HEARTBEAT)
        .is_some_and(|c| {
            let since = now.duration_since(c.last_transition_time.0);
            Duration::try_from(since).is_ok_and(|s| s >= PIN_FOLLOW)
        })
}

/// Whether one of `g`'s heartbeats names a consumer cluster it could pin.
pub fn names_a_uid(g: &Grant, heartbeats: &[Heartbeat]) -> bool {
    let grant = GrantRef {
        name: g.metadata.name.as_deref().unwrap_or_default(),
        uid: "",
        created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
    };
    !candidates(grant, heartbeats).is_empty()
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
        let now: Timestamp = "2026-01-03T00:00:00Z".parse().unwrap();
        let issued = cond(READY, ISSUED);
        let waiting = |reason: &str| json!({"status": {"conditions": [cond(CONSUMER_PINNED, reason), issued.clone()]}});
        let handover = |message: &str| {
            let mut c = cond(READY, HANDOVER_APPROVAL_REQUIRED);
            c["message"] = json!(message);
            json!({"status": {"consumerCluster": "u1", "conditions": [c]}})
        };
        let asks = "namespace a holds another consumer's objects (such as widgets a/x). Empty it, or let this Grant have it: kubectl annotate grant g iam.kbind.io/approve-handover=a";
        let cases: Vec<(&str, serde_json::Value, &[Heartbeat], Option<&str>)> = vec![
            ("settled, pinned", pinned.clone(), &later, None),
            (
                "new",
                json!({"metadata": {"finalizers": []}, "status": null}),
                &[],
                Some("new"),
            ),
            (
                "blocked from the start",
                json!({"metadata": {"finalizers": []}}),
                &[],
                None,
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
                Some("new"),
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
            ("hand-over waiting", handover(asks), &[], None),
            (
                "hand-over approved",
                {
                    let mut v = handover(asks);
                    merge(&mut v, approval(APPROVE_HANDOVER, "b, a"));
                    v
                },
                &[],
                Some("a hand-over approved"),
            ),
            (
                "another place approved",
                {
                    let mut v = handover(asks);
                    merge(&mut v, approval(APPROVE_HANDOVER, "b"));
                    v
                },
                &[],
                None,
            ),
            (
                "blocked before its pin, with a heartbeat",
                json!({"status": {"conditions": [cond(CONSUMER_PINNED, "WaitingForHeartbeat"), cond(READY, "NamespaceTaken")]}}),
                &later,
                None,
            ),
            (
                "a token due",
                json!({"status": {"expiresAt": "2026-01-03T00:20:00Z", "consumerCluster": "u1", "conditions": [issued.clone()]}}),
                &[],
                Some("a token due"),
            ),
            (
                "a token expired",
                json!({"status": {"expiresAt": "2026-01-02T00:00:00Z", "conditions": [issued.clone()]}}),
                &[],
                Some("a token due"),
            ),
            (
                "a token expired while blocked",
                json!({"status": {"expiresAt": "2026-01-02T00:00:00Z", "conditions": [cond(READY, "NamespaceTaken")]}}),
                &[],
                None,
            ),
            (
                "a token not due",
                json!({"status": {"expiresAt": "2026-01-03T00:21:00Z", "conditions": [issued.clone()]}}),
                &[],
                None,
            ),
            (
                "taken, approved: another Grant holds it still",
                {
                    let mut v = waiting("ConsumerClusterTaken");
                    merge(&mut v, approval(APPROVE_CONSUMER_CLUSTER, "u1"));
                    v
                },
                &later,
                None,
            ),
        ];
        for (what, patch, beats, want) in cases {
            assert_eq!(changed(&grant(patch), beats, (None, now)), want, "{what}");
        }
    }

    #[test]
    fn the_pin_window_follows_an_issued_grant_waiting_for_its_first_heartbeat_for_an_hour() {
        let now: Timestamp = "2026-01-03T00:00:00Z".parse().unwrap();
        let later = [beat("u1", "2026-01-02T00:00:00Z")];
        let before = [beat("u1", "2025-12-31T00:00:00Z")];
        let since = |reason: &str, at: &str| {
            let mut c = cond(CONSUMER_PINNED, reason);
            c["lastTransitionTime"] = json!(at);
            c
        };
        let status = |pin: serde_json::Value, ready: &str| json!({"status": {"conditions": [pin, cond(READY, ready)]}});
        let waiting = status(since(WAITING_FOR_HEARTBEAT, "2026-01-02T23:30:00Z"), ISSUED);
        let cases: Vec<(&str, serde_json::Value, &[Heartbeat], bool)> = vec![
            (
                "issued half an hour ago, no heartbeat",
                waiting.clone(),
                &[],
                true,
            ),
            (
                "a heartbeat older than the Grant does not count",
                waiting.clone(),
                &before,
                true,
            ),
            (
                "its heartbeat came: the run sweeps, not the window",
                waiting.clone(),
                &later,
                false,
            ),
            (
                "waiting for an hour: the next run pins",
                status(since(WAITING_FOR_HEARTBEAT, "2026-01-02T23:00:00Z"), ISSUED),
                &[],
                false,
            ),
            (
                "pinned",
                {
                    let mut v = waiting.clone();
                    merge(&mut v, json!({"status": {"consumerCluster": "u1"}}));
                    v
                },
                &[],
                false,
            ),
            (
                "blocked",
                status(
                    since(WAITING_FOR_HEARTBEAT, "2026-01-02T23:30:00Z"),
                    "NamespaceTaken",
                ),
                &[],
                false,
            ),
            (
                "waiting for a person",
                status(since("ApprovalRequired", "2026-01-02T23:30:00Z"), ISSUED),
                &[],
                false,
            ),
            (
                "spec changed: the run sweeps",
                {
                    let mut v = waiting.clone();
                    merge(&mut v, json!({"metadata": {"generation": 3}}));
                    v
                },
                &[],
                false,
            ),
            (
                "deleting",
                {
                    let mut v = waiting.clone();
                    merge(
                        &mut v,
                        json!({"metadata": {"deletionTimestamp": "2026-01-03T00:00:00Z"}}),
                    );
                    v
                },
                &[],
                false,
            ),
            ("never recorded", json!({"status": null}), &[], false),
        ];
        for (what, patch, beats, want) in cases {
            assert_eq!(awaits_pin(&grant(patch), beats, now), want, "{what}");
        }
        // After a sweep: what it left waiting is followed, a Grant issued by it included,
        // unless it has waited an hour already.
        let fresh = grant(json!({"status": null}));
        assert!(
            follows_after_sweep(&fresh, true, now),
            "issued by this sweep"
        );
        assert!(!follows_after_sweep(&fresh, false, now), "blocked, pinned");
        assert!(follows_after_sweep(&grant(waiting), true, now));
        let old = status(since(WAITING_FOR_HEARTBEAT, "2026-01-02T23:00:00Z"), ISSUED);
        assert!(!follows_after_sweep(&grant(old), true, now), "an hour");
    }
}
