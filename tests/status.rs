//! `kbind status` against the harness servers, run as the real binary: what an operator sees,
//! and the exit code a script relies on (0 everything Ready, 3 something not, docs/operations.md).
//! Each test limits the report to its own objects with `-l kbind-test=<label>`: the servers are
//! shared with every other test.

use crate::support;

use kbind::api::core::{ClusterBinding, Connection};
use kbind_testkit::faults::{FaultConfig, FaultProxy};
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use support::fx::{Fx, cond};

/// Run `kbind status` on the consumer (or `kubeconfig`) for this fixture's objects; returns
/// (exit code, stdout, stderr).
fn status(kubeconfig: &str, label: &str, extra: &[&str]) -> (i32, String, String) {
    let selector = format!("kbind-test={label}");
    let mut args = vec!["status", "--kubeconfig", kubeconfig, "-l", &selector];
    args.extend_from_slice(extra);
    let out = support::kbind_command(&args).output().expect("run kbind");
    support::keep_emitted(&out);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn consumer_kubeconfig(fx: &Fx) -> String {
    fx.env.consumer.to_string_lossy().into_owned()
}

/// The table row of `name` under the `Kind.group` heading `section`, split into cells.
fn row<'a>(table: &'a str, section: &str, name: &str) -> Vec<&'a str> {
    table
        .split("\n\n")
        .find(|s| s.lines().next() == Some(section))
        .unwrap_or_else(|| panic!("no {section} section in:\n{table}"))
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row {name} under {section} in:\n{table}"))
}

/// The JSON item `name` of `kind`.
fn json_item<'a>(report: &'a Value, kind: &str, name: &str) -> &'a Value {
    report["kinds"]
        .as_array()
        .expect("kinds")
        .iter()
        .find(|k| k["kind"] == kind)
        .and_then(|k| k["items"].as_array())
        .and_then(|items| items.iter().find(|i| i["name"] == name))
        .unwrap_or_else(|| panic!("no {kind} {name} in {report:#}"))
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_ready_connection_and_its_binding_exit_0_with_their_rows_and_json_agrees() {
    let fx = Fx::new("status").await;
    let (api, conn, cb) = fx.bound_api("widgets", "Namespaced").await;
    // One object in sync, so the per-API counts say something.
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let mut w = DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 1}}));
    w.metadata.namespace = Some(fx.ns.clone());
    Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &ar)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    fx.pass("resync", &[]);
    let bound = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(bound.bound_apis[0].in_sync, Some(1), "{bound:?}");
    let exports = fx.conn(&conn).await.status.unwrap().exported_apis.len();

    let kc = consumer_kubeconfig(&fx);
    let (code, table, stderr) = status(&kc, &fx.label, &["-o", "text"]);
    println!("kbind status -l kbind-test={}:\n{table}", fx.label);
    assert_eq!(code, 0, "everything is Ready:\n{table}\n{stderr}");
    assert_eq!(
        row(&table, "Connection.core.kbind.io", &conn),
        [conn.as_str(), "True", "True", &exports.to_string()]
    );
    assert_eq!(
        row(&table, "ClusterBinding.core.kbind.io", &cb),
        [
            cb.as_str(),
            &conn,
            "True",
            &api,
            "1",
            "0",
            "0",
            "0",
            "0",
            "0"
        ]
    );
    assert!(table.contains("All kbind resources are Ready."), "{table}");
    // The same facts for scripts.
    let (code, out, stderr) = status(&kc, &fx.label, &["-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&out).expect("-o json parses");
    assert_eq!(report["ready"], true);
    let c = json_item(&report, "Connection", &conn);
    assert_eq!(c["ready"], "True");
    assert_eq!(c["connected"], "True");
    assert_eq!(c["exportedAPIs"], exports);
    let b = json_item(&report, "ClusterBinding", &cb);
    assert_eq!(b["connection"], conn.as_str());
    assert_eq!(
        b["apis"],
        json!([{"name": api, "inSync": 1, "pending": 0, "conflicts": 0, "orphaned": 0,
            "denied": 0, "rejected": 0}])
    );
    let kinds: Vec<(&str, &str)> = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kind"].as_str().unwrap(), k["group"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("Connection", "core.kbind.io"),
            ("ClusterBinding", "core.kbind.io"),
            ("Binding", "core.kbind.io"),
            ("CatalogEntry", "providers.kbind.io"),
            ("RelationshipSource", "agentprimitives.authzed.com"),
            ("Grant", "tenancy.kbind.io"),
            ("Export", "catalog.kbind.io"),
            ("Collection", "catalog.kbind.io"),
            ("Grant", "iam.kbind.io"),
        ]
    );
    // -o yaml too.
    let (code, out, _) = status(&kc, &fx.label, &["-o", "yaml"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("kind: Connection") && out.contains(&conn),
        "{out}"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_connection_with_a_broken_secret_exits_3_naming_the_reason() {
    let fx = Fx::new("stbroken").await;
    fx.secret("broken", "kubeconfig", "this is not a kubeconfig")
        .await;
    let conn = fx
        .connection("p", "broken", json!({"source": "CRD"}), false)
        .await;
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap();
    let (ready, reason, message) = cond(&st.conditions, "Ready");
    assert_eq!(ready, "False", "{st:?}");
    // The reason `kbind schema` gives a Secret whose key holds no kubeconfig (docs/schema.md).
    assert_eq!(reason, "InvalidKubeconfig", "{st:?}");

    let kc = consumer_kubeconfig(&fx);
    let (code, table, stderr) = status(&kc, &fx.label, &[]);
    println!("kbind status -l kbind-test={}:\n{table}", fx.label);
    assert_eq!(code, 3, "something is not Ready:\n{table}\n{stderr}");
    let cells = row(&table, "Connection.core.kbind.io", &conn);
    assert_eq!(cells[1], "False", "{table}");
    let line = table.lines().find(|l| l.starts_with(&conn)).unwrap();
    assert!(
        line.contains(&format!("{reason}:")),
        "names the reason: {line}"
    );
    assert!(table.contains("not Ready (exit code 3)"), "{table}");

    let (code, out, _) = status(&kc, &fx.label, &["-o", "json"]);
    assert_eq!(code, 3);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["ready"], false);
    let c = json_item(&report, "Connection", &conn);
    assert_eq!(
        (&c["ready"], &c["reason"], &c["message"]),
        (&json!("False"), &json!(reason), &json!(message))
    );
    // Read-only: the report changed nothing on the Connection.
    assert_eq!(fx.conn(&conn).await.status.unwrap(), st);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_object_its_pass_never_handled_is_not_ready() {
    let fx = Fx::new("stnew").await;
    let conn = fx
        .connection("p", "absent", json!({"source": "CRD"}), false)
        .await;
    let (code, out, _) = status(&consumer_kubeconfig(&fx), &fx.label, &["-o", "json"]);
    assert_eq!(code, 3, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let c = json_item(&report, "Connection", &conn);
    assert_eq!(
        (&c["ready"], &c["reason"]),
        (&json!("Unknown"), &json!("NotObserved"))
    );
    let created: Connection = Api::all(fx.consumer.clone()).get(&conn).await.unwrap();
    assert!(created.status.is_none(), "status wrote nothing");
}

/// kbind's groups hidden by the proxy: the real apiserver answers for them as a cluster without
/// kbind's CRDs (a consumer has no CatalogEntries, a bare cluster none at all).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn kinds_the_cluster_does_not_serve_are_skipped_not_an_error() {
    let env = support::env();
    let text = std::fs::read_to_string(&env.consumer).unwrap();
    let config = FaultConfig {
        hidden_groups: [
            "core.kbind.io",
            "providers.kbind.io",
            "agentprimitives.authzed.com",
            "tenancy.kbind.io",
            "catalog.kbind.io",
            "iam.kbind.io",
        ]
        .map(String::from)
        .to_vec(),
        ..FaultConfig::rate(0.0, 1)
    };
    let proxy = FaultProxy::start(&support::server_of(&text), config)
        .await
        .unwrap();
    let kc = support::temp_file("status-bare", &support::via(&text, &proxy.url()));
    let kc = kc.to_string_lossy().into_owned();
    let out =
        tokio::process::Command::from(support::kbind_command(&["status", "--kubeconfig", &kc]))
            .output()
            .await
            .unwrap();
    support::keep_emitted(&out);
    let table = String::from_utf8_lossy(&out.stdout);
    println!("kbind status on a cluster without kbind's CRDs:\n{table}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{table}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for kind in [
        "Connection.core.kbind.io",
        "ClusterBinding.core.kbind.io",
        "Binding.core.kbind.io",
        "CatalogEntry.providers.kbind.io",
        "RelationshipSource.agentprimitives.authzed.com",
        "Grant.tenancy.kbind.io",
        "Export.catalog.kbind.io",
        "Collection.catalog.kbind.io",
        "Grant.iam.kbind.io",
    ] {
        assert!(
            table.contains(&format!("{kind}: not installed on this cluster (skipped)")),
            "{kind}:\n{table}"
        );
    }
    let out = tokio::process::Command::from(support::kbind_command(&[
        "status",
        "--kubeconfig",
        &kc,
        "-o",
        "json",
    ]))
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["installed"] == false && k["items"] == json!([])),
        "{report:#}"
    );
    assert!(proxy.stats.requests() >= 9, "every kind was asked for");
}

#[test]
fn unreachable_api_is_1_and_bad_usage_is_2() {
    let kc = support::temp_file(
        "status-unreachable",
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n",
    );
    let kc = kc.to_string_lossy().into_owned();
    let out = support::kbind_command(&[
        "status",
        "--kubeconfig",
        &kc,
        "--deadline",
        "5s",
        "--request-timeout",
        "1s",
    ])
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = support::kbind_command(&["status", "-o", "xml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The other kinds' rows, from statuses as their passes write them (set here directly).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn catalog_entries_relationship_sources_and_grants_get_their_rows() {
    use kube::api::{Patch, PatchParams};
    let fx = Fx::new("stkinds").await;
    let label = json!({"kbind-test": fx.label});
    let now = "2026-01-02T03:04:05Z";
    let create = |api: kube::api::ApiResource, namespaced: bool, body: Value| {
        let client = fx.consumer.clone();
        let ns = fx.ns.clone();
        async move {
            let o: DynamicObject = serde_json::from_value(body).unwrap();
            let name = o.metadata.name.clone().unwrap();
            let a: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client, &ns, &api)
            } else {
                Api::all_with(client, &api)
            };
            a.create(&PostParams::default(), &o).await.unwrap();
            (a, name)
        }
    };
    let ar = |group: &str, kind: &str, plural: &str| {
        kube::api::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1alpha1", kind),
            plural,
        )
    };
    let entry = format!("{}-entry", fx.label);
    let (entries, _) = create(
        ar("providers.kbind.io", "CatalogEntry", "catalogentries"),
        false,
        json!({"apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
            "metadata": {"name": entry, "labels": label},
            "spec": {"export": {"path": "root:org", "name": "widgets"}}}),
    )
    .await;
    entries
        .patch_status(
            &entry,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"bindingsChecked": 7, "bindingsUpdated": 2,
                "conditions": [{"type": "Ready", "status": "False", "reason": "DuplicateExport",
                    "message": "another entry names root:org/widgets", "lastTransitionTime": now}]}})),
        )
        .await
        .unwrap();
    let (sources, _) = create(
        ar(
            "agentprimitives.authzed.com",
            "RelationshipSource",
            "relationshipsources",
        ),
        true,
        json!({"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
            "metadata": {"name": "slack", "labels": label},
            "spec": {"kind": "slack", "auth": {"agentIdentity": "a", "credential": "c"}}}),
    )
    .await;
    sources
        .patch_status(
            "slack",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "Synced",
                    "message": "", "lastTransitionTime": now}],
                "sync": {"lastSyncTime": now, "enumComplete": false, "resumeAfter": "C07",
                    "lastPass": {"scopesProcessed": 3, "scopeErrors": 1}}}})),
        )
        .await
        .unwrap();
    create(
        ar("tenancy.kbind.io", "Grant", "grants"),
        true,
        json!({"apiVersion": "tenancy.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": "consent", "labels": label},
            "spec": {"workspace": "ws1", "provider": "widgets",
                "compositions": [{"group": "", "resource": "secrets"}]}}),
    )
    .await;

    let (code, table, stderr) = status(&consumer_kubeconfig(&fx), &fx.label, &[]);
    println!("{table}");
    assert_eq!(code, 3, "the CatalogEntry is not Ready:\n{table}\n{stderr}");
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().any(|c| c == name))
            .unwrap_or_else(|| panic!("no row {name}:\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        line(&entry),
        [
            entry.as_str(),
            "False",
            "root:org:widgets",
            "7",
            "2",
            "0",
            "DuplicateExport:",
            "another",
            "entry",
            "names",
            "root:org/widgets"
        ]
    );
    assert_eq!(
        row(
            &table,
            "RelationshipSource.agentprimitives.authzed.com",
            &fx.ns
        ),
        [
            &fx.ns, "slack", "slack", "True", now, "after", "C07", "3", "1"
        ]
    );
    assert_eq!(
        row(&table, "Grant.tenancy.kbind.io", &fx.ns),
        [&fx.ns, "consent", "ws1", "widgets", "1"]
    );
}

/// The service layer's kinds (docs/issue.md): Exports and issued Grants count for the exit code,
/// a Collection has no Ready condition; each kind is headed with its group, so the two Grants
/// (`tenancy.kbind.io`, `iam.kbind.io`) are told apart.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn exports_collections_and_issued_grants_get_their_rows_under_their_groups() {
    use kube::api::{Patch, PatchParams};
    let fx = Fx::new("stsvc").await;
    let label = json!({"kbind-test": fx.label});
    let now = "2026-01-02T03:04:05Z";
    let ar = |group: &str, kind: &str, plural: &str| {
        kube::api::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1alpha1", kind),
            plural,
        )
    };
    let create = |ar: kube::api::ApiResource, body: Value| {
        let client = fx.consumer.clone();
        async move {
            let o: DynamicObject = serde_json::from_value(body).unwrap();
            let a: Api<DynamicObject> = Api::all_with(client, &ar);
            a.create(&PostParams::default(), &o).await.unwrap();
            a
        }
    };
    let ready = |status: &str, reason: &str, message: &str| {
        json!([{"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now}])
    };
    let (exp, coll) = (format!("{}-x", fx.label), format!("{}-c", fx.label));
    let (pinned, unpinned) = (format!("{}-g1", fx.label), format!("{}-g2", fx.label));
    let exports = create(
        ar("catalog.kbind.io", "Export", "exports"),
        json!({"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export",
            "metadata": {"name": exp, "labels": label},
            "spec": {"apis": [{"name": "widgets.a.kbind.test"}, {"name": "gadgets.a.kbind.test"}]}}),
    )
    .await;
    exports
        .patch_status(
            &exp,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"missingAPIs": ["gadgets.a.kbind.test"],
                "conditions": ready("False", "APINotExported", "gadgets.a.kbind.test is not exported")}})),
        )
        .await
        .unwrap();
    create(
        ar("catalog.kbind.io", "Collection", "collections"),
        json!({"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Collection",
            "metadata": {"name": coll, "labels": label},
            "spec": {"exports": [{"name": exp}, {"name": "other"}]}}),
    )
    .await;
    let grants_ar = ar("iam.kbind.io", "Grant", "grants");
    let grants = create(
        grants_ar.clone(),
        json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": pinned, "labels": label},
            "spec": {"export": exp, "consumer": "team-a", "tokenTTL": "1h"}}),
    )
    .await;
    grants
        .patch_status(
            &pinned,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"expiresAt": now,
                "consumerCluster": "0f6f7c1e-uid", "conditions": ready("True", "Issued", "")}})),
        )
        .await
        .unwrap();
    create(
        grants_ar,
        json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": unpinned, "labels": label},
            "spec": {"collection": coll, "consumer": "team-b"}}),
    )
    .await;

    let (code, table, stderr) = status(&consumer_kubeconfig(&fx), &fx.label, &[]);
    println!("{table}");
    assert_eq!(code, 3, "the Export is not Ready:\n{table}\n{stderr}");
    assert_eq!(
        row(&table, "Export.catalog.kbind.io", &exp),
        [
            exp.as_str(),
            "False",
            "2",
            "1",
            "APINotExported:",
            "gadgets.a.kbind.test",
            "is",
            "not",
            "exported"
        ]
    );
    let exports_cell = format!("{exp},other");
    assert_eq!(
        row(&table, "Collection.catalog.kbind.io", &coll),
        [coll.as_str(), exports_cell.as_str()]
    );
    let for_export = format!("export/{exp}");
    assert_eq!(
        row(&table, "Grant.iam.kbind.io", &pinned),
        [
            pinned.as_str(),
            "True",
            "team-a",
            for_export.as_str(),
            now,
            "0f6f7c1e-uid"
        ]
    );
    let for_collection = format!("collection/{coll}");
    assert_eq!(
        row(&table, "Grant.iam.kbind.io", &unpinned),
        [
            unpinned.as_str(),
            "Unknown",
            "team-b",
            for_collection.as_str(),
            "-",
            "not-pinned",
            "NotObserved:",
            "no",
            "Ready",
            "condition",
            "yet:",
            "its",
            "pass",
            "has",
            "not",
            "handled",
            "this",
            "obje…"
        ]
    );
    // The claims Grant keeps its own heading: the two Grants are never one table.
    assert!(
        table.contains("Grant.tenancy.kbind.io\nNo resources found."),
        "{table}"
    );

    let (code, out, _) = status(&consumer_kubeconfig(&fx), &fx.label, &["-o", "json"]);
    assert_eq!(code, 3);
    let report: Value = serde_json::from_str(&out).unwrap();
    let groups: Vec<(&str, &str)> = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["kind"].as_str().unwrap(), k["group"].as_str().unwrap()))
        .filter(|(k, _)| *k == "Grant")
        .collect();
    assert_eq!(
        groups,
        [("Grant", "tenancy.kbind.io"), ("Grant", "iam.kbind.io")]
    );
    let iam = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["group"] == "iam.kbind.io")
        .unwrap();
    let g = iam["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == pinned.as_str())
        .unwrap();
    assert_eq!(g["ready"], "True");
    assert_eq!(g["consumerCluster"], "0f6f7c1e-uid");
    assert_eq!(g["expiresAt"], now);
    assert_eq!(g["export"], exp.as_str());
    assert_eq!(
        json_item(&report, "Export", &exp)["missingAPIs"],
        json!(["gadgets.a.kbind.test"])
    );
    assert_eq!(json_item(&report, "Collection", &coll).get("ready"), None);

    // Made Ready, the Export no longer holds the report back; the unpinned Grant still does.
    exports
        .patch_status(
            &exp,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"missingAPIs": null,
                "conditions": ready("True", "Exported", "")}})),
        )
        .await
        .unwrap();
    let (code, table, _) = status(&consumer_kubeconfig(&fx), &fx.label, &[]);
    assert_eq!(code, 3, "the second Grant has no Ready condition:\n{table}");
    grants
        .patch_status(
            &unpinned,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": ready("True", "Issued", "")}})),
        )
        .await
        .unwrap();
    let (code, table, _) = status(&consumer_kubeconfig(&fx), &fx.label, &[]);
    assert_eq!(code, 0, "{table}");
}
