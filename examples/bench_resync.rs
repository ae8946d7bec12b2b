//! Benchmark of `kbind resync` (run through `hack/bench.sh resync`, which starts the servers).
//!
//! N objects (default 10,000) in 100 namespaces of one bound API (`BENCH_APIS`: spread over
//! that many). Cold pass (every object
//! needs its finalizer and its provider copy) against two baselines issuing the same minimal
//! writes directly — a provider create and a consumer finalizer patch per object, with a plain
//! client — each on its own identical API in the same run: one object at a time (sequential),
//! and `BENCH_CONCURRENCY` objects at a time (parallel; kbind runs with the same
//! `--write-concurrency`). Then an unchanged pass: requests and writes. `BENCH_LATENCY=5ms`
//! sends kbind's and the baselines' requests through a loopback proxy adding that delay.
//! Prints figures; asserts nothing about time.

mod common;

use std::time::Instant;

use futures::{StreamExt, stream};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn crd(group: &str, exported: bool) -> CustomResourceDefinition {
    let mut v = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "owner": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
    if exported {
        v["metadata"]["labels"] = json!({"core.kbind.io/exported": "true"});
    }
    serde_json::from_value(v).expect("crd")
}

async fn wait_crd(api: &Api<CustomResourceDefinition>, name: &str) {
    for _ in 0..200 {
        if let Ok(c) = api.get(name).await
            && c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{name} not established");
}

use common::{client, concurrency, env, kbind, latency, link};

#[tokio::main]
async fn main() {
    kbind::install_crypto_provider();
    let n: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    // BENCH_APIS (default 1): the objects spread over that many bound APIs, object i in API
    // i mod BENCH_APIS (the "1,000 bound APIs x 100 objects" shape, scaled).
    let apis: usize = std::env::var("BENCH_APIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let bound: Vec<String> = (0..apis)
        .map(|k| {
            if k == 0 {
                "bench.kbind.io".to_string()
            } else {
                format!("b{k}.bench.kbind.io")
            }
        })
        .collect();
    let namespaces = 100.min(n.max(1));
    let consumer_path = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let provider_path = env("KBIND_TEST_PROVIDER_KUBECONFIG");
    let consumer = client(&consumer_path).await;
    let provider = client(&provider_path).await;
    let (delay, workers) = (latency(), concurrency());
    let (cl, pl) = (
        link(&consumer_path, delay).await,
        link(&provider_path, delay).await,
    );
    println!(
        "bench resync: {n} objects in {namespaces} namespaces of {apis} bound API(s); latency {delay:?} per request; concurrency {workers}"
    );

    // Setup (not measured): the bound API through kbind schema, the baseline API by hand.
    let t = Instant::now();
    let pcrds: Api<CustomResourceDefinition> = Api::all(provider.clone());
    let ccrds: Api<CustomResourceDefinition> = Api::all(consumer.clone());
    stream::iter(bound.iter())
        .for_each_concurrent(8, |g| {
            let api = pcrds.clone();
            async move {
                api.create(&PostParams::default(), &crd(g, true))
                    .await
                    .expect("provider CRD");
            }
        })
        .await;
    for c in [crd("base.kbind.io", false), crd("par.kbind.io", false)] {
        pcrds
            .create(&PostParams::default(), &c)
            .await
            .expect("baseline provider CRD");
        ccrds
            .create(&PostParams::default(), &c)
            .await
            .expect("baseline consumer CRD");
    }
    for c in kbind::crds::kbind_crds() {
        let name = c.metadata.name.clone().unwrap_or_default();
        ccrds
            .patch(
                &name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&c),
            )
            .await
            .expect("kbind CRD");
        wait_crd(&ccrds, &name).await;
    }
    let nsapi: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(consumer.clone());
    let pnsapi: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(provider.clone());
    for i in 0..namespaces {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("ns{i}")}})).unwrap();
        nsapi.create(&PostParams::default(), &ns).await.expect("ns");
        pnsapi
            .create(&PostParams::default(), &ns)
            .await
            .expect("provider ns");
    }
    let bench_ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "bench"}})).unwrap();
    nsapi
        .create(&PostParams::default(), &bench_ns)
        .await
        .expect("ns");
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "provider"},
        "stringData": {"kubeconfig": pl.text.clone()}}))
        .unwrap();
    Api::namespaced(consumer.clone(), "bench")
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let c = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection", "metadata": {"name": "bench"},
        "spec": {"kubeconfigSecretRef": {"namespace": "bench", "name": "provider"}, "schema": {"source": "CRD"}}});
    Api::<kbind::api::core::Connection>::all(consumer.clone())
        .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
        .await
        .expect("connection");
    let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding", "metadata": {"name": "bench"},
        "spec": {"connectionRef": {"name": "bench"}, "apis": bound.iter().map(|g| json!({"name": format!("widgets.{g}")})).collect::<Vec<_>>()}});
    Api::<kbind::api::core::ClusterBinding>::all(consumer.clone())
        .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
        .await
        .expect("binding");
    let mut schema_args: Vec<String> = [
        "schema",
        "--kubeconfig",
        &cl.path,
        "--lease-namespace",
        "bench",
        "-o",
        "json",
    ]
    .map(String::from)
    .to_vec();
    schema_args.extend(pl.flags());
    let schema = kbind(&schema_args);
    assert_eq!(schema["counts"]["ready"], 1, "schema pass: {schema}");
    for g in &bound {
        wait_crd(&ccrds, &format!("widgets.{g}")).await;
    }
    wait_crd(&ccrds, "widgets.base.kbind.io").await;
    wait_crd(&ccrds, "widgets.par.kbind.io").await;
    let ar = |g: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, "v1", "Widget"), "widgets")
    };
    // `BENCH_BASELINES` (default `sequential,parallel`; `none` for scale runs that measure
    // kbind's own memory and time only, without seeding the baselines' objects).
    let baselines =
        std::env::var("BENCH_BASELINES").unwrap_or_else(|_| "sequential,parallel".into());
    let (run_seq, run_par) = (
        baselines.contains("sequential"),
        baselines.contains("parallel"),
    );
    let groups = [("base.kbind.io", run_seq), ("par.kbind.io", run_par)];
    // The bound objects (object i in API i mod apis), then each baseline's own.
    let seeds: Vec<(Vec<String>, usize)> = std::iter::once((bound.clone(), apis))
        .chain(
            groups
                .iter()
                .filter(|(_, on)| *on)
                .map(|(g, _)| (vec![g.to_string()], 1)),
        )
        .collect();
    for (seed_groups, k) in &seeds {
        stream::iter(0..n)
            .for_each_concurrent(16, |i| {
                let (consumer, r) = (consumer.clone(), ar(&seed_groups[i % k]));
                async move {
                    let ns = format!("ns{}", i % namespaces);
                    let mut o = DynamicObject::new(&format!("w{i}"), &r)
                        .data(json!({"spec": {"size": i, "owner": "team"}}));
                    o.metadata.namespace = Some(ns.clone());
                    Api::<DynamicObject>::namespaced_with(consumer, &ns, &r)
                        .create(&PostParams::default(), &o)
                        .await
                        .expect("object");
                }
            })
            .await;
    }
    println!("setup: {:.1}s", t.elapsed().as_secs_f64());

    // Baselines: per object, the provider create, then the consumer finalizer patch; one object
    // at a time, then `workers` at a time, through the same route as kbind.
    let (consumer, provider) = (cl.client.clone(), pl.client.clone());
    let write = |group: &'static str, i: usize| {
        let (consumer, provider, r) = (consumer.clone(), provider.clone(), ar(group));
        async move {
            let ns = format!("ns{}", i % namespaces);
            let name = format!("w{i}");
            let body = json!({"apiVersion": format!("{group}/v1"), "kind": "Widget",
                "metadata": {"name": name, "namespace": ns, "labels": {"core.kbind.io/consumer-cluster": "x"}},
                "spec": {"size": i, "owner": "team"}});
            let o: DynamicObject = serde_json::from_value(body).unwrap();
            Api::<DynamicObject>::namespaced_with(provider, &ns, &r)
                .create(&PostParams::default(), &o)
                .await
                .expect("baseline create");
            let fin = json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": name, "namespace": ns, "finalizers": ["core.kbind.io/syncer"]}});
            Api::<DynamicObject>::namespaced_with(consumer, &ns, &r)
                .patch(
                    &name,
                    &PatchParams::apply("bench-finalizer"),
                    &Patch::Apply(&fin),
                )
                .await
                .expect("baseline finalizer");
        }
    };
    let t = Instant::now();
    if run_seq {
        for i in 0..n {
            write("base.kbind.io", i).await;
        }
    }
    let baseline = if run_seq {
        t.elapsed().as_secs_f64()
    } else {
        f64::NAN
    };
    let t = Instant::now();
    if run_par {
        stream::iter(0..n)
            .for_each_concurrent(workers, |i| write("par.kbind.io", i))
            .await;
    }
    let parallel = if run_par {
        t.elapsed().as_secs_f64()
    } else {
        f64::NAN
    };

    let wc = workers.to_string();
    let mut args: Vec<String> = [
        "resync",
        "--kubeconfig",
        &cl.path,
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
    args.extend(pl.flags());
    let cold = kbind(&args);
    let warm = kbind(&args);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!();
    println!(
        "{:<26} {:>9} {:>9} {:>12} {:>11} {:>9}",
        "run", "wall s", "requests", "data writes", "bookkeep", "peak MiB"
    );
    if run_seq {
        println!(
            "{:<26} {:>9.2} {:>9} {:>12} {:>11} {:>9}",
            "baseline, sequential",
            baseline,
            2 * n,
            2 * n,
            "-",
            "-"
        );
    }
    if run_par {
        println!(
            "{:<26} {:>9.2} {:>9} {:>12} {:>11} {:>9}",
            format!("baseline, {workers} parallel"),
            parallel,
            2 * n,
            2 * n,
            "-",
            "-"
        );
    }
    for (name, v) in [
        ("kbind resync, cold", &cold),
        ("kbind resync, unchanged", &warm),
    ] {
        println!(
            "{name:<26} {:>9.2} {:>9} {:>12} {:>11} {:>9.1}",
            f(v, "duration_seconds"),
            f(v, "requests"),
            f(v, "data_writes"),
            f(v, "bookkeeping_writes"),
            f(v, "peak_rss_bytes") / 1_048_576.0
        );
    }
    // Per side, each bound API lists its own objects in pages of 500.
    let pages = apis * n.div_ceil(apis).div_ceil(500);
    println!();
    if run_seq {
        println!(
            "ratio cold pass / sequential baseline: {:.2}",
            f(&cold, "duration_seconds") / baseline
        );
    }
    if run_par {
        println!(
            "ratio cold pass / parallel baseline: {:.2} (target <= 1.2)",
            f(&cold, "duration_seconds") / parallel
        );
    }
    println!(
        "unchanged pass: {} requests for {} list pages per side (target only LISTs, <= {} per side), {} data writes (target 0)",
        f(&warm, "requests"),
        pages,
        2 * pages,
        f(&warm, "data_writes")
    );
    println!(
        "cold outcome: {}; counts {}",
        cold["outcome"], cold["counts"]
    );
}
