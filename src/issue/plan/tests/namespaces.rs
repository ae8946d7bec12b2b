use super::*;

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
