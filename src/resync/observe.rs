//! What resync reads: the consumer's Connections, bindings and managed CRDs at the start of a
//! run; per Connection, the provider behind it (credentials and identity checked, heartbeat
//! renewed); per bound API, both sides' objects reduced to what the plan reads.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};

use super::plan::{self, ConsumerObj, ProviderObj};
use super::{BindingRef, BoundApi, Provider};
use crate::api::BindingKey;
use crate::api::core::{Binding, ClusterBinding, ConflictPolicy, Connection};
use crate::api::keys;
use crate::connection::{self, CredentialError, CredentialPolicy, IdentityError};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, StatusCode, list, shard};
use crate::secrets::SecretError;

/// The consumer side of a run, read once at its start.
pub(super) struct Consumer {
    pub connections: Vec<Connection>,
    pub bindings: Vec<BindingRef>,
    /// Root objects of this run: this shard's bindings, narrowed by --selector.
    pub selected: BTreeSet<BindingKey>,
    /// Managed consumer CRDs, sorted by name.
    pub apis: Vec<BoundApi>,
    /// Namespace name → UID (read when a namespaced API is managed).
    pub namespace_uids: crate::bindings::admission::NamespaceUids,
}

/// List Connections, bindings and managed CRDs, and select this run's bindings.
pub(super) async fn consumer(
    ctx: &PassContext,
    selector: Option<&str>,
) -> Result<Consumer, PassError> {
    let client = &ctx.client;
    let lp = ListParams::default();
    let err = |what: &'static str| move |e: kube::Error| PassError::kube(what, e);
    let connections = crate::connection::list(client, &lp)
        .await
        .map_err(err("listing Connections"))?;
    // Each CRD is cut down to what instance sync reads as its page arrives: a CRD carries its
    // whole schema and managedFields naming every field of it.
    let mut apis: Vec<BoundApi> = list::map_all(
        &Api::<CustomResourceDefinition>::all(client.clone()),
        &ListParams::default().labels(&format!("{}=true", keys::MANAGED)),
        |c| bound_api(&c),
    )
    .await
    .map_err(err("listing managed CustomResourceDefinitions"))?
    .into_iter()
    .flatten()
    .collect();
    apis.sort_by(|a, b| a.name.cmp(&b.name));
    // Namespaced APIs: their copies record their namespace's UID (docs/resync.md "Orphans").
    let namespaced = apis.iter().any(|a| a.namespaced);
    let (observed, namespace_uids) = crate::bindings::observe(client, &connections, namespaced)
        .await
        .map_err(err("listing ClusterBindings and Bindings"))?;
    let bindings: Vec<BindingRef> = observed.into_iter().map(BindingRef::from).collect();
    let mut selected: BTreeSet<BindingKey> = bindings
        .iter()
        .filter(|b| shard::owns(ctx.args.shard, &b.key.to_string()))
        .map(|b| b.key.clone())
        .collect();
    if let Some(sel) = selector {
        let keep = selected_by(client, sel).await?;
        selected.retain(|k| keep.contains(k));
    }
    Ok(Consumer {
        connections,
        bindings,
        selected,
        apis,
        namespace_uids,
    })
}

/// The keys of the bindings `--selector` matches.
async fn selected_by(client: &Client, sel: &str) -> Result<BTreeSet<BindingKey>, PassError> {
    let lp = ListParams::default().labels(sel);
    let bad_selector = |e: kube::Error| match &e {
        kube::Error::Api(s) if e.is_bad_request() => {
            PassError::Config(format!("--selector: {}", s.message))
        }
        _ => PassError::kube("listing bindings by --selector", e),
    };
    let mut keep: BTreeSet<BindingKey> =
        list::metadata(&Api::<ClusterBinding>::all(client.clone()), &lp)
            .await
            .map_err(bad_selector)?
            .into_iter()
            .map(|m| BindingKey {
                namespace: None,
                name: m.metadata.name.unwrap_or_default(),
            })
            .collect();
    keep.extend(
        list::metadata(&Api::<Binding>::all(client.clone()), &lp)
            .await
            .map_err(bad_selector)?
            .into_iter()
            .map(|m| BindingKey {
                namespace: m.metadata.namespace,
                name: m.metadata.name.unwrap_or_default(),
            }),
    );
    Ok(keep)
}

impl From<crate::bindings::ObservedBinding> for BindingRef {
    fn from(b: crate::bindings::ObservedBinding) -> Self {
        BindingRef {
            has_cleanup: b.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER),
            key: b.key,
            connection: b.connection,
            apis: b.apis,
            policy: match b.conflict_policy {
                ConflictPolicy::Adopt if !b.may_adopt => ConflictPolicy::Fail,
                p => p,
            },
            adopt_refused: b.conflict_policy == ConflictPolicy::Adopt && !b.may_adopt,
            admitted: b.admission.admitted(),
            orphans: b.orphans,
            deleting: b.deleting,
            uid: b.uid,
            created: b.created,
            generation: b.generation,
            status: b.status,
        }
    }
}

/// A managed consumer CRD's pinned Connection and served version; `None` while it is being
/// deleted or without a Connection or a served version.
fn bound_api(c: &CustomResourceDefinition) -> Option<BoundApi> {
    if c.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let connection = c.annotations().get(keys::CONNECTION)?.clone();
    let v = c.spec.versions.iter().find(|v| v.storage && v.served).or(c
        .spec
        .versions
        .iter()
        .find(|v| v.served))?;
    let gvk = GroupVersionKind::gvk(&c.spec.group, &v.name, &c.spec.names.kind);
    Some(BoundApi {
        name: format!("{}.{}", c.spec.names.plural, c.spec.group),
        connection,
        resource: ApiResource::from_gvk_with_plural(&gvk, &c.spec.names.plural),
        namespaced: c.spec.scope == "Namespaced",
        created: c
            .annotations()
            .get(keys::CREATED)
            .is_some_and(|v| v == "true"),
    })
}

/// Build the provider client for a Connection that `kbind schema` made Ready, check the
/// provider's identity against the pinned UID (never trusting an earlier Ready), and renew the
/// heartbeat Lease. `None`: not usable this run.
pub(super) async fn connect(
    ctx: &PassContext,
    client: &Client,
    conn: &Connection,
    policy: &CredentialPolicy,
    live_local: &Result<String, IdentityError>,
    writes: &mut Writes,
) -> Option<Provider> {
    let name = conn.name_any();
    let (remote, local) = pinned(conn, live_local)?;
    let r = &conn.spec.kubeconfig_secret_ref;
    let secret = match connection::read_secret(client, policy, r).await {
        Ok(s) => s,
        Err(CredentialError::SecretUnreadable(e)) => {
            secret_unreadable(ctx, conn, &e).await;
            return None;
        }
        Err(e) => {
            tracing::warn!(connection = %name, error = %e, "not syncing");
            return None;
        }
    };
    let pk = match connection::kubeconfig(secret.as_ref(), r, policy).await {
        Ok(pk) => pk,
        Err(e) => {
            tracing::warn!(connection = %name, error = %e, "credentials unusable; not syncing");
            return None;
        }
    };
    let provider = connection::client(&pk, r, ctx.counter.clone(), ctx.args.request_timeout)
        .await
        .ok()?;
    match connection::cluster_uid(&provider).await {
        Ok(uid) if uid == remote => {}
        Ok(uid) => {
            tracing::warn!(connection = %name, found = %uid, pinned = %remote, "ClusterIdentityChanged: the provider is another cluster; nothing is synced");
            return None;
        }
        Err(e) => {
            tracing::warn!(connection = %name, error = %e, "provider identity unreadable; not syncing");
            return None;
        }
    }
    // A Secret issued for a Grant (`kbind bind` copies the annotation) labels the heartbeat
    // with it: the issuer pins the Grant's consumer cluster from it (docs/issue.md).
    let grant = secret.as_ref().and_then(|s| {
        s.metadata
            .annotations
            .as_ref()?
            .get(crate::api::iam::GRANT_KEY)
            .cloned()
    });
    if let Err(e) = super::apply::heartbeat(
        &provider,
        &pk.default_namespace,
        &local,
        grant.as_deref(),
        writes,
    )
    .await
    {
        tracing::warn!(connection = %name, error = %e, "heartbeat Lease not renewed");
    }
    Some(Provider {
        client: provider,
        local_uid: local,
        generation: conn.metadata.generation.unwrap_or(0),
    })
}

/// The identities a Connection pinned (provider, consumer), when it is Connected and this
/// consumer is still the cluster it pinned; else why not, logged.
fn pinned(
    conn: &Connection,
    live_local: &Result<String, IdentityError>,
) -> Option<(String, String)> {
    let name = conn.name_any();
    let st = conn.status.clone().unwrap_or_default();
    // Connected, not Ready: one API's failed discovery or forbidden CRD write makes the
    // Connection not Ready, yet its other APIs' consumer CRDs are in place and keep syncing
    // (docs/resync.md "Per bound API"). The identity is checked again below either way.
    if !crate::api::conditions::Conditions::is_true(
        &st.conditions,
        crate::api::core::condition::CONNECTED,
    ) {
        tracing::info!(connection = %name, "Connection is not Connected (see its conditions); not syncing");
        return None;
    }
    let (Some(remote), Some(local)) = (st.remote_cluster_uid, st.local_cluster_uid) else {
        tracing::info!(connection = %name, "no pinned identities yet (run kbind schema); not syncing");
        return None;
    };
    match live_local {
        Ok(uid) if uid == &local => Some((remote, local)),
        Ok(uid) => {
            tracing::warn!(connection = %name, found = %uid, recorded = %local, "the consumer cluster's identity differs from the Connection's localClusterUID; nothing is synced");
            None
        }
        Err(e) => {
            tracing::warn!(connection = %name, error = %e, "the consumer cluster's identity is unreadable; not syncing");
            None
        }
    }
}

/// Not "Secret not found": an RBAC gap must say so, on the Connection (an Event).
async fn secret_unreadable(ctx: &PassContext, conn: &Connection, e: &SecretError) {
    let r = &conn.spec.kubeconfig_secret_ref;
    let reason = if e.is_forbidden() {
        "PermissionDenied"
    } else {
        "SecretUnreadable"
    };
    let cause = e.kube_source().map(ToString::to_string).unwrap_or_default();
    let note = format!(
        "kbind resync could not read Secret {}/{}: {}",
        r.namespace, r.name, cause
    );
    tracing::warn!(connection = %conn.name_any(), reason, note = %note, "not syncing");
    ctx.recorder
        .publish(
            &kube::Resource::object_ref(conn, &()),
            crate::pass::events::EventType::Warning,
            reason,
            &note,
        )
        .await;
}

pub(super) fn obj_key(ns: Option<&str>, name: &str) -> String {
    format!("{}/{name}", ns.unwrap_or(""))
}

fn field(o: &DynamicObject, name: &str) -> plan::Doc {
    plan::Doc::new(o.data.get(name))
}

pub(super) fn consumer_obj(o: &DynamicObject) -> ConsumerObj {
    let ann = o.annotations();
    ConsumerObj {
        namespace: o.namespace(),
        name: o.name_any(),
        uid: o.uid().unwrap_or_default(),
        spec: field(o, "spec"),
        status: field(o, "status"),
        deleting: o.metadata.deletion_timestamp.is_some(),
        deleting_since: o
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        has_finalizer: o.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER),
        conflict: ann.get(keys::CONFLICT).cloned(),
        orphan_on_delete: ann
            .get(keys::DELETION_POLICY)
            .is_some_and(|v| v == keys::DELETION_POLICY_ORPHAN),
        // Filled in from the run's namespace list (`Run::namespace_uids`).
        namespace_uid: None,
    }
}

pub(super) fn provider_obj(o: &DynamicObject) -> ProviderObj {
    ProviderObj {
        spec: field(o, "spec"),
        status: field(o, "status"),
        ..provider_meta(&o.metadata)
    }
}

/// What the plan reads of a provider object's metadata (spec and status left null).
fn provider_meta(m: &kube::api::ObjectMeta) -> ProviderObj {
    let (cluster_marker, object_marker) = plan::markers(m.labels.as_ref(), m.annotations.as_ref());
    ProviderObj {
        namespace: m.namespace.clone(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        cluster_marker,
        object_marker,
        namespace_marker: m
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::CONSUMER_NAMESPACE_UID))
            .cloned(),
        deleting: m.deletion_timestamp.is_some(),
        orphaned: m
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::ORPHANED))
            .cloned(),
        ..Default::default()
    }
}

/// The provider LIST is narrowed to our cluster's copies, so the object behind a reported
/// conflict (not ours) is never in it. Without seeing it, every run would plan a create, meet
/// 409 and re-mark, or clear the mark: a flapping annotation and a new Event per run. Where
/// conflicted consumer objects exist, one more paginated LIST of names and markers finds them.
pub(super) async fn observe_conflicts(
    provider_api: &Api<DynamicObject>,
    consumer: &[ConsumerObj],
    provider_by_key: &mut BTreeMap<String, ProviderObj>,
) -> Result<(), kube::Error> {
    let wanted: BTreeSet<String> = consumer
        .iter()
        .filter(|c| c.conflict.is_some() && !c.deleting)
        .map(|c| obj_key(c.namespace.as_deref(), &c.name))
        .filter(|k| !provider_by_key.contains_key(k))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    for m in list::metadata(provider_api, &ListParams::default()).await? {
        let p = provider_meta(&m.metadata);
        let key = obj_key(p.namespace.as_deref(), &p.name);
        if wanted.contains(&key) {
            provider_by_key.insert(key, p);
        }
    }
    Ok(())
}
