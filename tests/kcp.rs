//! `kbind claims` on a real kcp (docs/claims.md, docs/testing.md "Real kcp"): real workspaces,
//! the core export's virtual workspace, identity hashes kcp computed, and kcp's own verdict
//! (`PermissionClaimsValid`, `PermissionClaimsApplied`) on every binding kbind wrote.

use crate::support;

use kbind::api::kcp::PermissionClaim;
use kbind::api::providers::Requirement;
use support::claims_fx::entry_condition;
use support::kcp_fx::{CORE_BINDING, KcpFx, within};
use support::unique;

fn claim(group: &str, resource: &str, verbs: &[&str], identity_hash: &str) -> PermissionClaim {
    PermissionClaim {
        group: group.into(),
        resource: resource.into(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        identity_hash: identity_hash.into(),
    }
}

fn req(group: &str, resource: &str, provider: Option<&str>) -> Requirement {
    Requirement {
        group: group.into(),
        resource: resource.into(),
        provider: provider.map(String::from),
    }
}

/// The kind a storage provider exports and a compute provider composes.
const VOLUMES: (&str, &str, &str) = ("storage.example.io", "volumes", "Volume");

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// kcp accepts what kbind wrote: both of its claims conditions True on the binding.
async fn kcp_accepts(fx: &KcpFx, ws: &str) {
    kcp_accepts_binding(fx, ws, "compute").await;
}

/// [`kcp_accepts`] for binding `name`.
async fn kcp_accepts_binding(fx: &KcpFx, ws: &str, name: &str) {
    for type_ in ["PermissionClaimsValid", "PermissionClaimsApplied"] {
        fx.kcp_says_true(ws, name, type_).await;
    }
}

/// A storage provider (an export whose identity makes `volumes` a composition) and a compute
/// provider claiming configmaps, secrets and storage's volumes with storage's real identity
/// hash; returns (compute path, compute export, storage entry name, storage identity, storage
/// path).
async fn providers(fx: &KcpFx) -> (String, String, String, String, String) {
    let storage_ws = fx.workspace(&fx.parent, "storage").await;
    let storage = fx
        .resource_export(&storage_ws, "storage.example.io", VOLUMES)
        .await;
    let storage_entry = unique("storage");
    fx.entry(&storage_entry, &storage_ws, "storage.example.io", vec![])
        .await;
    let compute_ws = fx.workspace(&fx.parent, "prov").await;
    fx.export(
        &compute_ws,
        "compute.example.io",
        vec![
            claim("", "configmaps", &["get", "list"], ""),
            claim("", "secrets", &["get"], ""),
            claim("storage.example.io", "volumes", &["get", "list"], &storage),
        ],
    )
    .await;
    (
        compute_ws,
        "compute.example.io".into(),
        storage_entry,
        storage,
        storage_ws,
    )
}

/// The requirement change reaches every tenant holding the core binding, kcp accepts each
/// binding as written, a tenant's `Rejected` survives, consent recorded by a Grant turns the
/// composition `Accepted` and revoking it turns it back, and an unchanged run writes nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn requirements_reach_every_tenant_and_kcp_accepts_what_kbind_wrote() {
    let fx = KcpFx::new("kt-req").await;
    let (path, export, storage_entry, storage, storage_path) = providers(&fx).await;
    let t1 = fx.tenant("t1").await;
    let t2 = fx.tenant("t2").await;
    // Bound to compute but not to the core export: out of kbind's scope.
    let t3 = fx.workspace(&fx.parent, "t3").await;
    for ws in [&t1, &t2, &t3] {
        fx.bind(ws, "compute", &path, &export).await;
        fx.bind(ws, "storage", &storage_path, "storage.example.io")
            .await;
    }
    let entry = unique("compute");
    let mut requires = vec![
        req("", "configmaps", None),
        req("storage.example.io", "volumes", Some(&storage_entry)),
    ];
    fx.entry(&entry, &path, &export, requires.clone()).await;

    // The first run opens t1 and t2 (their core bindings) and writes their compute bindings;
    // kcp lists the opened workspaces' bindings in the virtual workspace asynchronously, so a
    // binding it had not shown yet is written by the next run.
    let want = strings(&["configmaps=Accepted", "storage.example.io/volumes=Rejected"]);
    for ws in [&t1, &t2] {
        fx.reconciled(ws, "compute", &want).await;
        kcp_accepts(&fx, ws).await;
        let b = fx.binding(ws, "compute").await;
        let volumes = b
            .spec
            .permission_claims
            .iter()
            .find(|c| c.resource == "volumes")
            .expect("volumes claim");
        assert_eq!(volumes.identity_hash, storage, "kcp's identity hash copied");
        assert_eq!(volumes.verbs, ["get", "list"], "the export's verbs copied");
        assert_eq!(
            fx.claims(ws, CORE_BINDING).await,
            strings(&["apis.kcp.io/apibindings=Accepted"]),
            "the core binding accepted the core export's claims"
        );
        kcp_accepts_binding(&fx, ws, CORE_BINDING).await;
    }
    assert!(
        fx.claims(&t3, "compute").await.is_empty(),
        "t3 holds no core binding and is not touched"
    );

    // The tenant of t2 rejects secrets; the provider then requires secrets.
    let client = fx.client(&t2).await;
    let api: kube::Api<kbind::api::kcp::APIBinding> = kube::Api::all(client);
    api.patch(
        "compute",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Json::<()>(
            serde_json::from_value(serde_json::json!([{"op": "add",
                "path": "/spec/permissionClaims/-",
                "value": {"group": "", "resource": "secrets", "verbs": ["get"],
                    "identityHash": "", "selector": {"matchAll": true}, "state": "Rejected"}}]))
            .expect("json patch"),
        ),
    )
    .await
    .expect("tenant rejects secrets");
    requires.push(req("", "secrets", None));
    fx.entry(&entry, &path, &export, requires).await;
    let s = fx.run().await;
    assert_eq!(
        s["data_writes"], 1,
        "t1 only: t2's Rejected stays as it is: {s}"
    );
    let e = fx.catalog_entry(&entry).await;
    // The platform provider's case (spec 001): no `spec.org`, and its claims reconcile as an
    // org-owned one's do (identity_not_the_provider_field_decides_and_a_dry_run_writes_nothing).
    assert_eq!(e.spec.org, "", "a platform provider");
    let st = e.status.expect("status");
    assert_eq!((st.bindings_checked, st.bindings_updated), (2, 1));
    assert_eq!(st.cursor, "");
    assert!(!st.requirements_hash.is_empty());
    assert_eq!(
        fx.claims(&t1, "compute").await,
        strings(&[
            "configmaps=Accepted",
            "storage.example.io/volumes=Rejected",
            "secrets=Accepted"
        ])
    );
    let t2_claims = strings(&[
        "configmaps=Accepted",
        "storage.example.io/volumes=Rejected",
        "secrets=Rejected",
    ]);
    assert_eq!(fx.claims(&t2, "compute").await, t2_claims);

    // Consent given to another provider is no consent to this one.
    let t1_cluster = fx.logical_cluster(&t1).await;
    fx.grant(
        &unique("t1-other"),
        &t1_cluster,
        &unique("other-provider"),
        &[("storage.example.io", "volumes")],
    )
    .await;
    let s = fx.run().await;
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(
        s["counts"]["bindingsChecked"], 4,
        "t1's and t2's compute and storage bindings, none of t3: {s}"
    );

    // t1 consents to the composition: Accepted there only; revoked: Rejected again.
    let grant = unique("t1-compute");
    fx.grant(
        &grant,
        &t1_cluster,
        &entry,
        &[("storage.example.io", "volumes")],
    )
    .await;
    let s = fx.run().await;
    assert_eq!(s["data_writes"], 1, "t1's binding only: {s}");
    let consented = strings(&[
        "configmaps=Accepted",
        "storage.example.io/volumes=Accepted",
        "secrets=Accepted",
    ]);
    assert_eq!(fx.claims(&t1, "compute").await, consented);
    assert_eq!(fx.claims(&t2, "compute").await, t2_claims);
    for ws in [&t1, &t2] {
        kcp_accepts(&fx, ws).await;
    }
    let s = fx.run().await;
    assert_eq!(s["data_writes"], 0, "an unchanged run writes nothing: {s}");

    fx.revoke(&grant).await;
    fx.run().await;
    assert_eq!(
        fx.claims(&t1, "compute").await,
        strings(&[
            "configmaps=Accepted",
            "storage.example.io/volumes=Rejected",
            "secrets=Accepted"
        ])
    );
    kcp_accepts(&fx, &t1).await;
    for _ in 0..2 {
        let s = fx.run().await;
        assert_eq!(s["data_writes"], 0, "an unchanged run writes nothing: {s}");
    }
}

/// Before any tenant binds the core export kcp lists no endpoint for it: kbind has nothing in
/// scope and says so, it does not fail. The first tenant's binding is then reconciled by the
/// next runs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_core_export_no_workspace_has_bound_yet_is_not_an_error() {
    let fx = KcpFx::new("kt-empty").await;
    let prov = fx.workspace(&fx.parent, "prov").await;
    fx.export(
        &prov,
        "compute.example.io",
        vec![claim("", "configmaps", &["get", "list"], "")],
    )
    .await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &prov,
        "compute.example.io",
        vec![req("", "configmaps", None)],
    )
    .await;
    for _ in 0..2 {
        let s = fx.run().await;
        assert_eq!(s["outcome"], "completed", "{s}");
        assert_eq!(s["data_writes"], 0, "{s}");
    }
    let t1 = fx.tenant("t1").await;
    fx.bind(&t1, "compute", &prov, "compute.example.io").await;
    fx.reconciled(&t1, "compute", &strings(&["configmaps=Accepted"]))
        .await;
    kcp_accepts(&fx, &t1).await;
}

/// `kbind claims export` renders the claims a provider publishes; kcp's admission takes them as
/// written, and a consenting tenant's binding then carries exactly them, which kcp finds valid.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn the_rendered_export_claims_are_admitted_by_kcp_as_written() {
    let fx = KcpFx::new("kt-export").await;
    let storage_ws = fx.workspace(&fx.parent, "storage").await;
    let storage = fx
        .resource_export(&storage_ws, "storage.example.io", VOLUMES)
        .await;
    let storage_entry = unique("storage");
    fx.entry(&storage_entry, &storage_ws, "storage.example.io", vec![])
        .await;
    let prov = fx.workspace(&fx.parent, "prov").await;
    fx.export(&prov, "compute.example.io", vec![]).await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &prov,
        "compute.example.io",
        vec![
            req("", "configmaps", None),
            req("", "secrets", None),
            req("storage.example.io", "volumes", Some(&storage_entry)),
            // A subresource is claimed as its resource (a built-in of kcp's: kcp refuses an
            // export claiming a core kind it does not serve, such as pods, without an identity).
            req("", "serviceaccounts/token", None),
        ],
    )
    .await;

    let kubeconfig = fx.kubeconfig();
    let (code, stdout, stderr) =
        support::kbind_output(&["claims", "export", &entry, "--kubeconfig", &kubeconfig]).await;
    assert_eq!(code, 0, "{stderr}");
    let rendered: serde_json::Value = serde_saphyr::from_str(&stdout).expect("YAML");
    assert_eq!(
        rendered["spec"]["permissionClaims"],
        serde_json::json!([
            {"group": "", "resource": "configmaps", "verbs": ["*"], "identityHash": ""},
            {"group": "", "resource": "secrets", "verbs": ["*"], "identityHash": ""},
            {"group": "", "resource": "serviceaccounts", "verbs": ["*"], "identityHash": ""},
            {"group": "storage.example.io", "resource": "volumes", "verbs": ["*"], "identityHash": storage},
        ])
    );
    // Applied as the docs say (server-side, in the provider's workspace): kcp admits it.
    let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        fx.client(&prov).await,
        &kube::api::ApiResource {
            group: "apis.kcp.io".into(),
            version: "v1alpha2".into(),
            api_version: "apis.kcp.io/v1alpha2".into(),
            kind: "APIExport".into(),
            plural: "apiexports".into(),
        },
    );
    let name = rendered["metadata"]["name"]
        .as_str()
        .expect("rendered name")
        .to_string();
    assert_eq!(name, "compute.example.io");
    let applied = api
        .patch(
            &name,
            &kube::api::PatchParams::apply("provider").force(),
            &kube::api::Patch::Apply(&rendered),
        )
        .await
        .unwrap_or_else(|e| panic!("kcp refused the rendered export: {e}"));
    assert_eq!(
        applied.data["spec"]["permissionClaims"], rendered["spec"]["permissionClaims"],
        "kcp kept the claims as written"
    );

    let t1 = fx.tenant("t1").await;
    let t1_cluster = fx.logical_cluster(&t1).await;
    fx.grant(
        &unique("g"),
        &t1_cluster,
        &entry,
        &[("storage.example.io", "volumes")],
    )
    .await;
    fx.bind(&t1, "compute", &prov, "compute.example.io").await;
    fx.bind(&t1, "storage", &storage_ws, "storage.example.io")
        .await;
    let want = strings(&[
        "configmaps=Accepted",
        "secrets=Accepted",
        "serviceaccounts=Accepted",
        "storage.example.io/volumes=Accepted",
    ]);
    fx.reconciled(&t1, "compute", &want).await;
    kcp_accepts(&fx, &t1).await;
    // The binding carries exactly the rendered claims: verbs and identity hashes too.
    let carried: Vec<serde_json::Value> = fx
        .binding(&t1, "compute")
        .await
        .spec
        .permission_claims
        .iter()
        .map(|c| serde_json::json!({"group": c.group, "resource": c.resource, "verbs": c.verbs, "identityHash": c.identity_hash}))
        .collect();
    assert_eq!(
        serde_json::json!(carried),
        rendered["spec"]["permissionClaims"]
    );
}

/// A WorkspaceType with `defaultAPIBindingLifecycle: Maintain` makes kcp rewrite its default
/// bindings' claims itself (every claim of the export Accepted). kbind leaves those bindings to
/// kcp instead of fighting it (no write, run after run) and says so on the CatalogEntry, naming
/// the workspace; the same export's other bindings are reconciled as usual. Once the type is
/// switched to `InitializeOnly`, kbind reconciles the binding and kcp leaves it be.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bindings_kcp_maintains_are_reported_not_fought() {
    let fx = KcpFx::new("kt-maint").await;
    let (path, export, storage_entry, _, storage_path) = providers(&fx).await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.example.io", "volumes", Some(&storage_entry)),
        ],
    )
    .await;
    fx.workspace_type(
        "maintained",
        &[
            (storage_path.as_str(), "storage.example.io"),
            (path.as_str(), export.as_str()),
        ],
        "Maintain",
    )
    .await;
    let maintained = fx
        .typed_workspace(&fx.parent, "m", Some((&fx.parent, "maintained")))
        .await;
    fx.bind(&maintained, "core", &fx.hub_ws, &fx.core_export)
        .await;
    let default_binding = fx
        .bindings(&maintained)
        .await
        .into_iter()
        .find(|(_, e)| *e == export)
        .map(|(name, _)| name)
        .expect("kcp created the default binding");
    // A plain tenant of the same export, for contrast.
    let plain = fx.tenant("p").await;
    fx.bind(&plain, "compute", &path, &export).await;
    fx.bind(&plain, "storage", &storage_path, "storage.example.io")
        .await;

    let kcps = strings(&[
        "configmaps=Accepted",
        "secrets=Accepted",
        "storage.example.io/volumes=Accepted",
    ]);
    let plain_want = strings(&["configmaps=Accepted", "storage.example.io/volumes=Rejected"]);
    fx.reconciled(&plain, "compute", &plain_want).await;
    let mut writes = Vec::new();
    for _ in 0..3 {
        let s = fx.run().await;
        writes.push(s["data_writes"].as_i64().unwrap_or(-1));
        // kcp's own shape, untouched by kbind.
        assert_eq!(fx.claims(&maintained, &default_binding).await, kcps);
    }
    assert_eq!(
        writes,
        vec![0, 0, 0],
        "kbind does not fight kcp: writes per run"
    );
    let e = fx.catalog_entry(&entry).await;
    let c = entry_condition(&e, "KcpMaintained");
    assert_eq!(
        (c.0.as_str(), c.1.as_str()),
        ("True", "DefaultAPIBindingLifecycleMaintain"),
        "{c:?}"
    );
    let cluster = fx.logical_cluster(&maintained).await;
    assert!(
        c.2.contains(&cluster) && c.2.contains(&default_binding),
        "names the workspace and binding: {c:?}"
    );
    assert_eq!(
        fx.claims(&plain, "compute").await,
        strings(&["configmaps=Accepted", "storage.example.io/volumes=Rejected"]),
        "the export's other bindings are still kbind's"
    );

    // The type switched to InitializeOnly: kcp lets go, kbind reconciles the binding from its
    // next run (the composition Rejected without a Grant) and kcp no longer rewrites it.
    fx.workspace_type(
        "maintained",
        &[
            (storage_path.as_str(), "storage.example.io"),
            (path.as_str(), export.as_str()),
        ],
        "InitializeOnly",
    )
    .await;
    // kbind keeps the Accepted claims the export lists (secrets) and rejects the composition.
    let reconciled = strings(&[
        "configmaps=Accepted",
        "secrets=Accepted",
        "storage.example.io/volumes=Rejected",
    ]);
    fx.reconciled(&maintained, &default_binding, &reconciled)
        .await;
    kcp_accepts_binding(&fx, &maintained, &default_binding).await;
    for _ in 0..3 {
        let s = fx.run().await;
        assert_eq!(s["data_writes"], 0, "{s}");
        assert_eq!(
            fx.claims(&maintained, &default_binding).await,
            reconciled,
            "kcp no longer rewrites the binding"
        );
    }
    let e = fx.catalog_entry(&entry).await;
    let c = entry_condition(&e, "KcpMaintained");
    assert_eq!(
        (c.0.as_str(), c.1.as_str()),
        ("False", "NoneMaintained"),
        "{c:?}"
    );
}

/// A Connection to a kcp workspace pins that workspace's LogicalCluster `cluster` UID as the
/// provider's identity (docs/schema.md), pulls and syncs as from any provider, and a Secret
/// pointing at another workspace of the same kcp (same server, same CA, same user) is
/// `ClusterIdentityChanged`: nothing is installed or synced from it.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_connection_to_a_kcp_workspace_pins_its_logical_cluster() {
    use kbind::api::core::ClusterBinding;
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    use serde_json::json;
    use support::fx::{Fx, cond};

    let kcp = KcpFx::new("kt-id").await;
    let fx = Fx::new("kt-id").await;
    let prov = kcp.workspace(&kcp.parent, "prov").await;
    let crd = fx.crd("widgets", "Namespaced", Some("true"), None);
    support::apply_crds(&kcp.client(&prov).await, std::slice::from_ref(&crd)).await;
    let widgets = format!("widgets.{}", fx.group);
    fx.secret("provider", "kubeconfig", &kcp.kubeconfig_at(&prov))
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&widgets]).await;
    fx.run(&[]);
    let lc: DynamicObject = Api::all_with(
        kcp.client(&prov).await,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster"),
            "logicalclusters",
        ),
    )
    .get("cluster")
    .await
    .expect("the workspace's LogicalCluster");
    let pinned = fx.conn(&conn).await.status.unwrap().remote_cluster_uid;
    assert_eq!(
        pinned, lc.metadata.uid,
        "the LogicalCluster's UID is pinned"
    );
    assert!(
        fx.installed_by(&widgets, &conn).await,
        "CRD pulled from kcp"
    );
    support::wait_established(&Api::all(fx.consumer.clone()), &widgets).await;

    // An object goes up into the workspace, its status comes down.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let consumer: Api<DynamicObject> = Api::namespaced_with(fx.consumer.clone(), &fx.ns, &ar);
    let mut w = DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 3}}));
    w.metadata.namespace = Some(fx.ns.clone());
    consumer.create(&PostParams::default(), &w).await.unwrap();
    let run = fx.pass("resync", &[]);
    assert_eq!(run["outcome"], "completed", "{run}");
    let provider: Api<DynamicObject> = Api::namespaced_with(kcp.client(&prov).await, &fx.ns, &ar);
    let mut copy = provider.get("w1").await.expect("copy in the workspace");
    assert_eq!(copy.data["spec"], json!({"size": 3}));
    copy.data["status"] = json!({"phase": "Ready"});
    provider
        .replace_status("w1", &PostParams::default(), &copy)
        .await
        .unwrap();
    fx.pass("resync", &[]);
    assert_eq!(
        consumer.get("w1").await.unwrap().data["status"]["phase"],
        "Ready"
    );
    let s = fx.pass("resync", &[]);
    assert_eq!(
        s["data_writes"], 0,
        "an unchanged resync writes nothing: {s}"
    );

    // The Secret now points at another workspace of the same kcp.
    let other = kcp.workspace(&kcp.parent, "other").await;
    support::apply_crds(&kcp.client(&other).await, std::slice::from_ref(&crd)).await;
    fx.secret("provider", "kubeconfig", &kcp.kubeconfig_at(&other))
        .await;
    for _ in 0..2 {
        fx.run(&[]);
        let st = fx.conn(&conn).await.status.unwrap();
        let (s, r, m) = cond(&st.conditions, "Connected");
        assert_eq!((s, r), ("False", "ClusterIdentityChanged"), "{m}");
        assert_eq!(
            st.remote_cluster_uid, lc.metadata.uid,
            "the pin never moves"
        );
        let run = fx.pass("resync", &[]);
        assert_eq!(
            run["data_writes"], 0,
            "nothing synced to another workspace: {run}"
        );
    }
    let other_copies: Api<DynamicObject> =
        Api::namespaced_with(kcp.client(&other).await, &fx.ns, &ar);
    assert!(
        other_copies.get_opt("w1").await.unwrap().is_none(),
        "no copy in the other workspace"
    );
    let bst = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(cond(&bst.conditions, "Ready").0, "False");
}

/// `kbind issue` on a kcp workspace: the identity it issues reads the workspace's LogicalCluster
/// (the one object it may get on `core.kcp.io`), so a consumer's `kbind schema` through the
/// issued kubeconfig pins the LogicalCluster's UID; once the issuer pins the consumer from its
/// heartbeat, an object syncs into the workspace, and further runs of all three write nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_identity_issued_on_a_kcp_workspace_pins_its_logical_cluster() {
    use k8s_openapi::api::core::v1::Secret;
    use kbind::api::iam::Grant;
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use serde_json::json;
    use support::issue_fx::widget;

    let kcp = KcpFx::new("kt-iss").await;
    let fx = support::fx::Fx::new("kt-iss").await;
    let prov = kcp.workspace(&kcp.parent, "prov").await;
    let admin = kcp.client(&prov).await;
    support::kbind_crds(&admin).await;
    let crd = fx.crd("widgets", "Namespaced", Some("true"), None);
    support::apply_crds(&admin, std::slice::from_ref(&crd)).await;
    let widgets = format!("widgets.{}", fx.group);
    let ns = support::namespace(&admin, "grants").await;
    let export = format!("{}-w", fx.label);
    support::apply_object(
        &admin,
        "exports",
        &json!({"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export",
            "metadata": {"name": export},
            "spec": {"description": "test", "apis": [{"name": widgets}], "permissions": []}}),
    )
    .await;
    let grant = format!("{}-g", fx.label);
    support::apply_object(
        &admin,
        "grants",
        &json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": grant},
            // The consumer's objects are in fx.ns: the Grant holds that namespace.
            "spec": {"export": export, "consumer": "team", "tokenTTL": "1h", "namespaces": [fx.ns]}}),
    )
    .await;
    let admin_file = support::temp_file("kcp-admin", &kcp.kubeconfig_at(&prov));
    let ca_file = support::temp_file("kcp-ca", &kcp.ca_pem());
    let url = kcp.url(&prov);
    let issue = || {
        let args = [
            "issue",
            "--kubeconfig",
            admin_file.to_str().expect("path"),
            "--lease-namespace",
            &ns,
            "--grants-namespace",
            &ns,
            "--server-url",
            &url,
            "--server-ca-file",
            ca_file.to_str().expect("path"),
            // kcp v0.31 exits on an admission policy with parameters: per-Grant policies.
            "--confinement",
            "per-grant",
            "-o",
            "json",
        ];
        let (code, s, err) = support::kbind(&args);
        assert_eq!(code, 0, "{s}\n{err}");
        s
    };
    let s = issue();
    assert_eq!(s["outcome"], "completed", "{s}");
    let g: Grant = Api::all(admin.clone()).get(&grant).await.expect("Grant");
    let ready = g
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"));
    assert_eq!(
        ready.map(|c| c.reason.as_str()),
        Some("Issued"),
        "{:?}",
        g.status
    );

    // The issued kubeconfig, handed to the consumer as docs/binding-flow.md says.
    let issued = Api::<Secret>::namespaced(admin.clone(), &ns)
        .get(&format!("kbind-grant-{grant}"))
        .await
        .expect("the issued Secret");
    let kc = String::from_utf8(issued.data.expect("data")["kubeconfig"].0.clone())
        .expect("kubeconfig text");
    assert!(
        kc.contains(&url),
        "the issued kubeconfig names the workspace"
    );
    // `kbind bind` copies the Grant's name from the issued Secret (docs/binding-flow.md).
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "issued", "annotations": {"iam.kbind.io/grant": grant}},
        "stringData": {"kubeconfig": kc}}))
    .expect("Secret");
    Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .patch(
            "issued",
            &PatchParams::apply("kbind-tests").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("the Connection's Secret");
    let conn = fx
        .connection("p", "issued", json!({"source": "CRD"}), false)
        .await;
    fx.cluster_binding("cb", &conn, &[&widgets]).await;
    let s = fx.run(&[]);
    assert_eq!(s["outcome"], "completed", "{s}");
    let lc: DynamicObject = Api::all_with(
        admin.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster"),
            "logicalclusters",
        ),
    )
    .get("cluster")
    .await
    .expect("the workspace's LogicalCluster");
    let st = fx.conn(&conn).await.status.expect("Connection status");
    assert_eq!(
        st.remote_cluster_uid, lc.metadata.uid,
        "the issued identity read the LogicalCluster and its UID is pinned: {:?}",
        st.conditions
    );
    support::wait_established(&Api::all(fx.consumer.clone()), &widgets).await;

    // resync's heartbeat, then the issuer pins the consumer, then the object goes up.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &ar)
        .patch(
            "w1",
            &PatchParams::apply("kbind-tests"),
            &Patch::Apply(widget(&fx.group, "w1", None)),
        )
        .await
        .expect("consumer widget");
    fx.pass("resync", &[]);
    issue();
    let g: Grant = Api::all(admin.clone()).get(&grant).await.expect("Grant");
    assert!(
        g.status
            .as_ref()
            .and_then(|st| st.consumer_cluster.clone())
            .is_some(),
        "the issuer pinned the consumer: {:?}",
        g.status
    );
    let copies: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &fx.ns, &ar);
    within(60, "the widget in the workspace", || async {
        fx.pass("resync", &[]);
        copies.get_opt("w1").await.ok().flatten()
    })
    .await;
    for _ in 0..2 {
        for (pass, s) in [
            ("schema", fx.run(&[])),
            ("resync", fx.pass("resync", &[])),
            ("issue", issue()),
        ] {
            assert_eq!(
                s["data_writes"], 0,
                "a further {pass} run writes nothing: {s}"
            );
        }
    }

    // Removed by hand (finalizer stripped): kcp's garbage collector revokes the identity, as
    // the owner references on everything issued ask, with no issuer run.
    let grants: Api<Grant> = Api::all(admin.clone());
    grants
        .patch(
            &grant,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer stripped");
    grants
        .delete(&grant, &Default::default())
        .await
        .expect("Grant deleted");
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), &ns);
    let name = format!("kbind-grant-{grant}");
    within(
        60,
        "the identity revoked by kcp's garbage collector",
        || async {
            accounts
                .get_opt(&name)
                .await
                .ok()
                .and_then(|a| a.is_none().then_some(()))
        },
    )
    .await;
}

/// A provider that withdraws every export (here its kcp workspace: a provider whose exports
/// this test alone controls) never causes the deletion of consumer objects: autoBind keeps its
/// ClusterBinding, and so the consumer CRD and its objects, while that CRD holds objects, says
/// so on the Connection (`AutoBind=False ExportsWithdrawn`, naming the CRD) and in a Warning
/// Event, run after run writing 0; once a person deletes the objects, the binding goes as the
/// spec says, and its teardown keeps a CRD that holds objects again by then.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_provider_withdrawing_every_export_never_deletes_consumer_objects() {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kbind::api::core::ClusterBinding;
    use kube::api::{
        Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    };
    use serde_json::json;
    use support::fx::{Fx, cond};

    let kcp = KcpFx::new("kt-wd").await;
    let fx = Fx::new("kt-wd").await;
    let prov = kcp.workspace(&kcp.parent, "prov").await;
    // Two kinds of one group served at different versions: the group's preferred version
    // (v1) does not show gadgets, which is served at v1alpha1 only.
    let crd = fx.crd("widgets", "Namespaced", Some("true"), None);
    let mut gadgets_crd = fx.crd("gadgets", "Namespaced", Some("true"), None);
    gadgets_crd.spec.versions[0].name = "v1alpha1".into();
    support::apply_crds(&kcp.client(&prov).await, &[crd, gadgets_crd]).await;
    let widgets = format!("widgets.{}", fx.group);
    let gadgets = format!("gadgets.{}", fx.group);
    fx.secret("provider", "kubeconfig", &kcp.kubeconfig_at(&prov))
        .await;
    let conn = fx
        .connection(
            "p",
            "provider",
            json!({"source": "CRD", "pullPolicy": "All"}),
            true,
        )
        .await;
    fx.run(&[]);
    let cbs = Api::<ClusterBinding>::all(fx.consumer.clone());
    let cb = cbs.get(&conn).await.expect("the autoBind ClusterBinding");
    // It carries the Connection's labels: resync's selector (this fixture's label) picks it.
    assert_eq!(
        cb.metadata.labels.unwrap_or_default().get("kbind-test"),
        Some(&fx.label)
    );
    let s = fx.run(&[]);
    assert_eq!(s["data_writes"], 0, "a second run writes nothing: {s}");
    let consumer_crds = Api::<CustomResourceDefinition>::all(fx.consumer.clone());
    support::wait_established(&consumer_crds, &widgets).await;
    support::wait_established(&consumer_crds, &gadgets).await;
    let gadget_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1alpha1", "Gadget"),
        "gadgets",
    );
    let gadget_objects: Api<DynamicObject> =
        Api::namespaced_with(fx.consumer.clone(), &fx.ns, &gadget_ar);
    let mut g = DynamicObject::new("g1", &gadget_ar).data(json!({"spec": {"size": 1}}));
    g.metadata.namespace = Some(fx.ns.clone());
    gadget_objects
        .create(&PostParams::default(), &g)
        .await
        .expect("a consumer gadget");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let objects: Api<DynamicObject> = Api::namespaced_with(fx.consumer.clone(), &fx.ns, &ar);
    let mut w = DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 3}}));
    w.metadata.namespace = Some(fx.ns.clone());
    objects
        .create(&PostParams::default(), &w)
        .await
        .expect("a consumer object");

    // The provider withdraws both exports by deleting their CRDs. A finalizer holds gadgets
    // in Terminating (as a provider's own cleanup may, for as long as it takes): a CRD being
    // deleted is withdrawn too, whether or not kcp has finished deleting widgets.
    let provider_crds = Api::<CustomResourceDefinition>::all(kcp.client(&prov).await);
    let hold = json!({"metadata": {"finalizers": ["kbind.test/hold"]}});
    provider_crds
        .patch(&gadgets, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold gadgets");
    for name in [&widgets, &gadgets] {
        provider_crds
            .delete(name, &Default::default())
            .await
            .expect("delete the provider CRD");
    }
    within(60, "the provider CRDs deleting", || async {
        let deleting = |c: Option<CustomResourceDefinition>| {
            c.is_none_or(|c| c.metadata.deletion_timestamp.is_some())
        };
        let w = provider_crds.get_opt(&widgets).await.ok()?;
        let g = provider_crds.get_opt(&gadgets).await.ok()??;
        (deleting(w) && g.metadata.deletion_timestamp.is_some()).then_some(())
    })
    .await;
    // One empty discovery may be a flapping label: nothing said yet.
    let s = fx.run(&[]);
    assert_eq!(s["data_writes"], 0, "{s}");
    let st = fx.conn(&conn).await.status.expect("status");
    assert_eq!(cond(&st.conditions, "AutoBind").1, "Maintained");
    let mut writes = Vec::new();
    let mut versions = Vec::new();
    for _ in 0..4 {
        writes.push(fx.run(&[])["data_writes"].as_i64().unwrap_or(-1));
        let cb = cbs.get(&conn).await.expect("the ClusterBinding stays");
        assert!(cb.metadata.deletion_timestamp.is_none(), "not deleted");
        assert!(
            objects.get_opt("w1").await.expect("read").is_some(),
            "object kept"
        );
        let c = fx.conn(&conn).await;
        versions.push(c.metadata.resource_version.clone());
        let st = c.status.expect("status");
        let (s, r, m) = cond(&st.conditions, "AutoBind");
        assert_eq!((s, r), ("False", "ExportsWithdrawn"), "{m}");
        for crd in [&widgets, &gadgets] {
            assert!(
                m.contains(&format!("{crd} (holds objects)")),
                "names each CRD holding objects: {m}"
            );
        }
    }
    assert_eq!(writes, vec![0, 0, 0, 0], "nothing written while withdrawn");
    assert!(
        versions.windows(2).skip(1).all(|w| w[0] == w[1]),
        "the Connection's status settles: {versions:?}"
    );
    let events = Api::<Event>::namespaced(fx.consumer.clone(), "default")
        .list(&Default::default())
        .await
        .expect("Events");
    let withdrawn: Vec<_> = events
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ExportsWithdrawn")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(conn.as_str())
        })
        .collect();
    assert_eq!(withdrawn.len(), 1, "one Event for four runs: {withdrawn:?}");
    assert_eq!(withdrawn[0].type_.as_deref(), Some("Warning"));

    // A person deletes the objects: autoBind deletes the binding. An object created before
    // its teardown keeps the CRD (the teardown looks again); the binding goes.
    objects
        .delete("w1", &Default::default())
        .await
        .expect("delete w1");
    gadget_objects
        .delete("g1", &Default::default())
        .await
        .expect("delete g1");
    within(60, "the binding deleting", || async {
        fx.run(&[]);
        let cb = cbs.get_opt(&conn).await.ok()??;
        cb.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    let mut w2 = DynamicObject::new("w2", &ar).data(json!({"spec": {"size": 4}}));
    w2.metadata.namespace = Some(fx.ns.clone());
    objects
        .create(&PostParams::default(), &w2)
        .await
        .expect("an object created in the meantime");
    within(90, "the binding gone", || async {
        fx.pass("resync", &[]);
        fx.run(&[]);
        cbs.get_opt(&conn).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        consumer_crds
            .get_opt(&widgets)
            .await
            .expect("read")
            .is_some(),
        "the CRD holding w2 stays"
    );
    assert!(
        objects.get_opt("w2").await.expect("read").is_some(),
        "w2 kept"
    );

    // Emptied, a CRD that outlived its binding is the person's to delete; a run changes nothing.
    let s = fx.run(&[]);
    assert_eq!(s["data_writes"], 0, "{s}");
    assert!(
        provider_crds
            .get_opt(&gadgets)
            .await
            .expect("read")
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        "gadgets was held in Terminating throughout"
    );
    let release = json!({"metadata": {"finalizers": null}});
    provider_crds
        .patch(&gadgets, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release gadgets");
}

/// A run killed right after its first write on real kcp (the first core binding opened) is
/// finished by the next runs once its Lease expires: every binding ends as one uninterrupted
/// cycle leaves it, kcp accepts each, and further runs write 0. A Grant deleted and created
/// again turns the composition back to `Accepted`.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_killed_run_is_finished_by_the_next_and_a_grant_comes_back() {
    let fx = KcpFx::new("kt-kill").await;
    let (path, export, storage_entry, _, storage_path) = providers(&fx).await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.example.io", "volumes", Some(&storage_entry)),
        ],
    )
    .await;
    let (yes, no) = (fx.tenant("yes").await, fx.tenant("no").await);
    for ws in [&yes, &no] {
        fx.bind(ws, "compute", &path, &export).await;
        fx.bind(ws, "storage", &storage_path, "storage.example.io")
            .await;
    }
    let yes_cluster = fx.logical_cluster(&yes).await;
    let grant = unique("g");
    let consent = [("storage.example.io", "volumes")];
    fx.grant(&grant, &yes_cluster, &entry, &consent).await;

    let (code, _, stderr) = fx
        .run_env(
            &[],
            &[
                ("KBIND_CRASH_AFTER_WRITES", "1"),
                ("KBIND_LEASE_DURATION", "2s"),
            ],
        )
        .await;
    assert_ne!(code, 0, "the crash knob stopped the run: {stderr}");
    assert!(stderr.contains("reached"), "{stderr}");

    let with = |volumes: &str| {
        strings(&[
            "configmaps=Accepted",
            &format!("storage.example.io/volumes={volumes}"),
        ])
    };
    fx.reconciled(&yes, "compute", &with("Accepted")).await;
    fx.reconciled(&no, "compute", &with("Rejected")).await;
    for ws in [&yes, &no] {
        assert_eq!(
            fx.claims(ws, CORE_BINDING).await,
            strings(&["apis.kcp.io/apibindings=Accepted"])
        );
        kcp_accepts(&fx, ws).await;
    }
    for _ in 0..2 {
        let s = fx.run().await;
        assert_eq!(s["data_writes"], 0, "converged: {s}");
    }

    // The Grant deleted, then created again.
    fx.revoke(&grant).await;
    fx.reconciled(&yes, "compute", &with("Rejected")).await;
    fx.grant(&grant, &yes_cluster, &entry, &consent).await;
    fx.reconciled(&yes, "compute", &with("Accepted")).await;
    kcp_accepts(&fx, &yes).await;
    let s = fx.run().await;
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(fx.claims(&no, "compute").await, with("Rejected"));
}

/// The merge rules kcp itself makes necessary: an `Accepted` claim the export does not list
/// makes kcp report `PermissionClaimsValid=False` and kbind removes it; a tenant's `Rejected`
/// stays; an existing claim keeps its selector (kcp refuses to change it) while its verbs follow
/// the export. kcp's verdict is read before and after.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn stale_claims_go_and_a_tenants_rejection_and_selector_stay() {
    let fx = KcpFx::new("kt-merge").await;
    let (path, export, _, _, _) = providers(&fx).await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![req("", "configmaps", None), req("", "secrets", None)],
    )
    .await;
    let ws = fx.tenant("t").await;
    let held = |group: &str, resource: &str, verbs: &[&str], hash: &str, state: &str, selector| {
        serde_json::json!({"group": group, "resource": resource, "verbs": verbs,
            "identityHash": hash, "selector": selector, "state": state})
    };
    let all = serde_json::json!({"matchAll": true});
    let team = serde_json::json!({"matchLabels": {"team": "a"}});
    let body = serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
    "metadata": {"name": "compute"},
    "spec": {"reference": {"export": {"path": path, "name": export}}, "permissionClaims": [
        held("", "configmaps", &["get", "list"], "", "Rejected", all.clone()),
        held("", "secrets", &["get", "delete"], "", "Accepted", team.clone()),
        held("gone.example.io", "things", &["get"], "", "Accepted", all.clone()),
        held("left.example.io", "alone", &["get"], "", "Rejected", all.clone()),
    ]}});
    let api: kube::Api<kbind::api::kcp::APIBinding> = kube::Api::all(fx.client(&ws).await);
    api.create(
        &kube::api::PostParams::default(),
        &serde_json::from_value(body).expect("binding"),
    )
    .await
    .expect("the tenant's binding");
    within(60, "kcp finds the stale claim invalid", || async {
        let b = api.get("compute").await.ok()?;
        let c = b
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "PermissionClaimsValid")?;
        (c.status == "False").then_some(())
    })
    .await;

    fx.reconciled(
        &ws,
        "compute",
        &strings(&[
            "configmaps=Rejected",
            "secrets=Accepted",
            "left.example.io/alone=Rejected",
        ]),
    )
    .await;
    let b = fx.binding(&ws, "compute").await;
    let secrets = b
        .spec
        .permission_claims
        .iter()
        .find(|c| c.resource == "secrets")
        .expect("secrets");
    assert_eq!(
        serde_json::to_value(&secrets.selector).expect("selector"),
        team,
        "selector kept"
    );
    assert_eq!(secrets.verbs, vec!["get"], "verbs follow the export");
    kcp_accepts(&fx, &ws).await;
    for _ in 0..2 {
        let s = fx.run().await;
        assert_eq!(s["data_writes"], 0, "{s}");
    }
}

/// CatalogEntry conditions on kcp: a requirement the export does not list is reported, not
/// claimed; a second entry for the same export writes nothing (`DuplicateEntry`) until the
/// older one is deleted; an entry naming an export that does not exist is a condition, not a
/// failed run.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn catalog_entries_report_what_they_cannot_claim() {
    use kbind::api::providers::CatalogEntry;
    let fx = KcpFx::new("kt-cat").await;
    let (path, export, _, _, _) = providers(&fx).await;
    let older = format!("z-{}", unique("older"));
    fx.entry(
        &older,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("", "serviceaccounts", None),
            req("compute.io", "instances/exec", None),
        ],
    )
    .await;
    // creationTimestamp has second resolution; the older entry's name sorts last, so only
    // creation order can make it win.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let newer = format!("a-{}", unique("newer"));
    fx.entry(
        &newer,
        &path,
        &export,
        vec![req("", "configmaps", None), req("", "secrets", None)],
    )
    .await;
    let ghost = unique("ghost");
    fx.entry(
        &ghost,
        &fx.parent.clone(),
        "ghost.example.io",
        vec![req("", "configmaps", None)],
    )
    .await;
    // An export in a workspace that does not exist at all.
    let nowhere = unique("nowhere");
    let nowhere_export = format!("{}.example.io", unique("ghost"));
    fx.entry(
        &nowhere,
        &format!("{}:nowhere", fx.parent),
        &nowhere_export,
        vec![req("", "configmaps", None)],
    )
    .await;
    let ws = fx.tenant("t").await;
    fx.bind(&ws, "compute", &path, &export).await;
    fx.reconciled(&ws, "compute", &strings(&["configmaps=Accepted"]))
        .await;
    let e = fx.catalog_entry(&older).await;
    let missing: Vec<String> = e
        .status
        .as_ref()
        .expect("status")
        .missing_on_export
        .iter()
        .map(|r| format!("{}/{}", r.group, r.resource))
        .collect();
    assert_eq!(
        missing,
        vec!["/serviceaccounts", "compute.io/instances/exec"]
    );
    let (s, r, m) = entry_condition(&e, "ExportComplete");
    assert_eq!(
        (s.as_str(), r.as_str()),
        ("False", "RequirementsMissingOnExport")
    );
    assert!(
        m.contains("serviceaccounts") && m.contains("compute.io/instances/exec"),
        "{m}"
    );
    assert_eq!(entry_condition(&e, "Ready").0, "True");
    let (s, r, m) = entry_condition(&fx.catalog_entry(&newer).await, "Ready");
    assert_eq!((s.as_str(), r.as_str()), ("False", "DuplicateEntry"));
    assert!(m.contains(&older), "{m}");
    let (s, r, m) = entry_condition(&fx.catalog_entry(&ghost).await, "Ready");
    assert_eq!((s.as_str(), r.as_str()), ("False", "ExportNotFound"), "{m}");
    assert!(m.contains("ghost.example.io"), "{m}");
    let (s, r, m) = entry_condition(&fx.catalog_entry(&nowhere).await, "Ready");
    assert_eq!((s.as_str(), r.as_str()), ("False", "ExportNotFound"), "{m}");
    assert!(m.contains(&nowhere_export), "{m}");
    for _ in 0..2 {
        let s = fx.run().await;
        assert_eq!(s["data_writes"], 0, "{s}");
        assert_eq!(s["counts"]["duplicateEntries"], 1, "{s}");
        assert_eq!(
            entry_condition(&fx.catalog_entry(&newer).await, "Ready").1,
            "DuplicateEntry"
        );
    }

    // The older entry deleted: the other one is the export's entry from the next run on.
    kube::Api::<CatalogEntry>::all(fx.client(&fx.hub_ws).await)
        .delete(&older, &Default::default())
        .await
        .expect("delete the older entry");
    fx.run().await;
    assert_eq!(
        fx.claims(&ws, "compute").await,
        strings(&["configmaps=Accepted", "secrets=Accepted"])
    );
    assert_eq!(
        entry_condition(&fx.catalog_entry(&newer).await, "Ready").0,
        "True"
    );
    kcp_accepts(&fx, &ws).await;
}

/// `--max-items` ends a run part-way through the cycle; the CatalogEntry's cursor resumes it on
/// the next run, on real workspaces.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn the_budget_stops_a_cycle_and_the_cursor_resumes_it() {
    let fx = KcpFx::new("kt-budget").await;
    let (path, export, _, _, _) = providers(&fx).await;
    let entry = unique("compute");
    fx.entry(&entry, &path, &export, vec![req("", "configmaps", None)])
        .await;
    let mut tenants = Vec::new();
    for i in 0..5 {
        tenants.push(fx.tenant(&format!("w{i}")).await);
    }
    // Open the five workspaces (core bindings only), bind them to the provider, and wait until
    // kcp lists all five provider bindings in the core export's virtual workspace (a dry run
    // plans a write for each).
    fx.run().await;
    for ws in &tenants {
        fx.bind(ws, "compute", &path, &export).await;
    }
    within(60, "five bindings visible", || async {
        let s = fx.run_with(&["--dry-run"]).await;
        (s["planned"].to_string().matches("/compute").count() >= 5).then_some(())
    })
    .await;
    let mut updated = Vec::new();
    for _ in 0..5 {
        let s = fx.run_with(&["--max-items", "2"]).await;
        updated.push(s["data_writes"].as_i64().unwrap_or(-1));
        let e = fx.catalog_entry(&entry).await;
        let st = e.status.clone().expect("status");
        if s["outcome"] == "completed" {
            assert_eq!(st.cursor, "");
            assert_eq!((st.bindings_checked, st.bindings_updated), (5, 5));
            assert_eq!(entry_condition(&e, "Ready").1, "InStep");
            break;
        }
        assert_eq!(s["outcome"], "partial", "{s}");
        assert!(!st.cursor.is_empty(), "a cursor is recorded");
        assert_eq!(entry_condition(&e, "Ready").1, "InProgress");
    }
    assert_eq!(updated, vec![2, 2, 1]);
    for ws in &tenants {
        assert_eq!(
            fx.claims(ws, "compute").await,
            strings(&["configmaps=Accepted"])
        );
    }
}

/// An org-owned provider whose requirement on another export's kind names no `provider`: the
/// identity hash kcp gave that export makes it a composition all the same (consent needed), its
/// own and built-in claims are Accepted as for a platform provider; a `--dry-run` first lists
/// the writes and makes none.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn identity_not_the_provider_field_decides_and_a_dry_run_writes_nothing() {
    let fx = KcpFx::new("kt-org").await;
    let (path, export, _, _, storage_path) = providers(&fx).await;
    let entry = unique("compute");
    fx.entry_in_org(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.example.io", "volumes", None),
        ],
        Some("org-acme"),
    )
    .await;
    let yes = fx.tenant("yes").await;
    let no = fx.tenant("no").await;
    for ws in [&yes, &no] {
        fx.bind(ws, "compute", &path, &export).await;
        fx.bind(ws, "storage", &storage_path, "storage.example.io")
            .await;
    }
    let yes_cluster = fx.logical_cluster(&yes).await;
    fx.grant(
        &unique("g"),
        &yes_cluster,
        &entry,
        &[("storage.example.io", "volumes")],
    )
    .await;

    let s = fx.run_with(&["--dry-run"]).await;
    assert_eq!(s["outcome"], "dry-run", "{s}");
    let no_cluster = fx.logical_cluster(&no).await;
    for cluster in [&yes_cluster, &no_cluster] {
        assert!(
            s["planned"]
                .to_string()
                .contains(&format!("APIBinding {cluster}/core")),
            "each core binding's write is listed, by logical cluster: {s}"
        );
    }
    for ws in [&yes, &no] {
        assert!(
            fx.claims(ws, "core").await.is_empty(),
            "dry run wrote nothing"
        );
        assert!(
            fx.claims(ws, "compute").await.is_empty(),
            "dry run wrote nothing"
        );
    }
    assert!(fx.catalog_entry(&entry).await.status.is_none(), "no status");

    let with = |volumes: &str| {
        strings(&[
            "configmaps=Accepted",
            &format!("storage.example.io/volumes={volumes}"),
        ])
    };
    for (ws, want) in [(&yes, with("Accepted")), (&no, with("Rejected"))] {
        fx.reconciled(ws, "compute", &want).await;
        kcp_accepts(&fx, ws).await;
    }
    let s = fx.run().await;
    assert_eq!(s["data_writes"], 0, "{s}");
    let e = fx.catalog_entry(&entry).await;
    assert_eq!(e.spec.org, "org-acme");
    let ready = entry_condition(&e, "Ready");
    assert_eq!(ready.0, "True", "{ready:?}");
}
