//! Benchmark of `kbind claims` on a real kcp (run through `hack/bench.sh claims-kcp`, which
//! starts kcp): N tenant workspaces (default 100), each holding the core binding and a binding to
//! one provider export. Passes: cold (kbind opens every workspace through its core binding, then
//! writes each binding's claims; kcp shows an opened workspace's bindings in the virtual
//! workspace asynchronously, so the cold cycle may take more than one run), unchanged, and a
//! requirement change (every binding gets one more claim). Two baselines patch the same N
//! bindings of two other exports (one at a time, then `BENCH_CONCURRENCY` at a time) with a plain
//! client, each with its resourceVersion, straight to each workspace. Prints figures; asserts
//! nothing about time.

mod common;

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::{Value, json};

use common::{concurrency, env, kbind};

struct Kcp {
    admin: Kubeconfig,
    base: String,
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl Kcp {
    async fn client(&self, path: &str) -> Client {
        let mut config =
            Config::from_custom_kubeconfig(self.admin.clone(), &KubeConfigOptions::default())
                .await
                .expect("kcp config");
        config.cluster_url = format!("{}/clusters/{path}", self.base)
            .parse()
            .expect("url");
        Client::try_from(config).expect("client")
    }

    async fn apply(&self, path: &str, r: &ApiResource, body: Value) {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Api::<DynamicObject>::all_with(self.client(path).await, r)
            .patch(
                &name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name} in {path}: {e}"));
    }

    async fn workspace(&self, parent: &str, name: &str) -> String {
        let r = ar("tenancy.kcp.io", "v1alpha1", "Workspace", "workspaces");
        self.apply(
            parent,
            &r,
            json!({"apiVersion": "tenancy.kcp.io/v1alpha1", "kind": "Workspace", "metadata": {"name": name}}),
        )
        .await;
        let api = Api::<DynamicObject>::all_with(self.client(parent).await, &r);
        for _ in 0..600 {
            if api
                .get(name)
                .await
                .is_ok_and(|w| w.data["status"]["phase"] == "Ready")
            {
                return format!("{parent}:{name}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("workspace {parent}:{name} not Ready within 120s");
    }

    async fn bind(&self, ws: &str, name: &str, path: &str, export: &str) -> String {
        let r = ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings");
        self.apply(
            ws,
            &r,
            json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding", "metadata": {"name": name},
                "spec": {"reference": {"export": {"path": path, "name": export}}}}),
        )
        .await;
        format!("{ws}|{name}")
    }
}

fn print(label: &str, s: &Value) {
    common::print_run(label, 24, s);
}

#[tokio::main]
async fn main() {
    kbind::install_crypto_provider();
    let n: usize = std::env::var("BENCH_WORKSPACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let workers = concurrency();
    let admin = Kubeconfig::read_from(env("KBIND_TEST_KCP_KUBECONFIG")).expect("kubeconfig");
    let server = admin
        .clusters
        .iter()
        .find_map(|c| c.cluster.as_ref()?.server.clone())
        .expect("server");
    let base = server
        .split("/clusters/")
        .next()
        .unwrap_or(&server)
        .to_string();
    let kcp = Kcp { admin, base };
    println!("bench claims on kcp: {n} tenant workspaces; concurrency {workers}");

    let t = Instant::now();
    let parent = kcp
        .workspace("root", &format!("bench-{}", std::process::id()))
        .await;
    let hub = kcp.workspace(&parent, "hub").await;
    let prov = kcp.workspace(&parent, "prov").await;
    let hub_client = kcp.client(&hub).await;
    common::install_crds(&hub_client, &kbind::crds::kbind_crds()).await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(hub_client.clone())
        .patch(
            "kbind-bench",
            &PatchParams::apply("bench"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kbind-bench"}})),
        )
        .await
        .expect("namespace");
    let export = ar("apis.kcp.io", "v1alpha2", "APIExport", "apiexports");
    kcp.apply(&hub, &export, json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
        "metadata": {"name": "core.kbind.io"}, "spec": {"permissionClaims": [
            {"group": "apis.kcp.io", "resource": "apibindings", "verbs": ["get", "list", "watch", "update", "patch"]}]}})).await;
    for name in ["bench.example.io", "base.example.io", "par.example.io"] {
        kcp.apply(
            &prov,
            &export,
            json!({"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
            "metadata": {"name": name}, "spec": {"permissionClaims": [
                {"group": "", "resource": "configmaps", "verbs": ["get", "list"]},
                {"group": "", "resource": "secrets", "verbs": ["get"]}]}}),
        )
        .await;
    }
    let entry = |requires: Value| {
        json!({"apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry",
            "metadata": {"name": "bench"},
            "spec": {"export": {"path": prov, "name": "bench.example.io"}, "requires": requires}})
    };
    let entries = ar(
        "providers.kbind.io",
        "v1alpha1",
        "CatalogEntry",
        "catalogentries",
    );
    kcp.apply(
        &hub,
        &entries,
        entry(json!([{"group": "", "resource": "configmaps"}])),
    )
    .await;
    let tenants: Vec<String> = stream::iter(0..n)
        .map(|i| {
            let (kcp, parent, hub, prov) = (&kcp, &parent, &hub, &prov);
            async move {
                let ws = kcp.workspace(parent, &format!("t{i}")).await;
                kcp.bind(&ws, "core", hub, "core.kbind.io").await;
                for e in ["bench", "base", "par"] {
                    kcp.bind(&ws, e, prov, &format!("{e}.example.io")).await;
                }
                ws
            }
        })
        .buffer_unordered(workers)
        .collect()
        .await;
    println!(
        "setup: {n} workspaces with 4 bindings each in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let dir = std::env::temp_dir().join(format!("bench-kcp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut hub_kc = kcp.admin.clone();
    for c in &mut hub_kc.clusters {
        if let Some(cluster) = c.cluster.as_mut() {
            cluster.server = Some(format!("{}/clusters/{hub}", kcp.base));
        }
    }
    let hub_path = dir.join("hub.kubeconfig");
    std::fs::write(&hub_path, serde_saphyr::to_string(&hub_kc).expect("yaml")).expect("write");
    let wc = workers.to_string();
    let hub_kubeconfig = hub_path.to_string_lossy().to_string();
    let args = [
        "claims",
        "--kubeconfig",
        &hub_kubeconfig,
        "--lease-namespace",
        "kbind-bench",
        "--core-export",
        "core.kbind.io",
        "--core-export-path",
        &hub,
        "--core-binding",
        "core",
        "--write-concurrency",
        &wc,
        "-o",
        "json",
    ];
    // The cold cycle: until a run writes nothing (kcp lists newly opened workspaces' bindings in
    // the virtual workspace with a delay, which grows with the number of workspaces), at most 30
    // runs.
    let t = Instant::now();
    let (mut runs, mut requests, mut writes) = (0, 0, 0);
    for _ in 0..30 {
        let s = kbind(&args);
        runs += 1;
        print(&format!("cold run {runs}"), &s);
        println!(
            "{:<24} bindings checked {} of {n}, core bindings {}",
            "", s["counts"]["bindingsChecked"], s["counts"]["coreBindingsChecked"]
        );
        requests += s["requests"].as_i64().unwrap_or(0);
        let w = s["data_writes"].as_i64().unwrap_or(0);
        writes += w;
        if w == 0 {
            break;
        }
    }
    println!(
        "cold cycle: {runs} runs, {:.1}s, {requests} requests, {writes} data writes ({:.2} requests and {:.2} writes per workspace)",
        t.elapsed().as_secs_f64(),
        requests as f64 / n as f64,
        writes as f64 / n as f64
    );
    let unchanged = kbind(&args);
    print("unchanged pass", &unchanged);
    kcp.apply(
        &hub,
        &entries,
        entry(json!([{"group": "", "resource": "configmaps"},
        {"group": "", "resource": "secrets"}])),
    )
    .await;
    let changed = kbind(&args);
    print("requirement change", &changed);

    // Baselines: the same patch per binding (both claims Accepted, with the binding's
    // resourceVersion), straight to each workspace.
    let bindings = ar("apis.kcp.io", "v1alpha2", "APIBinding", "apibindings");
    let patch = |ws: String, name: &'static str| {
        let (kcp, bindings) = (&kcp, &bindings);
        async move {
            let api = Api::<DynamicObject>::all_with(kcp.client(&ws).await, bindings);
            let b = api.get(name).await.expect("get binding");
            let body = json!({"metadata": {"resourceVersion": b.resource_version()},
                "spec": {"permissionClaims": [
                    {"group": "", "resource": "configmaps", "verbs": ["get", "list"], "identityHash": "", "selector": {"matchAll": true}, "state": "Accepted"},
                    {"group": "", "resource": "secrets", "verbs": ["get"], "identityHash": "", "selector": {"matchAll": true}, "state": "Accepted"}]}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .expect("baseline patch");
        }
    };
    let t = Instant::now();
    for ws in &tenants {
        patch(ws.clone(), "base").await;
    }
    let seq = t.elapsed().as_secs_f64();
    let t = Instant::now();
    stream::iter(tenants.clone())
        .for_each_concurrent(workers, |ws| patch(ws, "par"))
        .await;
    let par = t.elapsed().as_secs_f64();
    for (label, secs) in [
        ("baseline, sequential".to_string(), seq),
        (format!("baseline, {workers} parallel"), par),
    ] {
        println!(
            "{label:<24} {secs:>7.2}s  requests {:>6}  data writes {:>5}",
            2 * n,
            n
        );
    }
    let pass = changed["duration_seconds"].as_f64().unwrap_or(0.0);
    println!(
        "ratio requirement-change pass / sequential baseline: {:.2}; / parallel baseline: {:.2}",
        pass / seq,
        pass / par
    );
    let _ = std::fs::remove_dir_all(&dir);
}
