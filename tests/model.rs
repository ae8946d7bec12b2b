//! Model-based multi-run test (docs/testing.md): seeded random sequences of user and world
//! actions interleaved with runs of `kbind schema` and `kbind resync` (some killed at a random
//! write or by SIGKILL), against the real servers, checked after every step against a simple
//! reference model (tests/support/model_gen.rs).
//!
//! Invariants (docs/testing.md has the reasoning):
//! 1. No provider copy disappears unless its consumer object was deleted through the syncer
//!    finalizer (or it was an orphan under `spec.orphans: Delete`); a foreign provider object is
//!    never touched.
//! 2. After two clean rounds (schema then resync, twice) the servers equal the model, and a third
//!    round writes no data.
//! 3. With no intervening action, no condition or kbind annotation flips between runs.
//! 4. After a kill, no run is skipped for longer than the Lease duration (when `--lease-duration`
//!    exists).
//! 5. (relsync, tests/model/relsync.rs) SpiceDB holds exactly what Slack reports.
//! 6. An object no binding covers is not touched; a consumer object appears only when created,
//!    or restored from its copy under `spec.orphans: Restore`.
//!
//! Each run takes the fixed CI seeds and `KBIND_MODEL_FRESH_SEEDS` (default 2) fresh ones, printed.
//! `KBIND_MODEL_SEEDS=a,b,c` and `KBIND_MODEL_STEPS=N` (steps per seed) override the whole
//! set; `KBIND_MODEL_REPLAY='step; step; …'` runs exactly those steps; `KBIND_MODEL_SHRINK=1`
//! shrinks a failing sequence; `KBIND_MODEL_IGNORE=check,…` reports those checks without failing.

#[path = "model/converged.rs"]
mod converged;
#[path = "support/model_gen.rs"]
mod model_gen;
#[path = "model/relsync.rs"]
mod relsync;
#[path = "model/runs.rs"]
mod runs;
#[path = "model/steps.rs"]
mod steps;
use crate::support;
use support::hold::ProviderHold;
#[path = "model/world.rs"]
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use model_gen::{CObj, Cover, Model, Orphans, PObj, RStep, Rng, Step};
use relsync::rsequence;
use runs::{Figures, LeaseMode, Violation, help_has, invariant};
use world::World;

/// The fixed CI set: 3 × 80 steps (each settle is 6 runs), about two minutes on 2 cores.
const CI_SEEDS: [u64; 3] = [11, 23, 42];
/// Fresh seeds drawn per run besides the fixed ones (printed, so a failure replays), unless
/// `KBIND_MODEL_SEEDS` names them all; `KBIND_MODEL_FRESH_SEEDS=N` changes how many.
const CI_FRESH_SEEDS: usize = 2;
const CI_STEPS: usize = 80;
const CI_RELSYNC_STEPS: usize = 40;

pub struct Config {
    pub seeds: Vec<u64>,
    pub steps: usize,
    /// Soak mode (`KBIND_MODEL_TOTAL_STEPS=N`, `hack/soak.sh --pass model --steps N`): each test
    /// draws seeds `seed_base + 1, + 2, …` until it took its share of the N steps (half each),
    /// then fails if any sequence broke an invariant.
    pub total_steps: Option<usize>,
    pub seed_base: u64,
    pub replay: Option<Vec<Step>>,
    /// Steps per seed of the relsync sequences (`KBIND_MODEL_RELSYNC_STEPS`; 0 skips them).
    pub relsync_steps: usize,
    pub relsync_replay: Option<Vec<RStep>>,
    pub shrink: bool,
    /// `KBIND_MODEL_VERBOSE=1`: print every step as it is taken.
    pub verbose: bool,
    pub ignore: BTreeSet<String>,
    pub lease: LeaseMode,
    /// `--lease-duration` when invariant 4 is on.
    pub lease_args: Vec<String>,
    /// Extra flags every schema and resync run gets: the Lease's, and `--write-concurrency 1`
    /// when the binary has it.
    pub extra: Vec<String>,
    /// The binary has `--credential-namespace`.
    pub credential_ns: bool,
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
        let total_steps = var("KBIND_MODEL_TOTAL_STEPS")
            .map(|s| s.parse().expect("KBIND_MODEL_TOTAL_STEPS: a number"));
        let seed_base = var("KBIND_MODEL_SEED_BASE")
            .map(|s| s.parse::<u64>().expect("KBIND_MODEL_SEED_BASE: a number") % 1_000_000_000)
            .unwrap_or_else(|| fresh_seeds(1)[0]);
        let seeds = var("KBIND_MODEL_SEEDS")
            .map(|s| {
                s.split(',')
                    .map(|x| x.trim().parse().expect("KBIND_MODEL_SEEDS: numbers"))
                    .collect()
            })
            .unwrap_or_else(|| {
                if total_steps.is_some() {
                    // Soak mode draws its own seeds from `seed_base`.
                    return Vec::new();
                }
                let fresh = var("KBIND_MODEL_FRESH_SEEDS")
                    .map(|s| s.parse().expect("KBIND_MODEL_FRESH_SEEDS: a number"))
                    .unwrap_or(CI_FRESH_SEEDS);
                let drawn = fresh_seeds(fresh);
                println!(
                    "model: fresh seeds {drawn:?} (replay one: KBIND_MODEL_SEEDS=<seed> cargo test --features servers --test suite model::)"
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
            total_steps,
            seed_base,
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

/// A sequence that broke an invariant.
pub struct Failure {
    pub seed: Option<u64>,
    pub step: usize,
    pub violation: Violation,
    /// Each step's text and what happened.
    pub steps: Vec<(String, String)>,
    pub ignored: Vec<String>,
    /// The variables that replay it: (steps per seed, exact steps).
    pub vars: (&'static str, &'static str),
}

impl Failure {
    pub fn render(&self, shrunk: Option<&[String]>) -> String {
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
                "replay: KBIND_MODEL_SEEDS={seed} {steps_var}={} cargo test --features servers --test suite model::\n",
                self.step
            ));
        }
        s.push_str(&format!(
            "replay these steps: {replay_var}='{}' cargo test --features servers --test suite model::\n",
            plain.join("; ")
        ));
        if let Some(shrunk) = shrunk {
            s.push_str(&format!(
                "shrunk ({} steps): {replay_var}='{}' cargo test --features servers --test suite model::\n",
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
) -> (Figures, Result<String, Failure>) {
    let started = Instant::now();
    let mut w = World::new(cfg).await;
    w.prof.add("setup", started.elapsed());
    let mut rng = Rng::new(seed.unwrap_or(0));
    let n = replay.map_or(cfg.steps + 1, <[Step]>::len);
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut since_settle = 0;
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut failed = None;
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
        *counts.entry(step.kind()).or_default() += 1;
        let r = w.step(&step).await;
        if cfg.verbose {
            let note = r.as_ref().map_or("VIOLATION", String::as_str);
            println!("model: {:>3} {step:<28} {note}", i + 1);
        }
        match r {
            Ok(note) => steps.push((step.to_string(), note)),
            Err(violation) => {
                steps.push((step.to_string(), "VIOLATION".into()));
                failed = Some((i + 1, violation));
                break;
            }
        }
    }
    let t = Instant::now();
    w.cleanup().await;
    w.prof.add("setup", t.elapsed());
    let figures = Figures::of(steps.len(), &w.runs, &w.prof, started);
    if let Some(seed) = seed {
        let result = match &failed {
            Some((_, v)) => format!("fail check={}", v.check),
            None => "ok".into(),
        };
        println!(
            "model-figures seed={seed} {} result={result}",
            figures.fields()
        );
    }
    if let Some((step, violation)) = failed {
        return (
            figures,
            Err(Failure {
                seed,
                step,
                violation,
                steps,
                ignored: w.ignored,
                vars: ("KBIND_MODEL_STEPS", "KBIND_MODEL_REPLAY"),
            }),
        );
    }
    let mut s = format!(
        "model: {}: {} steps {counts:?}, {} kbind runs, {} killed, {} stopped by a lost Lease, longest skip after a kill {:.1} s, {:.0} s ({})",
        seed.map_or("replay".into(), |s| format!("seed {s}")),
        steps.len(),
        w.runs.runs,
        w.runs.kills,
        w.runs.lease_lost,
        w.runs.longest_skip.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        figures.prof.fields()
    );
    for i in &w.ignored {
        s.push_str(&format!("\n  ignored: {i}"));
    }
    (figures, Ok(s))
}

/// Soak mode (`KBIND_MODEL_TOTAL_STEPS`): run seeds `seed_base + 1, + 2, …` until `share` steps
/// were taken, print each failure with its replay lines, and one total line `hack/soak.sh`
/// reads. Returns the failures.
async fn soak<F, Fut>(kind: &str, share: usize, cfg: &Config, mut run: F) -> Vec<String>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = (Figures, Result<String, Failure>)>,
{
    let started = Instant::now();
    let mut total = Figures::default();
    let mut failures = Vec::new();
    let (mut seed, mut seeds) = (cfg.seed_base, 0);
    println!("model: soak {kind}: {share} steps from seed {}", seed + 1);
    while total.steps < share {
        seed += 1;
        seeds += 1;
        let (f, r) = run(seed).await;
        total.absorb(&f);
        match r {
            Ok(line) => println!("{line}"),
            Err(fail) => {
                let text = fail.render(None);
                println!("{text}");
                failures.push(text);
            }
        }
        println!(
            "model: soak {kind}: {}/{share} steps, {seeds} seeds, {} violations, {:.0} s",
            total.steps,
            failures.len(),
            started.elapsed().as_secs_f64()
        );
    }
    total.elapsed = started.elapsed();
    println!(
        "model-soak kind={kind} seeds={seeds} violations={} {}",
        failures.len(),
        total.fields()
    );
    failures
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
            match sequence(cfg, None, Some(&cand)).await.1 {
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
    let _hold = ProviderHold::shared();
    let cfg = Config::from_env();
    println!(
        "model: lease {:?}, extra flags {:?}, ignoring {:?}",
        cfg.lease, cfg.extra, cfg.ignore
    );
    if let (Some(total), None) = (cfg.total_steps, &cfg.replay) {
        let share = total - total / 2;
        let failures = soak("schema/resync", share, &cfg, |seed| {
            sequence(&cfg, Some(seed), None)
        })
        .await;
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        return;
    }
    let runs: Vec<(Option<u64>, Option<Vec<Step>>)> = match &cfg.replay {
        Some(r) => vec![(None, Some(r.clone()))],
        None => cfg.seeds.iter().map(|s| (Some(*s), None)).collect(),
    };
    let mut failures = Vec::new();
    for (seed, replay) in runs {
        match sequence(&cfg, seed, replay.as_deref()).await.1 {
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
const REGRESSIONS: [(&str, &str); 7] = [
    (
        "#29 seeds 849921154 and 849921150, both shrunk to this [counts]: a binding with no objects got no counts or Conflicts",
        "settle",
    ),
    (
        "#29 seed 849921154 [counts]: unbind and re-bind with killed runs; the re-created binding went unrecorded",
        "run schema; foreign a/w2 size=160; run resync; unbind; run resync; run resync; run resync; settle; rebind; run resync; run schema; run resync; unbind; run schema crash=1; run resync; run resync; run resync crash=3; run resync; run resync; run resync crash=1; run schema crash=3; run resync; rebind; run schema crash=3; settle",
    ),
    (
        "#29 soak seed 462681420, shrunk by hand [converged]: a schema run died after creating the consumer CRD, before the binding held its cleanup finalizer; the unbind then removed the binding at once and the CRD stayed",
        "unbind; settle; rebind; run schema crash=1; unbind; settle",
    ),
    (
        "#29 seed 108 (widened model), shrunk by hand [converged]: the ClusterBinding's teardown deleted the consumer CRD while a Binding being deleted still had its objects' syncer finalizers, and the CRD hung Terminating",
        "bind b; create b/w0 size=1; settle; unbind; run resync; unbind b; run schema; settle",
    ),
    (
        "#29 seeds 103, 104, 106 (widened model), shrunk by hand [converged]: an object restored under spec.orphans: Restore got its copy's status a run after its re-adoption, not with it",
        "create a/w0 size=1; settle; status a/w0 phase=1; orphans Restore; unbind; settle; rebind; settle",
    ),
    (
        "#29 soak seed 509584315 (widened model), shrunk by hand [converged]: resync synced under a ClusterBinding kbind schema had not set up yet; deleted, it went at once and its objects kept the syncer finalizer",
        "bind b; settle; unbind; settle; rebind; create a/w0 size=1; run resync; unbind; settle",
    ),
    (
        "seed 98452536, shrunk by hand [orphan-annotation]: three resync runs died in a row on the Connection, the next quarantined it and released the deleting ClusterBinding as if its provider were unreachable, so its copies were never marked orphaned",
        "create a/w0 size=1; create a/w1 size=1; create a/w2 size=1; run resync crash=1; run resync crash=1; run resync crash=1; unbind; run resync; settle",
    ),
];

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn sequences_that_once_failed_converge() {
    let _hold = ProviderHold::shared();
    let cfg = Config::from_env();
    let mut failures = Vec::new();
    for (what, replay) in REGRESSIONS {
        let steps = model_gen::parse_steps(replay).expect("a regression replay parses");
        match sequence(&cfg, None, Some(&steps)).await.1 {
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
        ns_teardown_done: true,
        ..Default::default()
    };
    let mut steps = Vec::new();
    // Follow the steps' effects on the model closely enough that every kind gets drawn.
    for i in 0..1000 {
        let s = model_gen::generate(&mut rng, &m, i % 20);
        match &s {
            Step::Create { key, size } => {
                m.consumer.insert(
                    *key,
                    CObj {
                        size: *size,
                        uid: String::new(),
                    },
                );
                m.provider.insert(
                    *key,
                    PObj::Copy {
                        may_go: false,
                        status: None,
                    },
                );
            }
            Step::Unbind => (m.bound, m.teardown_done) = (false, true),
            Step::Rebind => m.bound = true,
            Step::NsBind => m.ns_bound = true,
            Step::NsUnbind => (m.ns_bound, m.ns_teardown_done) = (false, true),
            Step::Orphans { on, policy } => match on {
                Cover::Cluster => m.orphans = *policy,
                Cover::Ns => m.ns_orphans = *policy,
            },
            _ => {}
        }
        steps.push(s);
    }
    let kinds: BTreeSet<&str> = steps.iter().map(Step::kind).collect();
    for k in [
        "create", "update", "delete", "status", "foreign", "unbind", "rebind", "bind b",
        "unbind b", "orphans", "reissue", "rotate", "run", "settle",
    ] {
        assert!(kinds.contains(k), "{k} never drawn: {kinds:?}");
    }
    let text = model_gen::format_steps(&steps);
    assert_eq!(model_gen::parse_steps(&text).unwrap(), steps);
    for (text, step) in [
        ("bind b", Step::NsBind),
        ("unbind b", Step::NsUnbind),
        ("reissue", Step::Reissue),
        (
            "orphans Restore",
            Step::Orphans {
                on: Cover::Cluster,
                policy: Orphans::Restore,
            },
        ),
        (
            "orphans b Delete",
            Step::Orphans {
                on: Cover::Ns,
                policy: Orphans::Delete,
            },
        ),
    ] {
        assert_eq!(model_gen::parse_step(text), Some(step.clone()));
        assert_eq!(step.to_string(), text);
    }
    assert!(model_gen::parse_steps("run resync crash=x").is_err());
    assert!(model_gen::parse_steps("create c/w0 size=1").is_err());
    assert!(model_gen::parse_steps("orphans Forget").is_err());
    assert!(model_gen::parse_steps("bind a").is_err());
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
    if let (Some(total), None, None) = (cfg.total_steps, &cfg.relsync_replay, &cfg.replay) {
        let failures = soak("relsync", total / 2, &cfg, |seed| {
            rsequence(&cfg, Some(seed), None)
        })
        .await;
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        return;
    }
    let runs: Vec<(Option<u64>, Option<Vec<RStep>>)> = match &cfg.relsync_replay {
        Some(r) => vec![(None, Some(r.clone()))],
        None if cfg.replay.is_some() => return,
        None => cfg.seeds.iter().map(|s| (Some(*s), None)).collect(),
    };
    let mut failures = Vec::new();
    for (seed, replay) in runs {
        match rsequence(&cfg, seed, replay.as_deref()).await.1 {
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
