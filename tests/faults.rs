//! Every pass under a 5% fault rate. A loopback proxy (`kbind_testkit::faults`) stands between
//! kbind and each server it talks to and injects 500, 503, 429 with Retry-After, resets before
//! and after the upstream acted, stalls past the request timeout, truncated bodies and slow
//! responses. Every run must end cleanly (exit 0 or 1: never a panic, an abort or a hang), and the
//! runs must converge on exactly the state an unfaulted pass produces, with nothing lost or
//! written twice. Set `KBIND_FAULT_SEED` to replay a sequence; each test prints its seed and
//! figures.

use crate::relsync_fx;
use crate::support;

use std::future::Future;
use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::core::ClusterBinding;
use kbind_testkit::faults::{FaultConfig, FaultProxy, Refusal};
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fx::{Fx, cond, holds};

const RATE: f64 = 0.05;
/// kbind's `--request-timeout` in these tests: the proxy stalls for 4 s, slow answers take 0.7 s.
const REQUEST_TIMEOUT: &str = "2s";
/// Runs allowed to converge. At 5% a run rarely needs a second; more means lost progress.
const MAX_RUNS: usize = 6;

fn seed() -> u64 {
    std::env::var("KBIND_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// A fault proxy in front of the server of `kubeconfig`, and that kubeconfig aimed at it.
async fn proxied(kubeconfig: &PathBuf, seed: u64) -> (FaultProxy, String) {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let proxy = FaultProxy::start(&support::server_of(&text), FaultConfig::rate(0.0, seed))
        .await
        .unwrap();
    let via = support::via(&text, &proxy.url());
    (proxy, via)
}

/// What the proxies did, for the test output and the issue's figures.
fn figures(what: &str, seed: u64, runs: usize, proxies: &[(&str, &FaultProxy)]) {
    let mut requests = 0;
    let mut by_kind = std::collections::BTreeMap::new();
    for (name, p) in proxies {
        eprintln!(
            "faults[{what}] seed={seed} proxy={name} requests={} injected={} {:?}",
            p.stats.requests(),
            p.stats.total_injected(),
            p.stats.injected()
        );
        // Every server the pass talks to was reached through its proxy: the faults could land.
        assert!(
            p.stats.requests() > 0,
            "{what}: nothing went through the {name} proxy"
        );
        requests += p.stats.requests();
        for (k, n) in p.stats.injected() {
            *by_kind.entry(format!("{k:?}")).or_insert(0) += n;
        }
    }
    // One line per converged test, summed by hack/soak.sh --pass faults.
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}={n}")).collect();
    let injected = by_kind.values().sum::<u64>();
    eprintln!(
        "fault-figures test={what} runs={runs} requests={requests} injected={injected} {}",
        kinds.join(" ")
    );
    // A convergence that met no fault proves nothing: the proxy brings the first one by the
    // 20th request at 5% (kbind_testkit::faults::max_gap), whatever the seed.
    assert!(
        injected > 0,
        "{what}: no fault was injected in {requests} requests: the test checked nothing"
    );
}

/// Run `run` until `check` says the state is the expected one, at most [`MAX_RUNS`] times.
/// Every run must end cleanly. Returns how many runs it took.
async fn converge<R, RF, C, CF>(what: &str, mut run: R, mut check: C) -> usize
where
    R: FnMut() -> RF,
    RF: Future<Output = (i32, Value, String)>,
    C: FnMut() -> CF,
    CF: Future<Output = Result<(), String>>,
{
    let mut last = String::new();
    for i in 1..=MAX_RUNS {
        let (code, summary, stderr) = run().await;
        assert!(
            code == 0 || code == 1,
            "{what}: run {i} must end cleanly (exit 0 or 1), got {code}: {summary}\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{what}: run {i}: {stderr}");
        match check().await {
            Ok(()) => return i,
            Err(e) => last = format!("{e}; last run: {summary}"),
        }
    }
    panic!("{what}: no convergence after {MAX_RUNS} runs: {last}");
}

fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// A fixture with every kbind request to both apiservers going through fault proxies.
struct Faulty {
    fx: Fx,
    consumer: FaultProxy,
    provider: FaultProxy,
    consumer_kubeconfig: PathBuf,
    seed: u64,
}

impl Faulty {
    async fn new(prefix: &str) -> Self {
        let fx = Fx::new(prefix).await;
        let seed = seed();
        let (consumer, kc) = proxied(&fx.env.consumer, seed).await;
        let (provider, pkc) = proxied(&fx.env.provider, seed.wrapping_add(1)).await;
        fx.secret("provider", "kubeconfig", &pkc).await;
        let consumer_kubeconfig = support::temp_file("faulty-kubeconfig", &kc);
        Self {
            fx,
            consumer,
            provider,
            consumer_kubeconfig,
            seed,
        }
    }

    fn faults(&self, on: bool) {
        let rate = if on { RATE } else { 0.0 };
        self.consumer.set_rate(rate);
        self.provider.set_rate(rate);
    }

    /// One run of `pass` (schema or resync) through the proxies. The proxies speak plain HTTP
    /// to kbind, so the provider Secret's `http://` server is re-allowed explicitly.
    async fn run(&self, pass: &str) -> (i32, Value, String) {
        self.run_with(pass, &[]).await
    }

    /// [`Faulty::run`] with `extra` flags.
    async fn run_with(&self, pass: &str, extra: &[&str]) -> (i32, Value, String) {
        let selector = format!("kbind-test={}", self.fx.label);
        let kc = self.consumer_kubeconfig.to_string_lossy().to_string();
        let mut args = vec![
            pass,
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            &self.fx.ns,
            "--credential-namespace",
            &self.fx.ns,
            "--selector",
            &selector,
            "--allow-kubeconfig-field",
            "http",
            "--request-timeout",
            REQUEST_TIMEOUT,
            "--deadline",
            "90s",
            "-o",
            "json",
        ];
        args.extend_from_slice(extra);
        support::kbind_async(&args).await
    }

    fn figures(&self, what: &str, runs: usize) {
        figures(
            what,
            self.seed,
            runs,
            &[("consumer", &self.consumer), ("provider", &self.provider)],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn schema_converges_under_faults() {
    let f = Faulty::new("flt-schema").await;
    let mut apis = Vec::new();
    for plural in ["ones", "twos", "threes", "fours", "fives"] {
        apis.push(
            f.fx.provider_crd(plural, "Namespaced", Some("true"), Some("colour"))
                .await,
        );
    }
    let conn =
        f.fx.connection("p", "provider", json!({"source": "CRD"}), false)
            .await;
    let refs: Vec<&str> = apis.iter().map(String::as_str).collect();
    let cb = f.fx.cluster_binding("cb", &conn, &refs).await;
    f.faults(true);
    let runs = converge(
        "schema",
        || f.run("schema"),
        || async {
            for api in &apis {
                let crd: Option<CustomResourceDefinition> = f.fx.consumer_crd(api).await;
                let Some(crd) = crd else {
                    return Err(format!("{api} not installed"));
                };
                let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
                ensure(schema.to_string().contains("colour"), || {
                    format!("{api} installed without the provider's schema")
                })?;
            }
            let st = f.fx.conn(&conn).await.status.unwrap_or_default();
            for api in &apis {
                ensure(st.exported_apis.iter().any(|e| &e.name == api), || {
                    format!("{api} not in exportedAPIs")
                })?;
            }
            for t in ["Ready", "Connected", "SecretValid"] {
                ensure(holds(&st.conditions, t, "True"), || {
                    format!("Connection {t} not True: {:?}", st.conditions)
                })?;
            }
            ensure(st.remote_cluster_uid.is_some(), || {
                "identity not pinned".into()
            })?;
            let b = Api::<ClusterBinding>::all(f.fx.consumer.clone())
                .get(&cb)
                .await
                .map_err(|e| e.to_string())?;
            let st = b.status.unwrap_or_default();
            ensure(holds(&st.conditions, "Ready", "True"), || {
                "ClusterBinding not Ready".into()
            })
        },
    )
    .await;
    f.figures("schema", runs);
    // Converged means finished: an unfaulted run finds nothing left to write.
    f.faults(false);
    let (code, s, _) = f.run("schema").await;
    assert_eq!((code, &s["data_writes"]), (0, &json!(0)), "{s}");
    let st = f.fx.conn(&conn).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "True");
}

/// The resync scenario: objects created, provider status reported, some deleted.
struct Widgets {
    f: Faulty,
    ar: ApiResource,
}

impl Widgets {
    fn consumer(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.f.fx.consumer.clone(), &self.f.fx.ns, &self.ar)
    }
    fn provider(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.f.fx.provider.clone(), &self.f.fx.ns, &self.ar)
    }

    /// Provider copies: exactly `want` (name, size), each owned by the consumer object.
    async fn provider_copies(&self, want: &[(String, i64)]) -> Result<(), String> {
        let consumer: Vec<DynamicObject> = self
            .consumer()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let provider = self
            .provider()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let mut got: Vec<(String, i64)> = provider
            .iter()
            .map(|p| (p.name_any(), p.data["spec"]["size"].as_i64().unwrap_or(-1)))
            .collect();
        got.sort();
        ensure(got == want, || {
            format!("provider copies {got:?}, want {want:?}")
        })?;
        for p in &provider {
            let owner = p.annotations().get("core.kbind.io/consumer-object-uid");
            let c = consumer.iter().find(|c| c.name_any() == p.name_any());
            ensure(
                c.is_some() && owner == c.and_then(|c| c.uid()).as_ref(),
                || format!("{} is not owned by its consumer object", p.name_any()),
            )?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn resync_converges_under_faults() {
    let f = Faulty::new("flt-resync").await;
    let api =
        f.fx.provider_crd("widgets", "Namespaced", Some("true"), None)
            .await;
    let conn =
        f.fx.connection("p", "provider", json!({"source": "CRD"}), false)
            .await;
    f.fx.cluster_binding("cb", &conn, &[&api]).await;
    f.fx.run(&["--allow-kubeconfig-field", "http"]);
    support::wait_established(&Api::all(f.fx.consumer.clone()), &api).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&f.fx.group, "v1", "Widget"),
        "widgets",
    );
    let w = Widgets { f, ar };
    let names: Vec<String> = (1..=12).map(|i| format!("w{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        let mut o = DynamicObject::new(n, &w.ar).data(json!({"spec": {"size": i}}));
        o.metadata.namespace = Some(w.f.fx.ns.clone());
        w.consumer()
            .create(&PostParams::default(), &o)
            .await
            .unwrap();
    }
    let want: Vec<(String, i64)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i as i64))
        .collect();
    w.f.faults(true);
    let mut runs = converge(
        "resync spec up",
        || w.f.run("resync"),
        || w.provider_copies(&want),
    )
    .await;

    // The provider reports status on every copy; it comes down.
    w.f.faults(false);
    for n in &names {
        let mut p = w.provider().get(n).await.unwrap();
        p.data["status"] = json!({"phase": "Ready", "endpoint": format!("{n}.example")});
        w.provider()
            .replace_status(n, &PostParams::default(), &p)
            .await
            .unwrap();
    }
    w.f.faults(true);
    runs += converge(
        "resync status down",
        || w.f.run("resync"),
        || async {
            for n in &names {
                let c = w.consumer().get(n).await.map_err(|e| e.to_string())?;
                ensure(
                    c.data["status"]["endpoint"] == format!("{n}.example"),
                    || format!("{n} status not down: {}", c.data["status"]),
                )?;
            }
            Ok(())
        },
    )
    .await;

    // Four consumer objects are deleted: their copies go, then their finalizers.
    for n in &names[..4] {
        w.consumer()
            .delete(n, &DeleteParams::default())
            .await
            .unwrap();
    }
    let kept = want[4..].to_vec();
    runs += converge(
        "resync deletion",
        || w.f.run("resync"),
        || async {
            w.provider_copies(&kept).await?;
            let left = w
                .consumer()
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            ensure(left == kept.len(), || {
                format!("{left} consumer objects left")
            })
        },
    )
    .await;
    w.f.figures("resync", runs);
    w.f.faults(false);
    let (code, s, _) = w.f.run("resync").await;
    assert_eq!(
        (code, &s["data_writes"]),
        (0, &json!(0)),
        "nothing left: {s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn claims_converges_under_faults() {
    use support::claims_fx::{ClaimsFx, apibindings_claim, req};
    let mut fx = ClaimsFx::new("flt-claims").await;
    let seed = seed();
    // The proxy sits in front of the kcp front: workspace and virtual-workspace requests alike.
    let proxy = FaultProxy::start(&fx.front.url(), FaultConfig::rate(0.0, seed))
        .await
        .unwrap();
    fx.route_through(&proxy.url()).await;
    let (path, export) = fx.provider().await;
    let entry = support::unique("compute");
    fx.entry(
        &entry,
        &path,
        &export,
        vec![
            req("", "configmaps", None),
            req("storage.io", "volumes", Some("storage")),
        ],
    )
    .await;
    let workspaces = fx.tenants(8, &path, &export).await;
    for ws in &workspaces[..3] {
        fx.grant(ws, &entry, &[("storage.io", "volumes")]).await;
    }
    let state = |consented: bool| {
        let volumes = if consented { "Accepted" } else { "Rejected" };
        let mut v = vec![
            ("configmaps".to_string(), "Accepted".to_string()),
            ("storage.io/volumes".to_string(), volumes.to_string()),
        ];
        v.sort();
        v
    };
    let core = vec![(
        format!(
            "{}/{}",
            apibindings_claim().group,
            apibindings_claim().resource
        ),
        "Accepted".to_string(),
    )];
    proxy.set_rate(RATE);
    let runs = converge(
        "claims",
        || fx.run_with(&fx.ns, &[("KBIND_REQUEST_TIMEOUT", REQUEST_TIMEOUT)]),
        || async {
            for (i, ws) in workspaces.iter().enumerate() {
                let got = fx.claims(ws, "compute").await;
                ensure(got == state(i < 3), || format!("{ws}: {got:?}"))?;
                let got = fx.claims(ws, "core").await;
                ensure(got == core, || format!("{ws} core: {got:?}"))?;
            }
            Ok(())
        },
    )
    .await;
    figures("claims", seed, runs, &[("kcp", &proxy)]);
    proxy.set_rate(0.0);
    let (code, s, _) = fx.run_with(&fx.ns, &[]).await;
    assert_eq!(
        (code, &s["data_writes"]),
        (0, &json!(0)),
        "nothing left: {s}"
    );
    let tenant_rejected: Vec<_> = fx.claims(&workspaces[7], "compute").await;
    assert_eq!(tenant_rejected, state(false));
}

/// Proxies for a relsync fixture: the consumer apiserver and SpiceDB (the upstream's own proxy
/// is the test's).
struct RelsyncFaults {
    kube: FaultProxy,
    spicedb: FaultProxy,
    kubeconfig: String,
}

impl RelsyncFaults {
    async fn new(rx: &mut relsync_fx::Rx, seed: u64) -> Self {
        let (kube, kc) = proxied(&rx.env.consumer, seed).await;
        let kubeconfig = support::temp_file("faulty-kubeconfig", &kc)
            .to_string_lossy()
            .to_string();
        let spicedb = FaultProxy::start(&rx.env.spicedb_url, FaultConfig::rate(0.0, seed ^ 1))
            .await
            .unwrap();
        rx.env.spicedb_url = spicedb.url();
        Self {
            kube,
            spicedb,
            kubeconfig,
        }
    }

    /// Run relsync through the proxies until `check` holds. Failed scopes wait for the source's
    /// next cycle (docs/relsync.md: Ready stays True), so the sources here have a 1 s interval and
    /// every run is a next cycle.
    async fn converge<C, CF>(
        &self,
        what: &str,
        rx: &relsync_fx::Rx,
        upstream: &FaultProxy,
        check: C,
    ) -> usize
    where
        C: FnMut() -> CF,
        CF: Future<Output = Result<(), String>>,
    {
        for p in [&self.kube, &self.spicedb, upstream] {
            p.set_rate(RATE);
        }
        let slack_url = upstream.url();
        let args = [
            "--kubeconfig",
            &self.kubeconfig,
            "--lease-namespace",
            &rx.ns,
            "--request-timeout",
            REQUEST_TIMEOUT,
        ];
        converge(
            what,
            || async {
                tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
                rx.run_env(&slack_url, &args, &[]).await
            },
            check,
        )
        .await
    }
}

/// Ready and no scope errors in the last pass.
async fn clean(rx: &relsync_fx::Rx, source: &str) -> Result<(), String> {
    let st = rx.status(source).await;
    let clean =
        holds(&st.conditions, "Ready", "True") && !holds(&st.conditions, "PartialFailure", "True");
    ensure(clean, || format!("{source}: {:?}", st.conditions))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn relsync_slack_converges_under_faults() {
    use kbind_testkit::slack;
    use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
    let mut rx = Rx::new("flt-slack").await;
    let seed = seed();
    let ids = ["U1", "U2", "U3", "U4", "U5", "U6", "U7", "U8"];
    let users: Vec<_> = ids.iter().map(|i| user(i)).collect();
    let members = |i: usize| &ids[..(i % 8) + 1];
    // More than 32 channels: a window that large diffs against one bulk export of what SpiceDB
    // holds (src/relsync/held.rs), which the faults then cut, stall and refuse as well.
    let n = 40;
    let chans: Vec<_> = (1..=n)
        .map(|i| channel(&format!("C{i:02}"), members(i)))
        .collect();
    let mut want: Vec<String> = (1..=n)
        .flat_map(|i| {
            members(i)
                .iter()
                .map(move |u| format!("C{i:02}#member@{}@example.com", u.to_lowercase()))
        })
        .collect();
    want.sort();
    let mut ws = workspace(users, chans);
    ws.max_page = 3;
    let fake = slack::start(ws, 0).await.unwrap();
    let upstream = FaultProxy::start(&fake.url(), FaultConfig::rate(0.0, seed ^ 2))
        .await
        .unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("s", json!({"kind": "slack", "sync": {"interval": "1s"}}))
        .await;
    let f = RelsyncFaults::new(&mut rx, seed).await;
    let runs = f
        .converge("relsync slack", &rx, &upstream, || async {
            let held: Vec<String> = rx
                .held("slack_channel")
                .await
                .into_iter()
                .filter(|r| r.contains("#member@"))
                .collect();
            ensure(held == want, || {
                format!("{} member relationships, want {}", held.len(), want.len())
            })?;
            clean(&rx, "s").await
        })
        .await;
    figures(
        "relsync-slack",
        seed,
        runs,
        &[
            ("consumer", &f.kube),
            ("spicedb", &f.spicedb),
            ("slack", &upstream),
        ],
    );
    let members: Vec<String> = ids
        .iter()
        .map(|u| format!("T1#member@{}@example.com", u.to_lowercase()))
        .collect();
    assert_eq!(
        rx.held("slack_workspace").await,
        members,
        "every member of the workspace"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn relsync_scim_converges_under_faults() {
    use kbind_testkit::scim;
    use relsync_fx::Rx;
    let mut rx = Rx::new("flt-scim").await;
    let seed = seed();
    let users: Vec<scim::ScimUser> = (1..=6)
        .map(|i| scim::ScimUser {
            id: format!("u{i}"),
            user_name: format!("u{i}"),
            emails: vec![(format!("u{i}@example.com"), true)],
            active: true,
        })
        .collect();
    let members = |g: usize| (1..=6).filter(move |u| (u + g).is_multiple_of(2) || u == &g);
    let groups = (1..=8)
        .map(|g| scim::ScimGroup {
            id: format!("g{g}"),
            display_name: format!("g{g}"),
            members: members(g).map(|u| format!("u{u}")).collect(),
        })
        .collect();
    let mut want: Vec<String> = (1..=8)
        .flat_map(|g| members(g).map(move |u| format!("g{g}#member@u{u}@example.com")))
        .collect();
    want.sort();
    let dir = scim::Directory {
        token: "scim-secret".into(),
        users,
        groups,
        max_results: 2,
        ..Default::default()
    };
    let bridge = scim::start(dir, 0).await.unwrap();
    let upstream = FaultProxy::start(&bridge.url(), FaultConfig::rate(0.0, seed ^ 2))
        .await
        .unwrap();
    rx.identity("scim", "scim-secret", &[&upstream.addr.to_string()])
        .await;
    rx.source(
        "op",
        json!({"kind": "onepassword", "baseURL": upstream.url(), "sync": {"interval": "1s"},
            "auth": {"agentIdentity": "agent", "credential": "scim"}, "config": {"pageSize": 2}}),
    )
    .await;
    let f = RelsyncFaults::new(&mut rx, seed).await;
    let runs = f
        .converge("relsync scim", &rx, &upstream, || async {
            let held = rx.held("scim_group").await;
            ensure(held == want, || format!("held {held:?}, want {want:?}"))?;
            clean(&rx, "op").await
        })
        .await;
    figures(
        "relsync-scim",
        seed,
        runs,
        &[
            ("consumer", &f.kube),
            ("spicedb", &f.spicedb),
            ("scim", &upstream),
        ],
    );
}

/// The token of a kubeconfig (the test servers' users authenticate by token).
fn token_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().to_string())
        .expect("a token user")
}

/// #27 item 3: an upstream whose error text quotes the job's own token, the Connection's token,
/// a signed URL, a credential field and a JWT, in text that is not ASCII. That text is followed
/// to every place kbind prints: a Connection's condition (schema, its identity read refused), an
/// Event and the log as text (resync, a provider write refused), the summary, the exit and the
/// JSON log (schema, its own Lease and then its own cluster's identity refused), a command's
/// error line (kbind status, its listing refused), and the metrics pushed to a real
/// Pushgateway. Each exit that can carry text gets the error; none gets a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_error_quoting_secrets_reaches_every_exit_without_them() {
    let f = Faulty::new("flt-echo").await;
    let pgw = support::pushgateway::Pushgateway::start().await;
    let consumer_token = token_of(&std::fs::read_to_string(&f.fx.env.consumer).unwrap());
    let provider_token = token_of(&std::fs::read_to_string(&f.fx.env.provider).unwrap());
    const SIGNED: &str = "sig-4be1c0de-never-print";
    const FIELD: &str = "Sh0uldNeverBePrinted";
    const JWT: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJrYmluZC10ZXN0In0.c2lnbmF0dXJlLWVjaG8";
    // Not ASCII either: the scrub must not trip over it.
    let quoting = |token: &str| {
        format!(
            "denied: {token} is not known here — see https://help.example/why?sig={SIGNED}#t client_secret={FIELD}, id {JWT}"
        )
    };
    let refuse = |proxy: &FaultProxy, method: http::Method, path: &str, token: &str| {
        proxy.refuse(Some(Refusal {
            method,
            path_contains: path.into(),
            message: quoting(token),
        }))
    };
    let flags = ["--log-level", "debug", "--pushgateway-url", pgw.url()];

    // Bound and synced, no refusal yet.
    let api =
        f.fx.provider_crd("gizmos", "Namespaced", Some("true"), None)
            .await;
    let conn =
        f.fx.connection("p", "provider", json!({"source": "CRD"}), false)
            .await;
    let cb = f.fx.cluster_binding("cb", &conn, &[&api]).await;
    let (code, s, stderr) = f.run("schema").await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    support::wait_established(&Api::all(f.fx.consumer.clone()), &api).await;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": f.fx.ns}})).unwrap();
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(f.fx.provider.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&f.fx.group, "v1", "Gizmo"),
        "gizmos",
    );
    let objects: Api<DynamicObject> = Api::namespaced_with(f.fx.consumer.clone(), &f.fx.ns, &ar);
    let mut o = DynamicObject::new("e1", &ar).data(json!({"spec": {"size": 1}}));
    o.metadata.namespace = Some(f.fx.ns.clone());
    let e1 = objects.create(&PostParams::default(), &o).await.unwrap();
    let mut printed = Vec::new();

    // An Event and the log, as text: the provider refuses resync's create, quoting the
    // Connection's token.
    refuse(&f.provider, http::Method::POST, "/gizmos", &provider_token);
    let text_flags = [&flags[..], &["--log-format", "text"]].concat();
    let refused = f.provider.stats.refused();
    let (code, s, stderr) = f.run_with("resync", &text_flags).await;
    assert_eq!(code, 0, "{s}\n{stderr}");
    assert!(
        f.provider.stats.refused() > refused,
        "the create was refused: {s}"
    );
    let note = support::event_note(
        &f.fx.consumer,
        &f.fx.ns,
        "PermissionDenied",
        &e1.uid().unwrap(),
    )
    .await
    .expect("a PermissionDenied Event on the object");
    assert!(
        note.contains("https://help.example/why"),
        "the error is in the Event: {note}"
    );
    assert!(
        stderr.contains("https://help.example/why"),
        "the error is in the log: {stderr}"
    );
    printed.push(("resync's log", stderr));
    printed.push(("resync's summary", s.to_string()));

    // A condition: the provider refuses schema's identity read.
    refuse(
        &f.provider,
        http::Method::GET,
        "/namespaces/kube-system",
        &provider_token,
    );
    let refused = f.provider.stats.refused();
    let (code, s, stderr) = f.run_with("schema", &flags).await;
    assert!(
        f.provider.stats.refused() > refused,
        "the read was refused: {s}\n{stderr}"
    );
    let c = f.fx.conn(&conn).await;
    let conds = serde_json::to_string(&c.status.clone().unwrap_or_default().conditions).unwrap();
    assert!(
        conds.contains("https://help.example/why"),
        "the error is in a condition: {conds}"
    );
    printed.push(("schema's log", stderr));
    printed.push(("schema's summary", format!("{code} {s}")));
    f.provider.refuse(None);

    // The summary and the exit: kbind's own cluster refuses its Lease, quoting the job's token.
    refuse(
        &f.consumer,
        http::Method::GET,
        "/leases/kbind-schema",
        &consumer_token,
    );
    let (code, s, stderr) = f.run_with("schema", &flags).await;
    f.consumer.refuse(None);
    assert_ne!(code, 0, "{s}\n{stderr}");
    assert_eq!(s["outcome"], "failed", "{s}");
    let message = s["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("https://help.example/why"),
        "the error is in the summary: {s}"
    );
    printed.push(("the failed run's log", stderr));
    printed.push(("the failed run's summary", s.to_string()));

    // The same for a failure after the Lease is held: the job's cluster refuses its identity read.
    refuse(
        &f.consumer,
        http::Method::GET,
        "/namespaces/kube-system",
        &consumer_token,
    );
    let (code, s, stderr) = f.run_with("schema", &flags).await;
    f.consumer.refuse(None);
    assert_ne!(code, 0, "{s}\n{stderr}");
    let message = s["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("identity") && message.contains("https://help.example/why"),
        "the error is in the summary: {s}"
    );
    printed.push(("the second failed run's log", stderr));
    printed.push(("the second failed run's summary", s.to_string()));

    // A command's error line: kbind status, its listing refused.
    refuse(
        &f.consumer,
        http::Method::GET,
        "/connections",
        &consumer_token,
    );
    let kc = f.consumer_kubeconfig.to_string_lossy().to_string();
    let (code, out, stderr) = support::kbind_output(&["status", "--kubeconfig", &kc]).await;
    f.consumer.refuse(None);
    assert_ne!(code, 0, "{out}\n{stderr}");
    assert!(
        stderr.contains("kbind status: ") && stderr.contains("https://help.example/why"),
        "the error is on the command's error line: {stderr}"
    );
    printed.push(("kbind status's error line", format!("{out}\n{stderr}")));

    // The metrics of all four runs, as Prometheus would scrape them.
    let metrics = pgw.scrape_text().await;
    assert!(
        metrics.contains(r#"job="kbind-schema""#) && metrics.contains(r#"job="kbind-resync""#),
        "every run pushed: {metrics}"
    );
    assert!(metrics.contains(r#"outcome="failed"} 1"#), "{metrics}");
    printed.push(("the Pushgateway", metrics));

    // What the runs left in the cluster: the objects' status and every Event they wrote.
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(f.fx.consumer.clone(), &f.fx.ns)
            .list(&Default::default())
            .await
            .unwrap();
    let default_events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(f.fx.consumer.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap();
    printed.push(("Events", serde_json::to_string(&events.items).unwrap()));
    printed.push((
        "Events in default",
        serde_json::to_string(&default_events.items).unwrap(),
    ));
    printed.push(("the Connection", serde_json::to_string(&c).unwrap()));
    let b = Api::<ClusterBinding>::all(f.fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap();
    printed.push(("the ClusterBinding", serde_json::to_string(&b).unwrap()));
    printed.push((
        "the object",
        serde_json::to_string(&objects.get("e1").await.unwrap()).unwrap(),
    ));

    for (exit, text) in &printed {
        for (what, secret) in [
            ("the job's token", consumer_token.as_str()),
            ("the Connection's token", provider_token.as_str()),
            ("a query string", SIGNED),
            ("a credential field", FIELD),
            ("a JWT", JWT),
        ] {
            assert!(!text.contains(secret), "{what} reached {exit}: {text}");
        }
    }
}
