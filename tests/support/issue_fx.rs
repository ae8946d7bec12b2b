//! The issuer's side of a test: `kbind issue` run as the admin against the provider, with its
//! own grants namespace and a Grant label passed as --selector (tests run in parallel on the
//! shared servers), and the Export/Grant objects it works from.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kbind::api::iam::Grant;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

use super::fx::Fx;

pub struct Ix {
    pub fx: Fx,
    /// Grants namespace and Lease namespace.
    pub ns: String,
    pub ca_file: std::path::PathBuf,
    pub server: String,
    /// `kbind-test=<fixture label>`: only this test's Grants.
    pub selector: String,
}

impl Ix {
    pub async fn new(prefix: &str) -> Self {
        Self::with(Fx::new(prefix).await).await
    }

    /// [`Ix::new`] for a test whose Grant gets pinned to the suite's one consumer cluster
    /// ([`Fx::pinning`]); it revokes its Grants before it ends.
    pub async fn pinning(prefix: &str) -> Self {
        Self::with(Fx::pinning(prefix).await).await
    }

    /// [`Ix::new`] for a test that needs the shared provider alone ([`Fx::alone`]).
    pub async fn alone(prefix: &str) -> Self {
        Self::with(Fx::alone(prefix).await).await
    }

    async fn with(fx: Fx) -> Self {
        super::kbind_crds(&fx.provider).await;
        super::grant_policies(&fx.provider).await;
        let ns = super::namespace(&fx.provider, "grants").await;
        let admin = fx.provider_kubeconfig();
        let kc = Kubeconfig::from_yaml(&admin).unwrap();
        let cluster = kc.clusters[0].cluster.clone().unwrap();
        let ca = cluster.certificate_authority_data.clone().unwrap();
        let pem: k8s_openapi::ByteString = serde_json::from_value(json!(ca)).unwrap();
        let ca_file = super::temp_file("issue-ca", &String::from_utf8(pem.0).unwrap());
        Self {
            selector: format!("kbind-test={}", fx.label),
            server: cluster.server.clone().unwrap(),
            fx,
            ns,
            ca_file,
        }
    }

    pub fn args<'a>(&'a self, kubeconfig: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec![
            "issue",
            "--kubeconfig",
            kubeconfig,
            "--lease-namespace",
            &self.ns,
            "--grants-namespace",
            &self.ns,
            "--server-url",
            &self.server,
            "--server-ca-file",
            self.ca_file.to_str().unwrap(),
            "--selector",
            &self.selector,
            "-o",
            "json",
        ];
        a.extend_from_slice(extra);
        a
    }

    /// Run the issuer as the admin; returns the summary.
    /// A consumer cluster UID for a heartbeat or an object's label, this test's own: the
    /// issuer checks every exported API for objects labelled with a UID before pinning it, so
    /// two tests (or two runs on one set of servers) naming the same UID would meet each
    /// other's objects.
    pub fn uid(&self, s: &str) -> String {
        format!("{}-{s}", self.fx.label)
    }

    pub fn run(&self, extra: &[&str]) -> Value {
        let admin = self.fx.env.provider.to_str().unwrap().to_string();
        let (code, s, err) = super::kbind(&self.args(&admin, extra));
        assert_eq!(code, 0, "{s}\n{err}");
        s
    }

    pub async fn export(&self, name: &str, apis: &[&str], permissions: Value) {
        let e = json!({"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export",
            "metadata": {"name": name},
            "spec": {"description": "test", "apis": apis.iter().map(|a| json!({"name": a})).collect::<Vec<_>>(), "permissions": permissions}});
        super::apply_object(&self.fx.provider, "exports", &e).await;
    }

    /// What a provider admin adds per exported API for the issuer's deploy identity (the
    /// `kbind-issue` ServiceAccount of this namespace): a ClusterRole with every object verb on
    /// `resources` of this fixture's group, bound directly (no wait for aggregation). Its name,
    /// for [`Ix::remove_grantable`].
    pub async fn grantable(&self, resources: &[&str]) -> String {
        let name = super::unique("grantable");
        let cr: ClusterRole = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"iam.kbind.io/grantable": "true"}},
            "rules": [{"apiGroups": [self.fx.group], "resources": resources,
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]}),
        )
        .unwrap();
        Api::<ClusterRole>::all(self.fx.provider.clone())
            .create(&PostParams::default(), &cr)
            .await
            .unwrap();
        let crb: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "kbind-issue", "namespace": self.ns}]}))
        .unwrap();
        Api::<ClusterRoleBinding>::all(self.fx.provider.clone())
            .create(&PostParams::default(), &crb)
            .await
            .unwrap();
        name
    }

    pub async fn remove_grantable(&self, name: &str) {
        let _ = Api::<ClusterRoleBinding>::all(self.fx.provider.clone())
            .delete(name, &Default::default())
            .await;
        let _ = Api::<ClusterRole>::all(self.fx.provider.clone())
            .delete(name, &Default::default())
            .await;
    }

    /// An exported, namespaced `widgets` CRD of this test's group and an Export `<label>-w` of
    /// it: (the API's name, the Export's name).
    pub async fn widgets_export(&self) -> (String, String) {
        let widgets = self
            .fx
            .provider_crd("widgets", "Namespaced", Some("true"), None)
            .await;
        let export = format!("{}-w", self.fx.label);
        self.export(&export, &[&widgets], json!([])).await;
        (widgets, export)
    }

    /// A Grant whose provider namespace is its own name (unique per test).
    pub async fn grant(&self, name: &str, export: &str, ttl: &str) {
        self.grant_in(name, export, ttl, &[name]).await;
    }

    /// A Grant of `export` into the provider namespaces `namespaces` (`spec.namespaces`).
    pub async fn grant_in(&self, name: &str, export: &str, ttl: &str, namespaces: &[&str]) {
        let g = json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": name, "labels": {"kbind-test": self.fx.label}},
            "spec": {"export": export, "consumer": "team", "tokenTTL": ttl, "namespaces": namespaces}});
        super::apply_object(&self.fx.provider, "grants", &g).await;
    }

    /// The consumer side by hand, as `kbind bind` does it: `grant`'s issued kubeconfig as the
    /// Connection Secret `issued` (annotated with the Grant), and a Connection of it; its name.
    pub async fn issued_connection(&self, grant: &str) -> String {
        let fx = &self.fx;
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "issued", "annotations": {"iam.kbind.io/grant": grant}},
            "stringData": {"kubeconfig": self.kubeconfig(grant).await}}))
        .unwrap();
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(fx.consumer.clone(), &fx.ns)
            .patch(
                "issued",
                &kube::api::PatchParams::apply("test").force(),
                &kube::api::Patch::Apply(&secret),
            )
            .await
            .unwrap();
        fx.connection("p", "issued", json!({"source": "CRD"}), false)
            .await
    }

    /// Which of what `grant` is issued exists, in write order: its identity and RBAC in the
    /// grants namespace, its Secret, its namespace and the RBAC there.
    pub async fn issued(&self, grant: &str) -> [(&'static str, bool); 9] {
        let (p, ns) = (&self.fx.provider, self.ns.as_str());
        let name = format!("kbind-grant-{grant}");
        async fn present<K>(api: Api<K>, name: &str) -> bool
        where
            K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        {
            api.get_opt(name).await.unwrap().is_some()
        }
        use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
        use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
        [
            (
                "ServiceAccount",
                present(Api::<ServiceAccount>::namespaced(p.clone(), ns), &name).await,
            ),
            (
                "ClusterRole",
                present(Api::<ClusterRole>::all(p.clone()), &name).await,
            ),
            (
                "Role",
                present(Api::<Role>::namespaced(p.clone(), ns), &name).await,
            ),
            (
                "ClusterRoleBinding",
                present(Api::<ClusterRoleBinding>::all(p.clone()), &name).await,
            ),
            (
                "RoleBinding",
                present(Api::<RoleBinding>::namespaced(p.clone(), ns), &name).await,
            ),
            (
                "Secret",
                present(Api::<Secret>::namespaced(p.clone(), ns), &name).await,
            ),
            (
                "Namespace",
                present(Api::<Namespace>::all(p.clone()), grant).await,
            ),
            (
                "Role in its namespace",
                present(Api::<Role>::namespaced(p.clone(), grant), &name).await,
            ),
            (
                "RoleBinding in its namespace",
                present(Api::<RoleBinding>::namespaced(p.clone(), grant), &name).await,
            ),
        ]
    }

    /// Delete `grants` and run the issuer, which revokes them; its summary.
    pub async fn revoke(&self, grants: &[&str]) -> Value {
        for g in grants {
            Api::<Grant>::all(self.fx.provider.clone())
                .delete(g, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("delete Grant {g}: {e}"));
        }
        self.run(&[])
    }

    /// Annotate Grant `grant` with `key: value`, as a person approving does.
    pub async fn annotate(&self, grant: &str, key: &str, value: &str) {
        Api::<Grant>::all(self.fx.provider.clone())
            .patch(
                grant,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .unwrap_or_else(|e| panic!("annotate Grant {grant}: {e}"));
    }

    pub async fn get_grant(&self, name: &str) -> Grant {
        Api::<Grant>::all(self.fx.provider.clone())
            .get(name)
            .await
            .unwrap()
    }

    pub async fn secret(&self, grant: &str) -> Secret {
        Api::<Secret>::namespaced(self.fx.provider.clone(), &self.ns)
            .get(&format!("kbind-grant-{grant}"))
            .await
            .unwrap()
    }

    /// The issued kubeconfig of `grant` (text), validated as a Connection Secret would be.
    pub async fn kubeconfig(&self, grant: &str) -> String {
        let s = self.secret(grant).await;
        let policy = kbind::connection::CredentialPolicy::new(&Default::default(), self.ns.clone());
        let pk = kbind::connection::kubeconfig::kubeconfig_from_secret(
            Some(&s),
            &self.ns,
            &format!("kbind-grant-{grant}"),
            "kubeconfig",
            &policy,
        )
        .expect("the issued kubeconfig passes kbind's Connection validation");
        assert_eq!(pk.default_namespace, self.ns);
        String::from_utf8(s.data.unwrap()["kubeconfig"].0.clone()).unwrap()
    }
}

pub async fn client_of(kubeconfig: &str) -> Client {
    let kc = Kubeconfig::from_yaml(kubeconfig).unwrap();
    Client::try_from(
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap(),
    )
    .unwrap()
}

pub fn token_of(kubeconfig: &str) -> String {
    use secrecy::ExposeSecret;
    let kc = Kubeconfig::from_yaml(kubeconfig).unwrap();
    kc.auth_infos[0]
        .auth_info
        .as_ref()
        .unwrap()
        .token
        .as_ref()
        .unwrap()
        .expose_secret()
        .to_string()
}

pub fn api_of(c: &Client, group: &str, plural: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let kind = format!(
        "{}{}",
        plural[..1].to_uppercase(),
        &plural[1..plural.len() - 1]
    );
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", &kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(c.clone(), ns, &ar),
        None => Api::all_with(c.clone(), &ar),
    }
}

pub fn widget(group: &str, name: &str, cluster: Option<&str>) -> DynamicObject {
    let mut w = json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": name}, "spec": {"size": 1}});
    if let Some(c) = cluster {
        w["metadata"]["labels"] = json!({"core.kbind.io/consumer-cluster": c});
    }
    serde_json::from_value(w).unwrap()
}

pub fn status_code(r: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("not an API error: {e}"),
    }
}

/// Poll until `f` gives `want` (admission policies and RBAC take effect a moment after they
/// are written), for up to ~20 s; returns the last code.
pub async fn until_code<F, Fut>(what: &str, want: u16, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u16>,
{
    let mut last = 0;
    for _ in 0..100 {
        last = f().await;
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: wanted {want}, last got {last}");
}

/// The Grant's `Ready` condition, whole (its message too).
pub fn ready_condition(g: &Grant) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    g.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("a Ready condition")
}

pub fn ready(g: &Grant) -> (String, String) {
    let c = g
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    c.map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

/// A heartbeat Lease as kbind resync writes it for a Secret issued for `grant`: named after the
/// Grant, the consumer cluster in a label.
pub fn heartbeat(uid: &str, grant: &str) -> k8s_openapi::api::coordination::v1::Lease {
    serde_json::from_value(json!({"metadata": {"name": format!("kbind-grant-{grant}"),
        "labels": {"iam.kbind.io/grant": grant, "core.kbind.io/consumer-cluster": uid}},
        "spec": {"holderIdentity": format!("kbind-resync/{uid}")}}))
    .unwrap()
}
