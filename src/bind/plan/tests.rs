use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn api(name: &str, scope: &str) -> ExportedApi {
    ExportedApi {
        name: name.into(),
        scope: scope.into(),
        ..Default::default()
    }
}

fn inputs<'a>(
    chosen: &'a Chosen,
    exports: &'a [ExportedApi],
    ns: Option<&'a str>,
    grant: Option<&'a GrantInfo>,
    labels: &'a BTreeMap<String, String>,
) -> Inputs<'a> {
    Inputs {
        name: "acme",
        credential_namespace: "kbind-system",
        binding_namespace: ns,
        key: "kubeconfig",
        kubeconfig: b"apiVersion: v1\n",
        chosen,
        exports,
        grant,
        labels,
    }
}

#[test]
fn chooses_exported_apis_and_names_what_is_wrong() {
    let exports = [
        api("gadgets.x.io", "Cluster"),
        api("widgets.x.io", "Namespaced"),
    ];
    let apis = |v: &[&str]| Chosen::Apis(v.iter().map(|s| s.to_string()).collect());
    let export = |v: &[&str]| Chosen::Export {
        name: "e".into(),
        apis: v.iter().map(|s| s.to_string()).collect(),
    };
    let none = BTreeMap::new();
    // (chosen, binding namespace, want: Ok(apis) or the error's text contains)
    type Want<'a> = Result<Vec<&'a str>, &'a str>;
    let cases: Vec<(Chosen, Option<&str>, Want)> = vec![
        (apis(&["widgets.x.io"]), None, Ok(vec!["widgets.x.io"])),
        (
            apis(&["widgets.x.io", " gadgets.x.io", "widgets.x.io"]),
            None,
            Ok(vec!["gadgets.x.io", "widgets.x.io"]),
        ),
        (
            export(&["widgets.x.io"]),
            Some("team"),
            Ok(vec!["widgets.x.io"]),
        ),
        (
            apis(&["nope.x.io"]),
            None,
            Err("not exported by the provider: nope.x.io; it exports: gadgets.x.io, widgets.x.io"),
        ),
        (
            export(&["widgets.x.io", "nope.x.io"]),
            None,
            Err("nope.x.io (listed by Export e)"),
        ),
        (export(&[]), None, Err("Export e lists no APIs")),
        (
            Chosen::Nothing,
            None,
            Err(
                "name the APIs to bind with --apis or --export; the provider exports: gadgets.x.io, widgets.x.io",
            ),
        ),
        (apis(&[""]), None, Err("name the APIs")),
        (
            apis(&["gadgets.x.io", "widgets.x.io"]),
            Some("team"),
            Err("--namespace team) cannot bind cluster-scoped APIs: gadgets.x.io"),
        ),
    ];
    for (chosen, ns, want) in cases {
        let got = choose_apis(&inputs(&chosen, &exports, ns, None, &none));
        match (got, want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{chosen:?}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{chosen:?}: {e}"),
            (g, w) => panic!("{chosen:?}: got {g:?}, want {w:?}"),
        }
    }
}

#[test]
fn desired_objects_name_the_secret_and_carry_the_grant_annotations() {
    let exports = [api("widgets.x.io", "Namespaced")];
    let chosen = Chosen::Apis(vec!["widgets.x.io".into()]);
    let labels = BTreeMap::from([("team".to_string(), "a".to_string())]);
    let grant = GrantInfo {
        namespace: "kbind-grants".into(),
        name: "acme-kubeconfig".into(),
        grant: Some("acme".into()),
        expires_at: None,
    };
    let i = inputs(&chosen, &exports, None, Some(&grant), &labels);
    let d = desired(&i, &["widgets.x.io".into()]);
    let kinds: Vec<_> = d.iter().map(|d| d.key()).collect();
    assert_eq!(
        kinds,
        [
            "Secret kbind-system/acme",
            "Connection acme",
            "ClusterBinding acme"
        ]
    );
    let s = &d[0].body;
    assert_eq!(s["data"]["kubeconfig"], "YXBpVmVyc2lvbjogdjEK");
    assert_eq!(
        s["metadata"]["annotations"],
        json!({"core.kbind.io/grant-secret": "kbind-grants/acme-kubeconfig", "iam.kbind.io/grant": "acme"})
    );
    assert_eq!(
        d[1].body["spec"]["kubeconfigSecretRef"],
        json!({"namespace": "kbind-system", "name": "acme", "key": "kubeconfig"})
    );
    assert_eq!(
        d[2].body["spec"],
        json!({"connectionRef": {"name": "acme"}, "apis": [{"name": "widgets.x.io"}]})
    );
    // A ClusterBinding admits no namespaced Binding by the way.
    assert!(d[1].body["spec"]["bindingNamespaces"].is_null());
    for o in &d {
        assert_eq!(o.body["metadata"]["labels"], json!({"team": "a"}));
    }
    // Without a Grant no annotation; with --namespace a Binding there.
    let none = BTreeMap::new();
    let d = desired(
        &inputs(&chosen, &exports, Some("team"), None, &none),
        &["widgets.x.io".into()],
    );
    assert!(d[0].body["metadata"]["annotations"].is_null());
    assert!(d[0].body["metadata"]["labels"].is_null());
    assert_eq!(d[2].key(), "Binding team/acme");
    assert_eq!(d[2].body["kind"], "Binding");
    // ... and the Connection serves that namespace, and only it.
    assert_eq!(
        d[1].body["spec"]["bindingNamespaces"],
        json!({"matchLabels": {"kubernetes.io/metadata.name": "team"}})
    );
}

fn managed_by(manager: &str) -> serde_json::Value {
    json!([{"manager": manager, "operation": "Apply"}])
}

#[test]
fn decides_create_update_unchanged_and_refuses_foreign_objects() {
    let exports = [api("widgets.x.io", "Namespaced")];
    let chosen = Chosen::Apis(vec!["widgets.x.io".into()]);
    let none = BTreeMap::new();
    let d = desired(
        &inputs(&chosen, &exports, None, None, &none),
        &["widgets.x.io".into()],
    );
    let (secret, conn, cb) = (&d[0], &d[1], &d[2]);
    // What the server returns after our apply: our fields, plus defaults, finalizers, status.
    let mut cb_have = cb.body.clone();
    cb_have["metadata"]["managedFields"] = managed_by(MANAGER);
    cb_have["metadata"]["finalizers"] = json!(["core.kbind.io/cleanup"]);
    cb_have["spec"]["conflictPolicy"] = json!("Fail");
    cb_have["status"] = json!({"conditions": []});
    let mut cb_more = cb_have.clone();
    cb_more["spec"]["apis"] = json!([{"name": "widgets.x.io"}, {"name": "gadgets.x.io"}]);
    let mut cb_foreign = cb_have.clone();
    cb_foreign["metadata"]["managedFields"] = managed_by("kubectl-client-side-apply");
    let mut secret_rotated = secret.body.clone();
    secret_rotated["metadata"]["managedFields"] =
        json!([{"manager": MANAGER}, {"manager": "kbind-schema"}]);
    secret_rotated["data"]["kubeconfig"] = json!("bmV3");
    let mut conn_other_secret = conn.body.clone();
    conn_other_secret["metadata"]["managedFields"] = managed_by(MANAGER);
    conn_other_secret["spec"]["kubeconfigSecretRef"]["namespace"] = json!("elsewhere");

    // (what, want, have, force, expected Ok(action) or the error text contains)
    type Case<'a> = (
        &'a str,
        &'a Desired,
        Option<&'a serde_json::Value>,
        bool,
        Result<Action, &'a str>,
    );
    let cases: Vec<Case> = vec![
        ("missing", cb, None, false, Ok(Action::Create)),
        (
            "ours, same",
            cb,
            Some(&cb_have),
            false,
            Ok(Action::Unchanged),
        ),
        (
            "ours, an API more",
            cb,
            Some(&cb_more),
            false,
            Ok(Action::Update),
        ),
        (
            "ours, data differs",
            secret,
            Some(&secret_rotated),
            false,
            Ok(Action::Update),
        ),
        (
            "foreign",
            cb,
            Some(&cb_foreign),
            false,
            Err("ClusterBinding acme exists and was not written by kbind bind"),
        ),
        (
            "foreign, forced",
            cb,
            Some(&cb_foreign),
            true,
            Ok(Action::Update),
        ),
        (
            "connection naming another secret",
            conn,
            Some(&conn_other_secret),
            true,
            Err("Connection acme uses Secret elsewhere/acme, not kbind-system/acme"),
        ),
    ];
    for (what, want, have, force, expected) in cases {
        match (decide(want, have, force), expected) {
            (Ok(a), Ok(e)) => assert_eq!(a, e, "{what}"),
            (Err(err), Err(e)) => assert!(err.to_string().contains(e), "{what}: {err}"),
            (g, e) => panic!("{what}: got {g:?}, want {e:?}"),
        }
    }
}

#[test]
fn contains_is_a_subset_for_objects_and_exact_for_lists() {
    let cases = [
        (json!({"a": 1, "b": 2}), json!({"a": 1}), true),
        (json!({"a": 1}), json!({"a": 1, "b": 2}), false),
        (json!({"a": {"x": 1, "y": 2}}), json!({"a": {"x": 1}}), true),
        (
            json!([{"n": 1}, {"n": 2}]),
            json!([{"n": 2}, {"n": 1}]),
            true,
        ),
        (json!([{"n": 1}, {"n": 2}]), json!([{"n": 1}]), false),
        (json!("a"), json!("b"), false),
        (json!(null), json!({}), false),
    ];
    for (have, want, expected) in cases {
        assert_eq!(contains(&have, &want), expected, "{have} ⊇ {want}");
    }
}

#[test]
fn a_connection_pinned_to_another_provider_is_refused() {
    let pinned = json!({"status": {"remoteClusterUID": "uid-a"}});
    let unpinned = json!({"status": {}});
    assert!(check_identity("acme", None, "uid-b").is_ok());
    assert!(check_identity("acme", Some(&unpinned), "uid-b").is_ok());
    assert!(check_identity("acme", Some(&pinned), "uid-a").is_ok());
    let e = check_identity("acme", Some(&pinned), "uid-b").unwrap_err();
    assert!(
        e.to_string()
            .contains("Connection acme is pinned to provider uid-a"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
}
