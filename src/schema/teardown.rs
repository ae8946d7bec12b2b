//! Teardown, in the contract's order. A deleting binding keeps its finalizer until `kbind
//! resync` has released its instances (`InstancesReleased=True`); then the managed consumer CRDs
//! of a ClusterBinding that kbind created (`core.kbind.io/created`) are removed (a Binding keeps
//! them, and a CRD kbind only stamped always stays) and the finalizer goes. A deleting Connection
//! waits while bindings reference it, removes its autoBind ClusterBinding, then releases the
//! Secret's finalizer (when no other Connection uses it) and its own. Provider data is never
//! deleted because of an unbind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::BindingObj;
use super::plan::CrdMeta;
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::condition::{INSTANCES_RELEASED, PERMISSION_DENIED, READY, SYNCED};
use crate::api::core::{ClusterBinding, Connection};
use crate::api::keys;
use crate::pass::StatusCode;
use crate::pass::finalizer;
use crate::pass::status::apply_status;
use crate::pass::writes::Writes;

pub struct View<'a> {
    pub client: &'a Client,
    pub manager: &'a str,
    pub connections: &'a [Connection],
    pub bindings: &'a [BindingObj],
}

/// A deleting Connection: its autoBind ClusterBinding goes, then it waits for the bindings
/// it serves; once none remain its Secret (unless shared) and itself lose the finalizer.
pub async fn connection(
    v: View<'_>,
    conn: &Connection,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let name = conn.name_any();
    if !finalizer::has(conn.meta().finalizers.as_ref(), keys::CLEANUP_FINALIZER) {
        return Ok(());
    }
    delete_autobind(&v, conn, writes).await?;
    // A Binding the Connection does not serve never holds it: it got nothing through it, and
    // once the Connection is gone its own teardown touches only consumer objects. So a tenant
    // cannot keep a Connection from being deleted (docs/operations.md "Deleting a Connection").
    let remaining: Vec<String> = v
        .bindings
        .iter()
        .filter(|b| b.view.connection == name && b.view.admission.admitted())
        .map(|b| b.view.key.to_string())
        .collect();
    let conns: Api<Connection> = Api::all(v.client.clone());
    if !remaining.is_empty() {
        return bindings_remain(&v, &conns, conn, &remaining, writes).await;
    }
    let r = &conn.spec.kubeconfig_secret_ref;
    let secret_shared = v.connections.iter().any(|c| {
        c.name_any() != name
            && c.spec.kubeconfig_secret_ref.namespace == r.namespace
            && c.spec.kubeconfig_secret_ref.name == r.name
    });
    if !secret_shared
        && writes.will(
            "release finalizer",
            format!("Secret {}/{}", r.namespace, r.name),
            keys::CLEANUP_FINALIZER,
        )
    {
        finalizer::set(
            &Api::<Secret>::namespaced(v.client.clone(), &r.namespace),
            &r.name,
            Some(&r.namespace),
            v.manager,
            keys::CLEANUP_FINALIZER,
            false,
        )
        .await?;
        writes.bookkeeping_done();
    }
    if writes.will(
        "release finalizer",
        format!("Connection {name}"),
        keys::CLEANUP_FINALIZER,
    ) {
        finalizer::set(
            &conns,
            &name,
            None,
            v.manager,
            keys::CLEANUP_FINALIZER,
            false,
        )
        .await?;
        writes.bookkeeping_done();
    }
    Ok(())
}

/// The ClusterBinding autoBind made for this Connection (named after it, owned by it) goes
/// with it.
async fn delete_autobind(
    v: &View<'_>,
    conn: &Connection,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let name = conn.name_any();
    let uid = conn.uid().unwrap_or_default();
    let autobind = v.bindings.iter().find(|b| {
        b.view.key.namespace.is_none() && b.view.key.name == name && b.owner_uids.contains(&uid)
    });
    if let Some(ab) = autobind
        && !ab.view.deleting
        && writes.will(
            "delete",
            format!("ClusterBinding {name}"),
            "autoBind binding of a deleted Connection",
        )
        && delete_observed(
            &Api::<ClusterBinding>::all(v.client.clone()),
            &name,
            &ab.uid,
        )
        .await?
    {
        writes.data_done();
    }
    Ok(())
}

/// The deletion waits: `Ready=False BindingsRemain` names the bindings it waits for.
async fn bindings_remain(
    v: &View<'_>,
    conns: &Api<Connection>,
    conn: &Connection,
    remaining: &[String],
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let name = conn.name_any();
    let mut st = conn.status.clone().unwrap_or_default();
    let msg = format!(
        "deletion waits for bindings that reference this Connection: {}",
        remaining.join(", ")
    );
    if st.conditions.set_condition(
        READY,
        S::False,
        "BindingsRemain",
        &msg,
        conn.meta().generation,
        Timestamp::now(),
    ) && writes.will(
        "apply-status",
        format!("Connection {name}"),
        "Ready=False BindingsRemain",
    ) {
        // The whole owned status: a server-side apply drops owned fields it omits.
        let value = serde_json::to_value(&st).unwrap_or_default();
        apply_status(
            conns,
            &name,
            v.manager,
            value,
            conn.resource_version().as_deref(),
        )
        .await?;
        writes.bookkeeping_done();
    }
    Ok(())
}

/// A deleting binding: finish once resync released its instances. CRDs in `keep` stay.
pub async fn binding(
    client: &Client,
    manager: &str,
    b: &BindingObj,
    all: &[BindingObj],
    crds: &BTreeMap<String, CrdMeta>,
    keep: &std::collections::BTreeSet<String>,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    if !b.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER) {
        return Ok(());
    }
    if !b.view.status.conditions.is_true(INSTANCES_RELEASED) {
        tracing::info!(binding = %b.view.key, "waiting for kbind resync to release the binding's instances");
        return Ok(());
    }
    if let Some(o) = unreleased_other(b, all) {
        tracing::info!(binding = %b.view.key, other = %o.view.key, "waiting for kbind resync to release the other binding's instances before removing the consumer CRDs");
        return Ok(());
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, uid) in crds_to_delete(b, all, crds) {
        if keep.contains(name) {
            tracing::warn!(binding = %b.view.key, crd = %name, "consumer CRD kept: it holds objects and its provider withdrew the export");
            continue;
        }
        if writes.will(
            "delete",
            format!("CustomResourceDefinition {name}"),
            "ClusterBinding removed",
        ) && delete_observed(&api, name, uid).await?
        {
            writes.data_done();
        }
    }
    if writes.will(
        "release finalizer",
        b.view.key.to_string(),
        keys::CLEANUP_FINALIZER,
    ) {
        crate::bindings::set_finalizer(client, manager, &b.view.key, false).await?;
        writes.bookkeeping_done();
    }
    Ok(())
}

/// For a ClusterBinding's teardown: another binding of its APIs being deleted whose instances
/// resync has not released yet. Its objects still hold the syncer finalizer, and a CRD deleted
/// now would hang on them (resync no longer syncs a deleting CRD, so nothing would release
/// them): the teardown waits for that release, then the CRD goes.
pub(crate) fn unreleased_other<'a>(
    b: &BindingObj,
    all: &'a [BindingObj],
) -> Option<&'a BindingObj> {
    if b.view.key.namespace.is_some() {
        return None;
    }
    all.iter().find(|o| {
        o.view.key != b.view.key
            && o.view.deleting
            && o.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER)
            && !o.view.status.conditions.is_true(INSTANCES_RELEASED)
            && o.view.apis.iter().any(|a| b.view.apis.contains(a))
    })
}

/// The consumer CRDs a deleted binding's teardown removes, with the UIDs observed: only a
/// ClusterBinding's, only CRDs kbind created for its Connection (`core.kbind.io/created`), not
/// already being deleted (deleting again would be a write redone), and listed by no other live
/// binding. A CRD kbind only stamped (pullPolicy None), or created by kbind 0.2 before the record
/// existed, stays with its objects (docs/upgrade.md, 0.3).
pub(crate) fn crds_to_delete<'c>(
    b: &BindingObj,
    all: &[BindingObj],
    crds: &'c BTreeMap<String, CrdMeta>,
) -> Vec<(&'c str, &'c str)> {
    if b.view.key.namespace.is_some() {
        return Vec::new();
    }
    crds.iter()
        .filter(|(name, m)| {
            b.view.apis.contains(name)
                && m.managed
                && !m.deleting
                && m.connection.as_deref() == Some(b.view.connection.as_str())
        })
        .filter(|(name, m)| {
            if !m.created {
                tracing::info!(binding = %b.view.key, crd = %name, "consumer CRD kept: kbind did not create it");
            }
            m.created
        })
        .filter(|(name, _)| {
            !all.iter().any(|o| {
                o.view.key != b.view.key && !o.view.deleting && o.view.apis.contains(name)
            })
        })
        .map(|(name, m)| (name.as_str(), m.uid.as_str()))
        .collect()
}

/// Delete the object observed with `uid` (a precondition: a same-named replacement is never
/// touched). Returns whether a delete was issued; gone or replaced counts as done.
pub(crate) async fn delete_observed<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if uid.is_empty() {
        // Created in this run: its UID is not known yet; the next run deletes it.
        return Ok(false);
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() || e.is_conflict() => Ok(false),
        Err(e) => Err(e),
    }
}

/// A binding whose Connection does not exist: report it, or finish its teardown.
pub async fn orphan_binding(
    client: &Client,
    manager: &str,
    b: &BindingObj,
    all: &[BindingObj],
    crds: &BTreeMap<String, CrdMeta>,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    if b.view.deleting {
        return binding(client, manager, b, all, crds, &Default::default(), writes).await;
    }
    let mut conds = b.view.status.conditions.clone();
    let msg = format!(
        "Connection {} not found; retried every run",
        b.view.connection
    );
    if !conds.set_condition(
        READY,
        S::False,
        "ConnectionNotFound",
        &msg,
        b.view.generation,
        Timestamp::now(),
    ) {
        return Ok(());
    }
    if !writes.will(
        "apply-status",
        b.view.key.to_string(),
        "Ready=False ConnectionNotFound",
    ) {
        return Ok(());
    }
    conds.set_condition(
        SYNCED,
        S::False,
        "ConnectionNotFound",
        &msg,
        b.view.generation,
        Timestamp::now(),
    );
    // Every condition this pass owns, so none is dropped by the apply.
    let owned: Vec<_> = conds
        .into_iter()
        .filter(|c| [READY, SYNCED, PERMISSION_DENIED].contains(&c.type_.as_str()))
        .collect();
    let status = json!({"conditions": owned, "observedGeneration": b.view.generation});
    crate::bindings::apply_status(client, manager, &b.view.key, status).await?;
    writes.bookkeeping_done();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::BindingKey;
    use crate::schema::plan::BindingView;

    fn binding(ns: Option<&str>, name: &str, apis: &[&str], deleting: bool) -> BindingObj {
        BindingObj {
            view: BindingView {
                key: BindingKey {
                    namespace: ns.map(String::from),
                    name: name.into(),
                },
                connection: "c".into(),
                apis: apis.iter().map(|a| a.to_string()).collect(),
                deleting,
                ..Default::default()
            },
            uid: format!("uid-{name}"),
            finalizers: vec![keys::CLEANUP_FINALIZER.into()],
            owner_uids: vec![],
        }
    }

    fn crd(connection: &str, created: bool, deleting: bool) -> CrdMeta {
        CrdMeta {
            uid: format!("uid-{connection}-{created}"),
            managed: true,
            connection: Some(connection.into()),
            schema_hash: created.then(|| "h".into()),
            created,
            deleting,
        }
    }

    #[test]
    fn teardown_deletes_only_crds_kbind_created_and_nobody_else_lists() {
        let crds = BTreeMap::from([
            ("created.x.io".to_string(), crd("c", true, false)),
            ("stamped.x.io".to_string(), crd("c", false, false)),
            ("others.x.io".to_string(), crd("d", true, false)),
            ("going.x.io".to_string(), crd("c", true, true)),
            ("shared.x.io".to_string(), crd("c", true, false)),
        ]);
        let apis = [
            "created.x.io",
            "stamped.x.io",
            "others.x.io",
            "going.x.io",
            "shared.x.io",
            "absent.x.io",
        ];
        let deleting = binding(None, "cb", &apis, true);
        let all = vec![
            deleting.clone(),
            binding(Some("ns"), "b", &["shared.x.io"], false),
            // Another deleting binding listing it does not keep it.
            binding(None, "gone", &["created.x.io"], true),
        ];
        // Of a ClusterBinding's APIs, only the CRD kbind created that nobody else lists goes:
        // not the stamped one, another Connection's, one already going, one a live Binding
        // lists, or one that does not exist.
        assert_eq!(
            crds_to_delete(&deleting, &all, &crds),
            [("created.x.io", "uid-c-true")]
        );
        assert_eq!(
            crds_to_delete(&all[1], &all, &crds),
            [],
            "a Binding removes no CRD"
        );
    }
}
