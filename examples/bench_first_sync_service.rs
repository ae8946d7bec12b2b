//! Benchmark of the time to first sync for a consumer of the service layer (run through
//! `hack/bench.sh first-sync-service`, which starts the servers): from `kbind bind` with a
//! kubeconfig `kbind issue` wrote (its Grant issued, the consumer not pinned yet) to its first
//! object on the provider, with `kbind schema`, `kbind resync` and `kbind issue` fired as their
//! CronJobs fire them, each as its own process at the ticks of its schedule. The tick is
//! `BENCH_PERIOD` (default 10 s) standing for the CronJobs' one minute; figures are scaled to
//! a 60 s period as in `bench_first_sync` (what a real node adds, ~1 s of Pod start per run,
//! is not in them).
//!
//! Three schedules of the issuer, in the same run, the consumer side as shipped (schema every
//! tick with full sweeps every 5, resync with its first-sync window): `before` (the issuer
//! every 5th tick, every run a full sweep: the 0.2 CronJob), `every-tick` (every tick with
//! `--full-sweep-every` of 5 ticks) and `shipped` (that, and `--pin-window` of half a tick, as
//! the CronJob's 30 s). Each sample gets its own Export, Grant and provider
//! namespace, issued and handed over before it starts (the previous sample's Grant revoked, as
//! one consumer cluster is pinned by one Grant at a time; its pin pre-approved, as objects of
//! that cluster are on the provider already). Then `BENCH_IDLE_TICKS` (default 10) quiet ticks
//! give the unchanged cost per hour of the three passes. Prints figures; asserts nothing about
//! time.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::iam::Grant;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use common::first_sync::{Cost, cost, number, percentile, scaled, until};
use common::{client, env};

const GROUP: &str = "fsservice.bench";
/// The consumer's credential and Lease namespace.
const NS: &str = "bench-fss";
/// The provider's grants namespace, also the issuer's Lease namespace.
const GRANTS: &str = "bench-fss-grants";

fn crd(plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{plural}.{GROUP}"), "labels": {"core.kbind.io/exported": "true"}},
        "spec": {"group": GROUP, "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural.trim_end_matches('s'), "kind": format!("K{plural}")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}}]}}))
    .expect("crd")
}

/// One issuer schedule.
struct Schedule {
    name: &'static str,
    issue_every: u64,
    issue_flags: Vec<String>,
}

/// Where the passes run and what they are given.
#[derive(Clone)]
struct World {
    consumer: String,
    provider: String,
    server: String,
    ca: String,
    period: Duration,
}

impl World {
    fn consumer_pass(&self, pass: &str, flags: &[String]) -> Value {
        let mut args: Vec<String> = [
            pass,
            "--kubeconfig",
            &self.consumer,
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

    fn issue(&self, flags: &[String]) -> Value {
        let mut args: Vec<String> = [
            "issue",
            "--kubeconfig",
            &self.provider,
            "--lease-namespace",
            GRANTS,
            "--grants-namespace",
            GRANTS,
            "--server-url",
            &self.server,
            "--server-ca-file",
            &self.ca,
            "--confinement",
            "per-grant",
            "-o",
            "json",
        ]
        .map(String::from)
        .to_vec();
        args.extend(flags.iter().cloned());
        common::kbind(&args)
    }

    /// The shipped consumer side: schema every tick with full sweeps every 5; resync with its
    /// first-sync window of half a tick.
    fn schema(&self) -> Value {
        let sweep = format!("{}s", self.period.as_secs() * 5);
        self.consumer_pass("schema", &["--full-sweep-every".into(), sweep])
    }

    fn resync(&self) -> Value {
        let window = format!("--first-sync-window={}ms", self.period.as_millis() / 2);
        self.consumer_pass("resync", &[window])
    }
}

/// Fire the three passes at every tick (the issuer at its schedule's) until `stop`; per tick,
/// the runs' costs (schema, resync, issue).
fn ticker(
    w: &World,
    s: &Schedule,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<[Cost; 3]>> {
    let (w, every, flags) = (w.clone(), s.issue_every, s.issue_flags.clone());
    std::thread::spawn(move || {
        let mut out = Vec::new();
        for tick in 0u64.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let at = start + w.period * u32::try_from(tick).expect("ticks");
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let (w1, w2, f) = (w.clone(), w.clone(), flags.clone());
            let schema = std::thread::spawn(move || cost(&w1.schema()));
            let issue =
                (tick % every == 0).then(|| std::thread::spawn(move || cost(&w2.issue(&f))));
            let resync = cost(&w.resync());
            let schema = schema.join().expect("schema");
            let issue = issue.map(|h| h.join().expect("issue")).unwrap_or_default();
            out.push([schema, resync, issue]);
        }
        out
    })
}

/// The provider admin's part, before a sample: the previous Grant revoked, this sample's
/// Export and Grant (its pin approved) issued, by issuer runs of its own between the ticks'
/// (one that meets a tick's pass Lease skips, and the next try goes on). The issued
/// kubeconfig's file.
async fn prepare(w: &World, provider: &Client, i: u64, uid: &str) -> String {
    let grants = Api::<Grant>::all(provider.clone());
    if i > 0 {
        let previous = format!("fss-{}", i - 1);
        // The consumer lets go first, while its credential works: its binding and Connection.
        let consumer = client(&w.consumer).await;
        let bindings = Api::<kbind::api::core::ClusterBinding>::all(consumer.clone());
        let connections = Api::<kbind::api::core::Connection>::all(consumer);
        let _ = bindings.delete(&previous, &Default::default()).await;
        let _ = connections.delete(&previous, &Default::default()).await;
        until(
            "the previous binding gone",
            Duration::from_secs(120),
            || async {
                if bindings.get_opt(&previous).await.ok()?.is_none()
                    && connections.get_opt(&previous).await.ok()?.is_none()
                {
                    return Some(());
                }
                w.consumer_pass("resync", &[]);
                w.consumer_pass("schema", &[]);
                None
            },
        )
        .await;
        let _ = grants.delete(&previous, &Default::default()).await;
        until(
            "the previous Grant revoked",
            Duration::from_secs(120),
            || async {
                if grants.get_opt(&previous).await.ok()?.is_none() {
                    return Some(());
                }
                w.issue(&[]);
                None
            },
        )
        .await;
    }
    let name = format!("fss-{i}");
    let export = json!({"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export",
        "metadata": {"name": name},
        "spec": {"description": "bench", "apis": [{"name": format!("w{i}s.{GROUP}")}]}});
    let grant = json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
        "metadata": {"name": name, "annotations": {"iam.kbind.io/approve-consumer-cluster": uid}},
        "spec": {"export": name, "consumer": "bench", "tokenTTL": "1h", "namespaces": [name]}});
    for (plural, o) in [("exports", export), ("grants", grant)] {
        let (group, version) = o["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .expect("apiVersion");
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, o["kind"].as_str().expect("kind")),
            plural,
        );
        let obj: DynamicObject = serde_json::from_value(o).expect("object");
        Api::<DynamicObject>::all_with(provider.clone(), &ar)
            .create(&PostParams::default(), &obj)
            .await
            .expect("create");
    }
    until("the Grant issued", Duration::from_secs(120), || async {
        let g = grants.get_opt(&name).await.ok()??;
        if g.status.and_then(|s| s.secret_ref).is_some() {
            return Some(());
        }
        w.issue(&[]);
        None
    })
    .await;
    let out = std::process::Command::new(
        std::env::var("KBIND_BIN").unwrap_or_else(|_| "target/release/kbind".into()),
    )
    .args([
        "issue",
        "--kubeconfig",
        &w.provider,
        "--print-kubeconfig",
        &name,
    ])
    .output()
    .expect("print the kubeconfig");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = std::env::temp_dir().join(format!("bench-fss-{i}.kubeconfig"));
    std::fs::write(&path, &out.stdout).expect("kubeconfig file");
    path.to_string_lossy().to_string()
}

/// One sample: `kbind bind` at `phase` of the issuer's cycle, then the object as soon as its
/// CRD is Established, until it is on the provider; seconds, scaled.
async fn sample(
    w: &World,
    (consumer, provider): (&Client, &Client),
    (i, kubeconfig): (u64, &str),
    start: Instant,
) -> f64 {
    let name = format!("fss-{i}");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns");
    let _ = Api::<Namespace>::all(consumer.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let applied = Instant::now();
    let bound = common::kbind(&[
        "bind",
        "--kubeconfig",
        &w.consumer,
        "--provider-kubeconfig",
        kubeconfig,
        "--name",
        &name,
        "--export",
        &name,
        "--credential-namespace",
        NS,
        "--lease-namespace",
        NS,
        "-o",
        "json",
    ]);
    assert_eq!(bound["command"], "bind", "{bound}");
    let limit = w.period * 15;
    let api = format!("w{i}s.{GROUP}");
    let crds = Api::<CustomResourceDefinition>::all(consumer.clone());
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
    let plural = format!("w{i}s");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1", &format!("K{plural}")),
        &plural,
    );
    let obj = DynamicObject::new("o", &ar).data(json!({"spec": {"n": i}}));
    until("creating the object", limit, || async {
        Api::<DynamicObject>::namespaced_with(consumer.clone(), &name, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .ok()
    })
    .await;
    let theirs = Api::<DynamicObject>::namespaced_with(provider.clone(), &name, &ar);
    until("the object on the provider", limit, || async {
        theirs.get_opt("o").await.ok().flatten()
    })
    .await;
    let took = applied.elapsed();
    let one = scaled(took, applied.duration_since(start), w.period);
    println!(
        "  sample {i:>2}: {:6.1} s ({:.2} periods), {one:5.0} s at a 60 s period",
        took.as_secs_f64(),
        took.as_secs_f64() / w.period.as_secs_f64()
    );
    one
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    kbind::install_crypto_provider();
    let period = Duration::from_secs(number("BENCH_PERIOD", 10));
    let count = number("BENCH_SAMPLES", 5);
    let idle = number("BENCH_IDLE_TICKS", 10);
    let consumer_path = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let provider_path = env("KBIND_TEST_PROVIDER_KUBECONFIG");
    let consumer = client(&consumer_path).await;
    let provider = client(&provider_path).await;
    common::install_crds(&consumer, &kbind::crds::kbind_crds()).await;
    common::install_crds(&provider, &kbind::crds::kbind_crds()).await;
    for (c, ns) in [(&consumer, NS), (&provider, GRANTS)] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
        let _ = Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &n)
            .await;
    }
    let exported: Vec<CustomResourceDefinition> =
        (0..3 * count).map(|i| crd(&format!("w{i}s"))).collect();
    common::install_crds(&provider, &exported).await;
    let kc = kube::config::Kubeconfig::read_from(&provider_path).expect("kubeconfig");
    let cluster = kc.clusters[0].cluster.clone().expect("cluster");
    let ca: k8s_openapi::ByteString =
        serde_json::from_value(json!(cluster.certificate_authority_data)).expect("ca");
    let ca_path = std::env::temp_dir().join("bench-fss-ca.pem");
    std::fs::write(&ca_path, ca.0).expect("ca file");
    let uid = Api::<Namespace>::all(consumer.clone())
        .get("kube-system")
        .await
        .expect("kube-system")
        .metadata
        .uid
        .expect("uid");
    let w = World {
        consumer: consumer_path,
        provider: provider_path,
        server: cluster.server.expect("server"),
        ca: ca_path.to_string_lossy().to_string(),
        period,
    };
    let ticks = period.as_secs() * 5;
    let sweeps = vec!["--full-sweep-every".to_string(), format!("{ticks}s")];
    let mut windowed = sweeps.clone();
    windowed.push(format!("--pin-window={}ms", period.as_millis() / 2));
    let schedules = [
        Schedule {
            name: "before",
            issue_every: 5,
            issue_flags: Vec::new(),
        },
        Schedule {
            name: "every-tick",
            issue_every: 1,
            issue_flags: sweeps,
        },
        Schedule {
            name: "shipped",
            issue_every: 1,
            issue_flags: windowed,
        },
    ];
    println!(
        "time to first sync, service layer: tick {} s standing for 1 min; {count} samples per schedule",
        period.as_secs()
    );
    let mut took_by = Vec::new();
    for (k, s) in schedules.iter().enumerate() {
        println!("{}:", s.name);
        let mut took = Vec::new();
        for j in 0..count {
            let i = k as u64 * count + j;
            let kubeconfig = prepare(&w, &provider, i, &uid).await;
            // Spread the binds over the issuer's cycle (golden-ratio steps).
            let stop = Arc::new(AtomicBool::new(false));
            let start = Instant::now();
            let t = ticker(&w, s, start, stop.clone());
            let cycle = period * u32::try_from(s.issue_every).expect("ticks");
            let phase = (i as f64 * 0.618_034).fract();
            tokio::time::sleep(cycle.mul_f64(phase)).await;
            took.push(sample(&w, (&consumer, &provider), (i, &kubeconfig), start).await);
            stop.store(true, Ordering::SeqCst);
            t.join().expect("ticker");
        }
        took_by.push(took);
    }
    // The unchanged cost: `idle` quiet ticks of each schedule over the settled world.
    let mut rows = Vec::new();
    for (s, took) in schedules.iter().zip(&took_by) {
        let stop = Arc::new(AtomicBool::new(false));
        let t = ticker(&w, s, Instant::now(), stop.clone());
        tokio::time::sleep(period * u32::try_from(idle).expect("ticks")).await;
        stop.store(true, Ordering::SeqCst);
        let quiet = t.join().expect("ticker");
        let hour = |k: usize, f: &dyn Fn(&Cost) -> u64| {
            quiet.iter().map(|c| f(&c[k])).sum::<u64>() as f64 * 60.0 / quiet.len().max(1) as f64
        };
        let total = |f: &dyn Fn(&Cost) -> u64| (0..3).map(|k| hour(k, f)).sum::<f64>();
        rows.push((
            s.name,
            percentile(took, 0.5),
            percentile(took, 0.95),
            hour(2, &|c| c.requests),
            hour(2, &|c| c.writes),
            total(&|c| c.requests),
            total(&|c| c.writes),
        ));
    }
    println!(
        "{:<10} {:>6} {:>6} | unchanged per hour: {:>14} {:>12} {:>20} {:>18}",
        "",
        "p50",
        "p95",
        "issue requests",
        "issue writes",
        "all three: requests",
        "all three: writes"
    );
    for r in &rows {
        println!(
            "{:<10} {:>5.0}s {:>5.0}s | {:>34.0} {:>12.0} {:>20.0} {:>18.0}",
            r.0, r.1, r.2, r.3, r.4, r.5, r.6
        );
    }
    let a = &rows[2];
    for b in &rows[..2] {
        println!(
            "shipped/{}: p95 {:.2}x; unchanged requests {:.2}x, writes {:.2}x (all three passes); issue alone {:.2}x, {:.2}x",
            b.0,
            a.2 / b.2,
            a.5 / b.5,
            a.6 / b.6,
            a.3 / b.3,
            a.4 / b.4
        );
    }
}
