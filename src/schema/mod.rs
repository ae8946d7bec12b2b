//! `kbind schema`: one bounded pass over every Connection (of this shard): credentials, cluster
//! identity, exported-API discovery, consumer CRD install per pull/update policy, the setup side
//! of bindings, autoBind, and teardown. Each Connection is observed, planned (pure, `plan`),
//! applied and recorded in turn.
//!
//! The files, in the order of a run: `observe` (the reads), `plan` (pure: the CRD writes, then
//! the statuses, in `plan/status.rs` and, for bindings, `plan/binding.rs`), `apply` (every
//! write, statuses included), `teardown` (deleting bindings and Connections); src/discovery
//! (shared with `kbind bind`) finds the provider's exports and builds the consumer CRDs from
//! them.

mod apply;
pub mod args;
mod memo;
mod observe;
pub mod plan;
mod teardown;

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::core::Connection;
use crate::api::keys;
use crate::connection::CredentialPolicy;
use crate::discovery::crdpull;
use crate::pass::events::EventType;
use crate::pass::finalizer;
use crate::pass::summary::Sweep;
use crate::pass::walk::{Look, Phase, Roots, TurnError, Walk};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, shard};
use plan::{BindingView, CrdMeta, CrdOutcome, Observed};

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
    providers: memo::Providers,
    /// Where Connection Secrets may live, which kubeconfig fields are re-allowed.
    policy: CredentialPolicy,
}

pub async fn run(ctx: PassContext, args: args::SchemaArgs) -> Result<Summary, PassError> {
    let mut world = observe::observe(&ctx, args.selector.as_deref()).await?;
    world.policy = CredentialPolicy::new(&args.credentials, crate::pass::args::install_namespace());
    let names: Vec<String> = world
        .connections
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    // Always the resume order, never "what changed first": a Connection that changes on every
    // run (a provider flipping its exports under autoBind) and is slow to answer would
    // otherwise take every run's budget, and no other Connection would be reached again.
    let walk = Walk::new(
        "Connection",
        names.iter().cloned(),
        ctx.args.shard,
        ctx.resume_after.as_deref(),
    )
    .isolated();
    world.providers.expect(
        walk.order()
            .iter()
            .filter_map(|name| connection(&world.connections, name))
            .map(|c| &c.spec.kubeconfig_secret_ref),
    );
    // Progress lines say "done/planned" Connections (docs/operations.md, "Logs").
    ctx.budget.plan(walk.order().len() as u64);
    // A one-off run with --selector does everything for what it selects, and is no full sweep.
    let sweep = match &args.selector {
        Some(_) => Sweep::Full,
        None => crate::pass::sweep::due(args.full_sweep_every, ctx.swept_at, Timestamp::now()),
    };
    let mut run = Run {
        statuses: apply::StatusWrites::new(args.write.write_concurrency, ctx.args.dry_run),
        summary: Summary::new(PASS, ctx.args.dry_run),
        writes: Writes::new(ctx.args.dry_run),
        ctx: &ctx,
        args: &args,
        world,
        sweep,
    };
    run.summary.sweep = args.selector.is_none().then_some(sweep);
    let walked = walk.run(&ctx.budget, &ctx.poison, &mut run).await;
    if args.selector.is_none() {
        // A deleted Connection leaves the quarantine record.
        ctx.poison
            .forget_absent("Connection", names.iter().map(String::as_str));
    }
    run.finish_statuses().await;
    run.orphaned_bindings(&names).await;
    let mut summary = run.summary;
    summary.count("connections", walked.done as i64);
    if walked.failed > 0 {
        summary.count("errors", walked.failed as i64);
    }
    summary.finish(run.writes, walked.stopped("Connections"));
    Ok(summary)
}

/// One run over the Connections in resume order: what it has observed, counted and written.
struct Run<'a> {
    ctx: &'a PassContext,
    args: &'a args::SchemaArgs,
    world: World,
    sweep: Sweep,
    summary: Summary,
    writes: Writes,
    statuses: apply::StatusWrites,
}

/// The walk's view of a Connection (src/pass/walk.rs): skipped when unchanged between full
/// sweeps, cleaned up while deleting, else reconciled and its status queued.
impl Roots for Run<'_> {
    type Error = kube::Error;

    fn look(&mut self, name: &str) -> Look {
        let Some(conn) = connection(&self.world.connections, name) else {
            return Look::Absent;
        };
        if self.sweep == Sweep::Changed && plan::sweep::changed(conn, &self.world.views).is_none() {
            let secret = conn.spec.kubeconfig_secret_ref.clone();
            self.summary.count("unchanged", 1);
            self.world.providers.done(&secret);
            return Look::Unchanged;
        }
        Look::Due {
            generation: conn.metadata.generation.unwrap_or(0),
            // A deleting Connection always has its bindings and teardown to finish; teardown
            // releases the finalizer last.
            phase: Phase::of(conn.meta().deletion_timestamp.is_some(), true),
        }
    }

    async fn quarantined(&mut self, name: &str, _generation: i64) {
        if let Some(conn) = connection(&self.world.connections, name).cloned() {
            self.report_quarantined(&conn).await;
        }
    }

    async fn apply(&mut self, name: &str) -> Result<(), TurnError<kube::Error>> {
        let Some(conn) = connection(&self.world.connections, name).cloned() else {
            return Ok(());
        };
        let secret = conn.spec.kubeconfig_secret_ref.clone();
        let concurrency = self.args.write.write_concurrency;
        let reconciled = match reconcile(
            self.ctx,
            &mut self.world,
            conn,
            &mut self.writes,
            concurrency,
        )
        .await
        {
            Ok((ready, Some(w))) => self
                .statuses
                .push(w, ready, &mut self.writes)
                .await
                .map(|()| ready),
            other => other.map(|(ready, _)| ready),
        };
        self.world.providers.done(&secret);
        let ready = reconciled.map_err(TurnError::Failed)?;
        self.summary
            .count(if ready { "ready" } else { "notReady" }, 1);
        Ok(())
    }

    async fn cleanup(&mut self, name: &str) -> Result<(), TurnError<kube::Error>> {
        let Some(conn) = connection(&self.world.connections, name).cloned() else {
            return Ok(());
        };
        // Its deleting bindings finish first; the Connection waits for them.
        let torn = async {
            apply::finish_deleting_bindings(&self.world, name, &mut self.writes).await?;
            teardown::connection(apply::world_view(&self.world), &conn, &mut self.writes).await
        }
        .await;
        self.world.providers.done(&conn.spec.kubeconfig_secret_ref);
        torn.map_err(TurnError::Failed)?;
        self.summary.count("notReady", 1);
        Ok(())
    }
}

impl Run<'_> {
    /// A quarantined Connection is not contacted: it says so on its status (once).
    async fn report_quarantined(&mut self, conn: &Connection) {
        let name = conn.name_any();
        if let Some(w) = apply::quarantined(self.ctx, &self.world, conn, &mut self.writes).await
            && let Err(e) = self.statuses.push(w, false, &mut self.writes).await
        {
            tracing::warn!(connection = %name, error = %e, "connection status not written; next run retries");
            self.summary.count("errors", 1);
        }
        self.summary.count("quarantined", 1);
        self.summary.count("notReady", 1);
    }

    /// The Connection status writes still queued; a failed one is counted again as an error.
    async fn finish_statuses(&mut self) {
        let empty = apply::StatusWrites::new(self.args.write.write_concurrency, true);
        let statuses = std::mem::replace(&mut self.statuses, empty);
        for (connection, ready, error) in statuses.finish(&mut self.writes).await {
            tracing::warn!(%connection, %error, "connection status not written; next run retries");
            self.summary
                .count(if ready { "ready" } else { "notReady" }, -1);
            self.summary.count("errors", 1);
        }
    }

    /// Bindings whose Connection does not exist (the shard owning that name reports them).
    async fn orphaned_bindings(&mut self, names: &[String]) {
        if self.args.selector.is_some() {
            return;
        }
        let orphans: Vec<BindingObj> = self
            .world
            .bindings
            .iter()
            .filter(|b| {
                !names.contains(&b.view.connection)
                    && shard::owns(self.ctx.args.shard, &b.view.connection)
            })
            .cloned()
            .collect();
        for b in &orphans {
            if let Err(e) = teardown::orphan_binding(
                &self.world.client,
                &self.world.manager,
                b,
                &self.world.bindings,
                &self.world.crds,
                &mut self.writes,
            )
            .await
            {
                tracing::warn!(binding = %b.view.key, error = %e, "binding not reconciled");
                self.summary.count("errors", 1);
            }
        }
    }
}

/// The listed Connection named `name`.
fn connection<'c>(connections: &'c [Connection], name: &str) -> Option<&'c Connection> {
    connections.iter().find(|c| c.name_any() == name)
}

/// Reconcile one live Connection; returns whether it ended Ready.
async fn reconcile(
    ctx: &PassContext,
    world: &mut World,
    mut conn: Connection,
    writes: &mut Writes,
    write_concurrency: std::num::NonZeroUsize,
) -> Result<(bool, Option<apply::StatusWrite>), kube::Error> {
    let name = conn.name_any();
    hold_with_finalizer(world, &mut conn, writes).await?;
    let conn = &conn;

    // Observe the provider: credentials, then (once they work) identity and discovery.
    let reached = world.reach(ctx, conn, writes).await;
    if reached.provider.is_ok() && reached.secret_needs_finalizer {
        apply::secret_finalizer(world, conn, writes).await?;
    }
    let memo = world
        .providers
        .entry(&reached.fingerprint, &conn.spec.kubeconfig_secret_ref);
    let remote_uid = match &reached.provider {
        Ok(p) => memo.identity(p).await,
        Err(_) => None,
    };
    let status = conn.status.clone().unwrap_or_default();
    let mut observed = Observed {
        name: &name,
        labels: conn.labels(),
        generation: conn.meta().generation,
        policy: &conn.spec.schema,
        status: &status,
        credentials: reached.provider.as_ref().map(|_| ()).map_err(Clone::clone),
        refresh: reached.refresh.clone(),
        remote_uid,
        local_uid: &world.local_uid,
        discovery: None,
        bindings: &world.views,
        consumer_crds: &world.crds,
        holding: Default::default(),
    };
    if let (Ok(p), Some(Ok(_))) = (&reached.provider, &observed.remote_uid)
        && !observed.identity_changed()
    {
        observed.discovery = Some(memo.discover(p, conn.spec.schema.source).await);
    }
    observed.holding = autobind_holding(world, conn, &observed).await;

    // Plan and apply the consumer CRD writes (the bindings they serve hold the cleanup
    // finalizer first), then plan the statuses and record them.
    apply::binding_finalizers(world, &name, writes).await?;
    let actions = plan::plan_crds(&observed);
    let outcomes = apply::apply_crds(
        &world.client,
        &world.manager,
        &actions,
        writes,
        write_concurrency,
    )
    .await;
    for (a, o) in actions.iter().zip(&outcomes) {
        if let CrdOutcome::Failed(m) | CrdOutcome::Forbidden(m) = o {
            tracing::warn!(connection = %name, crd = %a.name(), error = %m, "consumer CRD write failed");
        }
    }
    let (autobind, autobind_uid) = autobind_view(world, conn);
    let plan = plan::plan_status(&observed, &actions, &outcomes, autobind, Timestamp::now());
    exports_withdrawn(ctx, conn, &plan).await;
    let after = plan::crds_after(&observed, &actions, &outcomes);
    drop(observed);
    world.crds = after;
    apply::record(world, conn, &status, &plan, autobind_uid, writes).await
}

/// From the second empty discovery in a row (when autoBind would delete the binding): which
/// CRDs its teardown would delete still hold objects.
async fn autobind_holding(
    world: &World,
    conn: &Connection,
    observed: &Observed<'_>,
) -> BTreeMap<String, plan::Holding> {
    match autobind_binding(world, conn).filter(|_| conn.spec.auto_bind) {
        Some(b)
            if observed.exports().is_some_and(|d| d.exports.is_empty())
                && observed.status.empty_discoveries.unwrap_or(0) >= 1 =>
        {
            let crds = teardown::crds_to_delete(b, &world.bindings, &world.crds);
            observe::holding(&world.client, crds.iter().map(|(n, _)| *n)).await
        }
        _ => BTreeMap::new(),
    }
}

/// The Connection carries the cleanup finalizer before anything is written for it.
async fn hold_with_finalizer(
    world: &World,
    conn: &mut Connection,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    if finalizer::has(conn.meta().finalizers.as_ref(), keys::CLEANUP_FINALIZER) {
        return Ok(());
    }
    let name = conn.name_any();
    let api = Api::<Connection>::all(world.client.clone());
    let what = format!("Connection {name}");
    let written = apply::add_finalizer(world, &api, (&name, None), what, writes).await?;
    // Our own write moved its resourceVersion; the status write after reconcile is
    // preconditioned on the version this pass observed, which would now always conflict (and
    // cost a re-read and a second status write). Same generation: the spec observed is still
    // the spec.
    if let Some(w) = written.filter(|w| w.meta().generation == conn.meta().generation) {
        conn.metadata.resource_version = w.metadata.resource_version;
    }
    Ok(())
}

/// The `ExportsWithdrawn` Warning Event, when the planned status carries that AutoBind condition.
async fn exports_withdrawn(ctx: &PassContext, conn: &Connection, plan: &plan::StatusPlan) {
    if let Some(note) = plan::exports_withdrawn(&plan.connection) {
        ctx.recorder
            .publish(
                &kube::Resource::object_ref(conn, &()),
                EventType::Warning,
                plan::EXPORTS_WITHDRAWN,
                note,
            )
            .await;
    }
}

/// What autoBind has to work with, and the UID of the ClusterBinding it maintains (if any).
fn autobind_view<'w>(
    world: &'w World,
    conn: &Connection,
) -> (plan::AutoBindView<'w>, Option<String>) {
    let name = conn.name_any();
    let autobind_cb = world
        .bindings
        .iter()
        .find(|b| b.view.key.namespace.is_none() && b.view.key.name == name);
    let autobind_ours = autobind_binding(world, conn).is_some();
    let view = match (conn.spec.auto_bind, autobind_cb) {
        (false, _) => plan::AutoBindView::Off,
        (true, Some(_)) if !autobind_ours => {
            tracing::warn!(connection = %name, "a ClusterBinding named after the Connection exists and is not owned by it; autoBind leaves it alone");
            plan::AutoBindView::NameTaken
        }
        (true, cb) => plan::AutoBindView::Maintained(cb.map(|b| &b.view)),
    };
    let uid = autobind_cb.filter(|_| autobind_ours).map(|b| b.uid.clone());
    (view, uid)
}

/// The ClusterBinding named after the Connection, when the Connection owns it.
fn autobind_binding<'w>(world: &'w World, conn: &Connection) -> Option<&'w BindingObj> {
    let name = conn.name_any();
    let uid = conn.uid().unwrap_or_default();
    world.bindings.iter().find(|b| {
        b.view.key.namespace.is_none() && b.view.key.name == name && b.owner_uids.contains(&uid)
    })
}
