use super::*;
use crate::api::catalog::{ClusterScopedAccess, ExportApi, ExportRef};
use crate::issue::args::Confinement;
use crate::issue::render::Desired;
use k8s_openapi::api::rbac::v1::PolicyRule;

/// The Grant of every plan here, with the UID the apiserver gave it.
const G: GrantRef<'static> = GrantRef {
    name: "g",
    uid: "0b5e4c6a-grant-uid",
    created: None,
};

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn api(name: &str) -> ResolvedApi {
    let (plural, group) = name.split_once('.').unwrap();
    ResolvedApi {
        name: name.into(),
        group: group.into(),
        plural: plural.into(),
        namespaced: !plural.starts_with("cluster"),
        version: "v1".into(),
    }
}

/// Plan `s` as the only Grant, on a provider with no namespaces yet.
fn plan_alone(
    s: &GrantSpec,
    pin: Option<&str>,
    cat: &Catalog,
    issued: &Issued,
    c: &Config,
) -> Result<GrantPlan, Blocked> {
    let tenancy = tenancy(
        &[GrantView {
            name: "g",
            created: None,
            spec: s,
        }],
        cat,
    );
    let p = Provider {
        catalog: cat,
        tenancy: &tenancy,
        namespaces: &BTreeSet::new(),
        in_use: &BTreeMap::new(),
        handover: &BTreeMap::new(),
        cfg: c,
    };
    plan_grant(G, s, pin, None, issued, &BTreeMap::new(), &p)
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
        cluster_scoped_access: ClusterScopedAccess::Exclusive,
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
        namespaces: vec!["team-a".into()],
    }
}

fn cfg(now: i64) -> Config {
    Config {
        namespace: "kbind-grants".into(),
        server: "https://provider.example:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".to_vec(),
        reissue_before: None,
        now: t(now),
        confinement: Confinement::PerGrant,
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

fn lease(at: i64, name: &str, cluster: Option<&str>) -> Heartbeat {
    Heartbeat {
        created: t(at),
        name: name.into(),
        cluster: cluster.map(Into::into),
    }
}

/// A heartbeat written before the Grant existed (for an earlier Grant of the same name, whose
/// kubeconfig may have been stolen) pins nothing and is deleted; one written after pins.
#[test]
fn a_heartbeat_older_than_its_grant_pins_nothing_and_goes() {
    let c = cfg(0);
    let cat = catalog();
    let s = spec(Some("widgets"), None);
    let tenancy = tenancy(
        &[GrantView {
            name: "g",
            created: Some(t(100)),
            spec: &s,
        }],
        &cat,
    );
    let p = Provider {
        catalog: &cat,
        tenancy: &tenancy,
        namespaces: &BTreeSet::new(),
        in_use: &BTreeMap::new(),
        handover: &BTreeMap::new(),
        cfg: &c,
    };
    let g = GrantRef {
        created: Some(t(100)),
        ..G
    };
    // Before the Grant: an earlier Grant's.
    for at in [90, 99] {
        let issued = Issued {
            leases: vec![lease(at, "kbind-grant-g", Some("thief"))],
            ..Default::default()
        };
        let plan = plan_grant(g, &s, None, None, &issued, &BTreeMap::new(), &p).unwrap();
        assert_eq!(plan.pin, Pin::Waiting, "{at}");
        assert_eq!(plan.stale_leases, ["kbind-grant-g"], "{at}");
        assert!(candidates(g, &issued.leases).is_empty(), "{at}");
    }
    // Created in the Grant's second (whole seconds) or after: the consumer's own.
    let issued = Issued {
        leases: vec![lease(100, "kbind-grant-g", Some("mine"))],
        ..Default::default()
    };
    let plan = plan_grant(g, &s, None, None, &issued, &BTreeMap::new(), &p).unwrap();
    assert_eq!(
        plan.pin,
        Pin::Pinned {
            uid: "mine".into(),
            new: true
        }
    );
    assert!(plan.stale_leases.is_empty());
    assert_eq!(candidates(g, &issued.leases), ["mine"]);
    assert!(!plan.stale_identity);

    // A ServiceAccount owned by an earlier Grant of this name (re-created before the collector
    // came): deleted and issued anew, whatever its token's age.
    let issued = Issued {
        sa_owner: Some("an-earlier-grant".into()),
        ..issued
    };
    let plan = plan_grant(g, &s, None, None, &issued, &BTreeMap::new(), &p).unwrap();
    assert!(plan.stale_identity);
    assert!(
        matches!(plan.token, Token::Issue { .. }),
        "{:?}",
        plan.token
    );
    assert!(plan.writes.iter().any(|d| d.kind == Kind::ServiceAccount));
    let own = Issued {
        sa_owner: Some(G.uid.into()),
        ..issued
    };
    let plan = plan_grant(g, &s, None, None, &own, &BTreeMap::new(), &p).unwrap();
    assert!(!plan.stale_identity);
}

/// A namespace (or exclusive cluster-scoped API) this Grant would newly hold that holds another
/// consumer's objects blocks it, saying how to let it pass; nothing new is issued meanwhile.
#[test]
fn a_handover_of_another_consumers_objects_needs_a_person() {
    let c = cfg(0);
    let cat = catalog();
    let s = spec(Some("widgets"), None);
    let tenancy = tenancy(
        &[GrantView {
            name: "g",
            created: None,
            spec: &s,
        }],
        &cat,
    );
    let handover: BTreeMap<String, Vec<(String, handover::Finding)>> = [(
        "g".to_string(),
        vec![(
            "namespace team-a".to_string(),
            handover::Finding::Object("widgets.example.org team-a/w".to_string()),
        )],
    )]
    .into();
    let p = Provider {
        catalog: &cat,
        tenancy: &tenancy,
        namespaces: &BTreeSet::new(),
        in_use: &BTreeMap::new(),
        handover: &handover,
        cfg: &c,
    };
    let b = plan_grant(G, &s, None, None, &Issued::default(), &BTreeMap::new(), &p).unwrap_err();
    assert_eq!(b.reason, HANDOVER_APPROVAL_REQUIRED);
    assert!(
        b.message.contains("namespace team-a holds another consumer's objects (such as widgets.example.org team-a/w)")
            && b.message.contains("kubectl annotate grant g iam.kbind.io/approve-handover=team-a"),
        "{}",
        b.message
    );
    assert!(is_isolation(b.reason));
    // Never issued: reducing creates nothing.
    assert_eq!(reduce(G, &s, &Issued::default(), &p), Reduction::default());
    // Another Grant's handover is not this one's.
    let elsewhere: BTreeMap<String, Vec<(String, handover::Finding)>> =
        [("h".to_string(), handover["g"].clone())].into();
    let p = Provider {
        handover: &elsewhere,
        ..p
    };
    assert!(plan_grant(G, &s, None, None, &Issued::default(), &BTreeMap::new(), &p).is_ok());
}

#[test]
fn the_pin_is_first_use_unique_approved_when_in_use_and_never_moves() {
    let none: BTreeMap<String, String> = BTreeMap::new();
    let free = InUse::new();
    let pinned = |uid: &str| Pin::Pinned {
        uid: uid.into(),
        new: true,
    };
    let leases = vec![
        lease(20, "consumer-bbb", None),
        lease(10, "consumer-aaa", None),
        lease(5, "not-a-heartbeat", None),
        lease(1, "consumer-bad'uid", None),
        // Another Grant's name: never this Grant's heartbeat, whatever its label says.
        lease(0, "kbind-grant-other", Some("zzz")),
    ];
    let at = |recorded, leases: &[Heartbeat], others, in_use: &InUse, approved| {
        pin(&PinInputs {
            grant: "g",
            recorded,
            leases,
            others,
            in_use,
            approved,
        })
    };
    // The oldest valid heartbeat wins.
    assert_eq!(at(None, &leases, &none, &free, None), pinned("aaa"));
    // The Grant's own Lease names its cluster in a label (a bad value is no candidate).
    let own = vec![lease(30, "kbind-grant-g", Some("ccc"))];
    assert_eq!(at(None, &own, &none, &free, None), pinned("ccc"));
    let bad = vec![lease(30, "kbind-grant-g", Some("c'c"))];
    assert_eq!(at(None, &bad, &none, &free, None), Pin::Waiting);
    // Recorded: kept whatever the Leases say.
    assert_eq!(
        at(Some("zzz"), &leases, &none, &free, None),
        Pin::Pinned {
            uid: "zzz".into(),
            new: false
        }
    );
    // A UID another Grant holds is skipped; when all are, say by whom.
    let others: BTreeMap<String, String> = [("aaa".to_string(), "other".to_string())].into();
    assert_eq!(at(None, &leases, &others, &free, None), pinned("bbb"));
    let both: BTreeMap<String, String> = [
        ("aaa".to_string(), "other".to_string()),
        ("bbb".to_string(), "third".to_string()),
    ]
    .into();
    assert_eq!(
        at(None, &leases, &both, &free, None),
        Pin::Taken {
            uid: "aaa".into(),
            by: "other".into()
        }
    );
    // A UID provider objects already carry: only with a person's approval of that UID.
    let in_use: InUse = [(
        "ccc".to_string(),
        vec![(
            Holder::Grant("h".into()),
            "widgets.example.org a/w".to_string(),
        )],
    )]
    .into();
    let needs = Pin::NeedsApproval {
        uid: "ccc".into(),
        why: "its objects already exist on the provider (such as widgets.example.org a/w, of Grant h)".into(),
    };
    assert_eq!(at(None, &own, &none, &in_use, None), needs);
    assert_eq!(at(None, &own, &none, &in_use, Some("other-uid")), needs);
    assert_eq!(at(None, &own, &none, &in_use, Some("ccc")), pinned("ccc"));
    // Objects no Grant holds alone (left by a revoked Grant) too.
    let left: InUse = [(
        "ccc".to_string(),
        vec![(Holder::Nobody, "widgets.example.org gone/w".to_string())],
    )]
    .into();
    assert_eq!(
        at(None, &own, &none, &left, None),
        Pin::NeedsApproval {
            uid: "ccc".into(),
            why: "its objects already exist on the provider (such as widgets.example.org gone/w, which no Grant holds alone)".into(),
        }
    );
    assert_eq!(at(None, &own, &none, &left, Some("ccc")), pinned("ccc"));
    // Where the issuer could not look: the same approval, saying so.
    let unchecked: InUse = [(
        "ccc".to_string(),
        vec![(
            Holder::Unchecked,
            "listing widgets.example.org: forbidden".to_string(),
        )],
    )]
    .into();
    assert_eq!(
        at(None, &own, &none, &unchecked, None),
        Pin::NeedsApproval {
            uid: "ccc".into(),
            why:
                "the issuer could not look for its objects (listing widgets.example.org: forbidden)"
                    .into(),
        }
    );
    assert_eq!(
        at(None, &own, &none, &unchecked, Some("ccc")),
        pinned("ccc")
    );
    // Objects where this Grant holds them too: handed over to it, it wrote none (an unpinned
    // identity writes nothing).
    let own_objects: InUse = [(
        "ccc".to_string(),
        vec![(
            Holder::Grant("g".into()),
            "widgets.example.org g/w".to_string(),
        )],
    )]
    .into();
    assert_eq!(
        at(None, &own, &none, &own_objects, None),
        Pin::NeedsApproval {
            uid: "ccc".into(),
            why: "its objects already exist on the provider (such as widgets.example.org g/w, handed over to this Grant, which wrote none of them: it writes nothing before its pin)".into(),
        }
    );
    // An object found is named before a LIST that failed.
    let mixed: InUse = [(
        "ccc".to_string(),
        vec![
            (
                Holder::Unchecked,
                "listing a.example.org: forbidden".to_string(),
            ),
            (Holder::Nobody, "widgets.example.org gone/w".to_string()),
        ],
    )]
    .into();
    assert!(matches!(
        at(None, &own, &none, &mixed, None),
        Pin::NeedsApproval { why, .. } if why.contains("gone/w")
    ));
    let none_in_use = BTreeMap::new();
    assert_eq!(at(None, &[], &none, &none_in_use, None), Pin::Waiting);
    assert_eq!(candidates(G, &own), vec!["ccc".to_string()]);
    assert!(candidates(G, &bad).is_empty());
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
    let first = plan_alone(&s, Some("uid-1"), &cat, &Issued::default(), &c).unwrap();
    // Seven per Grant, two per namespace.
    assert_eq!(first.writes.len(), 9);
    assert_eq!(first.create_namespaces, vec!["team-a".to_string()]);
    assert!(matches!(first.token, Token::Issue { .. }));
    for d in &first.writes {
        issued.hashes.insert(d.slot(), d.hash.clone());
    }
    let again = plan_alone(&s, Some("uid-1"), &cat, &issued, &c).unwrap();
    assert!(again.writes.is_empty(), "{:?}", again.writes);
    assert!(again.stale.is_empty());
    assert!(matches!(again.token, Token::Keep { .. }));
    // Pinning changes the policy only.
    let unpinned = plan_alone(&s, None, &cat, &issued, &c).unwrap();
    let kinds: Vec<Kind> = unpinned.writes.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, vec![Kind::Policy]);
    // Another Export: the policy and the namespace's Role change (both APIs are namespaced).
    let moved = plan_alone(&spec(Some("both"), None), Some("uid-1"), &cat, &issued, &c).unwrap();
    let kinds: Vec<Kind> = moved.writes.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        vec![Kind::Policy, Kind::ClusterRole, Kind::TenantRole],
        "the policy first: a failed policy write stops before RBAC reaches further"
    );
    // Another namespace: its RBAC is written, the old namespace's is deleted (binding first).
    let mut elsewhere = s.clone();
    elsewhere.namespaces = vec!["team-b".into()];
    let moved = plan_alone(&elsewhere, Some("uid-1"), &cat, &issued, &c).unwrap();
    let slots: Vec<Slot> = moved.writes.iter().map(Desired::slot).collect();
    assert_eq!(
        slots,
        vec![
            (Kind::TenantRole, "team-b".to_string()),
            (Kind::TenantRoleBinding, "team-b".to_string())
        ]
    );
    assert_eq!(
        moved.stale,
        vec![
            (Kind::TenantRoleBinding, "team-a".to_string()),
            (Kind::TenantRole, "team-a".to_string())
        ]
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
            r#"{"apiGroups":["catalog.kbind.io"],"resourceNames":["widgets"],"resources":["exports"],"verbs":["get"]}"#,
            r#"{"apiGroups":[""],"resourceNames":["kube-system"],"resources":["namespaces"],"verbs":["get"]}"#,
            r#"{"apiGroups":["core.kcp.io"],"resourceNames":["cluster"],"resources":["logicalclusters"],"verbs":["get"]}"#,
        ],
        "no cluster-wide read of a namespaced API, no namespace creation"
    );
    let tenant: Vec<String> = render::tenant_rules(&r, "team-a")
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        tenant,
        vec![
            r#"{"apiGroups":["example.org"],"resources":["widgets","widgets/status"],"verbs":["get","list","watch","create","update","patch","delete"]}"#,
            r#"{"apiGroups":[""],"resourceNames":["team-a"],"resources":["namespaces"],"verbs":["get"]}"#,
            r#"{"apiGroups":[""],"resources":["configmaps"],"verbs":["get"]}"#,
        ]
    );
    // The grants namespace: its own heartbeat Lease by name (create cannot be narrowed by
    // name: the policy does), its own Secret; no list of either.
    let ns: Vec<String> = render::namespace_rules("g")
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        ns,
        vec![
            r#"{"apiGroups":["coordination.k8s.io"],"resourceNames":["kbind-grant-g"],"resources":["leases"],"verbs":["get","update","patch"]}"#,
            r#"{"apiGroups":["coordination.k8s.io"],"resources":["leases"],"verbs":["create"]}"#,
            r#"{"apiGroups":[""],"resourceNames":["kbind-grant-g"],"resources":["secrets"],"verbs":["get"]}"#,
        ]
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

/// With the shipped policies (the default), the issuer writes no admission policy, and pinning
/// changes nothing it issued: the pins policy reads the Grant's status.
#[test]
fn with_shipped_confinement_nothing_issued_is_a_policy_or_changes_with_the_pin() {
    let mut c = cfg(1_000_000);
    c.confinement = Confinement::Shipped;
    let cat = catalog();
    let s = spec(Some("widgets"), None);
    let first = plan_alone(&s, None, &cat, &Issued::default(), &c).unwrap();
    let kinds: Vec<Kind> = first.writes.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        vec![
            Kind::ServiceAccount,
            Kind::ClusterRole,
            Kind::Role,
            Kind::ClusterRoleBinding,
            Kind::RoleBinding,
            Kind::TenantRole,
            Kind::TenantRoleBinding
        ]
    );
    let mut issued = issued_with_secret(&c, "tok", 1_000_000 + 86400);
    for d in &first.writes {
        issued.hashes.insert(d.slot(), d.hash.clone());
    }
    let pinned = plan_alone(&s, Some("uid-1"), &cat, &issued, &c).unwrap();
    assert!(pinned.writes.is_empty(), "{:?}", pinned.writes);
}

#[test]
fn revoke_deletes_the_identity_first_and_the_policy_last() {
    let mut issued = Issued::default();
    for d in render::objects(
        &resolve(&spec(Some("widgets"), None), &catalog()).unwrap(),
        "kbind-grants",
        G,
        Confinement::PerGrant,
        None,
    ) {
        issued.hashes.insert(d.slot(), String::new());
    }
    let order: Vec<Kind> = revoke(&issued).into_iter().map(|s| s.0).collect();
    assert_eq!(order.len(), 9);
    assert_eq!(order.first(), Some(&Kind::ServiceAccount));
    assert_eq!(
        &order[order.len() - 2..],
        &[Kind::Policy, Kind::PolicyBinding]
    );
    assert!(revoke(&Issued::default()).is_empty());
}

#[test]
fn everything_issued_names_its_grant_as_owner_and_a_new_grant_rewrites_it() {
    let r = resolve(&spec(Some("widgets"), None), &catalog()).unwrap();
    let owned = |d: &serde_json::Value| {
        assert_eq!(
            d["metadata"]["ownerReferences"],
            serde_json::json!([{"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant", "name": "g", "uid": G.uid}]),
            "{d}"
        );
    };
    for confinement in [Confinement::Shipped, Confinement::PerGrant] {
        let objects = render::objects(&r, "kbind-grants", G, confinement, None);
        assert!(objects.iter().any(|d| d.kind == Kind::TenantRole));
        for d in &objects {
            if matches!(d.kind, Kind::Policy | Kind::PolicyBinding) {
                // Deleted last by revocation, never by the collector (no order there).
                assert!(d.body["metadata"].get("ownerReferences").is_none());
            } else {
                owned(&d.body);
            }
        }
    }
    owned(&render::secret("kbind-grants", G, "kc", "x", "sa-1"));
    // A Grant deleted and re-created under the same name has a new UID: every object is
    // rewritten to name it (else the collector would delete what the new Grant was issued).
    let again = GrantRef {
        uid: "another-uid",
        ..G
    };
    let first = render::objects(&r, "kbind-grants", G, Confinement::Shipped, None);
    let second = render::objects(&r, "kbind-grants", again, Confinement::Shipped, None);
    assert_eq!(first.len(), second.len());
    assert!(first.iter().zip(&second).all(|(a, b)| a.hash != b.hash));
}

#[test]
fn the_issued_kubeconfig_passes_connection_validation() {
    use k8s_openapi::api::core::v1::Secret;
    let c = cfg(0);
    let kc = render::kubeconfig(&c.server, &c.ca_pem, "tok", &c.namespace, "g");
    let s: Secret = serde_json::from_value(render::secret(
        &c.namespace,
        G,
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
        serde_json::from_value(render::secret(&c.namespace, G, &kc, "x", "sa-1")).unwrap();
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

/// A catalog with two cluster-scoped APIs: `clusterthings` (Export `things`, exclusive) and
/// `clusterpools` (Export `pools`, shared by consent).
fn catalog_with_cluster_apis() -> Catalog {
    let mut c = catalog();
    for (export, api_name, access) in [
        (
            "things",
            "clusterthings.example.org",
            ClusterScopedAccess::Exclusive,
        ),
        (
            "pools",
            "clusterpools.example.org",
            ClusterScopedAccess::Shared,
        ),
    ] {
        c.exported.insert(api_name.into(), api(api_name));
        c.exports.insert(
            export.into(),
            ExportSpec {
                description: String::new(),
                apis: vec![ExportApi {
                    name: api_name.into(),
                }],
                permissions: vec![],
                cluster_scoped_access: access,
            },
        );
    }
    c
}

/// Each provider namespace and each exclusive cluster-scoped API belongs to the oldest Grant
/// naming it; a later one is told which Grant holds it; a shared API goes to every Grant and
/// each says so. The reasons are exactly the documented ones.
#[test]
fn each_namespace_and_cluster_scoped_api_is_one_grants_unless_shared() {
    let cat = catalog_with_cluster_apis();
    let c = cfg(0);
    let grant = |export: &str, namespaces: &[&str]| GrantSpec {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        ..spec(Some(export), None)
    };
    // (name, created, spec): "a" is the oldest; "b" and "c" are created later.
    let specs = [
        ("a", 10, grant("widgets", &["team-a"])),
        ("b", 20, grant("widgets", &["team-a", "team-b"])),
        ("c", 5, grant("things", &[])),
        ("d", 30, grant("things", &[])),
        ("e", 40, grant("pools", &[])),
        ("f", 50, grant("pools", &[])),
        ("g", 60, grant("widgets", &[])),
        ("h", 70, grant("widgets", &["kbind-grants"])),
        ("i", 80, grant("widgets", &["kube-system"])),
    ];
    let views: Vec<GrantView<'_>> = specs
        .iter()
        .map(|(n, t0, s)| GrantView {
            name: n,
            created: Some(t(*t0)),
            spec: s,
        })
        .collect();
    let ten = tenancy(&views, &cat);
    assert_eq!(
        ten.namespace_owner.get("team-a").map(String::as_str),
        Some("a")
    );
    assert_eq!(
        ten.namespace_owner.get("team-b").map(String::as_str),
        Some("b")
    );
    let got = |name: &str| {
        let (_, _, s) = specs.iter().find(|(n, _, _)| *n == name).unwrap();
        let r = resolve(s, &cat).unwrap();
        isolation(name, &r, &ten, &c)
    };
    assert_eq!(got("a"), Ok(vec![]));
    let b = got("b").unwrap_err();
    assert_eq!(b.reason, NAMESPACE_TAKEN);
    assert!(
        b.message.contains("namespace team-a belongs to Grant a"),
        "{b:?}"
    );
    assert_eq!(
        got("c"),
        Ok(vec![]),
        "the oldest Grant of an exclusive API holds it"
    );
    let d = got("d").unwrap_err();
    assert_eq!(d.reason, CLUSTER_SCOPED_API_TAKEN);
    assert!(
        d.message
            .contains("clusterthings.example.org is cluster-scoped and Grant c holds it"),
        "{d:?}"
    );
    assert!(d.message.contains("clusterScopedAccess: Shared"), "{d:?}");
    assert_eq!(got("e"), Ok(vec!["clusterpools.example.org".to_string()]));
    assert_eq!(got("f"), Ok(vec!["clusterpools.example.org".to_string()]));
    let g = got("g").unwrap_err();
    assert_eq!(g.reason, NAMESPACES_REQUIRED);
    assert!(
        g.message
            .contains("widgets.example.org namespaced: set spec.namespaces"),
        "{g:?}"
    );
    for n in ["h", "i"] {
        let e = got(n).unwrap_err();
        assert_eq!(e.reason, NAMESPACE_RESERVED, "{n}");
    }
    // One Export saying Exclusive keeps an API exclusive, whatever another says.
    let mut both = cat.clone();
    both.exports
        .get_mut("things")
        .unwrap()
        .cluster_scoped_access = ClusterScopedAccess::Shared;
    both.exports.insert(
        "strict".into(),
        ExportSpec {
            description: String::new(),
            apis: vec![ExportApi {
                name: "clusterthings.example.org".into(),
            }],
            permissions: vec![],
            cluster_scoped_access: ClusterScopedAccess::Exclusive,
        },
    );
    let ten = tenancy(&views, &both);
    assert_eq!(
        ten.cluster_grantees.get("clusterthings.example.org"),
        Some(&vec!["c".to_string()])
    );
}

/// A cluster-scoped API is granted in the ClusterRole; a namespaced one only in the Grant's
/// namespaces; `nonResourceURLs` rules stay cluster-wide, resource rules go per namespace.
#[test]
fn namespaced_apis_are_granted_per_namespace_and_cluster_scoped_ones_cluster_wide() {
    let mut cat = catalog_with_cluster_apis();
    let url = PolicyRule {
        non_resource_urls: Some(vec!["/healthz".into()]),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    cat.exports.get_mut("things").unwrap().permissions = vec![url];
    let s = GrantSpec {
        collection: None,
        export: Some("things".into()),
        ..spec(None, None)
    };
    let r = resolve(&s, &cat).unwrap();
    let cluster = render::cluster_rules(&r);
    assert!(
        cluster.iter().any(|v| v["resources"][0] == "clusterthings"),
        "{cluster:?}"
    );
    assert!(
        cluster
            .iter()
            .any(|v| v["nonResourceURLs"][0] == "/healthz"),
        "{cluster:?}"
    );
    let tenant = render::tenant_rules(&r, "team-a");
    assert!(
        !tenant.iter().any(|v| v["resources"][0] == "clusterthings"),
        "{tenant:?}"
    );
    assert!(
        !tenant.iter().any(|v| v.get("nonResourceURLs").is_some()),
        "{tenant:?}"
    );
}

/// A Grant refused for read isolation only loses: its issued ClusterRole is narrowed (here,
/// from the cluster-wide grant of a namespaced API that issuers before 0.3 wrote) and the RBAC
/// of namespaces it no longer holds is deleted; nothing is created, and nothing is written
/// when nothing is left to reduce.
#[test]
fn a_grant_refused_for_isolation_only_loses_rbac() {
    let c = cfg(0);
    let cat = catalog();
    let mut held = spec(Some("widgets"), None);
    held.namespaces = vec!["team-a".into()];
    let first = plan_alone(&held, Some("uid"), &cat, &Issued::default(), &c).unwrap();
    let mut issued = Issued::default();
    for d in &first.writes {
        issued.hashes.insert(d.slot(), d.hash.clone());
    }
    // As a 0.2 issuer left it: another ClusterRole.
    issued
        .hashes
        .insert((Kind::ClusterRole, String::new()), "old".into());
    let mut bare = held.clone();
    bare.namespaces.clear();
    let ten = tenancy(
        &[GrantView {
            name: "g",
            created: None,
            spec: &bare,
        }],
        &cat,
    );
    let none = BTreeMap::new();
    let p = Provider {
        catalog: &cat,
        tenancy: &ten,
        namespaces: &BTreeSet::new(),
        in_use: &none,
        handover: &BTreeMap::new(),
        cfg: &c,
    };
    assert_eq!(
        plan_grant(G, &bare, Some("uid"), None, &issued, &BTreeMap::new(), &p)
            .unwrap_err()
            .reason,
        NAMESPACES_REQUIRED
    );
    let r = reduce(G, &bare, &issued, &p);
    let role = r.cluster_role.expect("the ClusterRole is narrowed");
    let rules = role.body["rules"].as_array().unwrap();
    assert!(
        !rules.iter().any(|r| r["resources"][0] == "widgets"),
        "no cluster-wide widgets: {rules:?}"
    );
    assert_eq!(
        r.stale,
        vec![
            (Kind::TenantRoleBinding, "team-a".to_string()),
            (Kind::TenantRole, "team-a".to_string())
        ]
    );
    // Once reduced: nothing more.
    issued.hashes.insert(role.slot(), role.hash.clone());
    for s in &r.stale {
        issued.hashes.remove(s);
    }
    assert_eq!(reduce(G, &bare, &issued, &p), Reduction::default());
    // Never issued: nothing is created.
    assert_eq!(
        reduce(G, &bare, &Issued::default(), &p),
        Reduction::default()
    );
    assert!(is_isolation(NAMESPACE_TAKEN) && !is_isolation(EXPORT_NOT_FOUND));
}
