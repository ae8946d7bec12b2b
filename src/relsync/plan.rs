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

/// `spec.sync.maxScopesPerPass` as a window limit: zero or absent is unbounded (spec 002: "Zero
/// → UNBOUNDED"); the CRD refuses negative values, which would also be unbounded here.
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
mod tests {
    use super::*;
    use crate::api::conditions::{ConditionStatus, Conditions};
    use crate::api::relsync::SyncProgress;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn rel(obj: &str, relation: &str, user: &str) -> Rel {
        Rel {
            resource: Obj::new("slack_channel", obj),
            relation: relation.into(),
            subject: Obj::new("user", user),
        }
    }

    #[test]
    fn intervals() {
        let ok = [
            (None, 900),
            (Some(""), 900),
            (Some("0"), 900),
            (Some("0s"), 900),
            (Some("15m"), 900),
            (Some("1h30m"), 5400),
            (Some("45s"), 45),
            (Some("1h0m0s"), 3600),
            (Some("1.5h"), 5400),
        ];
        for (s, secs) in ok {
            assert_eq!(
                parse_interval(s).unwrap(),
                Duration::from_secs(secs),
                "{s:?}"
            );
        }
        assert_eq!(
            parse_interval(Some("500ms")).unwrap(),
            Duration::from_millis(500)
        );
        for bad in [
            "15",
            "15x",
            "m",
            "1h30",
            "-5m",
            "fast",
            "8761h",
            "99999999999999999999h",
        ] {
            assert!(parse_interval(Some(bad)).is_err(), "{bad}");
        }
    }

    fn status(
        last: Option<i64>,
        generation: Option<i64>,
        ready: bool,
        started: bool,
        complete: bool,
    ) -> RelationshipSourceStatus {
        let mut conditions = Vec::new();
        conditions.set_condition(
            "Ready",
            ConditionStatus::from_bool(ready),
            "R",
            "",
            generation,
            Timestamp::from_second(1).unwrap(),
        );
        RelationshipSourceStatus {
            conditions,
            observed_generation: generation,
            sync: Some(SyncProgress {
                last_sync_time: last.map(|s| Time(Timestamp::from_second(s).unwrap())),
                cycle_started_at: started.then(|| Time(Timestamp::from_second(1).unwrap())),
                enum_complete: complete,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn due_table() {
        let i = Duration::from_secs(900);
        let cases = [
            // (status, generation, now, due, why)
            (None, Some(1), 1000, true, "never synced"),
            (
                Some(status(None, Some(1), true, false, false)),
                Some(1),
                1000,
                true,
                "no lastSyncTime",
            ),
            (
                Some(status(Some(1000), Some(1), true, true, true)),
                Some(1),
                1500,
                false,
                "interval not elapsed",
            ),
            (
                Some(status(Some(1000), Some(1), true, true, true)),
                Some(1),
                1900,
                true,
                "interval elapsed",
            ),
            (
                Some(status(Some(1000), Some(1), true, true, true)),
                Some(2),
                1001,
                true,
                "spec changed",
            ),
            (
                Some(status(Some(1000), Some(1), false, true, true)),
                Some(1),
                1001,
                true,
                "not Ready",
            ),
            (
                Some(status(Some(1000), Some(1), true, true, false)),
                Some(1),
                1001,
                true,
                "cycle in progress",
            ),
            (
                Some(status(Some(1000), Some(1), true, false, false)),
                Some(1),
                1001,
                false,
                "abandoned cycle waits",
            ),
        ];
        for (st, generation, now, want, why) in cases {
            assert_eq!(is_due(st.as_ref(), generation, i, now), want, "{why}");
        }
    }

    #[test]
    fn least_recently_synced_first() {
        let order = order_due(vec![
            ("b/big".into(), Some(50)),
            ("a/new".into(), None),
            ("c/old".into(), Some(10)),
            ("a/old".into(), Some(10)),
        ]);
        assert_eq!(order, ["a/new", "a/old", "c/old", "b/big"]);
    }

    #[test]
    fn max_scopes_per_pass_zero_or_absent_is_unbounded() {
        let cases = [
            (None, None),
            (Some(0), None),
            (Some(-1), None),
            (Some(1), Some(1)),
            (Some(250), Some(250)),
        ];
        for (field, want) in cases {
            assert_eq!(scope_limit(field), want, "{field:?}");
        }
        let ids = ["channel/A", "channel/B", "channel/C"];
        assert_eq!(window(&ids, "", scope_limit(Some(0))), (0, 3, true));
        assert_eq!(window(&ids, "", scope_limit(Some(2))), (0, 2, false));
    }

    #[test]
    fn the_order_key_is_the_last_pass_not_the_last_completed_cycle() {
        let at = |s| Some(Time(Timestamp::from_second(s).unwrap()));
        let st = |last_sync: Option<i64>, finished: Option<i64>| RelationshipSourceStatus {
            sync: Some(SyncProgress {
                last_sync_time: last_sync.and_then(at),
                last_pass: finished.map(|f| crate::api::relsync::LastPass {
                    finished_at: at(f),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(last_pass_time(None), None);
        assert_eq!(last_pass_time(Some(&st(None, None))), None);
        assert_eq!(last_pass_time(Some(&st(Some(10), None))), Some(10));
        // A cycle completed at 10, then passes that stopped partway until 50.
        assert_eq!(last_pass_time(Some(&st(Some(10), Some(50)))), Some(50));
        // Never completed, but had a pass at 50: behind a source last passed at 20.
        assert_eq!(last_pass_time(Some(&st(None, Some(50)))), Some(50));
        assert_eq!(
            order_due(vec![
                (
                    "a/partial".into(),
                    last_pass_time(Some(&st(None, Some(50))))
                ),
                (
                    "b/done".into(),
                    last_pass_time(Some(&st(Some(20), Some(20))))
                ),
            ]),
            ["b/done", "a/partial"]
        );
    }

    #[test]
    fn window_table() {
        let ids = ["channel/A", "channel/B", "channel/C", "usergroup/S1"];
        let cases = [
            ("", None, (0, 4, true)),
            ("", Some(2), (0, 2, false)),
            ("channel/B", Some(2), (2, 4, true)),
            ("channel/B", Some(1), (2, 3, false)),
            // The cursor scope vanished: resume at the next id in string order.
            ("channel/BB", Some(5), (2, 4, true)),
            ("usergroup/S1", None, (4, 4, true)),
            ("zzz", Some(1), (4, 4, true)),
        ];
        for (after, limit, want) in cases {
            assert_eq!(
                window(&ids, after, limit),
                want,
                "after {after:?} limit {limit:?}"
            );
        }
    }

    #[test]
    fn prefixes_never_overlap_between_sources() {
        let a = source_prefix("team-a", "slack");
        let b = source_prefix("team-a", "slack2");
        let c = source_prefix("team-a.x", "slack");
        assert_eq!(a, "team-a/slack/");
        assert!(!b.starts_with(&a) && !c.starts_with(&a));
        assert_eq!(object(&a, "slack_channel", "C1").id, "team-a/slack/C1");
    }

    #[test]
    fn diff_table() {
        let desired: BTreeSet<Rel> = [
            rel("o", "member", "a"),
            rel("o", "member", "b"),
            rel("o", "workspace", "w"),
        ]
        .into_iter()
        .collect();
        let held = vec![
            rel("o", "member", "b"),
            rel("o", "member", "c"),
            rel("o", "owner", "z"), // not ours: left alone
        ];
        let d = diff(&desired, &held, &["member", "workspace"]);
        assert_eq!(
            d.touch,
            vec![rel("o", "member", "a"), rel("o", "workspace", "w")]
        );
        assert_eq!(d.delete, vec![rel("o", "member", "c")]);
        // Unchanged: nothing to write.
        let held: Vec<Rel> = desired.iter().cloned().collect();
        assert!(diff(&desired, &held, &["member", "workspace"]).is_empty());
        // Empty upstream scope: an ordinary diff deleting every member.
        let d = diff(&BTreeSet::new(), &held, &["member", "workspace"]);
        assert_eq!(d.delete.len(), 3);
    }

    #[test]
    fn batches_never_exceed_the_cap() {
        let touch: Vec<Rel> = (0..2500)
            .map(|i| rel("o", "member", &format!("u{i}")))
            .collect();
        let d = Diff {
            touch,
            delete: vec![rel("o", "member", "gone")],
        };
        let b = d.batches();
        assert_eq!(
            b.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000, 501]
        );
        assert!(Diff::default().batches().is_empty());
    }

    #[test]
    fn sweep_only_objects_not_kept() {
        let held = vec![
            rel("p/s/C1", "member", "a"),
            rel("p/s/C2", "member", "a"),
            rel("p/s/C2", "workspace", "w"),
            rel("p/s/C2", "owner", "x"),
        ];
        let keep: BTreeSet<Obj> = [Obj::new("slack_channel", "p/s/C1")].into_iter().collect();
        let (n, del) = sweep(&held, &keep, &["member", "workspace"]);
        assert_eq!(n, 1);
        assert_eq!(
            del,
            vec![
                rel("p/s/C2", "member", "a"),
                rel("p/s/C2", "workspace", "w")
            ]
        );
    }

    #[test]
    fn reap_gate_table() {
        let full = Coverage {
            scoped: false,
            enumeration_ok: true,
            enumerated: 3,
            from_start: true,
            reached_end: true,
            scope_errors: 0,
            cross_ok: true,
        };
        assert_eq!(reap_decision(&full), Ok(()));
        let cases = [
            (
                Coverage {
                    scoped: true,
                    ..full.clone()
                },
                Deferral::Scoped,
            ),
            (
                Coverage {
                    enumeration_ok: false,
                    ..full.clone()
                },
                Deferral::EnumerationFailed,
            ),
            (
                Coverage {
                    cross_ok: false,
                    ..full.clone()
                },
                Deferral::EnumerationFailed,
            ),
            (
                Coverage {
                    enumerated: 0,
                    ..full.clone()
                },
                Deferral::EmptyEnumeration,
            ),
            (
                Coverage {
                    reached_end: false,
                    ..full.clone()
                },
                Deferral::PartialCoverage,
            ),
            (
                Coverage {
                    from_start: false,
                    ..full.clone()
                },
                Deferral::PartialCoverage,
            ),
            (
                Coverage {
                    scope_errors: 1,
                    ..full.clone()
                },
                Deferral::ScopeErrors,
            ),
        ];
        for (c, want) in cases {
            assert_eq!(reap_decision(&c), Err(want), "{c:?}");
        }
    }
}
