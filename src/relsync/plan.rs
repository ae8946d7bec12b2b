//! Pure decisions of a relsync pass: which sources are due and in what order, which scopes this
//! pass takes, the per-scope diff against what SpiceDB holds, write batching, and whether the
//! cross-resource reap may run. No I/O; everything here is table-tested.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::encode::encode;
use super::spicedb::{MAX_UPDATES, Obj, Op, Rel};
use crate::api::relsync::RelationshipSourceStatus;

/// `spec.sync.interval` when unset or zero.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// Parse `spec.sync.interval` with the duration grammar of every flag and field (Go's, at most a
/// year: src/pass/duration.rs); empty or zero means the default.
pub fn parse_interval(s: Option<&str>) -> Result<Duration, String> {
    match s.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(DEFAULT_INTERVAL),
        Some(s) => crate::pass::duration::parse(s)
            .map(|d| if d.is_zero() { DEFAULT_INTERVAL } else { d })
            .map_err(|e| format!("interval {e}")),
    }
}

/// The longest `spec.sync.interval` accepted: a year.
pub const MAX_INTERVAL: Duration = crate::pass::duration::MAX;

/// A cycle is in progress when it began and its walk has not reached the end of the scope
/// list: `cycleStartedAt` set and `enumComplete` false. (An enumeration failure abandons the
/// cycle by clearing `cycleStartedAt`, so a broken upstream is retried per interval, not
/// every run.)
pub fn cycle_in_progress(status: Option<&RelationshipSourceStatus>) -> bool {
    status
        .and_then(|s| s.sync.as_ref())
        .is_some_and(|s| s.cycle_started_at.is_some() && !s.enum_complete)
}

/// Whether a source is due now (seconds since the epoch): never synced, spec changed since the
/// last pass, not Ready (a fix to its identity or Secret is picked up on the next run), a cycle
/// in progress, or `interval` elapsed since `lastSyncTime`.
pub fn is_due(
    status: Option<&RelationshipSourceStatus>,
    generation: Option<i64>,
    interval: Duration,
    now: i64,
) -> bool {
    let Some(st) = status else { return true };
    let Some(last) = st.sync.as_ref().and_then(|s| s.last_sync_time.as_ref()) else {
        return true;
    };
    let ready = st
        .conditions
        .iter()
        .any(|c| c.type_ == crate::api::relsync::condition::READY && c.status == "True");
    if st.observed_generation != generation || !ready || cycle_in_progress(status) {
        return true;
    }
    now.saturating_sub(last.0.as_second()) >= i64::try_from(interval.as_secs()).unwrap_or(i64::MAX)
}

/// When this source last had a pass (the order key): `lastPass.finishedAt`, else
/// `lastSyncTime`; `None` when it never had one. Not `lastSyncTime` alone: that moves only when
/// a cycle completes, so a source whose cycle keeps stopping partway (or keeps failing) would
/// sort first on every run and take the shared `--max-items` from the rest.
pub fn last_pass_time(status: Option<&RelationshipSourceStatus>) -> Option<i64> {
    let sync = status.and_then(|s| s.sync.as_ref())?;
    sync.last_pass
        .as_ref()
        .and_then(|p| p.finished_at.as_ref())
        .or(sync.last_sync_time.as_ref())
        .map(|t| t.0.as_second())
}

/// `spec.sync.maxScopesPerPass` as a window limit: zero or absent is unbounded
/// (docs/relsync.md); the CRD refuses negative values, which would also be unbounded here.
pub fn scope_limit(max_scopes_per_pass: Option<i32>) -> Option<usize> {
    max_scopes_per_pass
        .filter(|n| *n > 0)
        .and_then(|n| usize::try_from(n).ok())
}

/// Order due sources least-recently-passed first (never passed first), ties by key.
pub fn order_due(mut due: Vec<(String, Option<i64>)>) -> Vec<String> {
    due.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    due.into_iter().map(|(k, _)| k).collect()
}

/// The slice of sorted scope ids this pass takes: those after `resume_after` (string
/// comparison), at most `limit`. Returns (start index, end index, whether the end is the last
/// scope).
pub fn window(ids: &[&str], resume_after: &str, limit: Option<usize>) -> (usize, usize, bool) {
    let start = if resume_after.is_empty() {
        0
    } else {
        ids.partition_point(|id| *id <= resume_after)
    };
    let end = match limit {
        Some(l) => (start + l).min(ids.len()),
        None => ids.len(),
    };
    (start, end, end == ids.len())
}

/// SpiceDB object id prefix of one source: `<namespace>/<name>/`, each part encoded. Every
/// object a source writes carries it, so one source's relationships are never another's.
pub fn source_prefix(namespace: &str, name: &str) -> String {
    format!("{}/{}/", encode(namespace), encode(name))
}

/// The object a source writes for an upstream id.
pub fn object(prefix: &str, kind: &str, upstream_id: &str) -> Obj {
    Obj::new(kind, format!("{prefix}{}", encode(upstream_id)))
}

/// What to write for one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub touch: Vec<Rel>,
    pub delete: Vec<Rel>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.touch.is_empty() && self.delete.is_empty()
    }

    /// Updates in batches SpiceDB accepts (≤ [`MAX_UPDATES`], no relationship twice).
    pub fn batches(&self) -> Vec<Vec<(Op, Rel)>> {
        let all: Vec<(Op, Rel)> = self
            .touch
            .iter()
            .map(|r| (Op::Touch, r.clone()))
            .chain(self.delete.iter().map(|r| (Op::Delete, r.clone())))
            .collect();
        all.chunks(MAX_UPDATES).map(<[_]>::to_vec).collect()
    }
}

/// Desired vs held for one object. Only held relations in `owned` are considered (a relation
/// this source never writes is never deleted); desired duplicates collapse.
pub fn diff(desired: &BTreeSet<Rel>, held: &[Rel], owned: &[&str]) -> Diff {
    let held: BTreeSet<&Rel> = held
        .iter()
        .filter(|r| owned.contains(&r.relation.as_str()))
        .collect();
    Diff {
        touch: desired
            .iter()
            .filter(|r| !held.contains(r))
            .cloned()
            .collect(),
        delete: held
            .into_iter()
            .filter(|r| !desired.contains(*r))
            .cloned()
            .collect(),
    }
}

/// Deletes sweeping every owned relationship of objects not in `keep` (scopes no longer
/// enumerated). Returns (objects swept, the deletes).
pub fn sweep(held: &[Rel], keep: &BTreeSet<Obj>, owned: &[&str]) -> (usize, Vec<Rel>) {
    let mut by_obj: BTreeMap<&Obj, Vec<Rel>> = BTreeMap::new();
    for r in held
        .iter()
        .filter(|r| !keep.contains(&r.resource) && owned.contains(&r.relation.as_str()))
    {
        by_obj.entry(&r.resource).or_default().push(r.clone());
    }
    let n = by_obj.len();
    (n, by_obj.into_values().flatten().collect())
}

/// How far this pass covered the source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub scoped: bool,
    pub enumeration_ok: bool,
    pub enumerated: usize,
    /// The pass started at the first scope (no resume point).
    pub from_start: bool,
    /// The pass reached the last scope.
    pub reached_end: bool,
    pub scope_errors: usize,
    pub cross_ok: bool,
}

/// Why cross-resource reaping did not run (`ReapDeferred=True`, this reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    Scoped,
    EnumerationFailed,
    EmptyEnumeration,
    PartialCoverage,
    ScopeErrors,
}

impl Deferral {
    pub fn reason(self) -> &'static str {
        match self {
            Self::Scoped => "ScopedPass",
            Self::EnumerationFailed => "EnumerationFailed",
            Self::EmptyEnumeration => "EmptyEnumeration",
            Self::PartialCoverage => "PartialCoverage",
            Self::ScopeErrors => "ScopeErrors",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Self::Scoped => "a scoped pass never reaps",
            Self::EnumerationFailed => {
                "scope enumeration did not complete; nothing outside the fetched scopes is pruned"
            }
            Self::EmptyEnumeration => {
                "the upstream enumerated zero scopes; kbind refuses to prune everything on an empty answer"
            }
            Self::PartialCoverage => {
                "this pass did not fetch every enumerated scope (maxScopesPerPass, --max-items, deadline or rate limits); cross-resource edges and vanished scopes are pruned only by a pass that covers all of them"
            }
            Self::ScopeErrors => {
                "some scopes failed this pass; cross-resource reaping waits for a pass where every scope succeeds"
            }
        }
    }
}

/// Reap only on a pass whose enumeration completed, was non-empty, and whose fetch covered
/// every enumerated scope without error.
pub fn reap_decision(c: &Coverage) -> Result<(), Deferral> {
    if c.scoped {
        return Err(Deferral::Scoped);
    }
    if !c.enumeration_ok || !c.cross_ok {
        return Err(Deferral::EnumerationFailed);
    }
    if c.enumerated == 0 {
        return Err(Deferral::EmptyEnumeration);
    }
    if !c.from_start || !c.reached_end {
        return Err(Deferral::PartialCoverage);
    }
    if c.scope_errors > 0 {
        return Err(Deferral::ScopeErrors);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
