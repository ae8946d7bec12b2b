//! The CRDs: checked in exactly as generated, installable, accepting the samples users copy, and
//! refusing bad input with a message that names the problem.

use crate::support;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde_json::{Value, json};

#[test]
fn checked_in_crds_match_the_types() {
    for (file, crds) in [
        ("deploy/crds/kbind.yaml", kbind::crds::kbind_crds()),
        ("deploy/crds/kcp/kcp.yaml", kbind::crds::kcp_crds()),
    ] {
        let want = kbind::crds::to_yaml(&crds).unwrap();
        let have = std::fs::read_to_string(file).unwrap_or_default();
        assert!(
            have == want,
            "{file} is stale: regenerate with `cargo run -- crds > deploy/crds/kbind.yaml` \
             (and copy it to charts/kbind/crds/) and `cargo run -- crds --kcp > deploy/crds/kcp/kcp.yaml`"
        );
    }
}

/// Every property under `schema` (objects' properties, arrays' items), with its path, that has no
/// description.
fn undescribed(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (name, p) in props {
            let here = format!("{path}.{name}");
            if p["description"]
                .as_str()
                .is_none_or(|d| d.trim().is_empty())
            {
                out.push(here.clone());
            }
            undescribed(p, &here, out);
        }
    }
    if schema["items"].is_object() {
        undescribed(&schema["items"], &format!("{path}[]"), out);
    }
}

/// What `kubectl explain` shows: every kind has a written description (not kube-derive's
/// "Auto-generated derived type for …Spec via `CustomResource`"), and so has every spec field,
/// nested ones included; every kind is in the category `kbind` (`kubectl get kbind`), has a
/// `kb…` short name, and a kind with conditions shows Ready's reason and message at priority 1
/// (`kubectl get -o wide`).
#[test]
fn every_crd_explains_itself() {
    let mut missing = Vec::new();
    for crd in kbind::crds::kbind_crds() {
        let crd = serde_json::to_value(&crd).unwrap();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        let version = &crd["spec"]["versions"][0];
        let schema = &version["schema"]["openAPIV3Schema"];
        let description = schema["description"].as_str().unwrap_or_default();
        assert!(
            description.len() > 40 && !description.contains("Auto-generated"),
            "{kind}: kind description {description:?}"
        );
        undescribed(
            &schema["properties"]["spec"],
            &format!("{kind}.spec"),
            &mut missing,
        );
        let names = &crd["spec"]["names"];
        assert!(
            names["categories"]
                .as_array()
                .is_some_and(|c| c.contains(&json!("kbind"))),
            "{kind}: category kbind"
        );
        let short = names["shortNames"].as_array().cloned().unwrap_or_default();
        let kb_kind = crd["spec"]["group"].as_str().unwrap().ends_with("kbind.io");
        assert!(
            !kb_kind
                || short
                    .iter()
                    .any(|s| s.as_str().is_some_and(|s| s.starts_with("kb"))),
            "{kind}: a kb… short name: {short:?}"
        );
        if schema["properties"]["status"]["properties"]["conditions"].is_object() {
            let columns = version["additionalPrinterColumns"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for (name, field) in [("Reason", "reason"), ("Message", "message")] {
                assert!(
                    columns.iter().any(|c| c["name"] == name
                        && c["priority"] == 1
                        && c["jsonPath"]
                            == format!(".status.conditions[?(@.type==\"Ready\")].{field}")),
                    "{kind}: no {name} column at priority 1: {columns:?}"
                );
            }
        }
    }
    assert!(
        missing.is_empty(),
        "spec fields without a description: {missing:#?}"
    );
}

/// `cate` stays as an alias of CatalogEntry's `kbcat` (scripts written for 0.1 keep working).
#[test]
fn catalog_entry_keeps_its_old_short_name() {
    let crd = kbind::crds::kbind_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "CatalogEntry")
        .unwrap();
    let short = crd.spec.names.short_names.unwrap_or_default();
    assert!(
        short.contains(&"kbcat".to_string()) && short.contains(&"cate".to_string()),
        "{short:?}"
    );
}

/// `kubectl get relsrc` (docs/relsync.md): RelationshipSource keeps its short name.
#[test]
fn relationship_source_answers_to_relsrc() {
    let crd = kbind::crds::kbind_crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "RelationshipSource")
        .unwrap();
    let short = crd.spec.names.short_names.unwrap_or_default();
    assert!(short.contains(&"relsrc".to_string()), "{short:?}");
}

fn resource_of(obj: &Value) -> ApiResource {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let crd = kbind::crds::kbind_crds()
        .into_iter()
        .find(|c| c.spec.group == group && c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"));
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        &crd.spec.names.plural,
    )
}

fn api_for(client: &Client, obj: &Value) -> Api<DynamicObject> {
    let ar = resource_of(obj);
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Server-side dry-run create: full validation (schema, CEL), nothing persisted.
async fn dry_create(client: &Client, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let o: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    api_for(client, obj)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &o,
        )
        .await
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn every_crd_installs_and_every_sample_is_accepted() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    support::apply_crds(&client, &kbind::crds::kcp_crds()).await;
    let mut n = 0;
    for file in [
        "config/samples/core.yaml",
        "config/samples/claims.yaml",
        "config/samples/relsync.yaml",
    ] {
        let text = std::fs::read_to_string(file).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
            // Sample namespaces may not exist here; validate them in one that does.
            if doc["metadata"]["namespace"].is_string() {
                doc["metadata"]["namespace"] = json!("default");
            }
            let created = dry_create(&client, &doc)
                .await
                .unwrap_or_else(|e| panic!("{file}: {} refused: {e}", doc["metadata"]["name"]));
            // Defaults from the contract are filled in by the server.
            if doc["kind"] == "ClusterBinding" || doc["kind"] == "Binding" {
                assert!(created.data["spec"]["conflictPolicy"].is_string());
            }
            n += 1;
        }
    }
    assert_eq!(n, 8, "every sample document validated");

    // Short names reach kubectl through discovery: `kubectl get relsrc`.
    let req = http::Request::get("/apis/agentprimitives.authzed.com/v1alpha1")
        .body(Vec::new())
        .unwrap();
    let list: Value = client.request(req).await.unwrap();
    let sources = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "relationshipsources")
        .unwrap_or_else(|| panic!("relationshipsources served: {list}"));
    assert!(
        sources["shortNames"]
            .as_array()
            .is_some_and(|s| s.contains(&json!("relsrc"))),
        "{sources}"
    );

    // Defaults: a minimal Connection gets the contract's defaults.
    let minimal = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": {"name": support::unique("minimal")},
        "spec": {"kubeconfigSecretRef": {"namespace": "ns", "name": "s"}}});
    let got = dry_create(&client, &minimal).await.unwrap();
    assert_eq!(
        got.data["spec"],
        json!({"autoBind": false, "kubeconfigSecretRef": {"namespace": "ns", "name": "s", "key": "kubeconfig"},
               "schema": {"source": "Auto", "pullPolicy": "Bound", "updatePolicy": "Always"}})
    );
}

fn binding(api: &str) -> Value {
    json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Binding",
        "metadata": {"name": support::unique("b"), "namespace": "default"},
        "spec": {"connectionRef": {"name": "p"}, "apis": [{"name": api}]}})
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn invalid_objects_are_refused_with_a_message_naming_the_problem() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    let conn = |schema: Value| {
        json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "metadata": {"name": support::unique("bad")},
            "spec": {"kubeconfigSecretRef": {"namespace": "ns", "name": "s"}, "schema": schema}})
    };
    let relsrc = |sync: Value| {
        json!({"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
            "metadata": {"name": support::unique("r"), "namespace": "default"},
            "spec": {"kind": "slack", "auth": {"agentIdentity": "a", "credential": "c"}, "sync": sync}})
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "bad source enum",
            conn(json!({"source": "Crd"})),
            "supported values",
        ),
        (
            "bad pullPolicy enum",
            conn(json!({"pullPolicy": "Eager"})),
            "supported values",
        ),
        ("api named by Kind", binding("Widget"), "<plural>.<group>"),
        (
            "api named by URL",
            binding("https://example.org/apis/widgets"),
            "<plural>.<group>",
        ),
        ("api without group", binding("widgets"), "<plural>.<group>"),
        (
            "api with version",
            binding("widgets.v1.example.org/v1"),
            "<plural>.<group>",
        ),
        (
            // Zero is accepted: unbounded (docs/relsync.md).
            "maxScopesPerPass -1",
            relsrc(json!({"maxScopesPerPass": -1})),
            "greater than or equal to 0",
        ),
        (
            "conflictPolicy enum",
            {
                let mut b = binding("widgets.example.org");
                b["spec"]["conflictPolicy"] = json!("Overwrite");
                b
            },
            "supported values",
        ),
    ];
    for (what, obj, needle) in cases {
        match dry_create(&client, &obj).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{what}: {s:?}");
                assert!(
                    s.message.contains(needle),
                    "{what}: message {:?} lacks {needle:?}",
                    s.message
                );
            }
            other => panic!("{what}: expected 422, got {other:?}"),
        }
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn immutable_fields_cannot_change() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    let name = support::unique("immutable");
    let obj = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": {"name": name},
        "spec": {"kubeconfigSecretRef": {"namespace": "ns", "name": "s"}}});
    let api = api_for(&client, &obj);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(obj.clone()).unwrap(),
    )
    .await
    .unwrap();

    let pp = PatchParams::default();
    let err = api
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"spec": {"kubeconfigSecretRef": {"name": "other"}}})),
        )
        .await
        .expect_err("changing kubeconfigSecretRef must be refused");
    assert!(
        err.to_string().contains("kubeconfigSecretRef is immutable"),
        "{err}"
    );

    // Recording the UIDs the first time is allowed; changing them afterwards is not.
    api.patch_status(
        &name,
        &pp,
        &Patch::Merge(json!({"status": {"remoteClusterUID": "r1", "localClusterUID": "l1"}})),
    )
    .await
    .expect("first recording of the UIDs");
    for field in ["remoteClusterUID", "localClusterUID"] {
        let err = api
            .patch_status(
                &name,
                &pp,
                &Patch::Merge(json!({"status": {field: "changed"}})),
            )
            .await
            .expect_err("changing a pinned UID must be refused");
        assert!(
            err.to_string().contains(&format!("{field} is immutable")),
            "{err}"
        );
        let err = api
            .patch_status(&name, &pp, &Patch::Merge(json!({"status": {field: null}})))
            .await
            .expect_err("removing a pinned UID must be refused");
        assert!(err.to_string().contains("immutable"), "{err}");
    }
    api.delete(&name, &Default::default()).await.unwrap();
}
