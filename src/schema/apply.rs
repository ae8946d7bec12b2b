//! What `kbind schema` writes for one Connection, in order (I/O): the consumer CRDs, kbind's
//! cleanup finalizers, the bindings' setup status, the autoBind ClusterBinding, the teardown of
//! its deleting bindings, and its own status. What to write is decided in `plan` (pure).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::plan::{self, AutoBind, CrdAction, CrdOutcome, StatusPlan};
use super::{BindingObj, World, teardown};
use crate::api::BindingKey;
use crate::api::core::{ClusterBinding, Connection, ConnectionStatus};
use crate::api::keys;
use std::num::NonZeroUsize;

use crate::pass::StatusCode;
use crate::pass::concurrency::InFlight;
use crate::pass::finalizer;
use crate::pass::status::{apply_status, retry_on_conflict};
use crate::pass::writes::Writes;

mod crds;
use crds::apply_autobind;
pub(super) use crds::apply_crds;

/// Add kbind's cleanup finalizer to `api`'s object `name` (once per object). Returns the object
/// as written, `None` when nothing was sent (a dry run).
pub(super) async fn add_finalizer<K>(
    world: &World,
    api: &Api<K>,
    (name, namespace): (&str, Option<&str>),
    what: String,
    writes: &mut Writes,
) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if !writes.will("add finalizer", what, keys::CLEANUP_FINALIZER) {
        return Ok(None);
    }
    let written = finalizer::add(
        api,
        name,
        namespace,
        &world.manager,
        keys::CLEANUP_FINALIZER,
    )
    .await?;
    writes.bookkeeping_done();
    Ok(Some(written))
}

/// The Secret's finalizer goes on only after it validated as a usable kubeconfig for this
/// Connection: naming a Secret must not let anyone block its deletion.
pub(super) async fn secret_finalizer(
    world: &World,
    conn: &Connection,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let r = &conn.spec.kubeconfig_secret_ref;
    let api = Api::<Secret>::namespaced(world.client.clone(), &r.namespace);
    let what = format!("Secret {}/{}", r.namespace, r.name);
    add_finalizer(world, &api, (&r.name, Some(&r.namespace)), what, writes)
        .await
        .map(|_| ())
}

/// Put the cleanup finalizer on the Connection's live bindings that lack it. Before any consumer
/// CRD is written for them: a binding deleted after its CRD was created but before it held the
/// finalizer would go at once and leave the CRD behind, with nothing left to remove it.
pub(super) async fn binding_finalizers(
    world: &World,
    name: &str,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    for b in world
        .bindings
        .iter()
        .filter(|b| b.view.connection == name && !b.view.deleting && b.view.admission.admitted())
    {
        if !b.finalizers.iter().any(|f| f == keys::CLEANUP_FINALIZER)
            && writes.will(
                "add finalizer",
                b.view.key.to_string(),
                keys::CLEANUP_FINALIZER,
            )
        {
            crate::bindings::set_finalizer(&world.client, &world.manager, &b.view.key, true)
                .await?;
            writes.bookkeeping_done();
        }
    }
    Ok(())
}

/// Record: bindings' setup status, autoBind, the deleting bindings, then the Connection.
/// Returns whether the Connection ended Ready, and its status write, which the caller hands to
/// [`StatusWrites`] (it may run beside the next Connection's writes).
pub(super) async fn record(
    world: &World,
    conn: &Connection,
    status: &ConnectionStatus,
    plan: &StatusPlan,
    autobind_uid: Option<String>,
    writes: &mut Writes,
) -> Result<(bool, Option<StatusWrite>), kube::Error> {
    let name = conn.name_any();
    let client = &world.client;
    for (key, st) in &plan.bindings {
        if writes.will(
            "apply-status",
            key.to_string(),
            "boundAPIs, Ready, Synced, PermissionDenied",
        ) {
            write_binding_status(client, &world.manager, key, st).await?;
            writes.bookkeeping_done();
        }
    }
    apply_autobind(
        client,
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
    let write = (&plan.connection != status
        && writes.will(
            "apply-status",
            format!("Connection {name}"),
            "identities, exports, conditions",
        ))
    .then(|| StatusWrite {
        api: Api::all(client.clone()),
        name: name.clone(),
        manager: world.manager.clone(),
        desired: plan.connection.clone(),
        rv: conn.resource_version(),
    });
    Ok((ready, write))
}

/// A quarantined Connection (src/pass/poison.rs): the status write that says so, with a
/// Warning Event, when its status does not say so yet. Its provider is not contacted.
pub(super) async fn quarantined(
    ctx: &crate::pass::PassContext,
    world: &World,
    conn: &Connection,
    writes: &mut Writes,
) -> Option<StatusWrite> {
    let name = conn.name_any();
    let generation = conn.metadata.generation.unwrap_or(0);
    let lease = format!(
        "{}/{}",
        ctx.args.lease_namespace(),
        crate::pass::runner::lease_name(ctx.pass, &ctx.args)
    );
    let status = conn.status.clone().unwrap_or_default();
    let desired = plan::quarantined_status(&status, generation, &lease, Timestamp::now())?;
    if !writes.will(
        "apply-status",
        format!("Connection {name}"),
        "Ready=False Quarantined",
    ) {
        return None;
    }
    let note = desired
        .conditions
        .iter()
        .find(|c| c.type_ == crate::api::core::condition::READY)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ctx.recorder
        .publish(
            &kube::Resource::object_ref(conn, &()),
            crate::pass::events::EventType::Warning,
            plan::REASON_QUARANTINED,
            &note,
        )
        .await;
    Some(StatusWrite {
        api: Api::all(world.client.clone()),
        name,
        manager: world.manager.clone(),
        desired,
        rv: conn.resource_version(),
    })
}

/// One Connection's status write, owning what it needs.
pub(super) struct StatusWrite {
    api: Api<Connection>,
    name: String,
    manager: String,
    desired: ConnectionStatus,
    rv: Option<String>,
}

impl StatusWrite {
    async fn run(self) -> Result<(), kube::Error> {
        write_connection_status(&self.api, &self.name, &self.manager, &self.desired, self.rv).await
    }
}

type StatusTask = tokio::task::JoinHandle<Result<(), kube::Error>>;

/// The pass's Connection status writes. With a `--write-concurrency` above 1 each runs in a
/// task beside the next Connection's reconcile, up to that many at once: a status carrying a
/// long `exportedAPIs` list costs the apiserver ~0.1 s to apply (docs/performance.md), which
/// made up half of a cold pass when written in line. At 1 (and in a dry run) each is written
/// in line, in order, as before: crash-point tests replay deterministically.
pub(super) struct StatusWrites {
    inline: bool,
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// Per started write: the Connection, whether it was counted Ready, the task.
    running: Vec<(String, bool, StatusTask)>,
}

impl StatusWrites {
    pub(super) fn new(concurrency: NonZeroUsize, dry_run: bool) -> Self {
        Self {
            inline: dry_run || concurrency.get() == 1,
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency.get())),
            running: Vec::new(),
        }
    }

    /// Write now (in line: its error is returned) or start the write (see [`Self::finish`]).
    /// `ready`: what the Connection was counted as, undone if a started write fails.
    pub(super) async fn push(
        &mut self,
        w: StatusWrite,
        ready: bool,
        writes: &mut Writes,
    ) -> Result<(), kube::Error> {
        if self.inline {
            w.run().await?;
            writes.bookkeeping_done();
            return Ok(());
        }
        // The permit is taken before the task starts, so at most `concurrency` statuses (each
        // with its whole `exportedAPIs`) are held at once: past that the pass waits here
        // instead of queueing every Connection's status in memory. Never closed: always a
        // permit.
        let slot = self.slots.clone().acquire_owned().await.ok();
        let name = w.name.clone();
        let task = tokio::spawn(async move {
            let _slot = slot;
            w.run().await
        });
        self.running.push((name, ready, task));
        Ok(())
    }

    /// Wait for the started writes; returns the failed ones: (Connection, counted Ready, error).
    pub(super) async fn finish(self, writes: &mut Writes) -> Vec<(String, bool, String)> {
        let mut failed = Vec::new();
        for (name, ready, task) in self.running {
            match task.await {
                Ok(Ok(())) => writes.bookkeeping_done(),
                Ok(Err(e)) => failed.push((name, ready, e.to_string())),
                Err(e) => failed.push((name, ready, format!("status write task: {e}"))),
            }
        }
        failed
    }
}

pub(super) async fn finish_deleting_bindings(
    world: &World,
    connection: &str,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    for b in world
        .bindings
        .iter()
        .filter(|b| b.view.deleting && b.view.connection == connection)
    {
        // A binding autoBind deleted because the provider withdrew its exports: a CRD that
        // holds objects again (created since the check that let the binding go) stays.
        let keep: BTreeSet<String> = if withdrawn_autobind(world, b) {
            let crds = teardown::crds_to_delete(b, &world.bindings, &world.crds);
            super::observe::holding(&world.client, crds.iter().map(|(n, _)| *n))
                .await
                .into_keys()
                .collect()
        } else {
            BTreeSet::new()
        };
        teardown::binding(
            &world.client,
            &world.manager,
            b,
            &world.bindings,
            &world.crds,
            &keep,
            writes,
        )
        .await?;
    }
    Ok(())
}

/// `b` is the autoBind ClusterBinding of a live Connection whose provider exports nothing: its
/// deletion was kbind's, not a person's.
fn withdrawn_autobind(world: &World, b: &BindingObj) -> bool {
    world.connections.iter().any(|c| {
        c.metadata.deletion_timestamp.is_none()
            && c.status
                .as_ref()
                .and_then(|s| s.empty_discoveries)
                .unwrap_or(0)
                >= 1
            && super::autobind_binding(world, c).is_some_and(|ab| ab.uid == b.uid)
    })
}

pub(super) fn world_view(w: &World) -> teardown::View<'_> {
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
