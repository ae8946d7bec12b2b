//! Benchmark of `kbind claims` (run through `hack/bench.sh claims`, which starts the servers).
//!
//! N bindings (default 5,000), each in its own workspace, to one provider export, on the real
//! apiserver in single-cluster mode (workspaces named by `kcp.io/cluster`). Passes: cold (every
//! binding gets its claim), unchanged, and a requirement change (every binding gets one more).
//! Two baselines issue the same N precondition-carrying merge patches directly with a plain
//! client, on their own sets of bindings listed once: one at a time (sequential), and
//! `BENCH_CONCURRENCY` at a time (parallel; kbind runs with the same `--write-concurrency`).
//! `BENCH_LATENCY=5ms` sends kbind's and the baselines' requests through a loopback proxy adding
//! that delay. Prints figures; asserts nothing about time.

mod common;

use std::time::Instant;

use futures::{StreamExt, stream};
use kbind::api::kcp::APIBinding;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

async fn apply(client: &Client, api_version: &str, plural: &str, body: Value) {
    let (group, version) = api_version.split_once('/').expect("group/version");
    let ar = kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: body["kind"].as_str().unwrap_or_default().into(),
        plural: plural.into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &ar);
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&body),
    )
    .await
    .expect("apply");
}

fn print(label: &str, s: &Value) {
    common::print_run(label, 22, s);
}

use common::{client, concurrency, env, kbind, latency, link};

#[tokio::main]
async fn main() {
    kbind::install_crypto_provider();
    let n: usize = std::env::var("BENCH_BINDINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let kubeconfig = env("KBIND_TEST_PROVIDER_KUBECONFIG");
    let hub = client(&kubeconfig).await;
    let (delay, workers) = (latency(), concurrency());
    let route = link(&kubeconfig, delay).await;
    println!("bench claims: {n} bindings; latency {delay:?} per request; concurrency {workers}");
    let kcp = kbind::crds::kcp_crds()
        .into_iter()
        .filter(|c| c.spec.group == "apis.kcp.io");
    let crds: Vec<_> = kbind::crds::kbind_crds().into_iter().chain(kcp).collect();
    common::install_crds(&hub, &crds).await;
    let ns = "kbind-bench";
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(hub.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"),
        )
        .await;

    apply(
        &hub,
        "apis.kcp.io/v1alpha2",
        "apiexports",
        json!({
            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
            "metadata": {"name": "bench.example.io"},
            "spec": {"permissionClaims": [
                {"group": "", "resource": "configmaps", "verbs": ["get", "list"]},
                {"group": "", "resource": "secrets", "verbs": ["get"]},
            ]},
        }),
    )
    .await;
    let entry = |requires: Value| {
        json!({
            "apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
            "metadata": {"name": "bench", "labels": {"bench": "claims"}},
            "spec": {"export": {"name": "bench.example.io"}, "requires": requires},
        })
    };
    apply(
        &hub,
        "providers.kbind.io/v1alpha1",
        "catalogentries",
        entry(json!([{"group": "", "resource": "configmaps"}])),
    )
    .await;

    let bindings: Api<APIBinding> = Api::all(hub.clone());
    let make = |prefix: &'static str| {
        let bindings = bindings.clone();
        async move {
            let t = Instant::now();
            stream::iter(0..n)
                .map(|i| {
                    let bindings = bindings.clone();
                    async move {
                        let body = json!({
                            "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
                            "metadata": {"name": format!("{prefix}-{i}"), "annotations": {"kcp.io/cluster": format!("{prefix}-ws-{i}")}},
                            "spec": {"reference": {"export": {"name": format!("{prefix}.example.io")}}},
                        });
                        bindings
                            .create(&PostParams::default(), &serde_json::from_value(body).expect("binding"))
                            .await
                            .expect("create binding");
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<_>>()
                .await;
            t.elapsed()
        }
    };
    let setup = make("bench").await;
    println!(
        "setup: {n} bindings in {n} workspaces created in {:.1}s",
        setup.as_secs_f64()
    );

    let wc = workers.to_string();
    let args = [
        "claims",
        "--single-cluster",
        "--write-concurrency",
        &wc,
        "--kubeconfig",
        &route.path,
        "--lease-namespace",
        ns,
        "--selector",
        "bench=claims",
        "-o",
        "json",
    ];
    let cold = kbind(&args);
    print("cold pass", &cold);
    let unchanged = kbind(&args);
    print("unchanged pass", &unchanged);
    apply(
        &hub,
        "providers.kbind.io/v1alpha1",
        "catalogentries",
        entry(json!([
            {"group": "", "resource": "configmaps"}, {"group": "", "resource": "secrets"},
        ])),
    )
    .await;
    let changed = kbind(&args);
    print("requirement change", &changed);

    // Baselines: the same number of preconditioned merge patches, plain client, on other sets
    // of bindings listed once (what the pass does minus the policy): one at a time, then
    // `workers` at a time, through the same route as kbind.
    make("base").await;
    make("par").await;
    let routed: Api<APIBinding> = Api::all(route.client.clone());
    let listed = |prefix: &'static str| {
        let routed = routed.clone();
        async move {
            let mut all = Vec::new();
            let mut lp = kube::api::ListParams::default().limit(500);
            loop {
                let page = routed.list(&lp).await.expect("list");
                all.extend(
                    page.items
                        .into_iter()
                        .filter(|b| b.name_any().starts_with(prefix)),
                );
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
            all
        }
    };
    let patch = |b: APIBinding| {
        let routed = routed.clone();
        async move {
            let body = json!({
                "metadata": {"resourceVersion": b.resource_version()},
                "spec": {"permissionClaims": [
                    {"group": "", "resource": "configmaps", "verbs": ["get", "list"], "identityHash": "", "selector": {"matchAll": true}, "state": "Accepted"},
                    {"group": "", "resource": "secrets", "verbs": ["get"], "identityHash": "", "selector": {"matchAll": true}, "state": "Accepted"},
                ]},
            });
            routed
                .patch(&b.name_any(), &PatchParams::default(), &Patch::Merge(&body))
                .await
                .expect("baseline patch");
        }
    };
    let t = Instant::now();
    let all = listed("base-").await;
    let count = all.len();
    for b in all {
        patch(b).await;
    }
    let base = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let all = listed("par-").await;
    stream::iter(all).for_each_concurrent(workers, patch).await;
    let par = t.elapsed().as_secs_f64();
    for (label, secs) in [
        ("baseline, sequential".to_string(), base),
        (format!("baseline, {workers} parallel"), par),
    ] {
        println!(
            "{label:<22} {secs:>7.2}s  requests {:>6}  data writes {:>5}",
            count + count.div_ceil(500),
            count
        );
    }
    let pass = changed["duration_seconds"].as_f64().unwrap_or(0.0);
    println!(
        "ratio requirement-change pass / sequential baseline: {:.2}",
        pass / base
    );
    println!(
        "ratio requirement-change pass / parallel baseline: {:.2} (target <= 1.2)  (unchanged pass: {} requests, {} data writes)",
        pass / par,
        unchanged["requests"],
        unchanged["data_writes"]
    );
}
