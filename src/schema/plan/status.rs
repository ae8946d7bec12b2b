//! The statuses `kbind schema` records after one Connection's CRD writes, pure: the
//! Connection's conditions and exports, each of its bindings' setup side (`binding.rs`), and
//! the autoBind ClusterBinding to apply or delete (`autobind.rs`).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::autobind::{AutoBind, AutoBindView, autobind_condition, plan_autobind};
use super::binding::{ApiState, ConnectionSide, api_state, binding_status};
use super::*;

/// Statuses to record after the CRD writes.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    pub connection: ConnectionStatus,
    /// Only bindings whose schema-owned status changed.
    pub bindings: Vec<(BindingKey, BindingStatus)>,
    pub autobind: AutoBind,
}

pub fn plan_status(
    o: &Observed,
    actions: &[CrdAction],
    outcomes: &[CrdOutcome],
    autobind: AutoBindView<'_>,
    now: Timestamp,
) -> StatusPlan {
    let crds = crds_after(o, actions, outcomes);
    let denied = names_where(actions, outcomes, |o| matches!(o, CrdOutcome::Forbidden(_)));
    let failed = names_where(actions, outcomes, |o| matches!(o, CrdOutcome::Failed(_)));

    let mut st = o.status.clone();
    let g = o.generation;
    let (ready, refused) = connection_conditions(o, &mut st, &denied, now);
    let d = o.exports();

    // Bindings (setup side), then SchemaInSync over what they bind.
    let mut drift = Drift::default();
    let mut bindings = Vec::new();
    for b in o.own_bindings() {
        let states: Vec<(String, ApiState)> = b
            .apis
            .iter()
            .filter(|_| b.admission.admitted())
            .map(|api| {
                (
                    api.clone(),
                    api_state(o, d, &crds, b, api, &denied, &failed),
                )
            })
            .collect();
        for (api, s) in &states {
            if let ApiState::Bound { in_sync: false, .. } = s {
                drift.note(o.policy.update_policy, api);
            }
        }
        let conn = ConnectionSide {
            ready: ready.is_ok(),
            not_ready: ready.as_ref().err(),
            refused: refused.as_ref(),
        };
        let desired = binding_status(b, &states, &conn, o.policy.update_policy, now);
        if schema_owned(&desired) != schema_owned(&b.status) {
            bindings.push((b.key.clone(), desired));
        }
    }
    drift.note_pulled(o, d, &crds);
    if d.is_some() {
        drift.record(&mut st.conditions, g, now);
    }
    match &ready {
        Ok(()) => st
            .conditions
            .set_condition(READY, S::True, "Ready", "", g, now),
        Err((reason, msg)) => st
            .conditions
            .set_condition(READY, S::False, reason, msg, g, now),
    };
    autobind_condition(o, &mut st, autobind, now);
    st.observed_generation = g;

    let (existing, auto_bind) = match autobind {
        AutoBindView::Maintained(b) => (b, true),
        _ => (None, false),
    };
    let autobind = plan_autobind(o, d, &st, existing, auto_bind);
    StatusPlan {
        connection: st,
        bindings,
        autobind,
    }
}

/// Why the Connection is not Ready (reason, message), if it is not.
type NotReady = Result<(), (&'static str, String)>;

/// A read the provider refused this run (reason naming it, message): the identity read or
/// discovery. Every binding of the Connection says so in its own PermissionDenied.
type Refused = Option<(&'static str, String)>;

/// SecretValid, Connected and PermissionDenied, and the exported APIs discovery found; returns
/// whether the Connection can be Ready as far as these go, and what the provider refused.
fn connection_conditions(
    o: &Observed,
    st: &mut ConnectionStatus,
    denied: &[String],
    now: Timestamp,
) -> (NotReady, Refused) {
    let g = o.generation;
    let conds = &mut st.conditions;
    let mut ready: NotReady = Ok(());
    match &o.credentials {
        Err(e) => {
            conds.set_condition(SECRET_VALID, S::False, e.reason(), &e.to_string(), g, now);
            conds.set_condition(
                CONNECTED,
                S::Unknown,
                "SecretInvalid",
                "no usable credentials",
                g,
                now,
            );
            ready = Err((e.reason(), e.to_string()));
        }
        Ok(()) => {
            conds.set_condition(SECRET_VALID, S::True, "Valid", "", g, now);
        }
    }
    rotation_condition(o, &mut st.conditions, now);
    let (connected, mut permission_denied) = connected_condition(o, st, now);
    ready = ready.and(connected);
    let conds = &mut st.conditions;
    match (&o.discovery, o.exports()) {
        (Some(Err(e)), _) if o.connected_uid().is_some() => {
            if e.forbidden() {
                permission_denied = Some(("DiscoveryForbidden", e.to_string()));
            } else {
                ready = ready.and(Err(("DiscoveryFailed", e.to_string())));
            }
        }
        (_, Some(d)) => {
            st.active_schema_source = Some(d.source.as_str().to_string());
            st.exported_apis = d.exports.iter().map(|e| e.api.clone()).collect();
            st.empty_discoveries = if d.exports.is_empty() {
                Some(
                    o.status
                        .empty_discoveries
                        .unwrap_or(0)
                        .saturating_add(1)
                        .min(2),
                )
            } else {
                None
            };
        }
        _ => {}
    }
    let refused = permission_denied.clone();
    if permission_denied.is_none() && !denied.is_empty() {
        permission_denied = Some((
            "CRDWriteForbidden",
            format!("writing consumer CRDs was forbidden: {}", denied.join(", ")),
        ));
    }
    match &permission_denied {
        Some((reason, msg)) => {
            conds.set_condition(PERMISSION_DENIED, S::True, reason, msg, g, now);
            ready = ready.and(Err((reason, msg.clone())));
        }
        None if o.connected_uid().is_some() => {
            conds.set_condition(PERMISSION_DENIED, S::False, "Permitted", "", g, now);
        }
        None => {}
    }
    (ready, refused)
}

/// CredentialRotation, for a Secret that pulls from its Grant's Secret: True `Current` while in
/// step (written or not this run: the reason stays so an unchanged run writes nothing), False
/// with why the pull failed (the current credential stays in use). Absent for other Secrets.
fn rotation_condition(o: &Observed, conds: &mut Vec<Condition>, now: Timestamp) {
    let g = o.generation;
    match &o.refresh {
        None => {
            conds.remove_condition(CREDENTIAL_ROTATION);
        }
        Some(Ok(Refreshed::Current | Refreshed::Updated)) => {
            conds.set_condition(
                CREDENTIAL_ROTATION,
                S::True,
                "Current",
                "the kubeconfig is the one in the Grant's Secret on the provider",
                g,
                now,
            );
        }
        Some(Ok(Refreshed::WouldUpdate)) => {
            conds.set_condition(
                CREDENTIAL_ROTATION,
                S::False,
                "PullPending",
                "the Grant's Secret on the provider holds a re-issued kubeconfig not yet written",
                g,
                now,
            );
        }
        Some(Err(e)) => {
            conds.set_condition(
                CREDENTIAL_ROTATION,
                S::False,
                e.reason(),
                &e.to_string(),
                g,
                now,
            );
        }
    }
}

/// Connected, from the provider's identity as read (once the credentials work); pins the
/// identities on first contact. Returns why not Ready, and a PermissionDenied cause.
fn connected_condition(
    o: &Observed,
    st: &mut ConnectionStatus,
    now: Timestamp,
) -> (NotReady, Option<(&'static str, String)>) {
    let g = o.generation;
    let mut ready: NotReady = Ok(());
    let mut permission_denied = None;
    match (&o.credentials, &o.remote_uid) {
        (Ok(()), Some(Err(e))) => {
            let reason = match e {
                IdentityError::Forbidden(_) => {
                    permission_denied = Some(("IdentityForbidden", e.to_string()));
                    "IdentityForbidden"
                }
                IdentityError::Unauthorized(_) => REASON_CREDENTIAL_REJECTED,
                _ => "Unreachable",
            };
            st.conditions
                .set_condition(CONNECTED, S::False, reason, &e.to_string(), g, now);
            ready = Err((reason, e.to_string()));
        }
        (Ok(()), Some(Ok(uid))) if o.identity_changed() => {
            let msg = format!(
                "provider identity {uid} (consumer {}) differs from the pinned remoteClusterUID {} (localClusterUID {}); nothing is synced. Use a new Connection for a new provider",
                o.local_uid,
                o.status.remote_cluster_uid.as_deref().unwrap_or("-"),
                o.status.local_cluster_uid.as_deref().unwrap_or("-"),
            );
            st.conditions.set_condition(
                CONNECTED,
                S::False,
                REASON_CLUSTER_IDENTITY_CHANGED,
                &msg,
                g,
                now,
            );
            ready = Err((REASON_CLUSTER_IDENTITY_CHANGED, msg));
        }
        (Ok(()), Some(Ok(uid))) => {
            st.conditions
                .set_condition(CONNECTED, S::True, "Connected", "", g, now);
            st.remote_cluster_uid.get_or_insert_with(|| uid.clone());
            st.local_cluster_uid
                .get_or_insert_with(|| o.local_uid.to_string());
        }
        _ => {}
    }

    (ready, permission_denied)
}

/// The APIs whose consumer CRD differs from the provider's: drifted, or pinned by
/// `updatePolicy: Once`.
#[derive(Default)]
struct Drift {
    drifted: BTreeSet<String>,
    pinned: BTreeSet<String>,
}

impl Drift {
    /// Under `pullPolicy: All` every export is pulled, bound or not: its drift counts too.
    fn note_pulled(
        &mut self,
        o: &Observed,
        d: Option<&Discovered>,
        crds: &std::collections::BTreeMap<String, CrdMeta>,
    ) {
        let Some(d) = d.filter(|_| o.policy.pull_policy == PullPolicy::All) else {
            return;
        };
        for e in &d.exports {
            match crds.get(&e.api.name) {
                Some(m)
                    if ours(m, o.name) && m.schema_hash.as_deref() != Some(&e.api.schema_hash) =>
                {
                    self.note(o.policy.update_policy, &e.api.name);
                }
                _ => {}
            }
        }
    }

    fn note(&mut self, update: UpdatePolicy, api: &str) {
        if update == UpdatePolicy::Once {
            self.pinned.insert(api.to_string())
        } else {
            self.drifted.insert(api.to_string())
        };
    }

    /// The SchemaInSync condition.
    fn record(&self, conds: &mut Vec<Condition>, g: Option<i64>, now: Timestamp) {
        let (s, reason, msg) = match (self.drifted.is_empty(), self.pinned.is_empty()) {
            (false, _) => (
                S::False,
                "Drifted",
                format!(
                    "consumer CRDs differ from the provider: {}",
                    join(&self.drifted)
                ),
            ),
            (true, false) => (
                S::True,
                "Pinned",
                format!("updatePolicy Once pins: {}", join(&self.pinned)),
            ),
            (true, true) => (S::True, "InSync", String::new()),
        };
        conds.set_condition(SCHEMA_IN_SYNC, s, reason, &msg, g, now);
    }
}

fn names_where(
    actions: &[CrdAction],
    outcomes: &[CrdOutcome],
    pred: impl Fn(&CrdOutcome) -> bool,
) -> Vec<String> {
    actions
        .iter()
        .zip(outcomes)
        .filter(|(_, o)| pred(o))
        .map(|(a, _)| a.name())
        .collect()
}

fn join(s: &BTreeSet<String>) -> String {
    s.iter().cloned().collect::<Vec<_>>().join(", ")
}
