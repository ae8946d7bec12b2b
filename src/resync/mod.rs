//! `kbind resync`: one bounded pass that makes the provider hold every bound consumer object's
//! spec and the consumer hold the provider's status. Per bound API: one paginated LIST of each
//! side (the provider side narrowed by kbind's cluster marker), a pure plan per object, the
//! writes, and the counts recorded on the covering binding.
//!
//! The files, in the order of a run: `observe` (the reads), `plan` (pure: each object's writes),
//! `sync` (one bound API end to end), `apply` (the instance writes), `release` (deleting
//! bindings), `record` (pure: the status each binding gets; written by [`Run::record`] here).

mod apply;
pub mod args;
mod doc;
mod first_sync;
mod observe;
pub mod plan;
mod record;
mod release;
mod sync;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::jiff::Timestamp;
use kube::api::ApiResource;
use kube::{Client, ResourceExt};

use crate::api::BindingKey;
use crate::api::core::{BindingStatus, ConflictPolicy, OrphanPolicy};
use crate::connection::{self, CredentialPolicy};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Stopped, Summary};
use sync::ApiSync;

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
    /// The conflict policy in effect: `Adopt` only where the Connection lets the namespace adopt.
    pub policy: ConflictPolicy,
    /// `spec.conflictPolicy: Adopt` asked for, and refused by the Connection's
    /// `spec.adoptionNamespaces` (the Conflicts condition says so).
    pub adopt_refused: bool,
    /// Whether its Connection serves it: one that does not covers no object (docs/resync.md).
    pub admitted: bool,
    pub orphans: OrphanPolicy,
    pub deleting: bool,
    pub has_cleanup: bool,
    pub uid: String,
    pub created: Option<Timestamp>,
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
    /// Of `denied`: refused because the provider's Grant has not pinned this consumer yet
    /// (not a status field: it makes the `ConsumerPinned` condition).
    pub unpinned: i64,
}

/// A managed consumer CRD and the Connection it pins.
struct BoundApi {
    name: String,
    connection: String,
    resource: ApiResource,
    namespaced: bool,
    /// kbind created the consumer CRD (`core.kbind.io/created`): only then does an unbind
    /// remove it, and its objects with it.
    created: bool,
}

/// A provider reached through a Connection, after its identity was checked.
struct Provider {
    client: Client,
    local_uid: String,
    /// The Connection's generation when it was reached: poison isolation records the work
    /// done through it (src/pass/poison.rs).
    generation: i64,
}

/// What one run carries from bound API to bound API.
struct Run<'a> {
    ctx: &'a PassContext,
    bindings: Vec<BindingRef>,
    /// Root objects of this run: this shard's bindings, narrowed by --selector.
    selected: BTreeSet<BindingKey>,
    counts: BTreeMap<(BindingKey, String), Counts>,
    /// Bindings with an API whose provider objects could not be listed this run: their
    /// `lastCompleteTime` must not claim a pass that never compared anything.
    unread: BTreeSet<BindingKey>,
    /// Where the next run resumes when this one stops early.
    resume_after: Option<String>,
    writes: Writes,
    summary: Summary,
    /// Objects whose writes may be in flight at once (1 in a dry run: plans print in order).
    write_concurrency: std::num::NonZeroUsize,
    /// Deletions that began before this (Unix seconds) no longer wait for a terminating
    /// provider copy (`--provider-deletion-wait`).
    waited_out: i64,
    /// Namespace name → UID: copies record it, and are re-adopted only into the same namespace.
    namespace_uids: crate::bindings::admission::NamespaceUids,
    /// Quarantined Connections already reported this run.
    reported: BTreeSet<String>,
}

pub async fn run(ctx: PassContext, args: args::ResyncArgs) -> Result<Summary, PassError> {
    let client = ctx.client.clone();
    let seen = observe::consumer(&ctx, args.selector.as_deref()).await?;
    let mut apis = seen.apis;
    let cursor = resume(ctx.resume_after.as_deref(), &mut apis);
    let mut run = Run::new(
        &ctx,
        seen.bindings,
        seen.selected,
        args.write.write_concurrency,
    );
    run.namespace_uids = seen.namespace_uids;
    run.waited_out = Timestamp::now()
        .as_second()
        .saturating_sub(i64::try_from(args.provider_deletion_wait.as_secs()).unwrap_or(i64::MAX));
    let mut reach = Reach {
        connections: seen.connections,
        policy: CredentialPolicy::new(&args.credentials, crate::pass::args::install_namespace()),
        // The consumer's own identity, read now: copies are marked with it, so a Connection
        // status claiming another (forged, or restored onto another cluster) must not be
        // trusted.
        local: connection::cluster_uid(&client).await,
        providers: HashMap::new(),
    };
    let mut stopped = None;
    for api in &apis {
        let start_after = cursor
            .as_ref()
            .filter(|(a, _)| a == &api.name)
            .map(|(_, k)| k.as_str())
            .filter(|k| !k.is_empty());
        if let Err(why) = run.step(&mut reach, api, start_after).await {
            stopped = Some(why);
            break;
        }
    }
    if stopped.is_none() && !args.first_sync_window.is_zero() {
        let window = first_sync::Window::new(args.first_sync_window);
        match window
            .follow(&mut run, &mut reach, args.selector.as_deref())
            .await
        {
            Ok(Some(now)) => apis = now,
            Ok(None) => {}
            Err(why) => stopped = Some(why),
        }
    }
    if args.selector.is_none() {
        // A deleted Connection leaves the quarantine record.
        let names: Vec<String> = reach
            .connections
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        ctx.poison
            .forget_absent("Connection", names.iter().map(String::as_str));
    }
    let held = run.reach_deleting(&mut reach, &apis).await;
    run.finish(&client, &apis, (&reach.providers, &held), stopped)
        .await
}

/// How a run reaches providers: the consumer's Connections, the credential rules, the
/// consumer's own identity, and each Connection's provider once connected (`None`: not usable
/// this run).
struct Reach {
    connections: Vec<crate::api::core::Connection>,
    policy: CredentialPolicy,
    local: Result<String, connection::IdentityError>,
    providers: HashMap<String, Option<Provider>>,
}

impl Reach {
    /// Connect to a Connection's provider and remember the outcome, usable or not, so each
    /// Connection is tried once per run.
    async fn connect(&mut self, ctx: &PassContext, name: &str, writes: &mut Writes) {
        let Some(conn) = self.connections.iter().find(|c| c.name_any() == name) else {
            return;
        };
        let p = observe::connect(ctx, &ctx.client, conn, &self.policy, &self.local, writes).await;
        self.providers.insert(name.to_string(), p);
    }
}

/// Resume where the last budget-limited run stopped (`<api>|<namespace>/<name>`): its API first
/// (`apis` rotated to it), after its object. Returns the (API, object) cursor.
fn resume(resume_after: Option<&str>, apis: &mut [BoundApi]) -> Option<(String, String)> {
    let cursor = resume_after
        .and_then(|c| c.split_once('|'))
        .map(|(a, k)| (a.to_string(), k.to_string()));
    if let Some((api, _)) = &cursor {
        let split = apis.partition_point(|a| &a.name < api);
        apis.rotate_left(split);
    }
    cursor
}

impl<'a> Run<'a> {
    fn new(
        ctx: &'a PassContext,
        bindings: Vec<BindingRef>,
        selected: BTreeSet<BindingKey>,
        write_concurrency: std::num::NonZeroUsize,
    ) -> Self {
        Run {
            ctx,
            bindings,
            selected,
            counts: BTreeMap::new(),
            unread: BTreeSet::new(),
            resume_after: None,
            writes: Writes::new(ctx.args.dry_run),
            summary: Summary::new(PASS, ctx.args.dry_run),
            // A dry run plans one write at a time, in order.
            write_concurrency: if ctx.args.dry_run {
                std::num::NonZeroUsize::MIN
            } else {
                write_concurrency
            },
            waited_out: i64::MIN,
            namespace_uids: Default::default(),
            reported: BTreeSet::new(),
        }
    }
}

impl Run<'_> {
    /// Sync one bound API through its Connection, if a selected binding lists it and the
    /// provider exports it. `Err` when the budget ran out.
    async fn step(
        &mut self,
        reach: &mut Reach,
        api: &BoundApi,
        start_after: Option<&str>,
    ) -> Result<(), crate::pass::budget::Exhausted> {
        let ctx = self.ctx;
        let Some(conn) = reach
            .connections
            .iter()
            .find(|c| c.name_any() == api.connection)
        else {
            return Ok(());
        };
        if !self
            .bindings
            .iter()
            .any(|b| b.apis.contains(&api.name) && self.selected.contains(&b.key))
        {
            return Ok(());
        }
        // Only what the provider exports: a consumer CRD hand-labelled managed is not a
        // reason to write to the provider (docs/resync.md "Per bound API").
        let exported = conn
            .status
            .as_ref()
            .is_some_and(|s| s.exported_apis.iter().any(|e| e.name == api.name));
        if !exported {
            tracing::info!(api = %api.name, connection = %api.connection, "not among the Connection's exportedAPIs; not syncing");
            self.summary.count("apisSkippedNotExported", 1);
            return Ok(());
        }
        // Poison isolation (src/pass/poison.rs): a Connection two runs in a row died on is
        // skipped until it changes; the others keep syncing.
        let item = crate::pass::poison::item("Connection", None, &api.connection);
        let generation = conn.metadata.generation.unwrap_or(0);
        if ctx.poison.check(&item, generation) == crate::pass::poison::Verdict::Quarantined {
            self.quarantined(conn, &item, generation).await;
            return Ok(());
        }
        ctx.poison.enter(&item, generation).await;
        if !reach.providers.contains_key(&api.connection) {
            reach.connect(ctx, &api.connection, &mut self.writes).await;
        }
        let Some(Some(provider)) = reach.providers.get(&api.connection) else {
            ctx.poison.leave(&item);
            self.summary.count("apisSkippedConnectionNotReady", 1);
            return Ok(());
        };
        let s = ApiSync {
            ctx,
            client: &ctx.client,
            provider,
            api,
        };
        let result = self.sync_api(&s, start_after).await;
        ctx.poison.leave(&item);
        result
    }

    /// Reach the provider of every deleting binding this run releases whose copies must be
    /// marked orphaned, whether or not its sync went there (its APIs no longer exported, the
    /// run stopped before them). Returns the Connections whose bindings must wait: quarantined,
    /// or not reached before the budget ran out. A Connection that is gone is neither (its
    /// bindings are released, their copies unmarked).
    async fn reach_deleting(
        &mut self,
        reach: &mut Reach,
        apis: &[BoundApi],
    ) -> BTreeMap<String, release::Hold> {
        use crate::api::conditions::Conditions;
        let ctx = self.ctx;
        let wanted: BTreeSet<String> = self
            .bindings
            .iter()
            .filter(|b| b.deleting && b.has_cleanup && self.selected.contains(&b.key))
            // Released already (schema finishes it), or nothing to mark: no need to connect.
            .filter(|b| {
                !b.status
                    .conditions
                    .is_true(crate::api::core::condition::INSTANCES_RELEASED)
                    && !release::unbound_apis(b, &self.bindings, apis).is_empty()
            })
            .map(|b| b.connection.clone())
            .filter(|c| !reach.providers.contains_key(c))
            .collect();
        let mut held = BTreeMap::new();
        for name in wanted {
            let Some(conn) = reach.connections.iter().find(|c| c.name_any() == name) else {
                continue;
            };
            let item = crate::pass::poison::item("Connection", None, &name);
            let generation = conn.metadata.generation.unwrap_or(0);
            if ctx.poison.check(&item, generation) == crate::pass::poison::Verdict::Quarantined {
                held.insert(name, release::Hold::Quarantined);
                continue;
            }
            if ctx.budget.check().is_err() {
                held.insert(name, release::Hold::OutOfBudget);
                continue;
            }
            ctx.poison.enter(&item, generation).await;
            reach.connect(ctx, &name, &mut self.writes).await;
            ctx.poison.leave(&item);
        }
        held
    }

    /// A quarantined Connection's API is skipped. Resync keeps no condition of its own on a
    /// Connection: the run whose takeover quarantined it says so with a Warning Event.
    async fn quarantined(
        &mut self,
        conn: &crate::api::core::Connection,
        item: &str,
        generation: i64,
    ) {
        tracing::warn!(connection = %conn.name_any(), generation, "skipped: two runs in a row died while syncing it (docs/operations.md \"Poison items\")");
        self.summary.count("apisSkippedQuarantined", 1);
        if self.ctx.poison.newly_quarantined(item) && self.reported.insert(item.to_string()) {
            let note = format!(
                "two runs of kbind resync in a row died while syncing through this Connection \
                 (generation {generation}): its APIs are skipped until its spec changes, so the \
                 other Connections keep syncing (docs/operations.md \"Poison items\")"
            );
            self.ctx
                .recorder
                .publish(
                    &kube::Resource::object_ref(conn, &()),
                    crate::pass::events::EventType::Warning,
                    "Quarantined",
                    &note,
                )
                .await;
        }
    }

    /// Release deleting bindings, record every synced binding's status, and end the summary.
    async fn finish(
        mut self,
        client: &Client,
        apis: &[BoundApi],
        (providers, held): (
            &HashMap<String, Option<Provider>>,
            &BTreeMap<String, release::Hold>,
        ),
        stopped: Option<crate::pass::budget::Exhausted>,
    ) -> Result<Summary, PassError> {
        let released = release::release_deleting_bindings(
            self.ctx,
            client,
            &self.bindings,
            &self.selected,
            apis,
            (providers, held),
            &mut self.writes,
        )
        .await;
        self.summary.count("bindingsReleased", released);
        self.record(client, stopped.is_none())
            .await
            .map_err(|e| PassError::kube("recording binding status", e))?;
        for c in self.counts.values() {
            self.summary.count("inSync", c.in_sync);
            self.summary.count("pending", c.pending);
            self.summary.count("conflicts", c.conflicts);
            self.summary.count("denied", c.denied);
            self.summary.count("rejected", c.rejected);
        }
        let stopped = stopped.map(|why| Stopped {
            message: format!("stopped early ({why:?}); the next run continues"),
            resume_after: self.resume_after.take(),
        });
        self.summary.finish(self.writes, stopped);
        Ok(self.summary)
    }

    /// Write each synced binding's counts and Conflicts condition when they changed.
    async fn record(&mut self, client: &Client, complete: bool) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        for b in self.bindings.iter().filter(|b| !b.deleting) {
            let mine: Vec<(&String, &Counts)> = self
                .counts
                .iter()
                .filter(|((k, _), _)| k == &b.key)
                .map(|((_, api), c)| (api, c))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let complete = complete && !self.unread.contains(&b.key);
            let Some(status) = record::binding_status(b, &mine, complete, now) else {
                continue;
            };
            if !self.writes.will(
                "apply-status",
                b.key.to_string(),
                "per-API counts, Conflicts",
            ) {
                continue;
            }
            release::write(client, &b.key, status).await?;
            self.writes.bookkeeping_done();
        }
        Ok(())
    }
}

/// The binding that covers an object: a ClusterBinding listing the API first (even when not
/// Ready), else the first Binding in the object's namespace. It must use the CRD's Connection.
pub fn covering<'a>(
    bindings: &'a [BindingRef],
    api: &str,
    connection: &str,
    namespace: Option<&str>,
) -> Option<&'a BindingRef> {
    let live = |b: &&BindingRef| !b.deleting && b.admitted && b.apis.iter().any(|a| a == api);
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
