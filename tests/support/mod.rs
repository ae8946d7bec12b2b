//! Test support: the servers started by `hack/test.sh` (passed in through environment
//! variables), clients for them, and unique names so tests run in parallel without colliding.
#![allow(dead_code)]

pub mod claims_fx;
pub mod fx;
pub mod identity;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Where the harness servers are.
#[derive(Clone, Debug)]
pub struct Env {
    pub consumer: PathBuf,
    pub provider: PathBuf,
    pub consumer_restricted: PathBuf,
    pub provider_restricted: PathBuf,
    pub spicedb_url: String,
}

/// The harness servers, or `None` (with one message) when the tests were started without them
/// outside CI. In CI a missing server is a failure, never a skip.
pub fn env() -> Option<Env> {
    kbind::install_crypto_provider();
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        var("KBIND_TEST_CONSUMER_KUBECONFIG"),
        var("KBIND_TEST_PROVIDER_KUBECONFIG"),
        var("KBIND_TEST_CONSUMER_RESTRICTED_KUBECONFIG"),
        var("KBIND_TEST_PROVIDER_RESTRICTED_KUBECONFIG"),
        var("KBIND_TEST_SPICEDB_URL"),
    ) {
        (Some(c), Some(p), Some(cr), Some(pr), Some(s)) => Some(Env {
            consumer: c.into(),
            provider: p.into(),
            consumer_restricted: cr.into(),
            provider_restricted: pr.into(),
            spicedb_url: s,
        }),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("the test servers are not running: CI must run the tests through hack/test.sh")
        }
        _ => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                eprintln!(
                    "skipping integration tests: the real servers are not running. \
                     Run the suite with `hack/test.sh` (it builds and starts them)."
                )
            });
            None
        }
    }
}

pub async fn client(kubeconfig: &PathBuf) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

impl Env {
    pub async fn consumer(&self) -> Client {
        client(&self.consumer).await
    }
    pub async fn provider(&self) -> Client {
        client(&self.provider).await
    }
}

/// A DNS-label-safe name unique to this process and call.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}{:x}-{n}",
        std::process::id() % 4096,
        t % 65536
    )
}

/// Create a namespace (its name unique) and return the name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = unique(prefix);
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// Server-side apply CRDs and wait until they are Established.
pub async fn apply_crds(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.clone().expect("crd name");
        api.patch(
            &name,
            &PatchParams::apply("kbind-tests").force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
    }
    for crd in crds {
        let name = crd.metadata.name.clone().expect("crd name");
        wait_established(&api, &name).await;
    }
}

pub async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) {
    for _ in 0..100 {
        if let Ok(crd) = api.get(name).await {
            let ok = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if ok {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} not established");
}

/// kbind's own CRDs, installed once per cluster (idempotent; tests share the servers).
pub async fn kbind_crds(client: &Client) {
    apply_crds(client, &kbind::crds::kbind_crds()).await;
}

/// Run the real `kbind` binary; returns (exit code, the summary line parsed as JSON, stderr).
pub fn kbind(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kbind"))
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run kbind");
    outcome(out)
}

/// [`kbind`] without blocking the test's runtime, for tests that serve something in-process (a
/// fake the pass talks to would otherwise never be polled).
pub async fn kbind_async(args: &[&str]) -> (i32, serde_json::Value, String) {
    kbind_async_env(args, &[]).await
}

/// [`kbind_async`] with extra environment variables (e.g. the crash knob).
pub async fn kbind_async_env(
    args: &[&str],
    envs: &[(&str, &str)],
) -> (i32, serde_json::Value, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kbind"))
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("run kbind");
    outcome(out)
}

/// Keep what a kbind run printed, for the suite's secret scan (`hack/test.sh` sets
/// `KBIND_TEST_EMIT_DIR` and scans it, with every status and Event, once the tests are done).
pub fn keep_emitted(out: &std::process::Output) {
    let Some(dir) = std::env::var_os("KBIND_TEST_EMIT_DIR") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(format!("{}.log", unique("kbind-run")));
    let mut text = out.stdout.clone();
    text.extend_from_slice(&out.stderr);
    let _ = std::fs::write(path, text);
}

fn outcome(out: std::process::Output) -> (i32, serde_json::Value, String) {
    keep_emitted(&out);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let summary = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| serde_json::json!({"unparsed": stdout}));
    (out.status.code().unwrap_or(-1), summary, stderr)
}

/// Poll `f` until it returns Some, for up to ~10 s.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..100 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A kubeconfig for a fresh ServiceAccount `name` in `namespace` of the cluster behind
/// `admin_kubeconfig`: an identity of its own, with no RBAC until the test grants some.
pub async fn service_account_kubeconfig(
    admin_kubeconfig: &PathBuf,
    namespace: &str,
    name: &str,
) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let c = client(admin_kubeconfig).await;
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(c.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .expect("service account");
    token_kubeconfig(admin_kubeconfig, namespace, name).await
}

/// The admin kubeconfig with its token replaced by a fresh token (TokenRequest) of the existing
/// ServiceAccount `namespace/name`.
pub async fn token_kubeconfig(admin_kubeconfig: &PathBuf, namespace: &str, name: &str) -> String {
    let c = client(admin_kubeconfig).await;
    let body = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}});
    let req = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).unwrap())
    .unwrap();
    let tr: serde_json::Value = c.request(req).await.expect("token request");
    let token = tr["status"]["token"].as_str().expect("token").to_string();
    std::fs::read_to_string(admin_kubeconfig)
        .unwrap()
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                format!("    token: {token}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `kubeconfig` (its text) aimed at `url` instead of its own server: a fault proxy on loopback
/// speaks plain HTTP, so the CA goes too. The credentials stay as they are.
pub fn via(kubeconfig: &str, url: &str) -> String {
    kubeconfig
        .lines()
        .filter(|l| !l.trim_start().starts_with("certificate-authority-data:"))
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                format!("    server: {url}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `server:` URL of a kubeconfig's (only) cluster.
pub fn server_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("server:"))
        .map(|s| s.trim().to_string())
        .expect("kubeconfig has a server")
}

/// Write `text` to a fresh file under the temp dir and return its path.
pub fn temp_file(prefix: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(unique(prefix));
    std::fs::write(&path, text).expect("write temp file");
    path
}
