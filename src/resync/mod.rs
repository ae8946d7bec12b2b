//! `kbind resync`: one bounded pass that makes the provider hold every bound consumer object's
//! spec and the consumer hold the provider's status. Per bound API: one paginated LIST of each
//! side (the provider side narrowed by kbind's cluster marker), a pure plan per object, the
//! writes, and the counts recorded on the covering binding.

mod apply;
pub mod plan;
mod record;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};

use crate::api::BindingKey;
use crate::api::core::{
    Binding, BindingStatus, ClusterBinding, ConflictPolicy, Connection, OrphanPolicy,
};
use crate::api::keys;
use crate::connection::{self, CredentialError, CredentialPolicy, IdentityError};
use crate::pass::StatusCode;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Stopped, Summary, list, shard};
use plan::{ConsumerObj, ProviderObj, Standing};

pub const PASS: &str = "resync";

/// The field manager of every write resync makes (its finalizers: [`FINALIZER_MANAGER`]).
pub(crate) const MANAGER: &str = "kbind-resync";
/// The field manager of the syncer finalizer on consumer objects.
pub(crate) const FINALIZER_MANAGER: &str = "kbind-resync-finalizer";

/// A binding as resync sees it.
#[derive(Clone, Debug)]
pub struct BindingRef {
    pub key: BindingKey,
    pub connection: String,
    pub apis: Vec<String>,
    pub policy: ConflictPolicy,
    pub orphans: OrphanPolicy,
    pub deleting: bool,
    pub has_cleanup: bool,
    pub uid: String,
    pub generation: Option<i64>,
    pub status: BindingStatus,
}

/// Per binding and API: how its objects stand after this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub in_sync: i64,
    pub pending: i64,
    pub conflicts: i64,
    pub denied: i64,
    pub rejected: i64,
    pub orphaned: i64,
}

/// A managed consumer CRD and the Connection it pins.
struct BoundApi {
    name: String,
    connection: String,
    resource: ApiResource,
    namespaced: bool,
}

/// A provider reached through a Connection, after its identity was checked.
struct Provider {
    client: Client,
    local_uid: String,
}

pub async fn run(ctx: PassContext, args: crate::cli::ResyncArgs) -> Result<Summary, PassError> {
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let mut writes = Writes::new(ctx.args.dry_run);
    let client = ctx.client.clone();
    let lp = ListParams::default();
    let err = |what: &'static str| move |e: kube::Error| PassError::kube(what, &e);
    let connections = list::all(&Api::<Connection>::all(client.clone()), &lp)
        .await
        .map_err(err("listing Connections"))?;
    let observed = crate::bindings::observe(&client)
        .await
        .map_err(err("listing ClusterBindings and Bindings"))?;
    let crds = list::all(
        &Api::<CustomResourceDefinition>::all(client.clone()),
        &ListParams::default().labels(&format!("{}=true", keys::MANAGED)),
    )
    .await
    .map_err(err("listing managed CustomResourceDefinitions"))?;

    let bindings: Vec<BindingRef> = observed.into_iter().map(BindingRef::from).collect();
    // Root objects of this run: this shard's bindings, narrowed by --selector.
    let mut selected: BTreeSet<BindingKey> = bindings
        .iter()
        .filter(|b| shard::owns(ctx.args.shard, &b.key.to_string()))
        .map(|b| b.key.clone())
        .collect();
    if let Some(sel) = &args.selector {
        let lp = ListParams::default().labels(sel);
        let bad_selector = |e: kube::Error| match &e {
            kube::Error::Api(s) if e.is_bad_request() => {
                PassError::Config(format!("--selector: {}", s.message))
            }
            _ => PassError::kube("listing bindings by --selector", &e),
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
        selected.retain(|k| keep.contains(k));
    }
    let mut apis = bound_apis(&crds);
    // Resume where the last budget-limited run stopped: its API first, after its object.
    let cursor: Option<(String, String)> = ctx
        .resume_after
        .as_deref()
        .and_then(|c| c.split_once('|'))
        .map(|(a, k)| (a.to_string(), k.to_string()));
    if let Some((api, _)) = &cursor {
        let split = apis.partition_point(|a| &a.name < api);
        apis.rotate_left(split);
    }
    let mut resume_after: Option<String> = None;

    let policy = CredentialPolicy::new(&args.credentials, ctx.args.lease_namespace());
    // The consumer's own identity, read now: copies are marked with it, so a Connection status
    // claiming another (forged, or restored onto another cluster) must not be trusted.
    let local = connection::cluster_uid(&client).await;
    let mut providers: HashMap<String, Option<Provider>> = HashMap::new();
    let mut counts: BTreeMap<(BindingKey, String), Counts> = BTreeMap::new();
    let mut stopped = None;
    for api in &apis {
        if stopped.is_some() {
            break;
        }
        let Some(conn) = connections.iter().find(|c| c.name_any() == api.connection) else {
            continue;
        };
        if !bindings
            .iter()
            .any(|b| b.apis.contains(&api.name) && selected.contains(&b.key))
        {
            continue;
        }
        if !providers.contains_key(&api.connection) {
            let p = connect(&ctx, &client, conn, &policy, &local, &mut writes).await;
            providers.insert(api.connection.clone(), p);
        }
        // Only what the provider exports: a consumer CRD hand-labelled managed is not a
        // reason to write to the provider (docs/resync.md "Per bound API").
        let exported = conn
            .status
            .as_ref()
            .is_some_and(|s| s.exported_apis.iter().any(|e| e.name == api.name));
        if !exported {
            tracing::info!(api = %api.name, connection = %api.connection, "not among the Connection's exportedAPIs; not syncing");
            summary.count("apisSkippedNotExported", 1);
            continue;
        }
        let Some(Some(provider)) = providers.get(&api.connection) else {
            summary.count("apisSkippedConnectionNotReady", 1);
            continue;
        };
        let start_after = cursor
            .as_ref()
            .filter(|(a, _)| a == &api.name)
            .map(|(_, k)| k.as_str())
            .filter(|k| !k.is_empty());
        let r = sync_api(
            &ctx,
            &client,
            provider,
            api,
            &bindings,
            &selected,
            start_after,
            &mut resume_after,
            &mut counts,
            &mut writes,
            &mut summary,
        )
        .await;
        if let Err(why) = r {
            stopped = Some(why);
        }
    }
    let released = record::release_deleting_bindings(
        &ctx,
        &client,
        &bindings,
        &selected,
        &apis,
        &providers,
        &mut writes,
    )
    .await;
    summary.count("bindingsReleased", released);
    record::binding_statuses(&client, &bindings, &counts, stopped.is_none(), &mut writes)
        .await
        .map_err(err("recording binding status"))?;
    for c in counts.values() {
        summary.count("inSync", c.in_sync);
        summary.count("pending", c.pending);
        summary.count("conflicts", c.conflicts);
        summary.count("denied", c.denied);
        summary.count("rejected", c.rejected);
    }
    let stopped = stopped.map(|why| Stopped {
        message: format!("stopped early ({why:?}); the next run continues"),
        resume_after,
    });
    summary.finish(writes, stopped);
    Ok(summary)
}

impl From<crate::bindings::ObservedBinding> for BindingRef {
    fn from(b: crate::bindings::ObservedBinding) -> Self {
        BindingRef {
            has_cleanup: b.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER),
            key: b.key,
            connection: b.connection,
            apis: b.apis,
            policy: b.conflict_policy,
            orphans: b.orphans,
            deleting: b.deleting,
            uid: b.uid,
            generation: b.generation,
            status: b.status,
        }
    }
}

/// Managed consumer CRDs with their pinned Connection and served version, sorted by name.
fn bound_apis(crds: &[CustomResourceDefinition]) -> Vec<BoundApi> {
    let mut out: Vec<BoundApi> = crds
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| {
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
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The binding that covers an object: a ClusterBinding listing the API first (even when not
/// Ready), else the first Binding in the object's namespace. It must use the CRD's Connection.
pub fn covering<'a>(
    bindings: &'a [BindingRef],
    api: &str,
    connection: &str,
    namespace: Option<&str>,
) -> Option<&'a BindingRef> {
    let live = |b: &&BindingRef| !b.deleting && b.apis.iter().any(|a| a == api);
    let found = bindings
        .iter()
        .filter(live)
        .find(|b| b.key.namespace.is_none())
        .or_else(|| {
            namespace.and_then(|ns| {
                bindings
                    .iter()
                    .filter(live)
                    .find(|b| b.key.namespace.as_deref() == Some(ns))
            })
        })?;
    (found.connection == connection).then_some(found)
}

/// Build the provider client for a Connection that `kbind schema` made Ready, check the
/// provider's identity against the pinned UID (never trusting an earlier Ready), and renew the
/// heartbeat Lease. `None`: not usable this run.
async fn connect(
    ctx: &PassContext,
    client: &Client,
    conn: &Connection,
    policy: &CredentialPolicy,
    live_local: &Result<String, IdentityError>,
    writes: &mut Writes,
) -> Option<Provider> {
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
    let (Some(remote), Some(local)) = (st.remote_cluster_uid.clone(), st.local_cluster_uid.clone())
    else {
        tracing::info!(connection = %name, "no pinned identities yet (run kbind schema); not syncing");
        return None;
    };
    match live_local {
        Ok(uid) if uid == &local => {}
        Ok(uid) => {
            tracing::warn!(connection = %name, found = %uid, recorded = %local, "the consumer cluster's identity differs from the Connection's localClusterUID; nothing is synced");
            return None;
        }
        Err(e) => {
            tracing::warn!(connection = %name, error = %e, "the consumer cluster's identity is unreadable; not syncing");
            return None;
        }
    }
    let r = &conn.spec.kubeconfig_secret_ref;
    let secret = match connection::read_secret(client, policy, r).await {
        Ok(s) => s,
        Err(CredentialError::SecretUnreadable(e)) => {
            // Not "Secret not found": an RBAC gap must say so, on the Connection.
            let reason = if e.is_forbidden() {
                "PermissionDenied"
            } else {
                "SecretUnreadable"
            };
            let cause = e.kube_source().map(ToString::to_string).unwrap_or_default();
            let note = format!(
                "kbind resync could not read Secret {}/{}: {}",
                r.namespace,
                r.name,
                crate::scrub::scrub(&cause)
            );
            tracing::warn!(connection = %name, reason, note = %note, "not syncing");
            ctx.recorder
                .publish(
                    &kube::Resource::object_ref(conn, &()),
                    crate::pass::events::EventType::Warning,
                    reason,
                    &note,
                )
                .await;
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
    if let Err(e) = apply::heartbeat(&provider, &pk.default_namespace, &local, writes).await {
        tracing::warn!(connection = %name, error = %crate::scrub::scrub(&e.to_string()), "heartbeat Lease not renewed");
    }
    Some(Provider {
        client: provider,
        local_uid: local,
    })
}

fn obj_key(ns: Option<&str>, name: &str) -> String {
    format!("{}/{name}", ns.unwrap_or(""))
}

/// Sync one bound API. `Err` when the budget ran out.
#[allow(clippy::too_many_arguments)]
async fn sync_api(
    ctx: &PassContext,
    client: &Client,
    provider: &Provider,
    api: &BoundApi,
    bindings: &[BindingRef],
    selected: &BTreeSet<BindingKey>,
    start_after: Option<&str>,
    resume_after: &mut Option<String>,
    counts: &mut BTreeMap<(BindingKey, String), Counts>,
    writes: &mut Writes,
    summary: &mut Summary,
) -> Result<(), crate::pass::budget::Exhausted> {
    let consumer_api: Api<DynamicObject> = Api::all_with(client.clone(), &api.resource);
    let provider_api: Api<DynamicObject> = Api::all_with(provider.client.clone(), &api.resource);
    // Each page is reduced to what the plan reads as it arrives: full objects (managedFields
    // and all) are never held for a whole API.
    let mut consumer = match list::map_all(&consumer_api, &ListParams::default(), |o| {
        consumer_obj(&o)
    })
    .await
    {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(api = %api.name, error = %crate::scrub::scrub(&e.to_string()), "listing consumer objects failed");
            summary.count("errors", 1);
            return Ok(());
        }
    };
    let marker = ListParams::default().labels(&format!(
        "{}={}",
        keys::CONSUMER_CLUSTER,
        provider.local_uid
    ));
    let provider_by_key: BTreeMap<String, ProviderObj> = match list::map_all(
        &provider_api,
        &marker,
        |o| provider_obj(&o),
    )
    .await
    {
        Ok(objs) => objs
            .into_iter()
            .map(|p| (obj_key(p.namespace.as_deref(), &p.name), p))
            .collect(),
        Err(e) => {
            // A forbidden or failed provider read: every covered object counts as denied.
            tracing::warn!(api = %api.name, error = %crate::scrub::scrub(&e.to_string()), "listing provider objects failed");
            summary.count("errors", 1);
            for c in &consumer {
                if let Some(b) =
                    covering(bindings, &api.name, &api.connection, c.namespace.as_deref())
                {
                    counts
                        .entry((b.key.clone(), api.name.clone()))
                        .or_default()
                        .denied += 1;
                }
            }
            return Ok(());
        }
    };
    let mut provider_by_key = provider_by_key;
    if let Err(e) = observe_conflicts(&provider_api, &consumer, &mut provider_by_key).await {
        // Not fatal: the conflicted objects meet their 409 again and stay marked.
        tracing::warn!(api = %api.name, error = %crate::scrub::scrub(&e.to_string()), "listing provider names for conflicted objects failed");
    }
    let live_uids: BTreeSet<String> = consumer.iter().map(|c| c.uid.clone()).collect();
    consumer.sort_by_key(|c| obj_key(c.namespace.as_deref(), &c.name));
    if let Some(after) = start_after {
        let split = consumer
            .partition_point(|c| obj_key(c.namespace.as_deref(), &c.name).as_str() <= after);
        consumer.rotate_left(split);
    }

    let mut result = Ok(());
    let mut last_handled: Option<String> = None;
    for c in &consumer {
        let key = obj_key(c.namespace.as_deref(), &c.name);
        // Uncovered objects are not touched, except deleting ones still holding our finalizer.
        let fallback = (c.deleting && c.has_finalizer).then_some(&*FALLBACK);
        let Some(binding) =
            covering(bindings, &api.name, &api.connection, c.namespace.as_deref()).or(fallback)
        else {
            continue;
        };
        if !binding.key.name.is_empty() && !selected.contains(&binding.key) {
            continue;
        }
        let p = provider_by_key.get(&key);
        let (actions, standing) =
            plan::plan_object(c, p, &provider.local_uid, &live_uids, binding.policy);
        let entry = counts
            .entry((binding.key.clone(), api.name.clone()))
            .or_default();
        if actions.iter().any(apply::is_data)
            && let Err(why) = ctx.budget.check()
        {
            if result.is_ok() {
                // The first object this run could not handle: the next run starts after the
                // last one it did handle.
                *resume_after = last_handled
                    .take()
                    .or_else(|| Some(format!("{}|", api.name)));
            }
            entry.pending += 1;
            result = Err(why);
            continue;
        }
        let outcome = apply::object(
            ctx,
            client,
            provider,
            api,
            c,
            p,
            &actions,
            binding.policy,
            writes,
        )
        .await;
        if !actions.is_empty() {
            last_handled = Some(format!("{}|{key}", api.name));
        }
        match (outcome, standing) {
            (apply::Outcome::Denied, _) => entry.denied += 1,
            (apply::Outcome::Rejected, _) => entry.rejected += 1,
            (apply::Outcome::Conflict, _) | (apply::Outcome::Done, Standing::Conflict) => {
                entry.conflicts += 1
            }
            (apply::Outcome::Failed, _) => entry.pending += 1,
            (apply::Outcome::Done, Standing::InSync | Standing::Pending) => entry.in_sync += 1,
            (apply::Outcome::Done, Standing::Deleting) => {}
        }
        for a in &actions {
            if apply::is_data(a) {
                let _ = ctx.budget.take();
            }
        }
    }
    // Copies of ours whose consumer object is gone, in namespaces a live binding covers:
    // orphans, handled by that binding's `spec.orphans` (docs/resync.md "Orphans").
    let consumer_keys: BTreeSet<String> = consumer
        .iter()
        .map(|c| obj_key(c.namespace.as_deref(), &c.name))
        .collect();
    for o in plan::orphans(
        &provider_by_key,
        &consumer_keys,
        &provider.local_uid,
        &live_uids,
    ) {
        let Some(b) = covering(bindings, &api.name, &api.connection, o.namespace.as_deref()) else {
            continue;
        };
        if !selected.contains(&b.key) {
            continue;
        }
        let entry = counts.entry((b.key.clone(), api.name.clone())).or_default();
        let Some(action) = plan::plan_orphan(o, b.orphans) else {
            entry.orphaned += 1;
            continue;
        };
        if ctx.budget.check().is_err() {
            entry.orphaned += 1;
            continue;
        }
        let _ = ctx.budget.take();
        if !apply::orphan(client, &provider.client, api, o, action, writes).await {
            entry.orphaned += 1;
        }
        summary.count(
            match action {
                plan::OrphanAction::Mark(_) => "orphansMarked",
                plan::OrphanAction::Delete => "orphansDeleted",
                plan::OrphanAction::Restore => "orphansRestored",
            },
            1,
        );
    }
    result
}

/// Stand-in binding for deleting objects no binding covers any more: Fail policy, no counts owner.
static FALLBACK: std::sync::LazyLock<BindingRef> = std::sync::LazyLock::new(|| BindingRef {
    key: BindingKey {
        namespace: None,
        name: String::new(),
    },
    connection: String::new(),
    apis: vec![],
    policy: ConflictPolicy::Fail,
    orphans: OrphanPolicy::Keep,
    deleting: false,
    has_cleanup: false,
    uid: String::new(),
    generation: None,
    status: BindingStatus::default(),
});

fn field(o: &DynamicObject, name: &str) -> serde_json::Value {
    o.data.get(name).cloned().unwrap_or(serde_json::Value::Null)
}

fn consumer_obj(o: &DynamicObject) -> ConsumerObj {
    let ann = o.annotations();
    ConsumerObj {
        namespace: o.namespace(),
        name: o.name_any(),
        uid: o.uid().unwrap_or_default(),
        spec: field(o, "spec"),
        status: field(o, "status"),
        deleting: o.metadata.deletion_timestamp.is_some(),
        has_finalizer: o.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER),
        conflict: ann.get(keys::CONFLICT).cloned(),
        orphan_on_delete: ann
            .get(keys::DELETION_POLICY)
            .is_some_and(|v| v == keys::DELETION_POLICY_ORPHAN),
    }
}

fn provider_obj(o: &DynamicObject) -> ProviderObj {
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
async fn observe_conflicts(
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
