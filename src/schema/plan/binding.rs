//! The setup side of one Connection's bindings, pure: per API, whether it is bound (and in
//! sync with what the provider exports) or why not; then the binding's status fields that
//! `kbind schema` owns (contract "Who writes what": the rest is resync's).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::bindings::admission::{Admission, NAMESPACE_NOT_ALLOWED};

/// Per-API setup result of a binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ApiState {
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

pub(super) fn api_state(
    o: &Observed,
    d: Option<&Discovered>,
    crds: &BTreeMap<String, CrdMeta>,
    b: &BindingView,
    api: &str,
    denied: &[String],
    failed: &[String],
) -> ApiState {
    let problem = |reason: &'static str, message: String| ApiState::Problem { reason, message };
    let e = match usable_export(o, d, b, api, denied, failed) {
        Ok(e) => e,
        Err(state) => return state,
    };
    match crds.get(api) {
        None if o.policy.pull_policy == PullPolicy::None => problem(
            "CRDMissing",
            format!("pullPolicy None: {api} must be installed by its external manager"),
        ),
        None => problem(
            "CRDPending",
            format!("consumer CRD {api} not installed yet"),
        ),
        Some(m) if ours(m, o.name) => bound(o, b, e, m),
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

/// The export behind `api`, when this binding may use it and its consumer CRD write did not
/// fail this run; else the problem that says why not.
fn usable_export<'d>(
    o: &Observed,
    d: Option<&'d Discovered>,
    b: &BindingView,
    api: &str,
    denied: &[String],
    failed: &[String],
) -> Result<&'d crate::discovery::crdpull::Export, ApiState> {
    let problem = |reason: &'static str, message: String| ApiState::Problem { reason, message };
    let Some(d) = d else {
        return Err(problem(
            "ConnectionNotReady",
            format!("Connection {} is not ready", o.name),
        ));
    };
    let Some(e) = d.exports.iter().find(|e| e.api.name == api) else {
        if let Some((_, why)) = d.skipped.iter().find(|(n, _)| n == api) {
            return Err(problem(
                "ExportUnusable",
                format!("{api} is exported but cannot be pulled: {why}"),
            ));
        }
        return Err(problem(
            "APINotExported",
            format!("{api} is not exported by Connection {}", o.name),
        ));
    };
    if b.key.namespace.is_some() && e.api.scope == "Cluster" {
        return Err(problem(
            "ClusterScopedAPI",
            format!("{api} is cluster-scoped: only a ClusterBinding can activate it"),
        ));
    }
    if denied.iter().any(|n| n == api) {
        return Err(problem(
            "PermissionDenied",
            format!("writing the consumer CRD {api} was forbidden"),
        ));
    }
    if failed.iter().any(|n| n == api) {
        return Err(problem(
            "CRDWriteFailed",
            format!("writing the consumer CRD {api} failed; retried next run"),
        ));
    }
    Ok(e)
}

/// An API bound through this Connection's own consumer CRD, with its drift and warnings.
fn bound(
    o: &Observed,
    b: &BindingView,
    e: &crate::discovery::crdpull::Export,
    m: &CrdMeta,
) -> ApiState {
    let api = e.api.name.as_str();
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
        && let Some(cb) = o
            .bindings
            .iter()
            .find(|x| x.key.namespace.is_none() && !x.deleting && x.apis.iter().any(|a| a == api))
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

/// What a binding's API states add up to: the bound APIs (schema fields set), the problems
/// (reason, message), the APIs with a schema update pending, and warnings.
struct Summed<'s> {
    bound: Vec<BoundApi>,
    problems: Vec<(&'static str, String)>,
    pending: Vec<&'s str>,
    warnings: Vec<String>,
}

fn sum<'s>(b: &BindingView, states: &'s [(String, ApiState)], update: UpdatePolicy) -> Summed<'s> {
    let mut out = Summed {
        bound: Vec::new(),
        problems: Vec::new(),
        pending: Vec::new(),
        warnings: Vec::new(),
    };
    for (api, s) in states {
        match s {
            ApiState::Bound {
                scope,
                version,
                hash,
                in_sync,
                warning,
            } => {
                out.warnings.extend(warning.iter().cloned());
                let prev = b
                    .status
                    .bound_apis
                    .iter()
                    .find(|x| &x.name == api)
                    .cloned()
                    .unwrap_or_default();
                out.bound.push(BoundApi {
                    name: api.clone(),
                    scope: Some(scope.clone()),
                    version: Some(version.clone()),
                    schema_hash: Some(hash.clone()),
                    ..prev
                });
                if !in_sync && update == UpdatePolicy::Always {
                    out.pending.push(api);
                }
            }
            ApiState::Problem { reason, message } => out.problems.push((*reason, message.clone())),
        }
    }
    out
}

/// The Connection as its bindings see it this run: Ready or why not, and what the provider
/// refused it (identity read, discovery).
pub(super) struct ConnectionSide<'a> {
    pub ready: bool,
    pub not_ready: Option<&'a (&'static str, String)>,
    pub refused: Option<&'a (&'static str, String)>,
}

pub(super) fn binding_status(
    b: &BindingView,
    states: &[(String, ApiState)],
    conn: &ConnectionSide<'_>,
    update: UpdatePolicy,
    now: Timestamp,
) -> BindingStatus {
    let mut st = b.status.clone();
    let g = b.generation;
    if let Admission::NotAllowed(msg) = &b.admission {
        return not_allowed(st, msg, g, now);
    }
    let Summed {
        mut bound,
        problems,
        pending,
        warnings,
    } = sum(b, states, update);
    keep_resync_entries(&b.status.bound_apis, &mut bound);
    st.bound_apis = bound;
    let denied: Vec<&String> = problems
        .iter()
        .filter(|(r, _)| *r == "PermissionDenied")
        .map(|(_, m)| m)
        .collect();
    let c = &mut st.conditions;
    match (conn.ready, problems.first()) {
        (false, _) => {
            let (reason, msg) = conn
                .not_ready
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
    if pending.is_empty() && problems.is_empty() && conn.ready {
        c.set_condition(SYNCED, S::True, "SchemasInstalled", "", g, now);
    } else {
        let msg = if pending.is_empty() {
            "setup incomplete; see Ready".to_string()
        } else {
            format!("schema update pending: {}", pending.join(", "))
        };
        c.set_condition(SYNCED, S::False, "SetupIncomplete", &msg, g, now);
    }
    permission_denied(c, &denied, conn.refused, g, now);
    st.observed_generation = g;
    st
}

/// A Binding its Connection does not serve: nothing is bound, and every condition says why (the
/// message names the Connection's field to set: docs/schema.md "Namespaced Bindings").
fn not_allowed(mut st: BindingStatus, msg: &str, g: Option<i64>, now: Timestamp) -> BindingStatus {
    let mut bound = Vec::new();
    keep_resync_entries(&st.bound_apis, &mut bound);
    st.bound_apis = bound;
    let c = &mut st.conditions;
    c.set_condition(READY, S::False, NAMESPACE_NOT_ALLOWED, msg, g, now);
    c.set_condition(
        SYNCED,
        S::False,
        "SetupIncomplete",
        "setup incomplete; see Ready",
        g,
        now,
    );
    c.set_condition(
        PERMISSION_DENIED,
        S::True,
        NAMESPACE_NOT_ALLOWED,
        msg,
        g,
        now,
    );
    st.observed_generation = g;
    st
}

/// Entries only resync owns (counts for an API no longer bound) are left to resync: kept with
/// the schema fields cleared, and the list sorted by name.
fn keep_resync_entries(previous: &[BoundApi], bound: &mut Vec<BoundApi>) {
    for prev in previous {
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
}

/// A binding's PermissionDenied: what the provider refused its Connection this run (the identity
/// read, discovery: reason `IdentityForbidden`, `DiscoveryForbidden`), else the denied CRD writes
/// of its APIs; `Permitted` only when nothing was refused.
fn permission_denied(
    c: &mut Vec<Condition>,
    denied: &[&String],
    refused: Option<&(&'static str, String)>,
    g: Option<i64>,
    now: Timestamp,
) {
    if let Some((reason, msg)) = refused {
        c.set_condition(PERMISSION_DENIED, S::True, reason, msg, g, now);
    } else if denied.is_empty() {
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
