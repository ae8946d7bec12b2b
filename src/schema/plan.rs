//! The pure part of `kbind schema`: from what one Connection's observation found, decide the
//! consumer CRD writes (the contract's install table), then — given how those writes went — the
//! statuses of the Connection and its bindings and the autoBind ClusterBinding. No I/O here.

use std::collections::{BTreeMap, BTreeSet};

use super::crdpull::{ConsumerCrd, with_markers};
use crate::api::BindingKey;
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::condition::*;
use crate::api::core::{
    BindingStatus, BoundApi, ConnectionStatus, PullPolicy, SchemaSource, UpdatePolicy,
};
use crate::connection::refresh::{RefreshError, Refreshed};
use crate::connection::{CredentialError, IdentityError};

/// What the consumer cluster holds under a CRD name (metadata only).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrdMeta {
    /// The observed object's UID: deletes are preconditioned on it.
    pub uid: String,
    pub managed: bool,
    pub connection: Option<String>,
    pub schema_hash: Option<String>,
    /// kbind created it (annotation `core.kbind.io/created`): only such a CRD is ever deleted.
    pub created: bool,
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
    pub labels: BTreeMap<String, String>,
    /// Whether its Connection serves it: a Binding in a namespace the Connection does not admit
    /// gets no CRD installed and no cleanup finalizer, only conditions saying why.
    pub admission: crate::bindings::admission::Admission,
}

pub use crate::discovery::{Discovered, DiscoveryError};

/// Everything observed for one Connection.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub name: &'a str,
    /// The Connection's labels: autoBind's ClusterBinding carries them, so a `--selector` that
    /// picks the Connection picks its binding too (in `kbind resync` as well).
    pub labels: &'a BTreeMap<String, String>,
    pub generation: Option<i64>,
    pub policy: &'a crate::api::core::SchemaPolicy,
    pub status: &'a ConnectionStatus,
    pub credentials: Result<(), CredentialError>,
    /// Rotation by pull (a Secret carrying `core.kbind.io/grant-secret`); `None` otherwise.
    pub refresh: Option<Result<Refreshed, RefreshError>>,
    /// Provider identity; `None` when credentials were unusable.
    pub remote_uid: Option<Result<String, IdentityError>>,
    pub local_uid: &'a str,
    /// `None` when discovery did not run (not connected).
    pub discovery: Option<Result<Discovered, DiscoveryError>>,
    /// Every binding in the cluster (the resolver needs the ones of other Connections too).
    pub bindings: &'a [BindingView],
    pub consumer_crds: &'a BTreeMap<String, CrdMeta>,
    /// Consumer CRDs of the autoBind ClusterBinding that still hold objects (or whose objects
    /// could not be read), read only once the provider exports nothing: a provider withdrawing
    /// its exports never causes the deletion of consumer objects (docs/schema.md "autoBind").
    pub holding: BTreeMap<String, Holding>,
}

/// Why a consumer CRD of a withdrawn autoBind binding is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// It holds objects.
    Objects,
    /// Its objects could not be listed (the reason): kept, as when unsure nothing is deleted.
    Unreadable(String),
}

/// One consumer CRD write.
#[derive(Clone, Debug, PartialEq)]
pub enum CrdAction {
    Create(Box<ConsumerCrd>),
    Update(Box<ConsumerCrd>),
    /// Add kbind's markers to an existing, externally supplied CRD (None + CRD source only).
    Stamp {
        name: String,
        connection: String,
    },
}

impl CrdAction {
    pub fn name(&self) -> String {
        match self {
            Self::Create(c) | Self::Update(c) => c.name.clone(),
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

    /// What discovery found, when it ran on a connected provider.
    pub fn exports(&self) -> Option<&Discovered> {
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
        .filter(|b| b.admission.admitted())
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
            None if wanted => actions.push(CrdAction::Create(Box::new(consumer_crd(e, o, true)))),
            None => {}
            Some(m) if ours(m, o.name) => {
                let drifted = m.schema_hash.as_deref() != Some(e.api.schema_hash.as_str());
                if drifted
                    && o.policy.update_policy == UpdatePolicy::Always
                    && o.policy.pull_policy != PullPolicy::None
                {
                    // The creation record stays exactly as observed: an update never claims a
                    // CRD kbind did not create.
                    let crd = consumer_crd(e, o, m.created);
                    actions.push(CrdAction::Update(Box::new(crd)));
                }
            }
            // Only a CRD a binding of this Connection lists: None never marks a CRD nobody asked
            // kbind to sync (docs/deviations.md "pullPolicy None").
            Some(m)
                if unmarked(m)
                    && o.policy.pull_policy == PullPolicy::None
                    && d.source == SchemaSource::Crd
                    && bound.contains(name) =>
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

/// The consumer CRD for export `e` with kbind's markers, and the creation record when `created`.
fn consumer_crd(e: &super::crdpull::Export, o: &Observed, created: bool) -> ConsumerCrd {
    let mut crd = with_markers(e, o.name);
    if created {
        crd.annotations
            .insert(crate::api::keys::CREATED.to_string(), "true".to_string());
    }
    crd
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
            CrdAction::Create(c) | CrdAction::Update(c) => {
                c.annotations.get(crate::api::keys::SCHEMA_HASH).cloned()
            }
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
                created: match a {
                    CrdAction::Create(_) => true,
                    _ => o.consumer_crds.get(&a.name()).is_some_and(|m| m.created),
                },
                deleting: false,
            },
        );
    }
    crds
}

mod autobind;
mod binding;
mod quarantine;
mod status;
pub mod sweep;
pub use autobind::{AutoBind, AutoBindView, EXPORTS_WITHDRAWN, TOO_MANY_APIS, exports_withdrawn};
pub use binding::{SchemaOwned, schema_owned};
pub use quarantine::{REASON_QUARANTINED, quarantined_status};
pub use status::{StatusPlan, plan_status};

#[cfg(test)]
mod tests;
