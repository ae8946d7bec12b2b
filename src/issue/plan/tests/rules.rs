use super::*;

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
