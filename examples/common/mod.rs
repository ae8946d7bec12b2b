//! What every benchmark needs: the harness environment, an admin client, and the real binary
//! run to its one-line JSON summary. Included by each `examples/bench_*.rs` as `mod common;`.
#![allow(dead_code)]

pub mod first_sync;

use std::ffi::OsStr;
use std::time::Duration;

use kbind_testkit::faults::{FaultConfig, FaultProxy};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

/// A variable `hack/bench.sh` sets (from the test servers' env file).
pub fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} unset: run through hack/bench.sh"))
}

/// An admin client for the cluster behind `path`.
pub async fn client(path: &str) -> Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Apply `crds` (server-side, manager `bench`) on the cluster of `c` and wait until each is
/// Established (up to 30 s each): a fresh environment has none of kbind's CRDs.
pub async fn install_crds(
    c: &Client,
    crds: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(c.clone());
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply("bench").force(),
            &Patch::Apply(crd),
        )
        .await
        .expect("crd");
    }
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        let established = |c: &CustomResourceDefinition| {
            c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|x| x.type_ == "Established" && x.status == "True")
            })
        };
        let mut ok = false;
        for _ in 0..300 {
            if api
                .get(name)
                .await
                .map(|c| established(&c))
                .unwrap_or(false)
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "CRD {name} not Established within 30 s");
    }
}

/// `BENCH_LATENCY` (e.g. `5ms`, default 0): the round trip a loopback proxy adds to every
/// request kbind and the baselines send (the setup goes straight to the servers).
pub fn latency() -> Duration {
    std::env::var("BENCH_LATENCY")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| {
            kbind::pass::args::parse_duration(&v).expect("BENCH_LATENCY: a duration, e.g. 5ms")
        })
        .unwrap_or(Duration::ZERO)
}

/// `BENCH_CONCURRENCY` (default 16): kbind's `--write-concurrency` and the parallel baseline's
/// workers.
pub fn concurrency() -> usize {
    std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(16)
}

/// A server as kbind and the baselines reach it: straight, or through a proxy adding
/// [`latency`] to every request.
pub struct Link {
    /// Kubeconfig file to hand to kbind.
    pub path: String,
    /// Its text (for a Connection Secret).
    pub text: String,
    /// An admin client through the same route.
    pub client: Client,
    proxied: bool,
}

impl Link {
    /// kbind's extra flags for a Connection Secret of this route (the proxy speaks plain HTTP).
    pub fn flags(&self) -> Vec<String> {
        if self.proxied {
            vec!["--allow-kubeconfig-field".into(), "http".into()]
        } else {
            vec![]
        }
    }
}

/// The server of kubeconfig `path`, reached with `delay` added to every request.
pub async fn link(path: &str, delay: Duration) -> Link {
    let text = std::fs::read_to_string(path).expect("kubeconfig");
    if delay.is_zero() {
        return Link {
            path: path.into(),
            client: client(path).await,
            text,
            proxied: false,
        };
    }
    let server = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server:"))
        .map(|s| s.trim().to_string())
        .expect("kubeconfig has a server");
    // The proxy gets its own runtime and threads, so a baseline running on this process's
    // runtime does not slow the proxy kbind goes through (nor the other way round).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("proxy runtime");
        rt.block_on(async move {
            let proxy = FaultProxy::start(&server, FaultConfig::latency(delay))
                .await
                .expect("latency proxy");
            tx.send((proxy.url(), proxy.addr.port()))
                .expect("proxy url");
            std::future::pending::<()>().await
        })
    });
    let (url, port) = rx.recv().expect("latency proxy started");
    let via = kbind_testkit::faults::kubeconfig_via(&text, &url);
    let file = std::env::temp_dir().join(format!(
        "kbind-bench-{}-{}.kubeconfig",
        std::process::id(),
        port
    ));
    std::fs::write(&file, &via).expect("write kubeconfig");
    let path = file.to_string_lossy().to_string();
    Link {
        client: client(&path).await,
        path,
        text: via,
        proxied: true,
    }
}

/// Run the release `kbind` (`KBIND_BIN`) and return its summary line. Logs go to stderr at
/// `BENCH_LOG` (default `warn`). The proxies of [`link`] run on this process's runtime: the wait
/// for the child leaves them the other worker threads.
pub fn kbind<S: AsRef<OsStr>>(args: &[S]) -> Value {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(|| kbind_blocking(args)),
        Err(_) => kbind_blocking(args),
    }
}

fn kbind_blocking<S: AsRef<OsStr>>(args: &[S]) -> Value {
    let bin = std::env::var("KBIND_BIN").unwrap_or_else(|_| "target/release/kbind".into());
    let out = std::process::Command::new(bin)
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .output()
        .expect("run kbind");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary: {stdout}"))
}

/// One summary line of a benchmarked run: time, requests, writes and peak RSS, `label`
/// left-aligned in `width` columns.
pub fn print_run(label: &str, width: usize, s: &Value) {
    println!(
        "{label:<width$} {:>7.2}s  requests {:>6}  data writes {:>5}  bookkeeping {:>3}  peak RSS {:>6.1} MiB",
        s["duration_seconds"].as_f64().unwrap_or(0.0),
        s["requests"],
        s["data_writes"],
        s["bookkeeping_writes"],
        s["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0
    );
}
