//! Fixture for `kbind claims` on a real kcp (`kcp start` of `hack/testenv.sh --kcp`). Each
//! fixture creates its own parent workspace `root:<unique>` and puts the hub and every tenant and
//! provider workspace of its test under it, so tests sharing the one kcp never see each other's
//! bindings (the core export, and so its virtual workspace, is per fixture too). kcp itself
//! decides identity hashes, workspace readiness and its `PermissionClaims*` conditions; the
//! fixture only waits for them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use kbind::api::kcp::{APIBinding, PermissionClaim};
use kbind::api::providers::Requirement;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{Value, json};

use super::{apply_crds, kbind_async_env, unique};

pub const CORE_BINDING: &str = "core";
/// Grants and the pass Lease live in this namespace of the hub workspace.
pub const NS: &str = "kbind-system";

pub struct KcpFx {
    admin: Kubeconfig,
    /// `https://127.0.0.1:<port>`: kcp's server root.
    base: String,
    /// `root:<unique>`: every workspace of this fixture lives under it.
    pub parent: String,
    pub hub_ws: String,
    pub core_export: String,
    kubeconfig: PathBuf,
    _dir: TempDir,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn workspaces() -> ApiResource {
    resource("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces")
}
fn apiexports() -> ApiResource {
    resource("apis.kcp.io", "v1alpha2", "APIExport", "apiexports")
}
fn apibindings() -> ApiResource {
    resource("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings")
}

/// Poll `f` every 250 ms until it returns Some, for at most `secs` seconds: kcp's controllers
/// (workspace scheduling, identity hashes, binding conditions) act asynchronously.
pub async fn within<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kcp: {what} within {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl KcpFx {
    /// A parent workspace, its hub with kbind's CRDs and the namespace [`NS`], and the core
    /// export `core.kbind.io` claiming the tenants' APIBindings (docs/claims.md "Core bindings
    /// and scope").
    pub async fn new(prefix: &str) -> Self {
        kbind::install_crypto_provider();
        let path = std::env::var("KBIND_TEST_KCP_KUBECONFIG")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| {
                panic!(
                    "KBIND_TEST_KCP_KUBECONFIG is not set: kcp is not running. Run the suite \
                     with `hack/test.sh` (it builds and starts kcp)"
                )
            });
        let admin = Kubeconfig::read_from(&path).expect("read kcp's admin kubeconfig");
        let server = admin
            .clusters
            .iter()
            .find_map(|c| c.cluster.as_ref()?.server.clone())
            .expect("kcp admin kubeconfig names a server");
        let base = match server.find("/clusters/") {
            Some(i) => server[..i].to_string(),
            None => server.trim_end_matches('/').to_string(),
        };
        let dir = std::env::temp_dir().join(unique("kcp-fx"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut fx = Self {
            admin,
            base,
            parent: String::new(),
            hub_ws: String::new(),
            core_export: "core.kbind.io".into(),
            kubeconfig: dir.join("hub.kubeconfig"),
            _dir: TempDir(dir),
        };
        fx.parent = fx.workspace("root", prefix).await;
        fx.hub_ws = fx.workspace(&fx.parent, "hub").await;
        let hub = fx.client(&fx.hub_ws).await;
        apply_crds(&hub, &kbind::crds::kbind_crds()).await;
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(hub.clone());
        ns.patch(
            NS,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            ),
        )
        .await
        .expect("namespace in the hub");
        let claim = PermissionClaim {
            group: "apis.kcp.io".into(),
            resource: "apibindings".into(),
            verbs: ["get", "list", "watch", "update", "patch"]
                .map(String::from)
                .to_vec(),
            identity_hash: String::new(),
        };
        fx.export(&fx.hub_ws.clone(), &fx.core_export.clone(), vec![claim])
            .await;
        std::fs::write(&fx.kubeconfig, fx.kubeconfig_for(&fx.hub_ws)).expect("hub kubeconfig");
        fx
    }

    /// kcp's admin kubeconfig with its server at workspace `path`.
    fn kubeconfig_for(&self, path: &str) -> String {
        let mut kc = self.admin.clone();
        for c in &mut kc.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(format!("{}/clusters/{path}", self.base));
            }
        }
        serde_saphyr::to_string(&kc).expect("kubeconfig to YAML")
    }

    /// A kubeconfig of kcp's admin for workspace `path` alone (one cluster, user and context),
    /// as a Connection's Secret holds it.
    pub fn kubeconfig_at(&self, path: &str) -> String {
        let context = self
            .admin
            .current_context
            .clone()
            .expect("kcp admin kubeconfig has a current context");
        let ctx = self
            .admin
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.clone())
            .expect("current context");
        let cluster = self
            .admin
            .clusters
            .iter()
            .find(|c| c.name == ctx.cluster)
            .and_then(|c| c.cluster.clone())
            .expect("current cluster");
        let ca = cluster
            .certificate_authority_data
            .expect("kcp's CA is inline");
        let token = self
            .admin
            .auth_infos
            .iter()
            .find(|u| Some(&u.name) == ctx.user.as_ref())
            .and_then(|u| u.auth_info.as_ref()?.token.clone())
            .map(|t| secrecy::ExposeSecret::expose_secret(&t).to_string())
            .expect("kcp admin token");
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kcp\n  cluster:\n    server: {}/clusters/{path}\n    certificate-authority-data: {ca}\n\
             users:\n- name: admin\n  user:\n    token: {token}\n\
             contexts:\n- name: kcp\n  context: {{cluster: kcp, user: admin}}\ncurrent-context: kcp\n",
            self.base
        )
    }

    /// The URL of workspace `path`, as kcp serves it to clients.
    pub fn url(&self, path: &str) -> String {
        format!("{}/clusters/{path}", self.base)
    }

    /// kcp's serving CA (PEM), for flags that take a CA file.
    pub fn ca_pem(&self) -> String {
        let data = self
            .admin
            .clusters
            .iter()
            .find_map(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
            .expect("kcp's CA is inline");
        let pem: k8s_openapi::ByteString =
            serde_json::from_value(json!(data)).expect("base64 CA data");
        String::from_utf8(pem.0).expect("PEM is text")
    }

    /// An admin client for workspace `path`.
    pub async fn client(&self, path: &str) -> Client {
        let mut config =
            Config::from_custom_kubeconfig(self.admin.clone(), &KubeConfigOptions::default())
                .await
                .expect("kcp admin config");
        config.cluster_url = format!("{}/clusters/{path}", self.base)
            .parse()
            .expect("workspace URL");
        Client::try_from(config).expect("kcp client")
    }

    /// Create workspace `<parent>:<unique(prefix)>` and wait until kcp says it is Ready.
    pub async fn workspace(&self, parent: &str, prefix: &str) -> String {
        self.typed_workspace(parent, prefix, None).await
    }

    /// [`KcpFx::workspace`] of WorkspaceType `(path, name)` when given.
    pub async fn typed_workspace(
        &self,
        parent: &str,
        prefix: &str,
        type_: Option<(&str, &str)>,
    ) -> String {
        let name = unique(prefix);
        let api: Api<DynamicObject> = Api::all_with(self.client(parent).await, &workspaces());
        let mut body = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}});
        if let Some((path, type_name)) = type_ {
            body["spec"] = json!({"type": {"path": path, "name": type_name}});
        }
        api.patch(
            &name,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("create workspace {name} in {parent}: {e}"));
        within(180, &format!("workspace {parent}:{name} Ready"), || async {
            let ws = api.get(&name).await.ok()?;
            (ws.data["status"]["phase"] == "Ready").then_some(())
        })
        .await;
        format!("{parent}:{name}")
    }

    /// WorkspaceType `name` in the parent workspace (extending `root:universal`) binding
    /// `defaults` (`(path, export)`) in each workspace of the type, with `lifecycle`
    /// (`InitializeOnly` or `Maintain`: kcp then keeps rewriting those bindings' claims).
    pub async fn workspace_type(&self, name: &str, defaults: &[(&str, &str)], lifecycle: &str) {
        let api: Api<DynamicObject> = Api::all_with(
            self.client(&self.parent).await,
            &resource(
                "tenancy.kcp.io",
                "v1alpha1",
                "WorkspaceType",
                "workspacetypes",
            ),
        );
        let body = json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "WorkspaceType",
            "metadata": {"name": name},
            "spec": {"extend": {"with": [{"name": "universal", "path": "root"}]},
                "defaultAPIBindings": defaults.iter()
                    .map(|(path, export)| json!({"path": path, "export": export}))
                    .collect::<Vec<_>>(),
                "defaultAPIBindingLifecycle": lifecycle}});
        api.patch(
            name,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("apply WorkspaceType {name}: {e}"));
    }

    /// The APIBindings in `ws` as (name, export name).
    pub async fn bindings(&self, ws: &str) -> Vec<(String, String)> {
        Api::<APIBinding>::all(self.client(ws).await)
            .list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list APIBindings in {ws}: {e}"))
            .items
            .into_iter()
            .map(|b| {
                (
                    kube::ResourceExt::name_any(&b),
                    b.spec.reference.export.name.clone(),
                )
            })
            .collect()
    }

    /// Create or update APIExport `name` in `path` with `claims` and no resources of its own;
    /// returns the identity hash kcp gave it.
    pub async fn export(&self, path: &str, name: &str, claims: Vec<PermissionClaim>) -> String {
        self.export_with(path, name, claims, None).await
    }

    /// APIExport `name` in `path` exporting `group`/`plural` (kind `kind`, namespaced, any
    /// fields) from an APIResourceSchema of its own: what a claim on another export's kinds
    /// refers to, and what kcp needs to apply such a claim once it is Accepted.
    pub async fn resource_export(
        &self,
        path: &str,
        name: &str,
        (group, plural, kind): (&str, &str, &str),
    ) -> String {
        let schema = format!("v1.{plural}.{group}");
        let api: Api<DynamicObject> = Api::all_with(
            self.client(path).await,
            &resource(
                "apis.kcp.io",
                "v1alpha1",
                "APIResourceSchema",
                "apiresourceschemas",
            ),
        );
        let body = json!({"apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": {"name": schema},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"kind": kind, "listKind": format!("{kind}List"), "plural": plural,
                    "singular": kind.to_lowercase()},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}]}});
        api.patch(
            &schema,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("apply APIResourceSchema {schema} in {path}: {e}"));
        let resources = json!([{"group": group, "name": plural, "schema": schema,
            "storage": {"crd": {}}}]);
        self.export_with(path, name, vec![], Some(resources)).await
    }

    async fn export_with(
        &self,
        path: &str,
        name: &str,
        claims: Vec<PermissionClaim>,
        resources: Option<Value>,
    ) -> String {
        let api: Api<DynamicObject> = Api::all_with(self.client(path).await, &apiexports());
        let mut body = json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
            "metadata": {"name": name}, "spec": {"permissionClaims": claims}});
        if let Some(resources) = resources {
            body["spec"]["resources"] = resources;
        }
        api.patch(
            name,
            &PatchParams::apply("kbind-tests").force(),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("apply APIExport {name} in {path}: {e}"));
        within(
            60,
            &format!("APIExport {path}:{name} identityHash"),
            || async {
                let e = api.get(name).await.ok()?;
                let hash = e.data["status"]["identityHash"].as_str()?.to_string();
                (!hash.is_empty()).then_some(hash)
            },
        )
        .await
    }

    /// APIBinding `name` in `ws` to `path:export`, holding no claims: kbind writes them.
    pub async fn bind(&self, ws: &str, name: &str, path: &str, export: &str) {
        let api: Api<DynamicObject> = Api::all_with(self.client(ws).await, &apibindings());
        let body = json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
            "metadata": {"name": name},
            "spec": {"reference": {"export": {"path": path, "name": export}}}});
        api.patch(
            name,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("bind {ws}/{name} to {path}:{export}: {e}"));
    }

    /// A tenant workspace under the parent holding the core binding.
    pub async fn tenant(&self, prefix: &str) -> String {
        let ws = self.workspace(&self.parent, prefix).await;
        self.bind(&ws, CORE_BINDING, &self.hub_ws, &self.core_export)
            .await;
        ws
    }

    pub async fn binding(&self, ws: &str, name: &str) -> APIBinding {
        Api::<APIBinding>::all(self.client(ws).await)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get APIBinding {ws}/{name}: {e}"))
    }

    /// The binding's claims as `group/resource=State`, in the binding's order.
    pub async fn claims(&self, ws: &str, name: &str) -> Vec<String> {
        self.binding(ws, name)
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
                format!("{gr}={:?}", c.state)
            })
            .collect()
    }

    /// Wait until kcp's own condition `type_` on the binding is True *for the claims the binding
    /// holds now*; returns the binding. kcp's conditions carry no observed generation, so a True
    /// could be left from before kbind's write: kcp sets both claims conditions in the pass that
    /// writes `status.appliedPermissionClaims`, so the verdict is taken only once that list is
    /// the spec's `Accepted` claims (kcp applies exactly those when they are valid). A write
    /// that left the `Accepted` claims as they were (only `Rejected` ones changed) can still be
    /// judged by an older verdict; the callers ask for `PermissionClaimsValid` first.
    pub async fn kcp_says_true(&self, ws: &str, name: &str, type_: &str) -> APIBinding {
        let client = self.client(ws).await;
        let typed: Api<APIBinding> = Api::all(client.clone());
        let raw: Api<DynamicObject> = Api::all_with(client, &apibindings());
        within(
            60,
            &format!("{ws}/{name} {type_}=True for its current claims"),
            || async {
                let b = raw.get(name).await.ok()?;
                let accepted: BTreeSet<String> = b.data["spec"]["permissionClaims"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter(|c| c["state"] == "Accepted")
                    .map(|c| {
                        let mut c = c.clone();
                        c.as_object_mut()?.remove("state");
                        Some(c.to_string())
                    })
                    .collect::<Option<_>>()?;
                let applied: BTreeSet<String> = b.data["status"]["appliedPermissionClaims"]
                    .as_array()
                    .map(|a| a.iter().map(Value::to_string).collect())
                    .unwrap_or_default();
                let verdict = b.data["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == type_ && c["status"] == "True");
                if !(verdict && accepted == applied) {
                    return None;
                }
                typed.get(name).await.ok()
            },
        )
        .await
    }

    /// Run `kbind claims` until binding `ws/name` holds `want` (as [`KcpFx::claims`] renders
    /// them), within 120 s: kcp shows an opened workspace's bindings in the virtual workspace
    /// asynchronously, so a binding it had not shown yet is written by a later run.
    pub async fn reconciled(&self, ws: &str, name: &str, want: &[String]) {
        within(120, &format!("{ws}/{name} holds {want:?}"), || async {
            if self.claims(ws, name).await == *want {
                return Some(());
            }
            self.run().await;
            None
        })
        .await
    }

    /// The `kcp.io/cluster` name of workspace `ws` (what a Grant's `spec.workspace` holds).
    pub async fn logical_cluster(&self, ws: &str) -> String {
        let api: Api<DynamicObject> = Api::all_with(
            self.client(ws).await,
            &resource(
                "core.kcp.io",
                "v1alpha1",
                "LogicalCluster",
                "logicalclusters",
            ),
        );
        let lc = api
            .get("cluster")
            .await
            .unwrap_or_else(|e| panic!("LogicalCluster of {ws}: {e}"));
        lc.metadata
            .annotations
            .and_then(|a| a.get("kcp.io/cluster").cloned())
            .unwrap_or_else(|| panic!("LogicalCluster of {ws} has no kcp.io/cluster"))
    }

    /// CatalogEntry `name` in the hub for export `path:export` (a platform provider).
    pub async fn entry(&self, name: &str, path: &str, export: &str, requires: Vec<Requirement>) {
        self.entry_in_org(name, path, export, requires, None).await
    }

    /// [`KcpFx::entry`] owned by `org` (`spec.org`) when given.
    pub async fn entry_in_org(
        &self,
        name: &str,
        path: &str,
        export: &str,
        requires: Vec<Requirement>,
        org: Option<&str>,
    ) {
        let api: Api<kbind::api::providers::CatalogEntry> =
            Api::all(self.client(&self.hub_ws).await);
        let mut body = json!({"apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
            "metadata": {"name": name},
            "spec": {"export": {"path": path, "name": export}, "requires": requires}});
        if let Some(org) = org {
            body["spec"]["org"] = json!(org);
        }
        api.patch(
            name,
            &PatchParams::apply("kbind-tests").force(),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CatalogEntry {name}: {e}"));
    }

    pub async fn catalog_entry(&self, name: &str) -> kbind::api::providers::CatalogEntry {
        Api::all(self.client(&self.hub_ws).await)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get CatalogEntry {name}: {e}"))
    }

    /// Grant `name`: workspace `logical_cluster` consents to `provider`'s compositions.
    pub async fn grant(
        &self,
        name: &str,
        logical_cluster: &str,
        provider: &str,
        compositions: &[(&str, &str)],
    ) {
        let api: Api<kbind::api::providers::Grant> =
            Api::namespaced(self.client(&self.hub_ws).await, NS);
        let body = json!({"apiVersion": "tenancy.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": name},
            "spec": {"workspace": logical_cluster, "provider": provider,
                "compositions": compositions.iter()
                    .map(|(g, r)| json!({"group": g, "resource": r})).collect::<Vec<_>>()}});
        api.patch(
            name,
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(body),
        )
        .await
        .unwrap_or_else(|e| panic!("apply Grant {name}: {e}"));
    }

    pub async fn revoke(&self, name: &str) {
        let api: Api<kbind::api::providers::Grant> =
            Api::namespaced(self.client(&self.hub_ws).await, NS);
        api.delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete Grant {name}: {e}"));
    }

    /// `kbind claims` for this fixture's hub: the core export configured, Grants in [`NS`].
    fn args(&self) -> Vec<String> {
        [
            "claims",
            "--kubeconfig",
            &self.kubeconfig.to_string_lossy(),
            "--lease-namespace",
            NS,
            "--core-export",
            &self.core_export,
            "--core-export-path",
            &self.hub_ws,
            "--core-binding",
            CORE_BINDING,
            "--grant-namespace",
            NS,
            "-o",
            "json",
        ]
        .map(String::from)
        .to_vec()
    }

    /// One pass; it must exit 0. Returns its summary.
    pub async fn run(&self) -> Value {
        self.run_with(&[]).await
    }

    /// [`KcpFx::run`] with `extra` flags (`--dry-run`, `--max-items N`).
    pub async fn run_with(&self, extra: &[&str]) -> Value {
        let (code, summary, stderr) = self.run_env(extra, &[]).await;
        assert_eq!(code, 0, "kbind claims failed: {summary}\n{stderr}");
        summary
    }

    /// One pass with `extra` flags and environment `envs`, whatever its exit: (exit code,
    /// summary, stderr).
    pub async fn run_env(&self, extra: &[&str], envs: &[(&str, &str)]) -> (i32, Value, String) {
        let args = self.args();
        let mut refs: Vec<&str> = args.iter().map(String::as_str).collect();
        refs.extend_from_slice(extra);
        kbind_async_env(&refs, envs).await
    }

    pub fn kubeconfig(&self) -> String {
        self.kubeconfig.to_string_lossy().to_string()
    }
}
