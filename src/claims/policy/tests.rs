//! Tests of `claims::policy`.

use super::*;

fn req(group: &str, resource: &str, provider: Option<&str>) -> Requirement {
    Requirement {
        group: group.into(),
        resource: resource.into(),
        provider: provider.map(String::from),
    }
}

fn exp(group: &str, resource: &str, verbs: &[&str], hash: &str) -> PermissionClaim {
    PermissionClaim {
        group: group.into(),
        resource: resource.into(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        identity_hash: hash.into(),
    }
}

fn consent(items: &[(&str, &str)]) -> Consent {
    items
        .iter()
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect()
}

fn states(d: &Desired) -> Vec<(String, ClaimState, bool)> {
    d.claims
        .iter()
        .map(|c| {
            (
                format!("{}/{}", c.claim.group, c.claim.resource),
                c.state,
                c.consented,
            )
        })
        .collect()
}

use ClaimState::{Accepted, Rejected};

/// The identities the table tests' entry `compute` owns: its export's and the core's.
fn own_ids() -> OwnIdentities {
    OwnIdentities::new(Some("h-compute".into()), Some("h-core".into()))
}

#[test]
fn desired_rules() {
    let export = vec![
        exp("", "configmaps", &["get", "list"], ""),
        exp("compute.io", "instances", &["*"], "h-compute"),
        exp("storage.io", "volumes", &["get"], "h-storage"),
    ];
    let own = req("", "configmaps", None);
    let comp = req("storage.io", "volumes", Some("storage"));
    type Case = (
        &'static str,
        Vec<Requirement>,
        Option<Consent>,
        Vec<(&'static str, ClaimState, bool)>,
    );
    let cases: Vec<Case> = vec![
        (
            "own requirement accepted without any Grant",
            vec![own.clone()],
            None,
            vec![("/configmaps", Accepted, false)],
        ),
        (
            "no Grant: composition rejected",
            vec![comp.clone()],
            None,
            vec![("storage.io/volumes", Rejected, false)],
        ),
        (
            "Grant without this composition: rejected",
            vec![comp.clone()],
            Some(consent(&[("other.io", "x")])),
            vec![("storage.io/volumes", Rejected, false)],
        ),
        (
            "consented composition accepted and marked",
            vec![comp.clone()],
            Some(consent(&[("storage.io", "volumes")])),
            vec![("storage.io/volumes", Accepted, true)],
        ),
        (
            "naming itself as provider is an own requirement",
            vec![req("compute.io", "instances", Some("compute"))],
            None,
            vec![("compute.io/instances", Accepted, false)],
        ),
        (
            "empty provider is an own requirement",
            vec![req("compute.io", "instances", Some(""))],
            None,
            vec![("compute.io/instances", Accepted, false)],
        ),
        (
            "verb coordinate claimed as its resource",
            vec![req("compute.io", "instances/exec", None)],
            None,
            vec![("compute.io/instances", Accepted, false)],
        ),
        (
            "coordinates on one resource merge into one claim",
            vec![
                req("compute.io", "instances", None),
                req("compute.io", "instances/exec", None),
            ],
            None,
            vec![("compute.io/instances", Accepted, false)],
        ),
        (
            "a merged claim with an unconsented composition is rejected",
            vec![
                req("compute.io", "instances", None),
                req("compute.io", "instances/exec", Some("other")),
            ],
            None,
            vec![("compute.io/instances", Rejected, false)],
        ),
        (
            "consent is per coordinate: consent to exec does not cover the whole resource",
            vec![
                req("compute.io", "instances", Some("other")),
                req("compute.io", "instances/exec", Some("other")),
            ],
            Some(consent(&[("compute.io", "instances/exec")])),
            vec![("compute.io/instances", Rejected, false)],
        ),
        (
            "duplicates collapse",
            vec![own.clone(), own.clone()],
            None,
            vec![("/configmaps", Accepted, false)],
        ),
        (
            "sorted by key",
            vec![comp.clone(), own.clone()],
            Some(consent(&[("storage.io", "volumes")])),
            vec![
                ("/configmaps", Accepted, false),
                ("storage.io/volumes", Accepted, true),
            ],
        ),
    ];
    for (name, requires, consent, want) in cases {
        let d = desired("compute", &requires, &export, &own_ids(), consent.as_ref());
        let want: Vec<(String, ClaimState, bool)> = want
            .into_iter()
            .map(|(k, s, c)| (k.to_string(), s, c))
            .collect();
        assert_eq!(states(&d), want, "{name}");
        assert!(d.missing_on_export.is_empty(), "{name}");
    }
}

/// Which requirements need consent is decided by the identityHash the live export's claim
/// carries, not by the `provider` field the provider writes itself.
#[test]
fn the_identity_hash_decides_what_is_a_composition() {
    let export = vec![
        exp("", "configmaps", &["get"], ""),
        exp("compute.io", "instances", &["*"], "h-compute"),
        exp("hub.io", "tenants", &["get"], "h-core"),
        exp("storage.io", "volumes", &["get"], "h-storage"),
    ];
    let ids = |export: Option<&str>, core: Option<&str>| {
        OwnIdentities::new(export.map(String::from), core.map(String::from))
    };
    type Case = (
        &'static str,
        Requirement,
        OwnIdentities,
        Option<Consent>,
        (&'static str, ClaimState, bool),
    );
    let cases: Vec<Case> = vec![
        (
            "provider omitted, foreign identityHash: a composition, Rejected without a Grant",
            req("storage.io", "volumes", None),
            own_ids(),
            None,
            ("storage.io/volumes", Rejected, false),
        ),
        (
            "provider omitted, foreign identityHash: Accepted with the Grant",
            req("storage.io", "volumes", None),
            own_ids(),
            Some(consent(&[("storage.io", "volumes")])),
            ("storage.io/volumes", Accepted, true),
        ),
        (
            "a Grant for another coordinate does not cover it",
            req("storage.io", "volumes", None),
            own_ids(),
            Some(consent(&[("storage.io", "snapshots")])),
            ("storage.io/volumes", Rejected, false),
        ),
        (
            "naming itself as provider does not make a foreign identity its own",
            req("storage.io", "volumes", Some("compute")),
            own_ids(),
            None,
            ("storage.io/volumes", Rejected, false),
        ),
        (
            "an empty provider with a foreign identity is a composition",
            req("storage.io", "volumes", Some("")),
            own_ids(),
            None,
            ("storage.io/volumes", Rejected, false),
        ),
        (
            "the entry's own export identity: own",
            req("compute.io", "instances", None),
            own_ids(),
            None,
            ("compute.io/instances", Accepted, false),
        ),
        (
            "the core export's identity: own",
            req("hub.io", "tenants", None),
            own_ids(),
            None,
            ("hub.io/tenants", Accepted, false),
        ),
        (
            "built-in (empty identityHash): own",
            req("", "configmaps", None),
            own_ids(),
            None,
            ("/configmaps", Accepted, false),
        ),
        (
            "naming another provider on an own identity still needs consent",
            req("compute.io", "instances", Some("storage")),
            own_ids(),
            None,
            ("compute.io/instances", Rejected, false),
        ),
        (
            "own export identity unreadable: its claims need consent",
            req("compute.io", "instances", None),
            ids(None, Some("h-core")),
            None,
            ("compute.io/instances", Rejected, false),
        ),
        (
            "own export identity unreadable: Accepted with consent",
            req("compute.io", "instances", None),
            ids(None, Some("h-core")),
            Some(consent(&[("compute.io", "instances")])),
            ("compute.io/instances", Accepted, true),
        ),
        (
            "core identity unreadable or not configured: its claims need consent",
            req("hub.io", "tenants", None),
            ids(Some("h-compute"), None),
            None,
            ("hub.io/tenants", Rejected, false),
        ),
        (
            "an empty identity read is unknown, not a match",
            req("hub.io", "tenants", None),
            ids(Some(""), Some("")),
            None,
            ("hub.io/tenants", Rejected, false),
        ),
        (
            "built-ins stay own when no identity could be read",
            req("", "configmaps", None),
            ids(None, None),
            None,
            ("/configmaps", Accepted, false),
        ),
    ];
    for (name, requirement, own, consent, (key, state, consented)) in cases {
        let d = desired("compute", &[requirement], &export, &own, consent.as_ref());
        assert_eq!(
            states(&d),
            vec![(key.to_string(), state, consented)],
            "{name}"
        );
    }
}

#[test]
fn one_entry_per_export_the_oldest_then_the_first_name_wins() {
    let at = |s: i64| Some(Timestamp::from_second(1_800_000_000 + s).unwrap());
    let x = ExportRef {
        path: "root:p".into(),
        name: "x.io".into(),
    };
    let y = ExportRef {
        path: "root:q".into(),
        name: "x.io".into(),
    };
    let same_name_elsewhere = ExportRef {
        path: String::new(),
        name: "x.io".into(),
    };
    let got = duplicate_entries([
        (&x, at(5), "a-newer"),
        (&x, at(1), "z-oldest"),
        (&x, at(1), "zz-same-second"),
        (&x, None, "0-no-time"),
        (&y, at(9), "alone"),
        (&same_name_elsewhere, at(0), "other-path"),
    ]);
    let want: BTreeMap<String, String> = [
        ("a-newer", "z-oldest"),
        ("zz-same-second", "z-oldest"),
        ("0-no-time", "z-oldest"),
    ]
    .into_iter()
    .map(|(l, w)| (l.to_string(), w.to_string()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn verbs_and_identity_come_from_the_live_export() {
    let export = vec![exp("compute.io", "instances", &["get", "create"], "h1")];
    let d = desired(
        "compute",
        &[req("compute.io", "instances/exec", None)],
        &export,
        &OwnIdentities::new(Some("h1".into()), None),
        None,
    );
    assert_eq!(d.claims[0].claim, export[0]);
}

#[test]
fn requirements_missing_on_the_export_are_reported_not_claimed() {
    let export = vec![exp("", "configmaps", &["get"], "")];
    let requires = vec![
        req("", "configmaps", None),
        req("", "secrets", None),
        req("x.io", "things/exec", Some("x")),
    ];
    let d = desired("p", &requires, &export, &own_ids(), None);
    assert_eq!(
        states(&d),
        vec![("/configmaps".to_string(), Accepted, false)]
    );
    assert_eq!(
        d.missing_on_export,
        vec![
            req("", "secrets", None),
            req("x.io", "things/exec", Some("x"))
        ]
    );
}

#[test]
fn core_desired_accepts_every_core_export_claim() {
    let core = vec![
        exp("apis.kcp.io", "apibindings", &["get", "list", "update"], ""),
        exp("", "namespaces", &["*"], ""),
    ];
    let d = core_desired(&core);
    assert!(d.claims.iter().all(|c| c.state == Accepted));
    assert_eq!(d.claims.len(), 2);
}

#[test]
fn export_claims_use_the_same_grouping_every_verb_and_the_serving_identity() {
    let requires = vec![
        req("", "configmaps", None),
        req("compute.io", "instances", None),
        req("compute.io", "instances/exec", None),
        req("storage.io", "volumes", Some("storage")),
    ];
    let ids: BTreeMap<&str, &str> = [("compute", "h-c"), ("storage", "h-s")].into();
    let got = export_claims("compute", &requires, |p| {
        ids.get(p).map(|s| s.to_string()).ok_or(p.to_string())
    })
    .unwrap();
    assert_eq!(
        got,
        vec![
            exp("", "configmaps", &["*"], ""),
            exp("compute.io", "instances", &["*"], "h-c"),
            exp("storage.io", "volumes", &["*"], "h-s"),
        ]
    );
    // And a binding computed against that export carries exactly those claims.
    let d = desired(
        "compute",
        &requires,
        &got,
        &OwnIdentities::new(Some("h-c".into()), None),
        Some(&consent(&[("storage.io", "volumes")])),
    );
    let claimed: Vec<PermissionClaim> = d.claims.into_iter().map(|c| c.claim).collect();
    assert_eq!(claimed, got);
}

#[test]
fn export_claims_name_the_provider_whose_identity_is_missing() {
    let requires = vec![req("storage.io", "volumes", Some("storage"))];
    let err = export_claims("compute", &requires, |p| Err::<String, _>(p.to_string()));
    assert_eq!(err, Err("storage".to_string()));
}

#[test]
fn requirements_hash_ignores_order_and_duplicates_but_not_content() {
    let a = vec![req("", "configmaps", None), req("x.io", "t", Some("x"))];
    let b = vec![
        req("x.io", "t", Some("x")),
        req("", "configmaps", None),
        req("", "configmaps", None),
    ];
    assert_eq!(requirements_hash(&a), requirements_hash(&b));
    let c = vec![req("", "configmaps", None), req("x.io", "t", None)];
    assert_ne!(requirements_hash(&a), requirements_hash(&c));
}
