//! `kbind bind` and rotation by pull against the real servers (docs/binding-flow.md): a
//! ServiceAccount on the provider with the RBAC a Grant's issued identity gets (the test plays the
//! issuer: real tokens from the TokenRequest API, bound to a Secret so deleting that Secret
//! revokes the token), its kubeconfig handed to `kbind bind`, then `kbind schema` and
//! `kbind resync` as the CronJobs run them.

use crate::support;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kbind::api::core::{ClusterBinding, Connection};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use support::fx::{Fx, cond};

/// The Grant's side on the provider: the grants namespace, the ServiceAccount, the issued Secret.
struct Issued {
    grants: String,
    sa: String,
    secret: String,
}

/// A provider API `widgets.<group>` exported, a grants namespace with a ServiceAccount holding
/// what a consumer's schema and resync need (as `kbind issue` grants it: docs/binding-flow.md),
/// and `get` on exactly its issued Secret.
async fn provider_side(fx: &Fx) -> (String, Issued) {
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let grants = support::namespace(&fx.provider, "grants").await;
    let sa = "consumer".to_string();
    let secret = "issued".to_string();
    let role = support::unique("bind-consumer");
    let docs = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": grants}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": role},
        "rules": [
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]},
            {"apiGroups": [fx.group], "resources": ["widgets", "widgets/status"],
                "verbs": ["get", "list", "create", "update", "patch", "delete"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": grants}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "consumer", "namespace": grants},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update", "patch"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]},
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "consumer", "namespace": grants},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "consumer"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": grants}]}),
    ];
    for d in docs {
        apply(&fx.provider, d).await;
    }
    (api, Issued { grants, sa, secret })
}

/// Server-side apply any object (as the admin).
async fn apply(client: &kube::Client, d: Value) {
    let kind = d["kind"].as_str().unwrap();
    let plural = match kind {
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "Secret" => "secrets",
        other => panic!("no plural for {other}"),
    };
    support::apply_object(client, plural, &d).await;
}

impl Issued {
    /// A kubeconfig for the ServiceAccount with a fresh token bound to the Secret `bound` (created
    /// here): deleting that Secret revokes the token. Its context namespace is the grants
    /// namespace, as an issued kubeconfig's is.
    async fn kubeconfig(&self, fx: &Fx, bound: &str) -> String {
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": bound, "namespace": self.grants}}))
                .unwrap();
        let s = Api::<Secret>::namespaced(fx.provider.clone(), &self.grants)
            .create(&PostParams::default(), &s)
            .await
            .unwrap();
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600,
                "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": bound, "uid": s.uid().unwrap()}}});
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{}/serviceaccounts/{}/token",
            self.grants, self.sa
        ))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
        let tr: Value = fx.provider.request(req).await.expect("TokenRequest");
        let token = tr["status"]["token"].as_str().expect("token");
        fx.provider_kubeconfig()
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("token:") {
                    format!("    token: {token}")
                } else {
                    l.replace("namespace: default", &format!("namespace: {}", self.grants))
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The issuer writes (or re-issues) its Secret: the kubeconfig and its expiry.
    async fn issue(&self, fx: &Fx, kubeconfig: &str, expires_at: &str) {
        apply(
            &fx.provider,
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": self.secret, "namespace": self.grants,
                    "annotations": {"iam.kbind.io/grant": "acme", "iam.kbind.io/expires-at": expires_at}},
                "data": {"kubeconfig": ByteString(kubeconfig.as_bytes().to_vec())}}),
        )
        .await;
    }

    fn grant_secret(&self) -> String {
        format!("{}/{}", self.grants, self.secret)
    }
}

/// `kbind bind` against the fixture's consumer, its Secret in the fixture's namespace (the
/// credential namespace its passes use), every object labelled for the fixture's selector.
fn bind(fx: &Fx, name: &str, kubeconfig: &std::path::Path, extra: &[&str]) -> (i32, Value, String) {
    let consumer = fx.env.consumer.to_string_lossy().to_string();
    let file = kubeconfig.to_string_lossy().to_string();
    let label = format!("kbind-test={}", fx.label);
    let mut args = vec![
        "bind",
        "--kubeconfig",
        &consumer,
        "--provider-kubeconfig",
        &file,
        "--name",
        name,
        "--credential-namespace",
        &fx.ns,
        "--label",
        &label,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    support::kbind(&args)
}

async fn consumer_secret(fx: &Fx, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .get_opt(name)
        .await
        .unwrap()
}

fn kubeconfig_of(s: &Secret) -> String {
    String::from_utf8(s.data.as_ref().unwrap()["kubeconfig"].0.clone()).unwrap()
}

fn widgets(fx: &Fx, client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    Api::namespaced_with(client.clone(), &fx.ns, &ar)
}

async fn create_widget(fx: &Fx, name: &str, size: i64) {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let mut o = DynamicObject::new(name, &ar).data(json!({"spec": {"size": size}}));
    o.metadata.namespace = Some(fx.ns.clone());
    widgets(fx, &fx.consumer)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
}

async fn set_size(fx: &Fx, name: &str, size: i64) {
    widgets(fx, &fx.consumer)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": size}})),
        )
        .await
        .unwrap();
}

/// What `bound` leaves: an exported API, its issued kubeconfig (token-1) on file, and the
/// consumer bound to it with `--grant-secret` (the bind's JSON output).
struct Bound {
    api: String,
    issued: Issued,
    kubeconfig: String,
    file: std::path::PathBuf,
    name: String,
    out: Value,
}

/// The provider side, then `kbind bind` with its kubeconfig; the bind must succeed.
async fn bound(fx: &Fx) -> Bound {
    let (api, issued) = provider_side(fx).await;
    let kubeconfig = issued.kubeconfig(fx, "token-1").await;
    issued.issue(fx, &kubeconfig, "2030-01-01T00:00:00Z").await;
    let file = support::temp_file("bind-kubeconfig", &kubeconfig);
    let name = format!("{}-p", fx.label);
    let (code, out, stderr) = bind(
        fx,
        &name,
        &file,
        &["--apis", &api, "--grant-secret", &issued.grant_secret()],
    );
    assert_eq!(code, 0, "{out}\n{stderr}");
    Bound {
        api,
        issued,
        kubeconfig,
        file,
        name,
        out,
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bind_writes_secret_connection_and_binding_that_schema_and_resync_use() {
    let fx = Fx::new("bind").await;
    let Bound {
        api,
        issued,
        kubeconfig: kc,
        file,
        name,
        out,
    } = bound(&fx).await;
    assert_eq!(out["writes"], 3, "{out}");
    assert_eq!(out["apis"], json!([api]));
    // The Secret: the kubeconfig under the key Connections read, the Grant's annotations.
    let s = consumer_secret(&fx, &name).await.expect("consumer Secret");
    assert!(kubeconfig_of(&s) == kc, "the kubeconfig as given");
    let ann = s.annotations();
    assert_eq!(
        ann.get("core.kbind.io/grant-secret"),
        Some(&issued.grant_secret())
    );
    assert_eq!(
        ann.get("iam.kbind.io/grant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(
        ann.get("iam.kbind.io/expires-at").map(String::as_str),
        Some("2030-01-01T00:00:00Z")
    );
    let conn = fx.conn(&name).await;
    assert_eq!(conn.spec.kubeconfig_secret_ref.namespace, fx.ns);
    assert_eq!(conn.spec.kubeconfig_secret_ref.name, name);
    let cb = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&name)
        .await
        .unwrap();
    assert_eq!(cb.spec.connection_ref.name, name);
    assert_eq!(
        cb.spec.apis.iter().map(|a| &a.name).collect::<Vec<_>>(),
        [&api]
    );

    // The same command again writes nothing.
    let (code, out, stderr) = bind(
        &fx,
        &name,
        &file,
        &["--apis", &api, "--grant-secret", &issued.grant_secret()],
    );
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert_eq!(out["writes"], 0, "second bind: {out}");

    // schema and resync run on what bind wrote, with the ServiceAccount's token.
    fx.run(&[]);
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "True", "{st:?}");
    assert_eq!(
        (
            cond(&st.conditions, "CredentialRotation").0,
            cond(&st.conditions, "CredentialRotation").1
        ),
        ("True", "Current")
    );
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    create_widget(&fx, "w1", 3).await;
    fx.pass("resync", &[]);
    let p = widgets(&fx, &fx.provider)
        .get("w1")
        .await
        .expect("provider copy");
    assert_eq!(p.data["spec"], json!({"size": 3}));
    let mut st = p.clone();
    st.data["status"] = json!({"phase": "Ready"});
    widgets(&fx, &fx.provider)
        .replace_status("w1", &PostParams::default(), &st)
        .await
        .unwrap();
    fx.pass("resync", &[]);
    assert_eq!(
        widgets(&fx, &fx.consumer).get("w1").await.unwrap().data["status"]["phase"],
        "Ready"
    );
    fx.assert_unchanged_pass(&name).await;
    // Finalizers, defaults and statuses the passes added are not differences: still 0 writes.
    let (code, out, stderr) = bind(
        &fx,
        &name,
        &file,
        &["--apis", &api, "--grant-secret", &issued.grant_secret()],
    );
    assert_eq!((code, &out["writes"]), (0, &json!(0)), "{out}\n{stderr}");

    // --dry-run -o yaml writes nothing, redacts the Secret, and the server accepts the output.
    let other = format!("{}-dry", fx.label);
    let out = support::kbind_command(&[
        "bind",
        "--provider-kubeconfig",
        &file.to_string_lossy(),
        "--name",
        &other,
        "--credential-namespace",
        &fx.ns,
        "--apis",
        &api,
        "--dry-run",
        "-o",
        "yaml",
    ])
    .output()
    .unwrap();
    support::keep_emitted(&out);
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    let token = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap();
    assert!(!yaml.contains(token), "the token is redacted");
    assert!(yaml.contains("REDACTED"), "{yaml}");
    // Without --credential-namespace, in a Pod: the Secret goes to the install namespace
    // ($POD_NAMESPACE), where the passes read it by default.
    let mut cmd = support::kbind_command(&[
        "bind",
        "--provider-kubeconfig",
        &file.to_string_lossy(),
        "--name",
        &other,
        "--apis",
        &api,
        "--dry-run",
        "-o",
        "json",
    ]);
    cmd.env("POD_NAMESPACE", &fx.ns);
    let out = cmd.output().unwrap();
    support::keep_emitted(&out);
    assert!(out.status.success());
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let secret = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "Secret")
        .unwrap();
    assert_eq!(secret["metadata"]["namespace"], json!(fx.ns), "{secret}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("redacted"),
        "stderr says the Secret is redacted"
    );
    assert!(
        consumer_secret(&fx, &other).await.is_none(),
        "dry run wrote nothing"
    );
    assert!(
        Api::<Connection>::all(fx.consumer.clone())
            .get_opt(&other)
            .await
            .unwrap()
            .is_none()
    );
    let manifests = support::temp_file("bind-manifests", &yaml);
    let applied = std::process::Command::new("kubectl")
        .args(["--kubeconfig", &fx.env.consumer.to_string_lossy()])
        .args([
            "apply",
            "--dry-run=server",
            "-f",
            &manifests.to_string_lossy(),
        ])
        .output()
        .unwrap();
    assert!(
        applied.status.success(),
        "kubectl apply --dry-run=server: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let said = String::from_utf8_lossy(&applied.stdout);
    for kind in [
        "secret/",
        "connection.core.kbind.io/",
        "clusterbinding.core.kbind.io/",
    ] {
        assert!(said.contains(kind), "{kind} in {said}");
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bad_inputs_exit_2_naming_the_problem_and_write_nothing() {
    let fx = Fx::new("bindbad").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let admin = fx.provider_kubeconfig();
    let good = support::temp_file("bind-good", &admin);
    let proxied = support::temp_file(
        "bind-proxy",
        &admin.replace(
            "    server:",
            "    proxy-url: http://127.0.0.1:9\n    server:",
        ),
    );
    let missing = std::env::temp_dir().join(support::unique("no-such-kubeconfig"));
    let foreign = fx
        .connection("taken", "taken", json!({"source": "CRD"}), false)
        .await;
    let nope = format!("nope.{}", fx.group);
    let cases: Vec<(&str, String, &std::path::Path, Vec<&str>, String)> = vec![
        (
            "missing file",
            format!("{}-a", fx.label),
            &missing,
            vec!["--apis", &api],
            format!(
                "--provider-kubeconfig {}: cannot read it",
                missing.display()
            ),
        ),
        (
            "proxy-url",
            format!("{}-b", fx.label),
            &proxied,
            vec!["--apis", &api],
            "cluster.proxy-url would send the credential through a proxy".into(),
        ),
        (
            "not exported",
            format!("{}-c", fx.label),
            &good,
            vec!["--apis", &nope],
            format!("not exported by the provider: {nope}"),
        ),
        (
            "no APIs named",
            format!("{}-d", fx.label),
            &good,
            vec![],
            "name the APIs to bind with --apis or --export; the provider exports: ".into(),
        ),
        (
            "foreign Connection",
            foreign.clone(),
            &good,
            vec!["--apis", &api],
            format!("Connection {foreign} exists and was not written by kbind bind"),
        ),
    ];
    for (what, name, file, extra, says) in &cases {
        let (code, out, stderr) = bind(&fx, name, file, extra);
        assert_eq!(code, 2, "{what}: {out}\n{stderr}");
        assert!(stderr.contains(says.as_str()), "{what}: {stderr}");
        assert!(
            consumer_secret(&fx, name).await.is_none(),
            "{what}: no Secret written"
        );
    }
    assert!(
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .get_opt(&foreign)
            .await
            .unwrap()
            .is_none(),
        "nothing written beside the foreign Connection"
    );
    // --force takes the foreign Connection over (its Secret reference is the same name).
    let (code, out, stderr) = bind(&fx, &foreign, &good, &["--apis", &api, "--force"]);
    assert_eq!(code, 2, "{out}\n{stderr}");
    assert!(
        stderr.contains("kubeconfigSecretRef is immutable"),
        "the foreign Connection names Secret {}/taken: {stderr}",
        fx.ns
    );
}

/// Wait until the provider refuses `kubeconfig` (401): a revoked token.
async fn rejected(kubeconfig: &str) {
    let path = support::temp_file("revoked", kubeconfig);
    let client = support::client(&path).await;
    // The API server caches a token's success for up to 10 s.
    for _ in 0..300 {
        if let Err(kube::Error::Api(s)) = Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
            && s.code == 401
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the revoked token is still accepted after 30 s");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn rotation_by_pull_follows_the_issuer_and_refuses_a_hostile_kubeconfig() {
    let fx = Fx::new("rotate").await;
    let Bound {
        api,
        issued,
        kubeconfig: kc1,
        name,
        ..
    } = bound(&fx).await;
    fx.run(&[]);
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    create_widget(&fx, "w1", 1).await;
    fx.pass("resync", &[]);
    assert!(
        widgets(&fx, &fx.provider)
            .get_opt("w1")
            .await
            .unwrap()
            .is_some()
    );

    // The issuer re-issues: a new token in its Secret. The next schema run pulls it.
    let kc2 = issued.kubeconfig(&fx, "token-2").await;
    issued.issue(&fx, &kc2, "2030-01-02T00:00:00Z").await;
    let run = fx.run(&[]);
    assert!(run["data_writes"].as_u64().unwrap() >= 1, "{run}");
    let s = consumer_secret(&fx, &name).await.unwrap();
    // Compared, never printed: the kubeconfigs hold tokens.
    assert!(
        kubeconfig_of(&s) == kc2,
        "the consumer Secret holds the new token"
    );
    assert_eq!(
        s.annotations()
            .get("iam.kbind.io/expires-at")
            .map(String::as_str),
        Some("2030-01-02T00:00:00Z")
    );
    assert_eq!(
        s.annotations().get("core.kbind.io/grant-secret"),
        Some(&issued.grant_secret()),
        "the annotation stays"
    );
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "CredentialRotation").1, "Current");
    assert_eq!(cond(&st.conditions, "Ready").0, "True");

    // The old token is revoked: nothing fails, the consumer already uses the new one.
    Api::<Secret>::namespaced(fx.provider.clone(), &issued.grants)
        .delete("token-1", &Default::default())
        .await
        .unwrap();
    rejected(&kc1).await;
    set_size(&fx, "w1", 2).await;
    let run = fx.pass("resync", &[]);
    assert_eq!(run["errors"].as_u64().unwrap_or(0), 0, "{run}");
    assert_eq!(
        widgets(&fx, &fx.provider).get("w1").await.unwrap().data["spec"],
        json!({"size": 2}),
        "resync synced with the new token"
    );
    fx.assert_unchanged_pass(&name).await;
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Connected").1, "Connected");

    // A provider offering a kubeconfig kbind refuses: not written, the condition says why, the
    // current credential stays in use.
    let hostile = kc2.replace(
        "    server:",
        "    proxy-url: http://127.0.0.1:9\n    server:",
    );
    issued.issue(&fx, &hostile, "2030-01-03T00:00:00Z").await;
    fx.run(&[]);
    let s = consumer_secret(&fx, &name).await.unwrap();
    assert!(
        kubeconfig_of(&s) == kc2,
        "the refused kubeconfig is not written"
    );
    assert_eq!(
        s.annotations()
            .get("iam.kbind.io/expires-at")
            .map(String::as_str),
        Some("2030-01-02T00:00:00Z")
    );
    let st = fx.conn(&name).await.status.unwrap();
    let (status, reason, message) = cond(&st.conditions, "CredentialRotation");
    assert_eq!(
        (status, reason),
        ("False", "KubeconfigFieldNotAllowed"),
        "{message}"
    );
    assert!(message.contains("proxy-url"), "{message}");
    assert!(message.contains(&issued.grant_secret()), "{message}");
    assert_eq!(cond(&st.conditions, "Ready").0, "True");
    // Nothing changed since: the next run writes nothing.
    fx.assert_unchanged_pass(&name).await;

    // A provider offering a kubeconfig kbind would accept as a Connection Secret, but for
    // another server (here the same apiserver by another name, which would work) or with an
    // added TLS server name: not a rotation, refused the same way, over two runs.
    for (offered, what) in [
        (
            kc2.replace("https://127.0.0.1:", "https://localhost:"),
            "server",
        ),
        (
            kc2.replace(
                "    server:",
                "    tls-server-name: elsewhere.example\n    server:",
            ),
            "TLS server name",
        ),
    ] {
        assert_ne!(offered, kc2, "the offered kubeconfig differs");
        issued.issue(&fx, &offered, "2030-01-04T00:00:00Z").await;
        for round in 1..=2 {
            fx.run(&[]);
            let s = consumer_secret(&fx, &name).await.unwrap();
            assert!(
                kubeconfig_of(&s) == kc2,
                "{what}, round {round}: not written"
            );
            let st = fx.conn(&name).await.status.unwrap();
            let (status, reason, message) = cond(&st.conditions, "CredentialRotation");
            assert_eq!((status, reason), ("False", "EndpointChanged"), "{message}");
            assert!(
                message.contains(&format!("changes the {what}")),
                "{message}"
            );
            assert_eq!(cond(&st.conditions, "Ready").0, "True");
        }
    }

    // The Grant revoked (its token too): the consumer stops with a clear condition.
    Api::<Secret>::namespaced(fx.provider.clone(), &issued.grants)
        .delete("token-2", &Default::default())
        .await
        .unwrap();
    rejected(&kc2).await;
    fx.run(&[]);
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(
        (
            cond(&st.conditions, "Connected").0,
            cond(&st.conditions, "Connected").1
        ),
        ("False", "CredentialRejected")
    );
    assert_eq!(
        cond(&st.conditions, "CredentialRotation").1,
        "CredentialRejected"
    );
}
