//! The deployment manifests (deploy/: base, components per role, overlays; and the jobs of
//! jobs/<pass>/ the components build on) against the real consumer apiserver: they render and
//! apply, the schema pass succeeds with exactly the RBAC in
//! deploy/components/consumer/schema-rbac.yaml, the resync pass with exactly
//! deploy/components/consumer/resync-rbac.yaml (plus the example instance role for its test
//! group), a missing rule is reported as a condition, the job command lines only use flags the
//! binary has, and (asked of the apiserver's own authorizer) no pass can read another pass's
//! credentials.
//!
//! Only `schema_pass_runs_as_its_service_account` and `resync_pass_runs_as_its_service_account`
//! use the shared Leases `kbind-system/kbind-schema` and `kbind-system/kbind-resync` (the
//! ServiceAccounts' Lease Roles exist only there); everything else has unique names.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::{ClusterBinding, Connection};
use kbind::api::keys;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::{Api, Client, Resource};
use serde_json::{Value, json};
use support::fx::{cond, holds};
use support::hold::ProviderHold;
use support::identity::{Without, pass_identity};

const NAMESPACE: &str = "kbind-system";
/// relsync's own namespace (its ServiceAccount, Lease and the SpiceDB key Secret).
const RELSYNC_NAMESPACE: &str = "kbind-relsync";
/// The RoleBinding a team creates so relsync may read its sources' credential Secrets.
const RELSYNC_CREDENTIALS_EXAMPLE: &str =
    "deploy/components/directory/relsync-credentials-example.yaml";
const SERVICE_ACCOUNT: &str = "kbind-schema";
const RESYNC_SERVICE_ACCOUNT: &str = "kbind-resync";
/// The namespaces: kbind-system (deploy/base), kbind-relsync (the directory component) and
/// kbind-grants (the provider component).
const NAMESPACE_FILES: [&str; 3] = [
    "deploy/base/namespace.yaml",
    "deploy/components/directory/namespace.yaml",
    "deploy/components/provider/grants-namespace.yaml",
];
/// The RBAC manifests, one per registered pass (src/registry.rs).
fn rbac_files() -> Vec<String> {
    kbind::registry::PASSES
        .iter()
        .map(|p| p.rbac_file())
        .collect()
}

/// Every registered pass's identity: its ServiceAccount `kbind-<pass>` where its Jobs run.
fn pass_accounts() -> Vec<(&'static str, (&'static str, String))> {
    kbind::registry::PASSES
        .iter()
        .map(|p| (p.name, (p.namespace, format!("kbind-{}", p.name))))
        .collect()
}

/// The grants namespace of the provider component (deploy/components/provider/grants-namespace.yaml).
const GRANTS_NAMESPACE: &str = "kbind-grants";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every non-empty document of a multi-document YAML text.
fn documents(yaml: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("parse {what}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Run kubectl (against `kubeconfig` when given), feeding `stdin`.
fn kubectl(kubeconfig: Option<&Path>, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new("kubectl");
    if let Some(kc) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kc);
    }
    cmd.args(args);
    support::output_with_stdin(&mut cmd, stdin)
}

/// kubectl that must succeed; returns stdout.
fn kubectl_ok(kubeconfig: Option<&Path>, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(kubeconfig, args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Server-side apply both namespaces for real.
fn apply_namespaces(env: &support::Env) {
    for file in NAMESPACE_FILES {
        apply_for_real(env, file);
    }
}

/// Server-side apply `file` for real (idempotent: shared by every test and run).
fn apply_for_real(env: &support::Env, file: &str) {
    let path = repo(file).to_string_lossy().to_string();
    kubectl_ok(
        Some(&env.consumer),
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kbind-deploy-tests",
            "-f",
            &path,
        ],
        None,
    );
}

/// An operator's step for a further credential namespace `ns`: the file's `*-credentials` Role
/// and RoleBinding (subject the pass's ServiceAccount in kbind-system), created in `ns`.
async fn credential_namespace(consumer: &Client, file: &str, ns: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    for d in support::identity::rbac_documents(file) {
        let named = d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-credentials"));
        if !named {
            continue;
        }
        let mut d = d.clone();
        d["metadata"]["namespace"] = json!(ns);
        let pp = PostParams::default();
        match d["kind"].as_str() {
            Some("Role") => {
                let r: Role = serde_json::from_value(d).expect("Role");
                Api::<Role>::namespaced(consumer.clone(), ns)
                    .create(&pp, &r)
                    .await
                    .expect("create Role");
            }
            Some("RoleBinding") => {
                let r: RoleBinding = serde_json::from_value(d).expect("RoleBinding");
                Api::<RoleBinding>::namespaced(consumer.clone(), ns)
                    .create(&pp, &r)
                    .await
                    .expect("create RoleBinding");
            }
            _ => {}
        }
    }
}

/// A kubeconfig file for the existing ServiceAccount `namespace/name`.
async fn token_kubeconfig(env: &support::Env, namespace: &str, name: &str) -> PathBuf {
    write_kubeconfig(&support::token_kubeconfig(&env.consumer, namespace, name).await)
}

fn write_kubeconfig(content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", support::unique("kbind-deploy")));
    std::fs::write(&path, content).expect("write kubeconfig");
    path
}

fn has_cleanup_finalizer<K: Resource>(o: &K) -> bool {
    o.meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == keys::CLEANUP_FINALIZER)
}

/// The objects one schema pass works on: a provider Secret in its own namespace, an exported
/// provider CRD in a unique group, a labelled Connection and a ClusterBinding for the CRD.
struct Setup {
    ns: String,
    label: String,
    connection: String,
    binding: String,
    crd: String,
    /// Its hold on the shared provider (tests/support/hold.rs).
    _hold: ProviderHold,
}

async fn setup(env: &support::Env, consumer: &Client, prefix: &str) -> Setup {
    let hold = ProviderHold::shared();
    support::kbind_crds(consumer).await;
    let provider = env.provider().await;
    let ns = support::namespace(consumer, prefix).await;
    let label = support::unique(prefix);
    let group = format!("{label}.kbind.test");

    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}"), "labels": {keys::EXPORTED: "true"}},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "singular": "widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}});
    let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("provider CRD");
    support::apply_crds(&provider, &[crd]).await;

    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("provider".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            std::fs::read_to_string(&env.provider).expect("provider kubeconfig"),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(consumer.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");

    // autoBind off: on the shared provider it would bind every test's exports.
    let connection = format!("{label}-conn");
    let c = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": {"name": connection, "labels": {"kbind-test": label}},
        "spec": {"kubeconfigSecretRef": {"namespace": ns, "name": "provider"},
            "schema": {"source": "CRD"}, "autoBind": false}});
    let c: Connection = serde_json::from_value(c).expect("Connection");
    Api::<Connection>::all(consumer.clone())
        .create(&PostParams::default(), &c)
        .await
        .expect("create Connection");

    let crd_name = format!("widgets.{group}");
    let binding = format!("{label}-bind");
    let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
        "metadata": {"name": binding},
        "spec": {"connectionRef": {"name": connection}, "apis": [{"name": crd_name}]}});
    let b: ClusterBinding = serde_json::from_value(b).expect("ClusterBinding");
    Api::<ClusterBinding>::all(consumer.clone())
        .create(&PostParams::default(), &b)
        .await
        .expect("create ClusterBinding");

    Setup {
        ns,
        label,
        connection,
        binding,
        crd: crd_name,
        _hold: hold,
    }
}

/// Run `kbind schema` with `args` until `done` holds (RBAC changes reach the apiserver's
/// authorizer a moment after they are written) or ~20 s passed; returns the last run.
async fn run_until<F, Fut>(args: &[&str], mut done: F) -> (i32, Value, String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut last = (0, Value::Null, String::new());
    for _ in 0..40 {
        last = support::kbind(args);
        if last.0 == 0 && last.1["outcome"] == "completed" && done().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

/// The installable kustomizations and the roles (components) each installs. `deploy/` is the
/// consumer side only: a team wanting schema and resync gets no claims or relsync job failing
/// for want of their settings.
const OVERLAYS: [(&str, &[&str]); 7] = [
    ("deploy", &["consumer"]),
    ("deploy/base", &[]),
    ("deploy/consumer", &["consumer"]),
    ("deploy/hub", &["hub"]),
    ("deploy/directory", &["directory"]),
    ("deploy/all", &["consumer", "hub", "directory"]),
    // On the provider cluster: the service layer's issuer.
    ("deploy/provider", &["provider"]),
];

/// The passes (`app.kubernetes.io/component`) of a role.
fn role_passes(role: &str) -> &'static [&'static str] {
    match role {
        "consumer" => &["schema", "resync"],
        "hub" => &["claims"],
        "directory" => &["relsync"],
        "provider" => &["issue"],
        other => panic!("unknown role {other}"),
    }
}

/// `kubectl kustomize <dir>` (kubectl's built-in kustomize).
fn kustomize(dir: &str) -> String {
    kubectl_ok(None, &["kustomize", &repo(dir).to_string_lossy()], None)
}

/// a. Every kustomization renders; each installs exactly its roles' passes on top of the base
/// (CRDs and kbind-system, nothing that runs); `deploy/` is the consumer side; every rendering,
/// and the one-off Job templates (schema one-off, sharded resync Indexed Job), passes a
/// server-side dry-run apply on the consumer apiserver.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn manifests_render_and_pass_server_dry_run() {
    let env = support::env();
    let base = documents(&kustomize("deploy/base"), "deploy/base");
    let crds = base
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(
        crds,
        kbind::crds::kbind_crds().len(),
        "deploy/base installs every CRD"
    );
    assert!(
        base.iter()
            .all(|d| d["kind"] == "CustomResourceDefinition" || d["kind"] == "Namespace"),
        "deploy/base must hold nothing that runs"
    );
    let mut rendered_overlays = Vec::new();
    for (dir, roles) in OVERLAYS {
        let rendered = kustomize(dir);
        let docs = documents(&rendered, dir);
        // The base is in every installation.
        for b in &base {
            assert!(
                docs.iter()
                    .any(|d| d["kind"] == b["kind"]
                        && d["metadata"]["name"] == b["metadata"]["name"]),
                "{dir}: no {} {} (deploy/base)",
                b["kind"],
                b["metadata"]["name"]
            );
        }
        // Exactly the passes of its roles.
        let mut passes: Vec<&str> = docs
            .iter()
            .filter_map(|d| d["metadata"]["labels"]["app.kubernetes.io/component"].as_str())
            .collect();
        passes.sort_unstable();
        passes.dedup();
        let mut want: Vec<&str> = roles.iter().flat_map(|r| role_passes(r)).copied().collect();
        want.sort_unstable();
        assert_eq!(passes, want, "{dir}: the passes it installs");
        for pass in &want {
            assert!(
                docs.iter()
                    .any(|d| d["kind"] == "CronJob"
                        && d["metadata"]["name"] == format!("kbind-{pass}")),
                "{dir}: no CronJob kbind-{pass}"
            );
        }
        assert!(
            !docs.iter().any(|d| d["kind"] == "Job"),
            "{dir}: a kustomization must not create a Job (it would run at once)"
        );
        rendered_overlays.push((dir, rendered, docs));
    }
    assert_eq!(
        rendered_overlays[0].1, rendered_overlays[2].1,
        "deploy/ installs what deploy/consumer does"
    );
    let (_, _, docs) = rendered_overlays
        .iter()
        .find(|(dir, _, _)| *dir == "deploy/all")
        .expect("deploy/all rendered");
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "CronJob",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in deploy/all: {kinds:?}");
    }
    for (kind, name) in [
        ("Namespace", "kbind-system"),
        ("Namespace", RELSYNC_NAMESPACE),
        ("ClusterRole", "kbind-relsync-credentials"),
        ("ServiceAccount", "kbind-schema"),
        ("ServiceAccount", "kbind-resync"),
        ("ClusterRole", "kbind-resync"),
        ("ClusterRole", "kbind-resync-instances-example"),
        ("Role", "kbind-resync-lease"),
        ("CronJob", "kbind-schema"),
        ("CronJob", "kbind-resync"),
        ("ServiceAccount", "kbind-claims"),
        ("ClusterRole", "kbind-claims"),
        ("Role", "kbind-claims-lease"),
        ("CronJob", "kbind-claims"),
        ("ServiceAccount", "kbind-relsync"),
        ("ClusterRole", "kbind-relsync"),
        ("Role", "kbind-relsync-lease"),
        ("CronJob", "kbind-relsync"),
    ] {
        assert!(
            docs.iter()
                .any(|d| d["kind"] == kind && d["metadata"]["name"] == name),
            "no {kind} {name} in deploy/all"
        );
    }

    // relsync's credentials ClusterRole is granted per namespace, never cluster-wide.
    assert!(
        !docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"
            && d["roleRef"]["name"] == "kbind-relsync-credentials"),
        "kbind-relsync-credentials must not be bound cluster-wide"
    );
    // relsync's objects live in its own namespace.
    for d in docs.iter().filter(|d| {
        d["metadata"]["labels"]["app.kubernetes.io/component"] == "relsync"
            && d["metadata"]["namespace"].is_string()
    }) {
        assert_eq!(
            d["metadata"]["namespace"], RELSYNC_NAMESPACE,
            "{} {}",
            d["kind"], d["metadata"]["name"]
        );
    }

    // Namespaced objects need their namespace to exist even in a dry run.
    apply_namespaces(&env);
    // The namespaces now carry `pod-security.kubernetes.io/warn: restricted`: the apiserver
    // warns about every pod template in them that would violate `restricted`.
    let dry_run = |input: &str, what: &str, count: usize| {
        let args = [
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "--field-manager=kbind-deploy-tests",
            "-f",
            "-",
        ];
        let output = kubectl(Some(&env.consumer), &args, Some(input));
        let (out, err) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(output.status.success(), "{what}: {err}\n{out}");
        let applied = out.matches("(server dry run)").count();
        assert_eq!(applied, count, "{what}: every document applies:\n{out}");
        assert!(
            !err.contains("PodSecurity"),
            "{what}: pods must meet Pod Security restricted:\n{err}"
        );
    };
    for (dir, rendered, docs) in &rendered_overlays {
        dry_run(rendered, dir, docs.len());
    }
    for file in [
        "jobs/schema/oneoff-job.yaml",
        "jobs/resync/indexed-job.yaml",
    ] {
        let job = read(file);
        dry_run(&job, file, documents(&job, file).len());
    }
    // The per-namespace credentials grant, in a namespace that exists.
    let example =
        read(RELSYNC_CREDENTIALS_EXAMPLE).replace("namespace: team-a", "namespace: default");
    dry_run(&example, RELSYNC_CREDENTIALS_EXAMPLE, 1);
}

/// b. The pass, run as kbind-system/kbind-schema with exactly deploy/components/consumer/schema-rbac.yaml, succeeds:
/// Connection Ready, consumer CRD installed, finalizers held, statuses written.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn schema_pass_runs_as_its_service_account() {
    let env = support::env();
    let consumer = env.consumer().await;
    // kbind's CRDs come from the binary (like every other test) rather than deploy/crds: the
    // `crds` test keeps the two equal.
    apply_namespaces(&env);
    apply_for_real(&env, "deploy/components/consumer/schema-rbac.yaml");
    let s = setup(&env, &consumer, "deploy-sa").await;
    // The test's Secret lives in its own namespace: a further credential namespace.
    credential_namespace(
        &consumer,
        "deploy/components/consumer/schema-rbac.yaml",
        &s.ns,
    )
    .await;
    let kubeconfig = token_kubeconfig(&env, NAMESPACE, SERVICE_ACCOUNT).await;
    let kc = kubeconfig.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", s.label);
    // A short deadline: should this process die mid-run, the shared Lease expires in 2 minutes.
    let args = [
        "schema",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        NAMESPACE,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "--deadline",
        "1m",
        "-o",
        "json",
    ];
    let conns: Api<Connection> = Api::all(consumer.clone());
    let (code, summary, stderr) = run_until(&args, || async {
        conns
            .get(&s.connection)
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|st| holds(&st.conditions, "Ready", "True"))
    })
    .await;
    let as_schema = support::client(&kubeconfig).await;
    let _ = std::fs::remove_file(&kubeconfig);
    assert_eq!(
        code, 0,
        "kbind schema as the ServiceAccount: {summary}\n{stderr}"
    );
    assert_eq!(summary["outcome"], "completed", "{summary}\n{stderr}");
    assert_eq!(
        summary["counts"]["errors"].as_i64().unwrap_or(0),
        0,
        "{summary}\n{stderr}"
    );

    let conn = conns.get(&s.connection).await.expect("Connection");
    let st = conn.status.clone().unwrap_or_default();
    for (t, want) in [
        ("Ready", "True"),
        ("SecretValid", "True"),
        ("Connected", "True"),
        ("PermissionDenied", "False"),
    ] {
        let (status, reason, message) = cond(&st.conditions, t);
        assert_eq!(status, want, "Connection {t}: {reason} {message}");
    }
    assert!(has_cleanup_finalizer(&conn), "Connection finalizer");

    let crd = Api::<CustomResourceDefinition>::all(consumer.clone())
        .get_opt(&s.crd)
        .await
        .expect("get consumer CRD")
        .unwrap_or_else(|| panic!("consumer CRD {} not created", s.crd));
    let labels = crd.metadata.labels.clone().unwrap_or_default();
    let annotations = crd.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(labels.get(keys::MANAGED).map(String::as_str), Some("true"));
    assert_eq!(annotations.get(keys::CONNECTION), Some(&s.connection));

    let cb = Api::<ClusterBinding>::all(consumer.clone())
        .get(&s.binding)
        .await
        .expect("ClusterBinding");
    let bst = cb.status.clone().unwrap_or_default();
    assert_eq!(
        cond(&bst.conditions, "Ready").0,
        "True",
        "{:?}",
        bst.conditions
    );
    assert_eq!(cond(&bst.conditions, "PermissionDenied").0, "False");
    assert!(has_cleanup_finalizer(&cb), "ClusterBinding finalizer");

    let secret = Api::<Secret>::namespaced(consumer.clone(), &s.ns)
        .get("provider")
        .await
        .expect("Secret");
    assert!(has_cleanup_finalizer(&secret), "Secret finalizer");

    // #28 item 10: its Role's `patch` reaches every Secret of a credential namespace; the
    // shipped policy kbind-schema-secrets lets it change only finalizers (above: added), or
    // a Secret `kbind bind` annotated core.kbind.io/grant-secret.
    let secrets = Api::<Secret>::namespaced(as_schema, &s.ns);
    let data = |v: &str| json!({"data": {"kubeconfig": v}});
    let mut refused = None;
    for _ in 0..40 {
        // The policy reaches the apiserver's admission a moment after it is written.
        match secrets
            .patch(
                "provider",
                &PatchParams::default(),
                &Patch::Merge(data("eA==")),
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 422 => {
                refused = Some(e.message);
                break;
            }
            Err(e) => panic!("patching the Secret's data as kbind-schema: {e}"),
            Ok(_) => {
                // Not enforced yet: put the kubeconfig back and look again.
                Api::<Secret>::namespaced(consumer.clone(), &s.ns)
                    .patch(
                        "provider",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"data": secret.data})),
                    )
                    .await
                    .expect("restore the Secret");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    }
    let refused = refused.expect("kbind-schema rewrote a Secret it only reads");
    assert!(refused.contains("kbind-schema-secrets"), "{refused}");
    // Nor hold it for ever with a finalizer of another name, nor hand it to the garbage
    // collector with an ownerReference, nor freeze it.
    for (what, patch) in [
        (
            "a foreign finalizer",
            json!({"metadata": {"finalizers": [keys::CLEANUP_FINALIZER, "example.com/hold"]}}),
        ),
        (
            "an ownerReference",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}]}}),
        ),
        ("immutable", json!({"immutable": true})),
    ] {
        let r = secrets
            .patch("provider", &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        assert!(
            matches!(r, Err(kube::Error::Api(ref e)) if e.code == 422),
            "{what}: {r:?}"
        );
    }
    let annotated = json!({"metadata": {"annotations": {keys::GRANT_SECRET: "g/s"}}});
    assert!(
        matches!(
            secrets
                .patch("provider", &PatchParams::default(), &Patch::Merge(&annotated))
                .await,
            Err(kube::Error::Api(e)) if e.code == 422
        ),
        "nor may it mark one as a Grant's Secret"
    );
    Api::<Secret>::namespaced(consumer.clone(), &s.ns)
        .patch(
            "provider",
            &PatchParams::default(),
            &Patch::Merge(&annotated),
        )
        .await
        .expect("kbind bind (here: admin) annotates it");
    secrets
        .patch(
            "provider",
            &PatchParams::default(),
            &Patch::Merge(data("eA==")),
        )
        .await
        .expect("a Grant's Secret takes the re-issued kubeconfig");
}

/// b2. The resync pass, run as kbind-system/kbind-resync with exactly deploy/components/consumer/resync-rbac.yaml
/// plus its example instance role adapted to this test's group, succeeds and creates the
/// provider copy of a consumer object.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn resync_pass_runs_as_its_service_account() {
    let env = support::env();
    let consumer = env.consumer().await;
    apply_namespaces(&env);
    apply_for_real(&env, "deploy/components/consumer/resync-rbac.yaml");
    let s = setup(&env, &consumer, "deploy-resync").await;
    credential_namespace(
        &consumer,
        "deploy/components/consumer/resync-rbac.yaml",
        &s.ns,
    )
    .await;
    let selector = format!("kbind-test={}", s.label);
    let group = s
        .crd
        .strip_prefix("widgets.")
        .expect("CRD name widgets.<group>")
        .to_string();

    // `kbind schema` as admin (its Lease in this test's own namespace): pins the identities and
    // installs the consumer CRD.
    let admin = env.consumer.to_string_lossy().to_string();
    let schema_args = [
        "schema",
        "--kubeconfig",
        &admin,
        "--lease-namespace",
        &s.ns,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    let conns: Api<Connection> = Api::all(consumer.clone());
    let crds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    let (code, summary, stderr) = run_until(&schema_args, || async {
        let ready = conns
            .get(&s.connection)
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|st| holds(&st.conditions, "Ready", "True"));
        let established = crds
            .get_opt(&s.crd)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.status)
            .and_then(|st| st.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        ready && established
    })
    .await;
    assert_eq!(code, 0, "kbind schema as admin: {summary}\n{stderr}");

    // resync selects bindings: label the ClusterBinding.
    Api::<ClusterBinding>::all(consumer.clone())
        .patch(
            &s.binding,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kbind-test": s.label}}})),
        )
        .await
        .expect("label ClusterBinding");

    // The example instance role, adapted to this test's group, under a unique name.
    let rbac = documents(
        &read("deploy/components/consumer/resync-rbac.yaml"),
        "deploy/components/consumer/resync-rbac.yaml",
    );
    let role_name = format!("{}-instances", s.label);
    let mut instance_role = rbac
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == "kbind-resync-instances-example"
        })
        .cloned()
        .expect("no ClusterRole kbind-resync-instances-example in deploy/components/consumer/resync-rbac.yaml");
    instance_role["metadata"] = json!({"name": role_name});
    for rule in instance_role["rules"]
        .as_array_mut()
        .expect("instance role rules")
    {
        assert_eq!(rule["apiGroups"], json!(["example.org"]), "{rule}");
        rule["apiGroups"] = json!([group]);
    }
    let instance_role: ClusterRole =
        serde_json::from_value(instance_role).expect("instance ClusterRole");
    let cluster_roles: Api<ClusterRole> = Api::all(consumer.clone());
    cluster_roles
        .create(&PostParams::default(), &instance_role)
        .await
        .expect("create instance ClusterRole");
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": RESYNC_SERVICE_ACCOUNT, "namespace": NAMESPACE}]}))
    .expect("ClusterRoleBinding");
    let crbs: Api<ClusterRoleBinding> = Api::all(consumer.clone());
    crbs.create(&PostParams::default(), &crb)
        .await
        .expect("create instance ClusterRoleBinding");

    // One consumer object (retried: the new CRD is served a moment after Established).
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&group, "v1", "Widget"),
        "widgets",
    );
    let consumer_widgets: Api<DynamicObject> = Api::namespaced_with(consumer.clone(), &s.ns, &ar);
    let widget = DynamicObject::new("w", &ar).data(json!({"spec": {"size": 3}}));
    let mut last_err = None;
    for _ in 0..40 {
        match consumer_widgets
            .create(&PostParams::default(), &widget)
            .await
        {
            Ok(_) => {
                last_err = None;
                break;
            }
            Err(e) => last_err = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last_err.is_none(), "create consumer Widget: {last_err:?}");

    // resync as the ServiceAccount. The shared Lease kbind-system/kbind-resync may be held by a
    // concurrent run (outcome "skipped"), and RBAC changes reach the authorizer a moment late:
    // run_until retries for ~20 s. A short deadline: should this process die mid-run, the shared
    // Lease expires soon.
    let kubeconfig = token_kubeconfig(&env, NAMESPACE, RESYNC_SERVICE_ACCOUNT).await;
    let kc = kubeconfig.to_string_lossy().to_string();
    let args = [
        "resync",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        NAMESPACE,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "--deadline",
        "1m",
        "-o",
        "json",
    ];
    let provider = env.provider().await;
    let provider_widgets: Api<DynamicObject> = Api::namespaced_with(provider.clone(), &s.ns, &ar);
    let (code, summary, stderr) = run_until(&args, || async {
        provider_widgets.get_opt("w").await.ok().flatten().is_some()
    })
    .await;
    let _ = std::fs::remove_file(&kubeconfig);
    // Cluster-scoped leftovers of this test.
    let _ = crbs.delete(&role_name, &DeleteParams::default()).await;
    let _ = cluster_roles
        .delete(&role_name, &DeleteParams::default())
        .await;
    assert_eq!(
        code, 0,
        "kbind resync as the ServiceAccount: {summary}\n{stderr}"
    );
    assert_eq!(summary["outcome"], "completed", "{summary}\n{stderr}");
    for count in ["errors", "denied", "rejected", "conflicts"] {
        assert_eq!(
            summary["counts"][count].as_i64().unwrap_or(0),
            0,
            "{count}: {summary}\n{stderr}"
        );
    }
    let copy = provider_widgets
        .get_opt("w")
        .await
        .expect("get provider copy")
        .unwrap_or_else(|| panic!("no provider copy of {}/w: {summary}\n{stderr}", s.ns));
    assert_eq!(copy.data["spec"]["size"], 3, "provider copy spec");
}

/// c. The same RBAC without `create` on customresourcedefinitions: the pass still exits 0 and
/// reports the refusal as conditions (PermissionDenied=True, CRDWriteForbidden).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn missing_crd_create_rule_is_reported_as_permission_denied() {
    let env = support::env();
    let consumer = env.consumer().await;
    let s = setup(&env, &consumer, "deploy-rbac").await;
    let identity = pass_identity(
        &env.consumer,
        "deploy/components/consumer/schema-rbac.yaml",
        &s.ns,
        Without::Verb {
            resource: "customresourcedefinitions",
            verb: "create",
        },
    )
    .await;

    let kc = identity.kubeconfig();
    let selector = format!("kbind-test={}", s.label);
    let args = [
        "schema",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &s.ns,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    let bindings: Api<ClusterBinding> = Api::all(consumer.clone());
    let (code, summary, stderr) = run_until(&args, || async {
        bindings
            .get(&s.binding)
            .await
            .ok()
            .and_then(|b| b.status)
            .is_some_and(|st| holds(&st.conditions, "PermissionDenied", "True"))
    })
    .await;
    assert_eq!(
        code, 0,
        "partial failures are conditions, not an exit code: {summary}\n{stderr}"
    );
    assert_eq!(summary["outcome"], "completed", "{summary}\n{stderr}");

    let bst = bindings
        .get(&s.binding)
        .await
        .expect("ClusterBinding")
        .status
        .unwrap_or_default();
    let (status, reason, message) = cond(&bst.conditions, "PermissionDenied");
    assert_eq!((status, reason), ("True", "CRDWriteForbidden"), "{message}");
    assert_eq!(
        cond(&bst.conditions, "Ready").0,
        "False",
        "{:?}",
        bst.conditions
    );

    let st = Api::<Connection>::all(consumer.clone())
        .get(&s.connection)
        .await
        .expect("Connection")
        .status
        .unwrap_or_default();
    let (status, reason, message) = cond(&st.conditions, "PermissionDenied");
    assert_eq!((status, reason), ("True", "CRDWriteForbidden"), "{message}");
    assert_eq!(
        cond(&st.conditions, "Connected").0,
        "True",
        "{:?}",
        st.conditions
    );
    assert!(
        Api::<CustomResourceDefinition>::all(consumer.clone())
            .get_opt(&s.crd)
            .await
            .expect("get consumer CRD")
            .is_none(),
        "the CRD must not exist without create permission"
    );

    // Cluster-scoped leftovers of this test.
    identity.remove().await;
}

/// Every `*.yaml` file under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "yaml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The containers of every Job and CronJob under jobs/ (and deploy/components/, should one be
/// added there), with the Job spec holding them.
fn job_containers() -> Vec<(String, Value, Value)> {
    let mut out = Vec::new();
    let files = ["jobs", "deploy/components"]
        .iter()
        .flat_map(|dir| yaml_files(&repo(dir)));
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read job manifest");
        for doc in documents(&text, &file.display().to_string()) {
            let job_spec = match doc["kind"].as_str() {
                Some("CronJob") => doc["spec"]["jobTemplate"]["spec"].clone(),
                Some("Job") => doc["spec"].clone(),
                _ => continue,
            };
            let what = format!(
                "{} {} ({})",
                doc["kind"].as_str().unwrap_or_default(),
                doc["metadata"]["name"].as_str().unwrap_or_default(),
                file.display()
            );
            let containers = job_spec["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| panic!("{what}: no containers"));
            for c in containers {
                out.push((what.clone(), job_spec.clone(), c));
            }
        }
    }
    out
}

/// d. Every flag the job manifests pass exists in the binary's `--help`, and each Job's
/// activeDeadlineSeconds is above the pass's --deadline.
#[test]
fn job_command_lines_match_the_binary() {
    let containers = job_containers();
    assert!(
        containers.len() >= 4,
        "the CronJobs, the one-off Job and the Indexed Job: {containers:?}"
    );
    let mut resync_checked = false;
    let mut shard_checked = false;
    for (what, job_spec, container) in containers {
        let args: Vec<String> = container["args"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no args"))
            .iter()
            .map(|a| {
                a.as_str()
                    .unwrap_or_else(|| panic!("{what}: arg {a}"))
                    .to_string()
            })
            .collect();
        let subcommand = args.first().unwrap_or_else(|| panic!("{what}: empty args"));
        resync_checked |= subcommand == "resync";
        let out = Command::new(env!("CARGO_BIN_EXE_kbind"))
            .args([subcommand.as_str(), "--help"])
            .output()
            .expect("run kbind --help");
        assert!(
            out.status.success(),
            "{what}: `kbind {subcommand} --help` failed"
        );
        let help = String::from_utf8_lossy(&out.stdout);
        let known: Vec<&str> = help
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| w.starts_with("--"))
            .collect();

        let mut deadline = Duration::from_secs(600); // the binary's default
        let mut i = 1;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            let Some(flag) = arg.strip_prefix("--") else {
                continue;
            };
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (flag, None),
            };
            assert!(
                known.contains(&format!("--{name}").as_str()),
                "{what}: `--{name}` is not a flag of `kbind {subcommand}`:\n{help}"
            );
            if name == "shard" {
                shard_checked = true;
            }
            if name == "deadline" {
                let value = value
                    .or_else(|| args.get(i).cloned())
                    .expect("--deadline value");
                deadline = kbind::pass::args::parse_duration(&value)
                    .unwrap_or_else(|e| panic!("{what}: --deadline {value}: {e}"));
            }
        }
        let active = job_spec["activeDeadlineSeconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no activeDeadlineSeconds"));
        // A one-off command (`kbind bind`) has no pass deadline: activeDeadlineSeconds alone
        // bounds it.
        let pass = kbind::registry::find(subcommand).is_some_and(|d| d.takes_lease);
        assert!(
            !pass || active > deadline.as_secs(),
            "{what}: activeDeadlineSeconds {active} must be above --deadline ({}s)",
            deadline.as_secs()
        );
    }
    assert!(resync_checked, "no job in jobs/ runs `kbind resync`");
    assert!(
        shard_checked,
        "no job in jobs/ passes --shard (jobs/resync/indexed-job.yaml)"
    );
}

/// The sharded resync example is an Indexed Job whose shard count matches its completions.
#[test]
fn resync_indexed_job_shards_by_completion_index() {
    let docs = documents(
        &read("jobs/resync/indexed-job.yaml"),
        "jobs/resync/indexed-job.yaml",
    );
    let job = docs.iter().find(|d| d["kind"] == "Job").expect("Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    let completions = spec["completions"].as_u64().expect("completions");
    assert_eq!(spec["parallelism"].as_u64(), Some(completions));
    let args = &spec["template"]["spec"]["containers"][0]["args"];
    let shard = format!("--shard=$(JOB_COMPLETION_INDEX)/{completions}");
    assert!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(shard.as_str()))),
        "args must include {shard}: {args}"
    );
}

/// The one-off Job template runs exactly what the CronJob runs, except that it reconciles
/// every Connection: an operator runs it to refresh now (docs/schema.md "Full sweeps").
#[test]
fn oneoff_job_has_the_cronjob_pod_spec() {
    let cron = documents(
        &read("jobs/schema/cronjob.yaml"),
        "jobs/schema/cronjob.yaml",
    );
    let job = documents(
        &read("jobs/schema/oneoff-job.yaml"),
        "jobs/schema/oneoff-job.yaml",
    );
    let cron_job = cron
        .iter()
        .find(|d| d["kind"] == "CronJob")
        .expect("CronJob")["spec"]["jobTemplate"]["spec"]
        .clone();
    let oneoff = job.iter().find(|d| d["kind"] == "Job").expect("Job")["spec"].clone();
    let mut cron_pod = cron_job["template"]["spec"].clone();
    let args = cron_pod["containers"][0]["args"]
        .as_array_mut()
        .expect("args");
    let sweeping = args.len();
    args.retain(|a| a != "--full-sweep-every=5m");
    assert_eq!(
        args.len(),
        sweeping - 1,
        "the CronJob sweeps fully every 5m"
    );
    assert_eq!(cron_pod, oneoff["template"]["spec"]);
    for field in [
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ] {
        assert_eq!(cron_job[field], oneoff[field], "{field}");
    }
}

/// Least privilege in the RBAC manifests: no wildcards, Secrets are never listed or watched, and
/// resync only reads Secrets (it never patches them: the cleanup finalizer is schema's).
#[test]
fn rbac_has_no_wildcards() {
    for file in rbac_files() {
        rbac_file_has_no_wildcards(&file);
    }
}

fn rbac_file_has_no_wildcards(file: &str) {
    // Only schema patches Secrets (the cleanup finalizer); resync and relsync only read them.
    let resync = !file.ends_with("schema-rbac.yaml");
    // The issuer writes the issued kubeconfig Secrets, in a Role of the grants namespace only.
    let issuer = file.ends_with("issue-rbac.yaml");
    for doc in documents(&read(file), file) {
        let Some(rules) = doc["rules"].as_array() else {
            continue;
        };
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        for rule in rules {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                let wild = rule[field].as_array().is_some_and(|v| {
                    v.iter()
                        .any(|x| x.as_str().is_some_and(|s| s.contains('*')))
                });
                assert!(!wild, "{name}: wildcard in {field}: {rule}");
            }
            let secrets = rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r == "secrets"));
            let verbs = rule["verbs"].as_array().cloned().unwrap_or_default();
            if issuer && secrets {
                assert!(
                    doc["kind"] == "Role" && doc["metadata"]["namespace"] == GRANTS_NAMESPACE,
                    "{name}: the issuer's Secret rules live in a Role of {GRANTS_NAMESPACE}: {rule}"
                );
                assert!(
                    verbs.iter().all(|v| v != "watch"),
                    "{name}: the issuer never watches Secrets: {rule}"
                );
                continue;
            }
            assert!(
                !secrets || verbs.iter().all(|v| v == "get" || v == "patch"),
                "{name}: Secrets only get and patch: {rule}"
            );
            assert!(
                !(resync && secrets && verbs.iter().any(|v| v == "patch")),
                "{name}: resync never patches Secrets: {rule}"
            );
        }
    }
}

/// The claims pass (single-cluster mode) run as a ServiceAccount holding exactly the rules of
/// deploy/components/hub/claims-rbac.yaml (`without` removes one resource from its rules), in a namespace
/// of its own. Returns the CatalogEntry's Ready condition and the binding's claim states.
async fn claims_as_service_account(
    env: &support::Env,
    prefix: &str,
    without: Option<&str>,
) -> ((String, String), Vec<String>) {
    let consumer = env.consumer().await;
    support::kbind_crds(&consumer).await;
    support::apply_crds(&consumer, &kbind::crds::kcp_crds()).await;
    let ns = support::namespace(&consumer, prefix).await;
    let identity = pass_identity(
        &env.consumer,
        "deploy/components/hub/claims-rbac.yaml",
        &ns,
        without.map_or(Without::Nothing, Without::Resource),
    )
    .await;

    // A provider export, its CatalogEntry and one tenant binding.
    let label = support::unique(prefix);
    let export = format!("{label}.example.io");
    let dynamic = |group: &str, version: &str, kind: &str, plural: &str| {
        Api::<DynamicObject>::all_with(
            consumer.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                plural,
            ),
        )
    };
    let apply = |api: Api<DynamicObject>, body: Value| async move {
        let name = body["metadata"]["name"].as_str().expect("name").to_string();
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .expect("apply");
    };
    apply(
        dynamic("apis.kcp.io", "v1alpha2", "APIExport", "apiexports"),
        json!({
        "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": export},
        "spec": {"permissionClaims": [{"group": "", "resource": "configmaps", "verbs": ["get"]}]}}),
    )
    .await;
    apply(dynamic("providers.kbind.io", "v1alpha1", "CatalogEntry", "catalogentries"), json!({
        "apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
        "metadata": {"name": label, "labels": {"kbind-test": label}},
        "spec": {"export": {"name": export}, "requires": [{"group": "", "resource": "configmaps"}]}})).await;
    apply(
        dynamic("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings"),
        json!({
        "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding", "metadata": {"name": label},
        "spec": {"reference": {"export": {"name": export}}}}),
    )
    .await;

    let kc = identity.kubeconfig();
    let selector = format!("kbind-test={label}");
    let (code, summary, stderr) = support::kbind(&[
        "claims",
        "--single-cluster",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ]);
    assert_eq!(
        code, 0,
        "kbind claims as the ServiceAccount: {summary}\n{stderr}"
    );
    let entry = dynamic(
        "providers.kbind.io",
        "v1alpha1",
        "CatalogEntry",
        "catalogentries",
    )
    .get(&label)
    .await
    .expect("entry");
    let ready = entry.data["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_else(|| panic!("no Ready condition: {}", entry.data["status"]));
    let binding = dynamic("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings")
        .get(&label)
        .await
        .expect("binding");
    let states = binding.data["spec"]["permissionClaims"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    format!(
                        "{}={}",
                        c["resource"].as_str().unwrap_or(""),
                        c["state"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    identity.remove().await;
    (
        (
            ready["status"].as_str().unwrap_or_default().to_string(),
            ready["reason"].as_str().unwrap_or_default().to_string(),
        ),
        states,
    )
}

/// The claims pass succeeds with exactly deploy/components/hub/claims-rbac.yaml.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn claims_pass_runs_as_its_service_account() {
    let env = support::env();
    let (ready, states) = claims_as_service_account(&env, "deploy-claims", None).await;
    assert_eq!(ready, ("True".to_string(), "InStep".to_string()));
    assert_eq!(states, vec!["configmaps=Accepted".to_string()]);
}

/// Without its rule on apiexports the CatalogEntry says PermissionDenied, and nothing is written.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn claims_missing_export_read_rule_is_reported_as_permission_denied() {
    let env = support::env();
    let (ready, states) =
        claims_as_service_account(&env, "deploy-claims-rbac", Some("apiexports")).await;
    assert_eq!(ready, ("False".to_string(), "PermissionDenied".to_string()));
    assert!(states.is_empty(), "{states:?}");
}

/// b3. The resync RBAC without its rule on Secrets: the pass exits 0, syncs nothing through that
/// Connection, and says why in a PermissionDenied Event on the Connection (not "not found").
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn resync_missing_secrets_rule_is_reported_as_permission_denied() {
    let env = support::env();
    let consumer = env.consumer().await;
    let s = setup(&env, &consumer, "deploy-resync-rbac").await;
    let selector = format!("kbind-test={}", s.label);
    let admin = env.consumer.to_string_lossy().to_string();
    let schema_args = [
        "schema",
        "--kubeconfig",
        &admin,
        "--lease-namespace",
        &s.ns,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    let conns: Api<Connection> = Api::all(consumer.clone());
    let (code, summary, stderr) = run_until(&schema_args, || async {
        conns
            .get(&s.connection)
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|st| holds(&st.conditions, "Ready", "True"))
    })
    .await;
    assert_eq!(code, 0, "kbind schema as admin: {summary}\n{stderr}");
    Api::<ClusterBinding>::all(consumer.clone())
        .patch(
            &s.binding,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kbind-test": s.label}}})),
        )
        .await
        .expect("label ClusterBinding");

    let identity = pass_identity(
        &env.consumer,
        "deploy/components/consumer/resync-rbac.yaml",
        &s.ns,
        Without::Resource("secrets"),
    )
    .await;

    let kc = identity.kubeconfig();
    let args = [
        "resync",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &s.ns,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(consumer.clone(), "default");
    let denied = || async {
        events.list(&Default::default()).await.ok().and_then(|l| {
            l.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PermissionDenied")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(s.connection.as_str())
            })
        })
    };
    let (code, summary, stderr) = run_until(&args, || async { denied().await.is_some() }).await;
    identity.remove().await;
    assert_eq!(code, 0, "{summary}\n{stderr}");
    let event = denied()
        .await
        .unwrap_or_else(|| panic!("no PermissionDenied Event: {summary}\n{stderr}"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("Secret") && note.contains("forbidden"),
        "{note}"
    );
}

/// Every Job and CronJob gives the pass its pod and Job names, so the Lease holder is
/// `<job>/<pod>` and a pod the Job retries after a crash takes over its predecessor's Lease
/// (docs/operations.md, "The pass Lease").
#[test]
fn every_job_passes_its_pod_and_job_name_for_the_lease() {
    for (what, _, container) in job_containers() {
        let subcommand = container["args"][0].as_str().unwrap_or_default();
        if kbind::registry::find(subcommand).is_some_and(|d| !d.takes_lease) {
            continue; // a one-off command (`kbind bind`) takes no Lease
        }
        let env = container["env"].as_array().cloned().unwrap_or_default();
        let field = |name: &str| {
            env.iter()
                .find(|e| e["name"] == name)
                .and_then(|e| e["valueFrom"]["fieldRef"]["fieldPath"].as_str())
                .map(String::from)
        };
        assert_eq!(
            field("POD_NAME").as_deref(),
            Some("metadata.name"),
            "{what}: POD_NAME"
        );
        assert_eq!(
            field("JOB_NAME").as_deref(),
            Some("metadata.labels['batch.kubernetes.io/job-name']"),
            "{what}: JOB_NAME"
        );
    }
}

/// The default install's RBAC, rule by rule with why it is needed (the comment above it in the
/// file): every rule must say why, and no pass reads Secrets cluster-wide (relsync's
/// `kbind-relsync-credentials` is a ClusterRole only so that each team can bind it in its own
/// namespace). Run with `--nocapture` to see the table; the counts per pass are what
/// docs/operations.md quotes.
#[test]
fn every_rbac_rule_says_why_and_secrets_stay_in_their_namespaces() {
    let mut table = Vec::new();
    for file in rbac_files() {
        let file = file.as_str();
        let text = read(file);
        for doc in text.split("\n---") {
            let kind = doc
                .lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .unwrap_or_default()
                .to_string();
            let name = doc
                .lines()
                .skip_while(|l| !l.starts_with("metadata:"))
                .find_map(|l| l.trim().strip_prefix("name: "))
                .unwrap_or_default()
                .to_string();
            let mut why = String::new();
            let mut block = String::new();
            let lines: Vec<&str> = doc.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim();
                if let Some(c) = t.strip_prefix('#') {
                    block.push_str(c.trim());
                    block.push(' ');
                    continue;
                }
                if !block.is_empty() {
                    why = std::mem::take(&mut block);
                }
                if !line.starts_with("  - apiGroups:") {
                    continue;
                }
                let rule: String = lines[i..]
                    .iter()
                    .take(4)
                    .take_while(|l| *l == line || l.starts_with("    "))
                    .map(|l| l.trim())
                    .collect::<Vec<_>>()
                    .join(" ");
                assert!(
                    !why.trim().is_empty(),
                    "{file}: {kind} {name}: rule without a reason: {rule}"
                );
                if rule.contains("\"secrets\"") && kind == "ClusterRole" {
                    // Only relsync's per-namespace credentials role, which nothing binds
                    // cluster-wide (checked in manifests_render_and_pass_server_dry_run).
                    assert!(
                        file.ends_with("relsync-rbac.yaml") && name == "kbind-relsync-credentials",
                        "{file}: {name} reads Secrets cluster-wide: {rule}"
                    );
                }
                let short: String = why.chars().take(90).collect();
                table.push(format!("{file:<26} {kind:<12} {rule:<110} {short}"));
            }
        }
    }
    for row in &table {
        eprintln!("{row}");
    }
    for file in rbac_files() {
        let n = table.iter().filter(|r| r.starts_with(&file)).count();
        eprintln!("{file}: {n} rules");
        assert!(n > 0, "{file} has rules");
    }
}

/// Whether `namespace/service_account` may `verb` Secrets (`name`, when given) in `ns` (`None`:
/// every namespace), asked of the apiserver's authorizer with the groups a ServiceAccount token
/// carries.
async fn may_secrets(
    consumer: &Client,
    (namespace, service_account): (&str, &str),
    verb: &str,
    ns: Option<&str>,
    name: Option<&str>,
) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{namespace}:{service_account}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"),
                "system:authenticated"],
            "resourceAttributes": {"namespace": ns.unwrap_or_default(), "verb": verb,
                "resource": "secrets", "name": name.unwrap_or_default()}}}))
    .expect("SubjectAccessReview");
    Api::<SubjectAccessReview>::all(consumer.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("create SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

/// No pass can read another pass's credentials, with exactly the shipped manifests (applied for
/// real) and asked of the apiserver's own authorizer (SubjectAccessReview, as each pass's
/// ServiceAccount):
/// - the SpiceDB key (kbind-relsync/kbind-spicedb, mounted by the kubelet) is readable by no
///   pass's identity, relsync's included;
/// - the Connection Secrets (the credential namespace kbind-system, and a further credential
///   namespace set up as docs/operations.md says) are readable by schema and resync only;
/// - a source's credential Secret is readable by relsync only, and only in a namespace whose team
///   created the example RoleBinding (deploy/components/directory/relsync-credentials-example.yaml);
/// - no pass may list or watch Secrets anywhere, nor read them in a namespace it was not given.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn no_pass_can_read_another_pass_credentials() {
    let env = support::env();
    let consumer = env.consumer().await;
    apply_namespaces(&env);
    for file in rbac_files() {
        apply_for_real(&env, &file);
    }
    // A further credential namespace for schema and resync, and two team namespaces holding
    // RelationshipSources: one granted relsync's credentials role, one not.
    let credentials = support::namespace(&consumer, "deploy-creds").await;
    for file in [
        "deploy/components/consumer/schema-rbac.yaml",
        "deploy/components/consumer/resync-rbac.yaml",
    ] {
        credential_namespace(&consumer, file, &credentials).await;
    }
    let granted = support::namespace(&consumer, "deploy-team-granted").await;
    let ungranted = support::namespace(&consumer, "deploy-team-ungranted").await;
    let example = read(RELSYNC_CREDENTIALS_EXAMPLE)
        .replace("namespace: team-a", &format!("namespace: {granted}"));
    let example = documents(&example, RELSYNC_CREDENTIALS_EXAMPLE);
    let rb: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_json::from_value(example[0].clone()).expect("RoleBinding");
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(consumer.clone(), &granted)
        .create(&PostParams::default(), &rb)
        .await
        .expect("create the example RoleBinding");

    let accounts = pass_accounts();
    let passes: Vec<(&str, (&str, &str))> = accounts
        .iter()
        .map(|(pass, (ns, sa))| (*pass, (*ns, sa.as_str())))
        .collect();
    let relsync = (RELSYNC_NAMESPACE, "kbind-relsync");
    // RBAC reaches the authorizer a moment after it is written: the RoleBinding created last
    // taking effect shows the authorizer has seen everything above.
    let mut seen = false;
    for _ in 0..40 {
        if may_secrets(
            &consumer,
            relsync,
            "get",
            Some(granted.as_str()),
            Some("tokens"),
        )
        .await
        {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen,
        "relsync may read a source Secret where the team granted it"
    );

    // (what, namespace, Secret name, the passes that may read it)
    let secrets: [(&str, &str, &str, &[&str]); 6] = [
        ("SpiceDB key", RELSYNC_NAMESPACE, "kbind-spicedb", &[]),
        (
            "issued kubeconfig Secret (grants namespace)",
            GRANTS_NAMESPACE,
            "kbind-grant-g",
            &["issue"],
        ),
        (
            "Connection Secret (install namespace)",
            NAMESPACE,
            "provider",
            &["schema", "resync"],
        ),
        (
            "Connection Secret (further credential namespace)",
            &credentials,
            "provider",
            &["schema", "resync"],
        ),
        (
            "source credential (granted)",
            &granted,
            "tokens",
            &["relsync"],
        ),
        ("source credential (not granted)", &ungranted, "tokens", &[]),
    ];
    let mut table = Vec::new();
    let mut wrong = Vec::new();
    for (what, ns, name, readers) in secrets {
        for &(pass, sa) in &passes {
            let may = may_secrets(&consumer, sa, "get", Some(ns), Some(name)).await;
            table.push(format!("{pass:<8} get {ns}/{name:<14} {what:<50} {may}"));
            if may != readers.contains(&pass) {
                wrong.push(format!("{pass} get {what} ({ns}/{name}): allowed={may}"));
            }
        }
    }
    for &(pass, sa) in &passes {
        for verb in ["list", "watch"] {
            for ns in [
                None,
                Some(NAMESPACE),
                Some(RELSYNC_NAMESPACE),
                Some(granted.as_str()),
            ] {
                if may_secrets(&consumer, sa, verb, ns, None).await {
                    wrong.push(format!("{pass} may {verb} Secrets in {ns:?}"));
                }
            }
        }
        if may_secrets(&consumer, sa, "get", None, Some("provider")).await {
            wrong.push(format!("{pass} may get Secrets in every namespace"));
        }
    }
    for row in &table {
        eprintln!("{row}");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The metric names kbind pushes (src/pass/metrics.rs), from a summary with every optional part.
fn pushed_metric_names() -> std::collections::BTreeSet<String> {
    let mut s = kbind::pass::Summary::new("schema", false);
    s.outcome = kbind::pass::Outcome::Completed;
    s.count("connections", 1);
    s.peak_rss_bytes = Some(1);
    kbind::pass::metrics::exposition(&s, 0, Some(1.0))
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The metric names deploy/monitoring/kube-state-metrics-config.yaml makes, by kind.
fn ksm_metric_names(config: &Value) -> BTreeMap<String, Vec<(String, Value)>> {
    let mut out: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    for r in config["spec"]["resources"]
        .as_array()
        .expect("spec.resources")
    {
        let kind = r["groupVersionKind"]["kind"].as_str().expect("kind");
        let prefix = r["metricNamePrefix"]
            .as_str()
            .unwrap_or("kube_customresource");
        for m in r["metrics"].as_array().expect("metrics") {
            let name = format!("{prefix}_{}", m["name"].as_str().expect("metric name"));
            out.entry(kind.to_string())
                .or_default()
                .push((name, m["each"].clone()));
        }
    }
    out
}

/// kube-state-metrics' custom resource state config covers every kbind kind with conditions
/// (Ready=False alerts), by its served group/version, on paths the CRD schema has; its RBAC file
/// lets kube-state-metrics list and watch exactly those kinds.
#[test]
fn kube_state_metrics_config_covers_every_kind_with_conditions() {
    let file = "deploy/monitoring/kube-state-metrics-config.yaml";
    let config = documents(&read(file), file).remove(0);
    assert_eq!(config["kind"], "CustomResourceStateMetrics");
    let metrics = ksm_metric_names(&config);
    let resources = config["spec"]["resources"].as_array().unwrap();
    let rbac = documents(
        &read("deploy/monitoring/kube-state-metrics-rbac.yaml"),
        "ksm rbac",
    );
    let rules = rbac
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .expect("a ClusterRole");
    let may_list = |group: &str, plural: &str| {
        rules.iter().any(|r| {
            r["apiGroups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g == group)
                && r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p == plural)
                && ["list", "watch"]
                    .iter()
                    .all(|v| r["verbs"].as_array().unwrap().iter().any(|x| x == v))
        })
    };
    assert!(may_list(
        "apiextensions.k8s.io",
        "customresourcedefinitions"
    ));
    let mut covered = Vec::new();
    for crd in kbind::crds::kbind_crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let (group, kind, plural) = (
            crd["spec"]["group"].as_str().unwrap(),
            crd["spec"]["names"]["kind"].as_str().unwrap(),
            crd["spec"]["names"]["plural"].as_str().unwrap(),
        );
        let version = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["storage"] == true)
            .unwrap();
        let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        if status["conditions"].is_null() {
            continue;
        }
        let r = resources
            .iter()
            .find(|r| r["groupVersionKind"]["kind"] == kind)
            .unwrap_or_else(|| panic!("{file}: no entry for {kind}, which has conditions"));
        assert_eq!(r["groupVersionKind"]["group"], group, "{kind}");
        assert_eq!(r["groupVersionKind"]["version"], version["name"], "{kind}");
        let condition = metrics[kind]
            .iter()
            .find(|(n, _)| n == "kbind_status_condition")
            .unwrap_or_else(|| panic!("{kind}: no kbind_status_condition"));
        assert_eq!(condition.1["type"], "StateSet", "{kind}");
        assert_eq!(
            condition.1["stateSet"]["path"],
            json!(["status", "conditions"])
        );
        assert_eq!(condition.1["stateSet"]["valueFrom"], json!(["status"]));
        assert_eq!(
            condition.1["stateSet"]["list"],
            json!(["True", "False", "Unknown"])
        );
        assert!(
            may_list(group, plural),
            "kube-state-metrics may not list {plural}.{group}"
        );
        covered.push(kind.to_string());
        if kind == "RelationshipSource" {
            let sync = metrics[kind]
                .iter()
                .find(|(n, _)| n == "kbind_relationshipsource_last_sync_timestamp_seconds")
                .expect("lastSyncTime metric");
            assert_eq!(
                sync.1["gauge"]["path"],
                json!(["status", "sync", "lastSyncTime"])
            );
            assert_eq!(
                status["sync"]["properties"]["lastSyncTime"]["format"], "date-time",
                "lastSyncTime is an RFC 3339 time kube-state-metrics reads as Unix seconds"
            );
        }
    }
    assert_eq!(
        covered.len(),
        resources.len(),
        "every entry is a kbind kind with conditions: {covered:?}"
    );
}

/// deploy/monitoring/prometheusrule.yaml is a PrometheusRule with the alerts docs/monitoring.md
/// lists, on metrics that exist (kube-state-metrics' own, kbind's custom resource state config,
/// kbind's pushes), and passes a server-side dry-run apply against a PrometheusRule CRD with the
/// operator's field names (so a misspelt field is refused).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn prometheus_rules_cover_the_documented_alerts_and_apply() {
    let file = "deploy/monitoring/prometheusrule.yaml";
    let text = read(file);
    let docs = documents(&text, file);
    assert_eq!(docs.len(), 1);
    let rule = &docs[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let config = documents(
        &read("deploy/monitoring/kube-state-metrics-config.yaml"),
        "ksm config",
    )
    .remove(0);
    let mut known = pushed_metric_names();
    known.extend(
        ksm_metric_names(&config)
            .into_values()
            .flatten()
            .map(|(n, _)| n),
    );
    let monitoring_doc = read("docs/monitoring.md");
    let mut exprs = String::new();
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("spec.groups") {
        assert!(group["name"].is_string());
        for r in group["rules"].as_array().expect("rules") {
            let alert = r["alert"].as_str().expect("alert name");
            let expr = r["expr"].as_str().expect("expr");
            assert!(
                ["warning", "critical", "info"]
                    .contains(&r["labels"]["severity"].as_str().unwrap_or("")),
                "{alert}: severity"
            );
            assert!(r["annotations"]["summary"].is_string(), "{alert}: summary");
            assert!(
                monitoring_doc.contains(&format!("`{alert}`")),
                "{alert} is not in docs/monitoring.md"
            );
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("kbind_") {
                    assert!(
                        known.contains(word),
                        "{alert}: no metric {word} is made: {known:?}"
                    );
                }
            }
            exprs.push_str(expr);
            alerts.push(alert.to_string());
        }
    }
    for needed in [
        "kube_cronjob_status_last_successful_time",
        "kube_job_failed",
        "kbind_status_condition{type=\"Ready\", status=\"False\"}",
        "kbind_relationshipsource_last_sync_timestamp_seconds",
        "kbind_last_success_timestamp_seconds",
    ] {
        assert!(exprs.contains(needed), "no alert on {needed}");
    }

    let env = support::env();
    // The Prometheus Operator's CRD, cut to the fields a PrometheusRule has.
    let strings = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let rule_schema = json!({
        "type": "object", "required": ["expr"],
        "properties": {
            "alert": {"type": "string"}, "record": {"type": "string"},
            "expr": {"x-kubernetes-int-or-string": true},
            "for": {"type": "string"}, "keep_firing_for": {"type": "string"},
            "labels": strings, "annotations": strings,
        }
    });
    let group_schema = json!({
        "type": "object", "required": ["name"],
        "properties": {
            "name": {"type": "string"}, "interval": {"type": "string"},
            "limit": {"type": "integer"}, "partial_response_strategy": {"type": "string"},
            "query_offset": {"type": "string"}, "labels": strings,
            "rules": {"type": "array", "items": rule_schema},
        }
    });
    let schema = json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {
            "groups": {"type": "array", "items": group_schema}
        }}}
    });
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"kind": "PrometheusRule", "plural": "prometheusrules",
                      "singular": "prometheusrule", "listKind": "PrometheusRuleList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": schema}}]
        }
    });
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    support::apply_crds(&env.consumer().await, &[crd]).await;
    apply_namespaces(&env);
    for (file, count) in [
        ("deploy/monitoring/prometheusrule.yaml", 1),
        ("deploy/monitoring/kube-state-metrics-rbac.yaml", 2),
    ] {
        let out = kubectl_ok(
            Some(&env.consumer),
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--field-manager=kbind-deploy-tests",
                "-f",
                &repo(file).to_string_lossy(),
            ],
            None,
        );
        assert_eq!(
            out.matches("(server dry run)").count(),
            count,
            "{file}: {out}"
        );
    }
}

/// Every Namespace kbind ships (deploy/) has Pod Security `restricted` enforced, warned and
/// audited.
#[test]
fn namespaces_enforce_pod_security_restricted() {
    let files = yaml_files(&repo("deploy"));
    let mut namespaces = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        // Not Kubernetes objects (kube-state-metrics' own config format).
        if text.contains("kind: CustomResourceStateMetrics") {
            continue;
        }
        for doc in documents(&text, &file.display().to_string()) {
            if doc["kind"] != "Namespace" {
                continue;
            }
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for mode in ["enforce", "warn", "audit"] {
                assert_eq!(
                    doc["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")],
                    "restricted",
                    "Namespace {name} ({}): {mode}",
                    file.display()
                );
            }
            namespaces.push(name);
        }
    }
    namespaces.sort();
    assert_eq!(
        namespaces,
        ["kbind-grants", "kbind-relsync", "kbind-system"]
    );
}

/// Every Job and CronJob under jobs/ fails at once on exit code 2 (a configuration error: retrying
/// will not help) and keeps its retries for other failures, and its pod meets Pod Security
/// `restricted` field by field (the server-side check is in
/// manifests_render_and_pass_server_dry_run).
#[test]
fn jobs_fail_at_once_on_exit_2_and_pods_meet_restricted() {
    let containers = job_containers();
    assert!(containers.len() >= 6, "{}", containers.len());
    for (what, job, c) in containers {
        let pod = &job["template"]["spec"];
        assert_eq!(
            pod["restartPolicy"], "Never",
            "{what}: podFailurePolicy needs it"
        );
        assert!(
            job["backoffLimit"].as_u64().is_some_and(|n| n > 0),
            "{what}"
        );
        let rules = job["podFailurePolicy"]["rules"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no podFailurePolicy"));
        assert!(
            rules.iter().any(|r| r["action"] == "FailJob"
                && r["onExitCodes"]["operator"] == "In"
                && r["onExitCodes"]["values"]
                    .as_array()
                    .is_some_and(|v| v.contains(&json!(2)))
                && (r["onExitCodes"]["containerName"].is_null()
                    || r["onExitCodes"]["containerName"] == c["name"])),
            "{what}: exit code 2 must fail the Job: {rules:?}"
        );
        assert!(
            !rules.iter().any(|r| r["action"] == "FailJob"
                && r["onExitCodes"]["values"]
                    .as_array()
                    .is_some_and(|v| v.contains(&json!(1)))),
            "{what}: exit code 1 (unreachable) is retried"
        );
        let (psc, csc) = (&pod["securityContext"], &c["securityContext"]);
        let either = |field: &str| {
            if csc[field].is_null() {
                psc[field].clone()
            } else {
                csc[field].clone()
            }
        };
        assert_eq!(either("runAsNonRoot"), true, "{what}: runAsNonRoot");
        assert_ne!(either("runAsUser"), 0, "{what}: runAsUser");
        assert_eq!(
            either("seccompProfile")["type"],
            "RuntimeDefault",
            "{what}: seccomp"
        );
        assert_eq!(csc["allowPrivilegeEscalation"], false, "{what}");
        assert_eq!(csc["capabilities"]["drop"], json!(["ALL"]), "{what}");
        assert!(
            csc["capabilities"]["add"].is_null() && csc["privileged"] != true,
            "{what}"
        );
        for v in pod["volumes"].as_array().cloned().unwrap_or_default() {
            assert!(
                v["secret"].is_object()
                    || v["configMap"].is_object()
                    || v["projected"].is_object()
                    || v["emptyDir"].is_object(),
                "{what}: volume type not allowed under restricted: {v}"
            );
        }
        assert!(pod["hostNetwork"] != true && pod["hostPID"] != true && pod["hostIPC"] != true);
    }
}
