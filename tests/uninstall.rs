//! `kbind uninstall` run as the real binary against the harness servers: what the passes put on
//! objects (schema's cleanup finalizers, resync's syncer finalizers, relsync's cleanup
//! finalizer) is listed by a dry run, released by `--yes` and nothing else is touched, so that
//! deleting kbind and its namespaces completes.

use crate::relsync_fx;
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kbind::api::core::{Binding, ClusterBinding, Connection};
use kbind::api::relsync::RelationshipSource;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};
use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
use serde_json::{Value, json};
use support::fx::Fx;

const KEEP: &str = "example.com/keep";
const KBIND_FINALIZERS: [&str; 3] = [
    "core.kbind.io/syncer",
    "core.kbind.io/cleanup",
    "kbind.io/relsync-cleanup",
];

/// `kbind uninstall` on the consumer cluster, limited to the fixture (its label) and its Lease
/// namespace; returns (exit code, the JSON report, stderr).
fn uninstall(fx: &Fx, extra: &[&str]) -> (i32, Value, String) {
    uninstall_as(fx, &fx.env.consumer.to_string_lossy(), extra)
}

/// [`uninstall`] with another kubeconfig.
fn uninstall_as(fx: &Fx, kc: &str, extra: &[&str]) -> (i32, Value, String) {
    let selector = format!("kbind-test={}", fx.label);
    let mut args = vec![
        "uninstall",
        "--kubeconfig",
        kc,
        "--lease-namespace",
        &fx.ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    support::kbind(&args)
}

/// Every object of the report, as `<Kind> <namespace/>name` → outcome.
fn listed(report: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for k in report["kinds"].as_array().expect("kinds") {
        for o in k["objects"].as_array().expect("objects") {
            let ns = o["namespace"]
                .as_str()
                .map(|n| format!("{n}/"))
                .unwrap_or_default();
            out.insert(
                format!(
                    "{} {ns}{}",
                    k["kind"].as_str().unwrap(),
                    o["name"].as_str().unwrap()
                ),
                o["outcome"].as_str().unwrap().to_string(),
            );
        }
    }
    out
}

fn json_patch(ops: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).unwrap())
}

/// Append `f` to the object's finalizers, as another controller would.
async fn add_finalizer<K>(api: &Api<K>, name: &str, f: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let op = if api.get(name).await.unwrap().finalizers().is_empty() {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [f]})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": f})
    };
    api.patch(name, &PatchParams::default(), &json_patch(json!([op])))
        .await
        .unwrap();
}

/// Remove `f` from the object's finalizers, as the controller that added it would.
async fn remove_finalizer<K>(api: &Api<K>, name: &str, f: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let o = api.get(name).await.unwrap();
    let i = o.finalizers().iter().position(|x| x == f).unwrap();
    let path = format!("/metadata/finalizers/{i}");
    api.patch(
        name,
        &PatchParams::default(),
        &json_patch(
            json!([{"op": "test", "path": path, "value": f}, {"op": "remove", "path": path}]),
        ),
    )
    .await
    .unwrap();
}

/// The objects under test: key → (resourceVersion, finalizers).
struct Objects {
    consumer: Client,
    widgets: ApiResource,
    gadgets: ApiResource,
    ns: String,
    rs_ns: String,
    conn: String,
    cb: String,
}

impl Objects {
    fn dynamic(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.consumer.clone(), &self.ns, ar)
    }

    async fn state(&self) -> BTreeMap<String, (String, Vec<String>)> {
        fn entry<K: kube::Resource>(o: &K) -> (String, Vec<String>) {
            (o.resource_version().unwrap(), o.finalizers().to_vec())
        }
        let c = &self.consumer;
        let mut s = BTreeMap::new();
        for (kind, ar, name) in [
            ("Widget", &self.widgets, "w1"),
            ("Widget", &self.widgets, "w2"),
            ("Gadget", &self.gadgets, "g1"),
        ] {
            s.insert(
                format!("{kind} {}/{name}", self.ns),
                entry(&self.dynamic(ar).get(name).await.unwrap()),
            );
        }
        s.insert(
            format!("Binding {}/b", self.ns),
            entry(
                &Api::<Binding>::namespaced(c.clone(), &self.ns)
                    .get("b")
                    .await
                    .unwrap(),
            ),
        );
        s.insert(
            format!("ClusterBinding {}", self.cb),
            entry(
                &Api::<ClusterBinding>::all(c.clone())
                    .get(&self.cb)
                    .await
                    .unwrap(),
            ),
        );
        s.insert(
            format!("Connection {}", self.conn),
            entry(
                &Api::<Connection>::all(c.clone())
                    .get(&self.conn)
                    .await
                    .unwrap(),
            ),
        );
        s.insert(
            format!("Secret {}/provider", self.ns),
            entry(
                &Api::<Secret>::namespaced(c.clone(), &self.ns)
                    .get("provider")
                    .await
                    .unwrap(),
            ),
        );
        s.insert(
            format!("RelationshipSource {}/s", self.rs_ns),
            entry(
                &Api::<RelationshipSource>::namespaced(c.clone(), &self.rs_ns)
                    .get("s")
                    .await
                    .unwrap(),
            ),
        );
        s
    }
}

/// Wait (up to a minute: a namespace goes through the namespace controller) until `gone`.
async fn wait_gone<F, Fut>(what: &str, mut gone: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if gone().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} is still there (Terminating?)");
}

/// The whole path: a dry run lists every kbind finalizer the passes added and changes nothing;
/// `--yes` releases them all and leaves a foreign finalizer; a second run finds nothing; then
/// deleting the CRDs, the namespaces and the objects completes with no pass running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_dry_run_lists_then_yes_releases_every_kbind_finalizer_and_deletion_completes() {
    let fx = Fx::new("uninst").await;
    // A namespaced Binding (gadgets) beside the ClusterBinding (widgets), one Connection.
    let gadgets = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    let conn_name = format!("{}-p", fx.label);
    fx.binding("b", &conn_name, &[&gadgets]).await;
    let (widgets, conn, cb) = fx.bound_api("widgets", "Namespaced").await;
    assert_eq!(conn, conn_name);
    fx.run(&[]);
    let crds: Api<CustomResourceDefinition> = Api::all(fx.consumer.clone());
    support::wait_established(&crds, &gadgets).await;
    let ar = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&fx.group, "v1", kind), plural)
    };
    let rx = Rx::new("uninst-rs").await;
    let o = Objects {
        consumer: fx.consumer.clone(),
        widgets: ar("Widget", "widgets"),
        gadgets: ar("Gadget", "gadgets"),
        ns: fx.ns.clone(),
        rs_ns: rx.ns.clone(),
        conn: conn.clone(),
        cb: cb.clone(),
    };
    for (a, name) in [(&o.widgets, "w1"), (&o.widgets, "w2"), (&o.gadgets, "g1")] {
        let mut d = DynamicObject::new(name, a).data(json!({"spec": {"size": 1}}));
        d.metadata.namespace = Some(fx.ns.clone());
        o.dynamic(a)
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }
    fx.pass("resync", &[]);

    // A RelationshipSource relsync synced (and so holds its finalizer), labelled for the selector.
    let fake =
        kbind_testkit::slack::start(workspace(vec![user("U1")], vec![channel("C1", &["U1"])]), 0)
            .await
            .unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("s", json!({"kind": "slack"})).await;
    rx.run(&fake.url(), &[]).await;
    let sources: Api<RelationshipSource> = Api::namespaced(fx.consumer.clone(), &rx.ns);
    sources
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kbind-test": fx.label}}})),
        )
        .await
        .unwrap();

    // Another controller's finalizer on a synced object and on the Connection.
    add_finalizer(&o.dynamic(&o.widgets), "w2", KEEP).await;
    let conns: Api<Connection> = Api::all(fx.consumer.clone());
    add_finalizer(&conns, &conn, KEEP).await;

    let before = o.state().await;
    for (k, (_, fs)) in &before {
        assert!(
            fs.iter().any(|f| KBIND_FINALIZERS.contains(&f.as_str())),
            "the passes put a kbind finalizer on {k}: {fs:?}"
        );
    }

    // Dry run (the default): lists every one, changes nothing.
    let (code, report, stderr) = uninstall(&fx, &[]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["dryRun"], true);
    let want: BTreeMap<String, String> = before
        .keys()
        .map(|k| (k.clone(), "wouldRelease".to_string()))
        .collect();
    assert_eq!(listed(&report), want, "{report}");
    assert_eq!(report["found"], before.len());
    assert_eq!(o.state().await, before, "a dry run changes nothing");

    // --yes: every kbind finalizer released, the foreign ones kept.
    let (code, report, stderr) = uninstall(&fx, &["--yes"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["dryRun"], false);
    let want: BTreeMap<String, String> = before
        .keys()
        .map(|k| (k.clone(), "released".to_string()))
        .collect();
    assert_eq!(listed(&report), want, "{report}");
    assert_eq!(
        (report["released"].clone(), report["failed"].clone()),
        (json!(before.len()), json!(0))
    );
    let after = o.state().await;
    for (k, (_, fs)) in &after {
        let want: Vec<String> =
            if k.starts_with("Widget") && k.ends_with("/w2") || k.starts_with("Connection") {
                vec![KEEP.to_string()]
            } else {
                vec![]
            };
        assert_eq!(fs, &want, "{k}");
    }

    // Across runs: nothing left to do, nothing written.
    let (code, report, stderr) = uninstall(&fx, &["--yes"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["found"], 0, "{report}");
    assert_eq!(o.state().await, after, "a second run writes nothing");

    // The other controller finishes; then deleting kbind's objects, the consumer CRDs and the
    // namespaces completes with no kbind pass running.
    remove_finalizer(&o.dynamic(&o.widgets), "w2", KEEP).await;
    remove_finalizer(&conns, &conn, KEEP).await;
    let dp = DeleteParams::default();
    Api::<ClusterBinding>::all(fx.consumer.clone())
        .delete(&cb, &dp)
        .await
        .unwrap();
    conns.delete(&conn, &dp).await.unwrap();
    for crd in [&widgets, &gadgets] {
        crds.delete(crd, &dp).await.unwrap();
    }
    let namespaces: Api<Namespace> = Api::all(fx.consumer.clone());
    for ns in [&fx.ns, &rx.ns] {
        namespaces.delete(ns, &dp).await.unwrap();
    }
    let c = fx.consumer.clone();
    wait_gone("the ClusterBinding", || async {
        Api::<ClusterBinding>::all(c.clone())
            .get_opt(&cb)
            .await
            .unwrap()
            .is_none()
    })
    .await;
    wait_gone("the Connection", || async {
        conns.get_opt(&conn).await.unwrap().is_none()
    })
    .await;
    for crd in [&widgets, &gadgets] {
        wait_gone(crd, || async { crds.get_opt(crd).await.unwrap().is_none() }).await;
    }
    for ns in [&fx.ns, &rx.ns] {
        wait_gone(ns, || async {
            namespaces.get_opt(ns).await.unwrap().is_none()
        })
        .await;
    }
}

/// A Lease `name` in `ns` held by `holder`, last renewed `ago` ago, for 60 s.
async fn lease(client: &Client, ns: &str, name: &str, holder: &str, ago: SignedDuration) {
    let t = MicroTime(Timestamp::now() - ago);
    let l = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(60),
            acquire_time: Some(t.clone()),
            renew_time: Some(t),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("kbind-tests").force(),
            &Patch::Apply(&l),
        )
        .await
        .unwrap();
}

/// While a pass Lease is held `--yes` refuses (exit 2, naming it) and releases nothing; a dry
/// run still lists; `--force` acts; an expired Lease or another Lease does not hold it back.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_held_pass_lease_makes_it_refuse_unless_forced() {
    let fx = Fx::new("uninst-lease").await;
    let conn = fx
        .connection("c", "provider", json!({"source": "CRD"}), false)
        .await;
    let conns: Api<Connection> = Api::all(fx.consumer.clone());
    let with_finalizer = || async {
        add_finalizer(&conns, &conn, "core.kbind.io/cleanup").await;
        conns.get(&conn).await.unwrap()
    };
    let held = with_finalizer().await;
    // Not a pass Lease: never counts.
    lease(
        &fx.consumer,
        &fx.ns,
        "consumer-1234",
        "someone",
        SignedDuration::ZERO,
    )
    .await;
    lease(
        &fx.consumer,
        &fx.ns,
        "kbind-resync-1-of-4",
        "kbind-resync-x/pod-1",
        SignedDuration::from_secs(5),
    )
    .await;

    let (code, report, stderr) = uninstall(&fx, &["--yes"]);
    assert_eq!(code, 2, "{report}\n{stderr}");
    assert!(
        stderr.contains("kbind-resync-1-of-4") && stderr.contains("kbind-resync-x/pod-1"),
        "names the Lease and its holder: {stderr}"
    );
    assert!(!stderr.contains("consumer-1234"), "{stderr}");
    assert_eq!(
        conns.get(&conn).await.unwrap().resource_version(),
        held.resource_version(),
        "nothing released"
    );

    let (code, report, stderr) = uninstall(&fx, &[]);
    assert_eq!(code, 0, "a dry run writes nothing, so it lists: {stderr}");
    assert_eq!(
        report["leasesHeld"][0]["name"], "kbind-resync-1-of-4",
        "{report}"
    );
    assert_eq!(report["found"], 1, "{report}");

    let (code, report, stderr) = uninstall(&fx, &["--yes", "--force"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["released"], 1, "{report}");
    assert!(conns.get(&conn).await.unwrap().finalizers().is_empty());

    // Expired (renewed longer than its duration ago): a killed run, no longer holding anything.
    with_finalizer().await;
    lease(
        &fx.consumer,
        &fx.ns,
        "kbind-resync-1-of-4",
        "kbind-resync-x/pod-1",
        SignedDuration::from_secs(120),
    )
    .await;
    let (code, report, stderr) = uninstall(&fx, &["--yes"]);
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(report["released"], 1, "{report}");
    assert!(conns.get(&conn).await.unwrap().finalizers().is_empty());
    conns.delete(&conn, &DeleteParams::default()).await.unwrap();
}

/// An identity that may list but not patch: every object it could not release is named with the
/// reason, the rest of the run goes on, and the exit code is 1.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_object_it_may_not_patch_is_named_and_the_exit_code_is_1() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let fx = Fx::new("uninst-denied").await;
    let conn = fx
        .connection("c", "provider", json!({"source": "CRD"}), false)
        .await;
    let conns: Api<Connection> = Api::all(fx.consumer.clone());
    add_finalizer(&conns, &conn, "core.kbind.io/cleanup").await;

    let name = support::unique("uninst-readonly");
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": name}, "rules": [
        {"apiGroups": ["core.kbind.io"], "resources": ["connections", "bindings", "clusterbindings"], "verbs": ["get", "list"]},
        {"apiGroups": ["agentprimitives.authzed.com"], "resources": ["relationshipsources"], "verbs": ["get", "list"]},
        {"apiGroups": ["iam.kbind.io"], "resources": ["grants"], "verbs": ["get", "list"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]}))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": fx.ns}]}))
    .unwrap();
    let pp = PostParams::default();
    let roles: Api<ClusterRole> = Api::all(fx.consumer.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(fx.consumer.clone());
    roles.create(&pp, &role).await.unwrap();
    bindings.create(&pp, &binding).await.unwrap();
    let kc = support::service_account_kubeconfig(&fx.env.consumer, &fx.ns, "reader").await;
    let kc = support::temp_file("uninst-reader", &kc);
    let kc = kc.to_string_lossy().to_string();

    let (code, report, stderr) = uninstall_as(&fx, &kc, &["--yes"]);
    assert_eq!(code, 1, "{report}\n{stderr}");
    assert_eq!(
        (report["found"].clone(), report["failed"].clone()),
        (json!(1), json!(1)),
        "{report}"
    );
    let k = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "Connection")
        .unwrap();
    assert_eq!(k["objects"][0]["name"], conn.as_str(), "{report}");
    assert_eq!(k["objects"][0]["outcome"], "failed", "{report}");
    let why = k["objects"][0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("forbidden"), "{why}");
    assert!(
        conns
            .get(&conn)
            .await
            .unwrap()
            .finalizers()
            .contains(&"core.kbind.io/cleanup".to_string()),
        "not released"
    );

    let dp = DeleteParams::default();
    let _ = bindings.delete(&name, &dp).await;
    let _ = roles.delete(&name, &dp).await;
    remove_finalizer(&conns, &conn, "core.kbind.io/cleanup").await;
    conns.delete(&conn, &dp).await.unwrap();
}

/// The issuer's Grant finalizer: with kbind gone a deleted Grant would hang in Terminating, so
/// uninstall releases it, but that skips revocation. The dry run and the real run say so per
/// Grant with the kubectl commands that revoke by hand; those commands, run, leave nothing and
/// the token stops working.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_grants_revoke_finalizer_is_released_with_the_commands_that_revoke_by_hand() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kbind::api::iam::Grant;
    let ix = support::issue_fx::Ix::new("uninst-grant").await;
    let (_, export) = ix.widgets_export().await;
    let (a, b) = (format!("{}-a", ix.fx.label), format!("{}-b", ix.fx.label));
    ix.grant(&a, &export, "1h").await;
    ix.grant(&b, &export, "1h").await;
    let s = ix.run(&[]);
    assert_eq!(s["outcome"], "completed", "{s}");
    let token = support::issue_fx::token_of(&ix.kubeconfig(&a).await);
    let expires = ix
        .get_grant(&a)
        .await
        .status
        .unwrap()
        .expires_at
        .unwrap()
        .0
        .to_string();
    let grants: Api<Grant> = Api::all(ix.fx.provider.clone());
    // kbind is gone (no issue run): the deleted Grant stays Terminating.
    grants.delete(&a, &DeleteParams::default()).await.unwrap();

    let admin = ix.fx.env.provider.to_string_lossy().into_owned();
    let args = |extra: &[&'static str]| {
        let mut v: Vec<String> = [
            "uninstall",
            "--kubeconfig",
            &admin,
            "--lease-namespace",
            &ix.ns,
            "--selector",
            &ix.selector,
            "-o",
            "json",
        ]
        .map(String::from)
        .to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |v: Vec<String>| {
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        support::kbind(&v)
    };
    let grant_kind = |report: &Value| {
        report["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["resource"] == "grants.iam.kbind.io")
            .cloned()
            .unwrap_or_else(|| panic!("no iam Grants in {report}"))
    };
    let (code, report, stderr) = run(args(&[]));
    assert_eq!(code, 0, "{report}\n{stderr}");
    let k = grant_kind(&report);
    assert_eq!(k["finalizer"], "iam.kbind.io/revoke");
    assert_eq!(k["manager"], "kbind-issue-finalizer");
    let objects = k["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 2, "{k}");
    let ga = objects.iter().find(|o| o["name"] == a.as_str()).unwrap();
    assert_eq!(ga["deleting"], true);
    assert_eq!(ga["outcome"], "wouldRelease");
    let u = &ga["unrevoked"];
    assert_eq!(u["namespace"], ix.ns.as_str(), "from the Grant's status");
    assert_eq!(u["tokenExpiresAt"], expires.as_str());
    let commands: Vec<String> = u["revokeByHand"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(commands, kbind::uninstall::revoke_commands(&ix.ns, &a));
    // The text a person reads says it too.
    let mut text_args = args(&[]);
    text_args.retain(|x| x != "-o" && x != "json");
    text_args.extend(["-o".into(), "text".into()]);
    let out = support::kbind_command(&text_args.iter().map(String::as_str).collect::<Vec<_>>())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        text.contains(&format!(
            "would release {a} (deleting)\n    WARNING: releasing skips revocation"
        )),
        "{text}"
    );
    assert!(text.contains(&commands[0]), "{text}");
    assert!(
        grants
            .get(&a)
            .await
            .unwrap()
            .finalizers()
            .contains(&"iam.kbind.io/revoke".to_string()),
        "the dry run changed nothing"
    );

    let (code, report, stderr) = run(args(&["--yes"]));
    assert_eq!(code, 0, "{report}\n{stderr}");
    let k = grant_kind(&report);
    assert_eq!(k["released"], 2, "{k}");
    assert!(
        k["objects"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["unrevoked"]["revokeByHand"]
                .as_array()
                .is_some_and(|c| c.len() == 5)),
        "{k}"
    );
    wait_gone("the deleted Grant", || {
        let g = grants.clone();
        let a = a.clone();
        async move { g.get_opt(&a).await.unwrap().is_none() }
    })
    .await;
    assert!(grants.get(&b).await.unwrap().finalizers().is_empty());
    // Released, not revoked by kbind: everything issued names the Grant as owner, so the
    // cluster's garbage collector deletes it once the Grant is gone, and the token is refused.
    let p = ix.fx.provider.clone();
    let n = format!("kbind-grant-{a}");
    let review = |token: String| {
        let p = p.clone();
        async move {
            let tr: k8s_openapi::api::authentication::v1::TokenReview =
                serde_json::from_value(json!({"spec": {"token": token}})).unwrap();
            Api::<k8s_openapi::api::authentication::v1::TokenReview>::all(p)
                .create(&PostParams::default(), &tr)
                .await
                .unwrap()
                .status
                .and_then(|s| s.authenticated)
                .unwrap_or(false)
        }
    };
    let accounts = Api::<ServiceAccount>::namespaced(p.clone(), &ix.ns);
    wait_gone(
        "the released Grant's identity, by the garbage collector",
        || {
            let accounts = accounts.clone();
            let n = n.clone();
            async move { accounts.get_opt(&n).await.unwrap().is_none() }
        },
    )
    .await;
    let (code, again, _) = run(args(&["--yes"]));
    assert_eq!(
        (code, grant_kind(&again)["found"].clone()),
        (0, json!(0)),
        "{again}"
    );

    fn gone<T>(r: Result<Option<T>, kube::Error>) -> bool {
        r.unwrap().is_none()
    }
    // The printed commands (for a cluster without a collector) run cleanly after it: nothing
    // of Grant a is left and its token is refused.
    let by_hand = |grant: &str| {
        for c in kbind::uninstall::revoke_commands(&ix.ns, grant) {
            let mut words = c.split_whitespace();
            assert_eq!(words.next(), Some("kubectl"));
            let out = std::process::Command::new("kubectl")
                .args(words)
                .args(["--kubeconfig", &admin])
                .output()
                .expect("kubectl runs");
            assert!(
                out.status.success(),
                "{c}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    by_hand(&a);
    assert!(gone(
        Api::<ServiceAccount>::namespaced(p.clone(), &ix.ns)
            .get_opt(&n)
            .await
    ));
    assert!(gone(
        Api::<Secret>::namespaced(p.clone(), &ix.ns)
            .get_opt(&n)
            .await
    ));
    assert!(gone(
        Api::<Role>::namespaced(p.clone(), &ix.ns).get_opt(&n).await
    ));
    assert!(gone(
        Api::<RoleBinding>::namespaced(p.clone(), &ix.ns)
            .get_opt(&n)
            .await
    ));
    assert!(gone(Api::<ClusterRole>::all(p.clone()).get_opt(&n).await));
    assert!(gone(
        Api::<ClusterRoleBinding>::all(p.clone()).get_opt(&n).await
    ));
    // The apiserver caches token reviews for a few seconds.
    let mut refused = false;
    for _ in 0..60 {
        if !review(token.clone()).await {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(refused, "revoked: the token is refused");
    // Grant b goes the same way, so the shared servers keep nothing of this test.
    grants.delete(&b, &DeleteParams::default()).await.unwrap();
    by_hand(&b);
}
