//! What a claims pass records on a CatalogEntry: the requirements hash of the cycle, the cursor
//! when the budget cut the cycle short, the cycle's counts, the requirements the export lacks,
//! and the conditions. The status is computed by pure functions ([`next_status`]) and written
//! by [`write`], one status apply per entry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use kube::{Api, Resource, ResourceExt};

use crate::api::conditions::{ConditionStatus, Conditions};
use crate::api::providers::{CatalogEntry, CatalogEntryStatus, Requirement};
use crate::pass::PassContext;
use crate::pass::status::apply_status;
use crate::pass::writes::Writes;

pub const READY: &str = "Ready";
pub const EXPORT_COMPLETE: &str = "ExportComplete";
pub const IDENTITY_KNOWN: &str = "IdentityKnown";
/// Whether kcp itself maintains some of the export's bindings (docs/claims.md "Bindings kcp
/// maintains").
pub const KCP_MAINTAINED: &str = "KcpMaintained";
/// `Ready=False` reason of a CatalogEntry naming the same APIExport as an older one.
pub const DUPLICATE_ENTRY: &str = "DuplicateEntry";

/// What stopped an entry from being reconciled at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// `ExportNotFound`, `PermissionDenied`, `ExportUnreadable` or `DuplicateEntry`.
    pub reason: &'static str,
    pub message: String,
}

/// An export identity the run could not read, so claims carrying it were treated as
/// compositions (`IdentityKnown=False`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityGap {
    /// `ExportIdentityUnknown` or `CoreIdentityUnknown`.
    pub reason: &'static str,
    pub message: String,
}

/// A binding kbind left alone because kcp maintains it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaintainedBinding {
    /// The logical cluster.
    pub workspace: String,
    pub binding: String,
    /// The WorkspaceType (`<path>:<name>`) whose `Maintain` lifecycle owns it, or why that
    /// could not be read (then it is not written either: writing might start the fight).
    pub by: Result<String, String>,
}

/// One entry's share of a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryOutcome {
    pub requirements_hash: String,
    /// Whether this run continued a cycle an earlier run left unfinished.
    pub resumed: bool,
    /// Key of the last binding handled when the budget stopped the cycle; `None` when the cycle
    /// reached its end.
    pub stopped_after: Option<String>,
    pub checked: i64,
    pub updated: i64,
    pub failed: i64,
    pub missing_on_export: Vec<Requirement>,
    pub blocked: Option<Blocked>,
    /// `None` when every identity own requirements are recognised by could be read.
    pub identity_gap: Option<IdentityGap>,
    pub maintained: Vec<MaintainedBinding>,
}

/// Where a run starts for this entry: after the recorded cursor when it continues a cycle for
/// the same requirements, else from the beginning.
pub fn resume_point(prev: &CatalogEntryStatus, requirements_hash: &str) -> Option<String> {
    (!prev.cursor.is_empty() && prev.requirements_hash == requirements_hash)
        .then(|| prev.cursor.clone())
}

/// The status after this run.
pub fn next_status(
    prev: &CatalogEntryStatus,
    generation: Option<i64>,
    outcome: &EntryOutcome,
    now: Timestamp,
) -> CatalogEntryStatus {
    let mut st = prev.clone();
    st.observed_generation = generation;
    st.last_pass_time = Some(Time(now));
    let set = |st: &mut CatalogEntryStatus, t: &str, s: ConditionStatus, r: &str, m: &str| {
        st.conditions.set_condition(t, s, r, m, generation, now);
    };
    if let Some(b) = &outcome.blocked {
        set(&mut st, READY, ConditionStatus::False, b.reason, &b.message);
        return st;
    }
    st.requirements_hash.clone_from(&outcome.requirements_hash);
    let (base_checked, base_updated) = if outcome.resumed {
        (prev.bindings_checked, prev.bindings_updated)
    } else {
        (0, 0)
    };
    st.bindings_checked = base_checked + outcome.checked;
    st.bindings_updated = base_updated + outcome.updated;
    st.cursor = outcome.stopped_after.clone().unwrap_or_default();
    st.missing_on_export.clone_from(&outcome.missing_on_export);

    let (status, reason, message) = ready(&st, outcome);
    set(&mut st, READY, status, reason, &message);
    let (status, reason, message) = identity_known(outcome.identity_gap.as_ref());
    set(&mut st, IDENTITY_KNOWN, status, reason, &message);
    let (status, reason, message) = kcp_maintained(&outcome.maintained);
    set(&mut st, KCP_MAINTAINED, status, reason, &message);
    let (status, reason, message) = export_complete(&outcome.missing_on_export);
    set(&mut st, EXPORT_COMPLETE, status, reason, &message);
    st
}

/// The `Ready` condition of an entry whose export could be read: this cycle's counts so far
/// (`st`), whether the budget stopped it and whether writes failed.
fn ready(
    st: &CatalogEntryStatus,
    outcome: &EntryOutcome,
) -> (ConditionStatus, &'static str, String) {
    let counts = format!(
        "{} bindings checked, {} updated this cycle",
        st.bindings_checked, st.bindings_updated
    );
    match (&outcome.stopped_after, outcome.failed) {
        (Some(after), _) => (
            ConditionStatus::False,
            "InProgress",
            format!("{counts}; the budget ended the run after {after}, the next run resumes there"),
        ),
        (None, 0) => (ConditionStatus::True, "InStep", counts),
        (None, n) => (
            ConditionStatus::False,
            "WritesFailed",
            format!("{counts}; {n} binding writes failed this run (see Events)"),
        ),
    }
}

/// The `IdentityKnown` condition: whether every identity own claims are recognised by was read.
fn identity_known(gap: Option<&IdentityGap>) -> (ConditionStatus, &'static str, String) {
    match gap {
        None => (
            ConditionStatus::True,
            "IdentitiesRead",
            "claims carrying the APIExport's own identityHash (or the core export's, or none) are the provider's own; any other identityHash is a composition needing the workspace's Grant".into(),
        ),
        Some(gap) => (ConditionStatus::False, gap.reason, gap.message.clone()),
    }
}

/// The `ExportComplete` condition: the requirements the APIExport does not list, if any.
fn export_complete(missing: &[Requirement]) -> (ConditionStatus, &'static str, String) {
    if missing.is_empty() {
        return (
            ConditionStatus::True,
            "AllRequirementsExported",
            "the APIExport lists every requirement".into(),
        );
    }
    let names: Vec<String> = missing
        .iter()
        .map(|r| {
            if r.group.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.group, r.resource)
            }
        })
        .collect();
    (
        ConditionStatus::False,
        "RequirementsMissingOnExport",
        format!(
            "not claimed because the APIExport does not list them: {} (run `kbind claims export` to render its claims)",
            names.join(", ")
        ),
    )
}

/// The `KcpMaintained` condition: which bindings kcp maintains (named, the first few), and any
/// whose WorkspaceType could not be read.
fn kcp_maintained(maintained: &[MaintainedBinding]) -> (ConditionStatus, &'static str, String) {
    const SHOWN: usize = 3;
    let name = |m: &MaintainedBinding| format!("workspace {} binding {}", m.workspace, m.binding);
    let listed = |items: Vec<String>| {
        let more = items.len().saturating_sub(SHOWN);
        let mut text = items.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
        if more > 0 {
            text.push_str(&format!(" and {more} more"));
        }
        text
    };
    let unknown: Vec<String> = maintained
        .iter()
        .filter_map(|m| m.by.as_ref().err().map(|e| format!("{} ({e})", name(m))))
        .collect();
    if !unknown.is_empty() {
        return (
            ConditionStatus::Unknown,
            "MaintainUnknown",
            format!(
                "cannot tell whether kcp maintains these default bindings, so kbind does not write them: {}",
                listed(unknown)
            ),
        );
    }
    let owned: Vec<String> = maintained
        .iter()
        .filter_map(|m| {
            m.by.as_ref()
                .ok()
                .map(|t| format!("{} (WorkspaceType {t})", name(m)))
        })
        .collect();
    if owned.is_empty() {
        return (
            ConditionStatus::False,
            "NoneMaintained",
            "kcp maintains none of this export's bindings; kbind writes their claims".into(),
        );
    }
    (
        ConditionStatus::True,
        "DefaultAPIBindingLifecycleMaintain",
        format!(
            "kcp maintains the claims of {} binding(s) (defaultAPIBindingLifecycle: Maintain accepts every claim of the export) and kbind leaves them to kcp: {}",
            owned.len(),
            listed(owned)
        ),
    )
}

/// Record the entry's outcome in its status (one write per entry per run).
pub(super) async fn write(
    ctx: &PassContext,
    entry: &CatalogEntry,
    outcome: &EntryOutcome,
    manager: &str,
    writes: &mut Writes,
) {
    let prev = entry.status.clone().unwrap_or_default();
    let next = next_status(&prev, entry.meta().generation, outcome, Timestamp::now());
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
            tracing::warn!(entry = %name, error = %e, "status not recorded")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn reason(st: &CatalogEntryStatus, t: &str) -> (String, String) {
        let c = st.conditions.condition(t).unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn a_resumed_cycle_accumulates_counts_and_a_new_one_starts_over() {
        let prev = CatalogEntryStatus {
            requirements_hash: "h".into(),
            cursor: "ws1|b".into(),
            bindings_checked: 10,
            bindings_updated: 4,
            ..Default::default()
        };
        let mut out = EntryOutcome {
            requirements_hash: "h".into(),
            resumed: true,
            checked: 5,
            updated: 1,
            ..Default::default()
        };
        let st = next_status(&prev, Some(2), &out, now());
        assert_eq!((st.bindings_checked, st.bindings_updated), (15, 5));
        assert_eq!(
            reason(&st, IDENTITY_KNOWN),
            ("True".into(), "IdentitiesRead".into())
        );
        assert_eq!(st.cursor, "");
        assert_eq!(reason(&st, READY), ("True".into(), "InStep".into()));
        assert_eq!(st.observed_generation, Some(2));

        out.resumed = false;
        let st = next_status(&prev, Some(2), &out, now());
        assert_eq!((st.bindings_checked, st.bindings_updated), (5, 1));
    }

    #[test]
    fn resume_only_for_the_same_requirements() {
        let prev = CatalogEntryStatus {
            requirements_hash: "h".into(),
            cursor: "ws|b".into(),
            ..Default::default()
        };
        assert_eq!(resume_point(&prev, "h"), Some("ws|b".into()));
        assert_eq!(resume_point(&prev, "other"), None);
        assert_eq!(resume_point(&CatalogEntryStatus::default(), ""), None);
    }

    #[test]
    fn kcp_maintained_names_the_bindings_and_an_unreadable_type_is_unknown() {
        let prev = CatalogEntryStatus::default();
        let m = |ws: &str, by: Result<&str, &str>| MaintainedBinding {
            workspace: ws.into(),
            binding: format!("compute-{ws}"),
            by: by.map(String::from).map_err(String::from),
        };
        let st = next_status(&prev, None, &EntryOutcome::default(), now());
        assert_eq!(
            reason(&st, KCP_MAINTAINED),
            ("False".into(), "NoneMaintained".into())
        );
        let owned: Vec<_> = (0..5).map(|i| m(&format!("w{i}"), Ok("root:m"))).collect();
        let st = next_status(
            &prev,
            None,
            &EntryOutcome {
                maintained: owned.clone(),
                ..Default::default()
            },
            now(),
        );
        assert_eq!(
            reason(&st, KCP_MAINTAINED),
            ("True".into(), "DefaultAPIBindingLifecycleMaintain".into())
        );
        let msg = &st.conditions.condition(KCP_MAINTAINED).unwrap().message;
        assert!(
            msg.contains("5 binding(s)")
                && msg.contains("workspace w0 binding compute-w0 (WorkspaceType root:m)")
                && msg.contains("and 2 more"),
            "{msg}"
        );
        assert_eq!(reason(&st, READY), ("True".into(), "InStep".into()));
        let mut mixed = owned;
        mixed.push(m("w9", Err("reading WorkspaceType root:m: forbidden")));
        let st = next_status(
            &prev,
            None,
            &EntryOutcome {
                maintained: mixed,
                ..Default::default()
            },
            now(),
        );
        assert_eq!(
            reason(&st, KCP_MAINTAINED),
            ("Unknown".into(), "MaintainUnknown".into())
        );
        let msg = &st.conditions.condition(KCP_MAINTAINED).unwrap().message;
        assert!(msg.contains("w9") && msg.contains("forbidden"), "{msg}");
    }

    #[test]
    fn conditions_say_what_happened() {
        let prev = CatalogEntryStatus::default();
        let stopped = EntryOutcome {
            stopped_after: Some("ws|b".into()),
            missing_on_export: vec![Requirement {
                group: "x.io".into(),
                resource: "things".into(),
                provider: None,
            }],
            ..Default::default()
        };
        let st = next_status(&prev, None, &stopped, now());
        assert_eq!(st.cursor, "ws|b");
        assert_eq!(reason(&st, READY), ("False".into(), "InProgress".into()));
        assert_eq!(
            reason(&st, EXPORT_COMPLETE),
            ("False".into(), "RequirementsMissingOnExport".into())
        );
        let msg = &st.conditions.condition(EXPORT_COMPLETE).unwrap().message;
        assert!(msg.contains("x.io/things"), "{msg}");

        let failed = EntryOutcome {
            failed: 2,
            ..Default::default()
        };
        let st = next_status(&prev, None, &failed, now());
        assert_eq!(reason(&st, READY), ("False".into(), "WritesFailed".into()));

        let unknown = EntryOutcome {
            identity_gap: Some(IdentityGap {
                reason: "ExportIdentityUnknown",
                message: "APIExport x has no status.identityHash".into(),
            }),
            ..Default::default()
        };
        let st = next_status(&prev, None, &unknown, now());
        assert_eq!(
            reason(&st, IDENTITY_KNOWN),
            ("False".into(), "ExportIdentityUnknown".into())
        );
        assert_eq!(reason(&st, READY), ("True".into(), "InStep".into()));

        let blocked = EntryOutcome {
            blocked: Some(Blocked {
                reason: "ExportNotFound",
                message: "APIExport x not found".into(),
            }),
            ..Default::default()
        };
        let prev_done = CatalogEntryStatus {
            requirements_hash: "old".into(),
            bindings_checked: 3,
            ..Default::default()
        };
        let st = next_status(&prev_done, None, &blocked, now());
        assert_eq!(
            reason(&st, READY),
            ("False".into(), "ExportNotFound".into())
        );
        assert_eq!(
            st.requirements_hash, "old",
            "a blocked run records no new cycle"
        );
        assert_eq!(st.bindings_checked, 3);
    }
}
