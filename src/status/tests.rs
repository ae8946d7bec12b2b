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
