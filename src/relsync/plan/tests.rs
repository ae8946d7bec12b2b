//! Tests of `relsync::plan`.

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
