//! The hostile and malformed input catalogue (docs/hostile-inputs.md, issue #9): inputs a
//! tenant, a provider or an upstream can hand kbind that are wrong, broken or malicious. Each
//! must end in a clear condition or error, never a panic, never a half-written object, never a
//! secret in a status, an Event or a log. Cases sharing a fixture share a test function; every
//! function says what it proves. Run against the real servers (`hack/test.sh`).

use crate::relsync_fx;
use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::ClusterBinding;
use kbind::api::relsync::condition::{PARTIAL_FAILURE, READY};
use kbind_testkit::{Fault, Generated, scim, slack};
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
use serde_json::{Value, json};
use support::fx::{Fx, cond};

/// The bearer token of a kubeconfig (to assert it never reaches a status or a log).
fn token_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("token:"))
        .map(|t| t.trim().to_string())
        .expect("the test kubeconfig carries a token")
}

/// `kubeconfig` with its `token:` line replaced by `user` (indented user fields).
fn with_user(kubeconfig: &str, user: &str) -> String {
    kubeconfig
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                user.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Secret in the fixture namespace holding raw bytes under `key`.
async fn secret_bytes(fx: &Fx, name: &str, key: &str, data: Vec<u8>) -> Result<(), kube::Error> {
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), ByteString(data))])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .create(&PostParams::default(), &s)
        .await
        .map(|_| ())
}

/// Kubeconfigs that cannot work inside a CronJob pod, or are not kubeconfigs at all: each
/// Connection says `SecretValid=False` with a reason and a message naming the field (never
/// quoting the Secret), is not Ready, pins no identity, and nothing is installed through it.
/// The pass itself succeeds: one tenant's bad Secret is not a failed run.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn kubeconfigs_that_cannot_work_in_a_cronjob_are_refused_by_name() {
    let fx = Fx::new("hostile-kc").await;
    let good = fx.provider_kubeconfig();
    let token = token_of(&good);
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    // A YAML alias bomb: nine levels of nine-fold aliases (387 M nodes if expanded).
    let mut bomb = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for (prev, cur) in "abcdefgh".chars().zip("bcdefghi".chars()) {
        let refs = vec![format!("*{prev}"); 9].join(",");
        bomb.push_str(&format!("{cur}: &{cur} [{refs}]\n"));
    }
    let two_contexts = good
        .replace("current-context:", "x-current-context:")
        .replace(
            "contexts:\n",
            "contexts:\n- name: other\n  context:\n    cluster: nowhere\n    user: nobody\n",
        );
    let padded = format!("{good}\n# {}\n", "x".repeat(900 * 1024));
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "certpath",
            with_user(
                &good,
                "    client-certificate: /home/me/.kube/client.crt\n    client-key: /home/me/.kube/client.key",
            )
            .into_bytes(),
            "NotSelfContained",
            "user.client-certificate is a file path",
        ),
        (
            "tokenfile",
            with_user(&good, "    tokenFile: /var/run/secrets/kubernetes.io/token").into_bytes(),
            "NotSelfContained",
            "user.tokenFile is a file path",
        ),
        (
            "authprovider",
            with_user(
                &good,
                "    auth-provider:\n      name: oidc\n      config:\n        idp-issuer-url: https://idp.example.com",
            )
            .into_bytes(),
            "NotSelfContained",
            "user.auth-provider",
        ),
        (
            "binary",
            [&[0xff, 0xfe, 0x00, 0xc3, 0x28][..], good.as_bytes()].concat(),
            "InvalidKubeconfig",
            "not UTF-8",
        ),
        (
            "huge",
            padded.into_bytes(),
            "InvalidKubeconfig",
            "larger than the 262144 allowed",
        ),
        (
            "yamlbomb",
            bomb.into_bytes(),
            "InvalidKubeconfig",
            "is not a valid kubeconfig",
        ),
        (
            "fileserver",
            kbind_testkit::faults::with_server(&good, "file:///etc/kubernetes/admin.conf").into_bytes(),
            "NotSelfContained",
            "cluster.server is not an http(s) URL",
        ),
        (
            "nocontext",
            two_contexts.into_bytes(),
            "NotSelfContained",
            "no current-context",
        ),
        (
            "nouser",
            good.replace("  user:\n", "  x-user:\n").into_bytes(),
            "NotSelfContained",
            "is not defined",
        ),
    ];
    let mut conns = Vec::new();
    for (name, data, _, _) in &cases {
        secret_bytes(&fx, name, "kubeconfig", data.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let conn = fx
            .connection(
                name,
                name,
                json!({"source": "CRD", "pullPolicy": "All"}),
                false,
            )
            .await;
        fx.cluster_binding(name, &conn, &[&widgets]).await;
        conns.push(conn);
    }
    // Above the API server's own limit (1 MiB of Secret data): refused before kbind sees it.
    let err = secret_bytes(&fx, "twomib", "kubeconfig", vec![b'a'; 2 << 20])
        .await
        .expect_err("a 2 MiB Secret is refused by the API server");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("Too long")),
        "{err}"
    );

    let t = std::time::Instant::now();
    let (code, summary, stderr) = fx.try_pass("schema", &[]);
    assert_eq!(code, 0, "bad Secrets are conditions: {summary}\n{stderr}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(60),
        "the alias bomb was not expanded"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains(&token), "the token reached the log");
    for ((what, _, reason, needle), conn) in cases.iter().zip(&conns) {
        let st = fx.conn(conn).await.status.unwrap_or_default();
        let (s, r, m) = cond(&st.conditions, "SecretValid");
        assert_eq!((s, r), ("False", *reason), "{what}: {m}");
        assert!(m.contains(needle), "{what}: {m:?} lacks {needle:?}");
        assert!(m.len() < 1024, "{what}: the message is bounded");
        assert!(!m.contains(&token), "{what}: the token reached status");
        assert!(!m.contains("lol"), "{what}: the document is not quoted");
        assert_eq!(cond(&st.conditions, "Ready").0, "False", "{what}");
        assert!(st.remote_cluster_uid.is_none(), "{what}: nothing pinned");
        assert!(st.exported_apis.is_empty(), "{what}: no discovery");
        assert!(
            !fx.installed_by(&widgets, conn).await,
            "{what}: nothing installed"
        );
    }
}

/// Kubeconfig fields that widen the credential's reach (a proxy, no TLS check, clear text,
/// impersonation) are refused by name, before any connection: the proxy is a local trap that
/// must see nothing. A Connection naming a Secret outside the credential namespaces is refused
/// without the Secret being read, and gets no finalizer on it (issue #11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn widening_kubeconfig_fields_and_foreign_secrets_are_refused_before_any_request() {
    let fx = Fx::new("hostile-wide").await;
    let good = fx.provider_kubeconfig();
    let token = token_of(&good);
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let (proxy, proxy_hits, proxy_task) = trap().await;
    let server = good
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server:"))
        .map(|s| s.trim().to_string())
        .expect("server");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "proxyurl",
            good.replace(
                &format!("server: {server}"),
                &format!("server: {server}\n    proxy-url: http://{proxy}"),
            ),
            "cluster.proxy-url",
        ),
        (
            "insecure",
            good.replace(
                &format!("server: {server}"),
                &format!("server: {server}\n    insecure-skip-tls-verify: true"),
            ),
            "cluster.insecure-skip-tls-verify",
        ),
        (
            "cleartext",
            kbind_testkit::faults::with_server(&good, &format!("http://{proxy}")),
            "http://",
        ),
        (
            "impersonate",
            with_user(&good, &format!("    token: {token}\n    as: system:admin")),
            "impersonation",
        ),
    ];
    let mut conns = Vec::new();
    for (name, data, _) in &cases {
        secret_bytes(&fx, name, "kubeconfig", data.clone().into_bytes())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let conn = fx
            .connection(name, name, json!({"source": "CRD"}), false)
            .await;
        fx.cluster_binding(name, &conn, &[&widgets]).await;
        conns.push(conn);
    }
    // A Connection pointing at a usable kubeconfig in a namespace that is not a credential
    // namespace (another tool's Secret, say).
    let elsewhere = support::namespace(&fx.consumer, "hostile-wide-other").await;
    let foreign = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("admin".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("kubeconfig".to_string(), good.clone())])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(fx.consumer.clone(), &elsewhere)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let name = format!("{}-foreign", fx.label);
    let c: kbind::api::core::Connection = serde_json::from_value(json!({
        "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": {"name": name, "labels": {"kbind-test": fx.label}},
        "spec": {"kubeconfigSecretRef": {"namespace": elsewhere, "name": "admin"}, "schema": {"source": "CRD"}}}))
    .unwrap();
    Api::<kbind::api::core::Connection>::all(fx.consumer.clone())
        .create(&PostParams::default(), &c)
        .await
        .unwrap();

    let (code, summary, stderr) = fx.try_pass_async("schema", &[]).await;
    assert_eq!(
        code, 0,
        "refused Secrets are conditions: {summary}\n{stderr}"
    );
    assert_eq!(
        proxy_hits.load(Ordering::SeqCst),
        0,
        "nothing reached the proxy"
    );
    proxy_task.abort();
    for ((what, _, needle), conn) in cases.iter().zip(&conns) {
        let st = fx.conn(conn).await.status.unwrap_or_default();
        let (s, r, m) = cond(&st.conditions, "SecretValid");
        assert_eq!(
            (s, r),
            ("False", "KubeconfigFieldNotAllowed"),
            "{what}: {m}"
        );
        assert!(m.contains(needle), "{what}: {m:?} lacks {needle:?}");
        assert!(!m.contains(&token), "{what}: the token reached status");
        assert!(st.remote_cluster_uid.is_none(), "{what}: nothing pinned");
        let secret = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
            .get(what)
            .await
            .unwrap();
        assert!(
            secret.finalizers().is_empty(),
            "{what}: no finalizer on a Secret that did not validate"
        );
    }
    let st = fx.conn(&name).await.status.unwrap_or_default();
    let (s, r, m) = cond(&st.conditions, "SecretValid");
    assert_eq!((s, r), ("False", "SecretNamespaceNotAllowed"), "{m}");
    assert!(m.contains(&elsewhere), "{m}");
    assert!(st.remote_cluster_uid.is_none());
    let foreign = Api::<Secret>::namespaced(fx.consumer.clone(), &elsewhere)
        .get("admin")
        .await
        .unwrap();
    assert!(
        foreign.finalizers().is_empty(),
        "no finalizer on a foreign Secret"
    );

    // An operator may re-allow a field explicitly, and add a credential namespace.
    let namespaces = format!("{},{elsewhere}", fx.ns);
    let (code, summary, stderr) = fx
        .try_pass_async(
            "schema",
            &[
                "--credential-namespace",
                &namespaces,
                "--allow-kubeconfig-field",
                "impersonation",
            ],
        )
        .await;
    assert_eq!(code, 0, "{summary}\n{stderr}");
    let st = fx.conn(&name).await.status.unwrap_or_default();
    assert_eq!(cond(&st.conditions, "SecretValid").0, "True");
    let impersonating = fx.conn(&conns[3]).await.status.unwrap_or_default();
    assert_ne!(
        cond(&impersonating.conditions, "SecretValid").1,
        "KubeconfigFieldNotAllowed",
        "re-allowed"
    );
}

/// A provider CRD whose schema nests deeper than a JSON reader's recursion limit, and one with
/// an enormous (~700 KiB) schema, both exported beside an ordinary API. The deep one cannot be
/// read and its binding says so (`ExportUnusable`); it does not take discovery down for the
/// other exports. The enormous one is copied whole, hash and all.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_provider_crd_too_deep_to_read_or_enormous_spoils_no_other_export() {
    // Alone: while its deep CRD exists, every issuer run's pin check waits for a person.
    let fx = Fx::alone("hostile-crd").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let crd = |plural: &str, kind: &str, spec: Value| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{}", fx.group), "labels": {"core.kbind.io/exported": "true"}},
            "spec": {"group": fx.group, "scope": "Namespaced", "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}}]}}))
        .unwrap()
    };
    let mut deep = json!({"type": "string"});
    for _ in 0..80 {
        deep = json!({"type": "object", "properties": {"a": deep}});
    }
    let huge: serde_json::Map<String, Value> = (0..3000)
        .map(|i| {
            (
                format!("field{i:04}"),
                json!({"type": "string", "description": "d".repeat(200)}),
            )
        })
        .collect();
    support::apply_crds(
        &fx.provider,
        &[crd(
            "bigs",
            "Big",
            json!({"type": "object", "properties": huge}),
        )],
    )
    .await;
    let (deeps, bigs) = (format!("deeps.{}", fx.group), format!("bigs.{}", fx.group));
    // kube-rs itself cannot decode the deep one, so kubectl creates it.
    support::kubectl(
        &fx.env.provider,
        &["create", "-f", "-"],
        Some(&serde_json::to_string(&crd("deeps", "Deep", deep)).unwrap()),
    );
    let _deeps = support::CrdDeletedAtEnd(fx.env.provider.clone(), deeps.clone());
    support::kubectl(
        &fx.env.provider,
        &[
            "wait",
            "--for=condition=Established",
            &format!("crd/{deeps}"),
        ],
        None,
    );
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx
        .cluster_binding("cb", &conn, &[&widgets, &deeps, &bigs])
        .await;
    let run = fx.run(&[]);
    let c = fx.conn(&conn).await.status.unwrap();
    let (s, r, m) = cond(&c.conditions, "Connected");
    assert_eq!((s, r), ("True", "Connected"), "{m} {run}");
    assert!(fx.installed_by(&widgets, &conn).await, "{run}");
    let big = fx.consumer_crd(&bigs).await.expect("the enormous CRD");
    let props = serde_json::to_value(&big.spec.versions[0].schema).unwrap();
    assert_eq!(
        props["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_object()
            .map(|m| m.len()),
        Some(3000),
        "copied whole"
    );
    assert!(
        fx.consumer_crd(&deeps).await.is_none(),
        "nothing half-copied"
    );
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("False", "ExportUnusable"), "{m}");
    assert!(m.contains(&deeps), "{m}");
}

/// A provider-side ValidatingAdmissionPolicy refuses some objects (HTTP 422). The refused
/// object gets a `Rejected` Warning Event quoting the policy, its binding counts it as
/// rejected, no provider copy exists, and the rest of the API still syncs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_provider_admission_policy_rejecting_writes_is_reported_on_the_object() {
    let fx = Fx::new("hostile-vap").await;
    let (api, _, cb) = fx.bound_api("widgets", "Namespaced").await;
    let policy = format!("{}-unlucky", fx.label);
    let vap = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [fx.group], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["widgets"]}]},
            "validations": [{"expression": "!has(object.spec.size) || object.spec.size != 13",
                "message": "size 13 is not accepted by this provider"}]}});
    let vapb = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy}, "spec": {"policyName": policy, "validationActions": ["Deny"]}});
    for (obj, plural) in [
        (vap, "validatingadmissionpolicies"),
        (vapb, "validatingadmissionpolicybindings"),
    ] {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                obj["kind"].as_str().unwrap(),
            ),
            plural,
        );
        Api::<DynamicObject>::all_with(fx.provider.clone(), &ar)
            .create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .unwrap();
    }
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let ns = fx.ns.clone();
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.provider.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await;
    let provider: Api<DynamicObject> = Api::namespaced_with(fx.provider.clone(), &ns, &ar);
    let consumer: Api<DynamicObject> = Api::namespaced_with(fx.consumer.clone(), &ns, &ar);
    // Policies take effect a moment after they are written: wait until a dry run is refused.
    support::eventually("the policy to be enforced", || {
        let provider = provider.clone();
        let ar = ar.clone();
        async move {
            let o = DynamicObject::new("probe", &ar).data(json!({"spec": {"size": 13}}));
            let dry = PostParams {
                dry_run: true,
                ..Default::default()
            };
            provider.create(&dry, &o).await.is_err().then_some(())
        }
    })
    .await;
    for (name, size) in [("w-13", 13), ("w-5", 5)] {
        let o = DynamicObject::new(name, &ar).data(json!({"spec": {"size": size}}));
        consumer.create(&PostParams::default(), &o).await.unwrap();
    }
    let run = fx.pass("resync", &[]);
    assert_eq!(run["counts"]["rejected"], 1, "{run}");
    assert!(provider.get_opt("w-13").await.unwrap().is_none(), "no copy");
    assert!(provider.get_opt("w-5").await.unwrap().is_some(), "{run}");
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    let counts = st.bound_apis.iter().find(|a| a.name == api).unwrap();
    assert_eq!((counts.rejected, counts.in_sync), (Some(1), Some(1)));
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.consumer.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    let uid = consumer.get("w-13").await.unwrap().uid().unwrap();
    let note = events
        .items
        .iter()
        .find(|e| {
            e.reason.as_deref() == Some("Rejected")
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
        })
        .and_then(|e| e.note.clone())
        .expect("a Rejected Event on the refused object");
    assert!(note.contains(&policy), "names the policy: {note}");
    assert!(note.contains("size 13 is not accepted"), "{note}");
    // Rejected again next run, still nothing half-written and no new data write for w-5.
    let again = fx.pass("resync", &[]);
    assert_eq!(again["counts"]["rejected"], 1, "{again}");
    assert_eq!(again["data_writes"], 0, "w-5 is not written again: {again}");
    assert!(provider.get_opt("w-13").await.unwrap().is_none());
    for plural in [
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicies",
    ] {
        let kind = if plural.ends_with("bindings") {
            "ValidatingAdmissionPolicyBinding"
        } else {
            "ValidatingAdmissionPolicy"
        };
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
            plural,
        );
        let _ = Api::<DynamicObject>::all_with(fx.provider.clone(), &ar)
            .delete(&policy, &Default::default())
            .await;
    }
}

/// Slack pages a client cannot trust. Duplicates (a channel listed twice, a member listed twice
/// in a channel, a user listed twice) are written once and are no error. Then the server starts
/// repeating one cursor: the enumeration fails as stalled after two calls (never an endless
/// loop, never a false end), Ready says so, and nothing already written is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn slack_duplicates_are_written_once_and_a_repeating_cursor_is_an_error() {
    let rx = Rx::new("hostile-pager").await;
    let mut ws = workspace(
        vec![user("U1"), user("U2"), user("U1")],
        vec![
            channel("C1", &["U1", "U2", "U1"]),
            channel("C1", &["U1", "U2", "U1"]),
            channel("C2", &["U2"]),
        ],
    );
    ws.max_page = 1;
    let fake = slack::start(ws, 0).await.unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("s", json!({"kind": "slack"})).await;
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["scopeErrors"], 0, "{s}");
    let want = vec![
        "C1#member@u1@example.com",
        "C1#member@u2@example.com",
        "C1#workspace@T1",
        "C2#member@u2@example.com",
        "C2#workspace@T1",
    ];
    assert_eq!(rx.held("slack_channel").await, want);
    assert_eq!(
        rx.held("slack_workspace").await,
        vec!["T1#member@u1@example.com", "T1#member@u2@example.com"]
    );
    assert_eq!(cond(&rx.status("s").await.conditions, READY).0, "True");

    fake.state.workspace().repeat_cursor = true;
    let before = fake.state.control().calls("conversations.list");
    rx.run(&fake.url(), &["--source", &format!("{}/s", rx.ns)])
        .await;
    assert_eq!(
        fake.state.control().calls("conversations.list") - before,
        2,
        "stopped at the first repeated cursor"
    );
    let st = rx.status("s").await;
    let (s, reason, message) = cond(&st.conditions, READY);
    assert_eq!((s, reason), ("False", "EnumerationFailed"), "{message}");
    assert!(message.contains("pagination stalled"), "{message}");
    assert!(message.contains("conversations.list"), "{message}");
    assert_eq!(rx.held("slack_channel").await, want, "nothing pruned");
}

/// Upstream error bodies a client must not trust: a non-UTF-8 500 page, a 1 MiB `ok:false`
/// error, and an error that echoes the bot token back in a URL's path and query. Each is one
/// scope error with a bounded, scrubbed sample; the token appears in no status and no log;
/// the healthy channel is still written and the source stays Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn slack_error_bodies_that_are_binary_huge_or_echo_the_token_are_scrubbed_and_bounded() {
    let rx = Rx::new("hostile-errs").await;
    let ws = workspace(
        vec![user("U1")],
        (1..=4)
            .map(|i| channel(&format!("C{i}"), &["U1"]))
            .collect(),
    );
    let fake = slack::start(ws, 0).await.unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("s", json!({"kind": "slack"})).await;
    {
        let mut c = fake.state.control();
        // A 5xx is sent again three times before it counts: this one persists.
        for _ in 0..4 {
            c.push_fault(
                "conversations.members",
                Fault::Bytes(500, vec![0xff, 0xfe, b'<', b'h', 0x80, 0x00, 0xc3]),
            );
        }
        c.push_fault("conversations.members", Fault::OkFalse("e".repeat(1 << 20)));
        c.push_fault(
            "conversations.members",
            Fault::OkFalse(format!(
                "invalid_auth see https://slack.com/api/auth/{SLACK_TOKEN}/check?token={SLACK_TOKEN}"
            )),
        );
    }
    let (code, s, stderr) = rx.run_env(&fake.url(), &["--concurrency", "1"], &[]).await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["counts"]["scopeErrors"], 3, "{s}");
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).0, "True");
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "True");
    let lp = rx.last_pass("s").await;
    assert_eq!(lp.scope_errors, 3);
    let by_scope: BTreeMap<_, _> = lp
        .scope_error_samples
        .iter()
        .map(|x| (x.scope.as_str(), x.message.as_str()))
        .collect();
    assert!(by_scope["channel/C1"].contains("not JSON"), "{by_scope:?}");
    assert!(by_scope["channel/C2"].len() <= 512, "bounded");
    assert!(
        by_scope["channel/C3"].contains("invalid_auth"),
        "{by_scope:?}"
    );
    for m in by_scope.values() {
        assert!(!m.contains(SLACK_TOKEN), "token in status: {m}");
        assert!(!m.contains('\u{fffd}'), "binary body quoted: {m}");
    }
    assert!(!stderr.contains(SLACK_TOKEN), "token in the log");
    assert!(
        stderr.len() < 256 * 1024,
        "the huge error was not logged whole"
    );
    assert_eq!(
        rx.held("slack_channel").await,
        vec!["C4#member@u1@example.com", "C4#workspace@T1"],
        "the healthy channel is written, the failed ones are not half-written"
    );
}

/// A SCIM bridge that echoes the bearer token back in its error `detail`, and one that answers
/// with an HTML page: the conditions and samples say what failed without quoting the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_scim_bridge_echoing_the_token_never_gets_it_into_status() {
    let rx = Rx::new("hostile-scim").await;
    let token = "op-bridge-credential-7f3a9c";
    let dir = scim::Directory {
        token: token.into(),
        users: vec![scim::ScimUser {
            id: "u1".into(),
            user_name: "u1".into(),
            emails: vec![("ada@example.com".into(), true)],
            active: true,
        }],
        groups: vec![scim::ScimGroup {
            id: "g1".into(),
            display_name: "g1".into(),
            members: vec!["u1".into()],
        }],
        max_results: 10,
        ..Default::default()
    };
    let bridge = scim::start(dir, 0).await.unwrap();
    rx.identity("scim", token, &[&bridge.addr.to_string()])
        .await;
    rx.source(
        "op",
        json!({"kind": "onepassword", "baseURL": bridge.url(),
        "auth": {"agentIdentity": "agent", "credential": "scim"}}),
    )
    .await;
    bridge.state.control().push_fault(
        "Groups",
        Fault::Status(
            401,
            format!("bearer token {token} is not valid for this bridge"),
        ),
    );
    let (code, s, stderr) = rx.run_env("http://127.0.0.1:9", &[], &[]).await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    let st = rx.status("op").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!(
        (status, reason),
        ("False", "UpstreamAuthFailed"),
        "{message}"
    );
    assert!(message.contains("HTTP 401"), "{message}");
    let samples = rx.last_pass("op").await.scope_error_samples;
    for m in std::iter::once(message).chain(samples.iter().map(|x| x.message.as_str())) {
        assert!(!m.contains(token), "the token reached status: {m}");
    }
    assert!(!stderr.contains(token), "the token reached the log");

    // An HTML error page from a proxy in front of the bridge, on the first try and on every
    // resend.
    for _ in 0..4 {
        bridge.state.control().push_fault(
            "Groups",
            Fault::Bytes(502, b"<html><body>Bad Gateway</body></html>".to_vec()),
        );
    }
    rx.run(
        "http://127.0.0.1:9",
        &["--source", &format!("{}/op", rx.ns)],
    )
    .await;
    let st = rx.status("op").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!(
        (status, reason),
        ("False", "EnumerationFailed"),
        "{message}"
    );
    assert!(message.contains("HTTP 502, body is not JSON"), "{message}");
    assert!(rx.held("scim_group").await.is_empty(), "nothing written");
}

/// SpiceDB refusing writes (its schema lacks a type the source writes): the scopes whose
/// writes were refused are scope errors naming SpiceDB, each write is atomic so none is
/// half-applied, the other scopes are written, and the source stays Ready with PartialFailure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn spicedb_rejecting_writes_fails_only_those_scopes() {
    let rx = Rx::new("hostile-spicedb").await;
    // The operator's schema has no slack_usergroup definition.
    rx.spicedb
        .write_schema(
            "definition user {}\ndefinition slack_workspace {\n relation member: user\n}\n\
             definition slack_channel {\n relation workspace: slack_workspace\n relation member: user\n}\n",
        )
        .await
        .unwrap();
    let mut ws = workspace(vec![user("U1"), user("U2")], vec![channel("C1", &["U1"])]);
    ws.usergroups = vec![slack::Usergroup {
        id: "S1".into(),
        handle: "ops".into(),
        users: vec!["U1".into(), "U2".into()],
    }];
    let fake = slack::start(ws, 0).await.unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source(
        "s",
        json!({"kind": "slack", "config": {"usergroups": true}}),
    )
    .await;
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["scopeErrors"], 1, "{s}");
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).0, "True");
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "True");
    let lp = rx.last_pass("s").await;
    let sample = &lp.scope_error_samples[0];
    assert_eq!(sample.scope, "usergroup/S1");
    assert!(sample.message.contains("SpiceDB"), "{}", sample.message);
    assert!(
        sample.message.contains("slack_usergroup"),
        "{}",
        sample.message
    );
    assert_eq!(
        rx.held("slack_channel").await,
        vec!["C1#member@u1@example.com", "C1#workspace@T1"]
    );
}

/// A listener counting the connections it accepts (a trap: the test passes when it stays 0).
async fn trap() -> (String, Arc<AtomicU32>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let task = tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            h.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, hits, task)
}

/// Tenant-written `baseURL`s aimed at the cloud metadata service (even when the credential's
/// allowedHosts lists it) or at loopback services the credential's allowedHosts does not name,
/// in every spelling (plain, decimal IP, IPv4-mapped IPv6, IPv6 link-local, user-info trick,
/// another port, a file URL): each is refused on Ready before any request. The run's HTTP proxy is a local trap, so a request to 169.254.169.254 would land
/// there instead of leaving the machine: it receives nothing, nor does the loopback service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn base_urls_at_cloud_metadata_or_unlisted_loopback_are_refused_before_any_request() {
    let rx = Rx::new("hostile-ssrf").await;
    let (proxy, proxy_hits, proxy_task) = trap().await;
    let (local, local_hits, local_task) = trap().await;
    let local_port = local.rsplit(':').next().unwrap().to_string();
    rx.identity(
        "scim",
        "scim-secret",
        &[
            "metadata.google.internal",
            "scim.example.com",
            "localhost:1",
            // Listed, yet never admitted: link-local and metadata addresses.
            "169.254.169.254",
            "[::ffff:169.254.169.254]",
            "[fe80::1]:8080",
        ],
    )
    .await;
    let cases = [
        (
            "meta",
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "HostNotAllowed",
        ),
        (
            "decimal",
            "http://2852039166/".to_string(),
            "HostNotAllowed",
        ),
        (
            "mapped",
            "http://[::ffff:169.254.169.254]/".to_string(),
            "HostNotAllowed",
        ),
        (
            "linklocal6",
            "http://[fe80::1]:8080/".to_string(),
            "HostNotAllowed",
        ),
        (
            "userinfo",
            "http://scim.example.com@169.254.169.254/".to_string(),
            "InvalidBaseURL",
        ),
        (
            "loopback",
            format!("http://127.0.0.1:{local_port}/"),
            "HostNotAllowed",
        ),
        (
            "localhost",
            format!("http://localhost:{local_port}/"),
            "HostNotAllowed",
        ),
        (
            "file",
            "file:///var/run/secrets/kubernetes.io/serviceaccount/token".to_string(),
            "InvalidBaseURL",
        ),
    ];
    for (name, url, _) in &cases {
        rx.source(
            name,
            json!({"kind": "onepassword", "baseURL": url,
            "auth": {"agentIdentity": "agent", "credential": "scim"}}),
        )
        .await;
    }
    let proxy_url = format!("http://{proxy}");
    let (code, s, stderr) = rx
        .run_env(
            "http://127.0.0.1:9",
            &[],
            &[
                // http:// destinations only: HTTPS_PROXY would also reroute the Kubernetes
                // client, which kbind builds without proxy support.
                ("HTTP_PROXY", &proxy_url),
                ("http_proxy", &proxy_url),
                ("NO_PROXY", "127.0.0.1,localhost"),
                ("no_proxy", "127.0.0.1,localhost"),
            ],
        )
        .await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["counts"]["sourcesNotReady"], cases.len() as i64, "{s}");
    for (name, url, reason) in &cases {
        let st = rx.status(name).await;
        let (status, r, message) = cond(&st.conditions, READY);
        assert_eq!((status, r), ("False", *reason), "{name} {url}: {message}");
        assert!(!message.contains("scim-secret"), "{message}");
        assert_eq!(rx.last_pass(name).await.scopes_processed, 0, "{name}");
    }
    let meta = cond(&rx.status("decimal").await.conditions, READY)
        .2
        .to_string();
    assert!(
        meta.contains("169.254.169.254"),
        "the address as parsed: {meta}"
    );
    for name in ["meta", "decimal", "mapped", "linklocal6"] {
        let st = rx.status(name).await;
        let message = cond(&st.conditions, READY).2.to_string();
        assert!(
            message.contains("link-local or cloud metadata address"),
            "{name}: refused as a metadata address though allowedHosts lists it: {message}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        proxy_hits.load(Ordering::SeqCst),
        0,
        "a request left for the metadata service"
    );
    assert_eq!(
        local_hits.load(Ordering::SeqCst),
        0,
        "the loopback service was reached"
    );
    proxy_task.abort();
    local_task.abort();
}

/// A Slack source whose credential's allowedHosts names only a SCIM host: the token is not sent
/// to the Slack API URL (`--slack-api-url`), whatever the kind ignores. `Ready=False`
/// `HostNotAllowed` names the Slack host and the credential; the fake Slack receives no request;
/// the destination is checked before the Secret is read (a missing Secret still says
/// HostNotAllowed). Listing the Slack host admits it; an empty list is checked against nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_credential_with_allowed_hosts_is_never_sent_to_an_unlisted_slack_api() {
    let rx = Rx::new("hostile-slackhost").await;
    let fake = slack::start(workspace(vec![user("U1")], vec![channel("C1", &["U1"])]), 0)
        .await
        .unwrap();
    let slack_host = fake.addr.to_string();
    rx.identity("slack", SLACK_TOKEN, &["scim.example.com"])
        .await;
    rx.source("s", json!({"kind": "slack"})).await;
    let (code, s, stderr) = rx.run_env(&fake.url(), &[], &[]).await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["counts"]["sourcesNotReady"], 1, "{s}");
    let st = rx.status("s").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!((status, reason), ("False", "HostNotAllowed"), "{message}");
    assert!(message.contains(&slack_host), "names the host: {message}");
    assert!(
        message.contains("\"slack\""),
        "names the credential: {message}"
    );
    assert!(message.contains("--slack-api-url"), "{message}");
    assert_eq!(fake.state.control().total_calls(), 0, "Slack was called");

    // Checked before the Secret is read.
    Api::<Secret>::namespaced(rx.client.clone(), &rx.ns)
        .delete("slack", &Default::default())
        .await
        .unwrap();
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).1, "HostNotAllowed");
    assert_eq!(fake.state.control().total_calls(), 0, "Slack was called");

    // Listing the Slack API host admits it.
    rx.identity("slack", SLACK_TOKEN, &["scim.example.com", &slack_host])
        .await;
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).0, "True", "{:?}", st.conditions);
    assert_eq!(
        rx.held("slack_channel").await,
        vec!["C1#member@u1@example.com", "C1#workspace@T1"]
    );
    // The token went only to the fake Slack, in the Authorization header.
    assert!(
        fake.state
            .control()
            .seen_auth
            .iter()
            .all(|a| a == &format!("Bearer {SLACK_TOKEN}"))
    );
}

fn scim_user(id: &str) -> scim::ScimUser {
    scim::ScimUser {
        id: id.into(),
        user_name: id.into(),
        emails: vec![(format!("{id}@example.com"), true)],
        active: true,
    }
}

fn scim_group(id: &str, members: &[&str]) -> scim::ScimGroup {
    scim::ScimGroup {
        id: id.into(),
        display_name: id.into(),
        members: members.iter().map(|m| m.to_string()).collect(),
    }
}

/// A bridge stand-in with users u1, u2 and groups g1, g2 (token `scim-secret`).
fn bridge_dir() -> scim::Directory {
    scim::Directory {
        token: "scim-secret".into(),
        users: vec![scim_user("u1"), scim_user("u2")],
        groups: vec![scim_group("g1", &["u1"]), scim_group("g2", &["u1", "u2"])],
        max_results: 100,
        ..Default::default()
    }
}

const MIB: u64 = 1 << 20;

/// The reporter's case (issue #11): a SCIM bridge stand-in dripping a ~400 MB body (at ~1.6 MB/s)
/// beside a healthy Slack source, under a short deadline. The bridge's source, ordered first,
/// gets only its share of the deadline: the run ends within the deadline (plus a generous
/// margin), its memory stays bounded (the body is never buffered past the cap), the healthy
/// source's scopes are all synced, and the bridge's source says why it was not on `Ready`.
/// `KBIND_HOSTILE_DEADLINE` (default 20s) and `KBIND_BIN` reproduce the before/after figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_dripping_bridge_gets_its_share_and_the_healthy_source_beside_it_syncs() {
    let rx = Rx::new("hostile-share").await;
    let deadline = std::env::var("KBIND_HOSTILE_DEADLINE").unwrap_or_else(|_| "20s".into());
    let deadline_secs = kbind::pass::args::parse_duration(&deadline)
        .unwrap()
        .as_secs();
    let mut dir = bridge_dir();
    dir.generated
        .insert("Groups".into(), Generated::drip(400 * MIB, 1600 << 10));
    let bridge = scim::start(dir, 0).await.unwrap();
    let fake = slack::start(
        workspace(
            vec![user("U1"), user("U2")],
            (1..=3)
                .map(|i| channel(&format!("C{i}"), &["U1", "U2"]))
                .collect(),
        ),
        0,
    )
    .await
    .unwrap();
    rx.identity_with(&[
        ("scim", "scim-secret", &[&bridge.addr.to_string()]),
        ("slack", SLACK_TOKEN, &[]),
    ])
    .await;
    rx.source(
        "a-bridge",
        json!({"kind": "onepassword", "baseURL": bridge.url(),
        "auth": {"agentIdentity": "agent", "credential": "scim"}}),
    )
    .await;
    rx.source("b-slack", json!({"kind": "slack"})).await;
    let started = std::time::Instant::now();
    let (code, s, stderr) = rx
        .run_env(
            &fake.url(),
            &["--deadline", &deadline],
            &[("KBIND_MIN_SOURCE_SHARE", "5s")],
        )
        .await;
    let wall = started.elapsed();
    let rss = s["peak_rss_bytes"].as_u64().unwrap_or(u64::MAX);
    let healthy = rx.last_pass("b-slack").await.scopes_processed;
    eprintln!(
        "figures: --deadline {deadline}: wall {:.1}s, peak RSS {} MiB, healthy scopes synced {healthy}/3, exit {code}, outcome {}",
        wall.as_secs_f64(),
        rss / MIB,
        s["outcome"]
    );
    assert_eq!(
        code,
        0,
        "{s}\n{}",
        &stderr[stderr.len().saturating_sub(4000)..]
    );
    assert!(
        wall.as_secs() < deadline_secs + 15,
        "the run outlived --deadline {deadline}: {wall:?}"
    );
    assert!(rss < 200 * MIB, "peak RSS {rss} bytes: {s}");
    assert_eq!(healthy, 3, "{s}");
    assert_eq!(
        rx.held("slack_channel").await.len(),
        9,
        "the healthy source's channels are synced"
    );
    assert_eq!(
        cond(&rx.status("b-slack").await.conditions, READY).0,
        "True"
    );
    let st = rx.status("a-bridge").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    eprintln!("a-bridge: Ready={status} {reason}: {message}\nsummary: {s}");
    assert_eq!(status, "False", "{message}");
    match reason {
        "DeadlineExceeded" => {
            assert!(message.contains("share of the pass deadline"), "{message}");
            assert_eq!(s["outcome"], "partial", "{s}");
            assert_eq!(s["counts"]["sourcesOutOfShare"], 1, "{s}");
        }
        "ResponseTooLarge" => assert!(message.contains("--max-response-bytes"), "{message}"),
        other => panic!("reason {other}: {message}"),
    }
    assert!(!message.contains("scim-secret"), "{message}");
    assert!(rx.held("scim_group").await.is_empty(), "nothing written");
}

/// Upstream answers that would hold a pass, each on its own source in one run: a 400 MB body
/// sent as fast as it can be read (with and without a `Content-Length`), a bridge whose group
/// list never ends, a body dripping slower than `--request-timeout` allows, a source asking for
/// `pageSize: 4294967295`, and a Slack whose channel list never ends. Each hostile source is
/// `Ready=False` with a reason naming the bound it met, after one request (or `--max-pages`);
/// the huge page size is asked as 1000 and syncs; the run's memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn huge_endless_and_slow_answers_fail_their_source_with_the_bound_they_met() {
    let rx = Rx::new("hostile-bounds").await;
    let with = |ep: &str, g: Generated| {
        let mut d = bridge_dir();
        d.generated.insert(ep.into(), g);
        d
    };
    let huge = scim::start(with("Groups", Generated::huge(400 * MIB)), 0)
        .await
        .unwrap();
    let declared = scim::start(
        with(
            "Groups",
            Generated {
                declare_length: true,
                ..Generated::huge(400 * MIB)
            },
        ),
        0,
    )
    .await
    .unwrap();
    let slow = scim::start(with("Groups", Generated::drip(MIB, 64 << 10)), 0)
        .await
        .unwrap();
    let mut endless_dir = bridge_dir();
    endless_dir.endless_pages = true;
    let endless = scim::start(endless_dir, 0).await.unwrap();
    let mut big_dir = bridge_dir();
    big_dir.max_results = usize::MAX;
    let big = scim::start(big_dir, 0).await.unwrap();
    let mut ws = workspace(vec![user("U1")], vec![channel("C1", &["U1"])]);
    ws.endless_pages = true;
    let fake = slack::start(ws, 0).await.unwrap();

    let bridges = [
        ("huge", &huge),
        ("declared", &declared),
        ("slow", &slow),
        ("endless", &endless),
        ("bigpage", &big),
    ];
    let hosts: Vec<String> = bridges.iter().map(|(_, b)| b.addr.to_string()).collect();
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    rx.identity_with(&[("scim", "scim-secret", &hosts), ("slack", SLACK_TOKEN, &[])])
        .await;
    for (name, b) in &bridges {
        let mut spec = json!({"kind": "onepassword", "baseURL": b.url(),
            "auth": {"agentIdentity": "agent", "credential": "scim"}});
        if *name == "bigpage" {
            spec["config"] = json!({"pageSize": 4294967295u64});
        }
        rx.source(name, spec).await;
    }
    rx.source(
        "slack",
        json!({"kind": "slack", "config": {"pageSize": 4294967295u64}}),
    )
    .await;
    let started = std::time::Instant::now();
    let (code, s, stderr) = rx
        .run_env(
            &fake.url(),
            &[
                "--deadline",
                "60s",
                "--request-timeout",
                "3s",
                "--max-pages",
                "50",
            ],
            &[("KBIND_MIN_SOURCE_SHARE", "5s")],
        )
        .await;
    assert_eq!(
        code,
        0,
        "{s}\n{}",
        &stderr[stderr.len().saturating_sub(4000)..]
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    let rss = s["peak_rss_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(rss < 200 * MIB, "peak RSS {rss} bytes: {s}");
    let cases = [
        (
            "huge",
            "ResponseTooLarge",
            "16Mi cap (--max-response-bytes)",
        ),
        (
            "declared",
            "ResponseTooLarge",
            "16Mi cap (--max-response-bytes)",
        ),
        ("slow", "RequestTimedOut", "--request-timeout 3s"),
        (
            "endless",
            "TooManyPages",
            "more than 50 pages (--max-pages)",
        ),
        ("slack", "TooManyPages", "more than 50 pages (--max-pages)"),
    ];
    for (name, reason, needle) in cases {
        let st = rx.status(name).await;
        let (status, r, message) = cond(&st.conditions, READY);
        assert_eq!((status, r), ("False", reason), "{name}: {message}");
        assert!(message.contains(needle), "{name}: {message}");
    }
    // Neither a too-large answer nor a timed-out one is sent again.
    assert_eq!(huge.state.control().calls("Groups"), 1);
    assert_eq!(declared.state.control().calls("Groups"), 1);
    assert_eq!(slow.state.control().calls("Groups"), 1);
    assert_eq!(endless.state.control().calls("Groups"), 50);
    assert_eq!(fake.state.control().calls("conversations.list"), 50);
    assert_eq!(fake.state.control().largest_page_asked, 1000);
    // pageSize 4294967295 is asked as 1000, and the source syncs.
    assert_eq!(big.state.control().largest_page_asked, 1000);
    let st = rx.status("bigpage").await;
    assert_eq!(cond(&st.conditions, READY).0, "True", "{:?}", st.conditions);
    assert_eq!(
        rx.held("scim_group").await,
        vec![
            "g1#member@u1@example.com",
            "g2#member@u1@example.com",
            "g2#member@u2@example.com"
        ]
    );
}

/// A scope whose members drip for longer than its source's whole turn: the request is cut off
/// at the end of the turn (not at `--request-timeout`), that first scope fails with a sample
/// saying so — so the cursor moves past it instead of holding the source in place run after
/// run — and the next run resumes after it and completes the cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_scope_outlasting_its_turn_fails_with_a_reason_and_the_cycle_moves_on() {
    let rx = Rx::new("hostile-turn").await;
    let bridge = scim::start(bridge_dir(), 0).await.unwrap();
    rx.identity("scim", "scim-secret", &[&bridge.addr.to_string()])
        .await;
    rx.source(
        "op",
        json!({"kind": "onepassword", "baseURL": bridge.url(),
        "auth": {"agentIdentity": "agent", "credential": "scim"}}),
    )
    .await;
    // Every group's member GET drips; with --concurrency 1, g1 is the only one asked.
    bridge
        .state
        .directory()
        .generated
        .insert("Group".into(), Generated::drip(400 * MIB, 256 << 10));
    let started = std::time::Instant::now();
    let s = rx
        .run(
            "http://127.0.0.1:9",
            &["--deadline", "12s", "--concurrency", "1"],
        )
        .await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    let st = rx.status("op").await;
    assert_eq!(cond(&st.conditions, READY).0, "True", "{s}");
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "True", "{s}");
    let lp = rx.last_pass("op").await;
    assert_eq!(lp.scope_errors, 1, "{s}");
    let sample = &lp.scope_error_samples[0];
    assert_eq!(sample.scope, "group/g1");
    assert!(
        sample.message.contains("share of the pass deadline"),
        "{}",
        sample.message
    );
    let sync = st.sync.unwrap();
    assert_eq!(sync.resume_after, "group/g1", "the cursor passed the scope");
    assert!(!sync.enum_complete);

    bridge.state.directory().generated.clear();
    rx.run("http://127.0.0.1:9", &[]).await;
    let st = rx.status("op").await;
    assert!(st.sync.unwrap().enum_complete, "the cycle completed");
    assert_eq!(
        rx.held("scim_group").await,
        vec!["g2#member@u1@example.com", "g2#member@u2@example.com"],
        "g2 synced; g1 is retried in the next cycle"
    );
}

/// Absurd durations and malformed configuration on RelationshipSources: a negative, a
/// unit-less, and an astronomically long `sync.interval`, a join directory that is a JSON list,
/// and a credential the identity does not hold each give their own Ready=False reason; none
/// takes down the pass, so the healthy source beside them still syncs. Absurd `--deadline`s are
/// usage errors (exit 2), not panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn absurd_durations_and_malformed_source_config_are_refused_per_source() {
    let rx = Rx::new("hostile-cfg").await;
    let fake = slack::start(workspace(vec![user("U1")], vec![channel("C1", &["U1"])]), 0)
        .await
        .unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dir"},
        "data": {"users": "[\"ada@example.com\"]"}}))
    .unwrap();
    Api::<ConfigMap>::namespaced(rx.client.clone(), &rx.ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let cases = [
        (
            "negative",
            json!({"kind": "slack", "sync": {"interval": "-5m"}}),
            "InvalidInterval",
            "-5m",
        ),
        (
            "unitless",
            json!({"kind": "slack", "sync": {"interval": "15"}}),
            "InvalidInterval",
            "needs a unit",
        ),
        (
            "eternal",
            json!({"kind": "slack", "sync": {"interval": "99999999999999999999h"}}),
            "InvalidInterval",
            "too long",
        ),
        (
            "dirlist",
            json!({"kind": "slack", "config": {"join": {"directory": {"configMapRef": {"name": "dir", "key": "users"}}}}}),
            "InvalidDirectory",
            "users",
        ),
        (
            "nocred",
            json!({"kind": "slack", "auth": {"agentIdentity": "agent", "credential": "github"}}),
            "CredentialNotFound",
            "github",
        ),
        (
            "nested",
            json!({"kind": "slack", "config": {"join": {"by": "email", "directory": {"configMapRef": {"name": "dir", "key": "users", "namespace": "kube-system"}}}}}),
            "InvalidConfig",
            "namespace",
        ),
    ];
    for (name, spec, _, _) in &cases {
        rx.source(name, spec.clone()).await;
    }
    rx.source("healthy", json!({"kind": "slack"})).await;
    let (code, s, stderr) = rx.run_env(&fake.url(), &[], &[]).await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for (name, _, reason, needle) in &cases {
        let st = rx.status(name).await;
        let (status, r, message) = cond(&st.conditions, READY);
        assert_eq!((status, r), ("False", *reason), "{name}: {message}");
        assert!(
            message.contains(needle),
            "{name}: {message:?} lacks {needle:?}"
        );
    }
    assert_eq!(
        cond(&rx.status("healthy").await.conditions, READY).0,
        "True"
    );
    assert_eq!(
        rx.held("slack_channel").await.len(),
        2,
        "the healthy source synced"
    );

    for deadline in [
        "18446744073709551615",
        "99999999999999999h",
        "5124095576030431h",
    ] {
        let (code, s, stderr) = support::kbind(&["relsync", "--deadline", deadline, "-o", "json"]);
        assert_eq!(code, 2, "--deadline {deadline}: {s}\n{stderr}");
        assert!(
            !stderr.contains("panicked"),
            "--deadline {deadline}: {stderr}"
        );
        assert!(stderr.contains("--deadline"), "{stderr}");
    }
}

/// Consumer-side objects written by hand with names that pass the CRD's pattern but still
/// name nothing real: a Binding for an API that is a Kind-like or URL-like `<plural>.<group>`
/// and for a built-in API. Each binding says `APINotExported` and nothing is installed.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bindings_naming_apis_the_provider_does_not_export_install_nothing() {
    let fx = Fx::new("hostile-api").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let names = [
        format!("widget.{}", fx.group),
        "deployments.apps".to_string(),
        "customresourcedefinitions.apiextensions.k8s.io".to_string(),
        format!("widgets.{}.evil.example.com", fx.group),
    ];
    let mut bindings = Vec::new();
    for (i, api) in names.iter().enumerate() {
        bindings.push(fx.binding(&format!("b{i}"), &conn, &[api]).await);
    }
    fx.run(&[]);
    let api: Api<kbind::api::core::Binding> = Api::namespaced(fx.consumer.clone(), &fx.ns);
    for (b, name) in bindings.iter().zip(&names) {
        let st = api.get(b).await.unwrap().status.unwrap_or_default();
        let (s, r, m) = cond(&st.conditions, "Ready");
        assert_eq!((s, r), ("False", "APINotExported"), "{name}: {m}");
        if !name.ends_with(".k8s.io") && name != "deployments.apps" {
            assert!(fx.consumer_crd(name).await.is_none(), "{name} installed");
        }
    }
    // The Connection itself is fine and still lists its real export.
    let c = fx.conn(&conn).await.status.unwrap();
    assert_eq!(cond(&c.conditions, "Ready").0, "True");
    assert!(c.exported_apis.iter().any(|e| e.name == widgets));
    assert!(!c.exported_apis.iter().any(|e| names.contains(&e.name)));
}

/// What a hostile provider apiserver does instead of answering one kind of request truthfully;
/// everything else it passes through to the real provider apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostileProvider {
    /// The CRD LIST page is a valid JSON list padded past the body cap, with no Content-Length.
    HugeListPage,
    /// Every CRD LIST page is empty and carries a new continue token.
    EndlessContinue,
    /// Every `/openapi/v3/<group-version>` document is padded past the body cap.
    HugeOpenApi,
    /// Every LIST of the named resource (the instances resync reads) is padded past the body cap.
    HugeInstanceList(&'static str),
}

/// A JSON body of about `bytes`: `head`, JSON whitespace, `tail`, streamed 64 KiB at a time and
/// never held whole.
fn padded_json(head: String, tail: &'static str, bytes: usize) -> axum::body::Body {
    static SPACES: [u8; 64 << 10] = [b' '; 64 << 10];
    let chunks = std::iter::once(bytes::Bytes::from(head))
        .chain(std::iter::repeat_n(
            bytes::Bytes::from_static(&SPACES),
            bytes / SPACES.len() + 1,
        ))
        .chain(std::iter::once(bytes::Bytes::from_static(tail.as_bytes())));
    axum::body::Body::from_stream(futures::stream::iter(
        chunks.map(Ok::<_, std::convert::Infallible>),
    ))
}

/// A provider apiserver on loopback (plain HTTP) that misbehaves as `mode` says and forwards
/// every other request to `upstream` (the real provider). Returns its URL and the number of
/// hostile answers it served.
async fn hostile_provider(
    upstream: String,
    mode: HostileProvider,
) -> (String, Arc<AtomicU32>, tokio::task::JoinHandle<()>) {
    use axum::body::Body;
    use axum::http::{Request, Response, StatusCode};
    kbind::install_crypto_provider();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let served = Arc::new(AtomicU32::new(0));
    let counter = served.clone();
    let cap = kbind::pass::retry::MAX_RESPONSE_BYTES;
    let handler = move |req: Request<Body>| {
        let (http, upstream, served) = (http.clone(), upstream.clone(), counter.clone());
        async move {
            let path = req.uri().path().to_string();
            let crd_list = req.method() == "GET"
                && path == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
            let json = |body: Body| {
                Response::builder()
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap()
            };
            match mode {
                HostileProvider::HugeListPage if crd_list => {
                    served.fetch_add(1, Ordering::SeqCst);
                    return json(padded_json(
                        r#"{"kind":"CustomResourceDefinitionList","apiVersion":"apiextensions.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":["#.into(),
                        "]}",
                        cap + (1 << 20),
                    ));
                }
                HostileProvider::EndlessContinue if crd_list => {
                    let n = served.fetch_add(1, Ordering::SeqCst);
                    return json(Body::from(
                        json!({"kind": "CustomResourceDefinitionList",
                            "apiVersion": "apiextensions.k8s.io/v1",
                            "metadata": {"resourceVersion": "1", "continue": format!("page-{n}")},
                            "items": []})
                        .to_string(),
                    ));
                }
                HostileProvider::HugeOpenApi if path.starts_with("/openapi/v3/") => {
                    served.fetch_add(1, Ordering::SeqCst);
                    return json(padded_json(
                        r#"{"openapi":"3.0.0","info":{"title":"Kubernetes","version":"v1"},"paths":{},"components":{"schemas":{}}"#.into(),
                        "}",
                        cap + (1 << 20),
                    ));
                }
                HostileProvider::HugeInstanceList(plural)
                    if req.method() == "GET" && path.ends_with(&format!("/{plural}")) =>
                {
                    served.fetch_add(1, Ordering::SeqCst);
                    return json(padded_json(
                        r#"{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":["#.into(),
                        "]}",
                        cap + (1 << 20),
                    ));
                }
                _ => {}
            }
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20)
                .await
                .unwrap_or_default();
            let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut out = http
                .request(parts.method.clone(), format!("{upstream}{path_and_query}"))
                .body(body);
            for (k, v) in &parts.headers {
                if k != "host" && k != "content-length" {
                    out = out.header(k, v);
                }
            }
            match out.send().await {
                Ok(resp) => {
                    let mut b = Response::builder().status(resp.status());
                    if let Some(ct) = resp.headers().get("content-type") {
                        b = b.header("content-type", ct);
                    }
                    let bytes = resp.bytes().await.unwrap_or_default();
                    b.body(Body::from(bytes)).unwrap()
                }
                Err(_) => Response::builder()
                    .status(StatusCode::BAD_GATEWAY)
                    .body(Body::empty())
                    .unwrap(),
            }
        }
    };
    let app = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, served, task)
}

/// Provider apiservers a tenant's Connection may point at, each answering one kind of request
/// with something that would hold or sink a pass: a CRD LIST page larger than the body cap
/// (128Mi, `kbind::pass::retry::MAX_RESPONSE_BYTES`, no Content-Length), a CRD LIST whose
/// continue tokens never end (cap 10000 pages, `kbind::pass::list::MAX_PAGES`), and a
/// `/openapi/v3` document larger than the body cap. Beside them, a healthy Connection in the same
/// run. Each hostile Connection ends `Ready=False` with a condition naming the bound it met, the
/// run ends well within its deadline with bounded memory, the healthy Connection is Ready, and a
/// second run behaves the same and writes no hostile Connection's or binding's status again.
/// (The hostile servers speak plain HTTP on loopback, hence `--allow-kubeconfig-field http`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn hostile_provider_apiservers_fail_their_connection_with_the_bound_they_met() {
    let fx = Fx::new("hostile-provider").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let good = fx.provider_kubeconfig();
    let upstream = support::server_of(&good);
    fx.secret("healthy", "kubeconfig", &good).await;
    let healthy = fx
        .connection("z-healthy", "healthy", json!({"source": "CRD"}), false)
        .await;
    let healthy_cb = fx.cluster_binding("z-healthy", &healthy, &[&widgets]).await;

    let modes = [
        ("huge-list", HostileProvider::HugeListPage, "CRD"),
        ("endless", HostileProvider::EndlessContinue, "CRD"),
        ("huge-openapi", HostileProvider::HugeOpenApi, "OpenAPI"),
    ];
    let mut servers = Vec::new();
    let mut hostile = Vec::new();
    for (name, mode, source) in modes {
        let (url, served, task) = hostile_provider(upstream.clone(), mode).await;
        fx.secret(name, "kubeconfig", &support::via(&good, &url))
            .await;
        let conn = fx
            .connection(name, name, json!({"source": source}), false)
            .await;
        let cb = fx.cluster_binding(name, &conn, &[&widgets]).await;
        servers.push((served, task));
        hostile.push((name, mode, conn, cb));
    }

    let deadline = 120u64;
    let deadline_arg = format!("{deadline}s");
    let kc = fx.env.consumer.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", fx.label);
    let args = [
        "schema",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &fx.ns,
        "--credential-namespace",
        &fx.ns,
        "--selector",
        &selector,
        "--allow-kubeconfig-field",
        "http",
        "--deadline",
        &deadline_arg,
        "-o",
        "json",
    ];
    // A run that outlives its deadline by more than a margin is killed and fails the test.
    let run = || async {
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(deadline + 60),
            tokio::process::Command::from(support::kbind_command(&args))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "kbind schema still running {}s after its start",
                deadline + 60
            )
        })
        .expect("run kbind");
        let wall = started.elapsed();
        let (code, summary, stderr) = support::outcome(out);
        assert_eq!(code, 0, "{summary}\n{stderr}");
        (wall, summary)
    };
    let statuses = || async {
        let mut out = Vec::new();
        for (name, _, conn, cb) in &hostile {
            let c = fx.conn(conn).await;
            let b = Api::<ClusterBinding>::all(fx.consumer.clone())
                .get(cb)
                .await
                .unwrap();
            out.push((
                *name,
                c.metadata.resource_version.clone(),
                c.status.unwrap_or_default().conditions,
                b.metadata.resource_version.clone(),
                b.status.unwrap_or_default().conditions,
            ));
        }
        out
    };

    let (wall, summary) = run().await;
    let first = statuses().await;
    let served: Vec<u32> = servers
        .iter()
        .map(|(s, _)| s.load(Ordering::SeqCst))
        .collect();
    eprintln!(
        "figures: run 1 wall {:.1}s, peak RSS {} MiB, hostile answers served {served:?}",
        wall.as_secs_f64(),
        summary["peak_rss_bytes"].as_u64().unwrap_or(0) / MIB
    );
    for (name, _, conds, _, bconds) in &first {
        let (s, r, m) = cond(conds, "Ready");
        let (bs, br, bm) = cond(bconds, "Ready");
        eprintln!(
            "{name}: Connection Ready={s} {r}: {m}\n{name}: ClusterBinding Ready={bs} {br}: {bm}"
        );
    }
    assert!(
        wall.as_secs() < deadline,
        "the run outlived its deadline: {wall:?}"
    );
    let rss = summary["peak_rss_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(rss < 400 * MIB, "peak RSS {rss} bytes: {summary}");
    for ((name, mode, _, _), (_, _, conds, _, bconds)) in hostile.iter().zip(&first) {
        let (s, r, m) = cond(conds, "Ready");
        assert_eq!((s, r), ("False", "DiscoveryFailed"), "{name}: {m}");
        let needle = match mode {
            HostileProvider::HugeListPage
            | HostileProvider::HugeOpenApi
            | HostileProvider::HugeInstanceList(_) => "response body larger than",
            HostileProvider::EndlessContinue => "pages",
        };
        assert!(m.contains(needle), "{name}: {m:?} lacks {needle:?}");
        assert_eq!(cond(bconds, "Ready").0, "False", "{name}: binding");
    }
    // The endless lister was cut off at the page cap (and not resent).
    assert_eq!(
        served[1] as usize,
        kbind::pass::list::MAX_PAGES,
        "continue tokens followed"
    );
    // The healthy Connection in the same run.
    let st = fx.conn(&healthy).await.status.unwrap_or_default();
    let (s, r, m) = cond(&st.conditions, "Ready");
    assert_eq!((s, r), ("True", "Ready"), "healthy: {m}\n{summary}");
    assert!(fx.installed_by(&widgets, &healthy).await, "{summary}");
    let b = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&healthy_cb)
        .await
        .unwrap();
    assert_eq!(
        cond(&b.status.unwrap_or_default().conditions, "Ready").0,
        "True"
    );

    // A second run: the same conditions, and no hostile status written again.
    let (wall, summary) = run().await;
    eprintln!(
        "figures: run 2 wall {:.1}s, peak RSS {} MiB",
        wall.as_secs_f64(),
        summary["peak_rss_bytes"].as_u64().unwrap_or(0) / MIB
    );
    assert!(
        wall.as_secs() < deadline,
        "run 2 outlived its deadline: {wall:?}"
    );
    let second = statuses().await;
    assert_eq!(first, second, "no status flapping across runs");
    for (_, task) in servers {
        task.abort();
    }
}

/// A provider whose instance LIST cannot be read (a page past the body cap) must not let resync
/// claim a complete pass: the binding's objects count as `denied` and `lastCompleteTime` is never
/// set, run after run, while `lastPassTime` says the run happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_unreadable_provider_list_never_claims_a_complete_resync() {
    let fx = Fx::new("hostile-ilist").await;
    let widgets = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let good = fx.provider_kubeconfig();
    let (url, served, _task) = hostile_provider(
        support::server_of(&good),
        HostileProvider::HugeInstanceList("widgets"),
    )
    .await;
    fx.secret("hostile", "kubeconfig", &support::via(&good, &url))
        .await;
    let conn = fx
        .connection("p", "hostile", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    let http = ["--allow-kubeconfig-field", "http"];
    fx.run(&http);
    assert_eq!(
        cond(&fx.conn(&conn).await.status.unwrap().conditions, "Ready").0,
        "True"
    );
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let consumer: Api<DynamicObject> = Api::namespaced_with(fx.consumer.clone(), &fx.ns, &ar);
    support::eventually("the consumer CRD to serve", || {
        let consumer = consumer.clone();
        let ar = ar.clone();
        async move {
            let o = DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 1}}));
            consumer.create(&PostParams::default(), &o).await.ok()
        }
    })
    .await;
    let cbs: Api<kbind::api::core::ClusterBinding> = Api::all(fx.consumer.clone());
    for round in 1..=2 {
        let summary = fx.pass("resync", &http);
        let st = serde_json::to_value(cbs.get(&cb).await.unwrap().status.unwrap()).unwrap();
        let api = st["boundAPIs"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == json!(widgets)))
            .cloned()
            .unwrap_or_default();
        assert_eq!(api["denied"], json!(1), "round {round}: {st}\n{summary}");
        assert!(
            st["resync"]["lastPassTime"].is_string(),
            "round {round}: {st}"
        );
        assert!(
            st["resync"].get("lastCompleteTime").is_none(),
            "round {round}: a pass that read no provider object claims completion: {st}"
        );
    }
    assert!(served.load(Ordering::SeqCst) >= 2);
}
