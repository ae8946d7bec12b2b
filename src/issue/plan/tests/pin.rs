use super::*;

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
