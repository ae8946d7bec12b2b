use super::*;
use serde_json::json;

const LOCAL: &str = "local-uid";

fn consumer() -> ConsumerObj {
    ConsumerObj {
        namespace: Some("ns".into()),
        name: "w".into(),
        uid: "u1".into(),
        spec: json!({"size": 1}).into(),
        has_finalizer: true,
        ..Default::default()
    }
}

fn provider(cluster: Option<&str>, object: Option<&str>) -> ProviderObj {
    ProviderObj {
        cluster_marker: cluster.map(String::from),
        object_marker: object.map(String::from),
        spec: json!({"size": 1}).into(),
        ..Default::default()
    }
}

fn live() -> BTreeSet<String> {
    BTreeSet::from(["u1".to_string(), "u2".to_string()])
}

#[test]
fn ownership_table() {
    let cases = [
        (None, None, Ownership::Unmarked),
        (Some(LOCAL), Some("u1"), Ownership::Ours),
        (Some(LOCAL), Some("gone"), Ownership::OurEarlierCopy),
        (Some(LOCAL), Some("u2"), Ownership::OwnedByAnother),
        (Some("other-cluster"), Some("u1"), Ownership::OwnedByAnother),
        (None, Some("u1"), Ownership::OwnedByAnother),
    ];
    for (c, o, want) in cases {
        assert_eq!(
            ownership(&provider(c, o), LOCAL, &consumer(), &live()),
            want,
            "{c:?} {o:?}"
        );
    }
}

/// (what, consumer, provider, policy, wanted actions, wanted standing)
type Row = (
    &'static str,
    ConsumerObj,
    Option<ProviderObj>,
    ConflictPolicy,
    Vec<Action>,
    Standing,
);

#[test]
fn live_object_table() {
    let with_status = ProviderObj {
        status: json!({"ready": true}).into(),
        ..provider(Some(LOCAL), Some("u1"))
    };
    let changed = ProviderObj {
        spec: json!({"size": 9}).into(),
        ..provider(Some(LOCAL), Some("u1"))
    };
    let cases: Vec<Row> = vec![
        (
            "new object",
            ConsumerObj {
                has_finalizer: false,
                ..consumer()
            },
            None,
            ConflictPolicy::Fail,
            vec![Action::AddFinalizer, Action::Create],
            Standing::Pending,
        ),
        (
            "in sync",
            consumer(),
            Some(provider(Some(LOCAL), Some("u1"))),
            ConflictPolicy::Fail,
            vec![],
            Standing::InSync,
        ),
        (
            "spec up",
            consumer(),
            Some(changed),
            ConflictPolicy::Fail,
            vec![Action::UpdateSpec],
            Standing::Pending,
        ),
        (
            "status down",
            consumer(),
            Some(with_status),
            ConflictPolicy::Fail,
            vec![Action::StatusDown(json!({"ready": true}).into())],
            Standing::InSync,
        ),
        (
            "foreign under Fail",
            consumer(),
            Some(provider(None, None)),
            ConflictPolicy::Fail,
            vec![Action::MarkConflict(FOREIGN_OBJECT_EXISTS)],
            Standing::Conflict,
        ),
        (
            "foreign under Fail, already marked",
            ConsumerObj {
                conflict: Some(FOREIGN_OBJECT_EXISTS.into()),
                ..consumer()
            },
            Some(provider(None, None)),
            ConflictPolicy::Fail,
            vec![],
            Standing::Conflict,
        ),
        (
            "foreign under Adopt",
            consumer(),
            Some(provider(None, None)),
            ConflictPolicy::Adopt,
            vec![Action::UpdateSpec],
            Standing::Pending,
        ),
        (
            "another owner even under Adopt",
            consumer(),
            Some(provider(Some("other"), Some("x"))),
            ConflictPolicy::Adopt,
            vec![Action::MarkConflict(OWNED_BY_ANOTHER)],
            Standing::Conflict,
        ),
        (
            "our earlier copy re-adopted",
            consumer(),
            Some(provider(Some(LOCAL), Some("gone"))),
            ConflictPolicy::Fail,
            vec![Action::UpdateSpec],
            Standing::Pending,
        ),
        (
            "conflict resolved clears the mark",
            ConsumerObj {
                conflict: Some(FOREIGN_OBJECT_EXISTS.into()),
                ..consumer()
            },
            Some(provider(Some(LOCAL), Some("u1"))),
            ConflictPolicy::Fail,
            vec![Action::ClearConflict],
            Standing::InSync,
        ),
    ];
    for (what, c, p, policy, want, standing) in cases {
        let (a, s) = plan_object(&c, p.as_ref(), LOCAL, &live(), policy, i64::MIN);
        assert_eq!(a, want, "{what}");
        assert_eq!(s, standing, "{what}");
    }
}

#[test]
fn deletion_table() {
    let deleting = ConsumerObj {
        deleting: true,
        ..consumer()
    };
    let ours = provider(Some(LOCAL), Some("u1"));
    let cases: Vec<(&str, ConsumerObj, Option<ProviderObj>, Vec<Action>)> = vec![
        (
            "delete our copy first",
            deleting.clone(),
            Some(ours.clone()),
            vec![Action::DeleteProvider],
        ),
        (
            "copy going: wait",
            deleting.clone(),
            Some(ProviderObj {
                deleting: true,
                ..ours.clone()
            }),
            vec![],
        ),
        (
            "copy going past the wait: release unconfirmed",
            ConsumerObj {
                deleting_since: Some(100),
                ..deleting.clone()
            },
            Some(ProviderObj {
                deleting: true,
                ..ours.clone()
            }),
            vec![Action::ReleaseUnconfirmed],
        ),
        (
            "copy going within the wait: wait",
            ConsumerObj {
                deleting_since: Some(1000),
                ..deleting.clone()
            },
            Some(ProviderObj {
                deleting: true,
                ..ours.clone()
            }),
            vec![],
        ),
        (
            "copy gone: release",
            deleting.clone(),
            None,
            vec![Action::ReleaseFinalizer],
        ),
        (
            "orphan: strip markers, release",
            ConsumerObj {
                orphan_on_delete: true,
                ..deleting.clone()
            },
            Some(ours),
            vec![Action::OrphanProvider, Action::ReleaseFinalizer],
        ),
        (
            "never delete a foreign object",
            deleting.clone(),
            Some(provider(None, None)),
            vec![Action::ReleaseFinalizer],
        ),
        (
            "never delete another's",
            deleting.clone(),
            Some(provider(Some("x"), Some("y"))),
            vec![Action::ReleaseFinalizer],
        ),
        (
            "no finalizer: nothing",
            ConsumerObj {
                has_finalizer: false,
                ..deleting
            },
            None,
            vec![],
        ),
    ];
    for (what, c, p, want) in cases {
        assert_eq!(
            plan_object(&c, p.as_ref(), LOCAL, &live(), ConflictPolicy::Fail, 500).0,
            want,
            "{what}"
        );
    }
}

#[test]
fn orphans_are_only_ours_without_a_live_owner() {
    let provider_objs = BTreeMap::from([
        ("ns/live".to_string(), provider(Some(LOCAL), Some("u1"))),
        (
            "ns/orphaned".to_string(),
            provider(Some(LOCAL), Some("dead")),
        ),
        ("ns/foreign".to_string(), provider(None, None)),
        (
            "ns/other".to_string(),
            provider(Some("other"), Some("dead")),
        ),
        ("ns/moved".to_string(), provider(Some(LOCAL), Some("u2"))),
    ]);
    let consumer_keys = BTreeSet::from(["ns/live".to_string()]);
    let found: Vec<_> = orphans(&provider_objs, &consumer_keys, LOCAL, &live())
        .iter()
        .map(|p| p.object_marker.clone())
        .collect();
    assert_eq!(found, [Some("dead".to_string())]);
}

#[test]
fn orphan_policy_table() {
    let unmarked = provider(Some(LOCAL), Some("dead"));
    let marked = ProviderObj {
        orphaned: Some(keys::ORPHANED_UNBOUND.into()),
        ..unmarked.clone()
    };
    let cases = [
        (
            &unmarked,
            OrphanPolicy::Keep,
            Some(OrphanAction::Mark(keys::ORPHANED_CONSUMER_OBJECT_GONE)),
        ),
        // Already reported (at the unbind or by an earlier run): nothing to write.
        (&marked, OrphanPolicy::Keep, None),
        (&marked, OrphanPolicy::Delete, Some(OrphanAction::Delete)),
        (
            &unmarked,
            OrphanPolicy::Restore,
            Some(OrphanAction::Restore),
        ),
        (&marked, OrphanPolicy::Restore, Some(OrphanAction::Restore)),
    ];
    for (p, policy, want) in cases {
        assert_eq!(
            plan_orphan(p, policy, Some("ns-uid")),
            want,
            "{policy:?} {:?}",
            p.orphaned
        );
    }
}

/// A copy is re-adopted or restored only into the namespace it came from (its UID), not into
/// one of the same name created again by someone else; a copy from before kbind recorded
/// namespaces (or a namespace of unknown UID) counts as the same. Existing copies get the
/// marker once.
#[test]
fn a_recreated_namespace_re_adopts_nothing() {
    let from = |ns: Option<&str>| ProviderObj {
        namespace_marker: ns.map(String::from),
        ..provider(Some(LOCAL), Some("gone"))
    };
    let mut c = consumer();
    c.namespace_uid = Some("ns-now".into());
    let never = BTreeSet::new();
    for (copy, want) in [
        (from(Some("ns-now")), Ownership::OurEarlierCopy),
        (from(Some("ns-before")), Ownership::FromRecreatedNamespace),
        (from(None), Ownership::OurEarlierCopy),
    ] {
        assert_eq!(ownership(&copy, LOCAL, &c, &never), want, "{copy:?}");
    }
    let unknown = ConsumerObj {
        namespace_uid: None,
        ..c.clone()
    };
    assert_eq!(
        ownership(&from(Some("ns-before")), LOCAL, &unknown, &never),
        Ownership::OurEarlierCopy
    );
    // Not taken over: a conflict that says why, then nothing more.
    let (a, st) = plan_object(
        &c,
        Some(&from(Some("ns-before"))),
        LOCAL,
        &never,
        ConflictPolicy::Adopt,
        i64::MIN,
    );
    assert_eq!(
        (a, st),
        (
            vec![Action::MarkConflict(keys::NAMESPACE_RECREATED)],
            Standing::Conflict
        )
    );
    let marked = ConsumerObj {
        conflict: Some(keys::NAMESPACE_RECREATED.into()),
        ..c.clone()
    };
    let (a, _) = plan_object(
        &marked,
        Some(&from(Some("ns-before"))),
        LOCAL,
        &never,
        ConflictPolicy::Fail,
        i64::MIN,
    );
    assert_eq!(a, vec![]);
    // Our live copy without the marker gets it once; with it, nothing.
    let plan = |p: &ProviderObj| {
        plan_object(&c, Some(p), LOCAL, &live(), ConflictPolicy::Fail, i64::MIN).0
    };
    let mut ours = provider(Some(LOCAL), Some("u1"));
    assert_eq!(plan(&ours), vec![Action::UpdateSpec]);
    ours.namespace_marker = Some("ns-now".into());
    assert_eq!(plan(&ours), vec![]);
    // Orphans: never restored into another namespace; marked once; Delete still deletes.
    let before = from(Some("ns-before"));
    let here = Some("ns-now");
    let mark = Some(OrphanAction::Mark(keys::NAMESPACE_RECREATED));
    assert_eq!(plan_orphan(&before, OrphanPolicy::Restore, here), mark);
    assert_eq!(plan_orphan(&before, OrphanPolicy::Keep, here), mark);
    assert_eq!(
        plan_orphan(&before, OrphanPolicy::Delete, here),
        Some(OrphanAction::Delete)
    );
    let reported = ProviderObj {
        orphaned: Some(keys::NAMESPACE_RECREATED.into()),
        ..before.clone()
    };
    assert_eq!(plan_orphan(&reported, OrphanPolicy::Restore, here), None);
    assert_eq!(
        plan_orphan(&from(Some("ns-now")), OrphanPolicy::Restore, here),
        Some(OrphanAction::Restore)
    );
}

#[test]
fn a_returning_consumer_object_re_adopts_an_orphan() {
    let orphan = ProviderObj {
        orphaned: Some(keys::ORPHANED_UNBOUND.into()),
        ..provider(Some(LOCAL), Some("gone"))
    };
    let (a, _) = plan_object(
        &consumer(),
        Some(&orphan),
        LOCAL,
        &live(),
        ConflictPolicy::Fail,
        i64::MIN,
    );
    assert_eq!(a, [Action::UpdateSpec, Action::ClearOrphaned]);
    // With the provider's status on it: that comes down in the same run, after the adoption.
    let with_status = ProviderObj {
        status: json!({"phase": "Ready"}).into(),
        ..orphan
    };
    let (a, standing) = plan_object(
        &consumer(),
        Some(&with_status),
        LOCAL,
        &live(),
        ConflictPolicy::Fail,
        i64::MIN,
    );
    assert_eq!(
        a,
        [
            Action::UpdateSpec,
            Action::ClearOrphaned,
            Action::StatusDown(json!({"phase": "Ready"}).into())
        ]
    );
    assert_eq!(standing, Standing::Pending);
}
