//! `kbind schema` and `kbind resync` as users run them: without `--selector`. Only such a run
//! reports a binding whose Connection does not exist (`ConnectionNotFound`) and tears down a
//! deleted binding whose Connection is gone (src/schema/mod.rs); every other test passes a
//! selector.
//!
//! A run without a selector reconciles every object on the shared servers, other tests' included.
//! So each test here first takes [`support::unscoped_lock`]: it waits until no other server test
//! process lives (each holds that lock shared from its first `support::env()`) and keeps new ones
//! out while it runs. What earlier tests left behind stays: the runs here reconcile it too (its
//! Secrets are outside the credential namespace these runs allow, so only status and teardown
//! writes reach it), and the tests assert on their own objects, plus that leftovers settle, so a
//! crash point lands on a write of this test. The runs keep their Lease and credential namespace
//! in the test's own namespace (neither is a selector).

mod support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::{Binding, ClusterBinding, Connection};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fx::{Fx, cond};

/// `kbind <pass>` without `--selector`, its Lease in `lease_ns`, then `extra`; (exit code,
/// summary, stderr).
fn kbind_unscoped(
    fx: &Fx,
    pass: &str,
    lease_ns: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (i32, Value, String) {
    let kc = fx.env.consumer.to_string_lossy().to_string();
    let mut args = vec![
        pass,
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        lease_ns,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let mut cmd = support::kbind_command(&args);
    cmd.envs(envs.iter().copied());
    support::outcome(cmd.output().expect("run kbind"))
}

/// [`kbind_unscoped`] reading Connection Secrets in the test's own namespace.
fn unscoped(fx: &Fx, pass: &str, lease_ns: &str, envs: &[(&str, &str)]) -> (i32, Value, String) {
    kbind_unscoped(
        fx,
        pass,
        lease_ns,
        &["--credential-namespace", &fx.ns],
        envs,
    )
}

/// An unscoped run that must exit 0 (a refused or broken foreign object is a condition on it,
/// never the run's failure).
fn run(fx: &Fx, pass: &str) -> Value {
    run_in(fx, pass, &fx.ns)
}

/// [`run`] with its Lease in `lease_ns` (after a crashed run, whose Lease stays held).
fn run_in(fx: &Fx, pass: &str, lease_ns: &str) -> Value {
    let (code, summary, stderr) = unscoped(fx, pass, lease_ns, &[]);
    assert_eq!(code, 0, "unscoped kbind {pass}: {summary}\n{stderr}");
    summary
}

/// Rounds of schema then resync until one writes no data at all: what earlier tests left is
/// reconciled and stays put. At most 8 rounds; then the failure shows what a dry run would
/// still write.
fn settle(fx: &Fx) {
    let mut last = Vec::new();
    for _ in 0..8 {
        let (schema, resync) = (run(fx, "schema"), run(fx, "resync"));
        if schema["data_writes"] == 0 && resync["data_writes"] == 0 {
            return;
        }
        last = vec![schema, resync];
    }
    let (_, plan, _) = support::kbind(&[
        "schema",
        "--kubeconfig",
        &fx.env.consumer.to_string_lossy(),
        "--credential-namespace",
        &fx.ns,
        "--dry-run",
        "-o",
        "json",
    ]);
    panic!(
        "unscoped runs never settled: {last:?}\na dry run plans: {}",
        plan["planned"]
    );
}

/// The resourceVersion of `obj`: equal before and after a run means the run wrote nothing on it.
fn version<K: kube::Resource>(obj: &K) -> String {
    obj.meta().resource_version.clone().unwrap_or_default()
}

fn widgets(fx: &Fx) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&fx.group, "v1", "Widget"), "widgets")
}

async fn widget(fx: &Fx, name: &str) {
    let mut o = DynamicObject::new(name, &widgets(fx)).data(json!({"spec": {"size": 1}}));
    o.metadata.namespace = Some(fx.ns.clone());
    Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &widgets(fx))
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": fx.ns}})).unwrap();
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.provider.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

/// Spec 000: "The Connection can exist before its Secret, and the Binding before its
/// Connection, controllers retry when dependencies appear." Run as users run it (no selector):
/// the Binding first says its Connection is not found, then that the Connection is not ready,
/// then binds and syncs once the Secret exists; every second run leaves it untouched.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_binding_before_its_connection_and_its_secret_binds_once_they_appear() {
    let _alone = support::unscoped_lock();
    let fx = Fx::new("unscoped-early").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let conn = format!("{}-p", fx.label);
    let b = fx.binding("b", &conn, &[&api]).await;
    let bindings = Api::<Binding>::namespaced(fx.consumer.clone(), &fx.ns);
    let get = || async { bindings.get(&b).await.unwrap() };
    let conds = |x: &Binding| x.status.clone().unwrap_or_default().conditions;

    settle(&fx);
    let st = conds(&get().await);
    let (s, r, m) = cond(&st, "Ready");
    assert_eq!((s, r), ("False", "ConnectionNotFound"), "{m}");
    assert!(m.contains(&conn), "the message names the Connection: {m}");
    assert_eq!(cond(&st, "Synced").1, "ConnectionNotFound");
    let seen = version(&get().await);
    for _ in 0..2 {
        run(&fx, "schema");
        run(&fx, "resync");
        assert_eq!(
            version(&get().await),
            seen,
            "nothing written on the Binding"
        );
    }

    // The Connection appears, before its Secret.
    fx.connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    for round in 1..=2 {
        run(&fx, "schema");
        let c = fx.conn(&conn).await.status.unwrap_or_default();
        let (s, r, m) = cond(&c.conditions, "SecretValid");
        assert_eq!((s, r), ("False", "SecretNotFound"), "round {round}: {m}");
        let st = conds(&get().await);
        let (s, r, m) = cond(&st, "Ready");
        assert_eq!(
            (s, r),
            ("False", "ConnectionNotReady"),
            "round {round}: {m}"
        );
    }
    let seen = version(&get().await);
    let s = run(&fx, "schema");
    assert_eq!(
        version(&get().await),
        seen,
        "a third run writes nothing on it: {s}"
    );

    // The Secret appears: bound, CRD installed, an object syncs.
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    run(&fx, "schema");
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    run(&fx, "schema");
    let st = conds(&get().await);
    let (s, r, m) = cond(&st, "Ready");
    assert_eq!((s, r), ("True", "Bound"), "{m}");
    widget(&fx, "w1").await;
    run(&fx, "resync");
    Api::<DynamicObject>::namespaced_with(fx.provider.clone(), &fx.ns, &widgets(&fx))
        .get("w1")
        .await
        .expect("w1 synced");
    let seen = (version(&get().await), version(&fx.conn(&conn).await));
    for _ in 0..2 {
        let (schema, resync) = (run(&fx, "schema"), run(&fx, "resync"));
        assert_eq!(
            (version(&get().await), version(&fx.conn(&conn).await)),
            seen,
            "settled: nothing written on the Binding or Connection\n{schema}\n{resync}"
        );
    }
}

/// A ClusterBinding whose Connection went without a teardown (its finalizer released by hand,
/// as `kbind uninstall` does) says `ConnectionNotFound`; deleted, it is torn down as any
/// binding: resync releases its objects, schema removes the CRD kbind created and the
/// finalizer. A run aborted right after deleting the CRD converges on the next run; a run after
/// that writes nothing. All without `--selector`, as users run it.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_binding_whose_connection_is_gone_says_so_and_is_torn_down() {
    let _alone = support::unscoped_lock();
    let fx = Fx::new("unscoped-gone").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&api]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(fx.consumer.clone());
    run(&fx, "schema");
    support::wait_established(&crds, &api).await;
    widget(&fx, "w1").await;
    settle(&fx);
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    assert_eq!(
        cond(
            &cbs.get(&cb).await.unwrap().status.unwrap().conditions,
            "Ready"
        )
        .0,
        "True"
    );

    // The Connection goes without kbind.
    let conns = Api::<Connection>::all(fx.consumer.clone());
    conns
        .patch(
            &conn,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    conns.delete(&conn, &Default::default()).await.unwrap();
    support::eventually("the Connection gone", || async {
        conns.get_opt(&conn).await.unwrap().is_none().then_some(())
    })
    .await;
    run(&fx, "schema");
    let st = cbs.get(&cb).await.unwrap().status.unwrap().conditions;
    let (s, r, m) = cond(&st, "Ready");
    assert_eq!((s, r), ("False", "ConnectionNotFound"), "{m}");
    assert!(m.contains(&conn), "{m}");
    settle(&fx);
    let seen = version(&cbs.get(&cb).await.unwrap());
    run(&fx, "schema");
    assert_eq!(version(&cbs.get(&cb).await.unwrap()), seen, "reported once");

    // Deleted: resync releases its objects, then a schema run aborted after its first data
    // write (the CRD's deletion: everything else has settled) and a rerun finish the teardown.
    cbs.delete(&cb, &Default::default()).await.unwrap();
    run(&fx, "resync");
    let released = cbs.get(&cb).await.unwrap().status.unwrap().conditions;
    assert_eq!(cond(&released, "InstancesReleased").0, "True");
    let consumer =
        Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &widgets(&fx));
    let w1 = consumer.get("w1").await.unwrap();
    assert!(
        !w1.finalizers().iter().any(|f| f == "core.kbind.io/syncer"),
        "w1 released"
    );
    let (code, _, stderr) = unscoped(&fx, "schema", &fx.ns, &[(kbind::pass::crash::ENV, "1")]);
    assert_ne!(code, 0, "aborted after its first write: {stderr}");
    let crd = crds.get_opt(&api).await.unwrap();
    assert!(
        crd.is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
        "the aborted run's one data write was this CRD's deletion"
    );
    assert!(
        cbs.get_opt(&cb).await.unwrap().is_some(),
        "the finalizer stayed: the run died before releasing it"
    );
    // The aborted run's Lease stays held until it expires: the rerun takes another, as an
    // operator would (docs/operations.md "The pass Lease").
    let rerun = support::namespace(&fx.consumer, "unscoped-rerun").await;
    let s = run_in(&fx, "schema", &rerun);
    assert_eq!(s["data_writes"], 0, "the CRD is not deleted twice: {s}");
    support::eventually("the ClusterBinding gone", || async {
        cbs.get_opt(&cb).await.unwrap().is_none().then_some(())
    })
    .await;
    support::eventually("the consumer CRD gone", || async {
        crds.get_opt(&api).await.unwrap().is_none().then_some(())
    })
    .await;
    // The provider copy stays (never deleted because of an unbind).
    Api::<DynamicObject>::namespaced_with(fx.provider.clone(), &fx.ns, &widgets(&fx))
        .get("w1")
        .await
        .expect("the provider copy stays");
    let (schema, resync) = (run_in(&fx, "schema", &rerun), run(&fx, "resync"));
    assert_eq!(schema["data_writes"], 0, "{schema}");
    assert_eq!(resync["data_writes"], 0, "{resync}");
}

/// `kbind <pass>` as installed in namespace `fx.ns` (`$POD_NAMESPACE`, no
/// `--credential-namespace` unless `credentials` names one), without `--selector`; exit 0.
fn installed(fx: &Fx, pass: &str, credentials: Option<&str>) -> Value {
    let extra: Vec<&str> = credentials.into_iter().collect();
    let (code, summary, stderr) =
        kbind_unscoped(fx, pass, &fx.ns, &extra, &[("POD_NAMESPACE", &fx.ns)]);
    assert_eq!(code, 0, "kbind {pass}: {summary}\n{stderr}");
    summary
}

/// Spec 000's example, applied verbatim (the YAML read from docs/schema.md "The spec's
/// example"): its Secret lives in `kbind`, outside the install namespace, so the Connection is
/// refused with a message that names the setting; the test then passes exactly the flag that
/// message names, and the example binds and syncs both ways. Every step over several runs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn the_specs_example_applied_verbatim_says_what_to_set_then_syncs() {
    let _alone = support::unscoped_lock();
    let fx = Fx::new("spec-example").await;
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/schema.md"))
        .expect("read docs/schema.md");
    let yaml = doc
        .split("<!-- spec-example -->\n```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/schema.md holds the spec's example");

    // The provider exports widgets.example.org; the consumer has team-a and the Secret in kbind.
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.org", "labels": {"core.kbind.io/exported": "true"}},
        "spec": {"group": "example.org", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}))
    .unwrap();
    support::apply_crds(&fx.provider, &[crd]).await;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.consumer.clone());
    for ns in ["kbind", "team-a"] {
        let body = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        let _ = namespaces.create(&PostParams::default(), &body).await;
    }
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "provider-kubeconfig"},
        "stringData": {"kubeconfig": fx.provider_kubeconfig()}}))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(fx.consumer.clone(), "kbind")
        .patch(
            "provider-kubeconfig",
            &PatchParams::apply("spec-example").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
    for object in yaml.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(object).expect("the example parses");
        match v["kind"].as_str() {
            Some("Connection") => {
                Api::<Connection>::all(fx.consumer.clone())
                    .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                    .await
                    .unwrap();
            }
            Some("Binding") => {
                Api::<Binding>::namespaced(fx.consumer.clone(), "team-a")
                    .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                    .await
                    .unwrap();
            }
            other => panic!("the example holds a {other:?}"),
        }
    }
    let connections = Api::<Connection>::all(fx.consumer.clone());
    let bindings = Api::<Binding>::namespaced(fx.consumer.clone(), "team-a");

    // 1. Refused, saying what to set; the Binding waits; further runs change nothing.
    installed(&fx, "schema", None);
    let conn = connections.get("provider").await.unwrap();
    let st = conn.status.clone().unwrap_or_default();
    let (s, r, message) = cond(&st.conditions, "SecretValid");
    assert_eq!((s, r), ("False", "SecretNamespaceNotAllowed"), "{message}");
    assert!(
        message.contains("credentialNamespaces: [kbind]"),
        "{message}"
    );
    let flag = message
        .split_whitespace()
        .find(|w| w.starts_with("--credential-namespace="))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .unwrap_or_else(|| panic!("the message names the flag: {message}"));
    assert_eq!(flag, format!("--credential-namespace={},kbind", fx.ns));
    // The Binding is told at once that its namespace is not served either, and what to set.
    let b = bindings.get("widgets").await.unwrap();
    let bst = b.status.clone().unwrap_or_default();
    let (s, r, m) = cond(&bst.conditions, "Ready");
    assert_eq!((s, r), ("False", "NamespaceNotAllowed"), "{m}");
    let admit = selector_in(m);
    assert_eq!(
        admit,
        json!({"matchLabels": {"kubernetes.io/metadata.name": "team-a"}})
    );
    let seen = (version(&conn), version(&b));
    for _ in 0..2 {
        installed(&fx, "schema", None);
        installed(&fx, "resync", None);
        let now = (
            version(&connections.get("provider").await.unwrap()),
            version(&bindings.get("widgets").await.unwrap()),
        );
        assert_eq!(now, seen, "nothing written on the example while refused");
    }

    // 2. With the setting the Connection's message names: Ready; the Binding still refused, so
    // no CRD is installed for it.
    installed(&fx, "schema", Some(&flag));
    let st = connections.get("provider").await.unwrap().status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "True", "{st:?}");
    let bst = bindings.get("widgets").await.unwrap().status.unwrap();
    assert_eq!(cond(&bst.conditions, "Ready").1, "NamespaceNotAllowed");
    let crds = Api::<CustomResourceDefinition>::all(fx.consumer.clone());
    assert!(crds.get_opt("widgets.example.org").await.unwrap().is_none());

    // 3. With the setting the Binding's message names: the CRD installed, the Binding bound.
    connections
        .patch(
            "provider",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"bindingNamespaces": admit}})),
        )
        .await
        .unwrap();
    installed(&fx, "schema", Some(&flag));
    support::wait_established(&Api::all(fx.consumer.clone()), "widgets.example.org").await;
    installed(&fx, "schema", Some(&flag));
    let bst = bindings.get("widgets").await.unwrap().status.unwrap();
    let (s, r, m) = cond(&bst.conditions, "Ready");
    assert_eq!((s, r), ("True", "Bound"), "{m}");

    // 4. A Widget in team-a goes up; its status comes back down.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.org", "v1", "Widget"),
        "widgets",
    );
    let mine = Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), "team-a", &ar);
    let theirs = Api::<DynamicObject>::namespaced_with(fx.provider.clone(), "team-a", &ar);
    mine.create(
        &PostParams::default(),
        &DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
    installed(&fx, "resync", Some(&flag));
    let mut copy = theirs.get("w1").await.expect("w1 reached the provider");
    assert_eq!(copy.data["spec"], json!({"size": 2}));
    copy.data["status"] = json!({"phase": "Ready"});
    theirs
        .replace_status("w1", &PostParams::default(), &copy)
        .await
        .unwrap();
    installed(&fx, "resync", Some(&flag));
    assert_eq!(
        mine.get("w1").await.unwrap().data["status"]["phase"],
        "Ready"
    );
    let seen = (
        version(&connections.get("provider").await.unwrap()),
        version(&bindings.get("widgets").await.unwrap()),
        version(&mine.get("w1").await.unwrap()),
    );
    for _ in 0..2 {
        installed(&fx, "schema", Some(&flag));
        installed(&fx, "resync", Some(&flag));
        let now = (
            version(&connections.get("provider").await.unwrap()),
            version(&bindings.get("widgets").await.unwrap()),
            version(&mine.get("w1").await.unwrap()),
        );
        assert_eq!(now, seen, "synced: a further run writes nothing");
    }

    // Leave the shared servers as they were: unbind (the provider's copy stays), forget the
    // Connection, then the example's namespaces and the provider CRD.
    bindings
        .delete("widgets", &Default::default())
        .await
        .unwrap();
    for _ in 0..4 {
        installed(&fx, "resync", Some(&flag));
        installed(&fx, "schema", Some(&flag));
        if bindings.get_opt("widgets").await.unwrap().is_none() {
            break;
        }
    }
    assert!(bindings.get_opt("widgets").await.unwrap().is_none());
    assert!(
        theirs.get_opt("w1").await.unwrap().is_some(),
        "the provider's copy stays"
    );
    connections
        .delete("provider", &Default::default())
        .await
        .unwrap();
    for _ in 0..4 {
        installed(&fx, "schema", Some(&flag));
        if connections.get_opt("provider").await.unwrap().is_none() {
            break;
        }
    }
    assert!(connections.get_opt("provider").await.unwrap().is_none());
    for ns in ["kbind", "team-a"] {
        let _ = namespaces.delete(ns, &Default::default()).await;
    }
    // The consumer CRD stays (it held w1 when the binding went): remove it too, so the test
    // can run again on the same servers.
    for cluster in [&fx.provider, &fx.consumer] {
        let _ = Api::<CustomResourceDefinition>::all(cluster.clone())
            .delete("widgets.example.org", &Default::default())
            .await;
    }
}

/// The selector a `NamespaceNotAllowed` message offers (`spec.bindingNamespaces: {...}`), as JSON.
fn selector_in(message: &str) -> Value {
    let (_, rest) = message
        .split_once("spec.bindingNamespaces: ")
        .unwrap_or_else(|| panic!("the message names spec.bindingNamespaces: {message}"));
    let mut depth = 0;
    let end = rest
        .char_indices()
        .find(|&(_, c)| {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            depth == 0
        })
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("a whole selector in: {message}"));
    serde_saphyr::from_str(&rest[..end]).expect("the offered selector parses as YAML")
}

/// `kbind schema --full-sweep-every`, as the shipped CronJob runs it (every minute, 5m), without
/// `--selector` as users run it: between full sweeps a run reconciles only what changed. A
/// Connection where nothing changed is asked nothing (an export added on its provider waits for
/// the next full sweep) and written nothing; a new binding is set up at the next run, its
/// Connection's discovery refreshed with it; a full sweep comes once the last one recorded in
/// the pass Lease is old enough, and a run killed during it leaves that record as it was, so
/// the next run sweeps fully again.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn between_full_sweeps_a_run_reconciles_only_what_changed() {
    let _alone = support::unscoped_lock();
    let fx = Fx::new("unscoped-sweep").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    // Full sweeps (no flag: every run is one) until everything, leftovers included, is quiet.
    settle(&fx);
    let exported = |c: &Connection| -> Vec<String> {
        let st = c.status.clone().unwrap_or_default();
        // The shared provider exports other tests' APIs too: this test's group only.
        let group = format!(".{}", fx.group);
        st.exported_apis
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n.ends_with(&group))
            .collect()
    };
    assert_eq!(exported(&fx.conn(&conn).await), vec![api.clone()]);
    let between = |env: &[(&str, &str)]| {
        let (code, s, err) = kbind_unscoped(
            &fx,
            "schema",
            &fx.ns,
            &[
                "--credential-namespace",
                &fx.ns,
                "--full-sweep-every",
                "1h",
                "--lease-duration",
                "3s",
            ],
            env,
        );
        (code, s, err)
    };
    let quiet = || {
        let (code, s, err) = between(&[]);
        assert_eq!(code, 0, "{s}\n{err}");
        s
    };

    // Nothing changed: the Connection is neither asked nor written.
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    let seen = version(&fx.conn(&conn).await);
    for round in 1..=2 {
        let s = quiet();
        assert_eq!(s["sweep"], "changed", "round {round}: {s}");
        assert_eq!(s["data_writes"], 0, "round {round}: {s}");
        assert!(s["counts"]["unchanged"].as_i64() >= Some(1), "{s}");
        assert_eq!(version(&fx.conn(&conn).await), seen, "round {round}");
    }
    assert_eq!(
        exported(&fx.conn(&conn).await),
        vec![api.clone()],
        "not asked"
    );

    // A new binding: set up at the next run, the Connection's exports refreshed with it.
    let cb = fx.cluster_binding("cb", &conn, &[&api]).await;
    let s = quiet();
    assert_eq!(s["sweep"], "changed", "{s}");
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    let mut both = vec![api.clone(), gadgets.clone()];
    both.sort();
    assert_eq!(exported(&fx.conn(&conn).await), both);
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    let conds = cbs
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .conditions;
    assert_eq!(cond(&conds, "Ready").0, "True", "{conds:?}");
    let seen = (
        version(&fx.conn(&conn).await),
        version(&cbs.get(&cb).await.unwrap()),
    );
    for round in 1..=2 {
        let s = quiet();
        assert_eq!(s["data_writes"], 0, "round {round}: {s}");
        assert_eq!(
            (
                version(&fx.conn(&conn).await),
                version(&cbs.get(&cb).await.unwrap())
            ),
            seen,
            "round {round}: {s}"
        );
    }

    // The last full sweep is old: the next run sweeps fully. Killed during it, the record
    // stays as it was; the run after (the dead run's Lease expired) sweeps fully and records it.
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(fx.consumer.clone(), &fx.ns);
    let old = (k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_hours(2))
    .to_string();
    leases
        .patch(
            "kbind-schema",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"kbind.io/swept-at": old}}})),
        )
        .await
        .unwrap();
    let swept_at = || async {
        leases
            .get("kbind-schema")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()["kbind.io/swept-at"]
            .clone()
    };
    // Stopped by its deadline before its first Connection: no sweep recorded.
    let (code, s, err) = kbind_unscoped(
        &fx,
        "schema",
        &fx.ns,
        &[
            "--credential-namespace",
            &fx.ns,
            "--full-sweep-every",
            "1h",
            "--deadline",
            "1s",
        ],
        &[],
    );
    assert_eq!(code, 0, "{s}\n{err}");
    assert_eq!(
        (&s["sweep"], &s["outcome"]),
        (&json!("full"), &json!("partial")),
        "{s}"
    );
    assert_eq!(
        swept_at().await,
        old,
        "a sweep stopped early records nothing"
    );
    let item = format!("Connection/{conn}");
    let (code, _, err) = between(&[(kbind::pass::crash::AT_ITEM_ENV, item.as_str())]);
    assert_ne!(code, 0, "killed as it reached the Connection: {err}");
    assert_eq!(swept_at().await, old, "a killed sweep records nothing");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let s = quiet();
    assert_eq!(s["sweep"], "full", "{s}");
    assert!(s["counts"].get("unchanged").is_none(), "{s}");
    assert!(swept_at().await > old, "the sweep is recorded");
    let s = quiet();
    assert_eq!(s["sweep"], "changed", "{s}");
    assert_eq!(s["data_writes"], 0, "{s}");

    cbs.delete(&cb, &Default::default()).await.unwrap();
    settle(&fx);
}

/// `kbind issue` as the shipped CronJob runs it: every minute with `--full-sweep-every`, and
/// no selector. Between full sweeps a run reads the Grants and heartbeats and stops when no
/// Grant needs a run (writing only its pass Lease, twice over); a new Grant, a first heartbeat
/// and a deleted Grant each make the next run a full sweep (issued, pinned, revoked); drift of
/// what is issued alone waits for the next full sweep, which repairs it.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn between_full_sweeps_the_issuer_acts_on_what_changed() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::rbac::v1::Role;
    use kbind::api::iam::Grant;
    use support::issue_fx::{Ix, client_of, heartbeat, ready};
    let _alone = support::unscoped_lock();
    let ix = Ix::new("unscoped-issue").await;
    let p = ix.fx.provider.clone();
    let (_, export) = ix.widgets_export().await;
    let admin = ix.fx.env.provider.to_string_lossy().to_string();
    let ca = ix.ca_file.to_string_lossy().to_string();
    let run = |every: &str| {
        let (code, s, err) = support::kbind(&[
            "issue",
            "--kubeconfig",
            &admin,
            "--lease-namespace",
            &ix.ns,
            "--grants-namespace",
            &ix.ns,
            "--server-url",
            &ix.server,
            "--server-ca-file",
            &ca,
            "--full-sweep-every",
            every,
            "-o",
            "json",
        ]);
        assert_eq!(code, 0, "{s}\n{err}");
        s
    };
    let a = format!("{}-a", ix.fx.label);
    ix.grant(&a, &export, "1h").await;
    // Full sweeps until everything, other tests' leftovers included, is quiet.
    let mut settled = false;
    for _ in 0..5 {
        if run("0s")["data_writes"] == 0 {
            settled = true;
            break;
        }
    }
    assert!(settled, "full sweeps settle");
    assert_eq!(ready(&ix.get_grant(&a).await).0, "True");
    for round in 1..=2 {
        let s = run("1h");
        assert_eq!(s["sweep"], "changed", "round {round}: {s}");
        assert_eq!(s["data_writes"], 0, "round {round}: {s}");
        assert_eq!(s["bookkeeping_writes"], 2, "the pass Lease only: {s}");
        assert!(s["counts"]["unchanged"].as_i64() >= Some(1), "{s}");
        assert!(s["counts"]["grants"].is_null(), "nothing observed: {s}");
    }

    // A new Grant is issued at the next run; a first heartbeat is pinned at the one after.
    let b = format!("{}-b", ix.fx.label);
    ix.grant(&b, &export, "1h").await;
    let s = run("1h");
    assert_eq!(s["sweep"], "full", "a new Grant: {s}");
    assert_eq!(
        ready(&ix.get_grant(&b).await),
        ("True".into(), "Issued".into())
    );
    let cb = client_of(&ix.kubeconfig(&b).await).await;
    Api::<Lease>::namespaced(cb, &ix.ns)
        .create(&PostParams::default(), &heartbeat(&ix.uid("b"), &b))
        .await
        .unwrap();
    let s = run("1h");
    assert_eq!(s["sweep"], "full", "a heartbeat to pin: {s}");
    assert_eq!(
        ix.get_grant(&b).await.status.unwrap().consumer_cluster,
        Some(ix.uid("b"))
    );
    let s = run("1h");
    assert_eq!(s["data_writes"], 0, "{s}");
    assert!(
        s["counts"]["grants"].is_null(),
        "pinned: nothing to do: {s}"
    );

    // Drift of what is issued waits for the full sweep.
    let roles = Api::<Role>::namespaced(p.clone(), &a);
    let role = format!("kbind-grant-{a}");
    roles.delete(&role, &Default::default()).await.unwrap();
    let s = run("1h");
    assert_eq!(s["sweep"], "changed", "{s}");
    assert!(roles.get_opt(&role).await.unwrap().is_none(), "not yet");
    let s = run("1s");
    assert_eq!(s["sweep"], "full", "{s}");
    assert!(roles.get_opt(&role).await.unwrap().is_some(), "repaired");

    // A deleted Grant is revoked at the next run.
    Api::<Grant>::all(p.clone())
        .delete(&b, &Default::default())
        .await
        .unwrap();
    let s = run("1h");
    assert_eq!(s["sweep"], "full", "a Grant deleting: {s}");
    assert_eq!(s["counts"]["revoked"], 1, "{s}");
    assert!(
        Api::<Grant>::all(p.clone())
            .get_opt(&b)
            .await
            .unwrap()
            .is_none()
    );
    let s = run("1h");
    assert_eq!(s["sweep"], "changed", "{s}");
    assert_eq!(s["data_writes"], 0, "{s}");
    ix.revoke(&[&a]).await;
}

/// `kbind issue --pin-window`, as the shipped CronJob runs it (every minute, `--full-sweep-every`,
/// no selector). A run that starts before a consumer's first heartbeat pins it as soon as it
/// comes, in that run, and then ends (without the window it would be pinned a period later). A
/// Grant nobody binds yet keeps a run looking only for its window, writing nothing, run after
/// run; SIGTERM ends the window at once; once pinned, a run does not look at all.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_first_heartbeat_is_pinned_by_the_run_waiting_for_it() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kbind::api::iam::Grant;
    use std::time::{Duration, Instant};
    use support::issue_fx::{Ix, client_of, heartbeat, ready};
    let _alone = support::unscoped_lock();
    let ix = Ix::new("unscoped-pin-window").await;
    let (_, export) = ix.widgets_export().await;
    let admin = ix.fx.env.provider.to_string_lossy().to_string();
    let ca = ix.ca_file.to_string_lossy().to_string();
    let args = |every: &'static str, window: &'static str| -> Vec<String> {
        [
            "issue",
            "--kubeconfig",
            &admin,
            "--lease-namespace",
            &ix.ns,
            "--grants-namespace",
            &ix.ns,
            "--server-url",
            &ix.server,
            "--server-ca-file",
            &ca,
            "--full-sweep-every",
            every,
            "--pin-window",
            window,
            "-o",
            "json",
        ]
        .map(String::from)
        .to_vec()
    };
    let run = |every: &'static str, window: &'static str| {
        let a = args(every, window);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let (code, s, err) = support::kbind(&a);
        assert_eq!(code, 0, "{s}\n{err}");
        s
    };
    // What an earlier, failed run of this test left waits for a heartbeat and would keep
    // every window open: its Grants go (the settling sweeps revoke them).
    let grants = Api::<Grant>::all(ix.fx.provider.clone());
    for o in grants.list(&Default::default()).await.unwrap() {
        if o.name_any().starts_with("unscoped-pin-window-") {
            let _ = grants.delete(&o.name_any(), &Default::default()).await;
        }
    }
    let g = format!("{}-w", ix.fx.label);
    ix.grant(&g, &export, "1h").await;
    let mut settled = false;
    for _ in 0..5 {
        if run("0s", "0s")["data_writes"] == 0 {
            settled = true;
            break;
        }
    }
    assert!(settled, "full sweeps settle");
    assert_eq!(
        ready(&ix.get_grant(&g).await),
        ("True".into(), "Issued".into())
    );
    // Another Grant waiting for its first heartbeat (a leftover of a failed test) would keep
    // the window open to its end: the timing checks below hold only without one.
    let others_wait = grants
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|o| {
            o.name_any() != g
                && kbind::issue::plan::sweep::awaits_pin(
                    o,
                    &[],
                    k8s_openapi::jiff::Timestamp::now(),
                )
        });

    // Nobody has bound yet: each run looks for its window, writes nothing, changes nothing.
    for round in 1..=2 {
        let s = run("1h", "5s");
        assert_eq!(s["sweep"], "changed", "round {round}: {s}");
        assert_eq!(s["data_writes"], 0, "round {round}: {s}");
        assert_eq!(s["bookkeeping_writes"], 2, "the pass Lease only: {s}");
        assert!(s["counts"]["pinWindowLooks"].as_i64() >= Some(1), "{s}");
        assert!(s["counts"]["pinWindowSweeps"].is_null(), "{s}");
    }
    assert_eq!(
        ready_pin(&ix.get_grant(&g).await),
        "WaitingForHeartbeat",
        "nothing to pin yet"
    );

    // SIGTERM (a CronJob's Pod past its deadline, a drain) ends the window at once.
    let a = args("1h", "60s");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let started = Instant::now();
    let out = support::when_logged(support::kbind_command(&a), WINDOW_BEGUN, |pid| async move {
        let sent = std::process::Command::new("kill")
            .args(["-s", "TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "SIGTERM sent in the window");
    })
    .await;
    let took = started.elapsed();
    let summary = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{summary}");
    assert!(
        took < Duration::from_secs(30),
        "ended by SIGTERM ({took:?}), not by its 60 s window: {summary}"
    );

    // The consumer's first heartbeat comes while a run waits for it: that run pins it.
    let a = args("1h", "60s");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let cg = client_of(&ix.kubeconfig(&g).await).await;
    let started = Instant::now();
    let out = support::when_logged(support::kbind_command(&a), WINDOW_BEGUN, |_| async {
        Api::<Lease>::namespaced(cg.clone(), &ix.ns)
            .create(&PostParams::default(), &heartbeat(&ix.uid("w"), &g))
            .await
            .unwrap();
    })
    .await;
    let took = started.elapsed();
    let (code, s, err) = support::outcome(out);
    assert_eq!(code, 0, "{s}\n{err}");
    assert_eq!(s["counts"]["pinWindowSweeps"], 1, "swept once it came: {s}");
    assert_eq!(s["sweep"], "full", "{s}");
    assert!(s["counts"]["unchanged"].is_null(), "it swept: {s}");
    assert_eq!(
        ix.get_grant(&g).await.status.unwrap().consumer_cluster,
        Some(ix.uid("w")),
        "pinned by the run that was waiting"
    );
    if !others_wait {
        assert!(
            took < Duration::from_secs(40),
            "the window ends once nothing waits ({took:?}), not at its 60 s end: {s}"
        );
    }

    // Pinned: runs do not look any more, and write nothing.
    for round in 1..=2 {
        let started = Instant::now();
        let s = run("1h", "20s");
        assert_eq!(s["sweep"], "changed", "round {round}: {s}");
        assert_eq!(s["data_writes"], 0, "round {round}: {s}");
        if !others_wait {
            assert!(
                s["counts"]["pinWindowLooks"].is_null(),
                "round {round}: {s}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "round {round}: {s}"
            );
        }
    }
    assert_eq!(ready_pin(&ix.get_grant(&g).await), "Pinned");
    ix.revoke(&[&g]).await;
}

/// What `kbind issue` logs as its pin window begins.
const WINDOW_BEGUN: &str = "pin window: following";

/// The reason of a Grant's `ConsumerPinned` condition.
fn ready_pin(g: &kbind::api::iam::Grant) -> String {
    g.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "ConsumerPinned"))
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}
