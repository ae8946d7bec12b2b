//! `kbind schema`: one bounded pass over every Connection (of this shard): credentials, cluster
//! identity, exported-API discovery, consumer CRD install per pull/update policy, the setup side
//! of bindings, autoBind, and teardown. Each Connection is observed, planned (pure, `plan`),
//! applied and recorded in turn.

pub mod crdpull;
pub mod discovery;
pub mod openapi;
pub mod plan;
mod teardown;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::BindingKey;
use crate::api::core::{ClusterBinding, Connection, ConnectionStatus, SchemaSource};
use crate::api::keys;
use crate::connection::{self, CredentialPolicy, IdentityError};
use crate::pass::StatusCode;
use crate::pass::finalizer;
use crate::pass::status::{apply_status, retry_on_conflict};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Stopped, Summary, list, shard};
use crate::scrub::scrub;
use plan::{AutoBind, BindingView, CrdAction, CrdMeta, CrdOutcome, Observed};

pub const PASS: &str = "schema";

/// A binding as observed, with the metadata teardown needs.
#[derive(Clone, Debug)]
pub struct BindingObj {
    pub view: BindingView,
    pub uid: String,
    pub finalizers: Vec<String>,
    pub owner_uids: Vec<String>,
}

struct World {
    client: Client,
    manager: String,
    local_uid: String,
    connections: Vec<Connection>,
    bindings: Vec<BindingObj>,
    views: Vec<BindingView>,
    crds: BTreeMap<String, CrdMeta>,
    /// Per provider credential (kubeconfig fingerprint), within this pass only.
    providers: HashMap<String, ProviderMemo>,
    /// Where Connection Secrets may live, which kubeconfig fields are re-allowed.
    policy: CredentialPolicy,
}

/// What one pass learned about a provider, shared by the Connections using the same credential.
#[derive(Default)]
struct ProviderMemo {
    client: Option<Client>,
    identity: Option<Result<String, IdentityError>>,
    discovery: HashMap<SchemaSource, Result<plan::Discovered, plan::DiscoveryError>>,
}

pub async fn run(ctx: PassContext, args: crate::cli::SchemaArgs) -> Result<Summary, PassError> {
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let mut writes = Writes::new(ctx.args.dry_run);
    let mut world = observe(&ctx, args.selector.as_deref()).await?;
    world.policy = CredentialPolicy::new(&args.credentials, ctx.args.lease_namespace());
    let names: Vec<String> = world
        .connections
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let order = resume_order(&names, ctx.resume_after.as_deref(), ctx.args.shard);
    let mut done: i64 = 0;
    let mut stopped = None;
    let mut last = None;
    for name in &order {
        if let Err(why) = ctx.budget.take() {
            stopped = Some(why);
            break;
        }
        last = Some(name.clone());
        let Some(conn) = world
            .connections
            .iter()
            .find(|c| &c.name_any() == name)
            .cloned()
        else {
            continue;
        };
        match reconcile(&ctx, &mut world, &conn, &mut writes).await {
            Ok(ready) => summary.count(if ready { "ready" } else { "notReady" }, 1),
            Err(e) => {
                tracing::warn!(connection = %name, error = %e, "connection not reconciled; next run retries");
                summary.count("errors", 1);
            }
        }
        done += 1;
    }
    // Bindings whose Connection does not exist (the shard owning that name reports them).
    let orphans: Vec<BindingObj> = world
        .bindings
        .iter()
        .filter(|b| {
            args.selector.is_none()
                && !names.contains(&b.view.connection)
                && shard::owns(ctx.args.shard, &b.view.connection)
        })
        .cloned()
        .collect();
    for b in &orphans {
        if let Err(e) = teardown::orphan_binding(
            &world.client,
            &world.manager,
            b,
            &world.bindings,
            &world.crds,
            &mut writes,
        )
        .await
        {
            tracing::warn!(binding = %b.view.key, error = %e, "binding not reconciled");
            summary.count("errors", 1);
        }
    }
    summary.count("connections", done);
    let stopped = stopped.map(|why| Stopped {
        message: format!(
            "stopped early ({why:?}); {} Connections left for the next run",
            order.len() as i64 - done
        ),
        resume_after: last,
    });
    summary.finish(writes, stopped);
    Ok(summary)
}

/// This shard's Connections in name order, starting after `resume_after` and wrapping around,
/// so a budget-limited schedule reaches every Connection in turn.
fn resume_order(
    names: &[String],
    resume_after: Option<&str>,
    shard: Option<crate::pass::Shard>,
) -> Vec<String> {
    let mut mine: Vec<String> = names
        .iter()
        .filter(|n| shard::owns(shard, n))
        .cloned()
        .collect();
    mine.sort();
    if let Some(after) = resume_after {
        let split = mine.partition_point(|n| n.as_str() <= after);
        mine.rotate_left(split);
    }
    mine
}

async fn observe(ctx: &PassContext, selector: Option<&str>) -> Result<World, PassError> {
    let client = ctx.client.clone();
    let lp = ListParams::default();
    let conn_lp = match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    let connections = list::all(&Api::<Connection>::all(client.clone()), &conn_lp)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if e.is_bad_request() => {
                PassError::Config(format!("--selector: {}", s.message))
            }
            _ => PassError::kube("listing Connections", &e),
        })?;
    let observed = crate::bindings::observe(&client)
        .await
        .map_err(|e| PassError::kube("listing ClusterBindings and Bindings", &e))?;
    let crd_meta = list::metadata(&Api::<CustomResourceDefinition>::all(client.clone()), &lp)
        .await
        .map_err(|e| PassError::kube("listing CustomResourceDefinitions", &e))?;
    let local_uid = connection::cluster_uid(&client)
        .await
        .map_err(|e| PassError::Unreachable {
            what: "reading the consumer cluster identity".into(),
            message: e.to_string(),
        })?;
    let bindings: Vec<BindingObj> = observed.into_iter().map(BindingObj::from).collect();
    let crds = crd_meta
        .into_iter()
        .map(|m| {
            let labels = m.metadata.labels.clone().unwrap_or_default();
            let ann = m.metadata.annotations.clone().unwrap_or_default();
            let meta = CrdMeta {
                uid: m.metadata.uid.clone().unwrap_or_default(),
                managed: labels.get(keys::MANAGED).is_some_and(|v| v == "true"),
                connection: ann.get(keys::CONNECTION).cloned(),
                schema_hash: ann.get(keys::SCHEMA_HASH).cloned(),
                deleting: m.metadata.deletion_timestamp.is_some(),
            };
            (m.metadata.name.unwrap_or_default(), meta)
        })
        .collect();
    let views = bindings.iter().map(|b| b.view.clone()).collect();
    Ok(World {
        client,
        manager: ctx.field_manager(),
        local_uid,
        connections,
        bindings,
        views,
        crds,
        providers: HashMap::new(),
        policy: CredentialPolicy::default(),
    })
}

impl From<crate::bindings::ObservedBinding> for BindingObj {
    fn from(b: crate::bindings::ObservedBinding) -> Self {
        BindingObj {
            view: BindingView {
                key: b.key,
                connection: b.connection,
                apis: b.apis,
                generation: b.generation,
                status: b.status,
                deleting: b.deleting,
            },
            uid: b.uid,
            finalizers: b.finalizers,
            owner_uids: b.owner_uids,
        }
    }
}

/// Reconcile one Connection; returns whether it ended Ready.
async fn reconcile(
    ctx: &PassContext,
    world: &mut World,
    conn: &Connection,
    writes: &mut Writes,
) -> Result<bool, kube::Error> {
    let name = conn.name_any();
    let client = world.client.clone();
    let conns: Api<Connection> = Api::all(client.clone());
    if conn.meta().deletion_timestamp.is_some() {
        // Its deleting bindings finish first; the Connection waits for them.
        finish_deleting_bindings(world, &name, writes).await?;
        teardown::connection(world_view(world), conn, writes).await?;
        return Ok(false);
    }
    if !finalizer::has(conn.meta().finalizers.as_ref(), keys::CLEANUP_FINALIZER)
        && writes.will(
            "add finalizer",
            format!("Connection {name}"),
            keys::CLEANUP_FINALIZER,
        )
    {
        finalizer::set(
            &conns,
            &name,
            None,
            &world.manager,
            keys::CLEANUP_FINALIZER,
            true,
        )
        .await?;
        writes.bookkeeping_done();
    }

    // Credentials: read the Secret now, every run (rotation needs no restart), and only in a
    // credential namespace (docs/schema.md "Credentials").
    let r = &conn.spec.kubeconfig_secret_ref;
    let secret = connection::read_secret(&client, &world.policy, r).await;
    // Whether the Secret still needs kbind's cleanup finalizer, added only once it validated.
    let needs_finalizer = matches!(&secret, Ok(Some(s))
        if s.meta().deletion_timestamp.is_none()
            && !finalizer::has(s.meta().finalizers.as_ref(), keys::CLEANUP_FINALIZER));
    let pk = match secret {
        Ok(s) => connection::kubeconfig(s.as_ref(), r, &world.policy).await,
        Err(e) => Err(e),
    };
    let fingerprint = pk
        .as_ref()
        .map(|p| p.fingerprint.clone())
        .unwrap_or_default();
    let memo = world.providers.entry(fingerprint).or_default();
    let provider = match (&pk, &memo.client) {
        (Ok(_), Some(c)) => Ok(c.clone()),
        (Ok(pk), None) => {
            connection::client(pk, r, ctx.counter.clone(), ctx.args.request_timeout).await
        }
        (Err(e), _) => Err(e.clone()),
    };
    // The finalizer goes on only after the Secret validated as a usable kubeconfig for this
    // Connection: naming a Secret must not let anyone block its deletion.
    if provider.is_ok()
        && needs_finalizer
        && writes.will(
            "add finalizer",
            format!("Secret {}/{}", r.namespace, r.name),
            keys::CLEANUP_FINALIZER,
        )
    {
        finalizer::set(
            &Api::<Secret>::namespaced(client.clone(), &r.namespace),
            &r.name,
            Some(&r.namespace),
            &world.manager,
            keys::CLEANUP_FINALIZER,
            true,
        )
        .await?;
        writes.bookkeeping_done();
    }
    let remote_uid = match &provider {
        Ok(p) => {
            memo.client = Some(p.clone());
            if memo.identity.is_none() {
                memo.identity = Some(connection::cluster_uid(p).await);
            }
            memo.identity.clone()
        }
        Err(_) => None,
    };
    let status = conn.status.clone().unwrap_or_default();
    let mut observed = Observed {
        name: &name,
        generation: conn.meta().generation,
        policy: &conn.spec.schema,
        status: &status,
        credentials: provider.as_ref().map(|_| ()).map_err(Clone::clone),
        remote_uid,
        local_uid: &world.local_uid,
        discovery: None,
        bindings: &[],
        consumer_crds: &world.crds,
    };
    if let (Ok(p), Some(Ok(_))) = (&provider, &observed.remote_uid)
        && !observed.identity_changed()
    {
        let source = conn.spec.schema.source;
        let found = match memo.discovery.get(&source) {
            Some(d) => d.clone(),
            None => {
                let d = discovery::discover(p, source).await;
                memo.discovery.insert(source, d.clone());
                d
            }
        };
        observed.discovery = Some(found);
    }
    observed.bindings = &world.views;

    // Plan and apply the consumer CRD writes.
    let actions = plan::plan_crds(&observed);
    let outcomes = apply_crds(&client, &world.manager, &actions, writes).await;
    for (a, o) in actions.iter().zip(&outcomes) {
        if let CrdOutcome::Failed(m) | CrdOutcome::Forbidden(m) = o {
            tracing::warn!(connection = %name, crd = %a.name(), error = %m, "consumer CRD write failed");
        }
    }
    let autobind_cb = world
        .bindings
        .iter()
        .find(|b| b.view.key.namespace.is_none() && b.view.key.name == name);
    let autobind_ours =
        autobind_cb.is_some_and(|b| b.owner_uids.contains(&conn.uid().unwrap_or_default()));
    let autobind = match (conn.spec.auto_bind, autobind_cb) {
        (false, _) => plan::AutoBindView::Off,
        (true, Some(_)) if !autobind_ours => {
            tracing::warn!(connection = %name, "a ClusterBinding named after the Connection exists and is not owned by it; autoBind leaves it alone");
            plan::AutoBindView::NameTaken
        }
        (true, cb) => plan::AutoBindView::Maintained(cb.map(|b| &b.view)),
    };
    let plan = plan::plan_status(&observed, &actions, &outcomes, autobind, Timestamp::now());
    let after = plan::crds_after(&observed, &actions, &outcomes);
    drop(observed);
    world.crds = after;

    // Record: bindings (finalizers, setup status), autoBind, then the Connection.
    for b in world
        .bindings
        .iter()
        .filter(|b| b.view.connection == name && !b.view.deleting)
    {
        if !b.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER)
            && writes.will(
                "add finalizer",
                b.view.key.to_string(),
                keys::CLEANUP_FINALIZER,
            )
        {
            crate::bindings::set_finalizer(&client, &world.manager, &b.view.key, true).await?;
            writes.bookkeeping_done();
        }
    }
    for (key, st) in &plan.bindings {
        if writes.will(
            "apply-status",
            key.to_string(),
            "boundAPIs, Ready, Synced, PermissionDenied",
        ) {
            write_binding_status(&client, &world.manager, key, st).await?;
            writes.bookkeeping_done();
        }
    }
    let autobind_uid = autobind_cb.filter(|_| autobind_ours).map(|b| b.uid.clone());
    apply_autobind(
        &client,
        &world.manager,
        conn,
        &plan.autobind,
        autobind_uid,
        writes,
    )
    .await?;
    finish_deleting_bindings(world, &name, writes).await?;
    let ready = plan
        .connection
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if plan.connection != status
        && writes.will(
            "apply-status",
            format!("Connection {name}"),
            "identities, exports, conditions",
        )
    {
        write_connection_status(
            &conns,
            &name,
            &world.manager,
            &plan.connection,
            conn.resource_version(),
        )
        .await?;
        writes.bookkeeping_done();
    }
    Ok(ready)
}

async fn finish_deleting_bindings(
    world: &World,
    connection: &str,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    for b in world
        .bindings
        .iter()
        .filter(|b| b.view.deleting && b.view.connection == connection)
    {
        teardown::binding(
            &world.client,
            &world.manager,
            b,
            &world.bindings,
            &world.crds,
            writes,
        )
        .await?;
    }
    Ok(())
}

fn world_view(w: &World) -> teardown::View<'_> {
    teardown::View {
        client: &w.client,
        manager: &w.manager,
        connections: &w.connections,
        bindings: &w.bindings,
    }
}

async fn write_binding_status(
    client: &Client,
    manager: &str,
    key: &BindingKey,
    st: &crate::api::core::BindingStatus,
) -> Result<(), kube::Error> {
    // Only the fields this pass owns: resync's counts and conditions stay resync's.
    let owned = plan::schema_owned(st);
    let (apis, conds, generation) = (owned.apis, owned.conditions, owned.observed_generation);
    let status = json!({"boundAPIs": apis, "conditions": conds, "observedGeneration": generation});
    crate::bindings::apply_status(client, manager, key, status).await
}

/// The Connection's status moves only from the version that was read; on a conflict it is
/// re-read and re-applied when the pinned identities still agree.
async fn write_connection_status(
    api: &Api<Connection>,
    name: &str,
    manager: &str,
    desired: &ConnectionStatus,
    rv: Option<String>,
) -> Result<(), kube::Error> {
    let value = serde_json::to_value(desired).unwrap_or(Value::Null);
    let mut first = true;
    retry_on_conflict(3, || {
        let (api, value, rv0, first_try) = (api.clone(), value.clone(), rv.clone(), first);
        first = false;
        let pinned = (
            desired.remote_cluster_uid.clone(),
            desired.local_cluster_uid.clone(),
        );
        async move {
            let rv = if first_try {
                rv0
            } else {
                let now = api.get(name).await?;
                let st = now.status.unwrap_or_default();
                let conflicting = |a: &Option<String>, b: &Option<String>| a.is_some() && a != b;
                if conflicting(&st.remote_cluster_uid, &pinned.0)
                    || conflicting(&st.local_cluster_uid, &pinned.1)
                {
                    return Ok(());
                }
                now.metadata.resource_version
            };
            apply_status(&api, name, manager, value, rv.as_deref())
                .await
                .map(|_| ())
        }
    })
    .await
}

async fn apply_crds(
    client: &Client,
    manager: &str,
    actions: &[CrdAction],
    writes: &mut Writes,
) -> Vec<CrdOutcome> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut out = Vec::with_capacity(actions.len());
    for a in actions {
        let (verb, detail) = match a {
            CrdAction::Create(_) => ("create", "consumer CRD"),
            CrdAction::Update(_) => ("update", "consumer CRD schema (provider changed)"),
            CrdAction::Stamp { .. } => ("patch", "add kbind markers (pullPolicy None)"),
        };
        if !writes.will(
            verb,
            format!("CustomResourceDefinition {}", a.name()),
            detail,
        ) {
            out.push(CrdOutcome::Done);
            continue;
        }
        let r = match a {
            CrdAction::Create(crd) => api.create(&PostParams::default(), crd).await.map(|_| ()),
            CrdAction::Update(crd) => api
                .patch(
                    &a.name(),
                    &PatchParams::apply(manager).force(),
                    &Patch::Apply(crd.as_ref()),
                )
                .await
                .map(|_| ()),
            CrdAction::Stamp { name, connection } => {
                // Markers only: the schema stays the external manager's.
                let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": name, "labels": {keys::MANAGED: "true"}, "annotations": {keys::CONNECTION: connection}}});
                api.patch(
                    name,
                    &PatchParams::apply(&format!("{manager}-stamp")),
                    &Patch::Apply(&body),
                )
                .await
                .map(|_| ())
            }
        };
        out.push(match r {
            Ok(()) => {
                writes.data_done();
                CrdOutcome::Done
            }
            Err(e) if e.is_forbidden() => {
                CrdOutcome::Forbidden(scrub(e.api_message().unwrap_or_default()))
            }
            Err(e) => CrdOutcome::Failed(scrub(&e.to_string())),
        });
    }
    out
}

async fn apply_autobind(
    client: &Client,
    manager: &str,
    conn: &Connection,
    plan: &AutoBind,
    existing_uid: Option<String>,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let name = conn.name_any();
    let api: Api<ClusterBinding> = Api::all(client.clone());
    match plan {
        AutoBind::Leave => Ok(()),
        AutoBind::Apply(apis) => {
            if !writes.will(
                "apply",
                format!("ClusterBinding {name}"),
                format!("autoBind: {} APIs", apis.len()),
            ) {
                return Ok(());
            }
            let body = json!({
                "apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                "metadata": {"name": name, "ownerReferences": [{
                    "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection", "name": name,
                    "uid": conn.uid(), "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"connectionRef": {"name": name}, "apis": apis.iter().map(|a| json!({"name": a})).collect::<Vec<_>>()},
            });
            api.patch(
                &name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&body),
            )
            .await?;
            writes.data_done();
            Ok(())
        }
        AutoBind::Delete => {
            if !writes.will(
                "delete",
                format!("ClusterBinding {name}"),
                "autoBind: two consecutive runs found no exports",
            ) {
                return Ok(());
            }
            if let Some(uid) = existing_uid
                && teardown::delete_observed(&api, &name, &uid).await?
            {
                writes.data_done();
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resume_order;

    #[test]
    fn resumes_after_the_cursor_and_wraps() {
        let names: Vec<String> = ["c", "a", "b", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(resume_order(&names, None, None), ["a", "b", "c", "d"]);
        assert_eq!(resume_order(&names, Some("b"), None), ["c", "d", "a", "b"]);
        // A cursor naming a deleted Connection still resumes at the next name.
        assert_eq!(resume_order(&names, Some("bb"), None), ["c", "d", "a", "b"]);
        assert_eq!(resume_order(&names, Some("z"), None), ["a", "b", "c", "d"]);
    }
}
