//! Benchmark of `kbind schema` (run through `hack/bench.sh schema`, which starts the servers).
//!
//! N Connections (default 50), each binding its own M exported APIs (default 20) on one
//! provider: a cold pass, then an unchanged pass. Baseline, in the same run: the pass's
//! unavoidable data writes (creating N×M consumer CRDs) issued directly, sequentially, with a
//! plain client — once before kbind's pass and once after, since a CRD create gets slower as
//! the apiserver holds more CRDs — and a parallel baseline after those, `BENCH_CONCURRENCY` creates
//! at a time (kbind runs with the same `--write-concurrency`). `BENCH_LATENCY=5ms` sends kbind's
//! and the baselines' requests through a loopback proxy adding that delay.
//! `BENCH_SECRETS=per-connection` gives each Connection a credential of its own;
//! `BENCH_BASELINES=none` skips the baselines (their rows then read ~0 s).
//! `BENCH_EXPORTS=shared` makes one provider export M APIs in all, which every Connection
//! discovers (N × M `exportedAPIs` entries) and the first Connection binds (M consumer CRDs):
//! the N Connections × M exports without N providers or N × M CRDs on one apiserver.
//! Prints figures; asserts nothing about time.

mod common;

use std::time::Instant;

use futures::{StreamExt, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn crd(group: &str, plural: &str, exported: bool) -> CustomResourceDefinition {
    let kind = format!("K{plural}");
    let mut v = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": plural, "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "name": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
    if exported {
        v["metadata"]["labels"] = json!({"core.kbind.io/exported": "true"});
    }
    serde_json::from_value(v).expect("crd")
}

fn kbind(consumer: &str, workers: usize, flags: &[String]) -> Value {
    let wc = workers.to_string();
    let mut args: Vec<String> = [
        "schema",
        "--kubeconfig",
        consumer,
        "--lease-namespace",
        "bench",
        "-o",
        "json",
        "--deadline",
        "60m",
        "--write-concurrency",
        &wc,
    ]
    .map(String::from)
    .to_vec();
    args.extend(flags.iter().cloned());
    common::kbind(&args)
}

use common::{client, concurrency, env, latency, link};

#[tokio::main]
async fn main() {
    kbind::install_crypto_provider();
    let n: usize = std::env::var("BENCH_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let m: usize = std::env::var("BENCH_APIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let shared = std::env::var("BENCH_EXPORTS").is_ok_and(|v| v == "shared");
    let consumer_path = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let provider_path = env("KBIND_TEST_PROVIDER_KUBECONFIG");
    let consumer = client(&consumer_path).await;
    let provider = client(&provider_path).await;
    let (delay, workers) = (latency(), concurrency());
    let (cl, pl) = (
        link(&consumer_path, delay).await,
        link(&provider_path, delay).await,
    );
    // The provider's exports as (group index, plural index); with shared exports one group
    // that every Connection sees, the first one binding it.
    let names: Vec<(usize, usize)> = if shared {
        (0..m).map(|j| (0, j)).collect()
    } else {
        (0..n).flat_map(|i| (0..m).map(move |j| (i, j))).collect()
    };
    let group = |i: usize| {
        if shared {
            "shared.bench.kbind.io".to_string()
        } else {
            format!("c{i}.bench.kbind.io")
        }
    };
    println!(
        "bench schema: {n} Connections x {m} APIs ({}) = {} consumer CRDs; latency {delay:?} per request; concurrency {workers}",
        if shared {
            "one provider's, shared: the first Connection binds them"
        } else {
            "each Connection its own"
        },
        names.len()
    );

    // Setup (not measured): provider exports, kbind CRDs, Secret, Connections, ClusterBindings.
    let t = Instant::now();
    let pcrds: Api<CustomResourceDefinition> = Api::all(provider.clone());
    stream::iter(names.iter().copied())
        .for_each_concurrent(8, |(i, j)| {
            let api = pcrds.clone();
            let group = group(i);
            async move {
                let c = crd(&group, &format!("r{j}s"), true);
                api.create(&PostParams::default(), &c)
                    .await
                    .expect("provider CRD");
            }
        })
        .await;
    common::install_crds(&consumer, &kbind::crds::kbind_crds()).await;
    let ns: Value = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}});
    let nsapi: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(consumer.clone());
    nsapi
        .create(&PostParams::default(), &serde_json::from_value(ns).unwrap())
        .await
        .expect("ns");
    // BENCH_SECRETS=per-connection gives every Connection its own Secret and a kubeconfig of
    // its own (a comment apart): one credential per provider, as with `kbind bind`.
    let per_connection = std::env::var("BENCH_SECRETS").is_ok_and(|v| v == "per-connection");
    let secret_names: Vec<String> = if per_connection {
        (0..n).map(|i| format!("provider-{i}")).collect()
    } else {
        vec!["provider".into()]
    };
    for (i, name) in secret_names.iter().enumerate() {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(json!({"metadata": {"name": name},
            "stringData": {"kubeconfig": format!("{}\n# credential {i}\n", pl.text)}}))
            .unwrap();
        Api::namespaced(consumer.clone(), "bench")
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
    }
    println!(
        "credentials: {} Secret(s) in namespace bench",
        secret_names.len()
    );
    let conns: Api<kbind::api::core::Connection> = Api::all(consumer.clone());
    let cbs: Api<kbind::api::core::ClusterBinding> = Api::all(consumer.clone());
    for i in 0..n {
        let secret = &secret_names[i % secret_names.len()];
        let c = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection", "metadata": {"name": format!("c{i}")},
            "spec": {"kubeconfigSecretRef": {"namespace": "bench", "name": secret}, "schema": {"source": "CRD"}}});
        conns
            .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
            .await
            .expect("connection");
        if shared && i > 0 {
            continue;
        }
        let apis: Vec<Value> = (0..m)
            .map(|j| json!({"name": format!("r{j}s.{}", group(i))}))
            .collect();
        let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding", "metadata": {"name": format!("c{i}")},
            "spec": {"connectionRef": {"name": format!("c{i}")}, "apis": apis}});
        cbs.create(&PostParams::default(), &serde_json::from_value(b).unwrap())
            .await
            .expect("binding");
    }
    println!("setup: {:.1}s", t.elapsed().as_secs_f64());

    // BENCH_BASELINES=none: kbind alone (scale runs that measure its memory and requests).
    let baselines = std::env::var("BENCH_BASELINES").map_or(true, |v| v != "none");
    // Baseline: the same number of consumer CRD creates, directly and sequentially, through the
    // same route as kbind.
    let ccrds: Api<CustomResourceDefinition> = Api::all(cl.client.clone());
    let t = Instant::now();
    for &(i, j) in names.iter().filter(|_| baselines) {
        ccrds
            .create(
                &PostParams::default(),
                &crd(&format!("b{i}.base.kbind.io"), &format!("r{j}s"), false),
            )
            .await
            .expect("baseline CRD");
    }
    let baseline = t.elapsed().as_secs_f64();

    let cold = kbind(&cl.path, workers, &pl.flags());
    let warm = kbind(&cl.path, workers, &pl.flags());
    // A CRD create costs more the more CRDs the apiserver holds: a second baseline, after
    // kbind's, brackets the cold pass from the other side.
    let t = Instant::now();
    for &(i, j) in names.iter().filter(|_| baselines) {
        ccrds
            .create(
                &PostParams::default(),
                &crd(&format!("a{i}.after.kbind.io"), &format!("r{j}s"), false),
            )
            .await
            .expect("baseline CRD");
    }
    let after = t.elapsed().as_secs_f64();
    let t = Instant::now();
    stream::iter(names.iter().copied().filter(|_| baselines))
        .for_each_concurrent(workers, |(i, j)| {
            let api = ccrds.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &crd(&format!("p{i}.par.kbind.io"), &format!("r{j}s"), false),
                )
                .await
                .expect("parallel baseline CRD");
            }
        })
        .await;
    let parallel = t.elapsed().as_secs_f64();
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let mb = |v: &Value| f(v, "peak_rss_bytes") / 1_048_576.0;
    println!();
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10}",
        "run", "wall s", "requests", "req/Conn", "data writes", "bookkeep", "peak MiB"
    );
    for (name, secs) in [
        ("baseline before (creates)", baseline),
        ("baseline after (creates)", after),
        ("baseline parallel, last", parallel),
    ] {
        println!(
            "{name:<28} {secs:>10.2} {:>10} {:>12} {:>12} {:>10} {:>10}",
            names.len(),
            "-",
            names.len(),
            "-",
            "-"
        );
    }
    for (name, v) in [
        ("kbind schema, cold", &cold),
        ("kbind schema, unchanged", &warm),
    ] {
        println!(
            "{:<28} {:>10.2} {:>10} {:>12.1} {:>12} {:>10} {:>10.1}",
            name,
            f(v, "duration_seconds"),
            f(v, "requests"),
            f(v, "requests") / n as f64,
            f(v, "data_writes"),
            f(v, "bookkeeping_writes"),
            mb(v)
        );
    }
    println!();
    println!(
        "ratio cold pass / baseline: {:.2} (before) .. {:.2} (after)",
        f(&cold, "duration_seconds") / baseline,
        f(&cold, "duration_seconds") / after
    );
    println!(
        "ratio cold pass / parallel baseline ({workers} at a time, run last): {:.2}",
        f(&cold, "duration_seconds") / parallel
    );
    println!(
        "unchanged pass data writes: {} (target 0)",
        f(&warm, "data_writes")
    );
    println!(
        "cold outcome: {}; counts {}",
        cold["outcome"], cold["counts"]
    );
}
