//! Fixture for `kbind claims`: the provider apiserver (with kbind's kcp CRDs) stands for a kcp
//! hub behind the local kcp front (`kbind_testkit::kcp`), so the pass runs its kcp code path:
//! workspace URLs, the core export's virtual workspace, per-workspace writes. Names are unique
//! per test, and the pass is limited to this fixture's CatalogEntries by a label.

use std::path::PathBuf;

use kbind::api::kcp::{APIBinding, APIExport, AcceptablePermissionClaim, PermissionClaim};
use kbind::api::providers::{CatalogEntry, Grant, Requirement};
use kbind_testkit::{Running, kcp};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::{Env, env, kbind_async, kbind_async_env, namespace, unique};

pub const CORE_BINDING: &str = "core";

pub struct ClaimsFx {
    pub env: Env,
    /// The upstream apiserver (admin).
    pub hub: Client,
    pub label: String,
    /// Grants and the pass Lease live here.
    pub ns: String,
    pub hub_ws: String,
    pub core_export: String,
    /// The core export's `status.identityHash`: claims carrying it are a provider's own.
    pub core_identity: String,
    pub front: Running<kcp::KcpState>,
    kubeconfig: PathBuf,
    _dir: tempdir::Dir,
}

/// A tiny self-cleaning temp dir (the tests need one file).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// CatalogEntry `entry`'s condition `type_` as (status, reason, message); panics naming the
/// entry when it has none.
pub fn entry_condition(entry: &CatalogEntry, type_: &str) -> (String, String, String) {
    let c = entry
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
        .unwrap_or_else(|| {
            panic!(
                "no {type_} condition on {}",
                kube::ResourceExt::name_any(entry)
            )
        });
    (c.status, c.reason, c.message)
}

pub fn claim(gr: &str, verbs: &[&str], hash: &str) -> PermissionClaim {
    let (group, resource) = gr.split_once('/').unwrap_or(("", gr));
    PermissionClaim {
        group: group.into(),
        resource: resource.into(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        identity_hash: hash.into(),
    }
}

pub fn req(group: &str, resource: &str, provider: Option<&str>) -> Requirement {
    Requirement {
        group: group.into(),
        resource: resource.into(),
        provider: provider.map(String::from),
    }
}

/// The core export's own claim: what opens a workspace's bindings to the hub.
pub fn apibindings_claim() -> PermissionClaim {
    claim(
        "apis.kcp.io/apibindings",
        &["get", "list", "watch", "update", "patch"],
        "",
    )
}

impl ClaimsFx {
    pub async fn new(prefix: &str) -> Self {
        let env = env();
        let hub = env.provider().await;
        super::kbind_crds(&hub).await;
        // Not LogicalCluster: its presence makes `kbind schema` read cluster identity from it,
        // which the provider identities of other tests may not do.
        let kcp: Vec<_> = kbind::crds::kcp_crds()
            .into_iter()
            .filter(|c| c.spec.group == "apis.kcp.io")
            .collect();
        super::apply_crds(&hub, &kcp).await;
        let ns = namespace(&hub, prefix).await;
        let label = unique(prefix);
        let hub_ws = format!("root:{}", unique("hub"));
        let core_export = format!("core.{}.io", unique("c"));
        let core_identity = unique("h-core");
        let front = kcp::start(hub.clone(), &hub_ws, 0)
            .await
            .expect("start kcp front");
        let dir = std::env::temp_dir().join(unique("claims-fx"));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, hub_kubeconfig(&front.url(), &hub_ws)).unwrap();
        let fx = Self {
            env,
            hub,
            label,
            ns,
            hub_ws: hub_ws.clone(),
            core_export: core_export.clone(),
            core_identity: core_identity.clone(),
            front,
            kubeconfig,
            _dir: tempdir::Dir(dir),
        };
        fx.export(
            &hub_ws,
            &core_export,
            vec![apibindings_claim()],
            &core_identity,
        )
        .await;
        fx.endpoint_slice(&fx.front.url()).await;
        fx
    }

    /// Send every kbind request through `base` (e.g. a fault proxy in front of the kcp front):
    /// the kubeconfig and the core export's endpoint slice both point at it.
    pub async fn route_through(&mut self, base: &str) {
        self.endpoint_slice(base).await;
        let path = self._dir.0.join(unique("kubeconfig"));
        std::fs::write(&path, hub_kubeconfig(base, &self.hub_ws)).unwrap();
        self.kubeconfig = path;
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>,
    {
        Api::all(self.hub.clone())
    }

    /// The core export's endpoint slice, pointing at the virtual workspace served at `base`.
    async fn endpoint_slice(&self, base: &str) {
        let name = kcp::upstream_name(&self.hub_ws, &self.core_export);
        let api: Api<DynamicObject> = Api::all_with(
            self.hub.clone(),
            &kube::api::ApiResource {
                group: "apis.kcp.io".into(),
                version: "v1alpha1".into(),
                api_version: "apis.kcp.io/v1alpha1".into(),
                kind: "APIExportEndpointSlice".into(),
                plural: "apiexportendpointslices".into(),
            },
        );
        let body = json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExportEndpointSlice",
            "metadata": {"name": name, "annotations": {kcp::CLUSTER_ANNOTATION: self.hub_ws}},
            "spec": {"export": {"path": self.hub_ws, "name": self.core_export}},
        });
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
        let url = format!(
            "{base}/services/apiexport/{}/{}",
            self.hub_ws, self.core_export
        );
        let status = json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIExportEndpointSlice",
            "status": {"endpoints": [{"url": url}]}});
        api.patch_status(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    }

    /// Create or update APIExport `name` in workspace `path` with these claims.
    pub async fn export(
        &self,
        path: &str,
        name: &str,
        claims: Vec<PermissionClaim>,
        identity: &str,
    ) {
        let up = kcp::upstream_name(path, name);
        let body = json!({
            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
            "metadata": {"name": up, "annotations": {kcp::CLUSTER_ANNOTATION: path}},
            "spec": {"permissionClaims": claims},
        });
        let api: Api<APIExport> = self.api();
        api.patch(
            &up,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
        let status = json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
            "status": {"identityHash": identity}});
        api.patch_status(
            &up,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    }

    /// A tenant workspace holding the core binding (with no claims accepted yet).
    pub async fn workspace(&self, prefix: &str) -> String {
        let ws = unique(prefix);
        self.binding(
            &ws,
            CORE_BINDING,
            &self.hub_ws.clone(),
            &self.core_export.clone(),
            vec![],
        )
        .await;
        ws
    }

    /// A provider's export in its own workspace: configmaps and secrets (builtins) and a
    /// composition target `storage.io/volumes`. Returns (workspace path, export name).
    pub async fn provider(&self) -> (String, String) {
        let path = format!("root:{}", unique("prov"));
        let name = format!("{}.example.io", unique("p"));
        self.export(
            &path,
            &name,
            vec![
                claim("configmaps", &["get", "list"], ""),
                claim("secrets", &["get"], ""),
                claim("storage.io/volumes", &["get", "list"], "h-storage"),
            ],
            "h-self",
        )
        .await;
        (path, name)
    }

    /// `n` tenant workspaces (each opened with its core binding), each with an APIBinding
    /// `compute` to `path:export` holding no claims yet.
    pub async fn tenants(&self, n: usize, path: &str, export: &str) -> Vec<String> {
        let mut workspaces = Vec::new();
        for i in 0..n {
            let ws = self.workspace(&format!("w{i}")).await;
            self.binding(&ws, "compute", path, export, vec![]).await;
            workspaces.push(ws);
        }
        workspaces
    }

    /// Create APIBinding `name` in workspace `ws` to export `path:export` with `claims`.
    pub async fn binding(
        &self,
        ws: &str,
        name: &str,
        path: &str,
        export: &str,
        claims: Vec<AcceptablePermissionClaim>,
    ) {
        let body = json!({
            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
            "metadata": {"name": kcp::upstream_name(ws, name), "annotations": {kcp::CLUSTER_ANNOTATION: ws}},
            "spec": {"reference": {"export": {"path": path, "name": export}}, "permissionClaims": claims},
        });
        self.api::<APIBinding>()
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
    }

    pub async fn get_binding(&self, ws: &str, name: &str) -> APIBinding {
        self.api::<APIBinding>()
            .get(&kcp::upstream_name(ws, name))
            .await
            .unwrap()
    }

    /// The binding's claims as `(group/resource, state)` pairs, sorted.
    pub async fn claims(&self, ws: &str, name: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .get_binding(ws, name)
            .await
            .spec
            .permission_claims
            .iter()
            .map(|c| {
                let gr = if c.group.is_empty() {
                    c.resource.clone()
                } else {
                    format!("{}/{}", c.group, c.resource)
                };
                (gr, format!("{:?}", c.state))
            })
            .collect();
        out.sort();
        out
    }

    /// A CatalogEntry labelled for this fixture (a platform provider: no `spec.org`).
    pub async fn entry(&self, name: &str, path: &str, export: &str, requires: Vec<Requirement>) {
        self.entry_in_org(name, path, export, requires, None).await
    }

    /// [`ClaimsFx::entry`] owned by `org` (`spec.org`) when given.
    pub async fn entry_in_org(
        &self,
        name: &str,
        path: &str,
        export: &str,
        requires: Vec<Requirement>,
        org: Option<&str>,
    ) {
        let mut body = json!({
            "apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
            "metadata": {"name": name, "labels": {"kbind-test": self.label}},
            "spec": {"export": {"path": path, "name": export}, "requires": requires},
        });
        if let Some(org) = org {
            body["spec"]["org"] = json!(org);
        }
        self.api::<CatalogEntry>()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    pub async fn catalog_entry(&self, name: &str) -> CatalogEntry {
        self.api::<CatalogEntry>().get(name).await.unwrap()
    }

    /// Record workspace `ws`'s consent to `provider`'s compositions.
    pub async fn grant(&self, ws: &str, provider: &str, compositions: &[(&str, &str)]) {
        let name = unique("grant");
        let body = json!({
            "apiVersion": "tenancy.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": name},
            "spec": {"workspace": ws, "provider": provider,
                "compositions": compositions.iter().map(|(g, r)| json!({"group": g, "resource": r})).collect::<Vec<_>>()},
        });
        Api::<Grant>::namespaced(self.hub.clone(), &self.ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
    }

    /// The `kbind claims` arguments for this fixture, with the Grant store configured.
    pub fn args(&self) -> Vec<String> {
        let selector = format!("kbind-test={}", self.label);
        [
            "claims",
            "--kubeconfig",
            &self.kubeconfig.to_string_lossy(),
            "--lease-namespace",
            &self.ns,
            "--selector",
            &selector,
            "--core-export",
            &self.core_export,
            "--core-export-path",
            &self.hub_ws,
            "--core-binding",
            CORE_BINDING,
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Run a pass (Grant store configured unless `extra` says otherwise); it must exit 0.
    pub async fn run(&self, extra: &[&str]) -> Value {
        let mut args = self.args();
        if !extra.contains(&"--no-grants") {
            args.extend(["--grant-namespace".to_string(), self.ns.clone()]);
        }
        args.extend(
            extra
                .iter()
                .filter(|a| **a != "--no-grants")
                .map(|s| s.to_string()),
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, summary, stderr) = kbind_async(&refs).await;
        assert_eq!(code, 0, "kbind claims failed: {summary}\n{stderr}");
        summary
    }

    /// A pass with its Lease in `lease_ns` and extra environment, whatever its exit code (a
    /// crashed run keeps its Lease until it expires, so a rerun needs another namespace),
    /// writing one binding at a time (crash point n is the same write on every run).
    pub async fn run_with(&self, lease_ns: &str, envs: &[(&str, &str)]) -> (i32, Value, String) {
        let mut args = self.args();
        let at = args
            .iter()
            .position(|a| a == "--lease-namespace")
            .unwrap_or(0);
        args[at + 1] = lease_ns.to_string();
        args.extend(["--grant-namespace".to_string(), self.ns.clone()]);
        args.extend(["--write-concurrency".to_string(), "1".to_string()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        kbind_async_env(&refs, envs).await
    }

    pub fn kubeconfig(&self) -> String {
        self.kubeconfig.to_string_lossy().to_string()
    }
}

/// A kubeconfig for the hub workspace served at `base` (the fake does not check the token).
fn hub_kubeconfig(base: &str, hub_ws: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: {base}/clusters/{hub_ws}\n\
         users:\n- name: kbind\n  user:\n    token: not-checked-by-the-fake\n\
         contexts:\n- name: hub\n  context: {{cluster: hub, user: kbind}}\ncurrent-context: hub\n"
    )
}

/// Claims as the fixture writes them onto a binding.
pub fn held(gr: &str, verbs: &[&str], hash: &str, state: &str) -> AcceptablePermissionClaim {
    let c = claim(gr, verbs, hash);
    serde_json::from_value(json!({
        "group": c.group, "resource": c.resource, "verbs": c.verbs, "identityHash": c.identity_hash,
        "selector": {"matchAll": true}, "state": state,
    }))
    .unwrap()
}
