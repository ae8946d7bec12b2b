//! The writes `kbind resync` plans, with what each failure means: 403 is denied, 400/422 is the
//! provider rejecting the object (an Event carries its message), 409 on create means an object
//! kbind did not list (so not marked as ours) already holds the name.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::plan::{
    Action, ConsumerObj, FOREIGN_OBJECT_EXISTS, OWNED_BY_ANOTHER, OrphanAction, Ownership,
    ProviderObj, ownership,
};
use super::sync::ApiSync;
use super::{BoundApi, FINALIZER_MANAGER, MANAGER};
use crate::api::core::ConflictPolicy;
use crate::api::keys;
use crate::pass::PassContext;
use crate::pass::StatusCode;
use crate::pass::events::EventType;
use crate::pass::finalizer::release;
use crate::pass::writes::Writes;

mod orphans;
pub use orphans::{mark_orphaned, orphan};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Denied,
    /// Denied by a Grant's admission policy because its consumer cluster is not pinned yet.
    Unpinned,
    Rejected,
    Conflict,
    Failed,
}

/// Every planned action writes an instance (or its metadata): all count against --max-items.
pub fn is_data(_: &Action) -> bool {
    true
}

fn ns_api(client: &Client, api: &BoundApi, ns: Option<&str>) -> Api<DynamicObject> {
    match (api.namespaced, ns) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &api.resource),
        _ => Api::all_with(client.clone(), &api.resource),
    }
}

fn reference(api: &BoundApi, o: &ConsumerObj) -> ObjectReference {
    ObjectReference {
        api_version: Some(api.resource.api_version.clone()),
        kind: Some(api.resource.kind.clone()),
        name: Some(o.name.clone()),
        namespace: o.namespace.clone(),
        uid: Some(o.uid.clone()),
        ..Default::default()
    }
}

/// The provider copy kbind applies: spec plus ownership markers, nothing else.
fn provider_body(api: &BoundApi, o: &ConsumerObj, local_uid: &str) -> Value {
    let mut metadata = json!({
        "name": o.name,
        "labels": {keys::CONSUMER_CLUSTER: local_uid},
        "annotations": {keys::CONSUMER_OBJECT_UID: o.uid},
    });
    if let Some(ns) = &o.namespace {
        metadata["namespace"] = json!(ns);
    }
    if let Some(uid) = &o.namespace_uid {
        metadata["annotations"][keys::CONSUMER_NAMESPACE_UID] = json!(uid);
    }
    json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind, "metadata": metadata, "spec": o.spec})
}

fn classify(e: &kube::Error) -> Outcome {
    match e {
        kube::Error::Api(s) if s.code == 403 && s.message.contains(crate::api::iam::NOT_PINNED) => {
            Outcome::Unpinned
        }
        _ if e.is_forbidden() => Outcome::Denied,
        _ if e.is_bad_request() || e.is_invalid() => Outcome::Rejected,
        _ => Outcome::Failed,
    }
}

/// Apply one object's planned writes in order; stops at the first that fails (an Event says
/// why) or that meets a conflict.
pub async fn object(
    s: &ApiSync<'_>,
    obj: &ConsumerObj,
    p: Option<&ProviderObj>,
    actions: &[Action],
    policy: ConflictPolicy,
    writes: &mut Writes,
) -> Outcome {
    let target = format!(
        "{} {}{}",
        s.api.resource.kind,
        obj.namespace
            .as_deref()
            .map(|n| format!("{n}/"))
            .unwrap_or_default(),
        obj.name
    );
    for a in actions {
        let (verb, on) = describe(a);
        if !writes.will(verb, format!("{target} ({on})"), "") {
            continue;
        }
        match write(s, obj, p, a, policy).await {
            Ok(Outcome::Conflict) => {
                // The create met an object we did not list: nothing after it applies (clearing a
                // conflict mark just written would make the mark flap run to run).
                writes.data_done();
                return Outcome::Conflict;
            }
            Ok(_) => writes.data_done(),
            Err(e) => return failed(s, obj, &target, (verb, on), &e).await,
        }
    }
    Outcome::Done
}

/// What a planned write does, and on which side, for dry runs, Events and logs.
fn describe(a: &Action) -> (&'static str, &'static str) {
    match a {
        Action::AddFinalizer => ("add finalizer", "consumer"),
        Action::Create => ("create", "provider"),
        Action::UpdateSpec => ("apply spec", "provider"),
        Action::StatusDown(_) => ("apply status", "consumer"),
        Action::MarkConflict(_) => ("annotate conflict", "consumer"),
        Action::ClearConflict => ("clear conflict", "consumer"),
        Action::DeleteProvider => ("delete", "provider"),
        Action::OrphanProvider => ("strip markers", "provider"),
        Action::ClearOrphaned => ("clear orphaned mark", "provider"),
        Action::ReleaseFinalizer => ("release finalizer", "consumer"),
        Action::ReleaseUnconfirmed => (
            "release finalizer, the provider copy still terminating",
            "consumer",
        ),
    }
}

/// One write. `Ok(Outcome::Conflict)`: a create met a name held by an object that is not ours
/// (the consumer object is marked).
async fn write(
    s: &ApiSync<'_>,
    obj: &ConsumerObj,
    p: Option<&ProviderObj>,
    a: &Action,
    policy: ConflictPolicy,
) -> Result<Outcome, kube::Error> {
    let (ctx, provider, api) = (s.ctx, s.provider, s.api);
    let ns = obj.namespace.clone();
    let consumer = ns_api(s.client, api, ns.as_deref());
    let prov = ns_api(&provider.client, api, ns.as_deref());
    let name = obj.name.clone();
    let mut conflict = false;
    let r: Result<(), kube::Error> = match a {
        Action::AddFinalizer => {
            let body = json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind,
                "metadata": {"name": name, "namespace": ns, "finalizers": [keys::SYNCER_FINALIZER]}});
            consumer.patch(&name, &PatchParams::apply(FINALIZER_MANAGER), &Patch::Apply(&body)).await.map(|_| ())
        }
        Action::ReleaseFinalizer | Action::ReleaseUnconfirmed => {
            if *a == Action::ReleaseUnconfirmed {
                let note = "the provider kept its copy terminating past --provider-deletion-wait: this object is released; the copy is left to the provider to finish";
                ctx.recorder
                    .publish(&reference(api, obj), EventType::Warning, "ProviderDeletionStuck", note)
                    .await;
            }
            let body = json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind,
                "metadata": {"name": name, "namespace": ns, "finalizers": []}});
            release(&consumer, &name, &body, FINALIZER_MANAGER, keys::SYNCER_FINALIZER).await
        }
        Action::Create => create_or_mark(s, obj, (&prov, &consumer), policy).await.map(|c| conflict = c),
        Action::UpdateSpec => apply_spec(&prov, api, obj, &provider.local_uid).await,
        Action::StatusDown(status) => {
            let body = json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind,
                "metadata": {"name": name, "namespace": ns}, "status": status});
            consumer.patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await.map(|_| ())
        }
        Action::MarkConflict(reason) => {
            mark_conflict(ctx, &consumer, api, obj, reason).await;
            Ok(())
        }
        Action::ClearConflict => consumer
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {keys::CONFLICT: null}}})))
            .await
            .map(|_| ()),
        Action::DeleteProvider => {
            let uid = p.map(|p| p.uid.clone());
            let dp = DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..Default::default() };
            match prov.delete(&name, &dp).await {
                Err(e) if e.is_not_found() => Ok(()),
                r => r.map(|_| ()),
            }
        }
        Action::OrphanProvider => prov
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {keys::CONSUMER_CLUSTER: null}, "annotations": {keys::CONSUMER_OBJECT_UID: null, keys::ORPHANED: null}}})),
            )
            .await
            .map(|_| ()),
        Action::ClearOrphaned => prov
            .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {keys::ORPHANED: null}}})))
            .await
            .map(|_| ()),
    };
    r.map(|()| {
        if conflict {
            Outcome::Conflict
        } else {
            Outcome::Done
        }
    })
}

/// Create the provider copy. A name already taken by an object not listed as ours is classified
/// with one GET: adopted under `conflictPolicy: Adopt` when unmarked, else the consumer object
/// is marked with the conflict. `Ok(true)`: a conflict was marked.
async fn create_or_mark(
    s: &ApiSync<'_>,
    obj: &ConsumerObj,
    (prov, consumer): (&Api<DynamicObject>, &Api<DynamicObject>),
    policy: ConflictPolicy,
) -> Result<bool, kube::Error> {
    let (ctx, provider, api) = (s.ctx, s.provider, s.api);
    let e = match create(&provider.client, prov, api, obj, &provider.local_uid).await {
        Err(e) if e.is_conflict() => e,
        r => return r.map(|()| false),
    };
    let existing = prov.get_opt(&obj.name).await.ok().flatten();
    let own = existing.as_ref().map(|e| {
        ownership(
            &super::observe::provider_obj(e),
            &provider.local_uid,
            obj,
            &Default::default(),
        )
    });
    let reason = match own {
        Some(Ownership::Unmarked) if policy == ConflictPolicy::Adopt => {
            return apply_spec(prov, api, obj, &provider.local_uid)
                .await
                .map(|()| false);
        }
        Some(Ownership::Unmarked) => FOREIGN_OBJECT_EXISTS,
        Some(Ownership::FromRecreatedNamespace) => keys::NAMESPACE_RECREATED,
        Some(_) => OWNED_BY_ANOTHER,
        None => return Err(e),
    };
    mark_conflict(ctx, consumer, api, obj, reason).await;
    Ok(true)
}

/// Report a failed write (an Event on the consumer object, a log line) and classify it.
async fn failed(
    s: &ApiSync<'_>,
    obj: &ConsumerObj,
    target: &str,
    (verb, on): (&str, &str),
    e: &kube::Error,
) -> Outcome {
    let o = classify(e);
    let msg = match e {
        kube::Error::Api(s) => s.message.clone(),
        e => e.to_string(),
    };
    let (reason, note) = match o {
        Outcome::Denied | Outcome::Unpinned => (
            "PermissionDenied",
            format!("{verb} on the {on} was forbidden: {msg}"),
        ),
        Outcome::Rejected => ("Rejected", format!("the {on} rejected the object: {msg}")),
        _ => (
            "SyncFailed",
            format!("{verb} on the {on} failed (retried next run): {msg}"),
        ),
    };
    s.ctx
        .recorder
        .publish(&reference(s.api, obj), EventType::Warning, reason, &note)
        .await;
    tracing::warn!(object = %target, reason, error = %msg, "instance write failed");
    o
}

async fn create(
    client: &Client,
    prov: &Api<DynamicObject>,
    api: &BoundApi,
    obj: &ConsumerObj,
    local_uid: &str,
) -> Result<(), kube::Error> {
    let body: DynamicObject = serde_json::from_value(provider_body(api, obj, local_uid))
        .map_err(kube::Error::SerdeError)?;
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match prov.create(&pp, &body).await {
        Err(e) if e.is_not_found() && obj.namespace.is_some() => {
            // The provider namespace does not exist yet: create it, then the object.
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: obj.namespace.clone(),
                    labels: Some(
                        [(keys::CONSUMER_CLUSTER.to_string(), local_uid.to_string())].into(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            };
            match Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
            prov.create(&pp, &body).await.map(|_| ())
        }
        r => r.map(|_| ()),
    }
}

async fn apply_spec(
    prov: &Api<DynamicObject>,
    api: &BoundApi,
    obj: &ConsumerObj,
    local_uid: &str,
) -> Result<(), kube::Error> {
    let body = provider_body(api, obj, local_uid);
    prov.patch(
        &obj.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

async fn mark_conflict(
    ctx: &PassContext,
    consumer: &Api<DynamicObject>,
    api: &BoundApi,
    obj: &ConsumerObj,
    reason: &str,
) {
    let patch = json!({"metadata": {"annotations": {keys::CONFLICT: reason}}});
    if let Err(e) = consumer
        .patch(&obj.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        tracing::warn!(error = %e, "could not annotate the conflict");
    }
    let note = match reason {
        FOREIGN_OBJECT_EXISTS => {
            "the provider already has an object of this name without kbind's markers (conflictPolicy Fail); it is left untouched"
        }
        keys::NAMESPACE_RECREATED => {
            "the provider holds this cluster's copy of an object from an earlier namespace of this name (deleted, then created again): it is not taken over by this namespace and is left untouched; delete or rename it on the provider to sync this object"
        }
        _ => {
            "the provider's object of this name belongs to another consumer object or cluster; it is left untouched"
        }
    };
    ctx.recorder
        .publish(&reference(api, obj), EventType::Warning, reason, note)
        .await;
}

/// Renew the heartbeat Lease `consumer-<localClusterUID>` in the provider kubeconfig's default
/// namespace, labelled `iam.kbind.io/grant: <grant>` when the Secret was issued for a Grant.
pub async fn heartbeat(
    provider: &Client,
    namespace: &str,
    local_uid: &str,
    grant: Option<&str>,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    // Issued for a Grant: the Lease is the Grant's own, named after it (its identity may write
    // no other; docs/issue.md "Confinement"), the cluster in a label. Else named after it.
    let name = match grant {
        Some(g) => keys::grant_object_name(g),
        None => format!("{}{local_uid}", keys::HEARTBEAT_LEASE_PREFIX),
    };
    if !writes.will(
        "renew",
        format!("Lease {namespace}/{name} (provider)"),
        "heartbeat",
    ) {
        return Ok(());
    }
    let now = Timestamp::now();
    let body = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.into()),
            labels: grant.map(|g| {
                [
                    (crate::api::iam::GRANT_KEY.to_string(), g.to_string()),
                    (keys::CONSUMER_CLUSTER.to_string(), local_uid.to_string()),
                ]
                .into()
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(format!("kbind-resync/{local_uid}")),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    };
    let mut v = serde_json::to_value(&body).map_err(kube::Error::SerdeError)?;
    v["apiVersion"] = json!("coordination.k8s.io/v1");
    v["kind"] = json!("Lease");
    Api::<Lease>::namespaced(provider.clone(), namespace)
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&v),
        )
        .await?;
    writes.bookkeeping_done();
    Ok(())
}
