//! `kbind claims` against a real kube-apiserver holding kbind's kcp CRDs, reached through the
//! local kcp front (workspace URLs and the core export's virtual workspace), plus the
//! single-cluster mode straight against the apiserver.

use crate::support;

use kbind::api::kcp::APIBinding;
use kbind::api::providers::Requirement;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeSet;
use support::claims_fx::{ClaimsFx, claim, entry_condition, held, req};
use support::{kbind, kbind_async, unique};

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    v.sort();
    v
}

fn count(summary: &serde_json::Value, key: &str) -> i64 {
    summary["counts"][key].as_i64().unwrap_or(0)
}

/// [`provider`] and a CatalogEntry for it with `requires`: (path, export, entry name).
async fn provider_entry(fx: &ClaimsFx, requires: Vec<Requirement>) -> (String, String, String) {
    let (path, export) = fx.provider().await;
    let entry = unique("compute");
    fx.entry(&entry, &path, &export, requires).await;
    (path, export, entry)
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn compositions_are_accepted_only_with_recorded_consent() {
    let fx = ClaimsFx::new("cl-comp").await;
    let (path, export, entry) = provider_entry(
        &fx,
        vec![
            req("", "configmaps", None),
            req("storage.io", "volumes", Some("storage")),
        ],
    )
    .await;
    let consenting = fx.workspace("yes").await;
    let other = fx.workspace("no").await;
    for ws in [&consenting, &other] {
        fx.binding(ws, "compute", &path, &export, vec![]).await;
    }
    let rejected = pairs(&[
        ("configmaps", "Accepted"),
        ("storage.io/volumes", "Rejected"),
    ]);

    // No Grant store configured: every composition Rejected.
    fx.run(&["--no-grants"]).await;
    for ws in [&consenting, &other] {
        assert_eq!(fx.claims(ws, "compute").await, rejected);
    }
    // A Grant store without this workspace's consent: still Rejected.
    fx.grant(
        &consenting,
        "some-other-provider",
        &[("storage.io", "volumes")],
    )
    .await;
    fx.run(&[]).await;
    assert_eq!(fx.claims(&consenting, "compute").await, rejected);

    // Consent recorded later: the hub's own placeholder becomes Accepted, only there.
    fx.grant(&consenting, &entry, &[("storage.io", "volumes")])
        .await;
    let s = fx.run(&[]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    assert_eq!(
        fx.claims(&consenting, "compute").await,
        pairs(&[
            ("configmaps", "Accepted"),
            ("storage.io/volumes", "Accepted")
        ])
    );
    assert_eq!(fx.claims(&other, "compute").await, rejected);
    let b = fx.get_binding(&consenting, "compute").await;
    let volumes = b
        .spec
        .permission_claims
        .iter()
        .find(|c| c.resource == "volumes")
        .unwrap();
    assert_eq!(
        volumes.identity_hash, "h-storage",
        "identityHash copied from the export"
    );
    assert_eq!(
        volumes.verbs,
        vec!["get", "list"],
        "verbs copied from the export"
    );
}

/// Whether a requirement needs consent is decided by the identityHash its export claim carries,
/// not by the `provider` field the provider writes itself: leaving `provider` out of a claim on
/// another export's kinds must not skip the workspace's consent (docs/hostile-inputs.md).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_composition_with_provider_omitted_and_a_foreign_identity_needs_consent() {
    let fx = ClaimsFx::new("cl-idc").await;
    let path = format!("root:{}", unique("prov"));
    let export = format!("{}.compute.io", unique("c"));
    let own_identity = unique("h-own");
    fx.export(
        &path,
        &export,
        vec![
            claim("configmaps", &["get"], ""),
            claim("compute.io/instances", &["*"], &own_identity),
            claim("hub.io/tenants", &["get"], &fx.core_identity),
            claim("storage.io/volumes", &["get", "list"], "h-storage"),
        ],
        &own_identity,
    )
    .await;
    let entry = unique("compute");
    // Not one requirement names a provider, the one on storage's volumes included.
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("compute.io", "instances", None),
            req("hub.io", "tenants", None),
            req("storage.io", "volumes", None),
        ],
    )
    .await;
    let consenting = fx.workspace("yes").await;
    let other = fx.workspace("no").await;
    let upgraded = fx.workspace("old").await;
    for ws in [&consenting, &other] {
        fx.binding(ws, "compute", &path, &export, vec![]).await;
    }
    // What kbind 0.1 wrote: the foreign claim Accepted on the provider's word alone.
    fx.binding(
        &upgraded,
        "compute",
        &path,
        &export,
        vec![held(
            "storage.io/volumes",
            &["get", "list"],
            "h-storage",
            "Accepted",
        )],
    )
    .await;
    fx.grant(&consenting, &entry, &[("storage.io", "volumes")])
        .await;
    let with = |volumes: &str| {
        pairs(&[
            ("configmaps", "Accepted"),
            ("compute.io/instances", "Accepted"),
            ("hub.io/tenants", "Accepted"),
            ("storage.io/volumes", volumes),
        ])
    };

    fx.run(&[]).await;
    assert_eq!(
        fx.claims(&consenting, "compute").await,
        with("Accepted"),
        "own identity, core identity and built-ins are own; the foreign one has consent"
    );
    assert_eq!(
        fx.claims(&other, "compute").await,
        with("Rejected"),
        "a foreign identityHash without consent is Rejected though no provider is named"
    );
    assert_eq!(
        fx.claims(&upgraded, "compute").await,
        with("Rejected"),
        "an acceptance by self-declaration is withdrawn until the workspace consents"
    );
    let e = fx.catalog_entry(&entry).await;
    assert_eq!(entry_condition(&e, "IdentityKnown").1, "IdentitiesRead");
    let ready = entry_condition(&e, "Ready");

    let again = fx.run(&[]).await;
    assert_eq!(again["data_writes"], 0, "{again}");
    let e = fx.catalog_entry(&entry).await;
    assert_eq!(entry_condition(&e, "Ready").1, ready.1);

    // The upgraded workspace consents: kbind's placeholder becomes Accepted, only there.
    fx.grant(&upgraded, &entry, &[("storage.io", "volumes")])
        .await;
    let s = fx.run(&[]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    assert_eq!(fx.claims(&upgraded, "compute").await, with("Accepted"));
    assert_eq!(fx.claims(&other, "compute").await, with("Rejected"));
}

/// An export whose identityHash cannot be read yet: its claims cannot be told from another
/// export's, so they need consent until it can, and the CatalogEntry says why.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_unreadable_own_identity_fails_safe_and_says_so() {
    let fx = ClaimsFx::new("cl-idu").await;
    let path = format!("root:{}", unique("prov"));
    let export = format!("{}.compute.io", unique("c"));
    let own_identity = unique("h-own");
    let claims = vec![
        claim("configmaps", &["get"], ""),
        claim("compute.io/instances", &["*"], &own_identity),
    ];
    fx.export(&path, &export, claims.clone(), "").await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("compute.io", "instances", None),
        ],
    )
    .await;
    let ws = fx.workspace("ws").await;
    fx.binding(&ws, "compute", &path, &export, vec![]).await;

    fx.run(&[]).await;
    assert_eq!(
        fx.claims(&ws, "compute").await,
        pairs(&[
            ("compute.io/instances", "Rejected"),
            ("configmaps", "Accepted")
        ])
    );
    let (status, reason, message) =
        entry_condition(&fx.catalog_entry(&entry).await, "IdentityKnown");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ExportIdentityUnknown")
    );
    assert!(message.contains(&export), "{message}");
    let again = fx.run(&[]).await;
    assert_eq!(again["data_writes"], 0, "{again}");

    // kcp fills the identity in: the placeholder becomes Accepted without any consent.
    fx.export(&path, &export, claims, &own_identity).await;
    let s = fx.run(&[]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    assert_eq!(
        fx.claims(&ws, "compute").await,
        pairs(&[
            ("compute.io/instances", "Accepted"),
            ("configmaps", "Accepted")
        ])
    );
    let (status, reason, _) = entry_condition(&fx.catalog_entry(&entry).await, "IdentityKnown");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "IdentitiesRead")
    );
}

/// CatalogEntry `entry` has no status yet and its `tenants`' bindings no claims: no run began it.
async fn not_begun(fx: &ClaimsFx, entry: &str, tenants: &[String], run: usize) {
    let e = fx.catalog_entry(entry).await;
    assert!(
        e.status.as_ref().is_none_or(|s| s.conditions.is_empty()),
        "run {run}: {entry} is not begun: {:?}",
        e.status
    );
    for ws in tenants {
        assert_eq!(fx.claims(ws, "compute").await, vec![], "run {run}: {ws}");
    }
}

/// docs/claims.md "Cycles, budget and the cursor": a run whose budget is spent takes no further
/// CatalogEntry. The entries after it keep their status and their bindings until a run reaches
/// them; the runs after it go on where it stopped, and then write nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_whose_budget_is_spent_takes_no_further_entry() {
    let fx = ClaimsFx::new("cl-budget").await;
    let (path_a, export_a) = fx.provider().await;
    let (path_b, export_b) = fx.provider().await;
    // Entries are taken in name order: `a` before `b`.
    let a = format!("a-{}", unique("entry"));
    let b = format!("b-{}", unique("entry"));
    let configmaps = || vec![req("", "configmaps", None)];
    fx.entry(&a, &path_a, &export_a, configmaps()).await;
    let tenants_a = fx.tenants(2, &path_a, &export_a).await;
    let tenants_b = fx.tenants(2, &path_b, &export_b).await;
    // Everything settled but entry `b`, which does not exist yet.
    fx.run(&[]).await;
    assert_eq!(fx.run(&[]).await["data_writes"], 0);

    // Each of `a`'s bindings and each of `b`'s needs a write now.
    fx.entry(
        &a,
        &path_a,
        &export_a,
        vec![req("", "configmaps", None), req("", "secrets", None)],
    )
    .await;
    fx.entry(&b, &path_b, &export_b, configmaps()).await;
    let both = pairs(&[("configmaps", "Accepted"), ("secrets", "Accepted")]);
    let accepted = pairs(&[("configmaps", "Accepted")]);

    // Run 1 writes one of `a`'s bindings and stops inside `a`; run 2 writes the other, which
    // ends `a`'s cycle and the budget with it. Neither begins `b`.
    let s = fx.run(&["--max-items", "1"]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    let ready = entry_condition(&fx.catalog_entry(&a).await, "Ready");
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "InProgress"),
        "{ready:?}"
    );
    not_begun(&fx, &b, &tenants_b, 1).await;
    let s = fx.run(&["--max-items", "1"]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    let ready = entry_condition(&fx.catalog_entry(&a).await, "Ready");
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("True", "InStep"),
        "{ready:?}"
    );
    for ws in &tenants_a {
        assert_eq!(fx.claims(ws, "compute").await, both, "{ws}");
    }
    not_begun(&fx, &b, &tenants_b, 2).await;
    // `a` has nothing left to write, so run 3's budget reaches `b`.
    let s = fx.run(&["--max-items", "1"]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    let ready = entry_condition(&fx.catalog_entry(&b).await, "Ready");
    assert_eq!(
        (ready.0.as_str(), ready.1.as_str()),
        ("False", "InProgress"),
        "{ready:?}"
    );
    let s = fx.run(&[]).await;
    assert_eq!(s["data_writes"], 1, "{s}");
    for ws in &tenants_b {
        assert_eq!(fx.claims(ws, "compute").await, accepted, "{ws}");
    }
    assert_eq!(
        entry_condition(&fx.catalog_entry(&b).await, "Ready").1,
        "InStep"
    );
    assert_eq!(fx.run(&[]).await["data_writes"], 0);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn accepted_claims_matching_no_export_claim_are_removed() {
    let fx = ClaimsFx::new("cl-stale").await;
    let (path, export, entry) = provider_entry(&fx, vec![req("storage.io", "volumes", None)]).await;
    let ws = fx.workspace("ws").await;
    // volumes carries another export's identity: a composition, Accepted with consent.
    fx.grant(&ws, &entry, &[("storage.io", "volumes")]).await;
    fx.binding(
        &ws,
        "compute",
        &path,
        &export,
        vec![
            held(
                "storage.io/volumes",
                &["get", "list"],
                "stale-hash",
                "Accepted",
            ),
            held("gone.io/things", &["*"], "h", "Accepted"),
            held("left.io/alone", &["*"], "h", "Rejected"),
        ],
    )
    .await;
    fx.run(&[]).await;
    let b = fx.get_binding(&ws, "compute").await;
    let mut got: Vec<(String, String, String)> = b
        .spec
        .permission_claims
        .iter()
        .map(|c| {
            (
                format!("{}/{}", c.group, c.resource),
                c.identity_hash.clone(),
                format!("{:?}", c.state),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("left.io/alone".into(), "h".into(), "Rejected".into()),
            (
                "storage.io/volumes".into(),
                "h-storage".into(),
                "Accepted".into()
            ),
        ]
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_write_racing_a_tenant_edit_is_retried_not_clobbered() {
    let fx = ClaimsFx::new("cl-race").await;
    let (path, export, _entry) = provider_entry(
        &fx,
        vec![req("", "configmaps", None), req("", "secrets", None)],
    )
    .await;
    let ws = fx.workspace("ws").await;
    // The core binding is already open, so the next patch kbind sends is the provider binding's.
    fx.run(&[]).await;
    fx.binding(&ws, "compute", &path, &export, vec![]).await;
    let tenant_secrets = held("secrets", &["get"], "", "Rejected");
    fx.front.state.race_next_patch(
        &ws,
        "compute",
        json!({"metadata": {"labels": {"tenant": "edited"}},
               "spec": {"permissionClaims": [tenant_secrets]}}),
    );
    fx.run(&[]).await;
    let b = fx.get_binding(&ws, "compute").await;
    assert_eq!(b.labels().get("tenant").map(String::as_str), Some("edited"));
    assert_eq!(
        fx.claims(&ws, "compute").await,
        pairs(&[("configmaps", "Accepted"), ("secrets", "Rejected")]),
        "the tenant's Rejected, written between kbind's read and write, is kept"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn only_workspaces_holding_the_core_binding_are_in_scope_and_core_goes_first() {
    let fx = ClaimsFx::new("cl-scope").await;
    let (path, export, _entry) = provider_entry(&fx, vec![req("", "configmaps", None)]).await;
    let member = fx.workspace("member").await;
    fx.binding(&member, "compute", &path, &export, vec![]).await;
    let stranger = unique("stranger");
    fx.binding(&stranger, "compute", &path, &export, vec![])
        .await;

    // The member's provider binding is invisible until its core binding accepts the
    // apibindings claim; one run does both (it lists again after opening the workspace).
    let s = fx.run(&[]).await;
    assert_eq!(count(&s, "coreBindingsUpdated"), 1, "{s}");
    assert_eq!(
        fx.claims(&member, "compute").await,
        pairs(&[("configmaps", "Accepted")])
    );
    assert_eq!(
        fx.claims(&stranger, "compute").await,
        vec![],
        "out of scope"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn export_renders_exactly_the_claims_bindings_carry() {
    let fx = ClaimsFx::new("cl-export").await;
    let storage_path = format!("root:{}", unique("storage"));
    let storage_export = format!("{}.storage.io", unique("s"));
    fx.export(&storage_path, &storage_export, vec![], "h-storage")
        .await;
    let storage = unique("storage");
    fx.entry(&storage, &storage_path, &storage_export, vec![])
        .await;
    let path = format!("root:{}", unique("compute"));
    let export = format!("{}.compute.io", unique("c"));
    fx.export(&path, &export, vec![], "h-compute").await;
    let entry = unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("compute.io", "instances", None),
            req("compute.io", "instances/exec", None),
            req("storage.io", "volumes", Some(&storage)),
        ],
    )
    .await;

    let mut args = fx.args();
    args.truncate(args.len() - 2); // drop `-o json`
    args.insert(1, "export".into());
    args.insert(2, entry.clone());
    args.retain(|a| a != "--lease-namespace" && *a != fx.ns);
    let sel = args.iter().position(|a| a == "--selector").unwrap();
    args.drain(sel..sel + 2);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kbind"))
        .args(&refs)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let claims = rendered["spec"]["permissionClaims"].clone();
    assert_eq!(
        claims,
        json!([
            {"group": "", "resource": "configmaps", "verbs": ["*"], "identityHash": ""},
            {"group": "compute.io", "resource": "instances", "verbs": ["*"], "identityHash": "h-compute"},
            {"group": "storage.io", "resource": "volumes", "verbs": ["*"], "identityHash": "h-storage"},
        ])
    );

    // The provider publishes that; a consenting workspace's binding then carries exactly it.
    fx.export(
        &path,
        &export,
        serde_json::from_value(claims.clone()).unwrap(),
        "h-compute",
    )
    .await;
    let ws = fx.workspace("ws").await;
    fx.grant(&ws, &entry, &[("storage.io", "volumes")]).await;
    fx.binding(&ws, "compute", &path, &export, vec![]).await;
    fx.run(&[]).await;
    let b = fx.get_binding(&ws, "compute").await;
    let carried: Vec<serde_json::Value> = b
        .spec
        .permission_claims
        .iter()
        .map(|c| json!({"group": c.group, "resource": c.resource, "verbs": c.verbs, "identityHash": c.identity_hash}))
        .collect();
    assert_eq!(json!(carried), claims);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn kcp_mode_without_core_configuration_is_a_usage_error() {
    let fx = ClaimsFx::new("cl-usage").await;
    let kc = fx.kubeconfig();
    let (code, _, stderr) =
        kbind_async(&["claims", "--kubeconfig", &kc, "--lease-namespace", &fx.ns]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--core-export"), "{stderr}");
}

/// Single-cluster mode: a plain API server, no `/clusters` paths; workspaces are named by the
/// `kcp.io/cluster` annotation, so Grants still apply per workspace.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn single_cluster_mode_reconciles_bindings_on_a_plain_apiserver() {
    let fx = ClaimsFx::new("cl-single").await;
    let path = String::new();
    let export = format!("{}.example.io", unique("single"));
    let exports: Api<kbind::api::kcp::APIExport> = Api::all(fx.hub.clone());
    exports
        .patch(
            &export,
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
                "metadata": {"name": export},
                "spec": {"permissionClaims": [
                    claim("configmaps", &["get"], ""),
                    claim("storage.io/volumes", &["get"], "h-storage"),
                ]},
            })),
        )
        .await
        .unwrap();
    let entry = unique("single");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.io", "volumes", Some("storage")),
        ],
    )
    .await;
    let bindings: Api<APIBinding> = Api::all(fx.hub.clone());
    let mut names = Vec::new();
    for ws in ["team-a", "team-b"] {
        let name = unique(ws);
        let body = json!({
            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
            "metadata": {"name": name, "annotations": {"kcp.io/cluster": format!("{ws}-{entry}")}},
            "spec": {"reference": {"export": {"name": export}}},
        });
        bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
        names.push(name);
    }
    fx.grant(
        &format!("team-a-{entry}"),
        &entry,
        &[("storage.io", "volumes")],
    )
    .await;
    let kc = fx.env.provider.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", fx.label);
    let (code, summary, stderr) = kbind(&[
        "claims",
        "--single-cluster",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &fx.ns,
        "--selector",
        &selector,
        "--grant-namespace",
        &fx.ns,
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    let states = |b: APIBinding| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = b
            .spec
            .permission_claims
            .iter()
            .map(|c| (c.resource.clone(), format!("{:?}", c.state)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        states(bindings.get(&names[0]).await.unwrap()),
        pairs(&[("configmaps", "Accepted"), ("volumes", "Accepted")])
    );
    assert_eq!(
        states(bindings.get(&names[1]).await.unwrap()),
        pairs(&[("configmaps", "Accepted"), ("volumes", "Rejected")])
    );
}

/// kcp's own published CRDs (extracted from its Go module by hack/build-servers.sh), installed
/// under a renamed group beside kbind's generated ones: the bindings kbind writes and the export
/// `kbind claims export` renders are accepted by kcp's real schema and CEL rules, and both sides
/// key claims the same way.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn kbind_objects_satisfy_kcps_published_crds() {
    let fx = ClaimsFx::new("cl-pub").await;
    let Some(dir) = std::env::var("KBIND_TEST_KCP_CRDS")
        .ok()
        .filter(|d| !d.is_empty())
    else {
        assert!(
            std::env::var("CI").is_err(),
            "KBIND_TEST_KCP_CRDS unset: hack/build-servers.sh extracts kcp's CRDs"
        );
        return;
    };
    const GROUP: &str = "published.apis.kcp.io";
    let mut installed = Vec::new();
    for file in [
        "apis.kcp.io_apibindings.yaml",
        "apis.kcp.io_apiexports.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let mut crd: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap()
            .replace("apis.kcp.io", GROUP);
        crd["metadata"] = json!({"name": name});
        crd["spec"]["group"] = json!(GROUP);
        // The same list-map keys as kbind's generated CRD for the same kind.
        let ours = kbind::crds::kcp_crds()
            .into_iter()
            .find(|c| c.spec.names.plural == crd["spec"]["names"]["plural"])
            .unwrap();
        let ours = serde_json::to_value(&ours).unwrap();
        let keys = |crd: &serde_json::Value| {
            crd["spec"]["versions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "v1alpha2")
                .map(|v| {
                    v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                        ["permissionClaims"]["x-kubernetes-list-map-keys"]
                        .clone()
                })
                .unwrap()
        };
        assert_eq!(keys(&crd), keys(&ours), "{file}: permissionClaims keys");
        installed.push(serde_json::from_value(crd).unwrap());
    }
    support::apply_crds(&fx.hub, &installed).await;
    let published = |kind: &str, plural: &str| {
        Api::<kube::api::DynamicObject>::all_with(
            fx.hub.clone(),
            &kube::api::ApiResource {
                group: GROUP.into(),
                version: "v1alpha2".into(),
                api_version: format!("{GROUP}/v1alpha2"),
                kind: kind.into(),
                plural: plural.into(),
            },
        )
    };

    // A binding kbind wrote (own claim Accepted, composition Rejected with its placeholder).
    let (path, export) = fx.provider().await;
    let entry = unique("compute");
    let storage = unique("storage");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.io", "volumes", Some(&storage)),
        ],
    )
    .await;
    let ws = fx.workspace("ws").await;
    fx.binding(&ws, "compute", &path, &export, vec![]).await;
    fx.run(&[]).await;
    let written = fx.get_binding(&ws, "compute").await;
    let name = unique("pub");
    let copy = json!({
        "apiVersion": format!("{GROUP}/v1alpha2"), "kind": "APIBinding",
        "metadata": {"name": name, "annotations": written.annotations()},
        "spec": written.spec,
    });
    let bindings = published("APIBinding", "apibindings");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(copy).unwrap(),
        )
        .await
        .expect("kcp's APIBinding schema accepts the binding kbind wrote");

    // kbind's next write (consent recorded): kcp's immutable-selector rule lets it through.
    fx.grant(&ws, &entry, &[("storage.io", "volumes")]).await;
    fx.run(&[]).await;
    let rewritten = fx.get_binding(&ws, "compute").await;
    let patch = json!({"spec": {"permissionClaims": rewritten.spec.permission_claims}});
    bindings
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("kcp's CRD accepts kbind's claims update");
    // ... and it does enforce that rule (so the check above could fail).
    let mut moved = rewritten.spec.permission_claims.clone();
    moved[0].selector = serde_json::from_value(json!({"matchLabels": {"x": "y"}})).unwrap();
    let err = bindings
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"permissionClaims": moved}})),
        )
        .await
        .expect_err("a changed selector is refused");
    assert!(err.to_string().contains("immutable"), "{err}");

    // The export `kbind claims export` renders.
    let mut args = vec!["claims".to_string(), "export".into(), entry.clone()];
    args.extend([
        "--kubeconfig".into(),
        fx.kubeconfig(),
        "--core-export".into(),
        fx.core_export.clone(),
        "--core-export-path".into(),
        fx.hub_ws.clone(),
        "--core-binding".into(),
        "core".into(),
    ]);
    fx.entry(&storage, &path, &export, vec![]).await; // the composition's provider
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kbind"))
        .args(&args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rendered: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    rendered["apiVersion"] = json!(format!("{GROUP}/v1alpha2"));
    rendered["metadata"]["name"] = json!(unique("pub"));
    published("APIExport", "apiexports")
        .create(
            &PostParams::default(),
            &serde_json::from_value(rendered).unwrap(),
        )
        .await
        .expect("kcp's APIExport schema accepts the rendered export");
}

type Claims = Vec<(String, String)>;

/// Each workspace's recorded claims (its `compute` and `core` bindings) as `w<i>:<gr>=<state>`.
fn claim_items(per_workspace: &[(Claims, Claims)]) -> BTreeSet<String> {
    per_workspace
        .iter()
        .enumerate()
        .flat_map(|(i, (compute, core))| {
            compute
                .iter()
                .chain(core)
                .map(move |(gr, state)| format!("w{i}:{gr}={state}"))
        })
        .collect()
}

/// Crash points: a run aborted right after each of its data writes (the crash knob), then an
/// ordinary run, ends in exactly the state one uninterrupted run reaches, and a further run
/// writes nothing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_killed_after_any_write_then_rerun_converges() {
    let want_consented = pairs(&[
        ("configmaps", "Accepted"),
        ("secrets", "Accepted"),
        ("storage.io/volumes", "Accepted"),
    ]);
    let want_other = pairs(&[
        ("configmaps", "Accepted"),
        ("secrets", "Accepted"),
        ("storage.io/volumes", "Rejected"),
    ]);
    // What an uninterrupted run records, per workspace: w0 consented to storage.
    let want: Vec<_> = (0..3)
        .map(|i| {
            let compute = if i == 0 { &want_consented } else { &want_other };
            (
                compute.clone(),
                pairs(&[("apis.kcp.io/apibindings", "Accepted")]),
            )
        })
        .collect();
    let want_claims = claim_items(&want);
    // Three core bindings and three provider bindings: six data writes in a cold run.
    let mut tally = support::Tally::new("claims", "writes");
    for crash_after in support::crash_points("claims writes", 6) {
        let point = format!("write {crash_after}");
        let fx = ClaimsFx::new("cl-crash").await;
        let (path, export) = fx.provider().await;
        let entry = unique("compute");
        fx.entry(
            &entry,
            &path,
            &export,
            vec![
                req("", "configmaps", None),
                req("", "secrets", None),
                req("storage.io", "volumes", Some("storage")),
            ],
        )
        .await;
        let workspaces = fx.tenants(3, &path, &export).await;
        fx.grant(&workspaces[0], &entry, &[("storage.io", "volumes")])
            .await;

        let crashed = support::namespace(&fx.hub, "cl-crashed").await;
        let n = crash_after.to_string();
        let (code, _, stderr) = fx
            .run_with(&crashed, &[("KBIND_CRASH_AFTER_WRITES", n.as_str())])
            .await;
        assert_ne!(code, 0, "{point} did not stop the run: {stderr}");
        assert!(stderr.contains("reached"), "{stderr}");

        let (code, summary, stderr) = fx.run_with(&fx.ns, &[]).await;
        if code != 0 {
            tally.failed(&point, format!("rerun: {summary}\n{stderr}"));
            continue;
        }
        let mut got = Vec::new();
        for ws in &workspaces {
            got.push((fx.claims(ws, "compute").await, fx.claims(ws, "core").await));
        }
        let got_claims = claim_items(&got);
        // Converged: a further run writes nothing.
        let again = fx.run(&[]).await;
        // Nothing redone, nothing skipped: the rerun makes exactly the writes left, and a
        // further run none.
        let writes = |s: &serde_json::Value| s["data_writes"].as_u64().unwrap_or(u64::MAX);
        tally.point(
            &point,
            &(&want, 6 - crash_after, 0),
            &(&got, writes(&summary), writes(&again)),
            &want_claims,
            &got_claims,
        );
    }
    tally.finish();
}
