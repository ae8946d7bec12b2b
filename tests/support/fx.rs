//! A fixture for pass tests: its own API group, Connection label (passed as --selector) and
//! namespace, so tests run in parallel on the shared servers without seeing each other.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::{Binding, ClusterBinding, Connection};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super as support;
use support::hold::ProviderHold;

pub struct Fx {
    pub env: support::Env,
    pub consumer: Client,
    pub provider: Client,
    pub group: String,
    pub label: String,
    pub ns: String,
    /// Its hold on the shared provider (tests/support/hold.rs).
    _hold: ProviderHold,
}

impl Fx {
    pub async fn new(prefix: &str) -> Self {
        Self::holding(prefix, ProviderHold::shared()).await
    }

    /// A fixture whose test needs the shared provider alone ([`ProviderHold::alone`]): one
    /// that pulls every export of it, or exports a CRD no client can decode.
    pub async fn alone(prefix: &str) -> Self {
        Self::holding(prefix, ProviderHold::alone()).await
    }

    /// A fixture whose test pins the suite's one consumer cluster to a Grant: it runs while no
    /// other test can have provider copies of that cluster ([`ProviderHold::pinning`]).
    pub async fn pinning(prefix: &str) -> Self {
        let env = support::env();
        let hold = ProviderHold::pinning(&env.provider().await, &env.consumer().await).await;
        Self::holding(prefix, hold).await
    }

    async fn holding(prefix: &str, hold: ProviderHold) -> Self {
        let env = support::env();
        let consumer = env.consumer().await;
        let provider = env.provider().await;
        support::kbind_crds(&consumer).await;
        let ns = support::namespace(&consumer, prefix).await;
        let id = support::unique(prefix);
        Self {
            group: format!("{id}.kbind.test"),
            label: id,
            ns,
            env,
            consumer,
            provider,
            _hold: hold,
        }
    }

    /// A provider CRD `<plural>.<group>`, labelled `exported=<label>` when given.
    pub async fn provider_crd(
        &self,
        plural: &str,
        scope: &str,
        exported: Option<&str>,
        extra_prop: Option<&str>,
    ) -> String {
        let crd = self.crd(plural, scope, exported, extra_prop);
        support::apply_crds(&self.provider, std::slice::from_ref(&crd)).await;
        format!("{plural}.{}", self.group)
    }

    /// The CRD [`Fx::provider_crd`] applies, for a provider elsewhere (a kcp workspace).
    pub fn crd(
        &self,
        plural: &str,
        scope: &str,
        exported: Option<&str>,
        extra_prop: Option<&str>,
    ) -> CustomResourceDefinition {
        let kind = format!(
            "{}{}",
            plural[..1].to_uppercase(),
            &plural[1..plural.len() - 1]
        );
        let mut props = json!({"size": {"type": "integer"}});
        if let Some(p) = extra_prop {
            props[p] = json!({"type": "string"});
        }
        let mut crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{}", self.group)},
            "spec": {"group": self.group, "scope": scope,
                "names": {"plural": plural, "kind": kind, "singular": &plural[..plural.len() - 1]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": props},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
        if let Some(v) = exported {
            crd["metadata"]["labels"] = json!({"core.kbind.io/exported": v});
        }
        serde_json::from_value(crd).unwrap()
    }

    pub async fn secret(&self, name: &str, key: &str, data: &str) {
        let s = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([(key.to_string(), data.to_string())])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.consumer.clone(), &self.ns)
            .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(&s))
            .await
            .unwrap();
    }

    pub fn provider_kubeconfig(&self) -> String {
        std::fs::read_to_string(&self.env.provider).unwrap()
    }

    pub async fn connection(
        &self,
        name: &str,
        secret: &str,
        schema: Value,
        auto_bind: bool,
    ) -> String {
        let name = format!("{}-{name}", self.label);
        let c = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "metadata": {"name": name, "labels": {"kbind-test": self.label}},
            "spec": {"kubeconfigSecretRef": {"namespace": self.ns, "name": secret}, "schema": schema, "autoBind": auto_bind,
                // The fixture's own namespace, where its Bindings live (docs/schema.md).
                "bindingNamespaces": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}}}});
        let c: Connection = serde_json::from_value(c).unwrap();
        Api::<Connection>::all(self.consumer.clone())
            .create(&PostParams::default(), &c)
            .await
            .unwrap();
        name
    }

    pub async fn cluster_binding(&self, name: &str, connection: &str, apis: &[&str]) -> String {
        let name = format!("{}-{name}", self.label);
        let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding", "metadata": {"name": name, "labels": {"kbind-test": self.label}},
            "spec": {"connectionRef": {"name": connection}, "apis": apis.iter().map(|a| json!({"name": a})).collect::<Vec<_>>()}});
        Api::<ClusterBinding>::all(self.consumer.clone())
            .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
            .await
            .unwrap();
        name
    }

    pub async fn binding(&self, name: &str, connection: &str, apis: &[&str]) -> String {
        self.binding_in(&self.ns, name, connection, apis, json!({}))
            .await
    }

    /// A Binding `name` in namespace `ns` (labelled for this fixture's runs), `spec` merged in.
    pub async fn binding_in(
        &self,
        ns: &str,
        name: &str,
        connection: &str,
        apis: &[&str],
        spec: Value,
    ) -> String {
        let mut b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Binding", "metadata": {"name": name, "namespace": ns, "labels": {"kbind-test": self.label}},
            "spec": {"connectionRef": {"name": connection}, "apis": apis.iter().map(|a| json!({"name": a})).collect::<Vec<_>>()}});
        if let (Some(to), Some(from)) = (b["spec"].as_object_mut(), spec.as_object()) {
            to.extend(from.clone());
        }
        Api::<Binding>::namespaced(self.consumer.clone(), ns)
            .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
            .await
            .unwrap();
        name.to_string()
    }

    /// `kbind schema` on this fixture's Connections (its label selector, Lease namespace).
    pub fn run(&self, extra: &[&str]) -> Value {
        self.pass("schema", extra)
    }

    /// Run pass `name` with the real binary, limited to this fixture's objects; it must exit 0.
    pub fn pass(&self, name: &str, extra: &[&str]) -> Value {
        let (code, summary, stderr) = self.try_pass(name, extra);
        assert_eq!(code, 0, "kbind {name} failed: {summary}\n{stderr}");
        summary
    }

    /// Run pass `name` until `done` holds after a run, at most `tries` times (a pause between):
    /// for what settles a run or two after it is asked for (a pin reaching the apiserver). Panics
    /// naming `what` when it never does.
    pub async fn pass_until<F, Fut>(&self, name: &str, what: &str, tries: usize, mut done: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        for _ in 0..tries {
            self.pass(name, &[]);
            if done().await {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        }
        panic!("after {tries} {name} runs: {what}");
    }

    /// [`Fx::try_pass`] off the async runtime's threads, for tests whose servers run on it.
    pub async fn try_pass_async(&self, name: &str, extra: &[&str]) -> (i32, Value, String) {
        support::kbind_async(
            &self
                .args(name, extra)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .await
    }

    /// [`Fx::try_pass`] with extra environment variables (a crash knob).
    pub fn try_pass_env(
        &self,
        name: &str,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> (i32, Value, String) {
        let args = self.args(name, extra);
        let mut cmd = support::kbind_command(&args.iter().map(String::as_str).collect::<Vec<_>>());
        cmd.envs(envs.iter().copied());
        support::outcome(cmd.output().expect("run kbind"))
    }

    /// [`Fx::pass`] without blocking the test's runtime: for a pass that runs while the test
    /// does something else (the other pass of the same CronJob tick).
    pub async fn pass_async(&self, name: &str, extra: &[&str]) -> Value {
        let args = self.args(name, extra);
        let (code, summary, stderr) =
            support::kbind_async(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
        assert_eq!(code, 0, "kbind {name} failed: {summary}\n{stderr}");
        summary
    }

    /// Run pass `name` like [`Fx::pass`], whatever its exit code: (code, summary, stderr).
    pub fn try_pass(&self, name: &str, extra: &[&str]) -> (i32, Value, String) {
        support::kbind(
            &self
                .args(name, extra)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    }

    /// The command line of pass `name` limited to this fixture's objects, then `extra`. The
    /// fixture's namespace holds its Lease and, for schema and resync, its Connection Secrets
    /// (`--credential-namespace`: the default is the install namespace, never the Lease's).
    fn args(&self, name: &str, extra: &[&str]) -> Vec<String> {
        let selector = format!("kbind-test={}", self.label);
        let kc = self.env.consumer.to_string_lossy().to_string();
        let mut args = vec![
            name,
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            &self.ns,
            "--selector",
            &selector,
            "-o",
            "json",
        ];
        if ["schema", "resync"].contains(&name) {
            args.extend(["--credential-namespace", &self.ns]);
        }
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect()
    }

    pub async fn conn(&self, name: &str) -> Connection {
        Api::<Connection>::all(self.consumer.clone())
            .get(name)
            .await
            .unwrap()
    }

    /// Whether `connection` installed the consumer CRD `api`. Tests assert this rather than
    /// absence: a concurrent test's pullPolicy All Connection installs every export on the
    /// shared provider, other tests' included.
    pub async fn installed_by(&self, api: &str, connection: &str) -> bool {
        self.consumer_crd(api).await.is_some_and(|c| {
            c.metadata
                .annotations
                .unwrap_or_default()
                .get("core.kbind.io/connection")
                .map(String::as_str)
                == Some(connection)
        })
    }

    pub async fn consumer_crd(&self, name: &str) -> Option<CustomResourceDefinition> {
        Api::<CustomResourceDefinition>::all(self.consumer.clone())
            .get_opt(name)
            .await
            .unwrap()
    }
}

impl Fx {
    /// A provider API `<plural>.<group>` exported, the provider Secret and a Connection `p` to it
    /// (CRD source), nothing bound yet. Returns (api, connection).
    pub async fn exported(&self, plural: &str, scope: &str) -> (String, String) {
        let api = self.provider_crd(plural, scope, Some("true"), None).await;
        self.secret("provider", "kubeconfig", &self.provider_kubeconfig())
            .await;
        let conn = self
            .connection("p", "provider", json!({"source": "CRD"}), false)
            .await;
        (api, conn)
    }

    /// A provider API `<plural>.<group>` exported, pulled and bound: the provider Secret, a
    /// Connection `p` (CRD source), a ClusterBinding `cb`, one `kbind schema` run, and the
    /// consumer CRD Established. Returns (api, connection, binding).
    pub async fn bound_api(&self, plural: &str, scope: &str) -> (String, String, String) {
        let (api, conn) = self.exported(plural, scope).await;
        let cb = self.cluster_binding("cb", &conn, &[&api]).await;
        self.run(&[]);
        support::wait_established(&Api::all(self.consumer.clone()), &api).await;
        (api, conn, cb)
    }

    /// Run again with nothing changed by this test: no data writes, and no bookkeeping beyond the
    /// Lease unless the provider's export list moved (other tests share the provider).
    pub async fn assert_unchanged_pass(&self, conn: &str) {
        let before = self
            .conn(conn)
            .await
            .status
            .unwrap_or_default()
            .exported_apis;
        let s = self.run(&[]);
        assert_eq!(s["data_writes"], 0, "unchanged pass: {s}");
        let after = self
            .conn(conn)
            .await
            .status
            .unwrap_or_default()
            .exported_apis;
        if before == after {
            assert_eq!(
                s["bookkeeping_writes"], 2,
                "Lease take and release only: {s}"
            );
        }
    }
}

/// Whether `conds` has condition `t` with `status`.
pub fn holds(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
    status: &str,
) -> bool {
    conds.iter().any(|c| c.type_ == t && c.status == status)
}

pub fn cond<'a>(
    conds: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> (&'a str, &'a str, &'a str) {
    let c = conds
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {conds:?}"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}
