use super::*;

fn conn(name: &str, ready: &str, reason: &str, message: &str) -> Item {
    Item {
        namespace: None,
        name: name.into(),
        ready: Some(ready.into()),
        reason: reason.into(),
        message: message.into(),
        facts: Facts::Connection {
            connected: ready.into(),
            exported_apis: 2,
        },
    }
}

#[test]
fn the_table_lines_up_and_says_why_not_ready() {
    let report = Report {
        ready: false,
        kinds: vec![
            KindReport {
                kind: "Connection",
                group: "core.kbind.io",
                installed: true,
                items: vec![
                    conn("a", "True", "", ""),
                    conn(
                        "long-name",
                        "False",
                        "SecretMissing",
                        "Secret ns/x\nnot found",
                    ),
                ],
            },
            KindReport {
                kind: "CatalogEntry",
                group: "providers.kbind.io",
                installed: false,
                items: vec![],
            },
        ],
    };
    let t = table(&report);
    let want = "Connection.core.kbind.io
NAME        READY   CONNECTED   EXPORTS   REASON
a           True    True        2
long-name   False   False       2         SecretMissing: Secret ns/x not found

CatalogEntry.providers.kbind.io: not installed on this cluster (skipped)

Some kbind resources are not Ready (exit code 3).
";
    assert_eq!(t, want);
}

#[test]
fn an_object_without_a_ready_condition_is_not_ready_and_a_grant_never_counts() {
    let (r, reason, _) = ready(&[]);
    assert_eq!((r.as_str(), reason.as_str()), ("Unknown", "NotObserved"));
    let g = Item {
        namespace: Some("ns".into()),
        name: "g".into(),
        ready: None,
        reason: String::new(),
        message: String::new(),
        facts: Facts::Grant {
            workspace: "w".into(),
            provider: "p".into(),
            compositions: 1,
        },
    };
    assert!(!g.not_ready());
    assert!(conn("c", "Unknown", "", "").not_ready());
    assert!(!conn("c", "True", "", "").not_ready());
}

#[test]
fn long_messages_are_cut_in_the_table() {
    let i = conn("c", "False", "R", &"x".repeat(200));
    let cell = reason_cell(&i);
    assert_eq!(cell.chars().count(), MESSAGE_WIDTH);
    assert!(cell.ends_with('…'));
}

#[test]
fn the_service_kinds_get_their_columns_and_a_collection_never_counts() {
    let grant = |name: &str, pinned: Option<&str>| Item {
        namespace: None,
        name: name.into(),
        ready: Some("True".into()),
        reason: String::new(),
        message: String::new(),
        facts: Facts::IssuedGrant {
            consumer: "team-a".into(),
            export: (name == "g1").then(|| "widgets".into()),
            collection: (name == "g2").then(|| "all".into()),
            expires_at: pinned.map(|_| "2026-01-02T03:04:05Z".into()),
            consumer_cluster: pinned.map(String::from),
        },
    };
    let coll = Item {
        namespace: None,
        name: "all".into(),
        ready: None,
        reason: String::new(),
        message: String::new(),
        facts: Facts::Collection {
            exports: vec!["widgets".into(), "gadgets".into()],
        },
    };
    assert!(!coll.not_ready());
    let report = Report {
        ready: true,
        kinds: vec![
            KindReport {
                kind: "Collection",
                group: "catalog.kbind.io",
                installed: true,
                items: vec![coll],
            },
            KindReport {
                kind: "Grant",
                group: "iam.kbind.io",
                installed: true,
                items: vec![grant("g1", Some("uid-1")), grant("g2", None)],
            },
        ],
    };
    let want = "Collection.catalog.kbind.io
NAME   EXPORTS
all    widgets,gadgets

Grant.iam.kbind.io
NAME   READY   CONSUMER   FOR              EXPIRES                CONSUMER-CLUSTER   REASON
g1     True    team-a     export/widgets   2026-01-02T03:04:05Z   uid-1
g2     True    team-a     collection/all   -                      not-pinned

All kbind resources are Ready.
";
    assert_eq!(table(&report), want);
}
