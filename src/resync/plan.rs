//! The pure part of `kbind resync`: for one consumer object and what the provider holds under
//! the same namespace/name, decide the writes (contract "Resync ownership", spec "Bidirectional
//! sync"). No I/O here.

use std::collections::{BTreeMap, BTreeSet};

pub use super::doc::Doc;
use crate::api::core::{ConflictPolicy, OrphanPolicy};
use crate::api::keys;

/// What the pass needs of a consumer object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsumerObj {
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub spec: Doc,
    pub status: Doc,
    pub deleting: bool,
    /// When its deletion began (Unix seconds), if it is being deleted.
    pub deleting_since: Option<i64>,
    pub has_finalizer: bool,
    pub conflict: Option<String>,
    pub orphan_on_delete: bool,
    /// The UID of its namespace now (`None`: cluster-scoped, or not known this run).
    pub namespace_uid: Option<String>,
}

/// What the pass needs of a provider object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderObj {
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub cluster_marker: Option<String>,
    pub object_marker: Option<String>,
    /// `core.kbind.io/consumer-namespace-uid`: the namespace its consumer object lived in.
    pub namespace_marker: Option<String>,
    pub spec: Doc,
    pub status: Doc,
    pub deleting: bool,
    /// kbind's `core.kbind.io/orphaned` annotation: why the consumer object is gone.
    pub orphaned: Option<String>,
}

/// Who a provider object belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    Ours,
    /// Our cluster's earlier copy of an object that no longer exists: take it back.
    OurEarlierCopy,
    /// Our cluster's earlier copy from a namespace of the same name that was deleted (its UID
    /// differs): never re-adopted by whoever holds the name now.
    FromRecreatedNamespace,
    /// No markers at all.
    Unmarked,
    OwnedByAnother,
}

pub fn ownership(
    p: &ProviderObj,
    local_uid: &str,
    c: &ConsumerObj,
    live_uids: &BTreeSet<String>,
) -> Ownership {
    let earlier = || {
        if same_namespace(p, c.namespace_uid.as_deref()) {
            Ownership::OurEarlierCopy
        } else {
            Ownership::FromRecreatedNamespace
        }
    };
    match (p.cluster_marker.as_deref(), p.object_marker.as_deref()) {
        (None, None) => Ownership::Unmarked,
        (Some(cl), Some(o)) if cl == local_uid && o == c.uid => Ownership::Ours,
        (Some(cl), Some(o)) if cl == local_uid && !live_uids.contains(o) => earlier(),
        (Some(cl), None) if cl == local_uid => earlier(),
        _ => Ownership::OwnedByAnother,
    }
}

/// Whether a copy came from the namespace that now holds its name. A copy written before kbind
/// recorded namespaces (no marker), or a namespace whose UID is not known, cannot be told apart:
/// such a copy counts as the same (docs/upgrade.md 0.3).
pub fn same_namespace(p: &ProviderObj, namespace_uid: Option<&str>) -> bool {
    match (p.namespace_marker.as_deref(), namespace_uid) {
        (Some(was), Some(now)) => was == now,
        _ => true,
    }
}

/// Conflict reasons written to the consumer object's `core.kbind.io/conflict` annotation.
pub const FOREIGN_OBJECT_EXISTS: &str = "ForeignObjectExists";
pub const OWNED_BY_ANOTHER: &str = "OwnedByAnother";

/// One write, in the order it must happen.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    AddFinalizer,
    /// Create the provider copy (spec + markers); the namespace is created if missing.
    Create,
    /// Bring the provider copy's spec and markers to the consumer's.
    UpdateSpec,
    StatusDown(Doc),
    MarkConflict(&'static str),
    ClearConflict,
    DeleteProvider,
    /// Hand the provider copy over: strip kbind's markers (deletion-policy Orphan).
    OrphanProvider,
    /// A re-adopted orphan: drop its `core.kbind.io/orphaned` annotation.
    ClearOrphaned,
    ReleaseFinalizer,
    /// The provider kept our copy terminating past `--provider-deletion-wait`: release the
    /// consumer object anyway, with a Warning Event; the copy is the provider's to finish.
    ReleaseUnconfirmed,
}

/// How the object stands after the planned writes succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    InSync,
    Pending,
    Conflict,
    /// Being deleted and released (or waiting for the provider copy to go).
    Deleting,
}

/// `waited_out`: deletions that began before it (Unix seconds) no longer wait for a provider
/// copy that is terminating (`i64::MIN`: wait for ever).
pub fn plan_object(
    c: &ConsumerObj,
    p: Option<&ProviderObj>,
    local_uid: &str,
    live_uids: &BTreeSet<String>,
    policy: ConflictPolicy,
    waited_out: i64,
) -> (Vec<Action>, Standing) {
    let provider = p.map(|p| (p, ownership(p, local_uid, c, live_uids)));
    if c.deleting {
        return (deleting(c, provider, waited_out), Standing::Deleting);
    }

    let mut a = Vec::new();
    if !c.has_finalizer {
        a.push(Action::AddFinalizer);
    }
    let conflict = |a: &mut Vec<Action>, reason: &'static str| {
        if c.conflict.as_deref() != Some(reason) {
            a.push(Action::MarkConflict(reason));
        }
    };
    match provider {
        None => a.push(Action::Create),
        Some((_, Ownership::OwnedByAnother)) => {
            conflict(&mut a, OWNED_BY_ANOTHER);
            return (a, Standing::Conflict);
        }
        Some((_, Ownership::FromRecreatedNamespace)) => {
            conflict(&mut a, keys::NAMESPACE_RECREATED);
            return (a, Standing::Conflict);
        }
        Some((_, Ownership::Unmarked)) if policy == ConflictPolicy::Fail => {
            conflict(&mut a, FOREIGN_OBJECT_EXISTS);
            return (a, Standing::Conflict);
        }
        Some((p, own)) => {
            if p.deleting {
                // The copy is going away on the provider; re-created once it is gone.
                return (a, Standing::Pending);
            }
            // A copy written before kbind recorded its namespace gets the marker once.
            let unrecorded = c.namespace_uid.is_some() && p.namespace_marker != c.namespace_uid;
            if own != Ownership::Ours || p.spec != c.spec || unrecorded {
                a.push(Action::UpdateSpec);
            }
            if p.orphaned.is_some() {
                a.push(Action::ClearOrphaned);
            }
            // A re-adopted copy's status comes down in the same run as the adoption, after it
            // (docs/resync.md "Orphans": a restored object has it on the next run); a foreign
            // object taken over under Adopt waits until it is ours.
            let mine = matches!(own, Ownership::Ours | Ownership::OurEarlierCopy);
            if mine && !p.status.is_null() && p.status != c.status {
                a.push(Action::StatusDown(p.status.clone()));
            }
        }
    }
    if c.conflict.is_some() {
        a.push(Action::ClearConflict);
    }
    let standing = if a
        .iter()
        .any(|x| matches!(x, Action::Create | Action::UpdateSpec))
    {
        Standing::Pending
    } else {
        Standing::InSync
    };
    (a, standing)
}

/// A deleting consumer object: its copy goes first (or is orphaned on request), then its
/// finalizer; a copy already terminating is waited for, within bounds.
fn deleting(
    c: &ConsumerObj,
    provider: Option<(&ProviderObj, Ownership)>,
    waited_out: i64,
) -> Vec<Action> {
    if !c.has_finalizer {
        return vec![];
    }
    match provider {
        Some((p, Ownership::Ours)) if !p.deleting => {
            if c.orphan_on_delete {
                vec![Action::OrphanProvider, Action::ReleaseFinalizer]
            } else {
                // Released once the copy is gone (possibly on a later run).
                vec![Action::DeleteProvider]
            }
        }
        // Deletion in progress on the provider: wait, within bounds.
        Some((_, Ownership::Ours)) => {
            if c.deleting_since.is_some_and(|t| t < waited_out) {
                vec![Action::ReleaseUnconfirmed]
            } else {
                vec![]
            }
        }
        _ => vec![Action::ReleaseFinalizer],
    }
}

/// Provider copies of ours whose consumer object no longer exists (both markers must be ours and
/// the object UID must match no live consumer object): orphans. Keys are `namespace/name`.
pub fn orphans<'a>(
    provider: &'a BTreeMap<String, ProviderObj>,
    consumer_keys: &BTreeSet<String>,
    local_uid: &str,
    live_uids: &BTreeSet<String>,
) -> Vec<&'a ProviderObj> {
    provider
        .iter()
        .filter(|(k, p)| {
            !consumer_keys.contains(k.as_str())
                && !p.deleting
                && p.cluster_marker.as_deref() == Some(local_uid)
                && p.object_marker
                    .as_deref()
                    .is_some_and(|o| !live_uids.contains(o))
        })
        .map(|(_, p)| p)
        .collect()
}

/// The one write an orphan gets under the covering binding's `spec.orphans`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanAction {
    /// Annotate `core.kbind.io/orphaned` with the reason.
    Mark(&'static str),
    /// `Delete`: the explicit opt-in to delete the copy.
    Delete,
    /// `Restore`: re-create the consumer object from the copy.
    Restore,
}

/// Kbind never deletes provider data its consumer did not ask to delete (docs/resync.md
/// "Orphans"): only `Delete` deletes, and an orphan already marked stays as it is under `Keep`.
///
/// `namespace_uid`: the UID of the namespace that holds the copy's name now. A copy from a
/// namespace that was deleted and created again is never restored into it: it is marked
/// `NamespaceRecreated` instead (once), whatever the policy but `Delete`.
pub fn plan_orphan(
    p: &ProviderObj,
    policy: OrphanPolicy,
    namespace_uid: Option<&str>,
) -> Option<OrphanAction> {
    let recreated = keys::NAMESPACE_RECREATED;
    if policy != OrphanPolicy::Delete && !same_namespace(p, namespace_uid) {
        return (p.orphaned.as_deref() != Some(recreated)).then_some(OrphanAction::Mark(recreated));
    }
    match policy {
        OrphanPolicy::Keep if p.orphaned.is_some() => None,
        OrphanPolicy::Keep => Some(OrphanAction::Mark(keys::ORPHANED_CONSUMER_OBJECT_GONE)),
        OrphanPolicy::Delete => Some(OrphanAction::Delete),
        OrphanPolicy::Restore => Some(OrphanAction::Restore),
    }
}

/// Read kbind's markers from provider metadata.
pub fn markers(
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> (Option<String>, Option<String>) {
    (
        labels.and_then(|l| l.get(keys::CONSUMER_CLUSTER)).cloned(),
        annotations
            .and_then(|a| a.get(keys::CONSUMER_OBJECT_UID))
            .cloned(),
    )
}

#[cfg(test)]
mod tests;
