//! Model-based multi-run test (docs/testing.md): seeded random sequences of user and world
//! actions interleaved with runs of `kbind schema` and `kbind resync` (some killed at a random
//! write or by SIGKILL), against the real servers, checked after every step against a simple
//! reference model (tests/support/model_gen.rs).
//!
//! Invariants (docs/testing.md has the reasoning):
//! 1. No provider copy disappears unless its consumer object was deleted through the syncer
//!    finalizer; a foreign provider object is never touched.
//! 2. After two clean rounds (schema then resync, twice) the servers equal the model, and a third
//!    round writes no data.
//! 3. With no intervening action, no condition or kbind annotation flips between runs.
//! 4. After a kill, no run is skipped for longer than the Lease duration (when `--lease-duration`
//!    exists).
//!
//! Each run takes the fixed CI seeds and `KBIND_MODEL_FRESH_SEEDS` (default 2) fresh ones, printed.
//! `KBIND_MODEL_SEEDS=a,b,c` and `KBIND_MODEL_STEPS=N` (steps per seed) override the whole
//! set; `KBIND_MODEL_REPLAY='step; step; …'` runs exactly those steps; `KBIND_MODEL_SHRINK=1`
//! shrinks a failing sequence; `KBIND_MODEL_IGNORE=check,…` reports those checks without failing.

#[path = "support/model_gen.rs"]
mod model_gen;
#[path = "support/relsync_fx.rs"]
mod relsync_fx;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind::api::core::{ClusterBinding, Connection};
use kbind::api::keys;
use kbind_testkit::slack;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use model_gen::{CObj, Key, Kill, Model, PObj, Pass, RModel, RStep, Rng, Step};
use relsync_fx::{Rx, SLACK_TOKEN, workspace};
use serde_json::{Value, json};
use support::fx::Fx;

const ORPHANED: &str = keys::ORPHANED;
const ORPHAN_REASONS: [&str; 2] = [keys::ORPHANED_UNBOUND, keys::ORPHANED_CONSUMER_OBJECT_GONE];
const FOREIGN_OBJECT_EXISTS: &str = "ForeignObjectExists";

/// The fixed CI set: 3 × 80 steps (each settle is 6 runs), about two minutes on 2 cores.
const CI_SEEDS: [u64; 3] = [11, 23, 42];
/// Fresh seeds drawn per run besides the fixed ones (printed, so a failure replays), unless
/// `KBIND_MODEL_SEEDS` names them all; `KBIND_MODEL_FRESH_SEEDS=N` changes how many.
const CI_FRESH_SEEDS: usize = 2;
const CI_STEPS: usize = 80;
const CI_RELSYNC_STEPS: usize = 40;

#[derive(Clone, Debug)]
struct Violation {
    check: &'static str,
    detail: String,
}

/// Which invariant of the module doc a check belongs to.
fn invariant(check: &str) -> &'static str {
    match check {
        "copy-kept" | "foreign-untouched" | "consumer-kept" | "relationship-kept" => {
            "1 (nothing disappears)"
        }
        "spicedb-exact" | "relationship-unexpected" => "5 (SpiceDB holds exactly the model)",
        "converged" | "orphan-annotation" | "counts" | "quiet-writes" | "status-kept"
        | "run-failed" => "2 (converges on the model)",
        "flap" => "3 (no flip without a cause)",
        "lease" => "4 (no skip beyond the Lease)",
        _ => "harness",
    }
}

fn harness(what: impl std::fmt::Display) -> Violation {
    Violation {
        check: "harness",
        detail: what.to_string(),
    }
}

/// How a run that was killed stops blocking the next ones.
#[derive(Clone, Copy, Debug)]
enum LeaseMode {
    /// Today: a killed run's Lease is held for the deadline plus 60 s, so the next run of that
    /// pass goes to a fresh Lease namespace, as an operator would.
    FreshNamespace,
    /// `--lease-duration d` exists: runs keep their Lease namespace and a killed run's Lease
    /// must be taken over within about `d` (invariant 4).
    Takeover(Duration),
}

struct Config {
    seeds: Vec<u64>,
    steps: usize,
    replay: Option<Vec<Step>>,
    /// Steps per seed of the relsync sequences (`KBIND_MODEL_RELSYNC_STEPS`; 0 skips them).
    relsync_steps: usize,
    relsync_replay: Option<Vec<RStep>>,
    shrink: bool,
    /// `KBIND_MODEL_VERBOSE=1`: print every step as it is taken.
    verbose: bool,
    ignore: BTreeSet<String>,
    lease: LeaseMode,
    /// `--lease-duration` when invariant 4 is on.
    lease_args: Vec<String>,
    /// Extra flags every schema and resync run gets: the Lease's, and `--write-concurrency 1`
    /// when the binary has it.
    extra: Vec<String>,
    /// The binary has `--credential-namespace`.
    credential_ns: bool,
}

/// The kbind binary the runs use: this crate's, or `KBIND_BIN` (another build, e.g. the one
/// before a fix, run against the same servers without installing its CRDs; as
/// tests/support/relsync_fx.rs).
fn command(args: &[&str]) -> std::process::Command {
    match std::env::var_os("KBIND_BIN").filter(|b| !b.is_empty()) {
        Some(bin) => {
            let mut cmd = std::process::Command::new(bin);
            cmd.args(args)
                .env("RUST_LOG", "info")
                .env_remove("KUBECONFIG");
            cmd
        }
        None => support::kbind_command(args),
    }
}

/// Run a kbind command without blocking the runtime: (exit code, summary, stderr).
async fn run_kbind(cmd: std::process::Command) -> (i32, Value, String) {
    let out = tokio::process::Command::from(cmd)
        .output()
        .await
        .expect("run kbind");
    support::outcome(out)
}

fn help_has(flag: &str) -> bool {
    command(&["resync", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

/// `n` seeds from the clock, below 10^9 so they read and type easily.
fn fresh_seeds(n: usize) -> Vec<u64> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let base = (nanos % 1_000_000_000) as u64;
    (0..n as u64)
        .map(|i| (base + i * 7_919) % 1_000_000_000)
        .collect()
}

impl Config {
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let seeds = var("KBIND_MODEL_SEEDS")
            .map(|s| {
                s.split(',')
                    .map(|x| x.trim().parse().expect("KBIND_MODEL_SEEDS: numbers"))
                    .collect()
            })
            .unwrap_or_else(|| {
                let fresh = var("KBIND_MODEL_FRESH_SEEDS")
                    .map(|s| s.parse().expect("KBIND_MODEL_FRESH_SEEDS: a number"))
                    .unwrap_or(CI_FRESH_SEEDS);
                let drawn = fresh_seeds(fresh);
                println!(
                    "model: fresh seeds {drawn:?} (replay one: KBIND_MODEL_SEEDS=<seed> cargo test --features servers --test model)"
                );
                CI_SEEDS.iter().copied().chain(drawn).collect()
            });
        let steps = var("KBIND_MODEL_STEPS")
            .map(|s| s.parse().expect("KBIND_MODEL_STEPS: a number"))
            .unwrap_or(CI_STEPS);
        let replay = var("KBIND_MODEL_REPLAY")
            .map(|s| model_gen::parse_steps(&s).expect("KBIND_MODEL_REPLAY"));
        let relsync_steps = var("KBIND_MODEL_RELSYNC_STEPS")
            .map(|s| s.parse().expect("KBIND_MODEL_RELSYNC_STEPS: a number"))
            .unwrap_or(CI_RELSYNC_STEPS);
        let relsync_replay = var("KBIND_MODEL_RELSYNC_REPLAY")
            .map(|s| model_gen::parse_rsteps(&s).expect("KBIND_MODEL_RELSYNC_REPLAY"));
        let ignore = var("KBIND_MODEL_IGNORE")
            .map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
            .unwrap_or_default();
        let duration = var("KBIND_MODEL_LEASE_DURATION")
            .map(|s| kbind::pass::args::parse_duration(&s).expect("KBIND_MODEL_LEASE_DURATION"))
            .unwrap_or(Duration::from_secs(3));
        let takeover = match var("KBIND_MODEL_LEASE_TAKEOVER").as_deref() {
            Some("1" | "true" | "on") => true,
            Some("0" | "false" | "off") => false,
            _ => help_has("--lease-duration"),
        };
        let mut lease_args = Vec::new();
        let lease = if takeover {
            lease_args.push("--lease-duration".to_string());
            // A Lease counts whole seconds.
            lease_args.push(format!("{}s", duration.as_secs().max(1)));
            LeaseMode::Takeover(duration)
        } else {
            LeaseMode::FreshNamespace
        };
        let mut extra = lease_args.clone();
        // docs/testing.md: model runs write one at a time, so a crash point is one write.
        if help_has("--write-concurrency") {
            extra.push("--write-concurrency".into());
            extra.push("1".into());
        }
        Self {
            seeds,
            steps,
            replay,
            relsync_steps,
            relsync_replay,
            shrink: var("KBIND_MODEL_SHRINK").is_some_and(|v| v != "0"),
            verbose: var("KBIND_MODEL_VERBOSE").is_some_and(|v| v != "0"),
            ignore,
            lease,
            lease_args,
            extra,
            credential_ns: help_has("--credential-namespace"),
        }
    }
}

/// What the servers hold, read after every step.
struct Obs {
    crd: Option<CustomResourceDefinition>,
    consumer: BTreeMap<Key, DynamicObject>,
    provider: BTreeMap<Key, DynamicObject>,
    cb: Option<ClusterBinding>,
    conn: Connection,
}

impl Obs {
    fn crd_established(&self) -> bool {
        self.crd.as_ref().is_some_and(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
        })
    }
}

/// Invariant 3: within a window with no disturbing step, no value of the snapshot returns to
/// an earlier one (A → B → A), and once the window holds two full rounds (schema, resync,
/// schema, resync), nothing changes at all.
struct Quiet {
    /// The clean runs that make two full rounds, in order.
    rounds: &'static [&'static str],
    history: BTreeMap<String, Vec<String>>,
    progress: usize,
    baseline: Option<BTreeMap<String, String>>,
}

const ROUNDS: [Pass; 4] = [Pass::Schema, Pass::Resync, Pass::Schema, Pass::Resync];

impl Quiet {
    fn new(rounds: &'static [&'static str]) -> Self {
        Quiet {
            rounds,
            history: BTreeMap::new(),
            progress: 0,
            baseline: None,
        }
    }

    fn reset(&mut self, snap: &BTreeMap<String, String>) {
        self.history = snap
            .iter()
            .map(|(k, v)| (k.clone(), vec![v.clone()]))
            .collect();
        self.progress = 0;
        self.baseline = None;
    }

    fn see(&mut self, snap: &BTreeMap<String, String>, clean: Option<&str>) -> Vec<String> {
        let mut problems = Vec::new();
        for (k, v) in snap {
            let h = self.history.entry(k.clone()).or_default();
            if h.last() != Some(v) {
                if h.contains(v) {
                    problems.push(format!("{k}: {} → {v} again", h.join(" → ")));
                }
                h.push(v.clone());
            }
        }
        if let Some(base) = &self.baseline
            && base != snap
        {
            let keys: BTreeSet<&String> = base.keys().chain(snap.keys()).collect();
            for k in keys {
                let (a, b) = (base.get(k), snap.get(k));
                if a != b {
                    problems.push(format!(
                        "{k}: {} after two clean rounds, now {}",
                        a.map_or("(absent)", String::as_str),
                        b.map_or("(absent)", String::as_str)
                    ));
                }
            }
        }
        if let Some(p) = clean
            && self.progress < self.rounds.len()
            && self.rounds[self.progress] == p
        {
            self.progress += 1;
            if self.progress == self.rounds.len() {
                self.baseline = Some(snap.clone());
            }
        }
        problems
    }
}

struct RunOutcome {
    clean: bool,
    summary: Value,
    note: String,
}

/// The runs of one sequence, and what a killed run leaves behind: its Lease.
struct Runs {
    lease: LeaseMode,
    /// Where fresh Lease namespaces are made.
    consumer: kube::Client,
    /// Per pass, its Lease namespace when not the default.
    lease_ns: BTreeMap<&'static str, String>,
    default_ns: String,
    /// Per pass, when a run was last killed, and whether it surely held the Lease then (it
    /// crashed after a data write).
    killed_at: BTreeMap<&'static str, (Instant, bool)>,
    /// The longest a run was skipped after a kill (invariant 4).
    longest_skip: Duration,
    runs: usize,
    kills: usize,
    /// Runs that stopped early because they could not renew their Lease in time.
    lease_lost: usize,
}

/// Stands for the Lease namespace in a command line built ahead.
const LEASE_NS: &str = "{lease-namespace}";

impl Runs {
    fn new(lease: LeaseMode, consumer: kube::Client, ns: &str) -> Self {
        Runs {
            lease,
            consumer,
            lease_ns: BTreeMap::new(),
            default_ns: ns.to_string(),
            killed_at: BTreeMap::new(),
            longest_skip: Duration::ZERO,
            runs: 0,
            kills: 0,
            lease_lost: 0,
        }
    }

    fn lease_ns(&self, pass: &str) -> String {
        self.lease_ns
            .get(pass)
            .cloned()
            .unwrap_or_else(|| self.default_ns.clone())
    }

    /// A killed run holds its pass Lease. The one place that decides what the next run does
    /// about it (docs/testing.md): today a fresh Lease namespace for that pass; with
    /// `--lease-duration`, nothing (the next runs must take the Lease over in time).
    async fn after_kill(&mut self, pass: &'static str, held_lease: bool) {
        self.kills += 1;
        match self.lease {
            LeaseMode::FreshNamespace => {
                let ns = support::namespace(&self.consumer, "model-lease").await;
                self.lease_ns.insert(pass, ns);
            }
            LeaseMode::Takeover(_) => {
                self.killed_at.insert(pass, (Instant::now(), held_lease));
            }
        }
    }

    /// Run pass `pass` (`make` builds its command for a Lease namespace), killed as `kill`
    /// says. A run skipped because a killed run's Lease is still live is retried, within
    /// invariant 4's bound.
    async fn run(
        &mut self,
        pass: &'static str,
        kill: Kill,
        make: impl Fn(&str) -> std::process::Command,
    ) -> Result<RunOutcome, Violation> {
        let (mut skipped, mut lease_lost) = (0, 0);
        loop {
            let ns = self.lease_ns(pass);
            self.runs += 1;
            let started = Instant::now();
            let (code, summary, stderr, killed) = match kill {
                Kill::No => {
                    let (c, s, e) = run_kbind(make(&ns)).await;
                    (c, s, e, false)
                }
                Kill::AfterWrites(n) => {
                    let mut cmd = make(&ns);
                    cmd.env(kbind::pass::crash::ENV, n.to_string());
                    let (c, s, e) = run_kbind(cmd).await;
                    let crashed = c != 0 && e.contains("reached");
                    (c, s, e, crashed)
                }
                Kill::Sigkill(ms) => {
                    let out = support::signalled(
                        make(&ns),
                        "KILL",
                        tokio::time::sleep(Duration::from_millis(ms)),
                    )
                    .await;
                    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
                    let summary = stdout
                        .lines()
                        .rev()
                        .find_map(|l| serde_json::from_str(l).ok())
                        .unwrap_or(Value::Null);
                    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
                    let code = out.status.code();
                    (code.unwrap_or(-1), summary, stderr, code.is_none())
                }
            };
            let took = started.elapsed();
            if killed {
                self.after_kill(pass, matches!(kill, Kill::AfterWrites(_)))
                    .await;
                let how = match kill {
                    Kill::AfterWrites(n) => format!("aborted after write {n}"),
                    _ => format!("SIGKILLed after {} ms", took.as_millis()),
                };
                return Ok(RunOutcome {
                    clean: false,
                    summary: Value::Null,
                    note: how,
                });
            }
            if code != 0 {
                let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
                return Err(Violation {
                    check: "run-failed",
                    detail: format!(
                        "kbind {} exited {code}: {summary}\n{}",
                        pass,
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ),
                });
            }
            if summary["outcome"] == "skipped" {
                // From the kill to the start of this attempt: a loaded machine may take a while
                // to run the attempt itself.
                let since_kill = self
                    .killed_at
                    .get(&pass)
                    .map(|(t, _)| started.saturating_duration_since(*t));
                let limit = match self.lease {
                    LeaseMode::Takeover(d) => Some(d * 2 + Duration::from_secs(3)),
                    LeaseMode::FreshNamespace => None,
                };
                match (since_kill, limit) {
                    (Some(t), Some(limit)) if t <= limit => {
                        skipped += 1;
                        self.longest_skip = self.longest_skip.max(t);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        continue;
                    }
                    (since_kill, _) => {
                        return Err(Violation {
                            check: "lease",
                            detail: format!(
                                "kbind {} skipped {}: {}",
                                pass,
                                since_kill.map_or("with no run killed".into(), |t| format!(
                                    "{:.1} s after a run was killed",
                                    t.as_secs_f64()
                                )),
                                summary["message"]
                            ),
                        });
                    }
                }
            }
            // The first run after a crash that held the Lease takes it over and says so (even
            // if it then stops early).
            if let Some((t, true)) = self.killed_at.remove(&pass)
                && summary["leaseTakenOver"].is_null()
            {
                return Err(Violation {
                    check: "lease",
                    detail: format!(
                        "the first kbind {} run {:.1} s after a run crashed holding the Lease does not report leaseTakenOver: {summary}",
                        pass,
                        t.elapsed().as_secs_f64()
                    ),
                });
            }
            // A run starved of CPU for longer than its Lease (a loaded machine; the tests run
            // niced) stops as at its deadline (docs/operations.md): not a failure, run it again.
            // It must have run at least one renewal period for that to be the explanation.
            if let LeaseMode::Takeover(d) = self.lease
                && summary["outcome"] == "partial"
                && summary["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("LeaseLost"))
                && summary["duration_seconds"].as_f64().unwrap_or(0.0) >= d.as_secs_f64() / 3.0
                && lease_lost < 5
            {
                lease_lost += 1;
                self.lease_lost += 1;
                continue;
            }
            if summary["outcome"] != "completed" {
                return Err(Violation {
                    check: "run-failed",
                    detail: format!("kbind {} did not complete: {summary}", pass),
                });
            }
            let mut note = format!(
                "data_writes={} bookkeeping_writes={}",
                summary["data_writes"], summary["bookkeeping_writes"]
            );
            if !summary["leaseTakenOver"].is_null() {
                note.push_str(" leaseTakenOver");
            }
            if skipped > 0 {
                note.push_str(&format!(" (after {skipped} skipped runs)"));
            }
            if lease_lost > 0 {
                note.push_str(&format!(
                    " (after {lease_lost} runs stopped by a lost Lease)"
                ));
            }
            return Ok(RunOutcome {
                clean: true,
                summary,
                note,
            });
        }
    }
}

/// One fixture (its own API group, namespaces, Connection, ClusterBinding) and the model of it.
struct World {
    fx: Fx,
    api: String,
    ar: ApiResource,
    conn: String,
    cb: String,
    nss: Vec<String>,
    sa_ns: String,
    crb: String,
    kubeconfig: String,
    rotations: u32,
    local_uid: String,
    runs: Runs,
    extra: Vec<String>,
    credential_ns: bool,
    m: Model,
    quiet: Quiet,
    ignore: BTreeSet<String>,
    /// Violations of ignored checks, reported at the end.
    ignored: Vec<String>,
    step_no: usize,
}

const SA: &str = "model-syncer";

impl World {
    async fn new(cfg: &Config) -> Self {
        let fx = Fx::new("model").await;
        let (api, conn, cb) = fx.bound_api("widgets", "Namespaced").await;
        let ns_b = support::namespace(&fx.consumer, "model-b").await;
        // The Connection's identity: a ServiceAccount of the provider (fresh tokens on rotation).
        let sa_ns = support::namespace(&fx.provider, "model-sa").await;
        let kubeconfig = support::service_account_kubeconfig(&fx.env.provider, &sa_ns, SA).await;
        let crb = format!("{}-syncer", fx.label);
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
            serde_json::from_value(json!({"metadata": {"name": crb},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": sa_ns}]}))
            .unwrap();
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(fx.provider.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("ClusterRoleBinding");
        fx.secret("provider", "kubeconfig", &kubeconfig).await;
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .patch(
                &cb,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"conflictPolicy": "Fail"}})),
            )
            .await
            .expect("conflictPolicy");
        let local_uid = fx
            .conn(&conn)
            .await
            .status
            .and_then(|s| s.local_cluster_uid)
            .expect("the setup run pinned the local cluster");
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
            "widgets",
        );
        let nss = vec![fx.ns.clone(), ns_b];
        let runs = Runs::new(cfg.lease, fx.consumer.clone(), &fx.ns);
        let mut w = World {
            fx,
            api,
            ar,
            conn,
            cb,
            nss,
            sa_ns,
            crb,
            kubeconfig,
            rotations: 0,
            local_uid,
            runs,
            extra: cfg.extra.clone(),
            credential_ns: cfg.credential_ns,
            m: Model {
                bound: true,
                ..Default::default()
            },
            quiet: Quiet::new(&["schema", "resync", "schema", "resync"]),
            ignore: cfg.ignore.clone(),
            ignored: Vec::new(),
            step_no: 0,
        };
        let o = w.observe().await.expect("first observation");
        w.m.crd_ready = o.crd_established();
        let snap = w.snapshot(&o);
        w.quiet.reset(&snap);
        w
    }

    /// Best effort: the cluster-scoped object this fixture made on the provider.
    async fn cleanup(&self) {
        let _ =
            Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(self.fx.provider.clone())
                .delete(&self.crb, &DeleteParams::default())
                .await;
    }

    fn key_of(&self, o: &DynamicObject) -> Option<Key> {
        let ns = self
            .nss
            .iter()
            .position(|n| Some(n) == o.metadata.namespace.as_ref())?;
        let name: u8 = o.name_any().strip_prefix('w')?.parse().ok()?;
        (name < model_gen::NAMES).then_some(Key { ns: ns as u8, name })
    }

    fn consumer_api(&self, k: Key) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.consumer.clone(), &self.nss[k.ns as usize], &self.ar)
    }

    fn provider_api(&self, k: Key) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.provider.clone(), &self.nss[k.ns as usize], &self.ar)
    }

    async fn observe(&self) -> Result<Obs, Violation> {
        let h = |what: &'static str| move |e: kube::Error| harness(format!("{what}: {e}"));
        let crd = Api::<CustomResourceDefinition>::all(self.fx.consumer.clone())
            .get_opt(&self.api)
            .await
            .map_err(h("reading the consumer CRD"))?;
        let mut consumer = BTreeMap::new();
        if crd.is_some() {
            match Api::<DynamicObject>::all_with(self.fx.consumer.clone(), &self.ar)
                .list(&ListParams::default())
                .await
            {
                Ok(l) => {
                    for o in l.items {
                        if let Some(k) = self.key_of(&o) {
                            consumer.insert(k, o);
                        }
                    }
                }
                // Being created or torn down: nothing is served.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(harness(format!("listing consumer objects: {e}"))),
            }
        }
        let mut provider = BTreeMap::new();
        for o in Api::<DynamicObject>::all_with(self.fx.provider.clone(), &self.ar)
            .list(&ListParams::default())
            .await
            .map_err(h("listing provider objects"))?
            .items
        {
            if let Some(k) = self.key_of(&o) {
                provider.insert(k, o);
            }
        }
        let cb = Api::<ClusterBinding>::all(self.fx.consumer.clone())
            .get_opt(&self.cb)
            .await
            .map_err(h("reading the ClusterBinding"))?;
        let conn = Api::<Connection>::all(self.fx.consumer.clone())
            .get(&self.conn)
            .await
            .map_err(h("reading the Connection"))?;
        Ok(Obs {
            crd,
            consumer,
            provider,
            cb,
            conn,
        })
    }

    /// What invariant 3 watches: every condition of the Connection and the ClusterBinding
    /// (status and reason), and kbind's annotations on every consumer object.
    fn snapshot(&self, o: &Obs) -> BTreeMap<String, String> {
        let mut s = BTreeMap::new();
        let mut conds = |kind: &str, cs: &[Condition]| {
            for c in cs {
                s.insert(
                    format!("{kind} condition {}", c.type_),
                    format!("{} {}", c.status, c.reason),
                );
            }
        };
        if let Some(st) = &o.conn.status {
            conds("Connection", &st.conditions);
        }
        if let Some(st) = o.cb.as_ref().and_then(|b| b.status.as_ref()) {
            conds("ClusterBinding", &st.conditions);
        }
        for (k, obj) in &o.consumer {
            let ann = obj.annotations();
            let mut names: BTreeSet<&str> = [keys::CONFLICT, ORPHANED].into_iter().collect();
            names.extend(
                ann.keys()
                    .map(String::as_str)
                    .filter(|a| a.starts_with("core.kbind.io/")),
            );
            for a in names {
                s.insert(
                    format!("{k} annotation {a}"),
                    ann.get(a).cloned().unwrap_or_else(|| "-".into()),
                );
            }
        }
        s
    }

    /// Record problems: the first check not ignored fails the step; ignored ones are kept for
    /// the report.
    fn report(&mut self, problems: Vec<(&'static str, String)>) -> Result<(), Violation> {
        let mut failing: Option<Violation> = None;
        for (check, detail) in problems {
            if self.ignore.contains(check) {
                self.ignored
                    .push(format!("step {} [{check}] {detail}", self.step_no));
                continue;
            }
            match &mut failing {
                Some(v) if v.check == check => v.detail.push_str(&format!("\n  {detail}")),
                Some(_) => {}
                None => {
                    failing = Some(Violation {
                        check,
                        detail: format!("\n  {detail}"),
                    })
                }
            }
        }
        failing.map_or(Ok(()), Err)
    }

    /// After every step: observe, check what must always hold (invariant 1 and the provider's
    /// own data), bring the model's observed facts up to date, and feed invariant 3.
    async fn after(&mut self, disturbing: bool, clean: Option<Pass>) -> Result<Obs, Violation> {
        let o = self.observe().await?;
        let mut p: Vec<(&'static str, String)> = Vec::new();
        for (k, pobj) in self.m.provider.clone() {
            if o.provider.contains_key(&k) {
                continue;
            }
            let consumer = match (
                self.m.consumer.contains_key(&k),
                self.m.terminating.contains(&k),
            ) {
                (true, _) => "lives",
                (_, true) => "is being deleted",
                _ => "is gone",
            };
            match pobj {
                PObj::Copy { may_go: true, .. } => {}
                PObj::Copy { .. } => p.push((
                    "copy-kept",
                    format!(
                        "provider copy {k} was deleted, though its consumer object was never deleted through the syncer finalizer (the consumer object {consumer}; binding {})",
                        if self.m.bound { "bound" } else { "unbound" }
                    ),
                )),
                PObj::Foreign { .. } => {
                    p.push(("foreign-untouched", format!("foreign provider object {k} was deleted")))
                }
            }
            self.m.provider.remove(&k);
        }
        for (k, obj) in &o.provider {
            match self.m.provider.get(k) {
                None => {
                    if obj.labels().get(keys::CONSUMER_CLUSTER) != Some(&self.local_uid) {
                        p.push((
                            "harness",
                            format!(
                                "provider object {k} appeared without kbind's cluster marker: {:?}",
                                obj.metadata.labels
                            ),
                        ));
                    }
                    self.m.provider.insert(
                        *k,
                        PObj::Copy {
                            may_go: false,
                            status: None,
                        },
                    );
                }
                Some(PObj::Foreign { size }) => {
                    let marked: Vec<&String> = obj
                        .labels()
                        .keys()
                        .chain(obj.annotations().keys())
                        .filter(|k| k.starts_with("core.kbind.io/"))
                        .collect();
                    if obj.data["spec"] != json!({"size": size}) || !marked.is_empty() {
                        p.push(("foreign-untouched", format!("foreign provider object {k} was changed: spec {} (was size {size}), kbind keys {marked:?}", obj.data["spec"])));
                    }
                }
                Some(PObj::Copy {
                    status: Some(st), ..
                }) => {
                    if &obj.data["status"] != st {
                        p.push((
                            "status-kept",
                            format!(
                                "the provider's status on {k} was {st}, now {}",
                                obj.data["status"]
                            ),
                        ));
                    }
                }
                Some(PObj::Copy { .. }) => {}
            }
        }
        // A consumer object released by the syncer finalizer whose copy is still there: the copy
        // is an orphan from now on, and stays.
        for (k, pobj) in self.m.provider.iter_mut() {
            if let PObj::Copy { may_go, .. } = pobj
                && *may_go
                && !o.consumer.contains_key(k)
            {
                *may_go = false;
            }
        }
        self.m.terminating.retain(|k| o.consumer.contains_key(k));
        if self.m.bound && o.crd_established() {
            for k in self.m.consumer.keys() {
                if !o.consumer.contains_key(k) {
                    p.push((
                        "consumer-kept",
                        format!("consumer object {k} vanished while bound"),
                    ));
                }
            }
        }
        self.m
            .consumer
            .retain(|k, _| o.consumer.contains_key(k) || !o.crd_established());
        self.m.crd_ready = self.m.bound && o.crd_established();
        self.m.teardown_done = !self.m.bound && o.cb.is_none() && o.crd.is_none();
        self.report(p)?;

        let snap = self.snapshot(&o);
        if disturbing {
            self.quiet.reset(&snap);
        } else {
            let flaps = self.quiet.see(&snap, clean.map(Pass::name));
            self.report(flaps.into_iter().map(|f| ("flap", f)).collect())?;
        }
        Ok(o)
    }

    fn args(&self, pass: Pass, lease_ns: &str) -> Vec<String> {
        let mut a: Vec<String> = [
            pass.name(),
            "--kubeconfig",
            &self.fx.env.consumer.to_string_lossy(),
            "--lease-namespace",
            lease_ns,
            "--selector",
            &format!("kbind-test={}", self.fx.label),
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.credential_ns {
            // The Secret stays in the fixture's namespace whatever the Lease namespace is.
            a.extend(["--credential-namespace".into(), self.fx.ns.clone()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    async fn run(&mut self, pass: Pass, kill: Kill) -> Result<RunOutcome, Violation> {
        let template = self.args(pass, LEASE_NS);
        let out = self
            .runs
            .run(pass.name(), kill, move |ns: &str| {
                let args: Vec<&str> = template
                    .iter()
                    .map(|a| if a == LEASE_NS { ns } else { a.as_str() })
                    .collect();
                command(&args)
            })
            .await?;
        if pass == Pass::Schema {
            self.wait_for_crd().await;
        }
        Ok(out)
    }

    /// After a schema run, let the apiserver finish what the run started on the consumer CRD
    /// (Established, or deleted), so the next step sees the same state on every replay.
    async fn wait_for_crd(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.fx.consumer.clone());
        for _ in 0..100 {
            let Ok(crd) = crds.get_opt(&self.api).await else {
                return;
            };
            let done = match &crd {
                None => true,
                Some(c) if c.metadata.deletion_timestamp.is_some() => false,
                Some(c) => c
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    }),
            };
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Perform one step; returns what happened (for the replay listing).
    async fn step(&mut self, step: &Step) -> Result<String, Violation> {
        let h = |what: String| move |e: kube::Error| harness(format!("{what}: {e}"));
        let skip = |why: &str| Ok(format!("skipped: {why}"));
        let note = match *step {
            Step::Create { key, size } => {
                if !self.m.crd_ready {
                    return skip("no consumer API");
                }
                if self.m.consumer.contains_key(&key) || self.m.terminating.contains(&key) {
                    return skip("the name is taken");
                }
                let mut o = DynamicObject::new(&key.object_name(), &self.ar)
                    .data(json!({"spec": {"size": size}}));
                o.metadata.namespace = Some(self.nss[key.ns as usize].clone());
                match self
                    .consumer_api(key)
                    .create(&PostParams::default(), &o)
                    .await
                {
                    Ok(c) => {
                        self.m.consumer.insert(
                            key,
                            CObj {
                                size,
                                uid: c.uid().unwrap_or_default(),
                            },
                        );
                        "created".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return skip("the name is taken");
                    }
                    Err(e) => return Err(harness(format!("create {key}: {e}"))),
                }
            }
            Step::Update { key, size } => {
                if !self.m.consumer.contains_key(&key) {
                    return skip("no such object");
                }
                self.consumer_api(key)
                    .patch(
                        &key.object_name(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"size": size}})),
                    )
                    .await
                    .map_err(h(format!("update {key}")))?;
                if let Some(c) = self.m.consumer.get_mut(&key) {
                    c.size = size;
                }
                "updated".into()
            }
            Step::Delete { key } => {
                if !self.m.consumer.contains_key(&key) {
                    return skip("no such object");
                }
                let api = self.consumer_api(key);
                let name = key.object_name();
                let Some(obj) = api.get_opt(&name).await.map_err(h(format!("get {key}")))? else {
                    return skip("no such object");
                };
                let held = obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER);
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(h(format!("delete {key}")))?;
                self.m.consumer.remove(&key);
                if held {
                    self.m.terminating.insert(key);
                    if let Some(PObj::Copy { may_go, .. }) = self.m.provider.get_mut(&key) {
                        *may_go = true;
                    }
                    "deleted (syncer finalizer held)".into()
                } else {
                    "deleted (no syncer finalizer yet)".into()
                }
            }
            Step::ProviderStatus { key, phase } => {
                if !matches!(self.m.provider.get(&key), Some(PObj::Copy { .. })) {
                    return skip("no copy");
                }
                let status = json!({"phase": format!("P{phase}")});
                match self
                    .provider_api(key)
                    .patch_status(
                        &key.object_name(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": status })),
                    )
                    .await
                {
                    Ok(o) => {
                        if let Some(PObj::Copy { status, .. }) = self.m.provider.get_mut(&key) {
                            *status = Some(o.data["status"].clone());
                        }
                        "status written".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => return skip("no copy"),
                    Err(e) => return Err(harness(format!("status {key}: {e}"))),
                }
            }
            Step::Foreign { key, size } => {
                if self.m.provider.contains_key(&key) {
                    return skip("the provider name is taken");
                }
                let ns = self.nss[key.ns as usize].clone();
                let n: k8s_openapi::api::core::v1::Namespace =
                    serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
                let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.fx.provider.clone())
                    .create(&PostParams::default(), &n)
                    .await;
                let mut o = DynamicObject::new(&key.object_name(), &self.ar)
                    .data(json!({"spec": {"size": size}}));
                o.metadata.namespace = Some(ns);
                match self
                    .provider_api(key)
                    .create(&PostParams::default(), &o)
                    .await
                {
                    Ok(_) => {
                        self.m.provider.insert(key, PObj::Foreign { size });
                        "created on the provider".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return skip("the provider name is taken");
                    }
                    Err(e) => return Err(harness(format!("foreign {key}: {e}"))),
                }
            }
            Step::Unbind => {
                if !self.m.bound {
                    return skip("not bound");
                }
                Api::<ClusterBinding>::all(self.fx.consumer.clone())
                    .delete(&self.cb, &DeleteParams::default())
                    .await
                    .map_err(h("unbind".into()))?;
                self.m.bound = false;
                self.m.crd_ready = false;
                // The consumer CRD and its objects go with the binding.
                self.m.consumer.clear();
                "ClusterBinding deleted".into()
            }
            Step::Rebind => {
                if self.m.bound || !self.m.teardown_done {
                    return skip("the old binding is still there");
                }
                let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                    "metadata": {"name": self.cb, "labels": {"kbind-test": self.fx.label}},
                    "spec": {"connectionRef": {"name": self.conn}, "apis": [{"name": self.api}], "conflictPolicy": "Fail"}});
                Api::<ClusterBinding>::all(self.fx.consumer.clone())
                    .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
                    .await
                    .map_err(h("rebind".into()))?;
                self.m.bound = true;
                "ClusterBinding created again".into()
            }
            Step::Rotate { fresh } => {
                self.rotations += 1;
                let text = if fresh {
                    self.kubeconfig =
                        support::token_kubeconfig(&self.fx.env.provider, &self.sa_ns, SA).await;
                    self.kubeconfig.clone()
                } else {
                    format!("{}\n# rewritten {}\n", self.kubeconfig, self.rotations)
                };
                self.fx.secret("provider", "kubeconfig", &text).await;
                if fresh {
                    "Secret rewritten with a fresh token".into()
                } else {
                    "Secret rewritten, same kubeconfig".into()
                }
            }
            Step::Run { pass, kill } => {
                let r = self.run(pass, kill).await?;
                if r.clean && pass == Pass::Resync {
                    self.m.pending_work = false;
                }
                self.after(!r.clean, r.clean.then_some(pass)).await?;
                return Ok(r.note);
            }
            Step::Settle => return self.settle().await,
        };
        self.m.pending_work = true;
        self.after(step.disturbs(), None).await?;
        Ok(note)
    }

    /// Invariant 2: two clean rounds, then the servers must equal the model, and a third round
    /// must write no data (invariant 3 watches its conditions and annotations).
    async fn settle(&mut self) -> Result<String, Violation> {
        let mut notes = Vec::new();
        for pass in ROUNDS {
            let r = self.run(pass, Kill::No).await?;
            notes.push(format!("{}: {}", pass.name(), r.summary["data_writes"]));
            self.after(false, Some(pass)).await?;
        }
        self.m.pending_work = false;
        self.check_converged().await?;
        for pass in [Pass::Schema, Pass::Resync] {
            let r = self.run(pass, Kill::No).await?;
            self.after(false, Some(pass)).await?;
            let n = r.summary["data_writes"].as_u64().unwrap_or(u64::MAX);
            if n != 0 {
                let planned = self.dry_run(pass).await;
                self.report(vec![(
                    "quiet-writes",
                    format!(
                        "the third {} run wrote {n} data ({}); a dry run now would: {planned}",
                        pass.name(),
                        r.summary["counts"]
                    ),
                )])?;
            }
        }
        Ok(format!(
            "data writes per run {}; converged; third round quiet",
            notes.join(", ")
        ))
    }

    /// The writes a run would make now (to explain a third-round write).
    async fn dry_run(&self, pass: Pass) -> String {
        let mut args = self.args(pass, &self.runs.lease_ns(pass.name()));
        args.push("--dry-run".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let (_, s, _) = run_kbind(command(&argv)).await;
        s["planned"].to_string()
    }

    async fn check_converged(&mut self) -> Result<(), Violation> {
        let o = self.observe().await?;
        let mut p: Vec<(&'static str, String)> = Vec::new();
        let conds = |st: Option<&Vec<Condition>>, t: &str| -> String {
            st.and_then(|cs| cs.iter().find(|c| c.type_ == t))
                .map_or("(none)".into(), |c| format!("{} {}", c.status, c.reason))
        };
        let ready = conds(o.conn.status.as_ref().map(|s| &s.conditions), "Ready");
        if !ready.starts_with("True") {
            p.push(("converged", format!("Connection Ready is {ready}")));
        }
        if self.m.bound {
            let conflicts: BTreeSet<Key> = self
                .m
                .consumer
                .keys()
                .filter(|k| self.m.foreign(k))
                .copied()
                .collect();
            match &o.cb {
                None => p.push(("converged", "the ClusterBinding is gone".into())),
                Some(cb) => {
                    let st = cb.status.clone().unwrap_or_default();
                    let ready = conds(Some(&st.conditions), "Ready");
                    if !ready.starts_with("True") {
                        p.push(("converged", format!("ClusterBinding Ready is {ready}")));
                    }
                    let want_conflicts = if conflicts.is_empty() {
                        "False"
                    } else {
                        "True"
                    };
                    let got = conds(Some(&st.conditions), "Conflicts");
                    if !got.starts_with(want_conflicts) {
                        p.push((
                            "counts",
                            format!("ClusterBinding Conflicts is {got}, conflicts {conflicts:?}"),
                        ));
                    }
                    let a = st.bound_apis.iter().find(|a| a.name == self.api);
                    let got = a.map(|a| (a.in_sync, a.conflict_count, a.pending, a.orphaned));
                    let n = |x: usize| Some(x as i64);
                    let orphans = self
                        .m
                        .provider
                        .iter()
                        .filter(|(k, p)| {
                            matches!(p, PObj::Copy { .. }) && !self.m.consumer.contains_key(k)
                        })
                        .count();
                    let want = Some((
                        n(self.m.consumer.len() - conflicts.len()),
                        n(conflicts.len()),
                        n(0),
                        n(orphans),
                    ));
                    if got != want {
                        p.push(("counts", format!("boundAPIs (inSync, conflictCount, pending, orphaned) = {got:?}, model {want:?}")));
                    }
                }
            }
            if !o.crd_established() {
                p.push(("converged", "the consumer CRD is not Established".into()));
            }
            for k in &self.m.terminating {
                p.push(("converged", format!("consumer object {k} was deleted but is still there (syncer finalizer not released)")));
            }
            for k in o.consumer.keys() {
                if !self.m.consumer.contains_key(k) && !self.m.terminating.contains(k) {
                    p.push((
                        "converged",
                        format!("consumer object {k} exists, the model has none"),
                    ));
                }
            }
            for (k, c) in &self.m.consumer {
                let Some(obj) = o.consumer.get(k) else {
                    p.push(("converged", format!("consumer object {k} is missing")));
                    continue;
                };
                let ann = obj.annotations();
                let conflict = ann.get(keys::CONFLICT).map(String::as_str);
                if self.m.foreign(k) {
                    if conflict != Some(FOREIGN_OBJECT_EXISTS) {
                        p.push(("converged", format!("{k}: a foreign provider object holds the name; conflict annotation is {conflict:?}, want {FOREIGN_OBJECT_EXISTS}")));
                    }
                    continue;
                }
                if let Some(c) = conflict {
                    p.push(("converged", format!("{k}: conflict annotation {c} though the provider holds no foreign object")));
                }
                if !obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER) {
                    p.push(("converged", format!("{k}: no syncer finalizer")));
                }
                let Some(copy) = o.provider.get(k) else {
                    p.push(("converged", format!("{k}: no provider copy")));
                    continue;
                };
                if copy.data["spec"] != json!({"size": c.size}) {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider spec {} but the consumer's is size {}",
                            copy.data["spec"], c.size
                        ),
                    ));
                }
                if copy.labels().get(keys::CONSUMER_CLUSTER) != Some(&self.local_uid) {
                    p.push((
                        "converged",
                        format!("{k}: provider copy lacks the cluster marker"),
                    ));
                }
                let owner = copy.annotations().get(keys::CONSUMER_OBJECT_UID).cloned();
                if owner.as_ref() != Some(&c.uid) {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider copy's object marker {owner:?}, consumer object uid {}",
                            c.uid
                        ),
                    ));
                }
                if let Some(r) = copy.annotations().get(ORPHANED) {
                    p.push((
                        "orphan-annotation",
                        format!("{k}: adopted copy still marked {ORPHANED}: {r}"),
                    ));
                }
                let st = &copy.data["status"];
                if !st.is_null() && &obj.data["status"] != st {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider status {st} not copied down (consumer has {})",
                            obj.data["status"]
                        ),
                    ));
                }
            }
        } else {
            if o.cb.is_some() {
                p.push((
                    "converged",
                    "the ClusterBinding is still there after the unbind".into(),
                ));
            }
            if o.crd.is_some() {
                p.push((
                    "converged",
                    "the consumer CRD is still there after the unbind".into(),
                ));
            }
        }
        for (k, pobj) in &self.m.provider {
            if !matches!(pobj, PObj::Copy { .. })
                || (self.m.bound && self.m.consumer.contains_key(k))
            {
                continue;
            }
            let Some(copy) = o.provider.get(k) else {
                continue;
            };
            let r = copy.annotations().get(ORPHANED).cloned();
            if !r.as_deref().is_some_and(|r| ORPHAN_REASONS.contains(&r)) {
                p.push(("orphan-annotation", format!("{k}: copy without a consumer object has {ORPHANED} {r:?}, want one of {ORPHAN_REASONS:?}")));
            }
        }
        self.report(p)
    }
}

/// A sequence that broke an invariant.
struct Failure {
    seed: Option<u64>,
    step: usize,
    violation: Violation,
    /// Each step's text and what happened.
    steps: Vec<(String, String)>,
    ignored: Vec<String>,
    /// The variables that replay it: (steps per seed, exact steps).
    vars: (&'static str, &'static str),
}

impl Failure {
    fn render(&self, shrunk: Option<&[String]>) -> String {
        let mut s = format!(
            "model: {} failed at step {}: invariant {} [{}]:{}\nsteps taken:\n",
            self.seed.map_or("replay".into(), |s| format!("seed {s}")),
            self.step,
            invariant(self.violation.check),
            self.violation.check,
            self.violation.detail
        );
        for (i, (step, note)) in self.steps.iter().enumerate() {
            s.push_str(&format!("  {:>3} {step:<28} {note}\n", i + 1));
        }
        let plain: Vec<&str> = self.steps.iter().map(|(s, _)| s.as_str()).collect();
        let (steps_var, replay_var) = self.vars;
        if let Some(seed) = self.seed {
            s.push_str(&format!(
                "replay: KBIND_MODEL_SEEDS={seed} {steps_var}={} cargo test --features servers --test model\n",
                self.step
            ));
        }
        s.push_str(&format!(
            "replay these steps: {replay_var}='{}' cargo test --features servers --test model\n",
            plain.join("; ")
        ));
        if let Some(shrunk) = shrunk {
            s.push_str(&format!(
                "shrunk ({} steps): {replay_var}='{}' cargo test --features servers --test model\n",
                shrunk.len(),
                shrunk.join("; ")
            ));
        }
        if !self.ignored.is_empty() {
            s.push_str("ignored violations before it:\n");
            for i in &self.ignored {
                s.push_str(&format!("  {i}\n"));
            }
        }
        s
    }
}

/// Run one sequence: generated from `seed` (then a final settle) or exactly `replay`.
async fn sequence(
    cfg: &Config,
    seed: Option<u64>,
    replay: Option<&[Step]>,
) -> Result<String, Failure> {
    let started = Instant::now();
    let mut w = World::new(cfg).await;
    let mut rng = Rng::new(seed.unwrap_or(0));
    let n = replay.map_or(cfg.steps + 1, <[Step]>::len);
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut since_settle = 0;
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for i in 0..n {
        let step = match replay {
            Some(r) => r[i].clone(),
            // The last generated step is a settle, so every sequence ends checked.
            None if i == cfg.steps => Step::Settle,
            None => model_gen::generate(&mut rng, &w.m, since_settle),
        };
        since_settle = if step == Step::Settle {
            0
        } else {
            since_settle + 1
        };
        w.step_no = i + 1;
        let kind = match &step {
            Step::Create { .. } => "create",
            Step::Update { .. } => "update",
            Step::Delete { .. } => "delete",
            Step::ProviderStatus { .. } => "status",
            Step::Foreign { .. } => "foreign",
            Step::Unbind => "unbind",
            Step::Rebind => "rebind",
            Step::Rotate { .. } => "rotate",
            Step::Run { .. } => "run",
            Step::Settle => "settle",
        };
        *counts.entry(kind).or_default() += 1;
        let r = w.step(&step).await;
        if cfg.verbose {
            let note = r.as_ref().map_or("VIOLATION", String::as_str);
            println!("model: {:>3} {step:<28} {note}", i + 1);
        }
        match r {
            Ok(note) => steps.push((step.to_string(), note)),
            Err(violation) => {
                steps.push((step.to_string(), "VIOLATION".into()));
                w.cleanup().await;
                if let Some(seed) = seed {
                    println!(
                        "model-figures seed={seed} steps={} runs={} killed={} lease_lost={} result=fail check={}",
                        steps.len(),
                        w.runs.runs,
                        w.runs.kills,
                        w.runs.lease_lost,
                        violation.check
                    );
                }
                return Err(Failure {
                    seed,
                    step: i + 1,
                    violation,
                    steps,
                    ignored: w.ignored,
                    vars: ("KBIND_MODEL_STEPS", "KBIND_MODEL_REPLAY"),
                });
            }
        }
    }
    w.cleanup().await;
    if let Some(seed) = seed {
        println!(
            "model-figures seed={seed} steps={} runs={} killed={} lease_lost={} result=ok",
            steps.len(),
            w.runs.runs,
            w.runs.kills,
            w.runs.lease_lost
        );
    }
    let mut s = format!(
        "model: {}: {} steps {counts:?}, {} kbind runs, {} killed, {} stopped by a lost Lease, longest skip after a kill {:.1} s, {:.0} s",
        seed.map_or("replay".into(), |s| format!("seed {s}")),
        steps.len(),
        w.runs.runs,
        w.runs.kills,
        w.runs.lease_lost,
        w.runs.longest_skip.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for i in &w.ignored {
        s.push_str(&format!("\n  ignored: {i}"));
    }
    Ok(s)
}

/// Remove chunks of a failing sequence while it still fails the same check (bounded).
async fn shrink(cfg: &Config, f: &Failure) -> Vec<String> {
    let mut cur: Vec<Step> = f
        .steps
        .iter()
        .filter_map(|(s, _)| model_gen::parse_step(s))
        .collect();
    let mut chunk = cur.len() / 2;
    let mut attempts = 0;
    while chunk >= 1 && attempts < 40 {
        let mut i = 0;
        while i < cur.len() && attempts < 40 {
            let mut cand = cur.clone();
            cand.drain(i..(i + chunk).min(cand.len()));
            attempts += 1;
            match sequence(cfg, None, Some(&cand)).await {
                Err(g) if g.violation.check == f.violation.check => {
                    println!("model: shrink: {} steps still fail", g.step);
                    cur = cand[..g.step].to_vec();
                }
                _ => i += chunk,
            }
        }
        chunk /= 2;
    }
    cur.iter().map(ToString::to_string).collect()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn random_sequences_of_actions_and_runs_converge_and_stay_put() {
    // Our exports must stay ours for the whole run (a pullPolicy All test would take them).
    let _exports = support::all_exports_lock(false);
    let cfg = Config::from_env();
    println!(
        "model: lease {:?}, extra flags {:?}, ignoring {:?}",
        cfg.lease, cfg.extra, cfg.ignore
    );
    let runs: Vec<(Option<u64>, Option<Vec<Step>>)> = match &cfg.replay {
        Some(r) => vec![(None, Some(r.clone()))],
        None => cfg.seeds.iter().map(|s| (Some(*s), None)).collect(),
    };
    let mut failures = Vec::new();
    for (seed, replay) in runs {
        match sequence(&cfg, seed, replay.as_deref()).await {
            Ok(line) => println!("{line}"),
            Err(f) => {
                let shrunk = if cfg.shrink {
                    Some(shrink(&cfg, &f).await)
                } else {
                    None
                };
                let text = f.render(shrunk.as_deref());
                println!("{text}");
                failures.push(text);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sequences that once failed, kept as regression tests (their issue, seed and check).
const REGRESSIONS: [(&str, &str); 2] = [
    (
        "#29 seed 849921154 shrunk [counts]: a binding with no objects got no counts or Conflicts",
        "settle",
    ),
    (
        "#29 seed 849921154 [counts]: unbind and re-bind with killed runs; the re-created binding went unrecorded",
        "run schema; foreign a/w2 size=160; run resync; unbind; run resync; run resync; run resync; settle; rebind; run resync; run schema; run resync; unbind; run schema crash=1; run resync; run resync; run resync crash=3; run resync; run resync; run resync crash=1; run schema crash=3; run resync; rebind; run schema crash=3; settle",
    ),
];

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn sequences_that_once_failed_converge() {
    let _exports = support::all_exports_lock(false);
    let cfg = Config::from_env();
    let mut failures = Vec::new();
    for (what, replay) in REGRESSIONS {
        let steps = model_gen::parse_steps(replay).expect("a regression replay parses");
        match sequence(&cfg, None, Some(&steps)).await {
            Ok(line) => println!("{what}: {line}"),
            Err(f) => failures.push(format!("{what}:\n{}", f.render(None))),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn steps_read_back_from_their_replay_form() {
    let mut rng = Rng::new(7);
    let mut m = Model {
        bound: true,
        crd_ready: true,
        ..Default::default()
    };
    let mut steps = Vec::new();
    for i in 0..400 {
        let s = model_gen::generate(&mut rng, &m, i % 20);
        if let Step::Create { key, size } = s {
            m.consumer.insert(
                key,
                CObj {
                    size,
                    uid: String::new(),
                },
            );
            m.provider.insert(
                key,
                PObj::Copy {
                    may_go: false,
                    status: None,
                },
            );
        }
        steps.push(s);
    }
    let text = model_gen::format_steps(&steps);
    assert_eq!(model_gen::parse_steps(&text).unwrap(), steps);
    assert!(model_gen::parse_steps("run resync crash=x").is_err());
    assert!(model_gen::parse_steps("create c/w0 size=1").is_err());
}

#[test]
fn the_generator_is_a_function_of_the_seed_and_the_model() {
    let m = Model {
        bound: true,
        crd_ready: true,
        ..Default::default()
    };
    let draw = |seed| {
        let mut rng = Rng::new(seed);
        (0..50)
            .map(|i| model_gen::generate(&mut rng, &m, i % 10))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
}

// ---- relsync: Slack membership changes and runs of `kbind relsync`, checked against SpiceDB ----

/// One relsync fixture (its namespace, SpiceDB store, Slack stand-in, source `s`) and its model.
struct RWorld {
    rx: Rx,
    fake: kbind_testkit::Running<slack::SlackState>,
    runs: Runs,
    extra: Vec<String>,
    m: RModel,
    /// What SpiceDB held after the previous step.
    held: BTreeSet<String>,
    quiet: Quiet,
    ignore: BTreeSet<String>,
    ignored: Vec<String>,
    step_no: usize,
}

impl RWorld {
    async fn new(cfg: &Config) -> Self {
        let rx = Rx::new("model-rel").await;
        let fake = slack::start(workspace(vec![], vec![]), 0)
            .await
            .expect("start the Slack stand-in");
        rx.identity("slack", SLACK_TOKEN, &[]).await;
        rx.source("s", json!({"kind": "slack"})).await;
        let runs = Runs::new(cfg.lease, rx.client.clone(), &rx.ns);
        let mut extra = vec!["--source".to_string(), format!("{}/s", rx.ns)];
        extra.extend(cfg.lease_args.iter().cloned());
        let mut w = RWorld {
            rx,
            fake,
            runs,
            extra,
            m: RModel::default(),
            held: BTreeSet::new(),
            quiet: Quiet::new(&["relsync", "relsync"]),
            ignore: cfg.ignore.clone(),
            ignored: Vec::new(),
            step_no: 0,
        };
        w.to_fake();
        let snap = w.snapshot().await;
        w.quiet.reset(&snap);
        w
    }

    /// Make the stand-in's workspace what the model says.
    fn to_fake(&self) {
        let mut ws = self.fake.state.workspace();
        ws.users = (0..model_gen::USERS)
            .map(|u| slack::User {
                id: format!("U{}", u + 1),
                email: Some(model_gen::email(u)),
                deleted: self.m.deactivated.contains(&u),
                ..Default::default()
            })
            .collect();
        ws.channels = self
            .m
            .members
            .iter()
            .enumerate()
            .map(|(c, members)| slack::Channel {
                id: format!("C{}", c + 1),
                name: format!("c{}", c + 1),
                is_private: c == 2,
                is_archived: self.m.archived.contains(&(c as u8)),
                members: members.iter().map(|u| format!("U{}", u + 1)).collect(),
            })
            .collect();
    }

    async fn spicedb(&self) -> BTreeSet<String> {
        let mut held: BTreeSet<String> = self.rx.held("slack_channel").await.into_iter().collect();
        held.extend(self.rx.held("slack_workspace").await);
        held
    }

    async fn snapshot(&self) -> BTreeMap<String, String> {
        self.rx
            .status("s")
            .await
            .conditions
            .iter()
            .map(|c| {
                (
                    format!("RelationshipSource condition {}", c.type_),
                    format!("{} {}", c.status, c.reason),
                )
            })
            .collect()
    }

    fn report(&mut self, problems: Vec<(&'static str, String)>) -> Result<(), Violation> {
        let mut failing: Option<Violation> = None;
        for (check, detail) in problems {
            if self.ignore.contains(check) {
                self.ignored
                    .push(format!("step {} [{check}] {detail}", self.step_no));
            } else if let Some(v) = failing.as_mut().filter(|v| v.check == check) {
                v.detail.push_str(&format!("\n  {detail}"));
            } else if failing.is_none() {
                failing = Some(Violation {
                    check,
                    detail: format!("\n  {detail}"),
                });
            }
        }
        failing.map_or(Ok(()), Err)
    }

    /// After every step: no relationship the model still asks for disappears, none the model
    /// never asked for appears; the source's conditions feed invariant 3.
    async fn after(&mut self, disturbing: bool, clean: bool) -> Result<(), Violation> {
        let now = self.spicedb().await;
        let (ch, ws) = self.m.expected();
        let expected: BTreeSet<&String> = ch.iter().chain(ws.iter()).collect();
        let mut p = Vec::new();
        for r in self.held.difference(&now) {
            if expected.contains(r) {
                p.push((
                    "relationship-kept",
                    format!("{r} was deleted though Slack still reports it"),
                ));
            }
        }
        for r in now.difference(&self.held) {
            if !expected.contains(r) {
                p.push((
                    "relationship-unexpected",
                    format!("{r} was written though Slack does not report it"),
                ));
            }
        }
        self.held = now;
        self.report(p)?;
        let snap = self.snapshot().await;
        if disturbing {
            self.quiet.reset(&snap);
        } else {
            let flaps = self.quiet.see(&snap, clean.then_some("relsync"));
            self.report(flaps.into_iter().map(|f| ("flap", f)).collect())?;
        }
        Ok(())
    }

    async fn run(&mut self, kill: Kill) -> Result<RunOutcome, Violation> {
        let (rx, url, extra) = (&self.rx, self.fake.url(), self.extra.clone());
        let kc = rx.env.consumer.to_string_lossy().to_string();
        self.runs
            .run("relsync", kill, |ns: &str| {
                let mut args: Vec<&str> = extra.iter().map(String::as_str).collect();
                if ns != rx.ns {
                    args.extend(["--kubeconfig", &kc, "--lease-namespace", ns]);
                }
                rx.command(&url, &args)
            })
            .await
    }

    async fn step(&mut self, step: &RStep) -> Result<String, Violation> {
        let note = match *step {
            RStep::Join { ch, user } => {
                self.m.members[ch as usize].insert(user);
                "joined"
            }
            RStep::Leave { ch, user } => {
                self.m.members[ch as usize].remove(&user);
                "left"
            }
            RStep::Deactivate { user } => {
                self.m.deactivated.insert(user);
                "deactivated"
            }
            RStep::Reactivate { user } => {
                self.m.deactivated.remove(&user);
                "reactivated"
            }
            RStep::Archive { ch } => {
                self.m.archived.insert(ch);
                "archived"
            }
            RStep::Unarchive { ch } => {
                self.m.archived.remove(&ch);
                "unarchived"
            }
            RStep::Run { kill } => {
                let r = self.run(kill).await?;
                if r.clean {
                    self.m.pending_work = false;
                }
                self.after(!r.clean, r.clean).await?;
                return Ok(r.note);
            }
            RStep::Settle => return self.settle().await,
        };
        self.m.pending_work = true;
        self.to_fake();
        self.after(true, false).await?;
        Ok(note.into())
    }

    /// Invariant 5: after two clean runs SpiceDB holds exactly the model's relationships for the
    /// source and its conditions say so; a third run writes nothing.
    async fn settle(&mut self) -> Result<String, Violation> {
        let mut writes = Vec::new();
        for _ in 0..2 {
            let r = self.run(Kill::No).await?;
            writes.push(r.summary["data_writes"].to_string());
            self.after(false, true).await?;
        }
        self.m.pending_work = false;
        let (ch, ws) = self.m.expected();
        let want: BTreeSet<String> = ch.into_iter().chain(ws).collect();
        let mut p = Vec::new();
        for r in want.difference(&self.held) {
            p.push(("spicedb-exact", format!("missing {r}")));
        }
        for r in self.held.difference(&want) {
            p.push(("spicedb-exact", format!("extra {r}")));
        }
        let st = self.rx.status("s").await;
        for (t, want) in [
            ("Ready", "True"),
            ("PartialFailure", "False"),
            ("ReapDeferred", "False"),
        ] {
            let got = st
                .conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| format!("{} {}", c.status, c.reason));
            if !got.as_deref().is_some_and(|g| g.starts_with(want)) {
                p.push((
                    "converged",
                    format!("source condition {t} is {got:?}, want {want}"),
                ));
            }
        }
        self.report(p)?;
        let r = self.run(Kill::No).await?;
        self.after(false, true).await?;
        let n = r.summary["data_writes"].as_u64().unwrap_or(u64::MAX);
        if n != 0 {
            self.report(vec![(
                "quiet-writes",
                format!("the third relsync run wrote {n} data: {}", r.summary),
            )])?;
        }
        Ok(format!(
            "data writes per run {}; SpiceDB equals the model; third run quiet",
            writes.join(", ")
        ))
    }
}

/// One relsync sequence, as [`sequence`].
async fn rsequence(
    cfg: &Config,
    seed: Option<u64>,
    replay: Option<&[RStep]>,
) -> Result<String, Failure> {
    let started = Instant::now();
    let mut w = RWorld::new(cfg).await;
    let mut rng = Rng::new(seed.unwrap_or(0) ^ 0x5e1f_5e1f);
    let n = replay.map_or(cfg.relsync_steps + 1, <[RStep]>::len);
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut since_settle = 0;
    for i in 0..n {
        let step = match replay {
            Some(r) => r[i].clone(),
            None if i == cfg.relsync_steps => RStep::Settle,
            None => model_gen::rgenerate(&mut rng, &w.m, since_settle),
        };
        since_settle = if step == RStep::Settle {
            0
        } else {
            since_settle + 1
        };
        w.step_no = i + 1;
        let r = w.step(&step).await;
        if cfg.verbose {
            let note = r.as_ref().map_or("VIOLATION", String::as_str);
            println!("model relsync: {:>3} {step:<28} {note}", i + 1);
        }
        match r {
            Ok(note) => steps.push((step.to_string(), note)),
            Err(violation) => {
                steps.push((step.to_string(), "VIOLATION".into()));
                println!(
                    "model-figures relsync seed={} steps={} runs={} killed={} lease_lost={} result=fail check={}",
                    seed.unwrap_or(0),
                    steps.len(),
                    w.runs.runs,
                    w.runs.kills,
                    w.runs.lease_lost,
                    violation.check
                );
                return Err(Failure {
                    seed,
                    step: i + 1,
                    violation,
                    steps,
                    ignored: w.ignored,
                    vars: ("KBIND_MODEL_RELSYNC_STEPS", "KBIND_MODEL_RELSYNC_REPLAY"),
                });
            }
        }
    }
    println!(
        "model-figures relsync seed={} steps={} runs={} killed={} lease_lost={} result=ok",
        seed.unwrap_or(0),
        steps.len(),
        w.runs.runs,
        w.runs.kills,
        w.runs.lease_lost
    );
    let mut s = format!(
        "model relsync: {}: {} steps, {} kbind runs, {} killed, {} stopped by a lost Lease, longest skip after a kill {:.1} s, {:.0} s",
        seed.map_or("replay".into(), |s| format!("seed {s}")),
        steps.len(),
        w.runs.runs,
        w.runs.kills,
        w.runs.lease_lost,
        w.runs.longest_skip.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    for i in &w.ignored {
        s.push_str(&format!("\n  ignored: {i}"));
    }
    Ok(s)
}

/// Invariant 5 and the relsync editions of 1–4: random Slack membership changes (joins,
/// leaves, deactivated users, archived channels) and runs of `kbind relsync`, some killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn random_slack_changes_and_relsync_runs_converge_on_spicedb() {
    let cfg = Config::from_env();
    if cfg.relsync_steps == 0 {
        return;
    }
    let runs: Vec<(Option<u64>, Option<Vec<RStep>>)> = match &cfg.relsync_replay {
        Some(r) => vec![(None, Some(r.clone()))],
        None if cfg.replay.is_some() => return,
        None => cfg.seeds.iter().map(|s| (Some(*s), None)).collect(),
    };
    let mut failures = Vec::new();
    for (seed, replay) in runs {
        match rsequence(&cfg, seed, replay.as_deref()).await {
            Ok(line) => println!("{line}"),
            Err(f) => {
                let text = f.render(None);
                println!("{text}");
                failures.push(text);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
