//! Test support: the servers started by `hack/test.sh` (passed in through environment
//! variables), clients for them, and unique names so tests run in parallel without colliding.
#![allow(dead_code)]

pub mod claims_fx;
pub mod fx;
pub mod hold;
pub mod identity;
pub mod issue_fx;
pub mod kcp_fx;
pub mod node;
pub mod pushgateway;

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

/// The harness servers `hack/test.sh` started. Tests that call this are compiled with
/// `#[cfg_attr(not(feature = "servers"), ignore = ...)]`, so a plain `cargo test` reports them
/// ignored; with the feature on (as hack/test.sh builds them), a missing server is a failure,
/// never a skip.
pub fn env() -> Env {
    kbind::install_crypto_provider();
    scoped();
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| {
                panic!(
                    "{k} is not set: the test servers are not running. Run the suite with \
                 `hack/test.sh` (it builds and starts them)"
                )
            })
    };
    Env {
        consumer: var("KBIND_TEST_CONSUMER_KUBECONFIG").into(),
        provider: var("KBIND_TEST_PROVIDER_KUBECONFIG").into(),
        consumer_restricted: var("KBIND_TEST_CONSUMER_RESTRICTED_KUBECONFIG").into(),
        provider_restricted: var("KBIND_TEST_PROVIDER_RESTRICTED_KUBECONFIG").into(),
        spicedb_url: var("KBIND_TEST_SPICEDB_URL"),
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

/// Server-side apply one object given as JSON (as the admin), of the resource `plural` in the
/// group and version its apiVersion names, in its own namespace if it has one.
pub async fn apply_object(client: &Client, plural: &str, d: &serde_json::Value) {
    let api_version = d["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = d["kind"].as_str().expect("kind");
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(group, version, kind),
        plural,
    );
    let name = d["metadata"]["name"].as_str().expect("name");
    let api: Api<kube::api::DynamicObject> = match d["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply("kbind-tests").force(),
        &Patch::Apply(d),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
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

/// Wait until CRD `name` is Established: the apiserver's own controller, which a machine busy
/// with the rest of the suite can keep for many seconds (a 10 s bound failed a CI-like run).
/// At most 60 s.
pub async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) {
    for _ in 0..600 {
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

/// The shipped admission policies confining every issued identity (kbind-grant-*, from
/// deploy/components/provider/issue-rbac.yaml), applied verbatim: the issuer (with its default
/// `--confinement shipped`) issues nothing without them. They match only ServiceAccounts named
/// kbind-grant-*, so they are harmless on the Kubernetes apiservers the suite shares. Never on
/// kcp: kcp v0.31 exits on a policy with parameters (docs/issue.md "Confinement").
pub async fn grant_policies(client: &Client) {
    let docs = identity::rbac_documents("deploy/components/provider/issue-rbac.yaml");
    let mut applied = 0;
    for d in docs.iter().filter(|d| {
        d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kbind-grant-"))
    }) {
        let plural = match d["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => "validatingadmissionpolicies",
            Some("ValidatingAdmissionPolicyBinding") => "validatingadmissionpolicybindings",
            other => panic!("unexpected kbind-grant-* document {other:?}"),
        };
        apply_object(client, plural, d).await;
        applied += 1;
    }
    assert_eq!(applied, 4, "two policies and their bindings");
    grant_pins_ready(client).await;
}

/// Wait until the shipped pins policy has found the Grant CRD.
pub async fn grant_pins_ready(client: &Client) {
    // The pins policy reads Grants: until the apiserver has found the Grant CRD (up to a
    // minute after it is installed) it refuses every write of a labelled object. Wait for a
    // labelled dry-run write to pass, at most 90 s.
    let probe: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kbind-grant-pins-probe",
            "labels": {kbind::api::keys::CONSUMER_CLUSTER: "probe"}}}))
    .expect("probe");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "default");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for _ in 0..180 {
        match cms.create(&dry, &probe).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => return,
            Err(kube::Error::Api(e)) if e.message.contains("paramKind") => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("a labelled dry-run write: {e}"),
        }
    }
    panic!("the apiserver did not find the Grant CRD for kbind-grant-pins within 90 s");
}

/// The real `kbind` binary with `args`, as every test runs it.
pub fn kbind_command(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kbind"));
    cmd.args(args)
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG");
    cmd
}

/// Run the real `kbind` binary; returns (exit code, the summary line parsed as JSON, stderr).
pub fn kbind(args: &[&str]) -> (i32, serde_json::Value, String) {
    outcome(kbind_command(args).output().expect("run kbind"))
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
    let out = tokio::process::Command::from(kbind_command(args))
        .envs(envs.iter().copied())
        .output()
        .await
        .expect("run kbind");
    outcome(out)
}

/// The real `kbind` binary with `args` for a command that prints a document rather than a
/// summary (`kbind claims export`, `kbind crds`): (exit code, stdout, stderr).
pub async fn kbind_output(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::from(kbind_command(args))
        .output()
        .await
        .expect("run kbind");
    keep_emitted(&out);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
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

pub fn outcome(out: std::process::Output) -> (i32, serde_json::Value, String) {
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

/// The note of an Event with `reason` about the object of `uid` (events.k8s.io, in `ns`).
pub async fn event_note(c: &Client, ns: &str, reason: &str, uid: &str) -> Option<String> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.clone(), ns)
        .list(&Default::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .find(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
        })
        .and_then(|e| e.note)
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
    kbind_testkit::faults::kubeconfig_via(kubeconfig, url)
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

/// A file lock in the servers' directory (so it holds across test processes, e.g. nextest's),
/// taken shared or exclusive; dropped, it is released.
fn lock_file(name: &str, exclusive: bool) -> std::fs::File {
    let dir = std::env::var_os("KBIND_TESTENV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(name))
        .unwrap_or_else(|e| panic!("open the lock {name}: {e}"));
    if exclusive { f.lock() } else { f.lock_shared() }
        .unwrap_or_else(|e| panic!("take the lock {name}: {e}"));
    f
}

/// Whether this process runs passes without `--selector` ([`unscoped_lock`]).
static UNSCOPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Every server test process holds the unscoped lock shared, from its first [`env`] until it
/// exits (a test binary under `cargo test`, one test under nextest): its objects are in flux
/// while it lives, and a pass run without `--selector` must not touch them.
fn scoped() {
    static SHARED: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    if !UNSCOPED.load(std::sync::atomic::Ordering::SeqCst) {
        SHARED.get_or_init(|| lock_file("unscoped.lock", false));
    }
}

/// For the tests that run schema and resync as users run them, without `--selector` (they see
/// every test's objects): waits until no other server test process lives, and keeps new ones
/// from starting until the returned lock is dropped. Only what earlier tests left behind remains,
/// and it stays put. Take it before anything else in the test (before [`env`]); a process that
/// takes it never holds the shared side (tests/unscoped.rs is such a process).
pub fn unscoped_lock() -> std::fs::File {
    UNSCOPED.store(true, std::sync::atomic::Ordering::SeqCst);
    lock_file("unscoped.lock", true)
}

/// Run `cmd`, send it `signal` (`KILL`, `TERM`) once `trigger` completes if it is still running,
/// and return what it printed (kept for the secret scan) and whether the signal was sent while
/// it ran. A trigger that never completes is cut off after [`SIGNAL_TRIGGER_TIMEOUT`].
pub async fn signalled_run(
    cmd: std::process::Command,
    signal: &str,
    trigger: impl std::future::Future<Output = ()>,
) -> (std::process::Output, bool) {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("start kbind");
    let pid = child.id().expect("pid").to_string();
    let out = child.wait_with_output();
    tokio::pin!(out);
    let trigger = tokio::time::timeout(SIGNAL_TRIGGER_TIMEOUT, trigger);
    let (out, sent) = tokio::select! {
        out = &mut out => (out, false),
        fired = trigger => {
            if fired.is_err() {
                let _ = std::process::Command::new("kill").args(["-s", "KILL", &pid]).status();
                panic!("the signal's trigger did not come within {SIGNAL_TRIGGER_TIMEOUT:?}");
            }
            let sent = std::process::Command::new("kill")
                .args(["-s", signal, &pid])
                .status()
                .is_ok_and(|s| s.success());
            (out.await, sent)
        }
    };
    let out = out.expect("wait for kbind");
    keep_emitted(&out);
    (out, sent)
}

/// Run `cmd`; once a line of its log (stderr) contains `needle`, run `then` with its pid while
/// the log keeps being read; return what it printed (kept for the secret scan). For a test that
/// must act at a known point of a run (its pin window begun), not after a guessed delay. Panics
/// when the run ends, or 120 s pass, without the line.
pub async fn when_logged<F, Fut>(
    cmd: std::process::Command,
    needle: &str,
    then: F,
) -> std::process::Output
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("start kbind");
    let pid = child.id().expect("pid").to_string();
    let mut stdout = child.stdout.take().expect("stdout");
    let out = tokio::spawn(async move {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b).await;
        b
    });
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = String::new();
    let seen = tokio::time::timeout(SIGNAL_TRIGGER_TIMEOUT, async {
        while let Ok(Some(l)) = lines.next_line().await {
            log.push_str(&l);
            log.push('\n');
            if l.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(seen, Ok(true)),
        "the run never logged {needle:?}:\n{log}"
    );
    let rest = async {
        while let Ok(Some(l)) = lines.next_line().await {
            log.push_str(&l);
            log.push('\n');
        }
    };
    tokio::join!(then(pid), rest);
    let status = child.wait().await.expect("wait for kbind");
    let out = std::process::Output {
        status,
        stdout: out.await.expect("stdout"),
        stderr: log.into_bytes(),
    };
    keep_emitted(&out);
    out
}

/// How long a signal test waits for its trigger (the pass's first write, say).
pub const SIGNAL_TRIGGER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// [`signalled_run`] for a test that may see the pass end first (the model test draws kill times
/// at random).
pub async fn signalled(
    cmd: std::process::Command,
    signal: &str,
    trigger: impl std::future::Future<Output = ()>,
) -> std::process::Output {
    signalled_run(cmd, signal, trigger).await.0
}

/// [`signalled_run`] for a test about the signal: it fails unless the signal reached the pass
/// before it finished (for SIGKILL: the process died of it).
pub async fn signalled_mid_run(
    cmd: std::process::Command,
    signal: &str,
    trigger: impl std::future::Future<Output = ()>,
) -> std::process::Output {
    use std::os::unix::process::ExitStatusExt;
    let (out, sent) = signalled_run(cmd, signal, trigger).await;
    assert!(
        sent,
        "the pass ended before SIG{signal} was sent: the test must give it more work ({})",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    if signal == "KILL" {
        assert_eq!(
            out.status.signal(),
            Some(9),
            "SIGKILL was sent, yet the pass exited by itself: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    out
}

/// Crash-point selection: every write index `1..=writes` of a cold run in the CI suite; with
/// `KBIND_SOAK_COUNT=N` (`hack/soak.sh`) N indices drawn at random. `label` names the draw: one
/// printed seed (`KBIND_SOAK_SEED` replays it) gives each label its own sequence.
pub fn crash_points(label: &str, writes: u64) -> Vec<u64> {
    match soak_rng(label) {
        Some((n, mut next)) => (0..n).map(|_| 1 + next() % writes).collect(),
        None => (1..=writes).collect(),
    }
}

/// Kill delays for signal tests: `ci` (ms) in the CI suite, `KBIND_SOAK_COUNT` random ones below
/// `max_ms` in a soak run.
pub fn kill_delays(label: &str, ci: &[u64], max_ms: u64) -> Vec<std::time::Duration> {
    let ms: Vec<u64> = match soak_rng(label) {
        Some((n, mut next)) => (0..n).map(|_| next() % max_ms).collect(),
        None => ci.to_vec(),
    };
    ms.into_iter()
        .map(std::time::Duration::from_millis)
        .collect()
}

/// `KBIND_SOAK_COUNT` and a generator (splitmix64) seeded from the run's seed and `label`, or
/// `None` outside a soak run.
fn soak_rng(label: &str) -> Option<(usize, impl FnMut() -> u64)> {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let n: usize = std::env::var("KBIND_SOAK_COUNT").ok()?.parse().ok()?;
    let seed = *SEED.get_or_init(|| {
        let seed = std::env::var("KBIND_SOAK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        println!("soak: KBIND_SOAK_SEED={seed}");
        seed
    });
    // FNV-1a of the label, so each draw has its own stream from the one seed.
    let mut state = label.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Some((n, move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }))
}

/// The figures of one crash test: points tried, points whose rerun converged on the state of an
/// uninterrupted run, and data items that run holds which a rerun lacked. `finish` prints the
/// figure line `hack/soak.sh` adds up, then fails the test unless every point converged.
pub struct Tally {
    pass: &'static str,
    kind: &'static str,
    tried: usize,
    converged: usize,
    lost: usize,
    failures: Vec<String>,
}

impl Tally {
    pub fn new(pass: &'static str, kind: &'static str) -> Self {
        Self {
            pass,
            kind,
            tried: 0,
            converged: 0,
            lost: 0,
            failures: Vec::new(),
        }
    }

    /// One crash point: `want`/`got` are the whole final states compared, `data` the items of
    /// the uninterrupted run's data (`want_data`) and of the rerun (`got_data`).
    pub fn point<T: PartialEq + std::fmt::Debug, D: Ord + std::fmt::Debug + Clone>(
        &mut self,
        point: &str,
        want: &T,
        got: &T,
        want_data: &std::collections::BTreeSet<D>,
        got_data: &std::collections::BTreeSet<D>,
    ) {
        self.tried += 1;
        let missing: Vec<D> = want_data.difference(got_data).cloned().collect();
        self.lost += missing.len();
        if want == got && missing.is_empty() {
            self.converged += 1;
        } else if want == got || !self.failures.is_empty() {
            self.failures.push(format!(
                "{point}: missing {missing:?}, states equal: {}",
                want == got
            ));
        } else {
            let (want, got) = (format!("{want:#?}"), format!("{got:#?}"));
            let only = |a: &str, b: &str| -> Vec<String> {
                let b: std::collections::BTreeSet<&str> = b.lines().collect();
                a.lines()
                    .filter(|l| !b.contains(l))
                    .map(str::to_string)
                    .collect()
            };
            self.failures.push(format!(
                "{point}: missing {missing:?}\n  only wanted: {:?}\n  only got: {:?}",
                only(&want, &got),
                only(&got, &want)
            ));
        }
    }

    /// A point that could not be compared (the rerun failed, say).
    pub fn failed(&mut self, point: &str, why: String) {
        self.tried += 1;
        self.failures.push(format!("{point}: {why}"));
    }

    pub fn finish(self) {
        println!(
            "crash-figures pass={} kind={} tried={} converged={} data_lost={}",
            self.pass, self.kind, self.tried, self.converged, self.lost
        );
        assert!(
            self.failures.is_empty() && self.tried > 0,
            "{} {} crash points did not converge:\n{}",
            self.pass,
            self.kind,
            self.failures.join("\n")
        );
    }
}

/// `v` with the keys in `drop` removed at any depth and each `(from, to)` replaced in every
/// string, so states of two fixtures (their own names, their own timestamps) compare.
pub fn normalized(
    v: &serde_json::Value,
    drop: &[&str],
    replace: &[(&str, &str)],
) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !drop.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), normalized(v, drop, replace)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| normalized(v, drop, replace)).collect()),
        Value::String(s) => Value::String(
            replace
                .iter()
                .fold(s.clone(), |s, (from, to)| s.replace(from, to)),
        ),
        other => other.clone(),
    }
}

/// Run `cmd` with `stdin` fed to it (or none), KUBECONFIG from the environment removed so only
/// the kubeconfig a test names is used; stdout and stderr captured.
pub fn output_with_stdin(
    cmd: &mut std::process::Command,
    stdin: Option<&str>,
) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    cmd.env_remove("KUBECONFIG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).expect("stdin");
    }
    child.wait_with_output().expect("output")
}

/// A ValidatingAdmissionPolicy and its binding, both named `name`, that make the apiserver refuse
/// (403) `operations` on `resource` of API group `group` when the CEL `allowed` is false: a real
/// server refusing one write, for tests of what kbind does when a write of its own is denied.
/// Policies take effect asynchronously: wait for a dry-run write to be refused before relying
/// on it.
pub struct Denial {
    name: String,
    policies: Api<kube::api::DynamicObject>,
    bindings: Api<kube::api::DynamicObject>,
}

impl Denial {
    pub async fn create(
        client: &Client,
        name: &str,
        (group, resource, operations): (&str, &str, &[&str]),
        allowed: &str,
        message: &str,
    ) -> Self {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let api = |kind: &str, plural: &str| {
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
                plural,
            );
            Api::<DynamicObject>::all_with(client.clone(), &ar)
        };
        let d = Denial {
            name: name.to_string(),
            policies: api("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
            bindings: api(
                "ValidatingAdmissionPolicyBinding",
                "validatingadmissionpolicybindings",
            ),
        };
        let policy = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                    "operations": operations, "resources": [resource]}]},
                "validations": [{"expression": allowed, "reason": "Forbidden", "message": message}]}});
        let binding = serde_json::json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}});
        for (api, obj) in [(&d.policies, policy), (&d.bindings, binding)] {
            api.create(
                &PostParams::default(),
                &serde_json::from_value(obj).unwrap(),
            )
            .await
            .unwrap();
        }
        d
    }

    /// Remove the policy and its binding (taking effect asynchronously too).
    pub async fn delete(&self) {
        let dp = kube::api::DeleteParams::default();
        let _ = self.bindings.delete(&self.name, &dp).await;
        let _ = self.policies.delete(&self.name, &dp).await;
    }
}

/// Run kubectl against `kubeconfig`, feeding `stdin`; it must succeed.
pub fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CRD kube cannot decode (tests/hostile.rs, tests/issue.rs), deleted however its test
/// ends: while it exists, every issuer run's pin check waits for a person.
pub struct CrdDeletedAtEnd(pub PathBuf, pub String);

impl Drop for CrdDeletedAtEnd {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(["delete", "crd", &self.1, "--ignore-not-found"])
            .output();
    }
}
