use super::*;
use crate::api::catalog::{ExportApi, ExportRef};
use k8s_openapi::api::rbac::v1::PolicyRule;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn api(name: &str) -> ResolvedApi {
    let (plural, group) = name.split_once('.').unwrap();
    ResolvedApi {
        name: name.into(),
        group: group.into(),
        plural: plural.into(),
    }
}

fn catalog() -> Catalog {
    let mut c = Catalog::default();
    for n in ["widgets.example.org", "gadgets.example.org"] {
        c.exported.insert(n.into(), api(n));
    }
    let export = |apis: &[&str], permissions: Vec<PolicyRule>| ExportSpec {
        description: String::new(),
        apis: apis
            .iter()
            .map(|a| ExportApi {
                name: a.to_string(),
            })
            .collect(),
        permissions,
    };
    let cm = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    c.exports.insert(
        "widgets".into(),
        export(&["widgets.example.org"], vec![cm.clone()]),
    );
    c.exports.insert(
        "both".into(),
        export(&["gadgets.example.org", "widgets.example.org"], vec![cm]),
    );
    c.exports
        .insert("broken".into(), export(&["nothere.example.org"], vec![]));
    c.collections.insert(
        "all".into(),
        CollectionSpec {
            description: String::new(),
            exports: vec![
                ExportRef {
                    name: "widgets".into(),
                },
                ExportRef {
                    name: "both".into(),
                },
            ],
        },
    );
    c
}

fn spec(export: Option<&str>, collection: Option<&str>) -> GrantSpec {
    GrantSpec {
        export: export.map(Into::into),
        collection: collection.map(Into::into),
        consumer: "team-a".into(),
        token_ttl: "24h".into(),
    }
}

fn cfg(now: i64) -> Config {
    Config {
        namespace: "kbind-grants".into(),
        server: "https://provider.example:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".to_vec(),
        reissue_before: None,
        now: t(now),
    }
}

#[test]
fn resolve_reports_each_way_a_grant_can_fail() {
    let c = catalog();
    let cases: [(GrantSpec, Result<Vec<&str>, &str>); 5] = [
        (spec(Some("widgets"), None), Ok(vec!["widgets.example.org"])),
        // A Collection: every Export's APIs, deduplicated and sorted.
        (
            spec(None, Some("all")),
            Ok(vec!["gadgets.example.org", "widgets.example.org"]),
        ),
        (spec(Some("nope"), None), Err(EXPORT_NOT_FOUND)),
        (spec(None, Some("nope")), Err(COLLECTION_NOT_FOUND)),
        (spec(Some("broken"), None), Err(API_NOT_EXPORTED)),
    ];
    for (s, want) in cases {
        let got = resolve(&s, &c)
            .map(|r| r.apis.iter().map(|a| a.name.clone()).collect::<Vec<_>>())
            .map_err(|b| b.reason);
        let want = want.map(|v| v.into_iter().map(String::from).collect::<Vec<_>>());
        assert_eq!(got, want, "{s:?}");
    }
    // Permissions shared by two Exports of a Collection are granted once.
    assert_eq!(
        resolve(&spec(None, Some("all")), &c)
            .unwrap()
            .permissions
            .len(),
        1
    );
    let broken = resolve(&spec(Some("broken"), None), &c).unwrap_err();
    assert!(broken.message.contains("nothere.example.org"), "{broken:?}");
}

#[test]
fn token_ttl_is_clamped_and_bad_text_blocks() {
    let mut s = spec(Some("widgets"), None);
    for (ttl, want) in [
        ("24h", Ok(Duration::from_secs(86400))),
        ("1m", Ok(MIN_TTL)),
        ("400h", Ok(MAX_TTL)),
        ("7d", Err(INVALID_TOKEN_TTL)),
    ] {
        s.token_ttl = ttl.into();
        assert_eq!(token_ttl(&s).map_err(|b| b.reason), want, "{ttl}");
    }
}

fn issued_with_secret(c: &Config, token: &str, expires: i64) -> Issued {
    Issued {
        sa_uid: Some("sa-1".into()),
        secret: Some(SecretObs {
            expires_at: Some(t(expires)),
            sa_uid: "sa-1".into(),
            token: Some(token.into()),
            kubeconfig: Some(render::kubeconfig(
                &c.server,
                &c.ca_pem,
                token,
                &c.namespace,
                "g",
            )),
        }),
        ..Default::default()
    }
}

#[test]
fn token_is_reissued_only_when_needed() {
    let day = Duration::from_secs(86400);
    let c = cfg(1_000_000);
    let fresh = issued_with_secret(&c, "tok", 1_000_000 + 86400);
    assert_eq!(
        token(&fresh, "g", day, &c),
        Token::Keep {
            expires_at: t(1_000_000 + 86400)
        }
    );
    // A third of the TTL is the default margin: 8h01m left keeps, 7h59m re-issues.
    let keep = issued_with_secret(&c, "tok", 1_000_000 + 8 * 3600 + 60);
    assert!(matches!(token(&keep, "g", day, &c), Token::Keep { .. }));
    let near = issued_with_secret(&c, "tok", 1_000_000 + 8 * 3600 - 60);
    assert!(matches!(token(&near, "g", day, &c), Token::Issue { .. }));
    // --reissue-before as long as the TTL: every run re-issues.
    let mut always = cfg(1_000_000);
    always.reissue_before = Some(day);
    assert!(matches!(
        token(&fresh, "g", day, &always),
        Token::Issue { .. }
    ));
    // Expired.
    let gone = issued_with_secret(&c, "tok", 999_000);
    assert!(matches!(token(&gone, "g", day, &c), Token::Issue { .. }));

    let mut cases: Vec<(&str, Issued)> = Vec::new();
    cases.push(("no Secret", Issued::default()));
    let mut recreated = fresh.clone();
    recreated.sa_uid = Some("sa-2".into());
    cases.push(("ServiceAccount re-created", recreated));
    let mut no_sa = fresh.clone();
    no_sa.sa_uid = None;
    cases.push(("ServiceAccount missing", no_sa));
    let mut no_token = fresh.clone();
    no_token.secret.as_mut().unwrap().token = None;
    cases.push(("no token", no_token));
    for (what, issued) in cases {
        assert!(
            matches!(token(&issued, "g", day, &c), Token::Issue { .. }),
            "{what}"
        );
    }
    // Another server URL: the kubeconfig no longer matches.
    let mut moved = cfg(1_000_000);
    moved.server = "https://elsewhere.example".into();
    assert!(matches!(
        token(&fresh, "g", day, &moved),
        Token::Issue { .. }
    ));
}

#[test]
fn the_pin_is_first_use_unique_and_never_moves() {
    let none = BTreeMap::new();
    let leases = vec![
        (t(20), "consumer-bbb".to_string()),
        (t(10), "consumer-aaa".to_string()),
        (t(5), "not-a-heartbeat".to_string()),
        (t(1), "consumer-bad'uid".to_string()),
    ];
    // The oldest valid heartbeat wins.
    assert_eq!(
        pin(None, &leases, &none),
        Pin::Pinned {
            uid: "aaa".into(),
            new: true
        }
    );
    // Recorded: kept whatever the Leases say.
    assert_eq!(
        pin(Some("zzz"), &leases, &none),
        Pin::Pinned {
            uid: "zzz".into(),
            new: false
        }
    );
    // A UID another Grant holds is skipped; when all are, say by whom.
    let others: BTreeMap<String, String> = [("aaa".to_string(), "other".to_string())].into();
    assert_eq!(
        pin(None, &leases, &others),
        Pin::Pinned {
            uid: "bbb".into(),
            new: true
        }
    );
    let both: BTreeMap<String, String> = [
        ("aaa".to_string(), "other".to_string()),
        ("bbb".to_string(), "third".to_string()),
    ]
    .into();
    assert_eq!(
        pin(None, &leases, &both),
        Pin::Taken {
            uid: "aaa".into(),
            by: "other".into()
        }
    );
    assert_eq!(pin(None, &[], &none), Pin::Waiting);
    for bad in ["", "a'b", "a\\b", "-a", &"x".repeat(64)] {
        assert!(!valid_uid(bad), "{bad}");
    }
    assert!(valid_uid("0d8f1c2e-1234-4abc-9def-0123456789ab"));
}

#[test]
fn an_unchanged_grant_plans_no_write() {
    let c = cfg(1_000_000);
    let cat = catalog();
    let s = spec(Some("widgets"), None);
    let mut issued = issued_with_secret(&c, "tok", 1_000_000 + 86400);
    let first = plan_grant(
        "g",
        &s,
        Some("uid-1"),
        &cat,
        &Issued::default(),
        &BTreeMap::new(),
        &c,
    )
    .unwrap();
    assert_eq!(first.writes.len(), Kind::ALL.len());
    assert!(matches!(first.token, Token::Issue { .. }));
    for d in &first.writes {
        issued.hashes.insert(d.kind, d.hash.clone());
    }
    let again = plan_grant("g", &s, Some("uid-1"), &cat, &issued, &BTreeMap::new(), &c).unwrap();
    assert!(again.writes.is_empty(), "{:?}", again.writes);
    assert!(matches!(again.token, Token::Keep { .. }));
    // Pinning changes the policy only.
    let unpinned = plan_grant("g", &s, None, &cat, &issued, &BTreeMap::new(), &c).unwrap();
    let kinds: Vec<Kind> = unpinned.writes.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, vec![Kind::Policy]);
    // Another Export: the ClusterRole and the policy change.
    let moved = plan_grant(
        "g",
        &spec(Some("both"), None),
        Some("uid-1"),
        &cat,
        &issued,
        &BTreeMap::new(),
        &c,
    )
    .unwrap();
    let kinds: Vec<Kind> = moved.writes.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        vec![Kind::Policy, Kind::ClusterRole],
        "the policy first: a failed policy write stops before RBAC reaches further"
    );
}

#[test]
fn issued_rules_are_exactly_the_contract() {
    let r = resolve(&spec(Some("widgets"), None), &catalog()).unwrap();
    let rules = render::cluster_rules(&r);
    let text: Vec<String> = rules.iter().map(|v| v.to_string()).collect();
    assert_eq!(
        text,
        vec![
            r#"{"apiGroups":["apiextensions.k8s.io"],"resources":["customresourcedefinitions"],"verbs":["list"]}"#,
            r#"{"apiGroups":["apiextensions.k8s.io"],"resourceNames":["widgets.example.org"],"resources":["customresourcedefinitions"],"verbs":["get"]}"#,
            r#"{"apiGroups":["example.org"],"resources":["widgets","widgets/status"],"verbs":["get","list","watch","create","update","patch","delete"]}"#,
            r#"{"apiGroups":["catalog.kbind.io"],"resourceNames":["widgets"],"resources":["exports"],"verbs":["get"]}"#,
            r#"{"apiGroups":[""],"resources":["namespaces"],"verbs":["create"]}"#,
            r#"{"apiGroups":[""],"resourceNames":["kube-system"],"resources":["namespaces"],"verbs":["get"]}"#,
            r#"{"apiGroups":["core.kcp.io"],"resourceNames":["cluster"],"resources":["logicalclusters"],"verbs":["get"]}"#,
            r#"{"apiGroups":[""],"resources":["configmaps"],"verbs":["get"]}"#,
        ]
    );
    let ns = render::namespace_rules("g");
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[1]["resourceNames"][0], "kbind-grant-g");
    assert!(
        !ns[0]["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "list")
    );
}

/// `kbind bind --export` with the issued kubeconfig reads the Export it was handed: a Grant of a
/// Collection may get each Export in it, and no other.
#[test]
fn the_issued_identity_may_get_its_own_exports_only() {
    let r = resolve(&spec(None, Some("all")), &catalog()).unwrap();
    assert_eq!(r.exports, vec!["both".to_string(), "widgets".to_string()]);
    let rules = render::cluster_rules(&r);
    let exports: Vec<&serde_json::Value> = rules
        .iter()
        .filter(|r| r["resources"][0] == "exports")
        .collect();
    assert_eq!(exports.len(), 1, "{rules:?}");
    assert_eq!(
        exports[0]["resourceNames"],
        serde_json::json!(["both", "widgets"])
    );
    assert_eq!(exports[0]["verbs"], serde_json::json!(["get"]));
}

/// The issued kubeconfig names its Grant's Secret, and kbind's own reading of it (what
/// `kbind bind` does without `--grant-secret`) finds it; the file still passes kbind's
/// Connection validation.
#[tokio::test]
async fn the_issued_kubeconfig_names_its_grant_secret() {
    let text = render::kubeconfig(
        "https://127.0.0.1:6443",
        b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "a-token-of-some-length",
        "kbind-grants",
        "acme",
    );
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    assert_eq!(
        crate::connection::issued_grant_secret(&kc),
        Ok(Some(("kbind-grants".into(), "kbind-grant-acme".into())))
    );
    let secret = k8s_openapi::api::core::v1::Secret {
        data: Some(std::collections::BTreeMap::from([(
            "kubeconfig".to_string(),
            k8s_openapi::ByteString(text.into_bytes()),
        )])),
        ..Default::default()
    };
    let r = crate::api::core::SecretKeyRef {
        namespace: "kbind-system".into(),
        name: "p".into(),
        key: "kubeconfig".into(),
    };
    let policy = crate::connection::CredentialPolicy::new(
        &crate::connection::CredentialArgs {
            credential_namespaces: vec!["kbind-system".into()],
            allow_kubeconfig_fields: vec![],
        },
        "kbind-system".into(),
    );
    assert!(
        crate::connection::kubeconfig(Some(&secret), &r, &policy)
            .await
            .is_ok()
    );
}

#[test]
fn revoke_deletes_the_identity_first_and_the_policy_last() {
    let mut issued = Issued::default();
    for k in Kind::ALL {
        issued.hashes.insert(k, String::new());
    }
    let order = revoke(&issued);
    assert_eq!(order.first(), Some(&Kind::ServiceAccount));
    assert_eq!(
        &order[order.len() - 2..],
        &[Kind::Policy, Kind::PolicyBinding]
    );
    assert!(revoke(&Issued::default()).is_empty());
}

#[test]
fn the_issued_kubeconfig_passes_connection_validation() {
    use k8s_openapi::api::core::v1::Secret;
    let c = cfg(0);
    let kc = render::kubeconfig(&c.server, &c.ca_pem, "tok", &c.namespace, "g");
    let s: Secret = serde_json::from_value(render::secret(
        &c.namespace,
        "g",
        &kc,
        "2026-01-01T00:00:00Z",
        "sa-1",
    ))
    .unwrap();
    let policy =
        crate::connection::CredentialPolicy::new(&Default::default(), "kbind-grants".into());
    let pk = crate::connection::kubeconfig::kubeconfig_from_secret(
        Some(&s),
        "kbind-grants",
        "kbind-grant-g",
        render::KUBECONFIG_KEY,
        &policy,
    )
    .unwrap();
    assert_eq!(pk.default_namespace, "kbind-grants");
    // http:// is refused by the same validation: the pass refuses such a --server-url.
    let kc = render::kubeconfig("http://p", &c.ca_pem, "tok", &c.namespace, "g");
    let s: Secret =
        serde_json::from_value(render::secret(&c.namespace, "g", &kc, "x", "sa-1")).unwrap();
    assert!(
        crate::connection::kubeconfig::kubeconfig_from_secret(
            Some(&s),
            "kbind-grants",
            "kbind-grant-g",
            render::KUBECONFIG_KEY,
            &policy
        )
        .is_err()
    );
}
