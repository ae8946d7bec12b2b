//! `kbind schema` against the consumer and provider apiservers, run as the real binary.
//! Each test uses its own API group, Connection label (passed as --selector) and Lease namespace,
//! so tests run in parallel on the shared servers without seeing each other's objects.

use crate::support;

use support::fx::{Fx, cond};
use support::hold::ProviderHold;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::{Binding, ClusterBinding, Connection};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;

async fn kube_system_uid(c: &Client) -> String {
    Api::<Namespace>::all(c.clone())
        .get("kube-system")
        .await
        .unwrap()
        .uid()
        .unwrap()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn connection_pins_identities_discovers_exact_exports_and_holds_finalizers() {
    let fx = Fx::new("ident").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.provider_crd("gadgets", "Namespaced", Some("True"), None)
        .await; // not the exact value
    fx.provider_crd("gizmos", "Namespaced", None, None).await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let name = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;

    let s = fx.run(&[]);
    assert_eq!(s["outcome"], "completed", "{s}");
    let c = fx.conn(&name).await;
    let st = c.status.clone().unwrap();
    assert_eq!(
        cond(&st.conditions, "Ready").0,
        "True",
        "{:?}",
        st.conditions
    );
    assert_eq!(cond(&st.conditions, "SecretValid").0, "True");
    assert_eq!(cond(&st.conditions, "Connected").0, "True");
    assert_eq!(cond(&st.conditions, "PermissionDenied").0, "False");
    assert_eq!(
        st.remote_cluster_uid.as_deref(),
        Some(kube_system_uid(&fx.provider).await.as_str())
    );
    assert_eq!(
        st.local_cluster_uid.as_deref(),
        Some(kube_system_uid(&fx.consumer).await.as_str())
    );
    let exported: Vec<&str> = st
        .exported_apis
        .iter()
        .filter(|e| e.name.ends_with(&fx.group))
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        exported,
        [widgets.as_str()],
        "only the exact label value exports"
    );
    assert_eq!(st.active_schema_source.as_deref(), Some("CRD"));
    assert!(c.finalizers().iter().any(|f| f == "core.kbind.io/cleanup"));
    let secret = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .get("provider")
        .await
        .unwrap();
    assert!(
        secret
            .finalizers()
            .iter()
            .any(|f| f == "core.kbind.io/cleanup"),
        "the Secret is held for teardown"
    );
    // pullPolicy Bound and no binding: nothing installed.
    assert!(!fx.installed_by(&widgets, &name).await);

    // Nothing changed: the next run writes nothing at all (only its Lease).
    fx.assert_unchanged_pass(&name).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bound_pull_installs_bound_apis_and_bindings_report_setup() {
    let fx = Fx::new("bound").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let clusters = fx
        .provider_crd("clusters", "Cluster", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection(
            "p",
            "provider",
            json!({"source": "CRD", "pullPolicy": "Bound"}),
            false,
        )
        .await;
    let cb = fx
        .cluster_binding("cb", &conn, &[&widgets, &clusters])
        .await;
    let b = fx.binding("ns-binding", &conn, &[&clusters]).await;
    let missing = fx
        .binding("missing", &conn, &["nothings.example.org"])
        .await;

    fx.run(&[]);
    // Bound APIs are installed with kbind's markers; the unbound export is not.
    for api in [&widgets, &clusters] {
        let crd = fx
            .consumer_crd(api)
            .await
            .unwrap_or_else(|| panic!("{api} installed"));
        assert_eq!(crd.labels()["core.kbind.io/managed"], "true");
        assert_eq!(crd.annotations()["core.kbind.io/connection"], conn);
        assert_eq!(crd.spec.conversion.as_ref().unwrap().strategy, "None");
    }
    assert!(
        !fx.installed_by(&gadgets, &conn).await,
        "unbound export not installed"
    );

    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap();
    let st = cbs.status.unwrap();
    assert_eq!(
        cond(&st.conditions, "Ready").0,
        "True",
        "{:?}",
        st.conditions
    );
    assert_eq!(cond(&st.conditions, "Synced").0, "True");
    let names: Vec<&str> = st.bound_apis.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, [clusters.as_str(), widgets.as_str()]);
    assert!(
        st.bound_apis
            .iter()
            .all(|a| a.schema_hash.as_deref().is_some_and(|h| h.len() == 16))
    );
    assert!(
        cbs.metadata
            .finalizers
            .unwrap()
            .contains(&"core.kbind.io/cleanup".to_string())
    );

    let bs = Api::<Binding>::namespaced(fx.consumer.clone(), &fx.ns);
    let st = bs.get(&b).await.unwrap().status.unwrap();
    let (status, reason, msg) = cond(&st.conditions, "Ready");
    assert_eq!((status, reason), ("False", "ClusterScopedAPI"), "{msg}");
    let st = bs.get(&missing).await.unwrap().status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").1, "APINotExported");

    fx.assert_unchanged_pass(&conn).await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bad_credentials_are_reported_and_retried() {
    let fx = Fx::new("creds").await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let reason = |c: Connection| {
        cond(&c.status.unwrap().conditions, "SecretValid")
            .1
            .to_string()
    };

    fx.run(&[]);
    assert_eq!(
        reason(fx.conn(&conn).await),
        "SecretNotFound",
        "a Connection may exist before its Secret"
    );
    fx.secret("provider", "config", "x").await;
    fx.run(&[]);
    assert_eq!(reason(fx.conn(&conn).await), "KeyNotFound");
    let exec = fx.provider_kubeconfig().replace("    token:", "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: gke-gcloud-auth-plugin\n    x-token:");
    fx.secret("provider", "kubeconfig", &exec).await;
    fx.run(&[]);
    let c = fx.conn(&conn).await;
    let st = c.status.unwrap();
    let (s, r, m) = cond(&st.conditions, "SecretValid");
    assert_eq!((s, r), ("False", "NotSelfContained"));
    assert!(m.contains("user.exec"), "the message names the field: {m}");
    assert_eq!(cond(&st.conditions, "Ready").0, "False");
    // Fixed in place: the next run uses the Secret's new data, no restart.
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    fx.run(&[]);
    assert_eq!(
        cond(&fx.conn(&conn).await.status.unwrap().conditions, "Ready").0,
        "True"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_secret_pointing_at_another_cluster_is_cluster_identity_changed() {
    let fx = Fx::new("idchg").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    fx.run(&[]);
    let pinned = fx
        .conn(&conn)
        .await
        .status
        .unwrap()
        .remote_cluster_uid
        .unwrap();
    // Rotate the Secret to the consumer cluster's credentials: a different cluster.
    fx.secret(
        "provider",
        "kubeconfig",
        &std::fs::read_to_string(&fx.env.consumer).unwrap(),
    )
    .await;
    let b = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap();
    let (s, r, m) = cond(&st.conditions, "Connected");
    assert_eq!((s, r), ("False", "ClusterIdentityChanged"), "{m}");
    assert_eq!(
        st.remote_cluster_uid.as_deref(),
        Some(pinned.as_str()),
        "the pinned UID never moves"
    );
    assert!(
        !fx.installed_by(&widgets, &conn).await,
        "nothing is installed from the other cluster"
    );
    let bst = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&b)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(cond(&bst.conditions, "Ready").0, "False");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn update_policy_always_follows_the_provider_and_once_pins() {
    let fx = Fx::new("update").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let always = fx
        .connection(
            "always",
            "provider",
            json!({"source": "CRD", "updatePolicy": "Always"}),
            false,
        )
        .await;
    let once = fx
        .connection(
            "once",
            "provider",
            json!({"source": "CRD", "updatePolicy": "Once"}),
            false,
        )
        .await;
    fx.cluster_binding("a", &always, &[&widgets]).await;
    fx.cluster_binding("o", &once, &[&gadgets]).await;
    fx.run(&[]);
    let hash = |c: CustomResourceDefinition| c.annotations()["core.kbind.io/schema-hash"].clone();
    let (w0, g0) = (
        hash(fx.consumer_crd(&widgets).await.unwrap()),
        hash(fx.consumer_crd(&gadgets).await.unwrap()),
    );

    // The provider adds a field to both.
    fx.provider_crd("widgets", "Namespaced", Some("true"), Some("color"))
        .await;
    fx.provider_crd("gadgets", "Namespaced", Some("true"), Some("color"))
        .await;
    fx.run(&[]);
    let w = fx.consumer_crd(&widgets).await.unwrap();
    assert_ne!(hash(w.clone()), w0, "Always follows");
    let schema = serde_json::to_value(&w.spec.versions[0].schema).unwrap();
    assert!(schema.to_string().contains("color"));
    assert_eq!(
        hash(fx.consumer_crd(&gadgets).await.unwrap()),
        g0,
        "Once pins"
    );
    let st = fx.conn(&once).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "SchemaInSync").1, "Pinned");
    assert_eq!(
        cond(
            &fx.conn(&always).await.status.unwrap().conditions,
            "SchemaInSync"
        )
        .0,
        "True"
    );
}

/// A CRD someone else installed on the consumer, with another schema.
fn foreign_crd(group: &str, plural: &str, kind: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": plural, "kind": kind},
            "versions": [{"name": "v9", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
    .unwrap()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_foreign_crd_is_never_overwritten() {
    let fx = Fx::new("foreign").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    support::apply_crds(&fx.consumer, &[foreign_crd(&fx.group, "widgets", "Widget")]).await;
    let rv = fx.consumer_crd(&widgets).await.unwrap().resource_version();
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let first = fx
        .connection("first", "provider", json!({"source": "CRD"}), false)
        .await;
    let second = fx
        .connection("second", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx
        .cluster_binding("cb", &first, &[&widgets, &gadgets])
        .await;
    // Two Connections claiming one CRD: the second never takes over the first's.
    let cb2 = fx.cluster_binding("cb2", &second, &[&gadgets]).await;
    fx.run(&[]);
    fx.run(&[]);

    assert_eq!(
        fx.consumer_crd(&widgets).await.unwrap().resource_version(),
        rv,
        "foreign CRD untouched"
    );
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    let st = cbs.get(&cb).await.unwrap().status.unwrap();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("False", "ForeignCRD"), "{m}");
    assert!(
        m.contains(&widgets) && m.contains("not managed by kbind"),
        "{m}"
    );
    let g = fx.consumer_crd(&gadgets).await.unwrap();
    assert_eq!(g.annotations()["core.kbind.io/connection"], first);
    let st = cbs.get(&cb2).await.unwrap().status.unwrap();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("False", "ForeignCRD"), "{m}");
    assert!(m.contains(&format!("managed by Connection {first}")), "{m}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn pull_none_creates_nothing_and_stamps_existing_crds_with_markers_only() {
    let fx = Fx::new("none").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    support::apply_crds(&fx.consumer, &[foreign_crd(&fx.group, "widgets", "Widget")]).await;
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
    let cb = fx.cluster_binding("cb", &none, &[&widgets, &gadgets]).await;
    fx.run(&[]);

    let w = fx.consumer_crd(&widgets).await.unwrap();
    assert_eq!(
        w.labels().get("core.kbind.io/managed").map(String::as_str),
        Some("true")
    );
    assert_eq!(w.annotations().get("core.kbind.io/connection"), Some(&none));
    assert_eq!(
        w.spec.versions[0].name, "v9",
        "the schema stays the external manager's"
    );
    assert!(
        !fx.installed_by(&gadgets, &none).await,
        "None never creates"
    );
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("False", "CRDMissing"), "{m}");
    assert!(m.contains(&gadgets) && !m.contains(&widgets), "{m}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn all_pull_installs_every_export_and_auto_bind_follows_exports() {
    // Alone: its Connection takes every export there is, other tests' too.
    let fx = Fx::alone("auto").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    // A restricted provider identity that can only see this test's CRDs would be ideal; the
    // admin sees every test's exports, so assert on this group's APIs only.
    let conn = fx
        .connection(
            "p",
            "provider",
            json!({"source": "CRD", "pullPolicy": "All"}),
            true,
        )
        .await;
    fx.run(&[]);
    assert!(fx.consumer_crd(&widgets).await.is_some() && fx.consumer_crd(&gadgets).await.is_some());
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    let ab = cbs
        .get(&conn)
        .await
        .expect("autoBind ClusterBinding named after the Connection");
    let apis: Vec<String> = ab.spec.apis.iter().map(|a| a.name.clone()).collect();
    assert!(apis.contains(&widgets) && apis.contains(&gadgets));
    assert_eq!(ab.owner_references()[0].name, conn);
    assert_eq!(
        ab.labels().get("kbind-test"),
        Some(&fx.label),
        "the Connection's labels, so a selector picking it picks its binding"
    );

    // autoBind off: the binding is left alone.
    Api::<Connection>::all(fx.consumer.clone())
        .patch(
            &conn,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoBind": false}})),
        )
        .await
        .unwrap();
    fx.provider_crd("gizmos", "Namespaced", Some("true"), None)
        .await;
    fx.run(&[]);
    let ab2 = cbs.get(&conn).await.unwrap();
    assert_eq!(
        ab2.spec.apis, ab.spec.apis,
        "not maintained any more, not deleted"
    );
}

/// autoBind's reserved name held by a ClusterBinding the Connection does not own: left alone, and
/// the Connection says so in a condition (a log line in a CronJob pod is read by nobody).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn auto_bind_name_taken_is_reported_on_the_connection() {
    let fx = Fx::new("abtaken").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    // The user's own ClusterBinding under the name autoBind would use (`<label>-p`).
    let taken = fx
        .cluster_binding("p", &format!("{}-p", fx.label), &[&widgets])
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), true)
        .await;
    assert_eq!(taken, conn);
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap();
    let (s, r, m) = cond(&st.conditions, "AutoBind");
    assert_eq!((s, r), ("False", "NameTaken"), "{m}");
    let cb = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&taken)
        .await
        .unwrap();
    let apis: Vec<String> = cb.spec.apis.iter().map(|a| a.name.clone()).collect();
    assert_eq!(apis, [widgets], "left alone: {gadgets} not added");
    assert!(cb.owner_references().is_empty());
    let again = fx.run(&[]);
    assert_eq!(again["data_writes"], 0, "{again}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn dry_run_plans_and_writes_nothing() {
    let fx = Fx::new("dry").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    fx.cluster_binding("cb", &conn, &[&widgets]).await;
    let rv = fx.conn(&conn).await.resource_version();
    let s = fx.run(&["--dry-run"]);
    assert_eq!(s["outcome"], "dry-run");
    assert_eq!(s["data_writes"], 0);
    let planned = s["planned"].as_array().expect("planned writes listed");
    assert!(
        planned
            .iter()
            .any(|w| w["verb"] == "create" && w["target"].as_str().unwrap().contains(&widgets)),
        "{s}"
    );
    assert_eq!(
        fx.conn(&conn).await.resource_version(),
        rv,
        "the Connection was not written"
    );
    assert!(!fx.installed_by(&widgets, &conn).await);
    assert!(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(fx.consumer.clone(), &fx.ns)
            .get_opt("kbind-schema")
            .await
            .unwrap()
            .is_none(),
        "a dry run takes no Lease"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn max_items_bounds_a_run_and_the_next_run_resumes() {
    let fx = Fx::new("budget").await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let names = [
        fx.connection("a", "provider", json!({"source": "CRD"}), false)
            .await,
        fx.connection("b", "provider", json!({"source": "CRD"}), false)
            .await,
        fx.connection("c", "provider", json!({"source": "CRD"}), false)
            .await,
    ];
    let handled = || async {
        let mut n = Vec::new();
        for c in &names {
            if fx.conn(c).await.status.is_some() {
                n.push(c.clone());
            }
        }
        n
    };
    let s = fx.run(&["--max-items", "2"]);
    assert_eq!(s["outcome"], "partial", "{s}");
    assert_eq!(handled().await, names[..2]);
    let s = fx.run(&["--max-items", "2"]);
    assert_eq!(
        handled().await,
        names,
        "the second run starts where the first stopped: {s}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn openapi_source_synthesizes_the_consumer_crd_from_discovery() {
    let fx = Fx::new("openapi").await;
    // Not labelled: the OpenAPI source has no label gate.
    let widgets = fx
        .provider_crd("widgets", "Namespaced", None, Some("color"))
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "OpenAPI"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    // A new API reaches the provider's OpenAPI document shortly after discovery: poll runs.
    let st = support::eventually("the export to be discovered", || async {
        fx.run(&[]);
        let st = fx.conn(&conn).await.status?;
        st.exported_apis
            .iter()
            .any(|e| e.name == widgets)
            .then_some(st)
    })
    .await;
    assert_eq!(st.active_schema_source.as_deref(), Some("OpenAPI"));
    fx.run(&[]); // the binding's CRD is installed once the export is known
    assert!(
        !st.exported_apis
            .iter()
            .any(|e| e.name.ends_with(".k8s.io") || e.name.starts_with("deployments.")),
        "built-in groups excluded"
    );
    let crd = fx
        .consumer_crd(&widgets)
        .await
        .expect("synthesized CRD installed");
    let v = &crd.spec.versions[0];
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some(),
        "discovered status subresource kept"
    );
    let schema = serde_json::to_value(&v.schema).unwrap();
    assert_eq!(
        schema.pointer("/openAPIV3Schema/properties/spec/properties/size/type"),
        Some(&json!("integer")),
        "{schema}"
    );
    assert_eq!(crd.spec.conversion.as_ref().unwrap().strategy, "None");
    let b = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(cond(&b.conditions, "Ready").0, "True", "{:?}", b.conditions);
    // Synthesis is deterministic: the next run sees no drift and writes nothing.
    let s = fx.run(&[]);
    assert_eq!(s["data_writes"], 0, "{s}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn auto_falls_through_only_after_a_successful_empty_list() {
    let fx = Fx::new("autosrc").await;
    // The consumer cluster as a "provider": it labels nothing exported, so Auto's CRD list is
    // empty and OpenAPI discovery takes over.
    fx.secret(
        "self",
        "kubeconfig",
        &std::fs::read_to_string(&fx.env.consumer).unwrap(),
    )
    .await;
    let conn = fx
        .connection("self", "self", json!({"source": "Auto"}), false)
        .await;
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap();
    assert_eq!(
        st.active_schema_source.as_deref(),
        Some("OpenAPI"),
        "{:?}",
        st.conditions
    );
    assert!(
        st.exported_apis
            .iter()
            .any(|e| e.name == "connections.core.kbind.io")
    );

    // A provider identity that may read its identity but not list CRDs: Auto reports the
    // error and does not fall back to OpenAPI.
    let pns = support::namespace(&fx.provider, "autosrc").await;
    let restricted =
        support::service_account_kubeconfig(&fx.env.provider, &pns, "schema-reader").await;
    grant_identity_read(
        &fx.provider,
        &fx.label,
        &format!("system:serviceaccount:{pns}:schema-reader"),
    )
    .await;
    fx.secret("restricted", "kubeconfig", &restricted).await;
    let denied = fx
        .connection("denied", "restricted", json!({"source": "Auto"}), false)
        .await;
    let st = support::eventually("RBAC to apply", || async {
        fx.run(&[]);
        let st = fx.conn(&denied).await.status?;
        (cond(&st.conditions, "Connected").0 == "True").then_some(st)
    })
    .await;
    let (s, r, m) = cond(&st.conditions, "PermissionDenied");
    assert_eq!((s, r), ("True", "DiscoveryForbidden"), "{m}");
    assert!(
        m.contains("403") || m.to_lowercase().contains("forbidden"),
        "{m}"
    );
    assert_eq!(
        st.active_schema_source, None,
        "no fallback to OpenAPI after a failed list"
    );
    assert_eq!(cond(&st.conditions, "Ready").0, "False");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn teardown_waits_for_instance_release_then_removes_crd_and_finalizers() {
    let fx = Fx::new("teardown").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    fx.run(&[]);
    assert!(fx.consumer_crd(&widgets).await.is_some());

    // Deleting the Connection first: it waits for its bindings.
    let conns = Api::<Connection>::all(fx.consumer.clone());
    conns.delete(&conn, &Default::default()).await.unwrap();
    fx.run(&[]);
    let c = fx.conn(&conn).await;
    let (s, r, m) = cond(&c.status.as_ref().unwrap().conditions, "Ready");
    assert_eq!((s, r), ("False", "BindingsRemain"), "{m}");
    assert!(m.contains(&cb));

    // Deleting the binding: it waits until resync has released the instances.
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    cbs.delete(&cb, &Default::default()).await.unwrap();
    fx.run(&[]);
    assert!(
        cbs.get_opt(&cb).await.unwrap().is_some(),
        "held until InstancesReleased"
    );
    assert!(fx.consumer_crd(&widgets).await.is_some());
    // What `kbind resync` records when it has released the binding's instances.
    cbs.patch_status(&cb, &PatchParams::apply("kbind-resync").force(), &Patch::Apply(json!({
        "apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
        "status": {"conditions": [{"type": "InstancesReleased", "status": "True", "reason": "Released", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})))
        .await
        .unwrap();
    fx.run(&[]);
    support::eventually("binding gone", || async {
        cbs.get_opt(&cb).await.unwrap().is_none().then_some(())
    })
    .await;
    support::eventually("consumer CRD removed", || async {
        (!fx.installed_by(&widgets, &conn).await).then_some(())
    })
    .await;

    // Now the Connection finishes: Secret finalizer released (the Secret itself stays), then its own.
    fx.run(&[]);
    support::eventually("connection gone", || async {
        conns.get_opt(&conn).await.unwrap().is_none().then_some(())
    })
    .await;
    let secret = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .get("provider")
        .await
        .expect("never deleted");
    assert!(
        !secret
            .finalizers()
            .iter()
            .any(|f| f == "core.kbind.io/cleanup")
    );
    // Provider data is never deleted because of an unbind.
    assert!(
        Api::<CustomResourceDefinition>::all(fx.provider.clone())
            .get_opt(&widgets)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn unusable_providers_give_a_clear_condition_and_change_nothing() {
    let fx = Fx::new("hostile").await;
    let good = fx.provider_kubeconfig();
    // A closed port on loopback, a TLS name the serving certificate does not carry, a token the
    // provider rejects.
    let unreachable = kbind_testkit::faults::with_server(&good, "https://127.0.0.1:1");
    let tls = good.replace(
        "    server:",
        "    tls-server-name: not-the-provider.example\n    server:",
    );
    let expired = good
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                "    token: expired-or-revoked"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let cases = [
        ("unreachable", unreachable, "Unreachable"),
        ("tls", tls, "Unreachable"),
        ("token", expired, "CredentialRejected"),
    ];
    let mut conns = Vec::new();
    for (name, kubeconfig, _) in &cases {
        fx.secret(name, "kubeconfig", kubeconfig).await;
        conns.push(
            fx.connection(name, name, json!({"source": "CRD"}), false)
                .await,
        );
    }
    let (code, summary, stderr) = fx.try_pass("schema", &[]);
    assert_eq!(
        code, 0,
        "a broken provider is a condition, not a failed pass: {summary} {stderr}"
    );
    for ((what, _, reason), conn) in cases.iter().zip(&conns) {
        let st = fx.conn(conn).await.status.unwrap();
        let (s, r, m) = cond(&st.conditions, "Connected");
        assert_eq!((s, r), ("False", *reason), "{what}: {m}");
        assert!(
            !m.contains("expired-or-revoked"),
            "{what}: the token leaked into status: {m}"
        );
        assert_eq!(cond(&st.conditions, "Ready").0, "False");
        assert!(st.remote_cluster_uid.is_none(), "{what}: nothing pinned");
    }
    assert!(
        !stderr.contains("expired-or-revoked"),
        "the token leaked into logs"
    );

    // An exported CRD without a served version cannot be pulled, and the binding says so.
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("ghosts.{}", fx.group), "labels": {"core.kbind.io/exported": "true"}},
        "spec": {"group": fx.group, "scope": "Namespaced", "names": {"plural": "ghosts", "kind": "Ghost"},
            "versions": [{"name": "v1", "served": false, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}))
    .unwrap();
    support::apply_crds(&fx.provider, &[crd]).await;
    fx.secret("good", "kubeconfig", &good).await;
    let conn = fx
        .connection("good", "good", json!({"source": "CRD"}), false)
        .await;
    let ghosts = format!("ghosts.{}", fx.group);
    let cb = fx.cluster_binding("cb", &conn, &[&ghosts]).await;
    fx.run(&[]);
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("False", "ExportUnusable"), "{m}");
    assert!(m.contains("no served version"), "{m}");
    assert!(fx.consumer_crd(&ghosts).await.is_none());
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_finding_the_lease_held_skips_and_a_short_deadline_stops_taking_work() {
    let fx = Fx::new("lease").await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    // Another run holds the Lease.
    let held = kbind::pass::lease::acquire(
        fx.consumer.clone(),
        &fx.ns,
        "kbind-schema",
        "other-run",
        600,
    )
    .await
    .unwrap();
    let s = fx.run(&[]);
    assert_eq!(s["outcome"], "skipped", "{s}");
    assert!(
        s["message"].as_str().unwrap().contains("other-run"),
        "names the holder: {s}"
    );
    assert!(
        fx.conn(&conn).await.status.is_none(),
        "a skipped run writes nothing"
    );
    if let kbind::pass::lease::Acquired::Held(g) = held {
        g.release(None, None).await;
    }
    // A deadline too short for any work: the run stops cleanly, exit 0, and says why.
    let s = fx.run(&["--deadline", "1s"]);
    assert_eq!(s["outcome"], "partial", "{s}");
    assert!(s["message"].as_str().unwrap().contains("Deadline"), "{s}");
    assert!(fx.conn(&conn).await.status.is_none());
    // Bad flags are a usage error (exit 2) that names the problem.
    let (code, _, stderr) = support::kbind(&["schema", "--shard", "4/4"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("invalid shard"), "{stderr}");
}

/// The crash scenario: what a cold run must do for two Connections, ten data writes in all.
/// Connection `a` (ClusterBinding `cb`) creates three consumer CRDs, updates a fourth installed
/// from an older provider schema, and removes the three CRDs of its deleting ClusterBinding
/// `old`; Connection `b` (a namespaced Binding) creates three.
struct Scene {
    fx: Fx,
    /// Consumer CRDs the run installs or updates, then the ones it removes.
    apis: Vec<String>,
    conns: [String; 2],
    /// ClusterBindings `cb` and `old`, Binding `nb`.
    cbs: [String; 2],
    nb: String,
}

const SCENE_WRITES: u64 = 10;
const STALE_HASH: &str = "from-an-older-schema";

/// A consumer CRD as a run of Connection `conn` (kbind's field manager and markers) would have
/// left it, made from a schema with property `prop`.
fn marked_crd(group: &str, plural: &str, conn: &str, prop: &str) -> CustomResourceDefinition {
    let kind = format!(
        "{}{}",
        plural[..1].to_uppercase(),
        &plural[1..plural.len() - 1]
    );
    serde_json::from_value(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"),
            "labels": {"core.kbind.io/managed": "true"},
            "annotations": {"core.kbind.io/connection": conn, "core.kbind.io/schema-hash": STALE_HASH,
                "core.kbind.io/created": "true"}},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind, "singular": &plural[..plural.len() - 1]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {prop: {"type": "string"}}}}}}}]}}))
    .unwrap()
}

/// A ClusterBinding `old` of `conn` for `apis`, being deleted, its instances released by resync:
/// the schema pass removes its CRDs and then its finalizer.
async fn deleting_cluster_binding(fx: &Fx, conn: &str, apis: &[String]) -> String {
    let old = format!("{}-old", fx.label);
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    let body = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
        "metadata": {"name": old, "labels": {"kbind-test": fx.label}},
        "spec": {"connectionRef": {"name": conn}, "apis": apis.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}});
    cbs.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap();
    // The finalizer as an earlier schema run added it (its own field manager, which releases it).
    let finalizer = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
        "metadata": {"name": old, "finalizers": ["core.kbind.io/cleanup"]}});
    let manager = format!("{}-finalizer", kbind::api::keys::field_manager("schema"));
    cbs.patch(
        &old,
        &PatchParams::apply(&manager),
        &Patch::Apply(&finalizer),
    )
    .await
    .unwrap();
    cbs.patch_status(
        &old,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"conditions": [{"type": "InstancesReleased", "status": "True",
            "reason": "Released", "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}}),
        ),
    )
    .await
    .unwrap();
    cbs.delete(&old, &Default::default()).await.unwrap();
    old
}

async fn scene() -> Scene {
    let fx = Fx::new("crash").await;
    let mut apis = Vec::new();
    for plural in [
        "alphas", "betas", "gammas", "deltas", "epsilons", "zetas", "etas",
    ] {
        apis.push(
            fx.provider_crd(plural, "Namespaced", Some("true"), None)
                .await,
        );
    }
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let a = fx
        .connection("a", "provider", json!({"source": "CRD"}), false)
        .await;
    let b = fx
        .connection("b", "provider", json!({"source": "CRD"}), false)
        .await;
    let refs: Vec<&str> = apis.iter().map(String::as_str).collect();
    let cb = fx.cluster_binding("cb", &a, &refs[..4]).await;
    let nb = fx.binding("nb", &b, &refs[4..]).await;
    // deltas was installed by an earlier run from an older provider schema.
    let manager = kbind::api::keys::field_manager("schema");
    let crds: Api<CustomResourceDefinition> = Api::all(fx.consumer.clone());
    let mut marked = vec![marked_crd(&fx.group, "deltas", &a, "old")];
    for plural in ["thetas", "iotas", "kappas"] {
        marked.push(marked_crd(&fx.group, plural, &a, "size"));
        apis.push(format!("{plural}.{}", fx.group));
    }
    for crd in &marked {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply(&manager),
            &Patch::Apply(crd),
        )
        .await
        .unwrap();
    }
    // ClusterBinding `old` of Connection a is being deleted and resync released its instances:
    // its CRDs go.
    let old = deleting_cluster_binding(&fx, &a, &apis[7..]).await;
    Scene {
        fx,
        apis,
        conns: [a, b],
        cbs: [cb, old],
        nb,
    }
}

impl Scene {
    fn args<'a>(&'a self, kc: &'a str, selector: &'a str, lease_ns: &'a str) -> Vec<&'a str> {
        vec![
            "schema",
            "--kubeconfig",
            kc,
            "--lease-namespace",
            lease_ns,
            "--credential-namespace",
            &self.fx.ns,
            "--selector",
            selector,
            "-o",
            "json",
            // One CRD at a time: crash point n is the same write on every run.
            "--write-concurrency",
            "1",
        ]
    }

    /// Run `kbind schema` with its Lease in `lease_ns`; returns (exit code, summary, stderr).
    fn run(&self, lease_ns: &str, env: &[(&str, &str)]) -> (i32, serde_json::Value, String) {
        let kc = self.fx.env.consumer.to_string_lossy().to_string();
        let selector = format!("kbind-test={}", self.fx.label);
        let mut cmd = support::kbind_command(&self.args(&kc, &selector, lease_ns));
        cmd.envs(env.iter().copied());
        support::outcome(cmd.output().expect("run kbind"))
    }

    /// Run `kbind schema` and send it `signal` once `trigger` completes.
    async fn signalled(
        &self,
        signal: &str,
        trigger: impl std::future::Future<Output = ()>,
    ) -> std::process::Output {
        let kc = self.fx.env.consumer.to_string_lossy().to_string();
        let selector = format!("kbind-test={}", self.fx.label);
        let cmd = support::kbind_command(&self.args(&kc, &selector, &self.fx.ns));
        support::signalled_mid_run(cmd, signal, trigger).await
    }

    /// A run in a fresh Lease namespace, as an operator finishes the work of a run that died
    /// holding its Lease.
    async fn rerun_elsewhere(&self) -> (i32, serde_json::Value, String) {
        let other = support::namespace(&self.fx.consumer, "crash-rerun").await;
        self.run(
            &other,
            &[("KBIND_CREDENTIAL_NAMESPACES", self.fx.ns.as_str())],
        )
    }

    /// Resolves once the run has written anything of this scene.
    async fn first_write(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the pass wrote none of its CRDs within 60 s"
            );
            for api in &self.apis[..7] {
                let written = self.fx.consumer_crd(api).await.is_some_and(|c| {
                    c.annotations().get("core.kbind.io/schema-hash")
                        != Some(&STALE_HASH.to_string())
                });
                if written {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Everything the pass owns, with this fixture's names and timestamps taken out: consumer CRDs
    /// (markers and spec), Connection and binding status and finalizers. Also the installed CRDs,
    /// the data a consumer relies on.
    async fn state(&self) -> (serde_json::Value, BTreeSet<String>) {
        let fx = &self.fx;
        // A schema hash covers the API's name, so each fixture's differ: name them by API.
        let mut names: Vec<(String, String)> = Vec::new();
        for c in &self.conns {
            for e in fx.conn(c).await.status.unwrap_or_default().exported_apis {
                if e.name.ends_with(&fx.group) && !e.schema_hash.is_empty() {
                    let api = e.name.replace(&fx.group, "GROUP");
                    names.push((e.schema_hash, format!("hash-of-{api}")));
                }
            }
        }
        names.extend([
            (fx.group.clone(), "GROUP".to_string()),
            (fx.label.clone(), "LABEL".to_string()),
            (fx.ns.clone(), "NS".to_string()),
        ]);
        let names: Vec<(&str, &str)> = names
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let drop = [
            "lastTransitionTime",
            "lastPassTime",
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
        ];
        let norm = |v: serde_json::Value| support::normalized(&v, &drop, &names);
        let mut crds = serde_json::Map::new();
        let mut installed = BTreeSet::new();
        for api in &self.apis {
            let key = api.replace(&fx.group, "GROUP");
            let v = match fx.consumer_crd(api).await {
                Some(c) if c.metadata.deletion_timestamp.is_none() => {
                    let kbind_keys = |m: Option<std::collections::BTreeMap<String, String>>| {
                        m.unwrap_or_default()
                            .into_iter()
                            .filter(|(k, _)| k.starts_with("core.kbind.io/"))
                            .collect::<std::collections::BTreeMap<_, _>>()
                    };
                    let ann = kbind_keys(c.metadata.annotations.clone());
                    let hash = ann
                        .get("core.kbind.io/schema-hash")
                        .cloned()
                        .unwrap_or_default();
                    installed.insert(norm(json!(format!("{key}@{hash}"))).to_string());
                    json!({"labels": kbind_keys(c.metadata.labels), "annotations": ann, "spec": c.spec})
                }
                _ => serde_json::Value::Null,
            };
            crds.insert(key, norm(v));
        }
        let mut conns = Vec::new();
        for c in &self.conns {
            let c = fx.conn(c).await;
            let mut st = c.status.unwrap_or_default();
            st.exported_apis.retain(|e| e.name.ends_with(&fx.group));
            conns.push(norm(
                json!({"finalizers": c.metadata.finalizers, "status": st}),
            ));
        }
        let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
        let mut bindings = Vec::new();
        for cb in &self.cbs {
            let b = cbs.get_opt(cb).await.unwrap();
            bindings.push(norm(json!(b.map(|b| json!({
                "finalizers": b.metadata.finalizers, "status": b.status})))));
        }
        let nb = Api::<Binding>::namespaced(fx.consumer.clone(), &fx.ns)
            .get(&self.nb)
            .await
            .unwrap();
        bindings.push(norm(
            json!({"finalizers": nb.metadata.finalizers, "status": nb.status}),
        ));
        let secret = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
            .get("provider")
            .await
            .unwrap();
        let state = json!({"crds": crds, "connections": conns, "bindings": bindings,
            "secretFinalizers": secret.metadata.finalizers});
        (state, installed)
    }
}

/// The state one uninterrupted cold run of the crash scenario ends in.
async fn uninterrupted() -> (serde_json::Value, BTreeSet<String>) {
    let s = scene().await;
    let (code, summary, stderr) = s.run(&s.fx.ns, &[]);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(
        summary["data_writes"], SCENE_WRITES,
        "the scenario's cold run: {summary}"
    );
    let (state, installed) = s.state().await;
    assert_eq!(installed.len(), 7, "{state}");
    (state, installed)
}

/// Crash points: a run aborted right after each of its data writes (the crash knob), then a
/// run in another Lease namespace, ends in exactly the state of an uninterrupted run, and the
/// rerun writes exactly what the crashed run did not: nothing redone, nothing skipped.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_killed_after_any_write_then_rerun_converges() {
    let _hold = ProviderHold::shared();
    let (want, want_crds) = uninterrupted().await;
    let mut tally = support::Tally::new("schema", "writes");
    for n in support::crash_points("schema writes", SCENE_WRITES) {
        let s = scene().await;
        let (code, _, stderr) = s.run(&s.fx.ns, &[(kbind::pass::crash::ENV, &n.to_string())]);
        assert_ne!(code, 0, "crash point {n} did not stop the run: {stderr}");
        assert!(stderr.contains("reached"), "{stderr}");
        let (code, summary, stderr) = s.rerun_elsewhere().await;
        if code != 0 {
            tally.failed(&format!("write {n}"), format!("rerun: {summary}\n{stderr}"));
            continue;
        }
        let (got, got_crds) = s.state().await;
        tally.point(
            &format!("write {n}"),
            &(&want, SCENE_WRITES - n),
            &(&got, summary["data_writes"].as_u64().unwrap_or(u64::MAX)),
            &want_crds,
            &got_crds,
        );
    }
    tally.finish();
}

/// Signals: a run killed (SIGKILL) at some moment after its first write, then rerun elsewhere,
/// converges; a run sent SIGTERM stops taking work, records its progress, exits 0 and releases
/// its Lease, so the next scheduled run (same Lease namespace) finishes the work, writing exactly
/// what the stopped run did not.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_killed_or_terminated_at_any_moment_then_rerun_converges() {
    let _hold = ProviderHold::shared();
    let (want, want_crds) = uninterrupted().await;
    let mut tally = support::Tally::new("schema", "signals");
    for (signal, delays) in [
        ("KILL", support::kill_delays("schema SIGKILL", &[50], 1500)),
        ("TERM", support::kill_delays("schema SIGTERM", &[0], 1500)),
    ] {
        for delay in delays {
            let point = format!("SIG{signal} {}ms after the first write", delay.as_millis());
            let s = scene().await;
            let out = s
                .signalled(signal, async {
                    s.first_write().await;
                    tokio::time::sleep(delay).await;
                })
                .await;
            let killed = out.status.code().is_none();
            let (code, first, stderr) = support::outcome(out);
            println!(
                "{point}: killed by the signal: {killed}, outcome {}, data writes {}",
                first["outcome"], first["data_writes"]
            );
            let (code, summary, stderr) = if signal == "TERM" {
                // Stopped cleanly (or finished first): a summary, exit 0, the Lease released,
                // so the next scheduled run, same Lease namespace, finishes the work.
                assert_eq!(code, 0, "{point}: {first}\n{stderr}");
                // The signal landed mid-pass (signalled_mid_run): the run stopped taking work and
                // said why.
                assert_eq!(first["outcome"], "partial", "{point}: {first}");
                assert!(
                    first["message"].as_str().unwrap().contains("Terminated"),
                    "{point}: {first}"
                );
                s.run(&s.fx.ns, &[])
            } else {
                s.rerun_elsewhere().await
            };
            if code != 0 || summary["outcome"] != "completed" {
                tally.failed(&point, format!("rerun: {summary}\n{stderr}"));
                continue;
            }
            // After SIGTERM the two runs' writes add up to one uninterrupted run's.
            let writes = |v: &serde_json::Value| v["data_writes"].as_u64();
            let (want_writes, got_writes) = match signal {
                "TERM" => (
                    Some(SCENE_WRITES),
                    writes(&first).zip(writes(&summary)).map(|(a, b)| a + b),
                ),
                _ => (None, None),
            };
            let (got, got_crds) = s.state().await;
            tally.point(
                &point,
                &(&want, want_writes),
                &(&got, got_writes),
                &want_crds,
                &got_crds,
            );
        }
    }
    tally.finish();
}

/// A CRD of a deleting ClusterBinding that is already being deleted (the next run after one that
/// deleted it, while the apiserver still finishes) is not deleted again: the run releases the
/// binding and counts no write. Found by the crash soak: a run right after a completed one
/// re-issued the delete.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_crd_already_being_deleted_is_not_deleted_again() {
    let fx = Fx::new("redelete").await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let a = fx
        .connection("a", "provider", json!({"source": "CRD"}), false)
        .await;
    // Held in Terminating by a finalizer of the test's, as the apiserver's own cleanup holds it
    // for a moment.
    let mut crd = marked_crd(&fx.group, "thetas", &a, "size");
    crd.metadata.finalizers = Some(vec!["kbind.test/hold".into()]);
    let crds: Api<CustomResourceDefinition> = Api::all(fx.consumer.clone());
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply(&kbind::api::keys::field_manager("schema")),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    crds.delete(&name, &Default::default()).await.unwrap();
    let old = deleting_cluster_binding(&fx, &a, std::slice::from_ref(&name)).await;
    let s = fx.run(&[]);
    assert_eq!(s["data_writes"], 0, "nothing to redo: {s}");
    assert!(
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .get_opt(&old)
            .await
            .unwrap()
            .is_none(),
        "the binding's teardown finished"
    );
    crds.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// Let `user` read the cluster identity (the kube-system Namespace) and nothing else.
async fn grant_identity_read(provider: &Client, label: &str, user: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let name = format!("{label}-identity");
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}]})).unwrap();
    let rb: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": user}]}))
    .unwrap();
    Api::<ClusterRole>::all(provider.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(provider.clone())
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_forbidden_identity_read_is_reported_never_skipped() {
    let fx = Fx::new("idforbid").await;
    let pns = support::namespace(&fx.provider, "idforbid").await;
    let nobody = support::service_account_kubeconfig(&fx.env.provider, &pns, "nobody").await;
    fx.secret("nobody", "kubeconfig", &nobody).await;
    let conn = fx
        .connection("p", "nobody", json!({"source": "CRD"}), false)
        .await;
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap();
    let (s, r, m) = cond(&st.conditions, "Connected");
    assert_eq!((s, r), ("False", "IdentityForbidden"), "{m}");
    assert_eq!(
        cond(&st.conditions, "PermissionDenied").1,
        "IdentityForbidden"
    );
    assert!(
        st.remote_cluster_uid.is_none(),
        "nothing pinned without an identity"
    );
    assert!(
        st.exported_apis.is_empty(),
        "no discovery without an identity check"
    );
}

/// Connection status writes run beside the next Connection's reconcile (src/schema/apply.rs
/// `StatusWrites`). One that fails there is still the run's failure: counted as an error, that
/// Connection not counted Ready, the other Connections' statuses written; and the next run
/// writes it.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_status_write_refused_in_the_background_is_an_error_and_the_next_run_writes_it() {
    let fx = Fx::new("stwrite").await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let ok = fx
        .connection("ok", "provider", json!({"source": "CRD"}), false)
        .await;
    let refused = fx
        .connection("refused", "provider", json!({"source": "CRD"}), false)
        .await;
    // An admission policy refuses (403) every status write of the second Connection.
    let denial = support::Denial::create(
        &fx.consumer,
        &format!("{}-deny-status", fx.label),
        ("core.kbind.io", "connections/status", &["UPDATE"]),
        &format!("object.metadata.name != '{refused}'"),
        "this Connection's status may not be written",
    )
    .await;
    // Admission policies take effect asynchronously: wait until a dry-run status write is
    // refused.
    let conns = Api::<Connection>::all(fx.consumer.clone());
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = json!({"status": {"observedGeneration": 1}});
    support::eventually("the admission policy in effect", || async {
        matches!(conns.patch_status(&refused, &dry, &Patch::Merge(&probe)).await,
            Err(kube::Error::Api(s)) if s.code == 403)
        .then_some(())
    })
    .await;

    let (_, first, stderr) = fx.try_pass("schema", &["--write-concurrency", "4"]);
    assert_eq!(first["counts"]["errors"], 1, "{first}\n{stderr}");
    assert_eq!(first["counts"]["ready"], 1, "{first}");
    assert!(
        stderr.contains("connection status not written"),
        "the failure is logged: {stderr}"
    );
    let st = fx.conn(&ok).await.status.unwrap_or_default();
    assert_eq!(cond(&st.conditions, "Ready").0, "True");
    assert!(
        fx.conn(&refused)
            .await
            .status
            .is_none_or(|s| s.conditions.is_empty()),
        "nothing was written for the refused Connection"
    );

    denial.delete().await;
    support::eventually("the admission policy gone", || async {
        conns
            .patch_status(&refused, &dry, &Patch::Merge(&probe))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    let second = fx.run(&["--write-concurrency", "4"]);
    assert_eq!(
        second["counts"]["errors"].as_u64().unwrap_or(0),
        0,
        "{second}"
    );
    assert_eq!(second["counts"]["ready"], 2, "{second}");
    let st = fx.conn(&refused).await.status.unwrap_or_default();
    assert_eq!(cond(&st.conditions, "Ready").0, "True");
    // And then it stays written: a third run writes nothing but its Lease (and, should a
    // concurrent test have changed the shared provider's exports meanwhile, the two statuses
    // listing them).
    let exports = || async {
        let mut all = Vec::new();
        for c in [&ok, &refused] {
            all.push(fx.conn(c).await.status.unwrap_or_default().exported_apis);
        }
        all
    };
    let before = exports().await;
    let third = fx.run(&["--write-concurrency", "4"]);
    assert_eq!(third["data_writes"], 0, "{third}");
    let moved = exports().await != before;
    assert_eq!(
        third["bookkeeping_writes"],
        if moved { 4 } else { 2 },
        "{third}"
    );
    assert_eq!(
        fx.conn(&refused)
            .await
            .status
            .unwrap_or_default()
            .conditions,
        st.conditions,
        "no condition changed"
    );
}

/// A provider kubeconfig naming its server by host (here `localhost`, which the test servers'
/// certificates name): the host is resolved once, checked, and connected to at that address,
/// with TLS verified against the host (#28 item 9). Discovery, the CRD install and sync work
/// as with an address, over two runs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_provider_named_by_host_is_reached_at_the_address_it_was_checked_at() {
    let fx = Fx::new("byname").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let named = fx
        .provider_kubeconfig()
        .replace("https://127.0.0.1:", "https://localhost:");
    assert!(named.contains("https://localhost:"), "{named}");
    fx.secret("provider", "kubeconfig", &named).await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    fx.binding("b", &conn, &[&widgets]).await;
    for round in 1..=2 {
        fx.run(&[]);
        let st = fx.conn(&conn).await.status.unwrap();
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True", "round {round}: {:?}", st.conditions);
        assert_eq!(
            st.remote_cluster_uid.as_deref(),
            Some(kube_system_uid(&fx.provider).await.as_str())
        );
    }
    assert!(fx.consumer_crd(&widgets).await.is_some());
}

/// #28 item 5 (docs/operations.md "Poison items"): a Connection runs keep dying on starves every
/// Connection after it, on every run, until it is skipped: once two runs in a row are known to
/// have died on it. Here the crash knob kills each run as it starts on Connection `a`, as a
/// provider answer blowing the pod's memory would. Deaths not in a row quarantine nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_connection_two_runs_in_a_row_died_on_is_skipped_until_it_changes() {
    use k8s_openapi::api::coordination::v1::Lease;
    let fx = Fx::new("poison").await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let bad = fx
        .connection("a", "provider", json!({"source": "CRD"}), false)
        .await;
    let good = fx
        .connection("b", "provider", json!({"source": "CRD"}), false)
        .await;
    let item = format!("Connection/{bad}");
    let knob = [("KBIND_CRASH_AT_ITEM", item.as_str())];
    // A dying run holds a 1 s Lease: it expires before the next run, as a CronJob's would.
    let lease_flags = ["--lease-duration", "1s"];
    let leases = Api::<Lease>::namespaced(fx.consumer.clone(), &fx.ns);
    let annotation = |l: &Lease, k: &str| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k).cloned())
    };
    let ready = |c: Connection| {
        let st = c.status.unwrap_or_default();
        let (s, r, m) = cond(&st.conditions, "Ready");
        (s.to_string(), r.to_string(), m.to_string())
    };
    let dies = |what: &str| {
        let (code, s, stderr) = fx.try_pass_env("schema", &lease_flags, &knob);
        assert_ne!(code, 0, "{what}: {s}\n{stderr}");
        assert!(stderr.contains("reached, aborting"), "{what}: {stderr}");
        std::thread::sleep(std::time::Duration::from_millis(1500));
    };

    // Deaths in a row at `a`: `b`, after it, is never reached. The first names nothing (it
    // died before any renewal recorded `a`); the careful runs after it record `a` first.
    dies("run 1");
    assert!(fx.conn(&good).await.status.is_none(), "starved");
    dies("run 2");
    dies("run 3");
    let lease = leases.get("kbind-schema").await.unwrap();
    assert_eq!(
        annotation(&lease, "kbind.io/suspects").as_deref(),
        Some(format!("{item}@1").as_str()),
        "run 2 died on `a`"
    );
    assert_eq!(
        annotation(&lease, "kbind.io/working-on").as_deref(),
        Some(format!("{item}@1").as_str()),
        "a careful run records each item before working on it"
    );
    assert!(fx.conn(&good).await.status.is_none(), "still starved");

    // The next run skips `a` (two runs in a row died on it), says so, and serves `b`; the
    // provider is still poison.
    let (code, s, stderr) = fx.try_pass_env("schema", &[], &knob);
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["counts"]["quarantined"], 1, "{s}");
    assert_eq!(s["counts"]["ready"], 1, "{s}");
    assert_eq!(ready(fx.conn(&good).await).0, "True");
    let c = fx.conn(&bad).await;
    let uid = c.uid().unwrap();
    let (st, reason, message) = ready(c);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "Quarantined"));
    assert!(message.contains("generation 1"), "{message}");
    assert!(message.contains("kbind.io/quarantined"), "{message}");
    let note = support::event_note(&fx.consumer, "default", "Quarantined", &uid)
        .await
        .expect("a Quarantined Event on the Connection");
    assert!(note.contains("two runs in a row died"), "{note}");
    let lease = leases.get("kbind-schema").await.unwrap();
    assert_eq!(
        annotation(&lease, "kbind.io/quarantined").as_deref(),
        Some(format!("{item}@1").as_str()),
        "the record survives release"
    );
    assert_eq!(
        annotation(&lease, "kbind.io/suspects"),
        None,
        "this run lived"
    );
    assert_eq!(annotation(&lease, "kbind.io/working-on"), None);

    // The next runs leave `a` alone (`b`, served for the first time by the run before, may
    // settle one more status write), then write nothing but the Lease (unless the shared
    // provider's export list moved under `b`: assert_unchanged_pass).
    let rv = fx.conn(&bad).await.resource_version();
    let (code, s, stderr) = fx.try_pass_env("schema", &[], &knob);
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(fx.conn(&bad).await.resource_version(), rv, "{s}");
    fx.assert_unchanged_pass(&good).await;
    assert_eq!(fx.conn(&bad).await.resource_version(), rv);
    assert_eq!(ready(fx.conn(&bad).await).1, "Quarantined");

    // A person changes its spec (the provider was fixed): it is tried again and leaves the
    // record.
    Api::<Connection>::all(fx.consumer.clone())
        .patch(
            &bad,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"adoptionNamespaces": {}}})),
        )
        .await
        .unwrap();
    fx.run(&[]);
    assert_eq!(ready(fx.conn(&bad).await).0, "True");
    let lease = leases.get("kbind-schema").await.unwrap();
    assert_eq!(annotation(&lease, "kbind.io/quarantined"), None);

    // Deaths not in a row quarantine nothing: a run that lives ends the care.
    for round in 1..=2 {
        dies(&format!("round {round}"));
        let s = fx.run(&[]);
        assert_eq!(s["counts"].get("quarantined"), None, "round {round}: {s}");
        assert!(s["leaseTakenOver"].is_string(), "round {round}: {s}");
        assert_eq!(ready(fx.conn(&bad).await).0, "True", "round {round}");
    }
}
