//! Benchmark of the time to first sync (run through `hack/bench.sh first-sync`, which starts the
//! servers): from `kubectl apply` of a ClusterBinding (its Connection already Ready) to its first
//! object on the provider, with `kbind schema` and `kbind resync` fired as their CronJobs fire
//! them: both at each tick of a schedule, each as its own process. The tick is `BENCH_PERIOD`
//! (default 10 s) standing for the CronJobs' one minute, so figures are given in periods and
//! scaled to a 60 s period; what a real node adds (Pod start, ~1 s: docs/performance.md "On a
//! real node") is not in them.
//!
//! Three schedules, in the same run: `before` (schema every 5th tick, every run a full sweep:
//! the 0.2 CronJobs), `sweeps` (schema every tick with `--full-sweep-every` of 5 ticks) and
//! `shipped` (that, and resync's `--first-sync-window` of half a tick: the shipped CronJobs). Each sample applies a binding at a spread offset within a tick, creates its
//! object as soon as the consumer CRD is Established (as a script or a GitOps retry would), and
//! waits for the object on the provider. Then `BENCH_IDLE_TICKS` (default 10) ticks with nothing
//! changing give the unchanged cost per hour (requests and writes of both passes, at 60 ticks an
//! hour), with `BENCH_CONNECTIONS` (default 10) other Connections on the same provider. Prints
//! figures; asserts nothing about time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use common::first_sync::{Cost, cost, number, percentile, scaled, until};
use common::{client, env};

const GROUP: &str = "firstsync.bench";
const NS: &str = "bench-fs";

fn crd(plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}"), "labels": {"core.kbind.io/exported": "true"}},
        "spec": {"group": GROUP, "scope": "Namespaced", "names": {"plural": plural, "kind": format!("K{plural}")},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}))
    .expect("crd")
}

/// One schedule: how often schema fires, and each pass's flags.
struct Schedule {
    name: &'static str,
    schema_every: u64,
    schema_flags: Vec<String>,
    resync_flags: Vec<String>,
}

fn pass(consumer: &str, pass: &str, flags: &[String]) -> Value {
    let mut args: Vec<String> = [
        pass,
        "--kubeconfig",
        consumer,
        "--lease-namespace",
        NS,
        "--credential-namespace",
        NS,
        "-o",
        "json",
    ]
    .map(String::from)
    .to_vec();
    args.extend(flags.iter().cloned());
    common::kbind(&args)
}

/// Fire both passes at every tick until `stop`; per tick, the two runs' costs.
fn ticker(
    consumer: String,
    s: &Schedule,
    (start, period): (Instant, Duration),
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Cost, Cost)>> {
    let (every, flags) = (s.schema_every, s.schema_flags.clone());
    let resync_flags = s.resync_flags.clone();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        for tick in 0u64.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let at = start + period * u32::try_from(tick).expect("ticks");
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let c = consumer.clone();
            let f = flags.clone();
            let schema = (tick % every == 0)
                .then(|| std::thread::spawn(move || cost(&pass(&c, "schema", &f))));
            let resync = cost(&pass(&consumer, "resync", &resync_flags));
            let schema = schema
                .map(|h| h.join().expect("schema"))
                .unwrap_or_default();
            out.push((schema, resync));
        }
        out
    })
}

/// The samples of one schedule, scaled ([`scaled`]).
async fn samples(
    (consumer, provider): (&Client, &Client),
    s: &Schedule,
    (first, count): (u64, u64),
    (start, period): (Instant, Duration),
) -> Vec<f64> {
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone());
    let mut out = Vec::new();
    for i in first..first + count {
        // Spread the applies over the schedule's cycle (schema's period; golden-ratio steps),
        // so the wait for the next run is uniform, as for a person applying at any moment.
        let phase = (i as f64 * 0.618_034).fract();
        let cycle = period * u32::try_from(s.schema_every).expect("ticks");
        tokio::time::sleep(cycle.mul_f64(phase)).await;
        let plural = format!("w{i}s");
        let api = format!("{plural}.{GROUP}");
        let cb: kbind::api::core::ClusterBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("fs-{i}")},
            "spec": {"connectionRef": {"name": "fs"}, "apis": [{"name": api}]}}))
        .expect("binding");
        let applied = Instant::now();
        Api::<kbind::api::core::ClusterBinding>::all(consumer.clone())
            .create(&PostParams::default(), &cb)
            .await
            .expect("binding");
        let limit = period * 12;
        until("the consumer CRD", limit, || async {
            let c = crds.get_opt(&api).await.ok().flatten()?;
            let ok = c
                .status?
                .conditions?
                .iter()
                .any(|x| x.type_ == "Established" && x.status == "True");
            ok.then_some(())
        })
        .await;
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, "v1", &format!("K{plural}")),
            &plural,
        );
        let obj = DynamicObject::new("o", &ar).data(json!({"spec": {"n": i}}));
        // The API is served a moment after Established: retried, as kubectl apply would be.
        until("creating the object", limit, || async {
            Api::<DynamicObject>::namespaced_with(consumer.clone(), NS, &ar)
                .create(&PostParams::default(), &obj)
                .await
                .ok()
        })
        .await;
        let theirs = Api::<DynamicObject>::namespaced_with(provider.clone(), NS, &ar);
        until("the object on the provider", limit, || async {
            theirs.get_opt("o").await.ok().flatten()
        })
        .await;
        let took = applied.elapsed();
        let one = scaled(took, applied.duration_since(start), period);
        println!(
            "  {:<6} sample {i:>2}: {:6.1} s ({:.2} periods), {one:5.0} s at a 60 s period",
            s.name,
            took.as_secs_f64(),
            took.as_secs_f64() / period.as_secs_f64()
        );
        out.push(one);
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    kbind::install_crypto_provider();
    let period = Duration::from_secs(number("BENCH_PERIOD", 10));
    let count = number("BENCH_SAMPLES", 8);
    let idle = number("BENCH_IDLE_TICKS", 10);
    let others = number("BENCH_CONNECTIONS", 10);
    let consumer_path = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let consumer = client(&consumer_path).await;
    let provider = client(&env("KBIND_TEST_PROVIDER_KUBECONFIG")).await;
    common::install_crds(&consumer, &kbind::crds::kbind_crds()).await;
    for c in [&consumer, &provider] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("ns");
        let _ = Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await;
    }
    let plurals: Vec<String> = (0..3 * count).map(|i| format!("w{i}s")).collect();
    let exported: Vec<CustomResourceDefinition> = plurals.iter().map(|p| crd(p)).collect();
    common::install_crds(&provider, &exported).await;
    let kc = std::fs::read_to_string(env("KBIND_TEST_PROVIDER_KUBECONFIG")).expect("kubeconfig");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "provider", "namespace": NS},
        "stringData": {"kubeconfig": kc}}))
        .expect("secret");
    Api::<Secret>::namespaced(consumer.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let connections = Api::<kbind::api::core::Connection>::all(consumer.clone());
    for name in std::iter::once("fs".to_string()).chain((0..others).map(|i| format!("idle-{i}"))) {
        let c: kbind::api::core::Connection = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"kubeconfigSecretRef": {"namespace": NS, "name": "provider"}, "schema": {"source": "CRD"}}}))
        .expect("connection");
        connections
            .create(&PostParams::default(), &c)
            .await
            .expect("connection");
    }
    // Every Connection Ready before the first sample.
    pass(&consumer_path, "schema", &[]);

    let ticks = period.as_secs() * 5;
    let schedules = [
        Schedule {
            name: "before",
            schema_every: 5,
            schema_flags: Vec::new(),
            resync_flags: Vec::new(),
        },
        Schedule {
            name: "sweeps",
            schema_every: 1,
            schema_flags: vec!["--full-sweep-every".into(), format!("{ticks}s")],
            resync_flags: Vec::new(),
        },
        // The shipped CronJobs: the window is 30 s of the minute, scaled to the tick.
        Schedule {
            name: "shipped",
            schema_every: 1,
            schema_flags: vec!["--full-sweep-every".into(), format!("{ticks}s")],
            resync_flags: vec![format!("--first-sync-window={}ms", period.as_millis() / 2)],
        },
    ];
    println!(
        "time to first sync: tick {} s standing for 1 min; {count} samples per schedule; {others} other Connections",
        period.as_secs()
    );
    let mut took_by = Vec::new();
    for (k, s) in schedules.iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let t = ticker(consumer_path.clone(), s, (start, period), stop.clone());
        let took = samples(
            (&consumer, &provider),
            s,
            (k as u64 * count, count),
            (start, period),
        )
        .await;
        stop.store(true, Ordering::SeqCst);
        t.join().expect("ticker");
        took_by.push(took);
    }
    // The unchanged cost, each schedule over the same settled world (every sample's binding
    // in place): `idle` ticks with nothing changing.
    let mut rows = Vec::new();
    for (s, took) in schedules.iter().zip(&took_by) {
        let stop = Arc::new(AtomicBool::new(false));
        let t = ticker(
            consumer_path.clone(),
            s,
            (Instant::now(), period),
            stop.clone(),
        );
        tokio::time::sleep(period * u32::try_from(idle).expect("ticks")).await;
        stop.store(true, Ordering::SeqCst);
        let quiet = t.join().expect("ticker");
        let hour = |f: &dyn Fn(&(Cost, Cost)) -> u64| {
            quiet.iter().map(f).sum::<u64>() as f64 * 60.0 / quiet.len().max(1) as f64
        };
        rows.push((
            s.name,
            percentile(took, 0.5),
            percentile(took, 0.95),
            took.iter().cloned().fold(0.0, f64::max),
            hour(&|c| c.0.requests),
            hour(&|c| c.0.writes),
            hour(&|c| c.1.requests),
            hour(&|c| c.1.writes),
        ));
    }
    println!(
        "{:<7} {:>9} {:>9} {:>9} | unchanged per hour: {:>15} {:>13} {:>15} {:>13}",
        "",
        "p50",
        "p95",
        "max",
        "schema requests",
        "schema writes",
        "resync requests",
        "resync writes"
    );
    for r in &rows {
        println!(
            "{:<7} {:>8.0}s {:>8.0}s {:>8.0}s | {:>35.0} {:>13.0} {:>15.0} {:>13.0}",
            r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7
        );
    }
    let b = &rows[0];
    for a in &rows[1..] {
        println!(
            "{}/before: p95 {:.2}x; unchanged requests {:.2}x, writes {:.2}x (both passes)",
            a.0,
            a.2 / b.2,
            (a.4 + a.6) / (b.4 + b.6),
            (a.5 + a.7) / (b.5 + b.7)
        );
    }
}
