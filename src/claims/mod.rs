//! `kbind claims`: one bounded pass that keeps every tenant APIBinding's permission claims in
//! step with what its provider declares (CatalogEntry `spec.requires`) and what the workspace
//! consented to (Grant). Observe the catalog, consent and bindings; reconcile the hub's core
//! bindings first; then, per provider, plan each binding's claims with the pure policy and
//! merge, write only what differs, and record the cycle on the CatalogEntry.
//!
//! The files, in the order of a run:
//! - `mod.rs`: [`run`], the pass's shape, and the errors and Events it reports;
//! - observe: `observe.rs` (catalog, Grants, core export, the hub topology; `hub.rs` reads and
//!   writes kcp or a single cluster; `maintain.rs` finds the bindings kcp maintains itself);
//! - plan (pure): `policy.rs` (which claims a binding should hold), `merge.rs` (merged into
//!   what the binding holds, a tenant's own edits kept);
//! - apply: `apply.rs` (core bindings, then each entry's bindings from its cursor);
//! - record: `record.rs` (the CatalogEntry status: computed purely, written once per entry);
//! - `args.rs` (flags), `export.rs` (`kbind claims export`, a one-off command).

mod apply;
pub mod args;
pub mod export;
pub mod hub;
pub mod maintain;
pub mod merge;
mod observe;
pub mod policy;
pub mod record;

use std::collections::{BTreeMap, BTreeSet};

use crate::pass::StatusCode;
use crate::pass::events::EventType;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use crate::api::providers::{CatalogEntry, ExportRef};
use crate::pass::budget::Exhausted;
use crate::pass::walk::{Items, Look, Phase, Roots, TurnError, Walk};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary};

use apply::Observed;
pub use args::{ClaimsArgs, HubArgs};
use hub::{HubError, SlimBinding};
use observe::CoreIdentity;
use record::{Blocked, EntryOutcome, IdentityGap};

pub const PASS: &str = "claims";

/// Workspace and provider a Grant's consent is for.
type GrantKey = (String, String);

/// Run one claims pass.
pub async fn run(ctx: PassContext, args: ClaimsArgs) -> Result<Summary, PassError> {
    let core = args.hub.core()?;
    let hub = observe::connect(&ctx, &args.hub).await?;
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let mut writes = Writes::new(ctx.args.dry_run);
    let manager = ctx.field_manager();

    // Observe: the catalog (this shard's share), consent and every visible binding.
    let (entries, losers) = observe::entries(&ctx, args.selector.as_deref()).await?;
    let grants = observe::grants(&ctx.client, args.hub.grant_namespace.as_deref()).await?;
    let mut bindings = hub.list_bindings().await.map_err(unreachable)?;
    // This shard's entries in name order; their own cursors say where each cycle resumes.
    let walk = Walk::new(
        "CatalogEntry",
        entries.iter().map(ResourceExt::name_any),
        ctx.args.shard,
        None,
    )
    .items(Items::PerWrite);
    summary.count("catalogEntries", walk.order().len() as i64);

    let mut stopped: Option<Exhausted> = None;
    let core_owner = ctx.args.shard.is_none_or(|s| s.index == 0);
    let core_export = observe::core_export(&hub, core.as_ref()).await?;
    let core_identity = match (&core, &core_export) {
        (Some(core), Some(export)) => CoreIdentity::read(core, export),
        _ => CoreIdentity::NotConfigured,
    };
    let observed = Observed {
        ctx: &ctx,
        hub: &hub,
        grants: &grants,
        core_identity: &core_identity,
        write_concurrency: if ctx.args.dry_run {
            std::num::NonZeroUsize::MIN
        } else {
            args.write.write_concurrency
        },
    };
    // The hub's own core bindings first (one shard does them).
    if let (Some(core), Some(core_export), true) = (&core, core_export, core_owner) {
        stopped = observed
            .reconcile_core(core, core_export, &mut bindings, &mut writes, &mut summary)
            .await?;
    }
    let by_export = by_export(&bindings, core.as_ref(), &mut summary);
    let maintained = maintain::find(&hub, &of_entries(&entries, &by_export)).await;

    if stopped.is_none() {
        let mut walking = Entries {
            observed: &observed,
            entries: &entries,
            losers: &losers,
            by_export: &by_export,
            maintained: &maintained,
            manager: &manager,
            writes: &mut writes,
            summary: &mut summary,
        };
        stopped = walk
            .run(&ctx.budget, &ctx.poison, &mut walking)
            .await
            .stopped;
    }

    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!(
            "stopped early ({why}); CatalogEntry cursors record where the next run resumes"
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

/// The walk over this run's CatalogEntries (src/pass/walk.rs): each entry's bindings from its
/// cursor, and its status recorded, even when the budget ends the run inside it.
struct Entries<'r, 'a> {
    observed: &'r Observed<'a>,
    entries: &'r [CatalogEntry],
    /// Entry name → the older entry naming the same export.
    losers: &'r BTreeMap<String, String>,
    by_export: &'r BTreeMap<(String, String), Vec<&'r SlimBinding>>,
    maintained: &'r maintain::Maintained,
    manager: &'r str,
    writes: &'r mut Writes,
    summary: &'r mut Summary,
}

impl Roots for Entries<'_, '_> {
    type Error = std::convert::Infallible;

    fn look(&mut self, name: &str) -> Look {
        match self.entries.iter().find(|e| e.name_any() == name) {
            None => Look::Absent,
            Some(e) => Look::Due {
                generation: e.metadata.generation.unwrap_or(0),
                phase: Phase::Apply,
            },
        }
    }

    async fn apply(&mut self, name: &str) -> Result<(), TurnError<Self::Error>> {
        let Some(entry) = self.entries.iter().find(|e| e.name_any() == name) else {
            return Ok(());
        };
        let ctx = self.observed.ctx;
        if let Some(winner) = self.losers.get(name) {
            self.summary.count("duplicateEntries", 1);
            let outcome = duplicate(entry, winner);
            record::write(ctx, entry, &outcome, self.manager, self.writes).await;
            return Ok(());
        }
        let key = (
            entry.spec.export.path.clone(),
            entry.spec.export.name.clone(),
        );
        let mine = self
            .by_export
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let (outcome, exhausted) = self
            .observed
            .reconcile_entry(entry, mine, self.maintained, self.writes, self.summary)
            .await;
        // Recorded either way: the cursor says where the next run resumes.
        record::write(ctx, entry, &outcome, self.manager, self.writes).await;
        exhausted.map_or(Ok(()), |why| Err(why.into()))
    }
}

/// The provider bindings by the export they bind, without the core bindings and (with a core
/// export configured) without those of workspaces that hold no core binding: only those are in
/// scope.
fn by_export<'a>(
    bindings: &'a [SlimBinding],
    core: Option<&args::Core>,
    summary: &mut Summary,
) -> BTreeMap<(String, String), Vec<&'a SlimBinding>> {
    let in_scope: Option<BTreeSet<String>> = core.map(|core| {
        bindings
            .iter()
            .filter(|b| core.is_core_binding(b))
            .map(|b| b.cluster.clone())
            .collect()
    });
    let mut by_export: BTreeMap<(String, String), Vec<&SlimBinding>> = BTreeMap::new();
    for b in bindings {
        if core.is_some_and(|c| c.is_core_binding(b)) {
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
    by_export
}

/// A CatalogEntry naming the same APIExport as the older `winner`: blocked, so it writes
/// nothing to any binding.
fn duplicate(entry: &CatalogEntry, winner: &str) -> EntryOutcome {
    EntryOutcome {
        blocked: Some(Blocked {
            reason: record::DUPLICATE_ENTRY,
            message: format!(
                "CatalogEntry {winner} is older and names the same APIExport {}; this entry writes nothing to any binding until that one is deleted",
                display_export(&entry.spec.export)
            ),
        }),
        ..Default::default()
    }
}

/// The bindings of the exports `entries` name: only those can be kcp-maintained bindings of
/// this run.
fn of_entries<'a>(
    entries: &[CatalogEntry],
    by_export: &BTreeMap<(String, String), Vec<&'a SlimBinding>>,
) -> Vec<&'a SlimBinding> {
    entries
        .iter()
        .filter_map(|e| by_export.get(&(e.spec.export.path.clone(), e.spec.export.name.clone())))
        .flatten()
        .copied()
        .collect()
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

fn blocked_by(e: &HubError) -> Blocked {
    let forbidden = e.kube_source().is_some_and(|k| k.is_forbidden());
    Blocked {
        reason: if forbidden {
            "PermissionDenied"
        } else {
            "ExportUnreadable"
        },
        message: e.to_string(),
    }
}

fn unreachable(e: HubError) -> PassError {
    PassError::unreachable("kcp", e)
}

/// A binding write failed (forbidden, rejected): an Event on the CatalogEntry names it.
async fn warn_entry(ctx: &PassContext, entry: &CatalogEntry, b: &SlimBinding, e: &HubError) {
    let reason = match e.kube_source() {
        Some(k) if k.is_forbidden() => "BindingWriteDenied",
        Some(k) if k.is_invalid() || k.is_bad_request() => "BindingWriteRejected",
        _ => "BindingWriteFailed",
    };
    let note = format!("APIBinding {} in workspace {}: {e}", b.name, b.cluster);
    tracing::warn!(entry = %entry.name_any(), reason, note = %note, "binding not written");
    let oref: ObjectReference = entry.object_ref(&());
    ctx.recorder
        .publish(&oref, EventType::Warning, reason, &note)
        .await;
}
