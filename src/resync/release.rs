//! Deleting bindings (I/O): stop syncing, mark an unbound API's provider copies orphaned,
//! release the syncer finalizers of the objects a deleting binding alone covered, then record
//! `InstancesReleased=True` so `kbind schema` finishes the teardown.

use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use std::collections::{BTreeMap, HashMap};

use super::{BindingRef, BoundApi, Provider, covering};
use crate::api::BindingKey;
use crate::api::conditions::Conditions;
use crate::api::core::condition::INSTANCES_RELEASED;
use crate::api::keys;
use crate::pass::StatusCode;
use crate::pass::events::EventType;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, list};

pub(super) async fn write(
    client: &Client,
    key: &BindingKey,
    status: Value,
) -> Result<(), kube::Error> {
    crate::bindings::apply_status(client, super::MANAGER, key, status).await
}

/// A deleting binding: stop syncing, release the syncer finalizers of the objects it alone
/// covered (provider copies stay, markers kept), then set `InstancesReleased=True` so
/// `kbind schema` finishes the teardown. Returns how many bindings were released.
pub async fn release_deleting_bindings(
    ctx: &PassContext,
    client: &Client,
    bindings: &[BindingRef],
    selected: &std::collections::BTreeSet<BindingKey>,
    apis: &[BoundApi],
    (providers, held): (&HashMap<String, Option<Provider>>, &BTreeMap<String, Hold>),
    writes: &mut Writes,
) -> i64 {
    let mut released = 0;
    for b in bindings
        .iter()
        .filter(|b| b.deleting && b.has_cleanup && selected.contains(&b.key))
    {
        let provider = match (providers.get(&b.connection), held.get(&b.connection)) {
            (Some(p), _) => Reached::Tried(p.as_ref()),
            (None, Some(h)) => Reached::Held(*h),
            (None, None) => Reached::Tried(None),
        };
        match release_one(ctx, client, b, bindings, apis, provider, writes).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            // Not fatal: the binding keeps its finalizer and the next run tries again.
            Err(e) => {
                tracing::warn!(binding = %b.key, error = %e, "instances not released yet")
            }
        }
    }
    released
}

/// Why a run did not try a deleting binding's provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Its Connection is quarantined (docs/operations.md "Poison items").
    Quarantined,
    /// The budget ran out first; the next run tries.
    OutOfBudget,
}

/// How this run reached a deleting binding's provider.
#[derive(Clone, Copy)]
enum Reached<'a> {
    /// Connected (`Some`), or tried and not usable, or its Connection is gone (`None`: its
    /// copies stay unmarked).
    Tried(Option<&'a Provider>),
    /// Not tried.
    Held(Hold),
}

/// Release one deleting binding's instances; true once `InstancesReleased` is recorded.
async fn release_one(
    ctx: &PassContext,
    client: &Client,
    b: &BindingRef,
    bindings: &[BindingRef],
    apis: &[BoundApi],
    provider: Reached<'_>,
    writes: &mut Writes,
) -> Result<bool, kube::Error> {
    if b.status.conditions.is_true(INSTANCES_RELEASED) {
        return Ok(false);
    }
    let unbound = unbound_apis(b, bindings, apis);
    let provider = match provider {
        Reached::Tried(p) => p,
        // Its copies are marked once a person has looked at the Connection (a quarantine lasts
        // until it changes): released now, they would stay unmarked for good.
        Reached::Held(Hold::Quarantined) if !unbound.is_empty() => {
            hold_while_quarantined(client, b, writes).await?;
            return Ok(false);
        }
        Reached::Held(Hold::OutOfBudget) if !unbound.is_empty() => {
            tracing::info!(binding = %b.key, connection = %b.connection, "the budget ran out before the provider was reached: the next run releases the binding");
            return Ok(false);
        }
        Reached::Held(_) => None,
    };
    let Some(kept) = mark_all_unbound(ctx, client, b, provider, &unbound, writes).await else {
        return Ok(false);
    };
    if !release_finalizers(ctx, client, b, bindings, apis, writes).await? {
        return Ok(false);
    }
    if !unbound.is_empty() {
        copies_kept(ctx, b, &unbound, &kept).await;
    }
    let status = super::record::released_status(b, Timestamp::now());
    if writes.will("apply-status", b.key.to_string(), "InstancesReleased=True") {
        write(client, &b.key, status).await?;
        writes.bookkeeping_done();
    }
    Ok(true)
}

/// APIs whose consumer CRD `kbind schema` removes after this release (a ClusterBinding, no
/// other live binding listing the API, a CRD kbind created): their consumer objects go with the
/// CRD. A CRD kbind only stamped stays with its objects, like a Binding's.
pub(super) fn unbound_apis<'a>(
    b: &BindingRef,
    bindings: &[BindingRef],
    apis: &'a [BoundApi],
) -> Vec<&'a BoundApi> {
    apis.iter()
        .filter(|a| b.apis.contains(&a.name) && a.connection == b.connection)
        .filter(|a| {
            a.created
                && b.key.namespace.is_none()
                && !bindings
                    .iter()
                    .any(|o| !o.deleting && o.apis.contains(&a.name))
        })
        .collect()
}

/// The binding waits for its quarantined Connection, and says so once.
async fn hold_while_quarantined(
    client: &Client,
    b: &BindingRef,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    tracing::warn!(binding = %b.key, connection = %b.connection, "the Connection is quarantined (docs/operations.md \"Poison items\"): the provider copies are not marked orphaned yet, so the binding waits");
    if let Some(status) = super::record::held_status(b, Timestamp::now())
        && writes.will(
            "apply-status",
            b.key.to_string(),
            "InstancesReleased=False ConnectionQuarantined",
        )
    {
        write(client, &b.key, status).await?;
        writes.bookkeeping_done();
    }
    Ok(())
}

/// What marking the provider copies of a released binding's unbound APIs came to.
#[derive(Debug, Default)]
struct Kept {
    /// Copies found on the provider (marked now or before).
    copies: i64,
    /// APIs whose copies were not all marked (provider not reached, or an error listing or
    /// marking them): the unmarked ones stay so.
    unmarked: Vec<String>,
}

/// Mark the provider copies of every unbound API orphaned: what was kept, or `None` when some
/// are left for the next run (the budget ran out).
async fn mark_all_unbound(
    ctx: &PassContext,
    client: &Client,
    b: &BindingRef,
    provider: Option<&Provider>,
    unbound: &[&BoundApi],
    writes: &mut Writes,
) -> Option<Kept> {
    let (mut kept, mut done) = (Kept::default(), true);
    // Work through the binding's Connection: a death while marking is blamed on it alone.
    let item = crate::pass::poison::item("Connection", None, &b.connection);
    if let Some(p) = provider.filter(|_| !unbound.is_empty() && ctx.budget.check().is_ok()) {
        ctx.poison.enter(&item, p.generation).await;
    }
    for api in unbound {
        match provider {
            Some(p) => match mark_unbound(ctx, client, p, api, writes).await {
                Ok((n, complete)) => {
                    kept.copies += n;
                    done &= complete;
                }
                // Not fatal for the unbind: an unmarked copy is marked ConsumerObjectGone
                // at the re-bind instead; it is never deleted either way.
                Err(e) => {
                    tracing::warn!(binding = %b.key, api = %api.name, error = %e, "provider copies not marked orphaned");
                    kept.unmarked.push(api.name.clone());
                }
            },
            None => {
                tracing::info!(binding = %b.key, api = %api.name, "provider not reachable: copies stay unmarked");
                kept.unmarked.push(api.name.clone());
            }
        }
    }
    ctx.poison.leave(&item);
    done.then_some(kept)
}

/// The `ProviderCopiesKept` Event on a released ClusterBinding: which consumer CRDs `kbind schema`
/// now removes, and what stays on the provider.
async fn copies_kept(ctx: &PassContext, b: &BindingRef, unbound: &[&BoundApi], kept: &Kept) {
    let names: Vec<&str> = unbound.iter().map(|a| a.name.as_str()).collect();
    let mut note = format!(
        "unbound: kbind schema now removes the consumer CRDs {} and every object of them",
        names.join(", ")
    );
    if kept.unmarked.len() < unbound.len() {
        note.push_str(&format!(
            "; the {} provider copies stay on the provider, annotated {}={} (re-bind re-adopts them, see spec.orphans)",
            kept.copies,
            keys::ORPHANED,
            keys::ORPHANED_UNBOUND
        ));
    }
    if !kept.unmarked.is_empty() {
        note.push_str(&format!(
            "; the provider copies of {} were not all marked (the provider was not reached, or listing or marking them failed: see kbind resync's log); they stay on the provider, never deleted, and a re-bind marks the unmarked ones {}",
            kept.unmarked.join(", "),
            keys::ORPHANED_CONSUMER_OBJECT_GONE
        ));
    }
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("core.kbind.io/v1alpha1".into()),
        kind: Some("ClusterBinding".into()),
        name: Some(b.key.name.clone()),
        uid: Some(b.uid.clone()),
        ..Default::default()
    };
    ctx.recorder
        .publish(&reference, EventType::Normal, "ProviderCopiesKept", &note)
        .await;
}

/// An identity confined to its Grant's namespaces (docs/issue.md "Read isolation"): the copies
/// in each namespace the consumer's objects of the API are in (they are still there: the
/// consumer CRD goes after this release). A namespace the provider refuses holds none of ours.
async fn copies_per_namespace(
    client: &Client,
    provider: &Provider,
    api: &BoundApi,
    ours: &ListParams,
) -> Result<Vec<kube::core::PartialObjectMeta<DynamicObject>>, kube::Error> {
    let consumer: Api<DynamicObject> = Api::all_with(client.clone(), &api.resource);
    let namespaces: std::collections::BTreeSet<String> =
        list::metadata(&consumer, &ListParams::default())
            .await?
            .into_iter()
            .filter_map(|m| m.metadata.namespace)
            .collect();
    let mut copies = Vec::new();
    for ns in namespaces {
        let in_ns: Api<DynamicObject> =
            Api::namespaced_with(provider.client.clone(), &ns, &api.resource);
        match list::metadata(&in_ns, ours).await {
            Ok(c) => copies.extend(c),
            Err(e) if e.is_forbidden() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(copies)
}

/// Annotate every copy of ours of an unbound API `core.kbind.io/orphaned: Unbound` (those not
/// already marked). Returns how many copies there are and whether all were handled within the
/// budget.
async fn mark_unbound(
    ctx: &PassContext,
    client: &Client,
    provider: &Provider,
    api: &BoundApi,
    writes: &mut Writes,
) -> Result<(i64, bool), kube::Error> {
    let prov: Api<DynamicObject> = Api::all_with(provider.client.clone(), &api.resource);
    let ours = ListParams::default().labels(&format!(
        "{}={}",
        keys::CONSUMER_CLUSTER,
        provider.local_uid
    ));
    let copies = match list::metadata(&prov, &ours).await {
        Err(e) if e.is_forbidden() && api.namespaced => {
            copies_per_namespace(client, provider, api, &ours).await?
        }
        r => r?,
    };
    let total = copies.len() as i64;
    for m in copies {
        let marked = m
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(keys::ORPHANED));
        if marked || m.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if ctx.budget.take().is_err() {
            return Ok((total, false));
        }
        let name = m.metadata.name.clone().unwrap_or_default();
        let ns = m.metadata.namespace.clone();
        if !writes.will(
            "annotate orphaned",
            format!(
                "{} {}{name} (provider)",
                api.resource.kind,
                ns.as_deref().map(|n| format!("{n}/")).unwrap_or_default()
            ),
            keys::ORPHANED_UNBOUND,
        ) {
            continue;
        }
        let scoped: Api<DynamicObject> = match &ns {
            Some(ns) => Api::namespaced_with(provider.client.clone(), ns, &api.resource),
            None => Api::all_with(provider.client.clone(), &api.resource),
        };
        match super::apply::mark_orphaned(&scoped, &name, keys::ORPHANED_UNBOUND).await {
            Ok(()) => writes.data_done(),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok((total, true))
}

/// Release the syncer finalizers of the objects `b` alone covered. Returns whether all were
/// handled within the budget.
async fn release_finalizers(
    ctx: &PassContext,
    client: &Client,
    b: &BindingRef,
    bindings: &[BindingRef],
    apis: &[BoundApi],
    writes: &mut Writes,
) -> Result<bool, kube::Error> {
    let mut done = true;
    for api in apis
        .iter()
        .filter(|a| b.apis.contains(&a.name) && a.connection == b.connection)
    {
        let consumer: Api<DynamicObject> = match (&b.key.namespace, api.namespaced) {
            (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &api.resource),
            (Some(_), false) => continue,
            (None, _) => Api::all_with(client.clone(), &api.resource),
        };
        for o in list::all(&consumer, &ListParams::default()).await? {
            let ours = o.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER);
            // Still covered by another live binding kbind schema has set up: that one keeps
            // syncing it, and releases it when it goes. One not set up yet could go at once,
            // with no release: let go now (it takes the object back once set up).
            if !ours
                || covering(
                    bindings,
                    &api.name,
                    &api.connection,
                    o.namespace().as_deref(),
                )
                .is_some_and(|other| other.has_cleanup)
            {
                continue;
            }
            if ctx.budget.take().is_err() {
                done = false;
                break;
            }
            if writes.will(
                "release finalizer",
                format!(
                    "{} {} (binding {} deleting)",
                    api.resource.kind,
                    o.name_any(),
                    b.key
                ),
                "",
            ) {
                let body = json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind,
                    "metadata": {"name": o.name_any(), "namespace": o.namespace(), "finalizers": []}});
                let scoped: Api<DynamicObject> = match o.namespace() {
                    Some(ns) => Api::namespaced_with(client.clone(), &ns, &api.resource),
                    None => Api::all_with(client.clone(), &api.resource),
                };
                crate::pass::finalizer::release(
                    &scoped,
                    &o.name_any(),
                    &body,
                    super::FINALIZER_MANAGER,
                    keys::SYNCER_FINALIZER,
                )
                .await?;
                writes.data_done();
            }
        }
    }
    Ok(done)
}
