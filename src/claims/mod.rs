//! `kbind claims`: one bounded pass that keeps every tenant APIBinding's permission claims in
//! step with what its provider declares (CatalogEntry `spec.requires`) and what the workspace
//! consented to (Grant). Observe the catalog, consent and bindings; reconcile the hub's core
//! bindings first; then, per provider, plan each binding's claims with the pure policy and
//! merge, write only what differs, and record the cycle on the CatalogEntry.

pub mod args;
pub mod export;
pub mod hub;
pub mod merge;
pub mod policy;
pub mod record;

use std::collections::{BTreeMap, BTreeSet};

use crate::pass::StatusCode;
use crate::pass::events::EventType;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::kcp::{ClaimState, PermissionClaim};
use crate::api::providers::{CatalogEntry, ExportRef, Grant};
use crate::pass::budget::Exhausted;
use crate::pass::client::{counted_client, own_config};
use crate::pass::status::apply_status;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, list, shard};
use crate::scrub::scrub;

pub use args::{ClaimsArgs, HubArgs};
use hub::{Hub, HubError, SlimBinding};
use merge::{ClaimKey, merge, parse_placeholders, render_placeholders};
use policy::{Consent, Desired, OwnIdentities};
use record::{Blocked, EntryOutcome, IdentityGap};

pub const PASS: &str = "claims";

/// Workspace and provider a Grant's consent is for.
type GrantKey = (String, String);

/// Run one claims pass.
pub async fn run(ctx: PassContext, args: ClaimsArgs) -> Result<Summary, PassError> {
    let core = args.hub.core()?;
    let hub = connect(&ctx, &args.hub).await?;
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let mut writes = Writes::new(ctx.args.dry_run);
    let manager = ctx.field_manager();

    // Observe: the catalog (this shard's share), consent and every visible binding.
    let entries_api: Api<CatalogEntry> = Api::all(ctx.client.clone());
    // One CatalogEntry per export, decided over the whole catalog (not this shard's share or the
    // selector's), so every run and every shard agrees on the winner.
    let catalog = list::all(&entries_api, &ListParams::default())
        .await
        .map_err(|e| PassError::kube("listing CatalogEntries", &e))?;
    let losers = policy::duplicate_entries(catalog.iter().map(|e| {
        (
            &e.spec.export,
            e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            e.metadata.name.as_deref().unwrap_or_default(),
        )
    }));
    let mut entries = match &args.selector {
        None => catalog.clone(),
        Some(sel) => list::all(&entries_api, &ListParams::default().labels(sel))
            .await
            .map_err(|e| PassError::kube("listing CatalogEntries", &e))?,
    };
    entries.retain(|e| shard::owns(ctx.args.shard, &e.name_any()));
    entries.sort_by_key(|e| e.name_any());
    let grants = observe_grants(&ctx.client, args.hub.grant_namespace.as_deref()).await?;
    let mut bindings = hub.list_bindings().await.map_err(unreachable)?;
    summary.count("catalogEntries", entries.len() as i64);

    // The hub's own core bindings first: accepting the apibindings claim there makes the
    // virtual workspace show that workspace's provider bindings, so the run lists once more.
    let mut stopped: Option<Exhausted> = None;
    let core_owner = ctx.args.shard.is_none_or(|s| s.index == 0);
    // Every shard reads the core export: its identity is one a provider's own requirement may
    // carry. Unreadable, the pass stops before any write.
    let core_export = match &core {
        Some(core) => Some(
            hub.get_export(&core.path, &core.export)
                .await
                .map_err(unreachable)?
                .ok_or_else(|| {
                    PassError::Config(format!(
                        "core APIExport {} not found in {} (check --core-export and --core-export-path)",
                        core.export,
                        if core.path.is_empty() { "the hub" } else { &core.path }
                    ))
                })?,
        ),
        None => None,
    };
    let core_identity = match (&core, &core_export) {
        (Some(core), Some(export)) => CoreIdentity::read(core, export),
        _ => CoreIdentity::NotConfigured,
    };
    if let (Some(core), Some(core_export), true) = (&core, core_export, core_owner) {
        let claims = core_export.spec.permission_claims;
        let desired = policy::core_desired(&claims);
        let mut opened: BTreeSet<String> = BTreeSet::new();
        for b in bindings.iter().filter(|b| core.is_core_binding(b)) {
            if let Err(why) = ctx.budget.check() {
                stopped = Some(why);
                break;
            }
            summary.count("coreBindingsChecked", 1);
            match reconcile_binding(&hub, b, &desired, &claims, true, &mut writes, &ctx).await {
                Ok(Written::Updated(after)) => {
                    summary.count("coreBindingsUpdated", 1);
                    if accepts_apibindings(&after) && !accepts_apibindings(&b.claims_view()) {
                        opened.insert(b.cluster.clone());
                    }
                }
                Ok(Written::Unchanged) => {}
                Ok(Written::OutOfBudget(why)) => {
                    stopped = Some(why);
                    break;
                }
                Err(e) => {
                    summary.count("failed", 1);
                    tracing::warn!(binding = %b.key(), error = %scrub(&e.to_string()), "core binding not reconciled");
                }
            }
        }
        if !opened.is_empty() && !writes.dry_run() {
            bindings = relist_opened(&hub, core, &opened, &ctx).await?;
            summary.count("workspacesOpened", opened.len() as i64);
        }
    }

    // Only workspaces holding the core binding are in scope.
    let in_scope: Option<BTreeSet<String>> = core.as_ref().map(|core| {
        bindings
            .iter()
            .filter(|b| core.is_core_binding(b))
            .map(|b| b.cluster.clone())
            .collect()
    });
    let mut by_export: BTreeMap<(String, String), Vec<&SlimBinding>> = BTreeMap::new();
    for b in &bindings {
        if core.as_ref().is_some_and(|c| c.is_core_binding(b)) {
            continue;
        }
        if in_scope.as_ref().is_some_and(|s| !s.contains(&b.cluster)) {
            summary.count("outOfScope", 1);
            continue;
        }
        by_export
            .entry((b.export.path.clone(), b.export.name.clone()))
            .or_default()
            .push(b);
    }
    summary.count("bindingsSeen", bindings.len() as i64);

    for entry in &entries {
        if stopped.is_some() {
            break;
        }
        let key = (
            entry.spec.export.path.clone(),
            entry.spec.export.name.clone(),
        );
        if let Some(winner) = losers.get(&entry.name_any()) {
            summary.count("duplicateEntries", 1);
            let outcome = EntryOutcome {
                blocked: Some(Blocked {
                    reason: record::DUPLICATE_ENTRY,
                    message: format!(
                        "CatalogEntry {winner} is older and names the same APIExport {}; this entry writes nothing to any binding until that one is deleted",
                        display_export(&entry.spec.export)
                    ),
                }),
                ..Default::default()
            };
            record(&ctx, entry, &outcome, &manager, &mut writes).await;
            continue;
        }
        let mine = by_export.get(&key).map(Vec::as_slice).unwrap_or_default();
        let (outcome, exhausted) = reconcile_entry(
            &ctx,
            &hub,
            entry,
            mine,
            &grants,
            &core_identity,
            &mut writes,
            &mut summary,
        )
        .await;
        stopped = exhausted;
        record(&ctx, entry, &outcome, &manager, &mut writes).await;
    }

    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!(
            "stopped early ({}); CatalogEntry cursors record where the next run resumes",
            match why {
                Exhausted::MaxItems => "--max-items reached",
                Exhausted::Deadline => "deadline near",
                Exhausted::Terminated => "SIGTERM received",
                Exhausted::LeaseLost => "pass Lease lost",
            }
        ),
        resume_after: None,
    });
    summary.finish(writes, stopped);
    if ctx.args.dry_run {
        // claims alone has always said dry-run over partial for a dry run that stopped early.
        summary.outcome = crate::pass::Outcome::DryRun;
    }
    Ok(summary)
}

/// The core export's identity as this run read it.
enum CoreIdentity {
    /// No core export configured (single-cluster mode without the core flags).
    NotConfigured,
    /// Configured, but its `status.identityHash` is empty: the message says which export.
    Unknown(String),
    Known(String),
}

impl CoreIdentity {
    fn read(core: &args::Core, export: &crate::api::kcp::APIExport) -> Self {
        match export.status.as_ref().map(|s| s.identity_hash.as_str()) {
            Some(h) if !h.is_empty() => Self::Known(h.to_string()),
            _ => Self::Unknown(display_export(&ExportRef {
                path: core.path.clone(),
                name: core.export.clone(),
            })),
        }
    }

    fn known(&self) -> Option<String> {
        match self {
            Self::Known(h) => Some(h.clone()),
            _ => None,
        }
    }
}

/// `<name> in <path>` (or `in the hub`).
fn display_export(e: &ExportRef) -> String {
    format!(
        "{} in {}",
        e.name,
        if e.path.is_empty() {
            "the hub"
        } else {
            &e.path
        }
    )
}

/// Say which identity could not be read (docs/claims.md, "The policy"): claims carrying it were
/// treated as compositions.
fn identity_gap(entry: &CatalogEntry, own_known: bool, core: &CoreIdentity) -> Option<IdentityGap> {
    if !own_known {
        return Some(IdentityGap {
            reason: "ExportIdentityUnknown",
            message: format!(
                "APIExport {} has no status.identityHash yet, so claims carrying an identityHash cannot be recognised as this provider's own: they are treated as compositions (Rejected without the workspace's Grant) until it can be read",
                display_export(&entry.spec.export)
            ),
        });
    }
    match core {
        CoreIdentity::Unknown(export) => Some(IdentityGap {
            reason: "CoreIdentityUnknown",
            message: format!(
                "the core APIExport {export} has no status.identityHash, so claims carrying its identity are treated as compositions (Rejected without the workspace's Grant) until it can be read"
            ),
        }),
        _ => None,
    }
}

/// Reconcile one provider's bindings from where its last unfinished cycle stopped.
#[allow(clippy::too_many_arguments)]
async fn reconcile_entry(
    ctx: &PassContext,
    hub: &Hub,
    entry: &CatalogEntry,
    bindings: &[&SlimBinding],
    grants: &Option<BTreeMap<GrantKey, Consent>>,
    core_identity: &CoreIdentity,
    writes: &mut Writes,
    summary: &mut Summary,
) -> (EntryOutcome, Option<Exhausted>) {
    let name = entry.name_any();
    let hash = policy::requirements_hash(&entry.spec.requires);
    let mut outcome = EntryOutcome {
        requirements_hash: hash.clone(),
        ..Default::default()
    };
    let export = match hub
        .get_export(&entry.spec.export.path, &entry.spec.export.name)
        .await
    {
        Ok(Some(e)) => e,
        Ok(None) => {
            outcome.blocked = Some(Blocked {
                reason: "ExportNotFound",
                message: format!(
                    "APIExport {} not found in {}",
                    entry.spec.export.name,
                    if entry.spec.export.path.is_empty() {
                        "the hub"
                    } else {
                        &entry.spec.export.path
                    }
                ),
            });
            return (outcome, None);
        }
        Err(e) => {
            outcome.blocked = Some(blocked_by(&e));
            return (outcome, None);
        }
    };

    let own_identity = export
        .status
        .as_ref()
        .map(|s| s.identity_hash.clone())
        .filter(|h| !h.is_empty());
    outcome.identity_gap = identity_gap(entry, own_identity.is_some(), core_identity);
    let own = OwnIdentities::new(own_identity, core_identity.known());
    let export = export.spec.permission_claims;

    // What the export lacks does not depend on any workspace's consent.
    outcome.missing_on_export =
        policy::desired(&name, &entry.spec.requires, &export, &own, None).missing_on_export;
    let prev = entry.status.clone().unwrap_or_default();
    let resume = record::resume_point(&prev, &hash);
    outcome.resumed = resume.is_some();
    // Desired claims depend only on the consent; most workspaces share "none".
    let mut cache: BTreeMap<Option<Consent>, Desired> = BTreeMap::new();
    let mut last: Option<String> = None;
    let mut exhausted = None;
    let mut sorted: Vec<&&SlimBinding> = bindings.iter().collect();
    sorted.sort_by_key(|b| b.key());
    for b in sorted {
        let key = b.key();
        if resume.as_ref().is_some_and(|r| key.as_str() <= r.as_str()) {
            continue;
        }
        if let Err(why) = ctx.budget.check() {
            exhausted = Some(why);
            break;
        }
        let consent = grants
            .as_ref()
            .and_then(|g| g.get(&(b.cluster.clone(), name.clone())).cloned());
        let desired = cache.entry(consent.clone()).or_insert_with(|| {
            policy::desired(&name, &entry.spec.requires, &export, &own, consent.as_ref())
        });
        match reconcile_binding(hub, b, desired, &export, false, writes, ctx).await {
            Ok(Written::Updated(_)) => outcome.updated += 1,
            Ok(Written::Unchanged) => {}
            Ok(Written::OutOfBudget(why)) => {
                exhausted = Some(why);
                break;
            }
            Err(e) => {
                outcome.failed += 1;
                warn_entry(ctx, entry, b, &e).await;
            }
        }
        outcome.checked += 1;
        last = Some(key);
    }
    if exhausted.is_some() {
        outcome.stopped_after = last.or(resume);
    }
    summary.count("bindingsChecked", outcome.checked);
    summary.count("bindingsUpdated", outcome.updated);
    summary.count("failed", outcome.failed);
    summary.count("missingOnExport", outcome.missing_on_export.len() as i64);
    (outcome, exhausted)
}

/// List again after core bindings accepted the apibindings claim. kcp labels a newly opened
/// workspace's bindings for the virtual workspace asynchronously and one by one (observed on kcp
/// v0.31: the list right after the write shows none, the next one some), so the list is
/// repeated a second apart until the opened workspaces' bindings are visible and their number
/// held still between two lists, at most five times and within the deadline. Whatever is still
/// hidden is reconciled by the next run.
async fn relist_opened(
    hub: &Hub,
    core: &args::Core,
    opened: &BTreeSet<String>,
    ctx: &PassContext,
) -> Result<Vec<SlimBinding>, PassError> {
    let wait = std::time::Duration::from_secs(1);
    let mut previous = None;
    let mut tries = 0;
    loop {
        tries += 1;
        let bindings = hub.list_bindings().await.map_err(unreachable)?;
        let visible = bindings
            .iter()
            .filter(|b| opened.contains(&b.cluster) && !core.is_core_binding(b))
            .count();
        let settled = visible > 0 && previous == Some(visible);
        if settled || tries >= 5 || ctx.budget.remaining() <= wait {
            return Ok(bindings);
        }
        previous = Some(visible);
        tokio::time::sleep(wait).await;
    }
}

/// What happened to one binding.
enum Written {
    Unchanged,
    /// The claims now held (or, in a dry run, that would be).
    Updated(Vec<(ClaimKey, ClaimState)>),
    /// A write was due but the budget is spent.
    OutOfBudget(Exhausted),
}

/// Bring one binding's claims to `desired`, taking one unit of budget per write. A conflicting
/// write re-reads the binding and merges again, so a tenant's concurrent edit is kept, never
/// clobbered.
async fn reconcile_binding(
    hub: &Hub,
    binding: &SlimBinding,
    desired: &Desired,
    export: &[PermissionClaim],
    force: bool,
    writes: &mut Writes,
    ctx: &PassContext,
) -> Result<Written, HubError> {
    let mut current = binding.clone();
    let mut budgeted = false;
    for attempt in 0..3 {
        let marks = parse_placeholders(current.placeholders.as_deref());
        let merged = merge(&current.claims, &marks, desired, export, force);
        if !merged.changed {
            return Ok(Written::Unchanged);
        }
        if !budgeted {
            if let Err(why) = ctx.budget.take() {
                return Ok(Written::OutOfBudget(why));
            }
            budgeted = true;
        }
        let target = format!("APIBinding {}/{}", current.cluster, current.name);
        let detail = describe(&current, &merged.claims);
        if !writes.will("patch", target, detail) {
            return Ok(Written::Updated(view(&merged.claims)));
        }
        let annotation = render_placeholders(&merged.placeholders);
        match hub
            .write_claims(
                &current,
                &merged.claims,
                annotation.as_deref(),
                &ctx.field_manager(),
            )
            .await
        {
            Ok(()) => {
                writes.data_done();
                return Ok(Written::Updated(view(&merged.claims)));
            }
            Err(e) if is_conflict(&e) && attempt < 2 => {
                tracing::debug!(binding = %current.key(), "binding changed while writing; re-reading");
                match hub.get_binding(&current.cluster, &current.name).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(Written::Unchanged),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Written::Unchanged)
}

fn view(claims: &[crate::api::kcp::AcceptablePermissionClaim]) -> Vec<(ClaimKey, ClaimState)> {
    claims
        .iter()
        .map(|c| {
            (
                ClaimKey {
                    group: c.group.clone(),
                    resource: c.resource.clone(),
                    identity_hash: c.identity_hash.clone(),
                },
                c.state,
            )
        })
        .collect()
}

fn accepts_apibindings(claims: &[(ClaimKey, ClaimState)]) -> bool {
    claims.iter().any(|(k, s)| {
        k.group == "apis.kcp.io" && k.resource == "apibindings" && *s == ClaimState::Accepted
    })
}

impl SlimBinding {
    fn claims_view(&self) -> Vec<(ClaimKey, ClaimState)> {
        view(&self.claims)
    }
}

/// A short description of a claims change for dry runs and logs.
fn describe(before: &SlimBinding, after: &[crate::api::kcp::AcceptablePermissionClaim]) -> String {
    let old: BTreeMap<ClaimKey, ClaimState> = before.claims_view().into_iter().collect();
    let new: BTreeMap<ClaimKey, ClaimState> = view(after).into_iter().collect();
    let mut parts = Vec::new();
    for (k, s) in &new {
        let gr = if k.group.is_empty() {
            k.resource.clone()
        } else {
            format!("{}.{}", k.resource, k.group)
        };
        match old.get(k) {
            None => parts.push(format!("+{gr}={s:?}")),
            Some(o) if o != s => parts.push(format!("{gr}: {o:?}->{s:?}")),
            Some(_) => {}
        }
    }
    for k in old.keys().filter(|k| !new.contains_key(*k)) {
        parts.push(format!("-{}.{}", k.resource, k.group));
    }
    if parts.is_empty() {
        "verbs or placeholder marks".into()
    } else {
        parts.join(", ")
    }
}

fn is_conflict(e: &HubError) -> bool {
    e.kube_source().is_some_and(|k| k.is_conflict())
}

fn blocked_by(e: &HubError) -> Blocked {
    let forbidden = e.kube_source().is_some_and(|k| k.is_forbidden());
    Blocked {
        reason: if forbidden {
            "PermissionDenied"
        } else {
            "ExportUnreadable"
        },
        message: scrub(&e.to_string()),
    }
}

fn unreachable(e: HubError) -> PassError {
    PassError::Unreachable {
        what: "kcp".into(),
        message: scrub(&e.to_string()),
    }
}

/// A binding write failed (forbidden, rejected): an Event on the CatalogEntry names it.
async fn warn_entry(ctx: &PassContext, entry: &CatalogEntry, b: &SlimBinding, e: &HubError) {
    let reason = match e.kube_source() {
        Some(k) if k.is_forbidden() => "BindingWriteDenied",
        Some(k) if k.is_invalid() || k.is_bad_request() => "BindingWriteRejected",
        _ => "BindingWriteFailed",
    };
    let note = format!("APIBinding {} in workspace {}: {e}", b.name, b.cluster);
    tracing::warn!(entry = %entry.name_any(), reason, note = %scrub(&note), "binding not written");
    let oref: ObjectReference = entry.object_ref(&());
    ctx.recorder
        .publish(&oref, EventType::Warning, reason, &note)
        .await;
}

/// Record the entry's outcome in its status (one write per entry per run).
async fn record(
    ctx: &PassContext,
    entry: &CatalogEntry,
    outcome: &EntryOutcome,
    manager: &str,
    writes: &mut Writes,
) {
    let prev = entry.status.clone().unwrap_or_default();
    let next = record::next_status(&prev, entry.meta().generation, outcome, Timestamp::now());
    let name = entry.name_any();
    if !writes.will(
        "apply-status",
        format!("CatalogEntry {name}"),
        "cycle cursor and counts",
    ) {
        return;
    }
    let api: Api<CatalogEntry> = Api::all(ctx.client.clone());
    let value = serde_json::to_value(&next).unwrap_or_default();
    match apply_status(&api, &name, manager, value, None).await {
        Ok(_) => writes.bookkeeping_done(),
        Err(e) => {
            tracing::warn!(entry = %name, error = %scrub(&e.to_string()), "status not recorded")
        }
    }
}

/// Consent per (workspace, provider); `None` when no Grant store is configured.
async fn observe_grants(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Option<BTreeMap<GrantKey, Consent>>, PassError> {
    let Some(ns) = namespace else {
        return Ok(None);
    };
    let api: Api<Grant> = Api::namespaced(client.clone(), ns);
    let grants = list::all(&api, &ListParams::default())
        .await
        .map_err(|e| PassError::kube(format!("listing Grants in {ns}"), &e))?;
    let mut out: BTreeMap<GrantKey, Consent> = BTreeMap::new();
    for g in grants {
        out.entry((g.spec.workspace.clone(), g.spec.provider.clone()))
            .or_default()
            .extend(
                g.spec
                    .compositions
                    .into_iter()
                    .map(|c| (c.group, c.resource)),
            );
    }
    Ok(Some(out))
}

/// Build the hub topology from the job's kubeconfig.
async fn connect(ctx: &PassContext, args: &HubArgs) -> Result<Hub, PassError> {
    if args.single_cluster {
        return Ok(Hub::Single {
            client: ctx.client.clone(),
            cluster_name: args.cluster_name.clone(),
        });
    }
    let core = args.core()?.ok_or_else(|| {
        PassError::Config(
            "kcp mode needs --core-export, --core-export-path and --core-binding (or pass --single-cluster)"
                .into(),
        )
    })?;
    if core.path.is_empty() {
        return Err(PassError::Config(
            "kcp mode needs --core-export-path (the workspace path of the core APIExport, e.g. root:hub)".into(),
        ));
    }
    let config = own_config(&ctx.args).await?;
    let root_url = hub::server_root(&config.cluster_url).map_err(unreachable)?;
    let client_for = |url: http::Uri| {
        let mut c = config.clone();
        c.cluster_url = url;
        counted_client(c, ctx.counter.clone())
            .map_err(|e| PassError::kube("building a kcp client", &e))
    };
    let root = client_for(root_url)?;
    let slice = args.core_endpoint_slice.as_deref().unwrap_or(&core.export);
    let urls = hub::endpoint_urls(&root, &core.path, slice)
        .await
        .map_err(unreachable)?;
    let mut endpoints = Vec::with_capacity(urls.len());
    for url in urls {
        let uri: http::Uri = url.parse().map_err(|_| {
            PassError::Config(format!(
                "APIExportEndpointSlice {slice} lists an invalid URL {}",
                scrub(&url)
            ))
        })?;
        endpoints.push(client_for(uri)?);
    }
    Ok(Hub::Kcp { root, endpoints })
}
