//! The pure part of `kbind schema`: from what one Connection's observation found, decide the
//! consumer CRD writes (the contract's install table), then — given how those writes went — the
//! statuses of the Connection and its bindings and the autoBind ClusterBinding. No I/O here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::crdpull::{Export, with_markers};
use crate::api::BindingKey;
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::condition::*;
use crate::api::core::{
    BindingStatus, BoundApi, ConnectionStatus, PullPolicy, SchemaSource, UpdatePolicy,
};
use crate::connection::{CredentialError, IdentityError};

/// What the consumer cluster holds under a CRD name (metadata only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrdMeta {
    /// The observed object's UID: deletes are preconditioned on it.
    pub uid: String,
    pub managed: bool,
    pub connection: Option<String>,
    pub schema_hash: Option<String>,
    pub deleting: bool,
}

/// The parts of a binding the schema pass looks at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BindingView {
    pub key: BindingKey,
    pub connection: String,
    pub apis: Vec<String>,
    pub generation: Option<i64>,
    pub status: BindingStatus,
    pub deleting: bool,
}

/// Result of discovery on the provider.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Discovered {
    pub source: SchemaSource,
    /// Sorted by name.
    pub exports: Vec<Export>,
    /// Candidates that could not be exported, with why (e.g. no served version).
    pub skipped: Vec<(String, String)>,
}

/// Why discovery failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryError {
    pub forbidden: bool,
    pub message: String,
}

/// Everything observed for one Connection.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub name: &'a str,
    pub generation: Option<i64>,
    pub policy: &'a crate::api::core::SchemaPolicy,
    pub status: &'a ConnectionStatus,
    pub credentials: Result<(), CredentialError>,
    /// Provider identity; `None` when credentials were unusable.
    pub remote_uid: Option<Result<String, IdentityError>>,
    pub local_uid: &'a str,
    /// `None` when discovery did not run (not connected).
    pub discovery: Option<Result<Discovered, DiscoveryError>>,
    /// Every binding in the cluster (the resolver needs the ones of other Connections too).
    pub bindings: &'a [BindingView],
    pub consumer_crds: &'a BTreeMap<String, CrdMeta>,
}

/// One consumer CRD write.
#[derive(Clone, Debug, PartialEq)]
pub enum CrdAction {
    Create(Box<CustomResourceDefinition>),
    Update(Box<CustomResourceDefinition>),
    /// Add kbind's markers to an existing, externally supplied CRD (None + CRD source only).
    Stamp {
        name: String,
        connection: String,
    },
}

impl CrdAction {
    pub fn name(&self) -> String {
        match self {
            Self::Create(c) | Self::Update(c) => c.metadata.name.clone().unwrap_or_default(),
            Self::Stamp { name, .. } => name.clone(),
        }
    }
}

/// How a CRD write went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdOutcome {
    Done,
    Forbidden(String),
    /// Someone else created it first, or another failure.
    Failed(String),
}

impl Observed<'_> {
    fn connected_uid(&self) -> Option<&str> {
        match &self.remote_uid {
            Some(Ok(uid)) if !self.identity_changed() => Some(uid),
            _ => None,
        }
    }

    /// A pinned identity that no longer matches: nothing may be synced or moved.
    pub fn identity_changed(&self) -> bool {
        let remote = matches!((&self.remote_uid, &self.status.remote_cluster_uid), (Some(Ok(now)), Some(pinned)) if now != pinned);
        let local = self
            .status
            .local_cluster_uid
            .as_deref()
            .is_some_and(|p| p != self.local_uid);
        remote || local
    }

    fn exports(&self) -> Option<&Discovered> {
        match &self.discovery {
            Some(Ok(d)) if self.connected_uid().is_some() => Some(d),
            _ => None,
        }
    }

    /// This Connection's live bindings.
    fn own_bindings(&self) -> impl Iterator<Item = &BindingView> {
        self.bindings
            .iter()
            .filter(|b| b.connection == self.name && !b.deleting)
    }
}

/// The consumer CRD writes the install table calls for.
pub fn plan_crds(o: &Observed) -> Vec<CrdAction> {
    let Some(d) = o.exports() else {
        return Vec::new();
    };
    let bound: BTreeSet<&str> = o
        .own_bindings()
        .flat_map(|b| {
            b.apis
                .iter()
                .map(String::as_str)
                .filter(|api| !cluster_scoped_in_binding(d, b, api))
        })
        .collect();
    let mut actions = Vec::new();
    for e in &d.exports {
        let name = e.api.name.as_str();
        let wanted = match o.policy.pull_policy {
            PullPolicy::Bound => bound.contains(name),
            PullPolicy::All => true,
            PullPolicy::None => false,
        };
        match o.consumer_crds.get(name) {
            Some(m) if m.deleting => {}
            None if wanted => actions.push(CrdAction::Create(Box::new(with_markers(e, o.name)))),
            None => {}
            Some(m) if ours(m, o.name) => {
                let drifted = m.schema_hash.as_deref() != Some(e.api.schema_hash.as_str());
                if drifted
                    && o.policy.update_policy == UpdatePolicy::Always
                    && o.policy.pull_policy != PullPolicy::None
                {
                    actions.push(CrdAction::Update(Box::new(with_markers(e, o.name))));
                }
            }
            Some(m)
                if unmarked(m)
                    && o.policy.pull_policy == PullPolicy::None
                    && d.source == SchemaSource::Crd =>
            {
                actions.push(CrdAction::Stamp {
                    name: name.to_string(),
                    connection: o.name.to_string(),
                })
            }
            Some(_) => {}
        }
    }
    actions
}

fn ours(m: &CrdMeta, connection: &str) -> bool {
    m.managed && m.connection.as_deref() == Some(connection)
}

fn unmarked(m: &CrdMeta) -> bool {
    !m.managed && m.connection.is_none()
}

fn cluster_scoped_in_binding(d: &Discovered, b: &BindingView, api: &str) -> bool {
    b.key.namespace.is_some()
        && d.exports
            .iter()
            .any(|e| e.api.name == api && e.api.scope == "Cluster")
}

/// The consumer CRDs after the writes that succeeded (a created CRD's UID is not known yet).
pub fn crds_after(
    o: &Observed,
    actions: &[CrdAction],
    outcomes: &[CrdOutcome],
) -> BTreeMap<String, CrdMeta> {
    let mut crds = o.consumer_crds.clone();
    for (a, out) in actions.iter().zip(outcomes) {
        if *out != CrdOutcome::Done {
            continue;
        }
        let hash = match a {
            CrdAction::Create(c) | CrdAction::Update(c) => c
                .metadata
                .annotations
                .as_ref()
                .and_then(|m| m.get(crate::api::keys::SCHEMA_HASH))
                .cloned(),
            CrdAction::Stamp { .. } => None,
        };
        crds.insert(
            a.name(),
            CrdMeta {
                uid: o
                    .consumer_crds
                    .get(&a.name())
                    .map(|m| m.uid.clone())
                    .unwrap_or_default(),
                managed: true,
                connection: Some(o.name.to_string()),
                schema_hash: hash,
                deleting: false,
            },
        );
    }
    crds
}

/// Per-API setup result of a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ApiState {
    Bound {
        scope: String,
        version: String,
        hash: String,
        in_sync: bool,
        /// Something the user should know although the API is bound.
        warning: Option<String>,
    },
    Problem {
        reason: &'static str,
        message: String,
    },
}

/// Statuses to record after the CRD writes.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    pub connection: ConnectionStatus,
    /// Only bindings whose schema-owned status changed.
    pub bindings: Vec<(BindingKey, BindingStatus)>,
    pub autobind: AutoBind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AutoBind {
    Leave,
    /// Apply the ClusterBinding named after the Connection with these APIs.
    Apply(Vec<String>),
    Delete,
}

/// What autoBind has to work with: off, its ClusterBinding (absent or owned by the Connection),
/// or that name held by a binding the Connection does not own.
#[derive(Clone, Copy, Debug)]
pub enum AutoBindView<'a> {
    Off,
    Maintained(Option<&'a BindingView>),
    NameTaken,
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
    let conds = &mut st.conditions;
    let mut ready: Result<(), (&str, String)> = Ok(());

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
    let mut permission_denied: Option<(&str, String)> = None;
    match (&o.credentials, &o.remote_uid) {
        (Ok(()), Some(Err(e))) => {
            let reason = match e {
                IdentityError::Forbidden(_) => {
                    permission_denied = Some(("IdentityForbidden", e.to_string()));
                    "IdentityForbidden"
                }
                IdentityError::Unauthorized(_) => "Unauthorized",
                _ => "Unreachable",
            };
            conds.set_condition(CONNECTED, S::False, reason, &e.to_string(), g, now);
            ready = ready.and(Err((reason, e.to_string())));
        }
        (Ok(()), Some(Ok(uid))) if o.identity_changed() => {
            let msg = format!(
                "provider identity {uid} (consumer {}) differs from the pinned remoteClusterUID {} (localClusterUID {}); nothing is synced. Use a new Connection for a new provider",
                o.local_uid,
                o.status.remote_cluster_uid.as_deref().unwrap_or("-"),
                o.status.local_cluster_uid.as_deref().unwrap_or("-"),
            );
            conds.set_condition(
                CONNECTED,
                S::False,
                REASON_CLUSTER_IDENTITY_CHANGED,
                &msg,
                g,
                now,
            );
            ready = ready.and(Err((REASON_CLUSTER_IDENTITY_CHANGED, msg)));
        }
        (Ok(()), Some(Ok(uid))) => {
            conds.set_condition(CONNECTED, S::True, "Connected", "", g, now);
            st.remote_cluster_uid.get_or_insert_with(|| uid.clone());
            st.local_cluster_uid
                .get_or_insert_with(|| o.local_uid.to_string());
        }
        _ => {}
    }

    let d = o.exports();
    match (&o.discovery, d) {
        (Some(Err(e)), _) if o.connected_uid().is_some() => {
            if e.forbidden {
                permission_denied = Some(("DiscoveryForbidden", e.message.clone()));
            } else {
                ready = ready.and(Err(("DiscoveryFailed", e.message.clone())));
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

    // Bindings (setup side), then SchemaInSync over what they bind.
    let connection_ready = ready.is_ok();
    let mut bindings = Vec::new();
    let mut drifted = BTreeSet::new();
    let mut pinned = BTreeSet::new();
    for b in o.own_bindings() {
        let states: Vec<(String, ApiState)> = b
            .apis
            .iter()
            .map(|api| {
                (
                    api.clone(),
                    api_state(o, d, &crds, b, api, &denied, &failed),
                )
            })
            .collect();
        for (api, s) in &states {
            if let ApiState::Bound { in_sync: false, .. } = s {
                if o.policy.update_policy == UpdatePolicy::Once {
                    pinned.insert(api.clone())
                } else {
                    drifted.insert(api.clone())
                };
            }
        }
        let desired = binding_status(
            b,
            &states,
            connection_ready,
            ready.as_ref().err(),
            o.policy.update_policy,
            now,
        );
        if schema_owned(&desired) != schema_owned(&b.status) {
            bindings.push((b.key.clone(), desired));
        }
    }
    if o.policy.pull_policy == PullPolicy::All
        && let Some(d) = d
    {
        for e in &d.exports {
            match crds.get(&e.api.name) {
                Some(m)
                    if ours(m, o.name) && m.schema_hash.as_deref() != Some(&e.api.schema_hash) =>
                {
                    if o.policy.update_policy == UpdatePolicy::Once {
                        pinned.insert(e.api.name.clone())
                    } else {
                        drifted.insert(e.api.name.clone())
                    };
                }
                _ => {}
            }
        }
    }
    if d.is_some() {
        let (s, reason, msg) = match (drifted.is_empty(), pinned.is_empty()) {
            (false, _) => (
                S::False,
                "Drifted",
                format!("consumer CRDs differ from the provider: {}", join(&drifted)),
            ),
            (true, false) => (
                S::True,
                "Pinned",
                format!("updatePolicy Once pins: {}", join(&pinned)),
            ),
            (true, true) => (S::True, "InSync", String::new()),
        };
        st.conditions
            .set_condition(SCHEMA_IN_SYNC, s, reason, &msg, g, now);
    }
    match &ready {
        Ok(()) => st
            .conditions
            .set_condition(READY, S::True, "Ready", "", g, now),
        Err((reason, msg)) => st
            .conditions
            .set_condition(READY, S::False, reason, msg, g, now),
    };
    // autoBind's reserved name held by someone else is the user's to resolve: say so where they
    // look (a log line in a CronJob's pod is seen by nobody).
    match autobind {
        AutoBindView::NameTaken => st.conditions.set_condition(
            AUTO_BIND,
            S::False,
            "NameTaken",
            &format!(
                "ClusterBinding {} exists and is not owned by this Connection; autoBind leaves it alone. Delete or rename it to let autoBind maintain it",
                o.name
            ),
            g,
            now,
        ),
        AutoBindView::Maintained(_) => {
            st.conditions
                .set_condition(AUTO_BIND, S::True, "Maintained", "", g, now)
        }
        AutoBindView::Off => st.conditions.remove_condition(AUTO_BIND),
    };
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

fn plan_autobind(
    o: &Observed,
    d: Option<&Discovered>,
    st: &ConnectionStatus,
    existing: Option<&BindingView>,
    auto_bind: bool,
) -> AutoBind {
    let Some(d) = d else { return AutoBind::Leave };
    if !auto_bind {
        return AutoBind::Leave;
    }
    if d.exports.is_empty() {
        // Two consecutive successful, empty discoveries before deleting (contract).
        return if existing.is_some() && st.empty_discoveries.unwrap_or(0) >= 2 {
            AutoBind::Delete
        } else {
            AutoBind::Leave
        };
    }
    let apis: Vec<String> = d.exports.iter().map(|e| e.api.name.clone()).collect();
    match existing {
        Some(b) if b.apis == apis && b.connection == o.name => AutoBind::Leave,
        _ => AutoBind::Apply(apis),
    }
}

fn api_state(
    o: &Observed,
    d: Option<&Discovered>,
    crds: &BTreeMap<String, CrdMeta>,
    b: &BindingView,
    api: &str,
    denied: &[String],
    failed: &[String],
) -> ApiState {
    let problem = |reason: &'static str, message: String| ApiState::Problem { reason, message };
    let Some(d) = d else {
        return problem(
            "ConnectionNotReady",
            format!("Connection {} is not ready", o.name),
        );
    };
    let Some(e) = d.exports.iter().find(|e| e.api.name == api) else {
        if let Some((_, why)) = d.skipped.iter().find(|(n, _)| n == api) {
            return problem(
                "ExportUnusable",
                format!("{api} is exported but cannot be pulled: {why}"),
            );
        }
        return problem(
            "APINotExported",
            format!("{api} is not exported by Connection {}", o.name),
        );
    };
    if b.key.namespace.is_some() && e.api.scope == "Cluster" {
        return problem(
            "ClusterScopedAPI",
            format!("{api} is cluster-scoped: only a ClusterBinding can activate it"),
        );
    }
    if denied.iter().any(|n| n == api) {
        return problem(
            "PermissionDenied",
            format!("writing the consumer CRD {api} was forbidden"),
        );
    }
    if failed.iter().any(|n| n == api) {
        return problem(
            "CRDWriteFailed",
            format!("writing the consumer CRD {api} failed; retried next run"),
        );
    }
    match crds.get(api) {
        None if o.policy.pull_policy == PullPolicy::None => problem(
            "CRDMissing",
            format!("pullPolicy None: {api} must be installed by its external manager"),
        ),
        None => problem(
            "CRDPending",
            format!("consumer CRD {api} not installed yet"),
        ),
        Some(m) if ours(m, o.name) => {
            // Under pullPolicy None the schema is the external manager's: no drift to report.
            let in_sync = o.policy.pull_policy == PullPolicy::None
                || m.schema_hash.as_deref() == Some(e.api.schema_hash.as_str());
            let mut warnings = Vec::new();
            if e.webhook_conversion {
                warnings.push(format!(
                    "{api}: the provider converts versions with a webhook; the consumer CRD serves only {} and provider-side conversion is not reproduced",
                    e.api.version
                ));
            }
            // The resolver checks ClusterBindings first, even when not Ready.
            if b.key.namespace.is_some()
                && let Some(cb) = o.bindings.iter().find(|x| {
                    x.key.namespace.is_none() && !x.deleting && x.apis.iter().any(|a| a == api)
                })
            {
                warnings.push(format!("{api} is also listed by ClusterBinding {}, which takes precedence: this Binding does not sync it", cb.key.name));
            }
            ApiState::Bound {
                scope: e.api.scope.clone(),
                version: e.api.version.clone(),
                hash: m.schema_hash.clone().unwrap_or_default(),
                in_sync,
                warning: (!warnings.is_empty()).then(|| warnings.join("; ")),
            }
        }
        Some(m) => {
            let owner = match &m.connection {
                Some(c) => format!("is managed by Connection {c}"),
                None => "exists and is not managed by kbind".to_string(),
            };
            problem(
                REASON_FOREIGN_CRD,
                format!("consumer CRD {api} {owner}; it is never overwritten"),
            )
        }
    }
}

fn binding_status(
    b: &BindingView,
    states: &[(String, ApiState)],
    connection_ready: bool,
    conn_err: Option<&(&str, String)>,
    update: UpdatePolicy,
    now: Timestamp,
) -> BindingStatus {
    let mut st = b.status.clone();
    let g = b.generation;
    let mut bound: Vec<BoundApi> = Vec::new();
    let mut problems: Vec<(&str, String)> = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    for (api, s) in states {
        match s {
            ApiState::Bound {
                scope,
                version,
                hash,
                in_sync,
                warning,
            } => {
                warnings.extend(warning.iter().cloned());
                let prev = b
                    .status
                    .bound_apis
                    .iter()
                    .find(|x| &x.name == api)
                    .cloned()
                    .unwrap_or_default();
                bound.push(BoundApi {
                    name: api.clone(),
                    scope: Some(scope.clone()),
                    version: Some(version.clone()),
                    schema_hash: Some(hash.clone()),
                    ..prev
                });
                if !in_sync && update == UpdatePolicy::Always {
                    pending.push(api);
                }
            }
            ApiState::Problem { reason, message } => problems.push((reason, message.clone())),
        }
    }
    // Entries only resync owns (counts for an API no longer bound) are left to resync.
    for prev in &b.status.bound_apis {
        if !bound.iter().any(|x| x.name == prev.name) {
            bound.push(BoundApi {
                name: prev.name.clone(),
                scope: None,
                version: None,
                schema_hash: None,
                ..prev.clone()
            });
        }
    }
    bound.sort_by(|a, b| a.name.cmp(&b.name));
    st.bound_apis = bound;
    let denied: Vec<&String> = problems
        .iter()
        .filter(|(r, _)| *r == "PermissionDenied")
        .map(|(_, m)| m)
        .collect();
    let c = &mut st.conditions;
    match (connection_ready, problems.first()) {
        (false, _) => {
            let (reason, msg) = conn_err
                .map(|(r, m)| (*r, m.as_str()))
                .unwrap_or(("ConnectionNotReady", ""));
            c.set_condition(
                READY,
                S::False,
                "ConnectionNotReady",
                &format!("{reason}: {msg}"),
                g,
                now,
            )
        }
        (true, Some((reason, _))) => {
            let msg = problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            c.set_condition(READY, S::False, reason, &msg, g, now)
        }
        (true, None) => c.set_condition(READY, S::True, "Bound", &warnings.join("; "), g, now),
    };
    if pending.is_empty() && problems.is_empty() && connection_ready {
        c.set_condition(SYNCED, S::True, "SchemasInstalled", "", g, now);
    } else {
        let msg = if pending.is_empty() {
            "setup incomplete; see Ready".to_string()
        } else {
            format!("schema update pending: {}", pending.join(", "))
        };
        c.set_condition(SYNCED, S::False, "SetupIncomplete", &msg, g, now);
    }
    if denied.is_empty() {
        c.set_condition(PERMISSION_DENIED, S::False, "Permitted", "", g, now);
    } else {
        let msg = denied
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        c.set_condition(
            PERMISSION_DENIED,
            S::True,
            "CRDWriteForbidden",
            &msg,
            g,
            now,
        );
    }
    st.observed_generation = g;
    st
}

/// The binding status fields `kbind schema` owns (contract "Who writes what").
#[derive(Clone, Debug, PartialEq)]
pub struct SchemaOwned {
    /// Bound APIs with only the schema fields set.
    pub apis: Vec<BoundApi>,
    pub conditions: Vec<Condition>,
    pub observed_generation: Option<i64>,
}

pub fn schema_owned(s: &BindingStatus) -> SchemaOwned {
    SchemaOwned {
        apis: s
            .bound_apis
            .iter()
            .filter(|a| a.schema_hash.is_some())
            .map(|a| BoundApi {
                name: a.name.clone(),
                scope: a.scope.clone(),
                version: a.version.clone(),
                schema_hash: a.schema_hash.clone(),
                ..Default::default()
            })
            .collect(),
        conditions: s
            .conditions
            .iter()
            .filter(|c| [READY, SYNCED, PERMISSION_DENIED].contains(&c.type_.as_str()))
            .cloned()
            .collect(),
        observed_generation: s.observed_generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::core::{ExportedApi, SchemaPolicy};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionSpec;

    fn export(name: &str, scope: &str, hash: &str) -> Export {
        Export {
            api: ExportedApi {
                name: name.into(),
                scope: scope.into(),
                version: "v1".into(),
                schema_hash: hash.into(),
            },
            crd: CustomResourceDefinition {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: CustomResourceDefinitionSpec::default(),
                status: None,
            },
            webhook_conversion: false,
        }
    }

    fn binding(ns: Option<&str>, name: &str, conn: &str, apis: &[&str]) -> BindingView {
        BindingView {
            key: BindingKey {
                namespace: ns.map(String::from),
                name: name.into(),
            },
            connection: conn.into(),
            apis: apis.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn meta(managed: bool, conn: Option<&str>, hash: Option<&str>) -> CrdMeta {
        CrdMeta {
            uid: "uid".into(),
            managed,
            connection: conn.map(String::from),
            schema_hash: hash.map(String::from),
            deleting: false,
        }
    }

    struct Case {
        policy: SchemaPolicy,
        source: SchemaSource,
        exports: Vec<Export>,
        bindings: Vec<BindingView>,
        crds: BTreeMap<String, CrdMeta>,
        status: ConnectionStatus,
        remote: Option<Result<String, IdentityError>>,
    }

    impl Default for Case {
        fn default() -> Self {
            Self {
                policy: SchemaPolicy::default(),
                source: SchemaSource::Crd,
                exports: vec![
                    export("a.x.io", "Namespaced", "h1"),
                    export("b.x.io", "Cluster", "h2"),
                ],
                bindings: vec![],
                crds: BTreeMap::new(),
                status: ConnectionStatus::default(),
                remote: Some(Ok("remote".into())),
            }
        }
    }

    impl Case {
        fn observed(&self) -> Observed<'_> {
            Observed {
                name: "c",
                generation: Some(1),
                policy: &self.policy,
                status: &self.status,
                credentials: Ok(()),
                remote_uid: self.remote.clone(),
                local_uid: "local",
                discovery: Some(Ok(Discovered {
                    source: self.source,
                    exports: self.exports.clone(),
                    skipped: vec![],
                })),
                bindings: &self.bindings,
                consumer_crds: &self.crds,
            }
        }
        fn actions(&self) -> Vec<String> {
            plan_crds(&self.observed())
                .iter()
                .map(|a| match a {
                    CrdAction::Create(_) => format!("create {}", a.name()),
                    CrdAction::Update(_) => format!("update {}", a.name()),
                    CrdAction::Stamp { .. } => format!("stamp {}", a.name()),
                })
                .collect()
        }
    }

    fn policy(pull: PullPolicy, update: UpdatePolicy) -> SchemaPolicy {
        SchemaPolicy {
            source: SchemaSource::Auto,
            pull_policy: pull,
            update_policy: update,
        }
    }

    #[test]
    fn install_table() {
        let bound_a = vec![binding(None, "cb", "c", &["a.x.io"])];
        let cases: Vec<(&str, Case, Vec<&str>)> = vec![
            (
                "Bound installs only bound",
                Case {
                    bindings: bound_a.clone(),
                    ..Default::default()
                },
                vec!["create a.x.io"],
            ),
            (
                "Bound ignores other Connections' bindings",
                Case {
                    bindings: vec![binding(None, "cb", "other", &["a.x.io"])],
                    ..Default::default()
                },
                vec![],
            ),
            (
                "All installs every export",
                Case {
                    policy: policy(PullPolicy::All, UpdatePolicy::Always),
                    ..Default::default()
                },
                vec!["create a.x.io", "create b.x.io"],
            ),
            (
                "None never creates",
                Case {
                    policy: policy(PullPolicy::None, UpdatePolicy::Always),
                    bindings: bound_a.clone(),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "None + CRD stamps unmarked",
                Case {
                    policy: policy(PullPolicy::None, UpdatePolicy::Always),
                    crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                    ..Default::default()
                },
                vec!["stamp a.x.io"],
            ),
            (
                "None + OpenAPI only reads",
                Case {
                    policy: policy(PullPolicy::None, UpdatePolicy::Always),
                    source: SchemaSource::OpenApi,
                    crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "Always updates drift",
                Case {
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                    ..Default::default()
                },
                vec!["update a.x.io"],
            ),
            (
                "Always + OpenAPI + Bound updates too (deviation)",
                Case {
                    source: SchemaSource::OpenApi,
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                    ..Default::default()
                },
                vec!["update a.x.io"],
            ),
            (
                "in sync: nothing",
                Case {
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "Once pins",
                Case {
                    policy: policy(PullPolicy::Bound, UpdatePolicy::Once),
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "unmarked under Bound is foreign",
                Case {
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "another Connection's is foreign",
                Case {
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("d"), Some("old")))]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "deleting CRD waits",
                Case {
                    bindings: bound_a.clone(),
                    crds: BTreeMap::from([(
                        "a.x.io".into(),
                        CrdMeta {
                            deleting: true,
                            ..meta(true, Some("c"), Some("old"))
                        },
                    )]),
                    ..Default::default()
                },
                vec![],
            ),
            (
                "namespaced Binding cannot pull a cluster-scoped API",
                Case {
                    bindings: vec![binding(Some("ns"), "b", "c", &["b.x.io"])],
                    ..Default::default()
                },
                vec![],
            ),
            (
                "identity changed: nothing",
                Case {
                    bindings: bound_a.clone(),
                    status: ConnectionStatus {
                        remote_cluster_uid: Some("pinned".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                vec![],
            ),
            (
                "identity unreadable: nothing",
                Case {
                    bindings: bound_a,
                    remote: Some(Err(IdentityError::Forbidden("no".into()))),
                    ..Default::default()
                },
                vec![],
            ),
        ];
        for (what, case, want) in cases {
            assert_eq!(case.actions(), want, "{what}");
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    fn reason(conds: &[Condition], t: &str) -> String {
        conds
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| format!("{}/{}", c.status, c.reason))
            .unwrap_or_default()
    }

    #[test]
    fn connection_conditions() {
        let case = Case::default();
        let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).connection;
        assert_eq!(reason(&st.conditions, READY), "True/Ready");
        assert_eq!(
            (
                st.remote_cluster_uid.as_deref(),
                st.local_cluster_uid.as_deref()
            ),
            (Some("remote"), Some("local"))
        );
        assert_eq!(st.exported_apis.len(), 2);

        let changed = Case {
            status: ConnectionStatus {
                remote_cluster_uid: Some("pinned".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let st = plan_status(&changed.observed(), &[], &[], AutoBindView::Off, now()).connection;
        assert_eq!(
            reason(&st.conditions, CONNECTED),
            "False/ClusterIdentityChanged"
        );
        assert_eq!(
            st.remote_cluster_uid.as_deref(),
            Some("pinned"),
            "never re-pinned"
        );
        assert!(
            st.exported_apis.is_empty(),
            "nothing discovered from the other cluster"
        );

        let case = Case::default();
        let mut o = case.observed();
        o.credentials = Err(CredentialError::SecretNotFound {
            namespace: "n".into(),
            name: "s".into(),
        });
        o.remote_uid = None;
        o.discovery = None;
        let st = plan_status(&o, &[], &[], AutoBindView::Off, now()).connection;
        assert_eq!(reason(&st.conditions, SECRET_VALID), "False/SecretNotFound");
        assert_eq!(reason(&st.conditions, READY), "False/SecretNotFound");

        let mut o = case.observed();
        o.discovery = Some(Err(DiscoveryError {
            forbidden: true,
            message: "listing: 403".into(),
        }));
        let st = plan_status(&o, &[], &[], AutoBindView::Off, now()).connection;
        assert_eq!(
            reason(&st.conditions, PERMISSION_DENIED),
            "True/DiscoveryForbidden"
        );
        assert_eq!(reason(&st.conditions, READY), "False/DiscoveryForbidden");
    }

    #[test]
    fn binding_setup_status() {
        let case = Case {
            bindings: vec![
                binding(None, "ok", "c", &["a.x.io"]),
                binding(Some("ns"), "scoped", "c", &["b.x.io"]),
                binding(None, "foreign", "c", &["b.x.io"]),
                binding(None, "missing", "c", &["z.x.io"]),
            ],
            crds: BTreeMap::from([
                ("a.x.io".into(), meta(true, Some("c"), Some("h1"))),
                ("b.x.io".into(), meta(false, None, None)),
            ]),
            ..Default::default()
        };
        let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
        let by_name: BTreeMap<String, &BindingStatus> = plan
            .bindings
            .iter()
            .map(|(k, s)| (k.name.clone(), s))
            .collect();
        assert_eq!(reason(&by_name["ok"].conditions, READY), "True/Bound");
        assert_eq!(
            reason(&by_name["ok"].conditions, SYNCED),
            "True/SchemasInstalled"
        );
        assert_eq!(
            by_name["ok"].bound_apis[0].schema_hash.as_deref(),
            Some("h1")
        );
        assert_eq!(
            reason(&by_name["scoped"].conditions, READY),
            "False/ClusterScopedAPI"
        );
        assert_eq!(
            reason(&by_name["foreign"].conditions, READY),
            "False/ForeignCRD"
        );
        assert_eq!(
            reason(&by_name["missing"].conditions, READY),
            "False/APINotExported"
        );

        // A forbidden CRD write is the binding's setup-level PermissionDenied.
        let case = Case {
            bindings: vec![binding(None, "ok", "c", &["a.x.io"])],
            ..Default::default()
        };
        let o = case.observed();
        let actions = plan_crds(&o);
        let plan = plan_status(
            &o,
            &actions,
            &[CrdOutcome::Forbidden("no".into())],
            AutoBindView::Off,
            now(),
        );
        assert_eq!(
            reason(&plan.bindings[0].1.conditions, PERMISSION_DENIED),
            "True/CRDWriteForbidden"
        );
        assert_eq!(
            reason(&plan.connection.conditions, PERMISSION_DENIED),
            "True/CRDWriteForbidden"
        );

        // An unchanged binding is not rewritten.
        let mut case = Case {
            bindings: vec![binding(None, "ok", "c", &["a.x.io"])],
            crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
            ..Default::default()
        };
        let first = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
        case.bindings[0].status = first.bindings[0].1.clone();
        assert!(
            plan_status(&case.observed(), &[], &[], AutoBindView::Off, now())
                .bindings
                .is_empty()
        );
    }

    #[test]
    fn bound_apis_carry_warnings_for_webhook_conversion_and_shadowing() {
        let mut webhook = export("a.x.io", "Namespaced", "h1");
        webhook.webhook_conversion = true;
        let case = Case {
            exports: vec![webhook],
            bindings: vec![
                binding(None, "cb", "c", &["a.x.io"]),
                binding(Some("ns"), "b", "c", &["a.x.io"]),
            ],
            crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
            ..Default::default()
        };
        let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
        let ready = |name: &str| {
            let st = &plan
                .bindings
                .iter()
                .find(|(k, _)| k.name == name)
                .unwrap()
                .1;
            st.conditions
                .iter()
                .find(|c| c.type_ == READY)
                .cloned()
                .unwrap()
        };
        let cb = ready("cb");
        assert_eq!(cb.status, "True");
        assert!(
            cb.message
                .contains("provider-side conversion is not reproduced"),
            "{}",
            cb.message
        );
        let b = ready("b");
        assert!(
            b.message
                .contains("ClusterBinding cb, which takes precedence"),
            "{}",
            b.message
        );
    }

    #[test]
    fn auto_bind_name_taken_is_a_condition() {
        let case = Case::default();
        let st = plan_status(&case.observed(), &[], &[], AutoBindView::NameTaken, now());
        assert_eq!(
            reason(&st.connection.conditions, AUTO_BIND),
            "False/NameTaken"
        );
        assert_eq!(st.autobind, AutoBind::Leave, "never touched");
        let st = plan_status(
            &case.observed(),
            &[],
            &[],
            AutoBindView::Maintained(None),
            now(),
        );
        assert_eq!(
            reason(&st.connection.conditions, AUTO_BIND),
            "True/Maintained"
        );
        let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
        assert!(
            !st.connection
                .conditions
                .iter()
                .any(|c| c.type_ == AUTO_BIND)
        );
    }

    #[test]
    fn auto_bind_needs_two_empty_discoveries_to_delete() {
        let existing = binding(None, "c", "c", &["a.x.io"]);
        let mut case = Case {
            exports: vec![],
            ..Default::default()
        };
        let first = plan_status(
            &case.observed(),
            &[],
            &[],
            AutoBindView::Maintained(Some(&existing)),
            now(),
        );
        assert_eq!(
            first.autobind,
            AutoBind::Leave,
            "one empty discovery may be a flapping label"
        );
        assert_eq!(first.connection.empty_discoveries, Some(1));
        case.status = first.connection;
        let second = plan_status(
            &case.observed(),
            &[],
            &[],
            AutoBindView::Maintained(Some(&existing)),
            now(),
        );
        assert_eq!(second.autobind, AutoBind::Delete);

        let case = Case::default();
        assert_eq!(
            plan_status(
                &case.observed(),
                &[],
                &[],
                AutoBindView::Maintained(None),
                now()
            )
            .autobind,
            AutoBind::Apply(vec!["a.x.io".into(), "b.x.io".into()])
        );
        let same = binding(None, "c", "c", &["a.x.io", "b.x.io"]);
        assert_eq!(
            plan_status(
                &case.observed(),
                &[],
                &[],
                AutoBindView::Maintained(Some(&same)),
                now()
            )
            .autobind,
            AutoBind::Leave
        );
        assert_eq!(
            plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).autobind,
            AutoBind::Leave,
            "autoBind off leaves it"
        );
        // A non-empty discovery resets the count.
        let reset = Case {
            status: ConnectionStatus {
                empty_discoveries: Some(1),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            plan_status(
                &reset.observed(),
                &[],
                &[],
                AutoBindView::Maintained(None),
                now()
            )
            .connection
            .empty_discoveries,
            None
        );
    }
}
