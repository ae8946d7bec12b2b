//! Grant and Export status (docs/issue.md "Status"): computed purely from what the run found and
//! did, written once per object and only when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::ConditionStatus;
use crate::api::catalog::{ExportSpec, ExportStatus};
use crate::api::conditions::Conditions;
use crate::api::iam::{GrantStatus, SecretRef};

use super::plan::{API_NOT_EXPORTED, Blocked, Catalog, ISSUED, Pin};
use super::render::object_name;

pub const READY: &str = "Ready";
pub const CONSUMER_PINNED: &str = "ConsumerPinned";
pub const SHARED_READS: &str = "SharedReads";

/// What one run came to for a Grant.
#[derive(Clone, Debug, Default)]
pub struct GrantOutcome {
    pub blocked: Option<Blocked>,
    pub pin: Option<Pin>,
    /// Expiry of the token in the Secret now (issued this run, or kept).
    pub expires_at: Option<Timestamp>,
    pub apis: Option<Vec<String>>,
    /// Cluster-scoped APIs held together with other Grants (known when planned).
    pub shared: Option<Vec<String>>,
}

/// The Grant's new status from the old one; `None` when nothing changed.
pub fn grant_status(
    old: Option<&GrantStatus>,
    namespace: &str,
    grant: &str,
    o: &GrantOutcome,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<GrantStatus> {
    let old = old.cloned().unwrap_or_default();
    let mut st = old.clone();
    st.observed_generation = generation;
    if let Some(apis) = &o.apis {
        st.granted_apis = apis.clone();
    }
    if let Some(t) = o.expires_at {
        st.expires_at = Some(Time(t));
        st.secret_ref = Some(SecretRef {
            namespace: namespace.into(),
            name: object_name(grant),
        });
        st.service_account = Some(format!("{namespace}/{}", object_name(grant)));
    }
    let (status, reason, message) = match &o.blocked {
        Some(b) => (ConditionStatus::False, b.reason, b.message.clone()),
        None => (
            ConditionStatus::True,
            ISSUED,
            "the kubeconfig Secret holds a current token".to_string(),
        ),
    };
    let mut changed = st
        .conditions
        .set_condition(READY, status, reason, &message, generation, now);
    if let Some(pin) = &o.pin {
        if let Pin::Pinned { uid, .. } = pin {
            st.consumer_cluster = Some(uid.clone());
        }
        let (status, reason, message) = pin_condition(pin);
        changed |=
            st.conditions
                .set_condition(CONSUMER_PINNED, status, reason, &message, generation, now);
    }
    if let Some(shared) = &o.shared {
        let (status, reason, message) = if shared.is_empty() {
            (
                ConditionStatus::False,
                "Isolated",
                "no other Grant holds this Grant's namespaces or cluster-scoped APIs".to_string(),
            )
        } else {
            (
                ConditionStatus::True,
                "ClusterScopedAPIsShared",
                format!(
                    "other Grants hold these cluster-scoped APIs too (their Exports set clusterScopedAccess: Shared), so they can read this consumer's objects of them: {}",
                    shared.join(", ")
                ),
            )
        };
        changed |=
            st.conditions
                .set_condition(SHARED_READS, status, reason, &message, generation, now);
    }
    (changed || st != old).then_some(st)
}

/// The `ConsumerPinned` condition a pin makes.
fn pin_condition(pin: &Pin) -> (ConditionStatus, &'static str, String) {
    match pin {
        Pin::Pinned { uid, .. } => (
            ConditionStatus::True,
            "Pinned",
            format!("writes are confined to objects labelled core.kbind.io/consumer-cluster={uid}"),
        ),
        Pin::Waiting => (
            ConditionStatus::False,
            super::plan::WAITING_FOR_HEARTBEAT,
            "no heartbeat Lease from this Grant's identity yet: the consumer's kbind resync writes one, and kbind issue pins its cluster when it sees it (its next run, or within its pin window); until then the identity may read but not write objects".to_string(),
        ),
        Pin::Taken { uid, by } => (
            ConditionStatus::False,
            "ConsumerClusterTaken",
            format!("the heartbeat names consumer cluster {uid}, which Grant {by} already holds; nothing is pinned"),
        ),
        Pin::NeedsApproval { uid, why } => (
            ConditionStatus::False,
            "ApprovalRequired",
            format!(
                "the heartbeat names consumer cluster {uid}, but {why}; nothing is pinned. If this Grant's consumer is that cluster, approve it: annotate the Grant {}={uid}",
                crate::api::iam::APPROVE_CONSUMER_CLUSTER
            ),
        ),
    }
}

/// An Export's status: which APIs are not exported CRDs.
pub fn export_status(
    old: Option<&ExportStatus>,
    spec: &ExportSpec,
    catalog: &Catalog,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<ExportStatus> {
    let old = old.cloned().unwrap_or_default();
    let mut st = old.clone();
    st.observed_generation = generation;
    st.missing_apis = spec
        .apis
        .iter()
        .filter(|a| !catalog.exported.contains_key(&a.name))
        .map(|a| a.name.clone())
        .collect();
    let changed = if st.missing_apis.is_empty() {
        st.conditions.set_condition(
            READY,
            ConditionStatus::True,
            "Exported",
            "every API is an exported CRD",
            generation,
            now,
        )
    } else {
        let m = format!(
            "not an exported CRD on this cluster: {}",
            st.missing_apis.join(", ")
        );
        st.conditions.set_condition(
            READY,
            ConditionStatus::False,
            API_NOT_EXPORTED,
            &m,
            generation,
            now,
        )
    };
    (changed || st != old).then_some(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_outcome_writes_no_status() {
        let now = Timestamp::from_second(1000).unwrap();
        let o = GrantOutcome {
            pin: Some(Pin::Waiting),
            expires_at: Some(Timestamp::from_second(5000).unwrap()),
            apis: Some(vec!["widgets.example.org".into()]),
            ..Default::default()
        };
        let first = grant_status(None, "ns", "g", &o, Some(1), now).expect("first write");
        assert_eq!(first.secret_ref.as_ref().unwrap().name, "kbind-grant-g");
        let later = Timestamp::from_second(2000).unwrap();
        assert_eq!(
            grant_status(Some(&first), "ns", "g", &o, Some(1), later),
            None
        );
        // A token kept (no new expiry) writes nothing either.
        let kept = GrantOutcome {
            expires_at: None,
            ..o.clone()
        };
        assert_eq!(
            grant_status(Some(&first), "ns", "g", &kept, Some(1), later),
            None
        );
        // Blocked: Ready=False with the reason, what was issued is still named.
        let blocked = GrantOutcome {
            blocked: Some(Blocked {
                reason: "PermissionsNotGrantable",
                message: "m".into(),
            }),
            ..kept
        };
        let st = grant_status(Some(&first), "ns", "g", &blocked, Some(1), later).unwrap();
        let ready = st.conditions.condition(READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "PermissionsNotGrantable")
        );
        assert!(st.secret_ref.is_some());
    }
}
