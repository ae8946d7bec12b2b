//! Apply: bring bindings' claims to what the policy plans (`policy`, `merge`) — the hub's own
//! core bindings first, then each CatalogEntry's bindings from its cursor — one budgeted write
//! per binding that differs, re-read and merged again on a conflict.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::args;
use super::hub::{Hub, HubError, SlimBinding};
use super::maintain::Maintained;
use super::merge::{ClaimKey, merge, parse_placeholders, render_placeholders};
use super::observe::{CoreIdentity, relist_opened};
use super::policy::{self, Consent, Desired, OwnIdentities};
use super::record::{self, Blocked, EntryOutcome, MaintainedBinding};
use super::{GrantKey, blocked_by, identity_gap, warn_entry};
use crate::api::kcp::{APIExport, ClaimState, PermissionClaim};
use crate::api::providers::CatalogEntry;
use crate::pass::StatusCode;
use crate::pass::budget::Exhausted;
use crate::pass::concurrency::InFlight;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary};

/// What every CatalogEntry of one run reads (the run state of the apply step).
pub(super) struct Observed<'a> {
    pub ctx: &'a PassContext,
    pub hub: &'a Hub,
    pub grants: &'a Option<BTreeMap<GrantKey, Consent>>,
    pub core_identity: &'a CoreIdentity,
    /// Bindings whose writes may be in flight at once (1 in a dry run: plans print in order).
    pub write_concurrency: std::num::NonZeroUsize,
}

impl Observed<'_> {
    /// Reconcile one provider's bindings from where its last unfinished cycle stopped.
    pub(super) async fn reconcile_entry(
        &self,
        entry: &CatalogEntry,
        bindings: &[&SlimBinding],
        maintained: &Maintained,
        writes: &mut Writes,
        summary: &mut Summary,
    ) -> (EntryOutcome, Option<Exhausted>) {
        let name = entry.name_any();
        let (mut outcome, export, own, resume) = match self.begin(entry).await {
            Ok(begun) => begun,
            Err(blocked) => return (blocked, None),
        };
        // Desired claims depend only on the consent; most workspaces share "none".
        let mut cache: BTreeMap<Option<Consent>, Desired> = BTreeMap::new();
        let mut last: Option<String> = None;
        let mut exhausted = None;
        let mut sorted: Vec<&&SlimBinding> = bindings.iter().collect();
        sorted.sort_by_key(|b| b.key());
        // Up to --write-concurrency bindings' writes in flight; the budget and the cursor are
        // decided as each binding starts, in key order, as one at a time would.
        let mut flight = InFlight::new(self.write_concurrency);
        let export_ref: &[PermissionClaim] = &export;
        for b in sorted {
            let key = b.key();
            if resume.as_ref().is_some_and(|r| key.as_str() <= r.as_str()) {
                continue;
            }
            if let Some(by) = maintained.get(&key) {
                // kcp owns these claims (docs/claims.md "Bindings kcp maintains"): no write.
                summary.count("kcpMaintained", 1);
                note_maintained(&mut outcome, b, by);
                last = Some(key);
                continue;
            }
            if let Err(why) = self.ctx.budget.check() {
                exhausted = Some(why);
                break;
            }
            let desired = cache
                .entry(self.consent(b, &name))
                .or_insert_with_key(|consent| {
                    policy::desired(&name, &entry.spec.requires, &export, &own, consent.as_ref())
                });
            let pending = match start_binding(b, desired, &export, false, writes, self.ctx) {
                Started::Done(w) => {
                    self.count_binding(entry, b, Ok(w), &mut outcome).await;
                    outcome.checked += 1;
                    last = Some(key);
                    continue;
                }
                Started::OutOfBudget(why) => {
                    exhausted = Some(why);
                    break;
                }
                Started::Write(p) => p,
            };
            self.make_room(entry, &mut flight, writes, &mut outcome)
                .await;
            let mut one = writes.for_one();
            let desired = desired.clone();
            flight.push(async move {
                let r = finish_binding(
                    self.hub, pending, &desired, export_ref, false, &mut one, self.ctx,
                )
                .await;
                (*b, r, one)
            });
            outcome.checked += 1;
            last = Some(key);
        }
        while let Some(done) = flight.next().await {
            self.absorb(entry, done, writes, &mut outcome).await;
        }
        if exhausted.is_some() {
            outcome.stopped_after = last.or(resume);
        }
        count_entry(summary, &outcome);
        (outcome, exhausted)
    }

    /// What the workspace of `b` consented to for provider `entry` (its Grant), if anything.
    fn consent(&self, b: &SlimBinding, entry: &str) -> Option<Consent> {
        self.grants
            .as_ref()
            .and_then(|g| g.get(&(b.cluster.clone(), entry.to_string())).cloned())
    }

    /// An entry's outcome so far, its export's claims and the identities its requirements may
    /// carry, and where its cycle resumes; `Err` with the outcome blocked when the export
    /// cannot be read.
    async fn begin(
        &self,
        entry: &CatalogEntry,
    ) -> Result<
        (
            EntryOutcome,
            Vec<PermissionClaim>,
            OwnIdentities,
            Option<String>,
        ),
        EntryOutcome,
    > {
        let hash = policy::requirements_hash(&entry.spec.requires);
        let mut outcome = EntryOutcome {
            requirements_hash: hash.clone(),
            ..Default::default()
        };
        let Some((export, own)) = self.entry_export(entry, &mut outcome).await else {
            return Err(outcome);
        };
        let prev = entry.status.clone().unwrap_or_default();
        let resume = record::resume_point(&prev, &hash);
        outcome.resumed = resume.is_some();
        Ok((outcome, export, own, resume))
    }

    /// Wait for writes in flight to finish until another may start.
    async fn make_room<'b, F>(
        &self,
        entry: &CatalogEntry,
        flight: &mut InFlight<F>,
        writes: &mut Writes,
        outcome: &mut EntryOutcome,
    ) where
        F: Future<Output = (&'b SlimBinding, Result<Written, HubError>, Writes)>,
    {
        while !flight.has_room() {
            if let Some(done) = flight.next().await {
                self.absorb(entry, done, writes, outcome).await;
            }
        }
    }

    /// A binding's write finished: its writes join the run's, its result the entry's counts.
    async fn absorb(
        &self,
        entry: &CatalogEntry,
        (b, r, w): (&SlimBinding, Result<Written, HubError>, Writes),
        writes: &mut Writes,
        outcome: &mut EntryOutcome,
    ) {
        writes.absorb(w);
        self.count_binding(entry, b, r, outcome).await;
    }

    /// Count one provider binding's result (a failure also gets its Event).
    async fn count_binding(
        &self,
        entry: &CatalogEntry,
        b: &SlimBinding,
        r: Result<Written, HubError>,
        outcome: &mut EntryOutcome,
    ) {
        match r {
            Ok(Written::Updated(_)) => outcome.updated += 1,
            Ok(Written::Unchanged | Written::OutOfBudget(_)) => {}
            Err(e) => {
                outcome.failed += 1;
                warn_entry(self.ctx, entry, b, &e).await;
            }
        }
    }

    /// The entry's APIExport claims and the identities its requirements may carry, with the
    /// outcome's identity gap and what the export lacks; `None` (the outcome blocked) when the
    /// export cannot be read.
    async fn entry_export(
        &self,
        entry: &CatalogEntry,
        outcome: &mut EntryOutcome,
    ) -> Option<(Vec<PermissionClaim>, OwnIdentities)> {
        let export = match self
            .hub
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
                return None;
            }
            Err(e) => {
                outcome.blocked = Some(blocked_by(&e));
                return None;
            }
        };
        let own_identity = export
            .status
            .as_ref()
            .map(|s| s.identity_hash.clone())
            .filter(|h| !h.is_empty());
        outcome.identity_gap = identity_gap(entry, own_identity.is_some(), self.core_identity);
        let own = OwnIdentities::new(own_identity, self.core_identity.known());
        let export = export.spec.permission_claims;
        // What the export lacks does not depend on any workspace's consent.
        outcome.missing_on_export =
            policy::desired(&entry.name_any(), &entry.spec.requires, &export, &own, None)
                .missing_on_export;
        Some((export, own))
    }

    /// The hub's own core bindings, before any provider's: accepting the apibindings claim
    /// there makes the virtual workspace show that workspace's provider bindings, so `bindings`
    /// is listed once more when a workspace opened. Returns what stopped the pass, if anything.
    pub(super) async fn reconcile_core(
        &self,
        core: &args::Core,
        core_export: APIExport,
        bindings: &mut Vec<SlimBinding>,
        writes: &mut Writes,
        summary: &mut Summary,
    ) -> Result<Option<Exhausted>, PassError> {
        let claims = core_export.spec.permission_claims;
        let desired = policy::core_desired(&claims);
        let mut opened: BTreeSet<String> = BTreeSet::new();
        let mut stopped = None;
        for b in bindings.iter().filter(|b| core.is_core_binding(b)) {
            if let Err(why) = self.ctx.budget.check() {
                stopped = Some(why);
                break;
            }
            summary.count("coreBindingsChecked", 1);
            match reconcile_binding(self.hub, b, &desired, &claims, true, writes, self.ctx).await {
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
                    tracing::warn!(binding = %b.key(), error = %e, "core binding not reconciled");
                }
            }
        }
        if !opened.is_empty() && !writes.dry_run() {
            *bindings = relist_opened(self.hub, core, &opened, self.ctx).await?;
            summary.count("workspacesOpened", opened.len() as i64);
        }
        Ok(stopped)
    }
}

/// An entry's counts in the run's summary.
fn count_entry(summary: &mut Summary, outcome: &EntryOutcome) {
    summary.count("bindingsChecked", outcome.checked);
    summary.count("bindingsUpdated", outcome.updated);
    summary.count("failed", outcome.failed);
    summary.count("missingOnExport", outcome.missing_on_export.len() as i64);
}

/// A binding whose claims kcp maintains (docs/claims.md "Bindings kcp maintains"): checked,
/// never written.
fn note_maintained(outcome: &mut EntryOutcome, b: &SlimBinding, by: &Result<String, String>) {
    outcome.maintained.push(MaintainedBinding {
        workspace: b.cluster.clone(),
        binding: b.name.clone(),
        by: by.clone(),
    });
    outcome.checked += 1;
}

/// What happened to one binding.
pub(super) enum Written {
    Unchanged,
    /// The claims now held (or, in a dry run, that would be).
    Updated(Vec<(ClaimKey, ClaimState)>),
    /// A write was due but the budget is spent.
    OutOfBudget(Exhausted),
}

/// Bring one binding's claims to `desired`, taking one unit of budget per write. A conflicting
/// write re-reads the binding and merges again, so a tenant's concurrent edit is kept, never
/// clobbered.
pub(super) async fn reconcile_binding(
    hub: &Hub,
    binding: &SlimBinding,
    desired: &Desired,
    export: &[PermissionClaim],
    force: bool,
    writes: &mut Writes,
    ctx: &PassContext,
) -> Result<Written, HubError> {
    match start_binding(binding, desired, export, force, writes, ctx) {
        Started::Done(w) => Ok(w),
        Started::OutOfBudget(why) => Ok(Written::OutOfBudget(why)),
        Started::Write(p) => finish_binding(hub, p, desired, export, force, writes, ctx).await,
    }
}

/// A binding whose write is due, budget taken: what to write first.
pub(super) struct PendingWrite {
    current: SlimBinding,
    merged: super::merge::Merged,
}

/// The first step of [`reconcile_binding`], without I/O, so a pass starting many bindings
/// decides budget and dry-run output in binding order: nothing to do, out of budget, a dry run's
/// planned write (recorded), or a write to make.
pub(super) enum Started {
    Done(Written),
    OutOfBudget(Exhausted),
    Write(PendingWrite),
}

pub(super) fn start_binding(
    binding: &SlimBinding,
    desired: &Desired,
    export: &[PermissionClaim],
    force: bool,
    writes: &mut Writes,
    ctx: &PassContext,
) -> Started {
    let marks = parse_placeholders(binding.placeholders.as_deref());
    let merged = merge(&binding.claims, &marks, desired, export, force);
    if !merged.changed {
        return Started::Done(Written::Unchanged);
    }
    if let Err(why) = ctx.budget.take() {
        return Started::OutOfBudget(why);
    }
    let target = format!("APIBinding {}/{}", binding.cluster, binding.name);
    let detail = describe(binding, &merged.claims);
    if !writes.will("patch", target, detail) {
        return Started::Done(Written::Updated(view(&merged.claims)));
    }
    Started::Write(PendingWrite {
        current: binding.clone(),
        merged,
    })
}

/// The I/O of [`reconcile_binding`]: write, and on a conflict re-read, merge again and retry
/// (twice at most; the budget was taken once, by [`start_binding`]).
pub(super) async fn finish_binding(
    hub: &Hub,
    pending: PendingWrite,
    desired: &Desired,
    export: &[PermissionClaim],
    force: bool,
    writes: &mut Writes,
    ctx: &PassContext,
) -> Result<Written, HubError> {
    let PendingWrite {
        mut current,
        mut merged,
    } = pending;
    for attempt in 0..3 {
        if attempt > 0 {
            let marks = parse_placeholders(current.placeholders.as_deref());
            merged = merge(&current.claims, &marks, desired, export, force);
            if !merged.changed {
                return Ok(Written::Unchanged);
            }
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

pub(super) fn accepts_apibindings(claims: &[(ClaimKey, ClaimState)]) -> bool {
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
