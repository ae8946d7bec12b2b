//! What an operator relies on across runs of `kbind schema` and `kbind resync` (issue #31, "no
//! surprises"): a one-off run with another Lease namespace changes nothing, CRDs managed in Git
//! and bound with `pullPolicy: None` survive an unbind with their objects, a binding says what
//! the provider refused instead of `Permitted`, and `source: Auto` picks the labelled CRDs when
//! there are any. Each checks a second run writes nothing and changes no condition.

use crate::support;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind::api::core::{ClusterBinding, Connection};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::fx::{Fx, cond};

/// `kbind <pass>` as an installation runs it: no `--credential-namespace` (its default applies),
/// the Lease in `lease_ns` (`None`: the default), and `POD_NAMESPACE` set as in a Pod when
/// `pod_ns` is given (unset otherwise, as on a laptop). It must exit 0.
fn installed_run(fx: &Fx, pass: &str, lease_ns: Option<&str>, pod_ns: Option<&str>) -> Value {
    let kc = fx.env.consumer.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", fx.label);
    let mut args = vec![
        pass,
        "--kubeconfig",
        &kc,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    if let Some(ns) = lease_ns {
        args.extend(["--lease-namespace", ns]);
    }
    let mut cmd = support::kbind_command(&args);
    for var in [
        "POD_NAMESPACE",
        "KBIND_LEASE_NAMESPACE",
        "KBIND_CREDENTIAL_NAMESPACES",
    ] {
        cmd.env_remove(var);
    }
    if let Some(ns) = pod_ns {
        cmd.env("POD_NAMESPACE", ns);
    }
    let (code, summary, stderr) = support::outcome(cmd.output().expect("run kbind"));
    assert_eq!(code, 0, "kbind {pass}: {summary}\n{stderr}");
    summary
}

async fn conditions_of_connection(fx: &Fx, name: &str) -> Vec<Condition> {
    fx.conn(name).await.status.unwrap_or_default().conditions
}

async fn conditions_of_cluster_binding(fx: &Fx, name: &str) -> Vec<Condition> {
    Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .conditions
}

/// A namespace that may already exist (kbind-system is shared by the tests).
async fn ensure_namespace(c: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

fn resource(fx: &Fx, plural: &str) -> ApiResource {
    let kind = format!(
        "{}{}",
        plural[..1].to_uppercase(),
        &plural[1..plural.len() - 1]
    );
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&fx.group, "v1", &kind), plural)
}

async fn create_object(fx: &Fx, plural: &str, name: &str) {
    let ar = resource(fx, plural);
    let mut o = DynamicObject::new(name, &ar).data(json!({"spec": {"size": 1}}));
    o.metadata.namespace = Some(fx.ns.clone());
    Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &ar)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
}

/// Credential namespaces default to the install namespace, never to `--lease-namespace`: a
/// one-off run with another Lease namespace, from a Job in the install namespace or from a
/// laptop, leaves every Connection and binding exactly as the scheduled runs left them, and
/// resync keeps syncing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_one_off_run_with_another_lease_namespace_leaves_every_connection_as_it_was() {
    // In a Pod: the install namespace is $POD_NAMESPACE (here the fixture's), holding the Secret.
    let pod = Fx::new("oneoff-pod").await;
    // On a laptop: no $POD_NAMESPACE, so the install namespace is kbind-system.
    let laptop = Fx::new("oneoff-laptop").await;
    ensure_namespace(&laptop.consumer, "kbind-system").await;
    let laptop_secret = format!("{}-provider", laptop.label);
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(laptop_secret.clone()),
            ..Default::default()
        },
        string_data: Some([("kubeconfig".to_string(), laptop.provider_kubeconfig())].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(laptop.consumer.clone(), "kbind-system")
        .create(&PostParams::default(), &s)
        .await
        .unwrap();

    for (fx, pod_ns, scheduled_lease) in [
        (&pod, Some(pod.ns.as_str()), None),
        (&laptop, None, Some(laptop.ns.as_str())),
    ] {
        let api = fx
            .provider_crd("widgets", "Namespaced", Some("true"), None)
            .await;
        let secret_ns = pod_ns.unwrap_or("kbind-system");
        let secret = if pod_ns.is_some() {
            fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
                .await;
            "provider".to_string()
        } else {
            laptop_secret.clone()
        };
        let c = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "metadata": {"name": format!("{}-p", fx.label), "labels": {"kbind-test": fx.label}},
            "spec": {"kubeconfigSecretRef": {"namespace": secret_ns, "name": secret}, "schema": {"source": "CRD"}}});
        let conn = Api::<Connection>::all(fx.consumer.clone())
            .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
            .await
            .unwrap()
            .name_any();
        let cb = fx.cluster_binding("cb", &conn, &[&api]).await;
        // The scheduled runs.
        installed_run(fx, "schema", scheduled_lease, pod_ns);
        support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
        installed_run(fx, "schema", scheduled_lease, pod_ns);
        let st = fx.conn(&conn).await.status.unwrap();
        assert_eq!(cond(&st.conditions, "Ready").0, "True", "{st:?}");
        assert_eq!(cond(&st.conditions, "SecretValid").1, "Valid");
        installed_run(fx, "resync", scheduled_lease, pod_ns);

        let before = (
            conditions_of_connection(fx, &conn).await,
            conditions_of_cluster_binding(fx, &cb).await,
        );
        let other = support::namespace(&fx.consumer, "oneoff-lease").await;
        // Two one-off schema runs with another Lease namespace: nothing written, nothing moved.
        for run in 1..=2 {
            let s = installed_run(fx, "schema", Some(&other), pod_ns);
            assert_eq!(s["data_writes"], 0, "one-off schema run {run}: {s}");
            let after = (
                conditions_of_connection(fx, &conn).await,
                conditions_of_cluster_binding(fx, &cb).await,
            );
            assert_eq!(after, before, "no condition changed (run {run})");
        }
        // A one-off resync with another Lease namespace still reads the Secret and syncs.
        ensure_namespace(&fx.provider, &fx.ns).await;
        create_object(fx, "widgets", "w1").await;
        let s = installed_run(fx, "resync", Some(&other), pod_ns);
        assert!(
            s["data_writes"].as_u64().unwrap_or(0) >= 2,
            "finalizer and provider copy: {s}"
        );
        let copy = Api::<DynamicObject>::namespaced_with(
            fx.provider.clone(),
            &fx.ns,
            &resource(fx, "widgets"),
        )
        .get_opt("w1")
        .await
        .unwrap();
        assert!(copy.is_some(), "the one-off resync synced w1");
        let s = installed_run(fx, "resync", Some(&other), pod_ns);
        assert_eq!(s["data_writes"], 0, "a second one-off resync: {s}");
        assert_eq!(
            conditions_of_connection(fx, &conn).await,
            before.0,
            "resync changes no Connection condition"
        );
    }
}

/// A consumer CRD as a GitOps tool applies it: the provider's API with one property of the
/// Git copy's own (so the schema kbind would pull is told apart from it).
fn git_crd(group: &str, plural: &str) -> CustomResourceDefinition {
    let kind = format!(
        "{}{}",
        plural[..1].to_uppercase(),
        &plural[1..plural.len() - 1]
    );
    serde_json::from_value(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind, "singular": &plural[..plural.len() - 1]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "integer"}, "fromGit": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}))
    .unwrap()
}

fn has_git_schema(crd: &CustomResourceDefinition) -> bool {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .is_some_and(|p| p.contains_key("fromGit"))
}

/// One round as the CronJobs run it: schema, then resync, for this fixture's objects.
fn round(fx: &Fx) -> (Value, Value) {
    (fx.run(&[]), fx.pass("resync", &[]))
}

/// `pullPolicy: None` stamps only the CRDs a binding lists, never touches their schema (the
/// provider's changes included), and a ClusterBinding's teardown deletes only CRDs kbind created
/// (`core.kbind.io/created`): a stamped CRD stays with its objects, and so does one created
/// before the record existed (kbind 0.2), even after kbind updated its schema. A CRD kbind
/// created is removed at unbind as before. Every second round writes nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn unbind_deletes_only_crds_kbind_created_and_none_stamps_only_listed_crds() {
    let fx = Fx::new("gitops").await;
    let mut apis = Vec::new();
    for plural in ["widgets", "gadgets", "gizmos", "relics"] {
        apis.push(
            fx.provider_crd(plural, "Namespaced", Some("true"), None)
                .await,
        );
    }
    let [widgets, gadgets, gizmos, relics] = [&apis[0], &apis[1], &apis[2], &apis[3]];
    // widgets and gadgets are managed in Git on the consumer; only widgets is bound.
    support::apply_crds(
        &fx.consumer,
        &[git_crd(&fx.group, "widgets"), git_crd(&fx.group, "gadgets")],
    )
    .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let none = fx
        .connection(
            "none",
            "provider",
            json!({"source": "CRD", "pullPolicy": "None"}),
            false,
        )
        .await;
    let bound = fx
        .connection("bound", "provider", json!({"source": "CRD"}), false)
        .await;
    let none_cb = fx.cluster_binding("none-cb", &none, &[widgets]).await;
    let bound_cb = fx
        .cluster_binding("bound-cb", &bound, &[gizmos, relics])
        .await;
    let crds: Api<CustomResourceDefinition> = Api::all(fx.consumer.clone());
    let get = |name: &str| {
        let crds = crds.clone();
        let name = name.to_string();
        async move { crds.get_opt(&name).await.unwrap() }
    };

    fx.run(&[]);
    for api in [gizmos, relics] {
        support::wait_established(&crds, api).await;
    }
    let w = get(widgets).await.unwrap();
    assert_eq!(w.labels()["core.kbind.io/managed"], "true");
    assert_eq!(w.annotations()["core.kbind.io/connection"], none);
    assert!(
        !w.annotations().contains_key("core.kbind.io/created"),
        "stamped, not created"
    );
    assert!(has_git_schema(&w), "the schema stays Git's");
    let g = get(gadgets).await.unwrap();
    assert!(
        g.labels().is_empty() && g.annotations().is_empty(),
        "None stamps only what a binding lists: {:?} {:?}",
        g.labels(),
        g.annotations()
    );
    for api in [gizmos, relics] {
        let c = get(api).await.unwrap();
        assert_eq!(c.annotations()["core.kbind.io/created"], "true", "{api}");
    }
    // relics as kbind 0.2 left it: created, with no record of it.
    crds.patch(
        relics,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"core.kbind.io/created": null}}})),
    )
    .await
    .unwrap();
    // The provider changes widgets' and relics' schemas: None leaves widgets alone, Always
    // updates relics without claiming to have created it.
    for plural in ["widgets", "relics"] {
        fx.provider_crd(plural, "Namespaced", Some("true"), Some("color"))
            .await;
    }
    for plural in ["widgets", "gizmos", "relics"] {
        create_object(&fx, plural, "o1").await;
    }
    ensure_namespace(&fx.provider, &fx.ns).await;
    let first = round(&fx);
    let relic = get(relics).await.unwrap();
    assert!(
        relic.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("spec"))
            .and_then(|s| s.properties.as_ref())
            .is_some_and(|p| p.contains_key("color")),
        "relics followed the provider: {first:?}"
    );
    assert!(
        !relic.annotations().contains_key("core.kbind.io/created"),
        "an update never records a creation"
    );
    let before: Vec<Vec<Condition>> = vec![
        conditions_of_connection(&fx, &none).await,
        conditions_of_connection(&fx, &bound).await,
        conditions_of_cluster_binding(&fx, &none_cb).await,
        conditions_of_cluster_binding(&fx, &bound_cb).await,
    ];
    for run in 1..=2 {
        let (schema, resync) = round(&fx);
        assert_eq!(schema["data_writes"], 0, "round {run}: {schema}");
        assert_eq!(resync["data_writes"], 0, "round {run}: {resync}");
        let w = get(widgets).await.unwrap();
        assert!(has_git_schema(&w), "round {run}: the None guard holds");
        assert!(
            !w.annotations().contains_key("core.kbind.io/schema-hash"),
            "round {run}: None claims no schema"
        );
        let g = get(gadgets).await.unwrap();
        assert!(g.labels().is_empty(), "round {run}: gadgets untouched");
        let after = vec![
            conditions_of_connection(&fx, &none).await,
            conditions_of_connection(&fx, &bound).await,
            conditions_of_cluster_binding(&fx, &none_cb).await,
            conditions_of_cluster_binding(&fx, &bound_cb).await,
        ];
        assert_eq!(after, before, "round {run}: no condition changed");
    }
    let provider_copy = |plural: &str| {
        let api = Api::<DynamicObject>::namespaced_with(
            fx.provider.clone(),
            &fx.ns,
            &resource(&fx, plural),
        );
        async move { api.get("o1").await.unwrap() }
    };
    for plural in ["widgets", "gizmos", "relics"] {
        provider_copy(plural).await;
    }

    // Unbind both.
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    for cb in [&none_cb, &bound_cb] {
        cbs.delete(cb, &Default::default()).await.unwrap();
    }
    for _ in 0..2 {
        round(&fx);
    }
    for cb in [&none_cb, &bound_cb] {
        assert!(cbs.get_opt(cb).await.unwrap().is_none(), "{cb} torn down");
    }
    support::eventually("the CRD kbind created removed", || async {
        get(gizmos).await.is_none().then_some(())
    })
    .await;
    assert_eq!(
        provider_copy("gizmos").await.annotations()["core.kbind.io/orphaned"],
        "Unbound"
    );
    for (api, plural) in [(widgets, "widgets"), (relics, "relics")] {
        assert!(get(api).await.is_some(), "{api} kept");
        let ar = resource(&fx, plural);
        let o = Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &ar)
            .get("o1")
            .await
            .unwrap_or_else(|e| panic!("{plural}/o1 kept with its CRD: {e}"));
        assert!(
            !o.finalizers().iter().any(|f| f == "core.kbind.io/syncer"),
            "{plural}/o1 released"
        );
        assert!(
            !provider_copy(plural)
                .await
                .annotations()
                .contains_key("core.kbind.io/orphaned"),
            "{plural}: its consumer object lives, the copy is no orphan"
        );
    }
    for run in 1..=2 {
        let (schema, resync) = round(&fx);
        assert_eq!(
            schema["data_writes"], 0,
            "after unbind, round {run}: {schema}"
        );
        assert_eq!(
            resync["data_writes"], 0,
            "after unbind, round {run}: {resync}"
        );
        assert!(get(widgets).await.is_some() && get(relics).await.is_some());
    }
}

/// Grant `user` on the provider exactly `rules`, under a name unique to the fixture.
async fn grant(fx: &Fx, what: &str, user: &str, rules: Value) {
    let name = format!("{}-{what}", fx.label);
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap();
    let rb: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": user}]}))
    .unwrap();
    Api::<ClusterRole>::all(fx.provider.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(fx.provider.clone())
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
}

/// Run schema until the Connection's PermissionDenied has `reason` (RBAC reaches the authorizer
/// a moment after it is written), at most 30 runs.
async fn until_permission(fx: &Fx, conn: &str, reason: &str) {
    for _ in 0..30 {
        fx.run(&[]);
        let st = fx.conn(conn).await.status.unwrap_or_default();
        if st
            .conditions
            .iter()
            .any(|c| c.type_ == "PermissionDenied" && c.reason == reason)
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    panic!("PermissionDenied never became {reason}");
}

/// A binding never reports `PermissionDenied=False Permitted` while the provider refused its
/// Connection something: a real apiserver refuses (RBAC) first the identity read, then the CRD
/// list; each time the binding names what was refused, like its Connection, and a second run
/// writes nothing. Once everything is allowed, it is `Permitted`.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_binding_names_what_the_provider_refused_and_never_says_permitted_then() {
    let fx = Fx::new("refused").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let pns = support::namespace(&fx.provider, "refused").await;
    let kc = support::service_account_kubeconfig(&fx.env.provider, &pns, "reader").await;
    let user = format!("system:serviceaccount:{pns}:reader");
    fx.secret("reader", "kubeconfig", &kc).await;
    let conn = fx
        .connection("p", "reader", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&api]).await;

    let steps: [(&str, Option<(&str, Value)>); 3] = [
        ("IdentityForbidden", None),
        (
            "DiscoveryForbidden",
            Some((
                "identity",
                json!([{"apiGroups": [""], "resources": ["namespaces"],
                    "resourceNames": ["kube-system"], "verbs": ["get"]}]),
            )),
        ),
        (
            "Permitted",
            Some((
                "crds",
                json!([{"apiGroups": ["apiextensions.k8s.io"],
                    "resources": ["customresourcedefinitions"], "verbs": ["get", "list"]}]),
            )),
        ),
    ];
    for (reason, rbac) in steps {
        if let Some((what, rules)) = rbac {
            grant(&fx, what, &user, rules).await;
        }
        until_permission(&fx, &conn, reason).await;
        let want = if reason == "Permitted" {
            "False"
        } else {
            "True"
        };
        let conn_conds = conditions_of_connection(&fx, &conn).await;
        let cb_conds = conditions_of_cluster_binding(&fx, &cb).await;
        let (s, r, m) = cond(&cb_conds, "PermissionDenied");
        assert_eq!((s, r), (want, reason), "the binding: {m}");
        if want == "True" {
            assert!(m.to_lowercase().contains("forbidden"), "{reason}: {m}");
            assert_eq!(cond(&cb_conds, "Ready").0, "False", "{reason}");
        } else {
            assert_eq!(cond(&cb_conds, "Ready").0, "True", "{cb_conds:?}");
        }
        assert_eq!(cond(&conn_conds, "PermissionDenied").1, reason);
        let s = fx.run(&[]);
        assert_eq!(s["data_writes"], 0, "{reason}, a second run: {s}");
        assert_eq!(
            (
                conditions_of_connection(&fx, &conn).await,
                conditions_of_cluster_binding(&fx, &cb).await
            ),
            (conn_conds, cb_conds),
            "{reason}: a second run changes no condition"
        );
    }
}

/// `source: Auto` with a non-empty labelled CRD list selects CRD: `activeSchemaSource` says so,
/// and only the labelled APIs are exported (OpenAPI would add every unlabelled one).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn auto_selects_crd_when_the_labelled_list_is_not_empty() {
    let fx = Fx::new("autocrd").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let unlabelled = fx.provider_crd("gadgets", "Namespaced", None, None).await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "Auto"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    fx.run(&[]);
    support::wait_established(&Api::all(fx.consumer.clone()), &widgets).await;
    for run in 1..=2 {
        let s = fx.run(&[]);
        let st = fx.conn(&conn).await.status.unwrap();
        assert_eq!(
            st.active_schema_source.as_deref(),
            Some("CRD"),
            "run {run}: {:?}",
            st.conditions
        );
        let exported: Vec<&str> = st.exported_apis.iter().map(|e| e.name.as_str()).collect();
        assert!(exported.contains(&widgets.as_str()), "{exported:?}");
        assert!(
            !exported.contains(&unlabelled.as_str())
                && !exported.contains(&"connections.core.kbind.io"),
            "only labelled CRDs: {exported:?}"
        );
        assert_eq!(
            cond(&conditions_of_cluster_binding(&fx, &cb).await, "Ready").0,
            "True"
        );
        if run == 2 {
            assert_eq!(s["data_writes"], 0, "{s}");
        }
    }
}
