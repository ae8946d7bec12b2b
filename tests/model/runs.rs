//! The runs of a model sequence (docs/testing.md): the kbind binary and its command lines, what
//! a killed run leaves behind (its Lease, invariant 4), and the quiet window of invariant 3.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::model::model_gen::{Kill, Pass};
use crate::support;

#[derive(Clone, Debug)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

/// Which invariant of the module doc a check belongs to.
pub fn invariant(check: &str) -> &'static str {
    match check {
        "copy-kept" | "foreign-untouched" | "consumer-kept" | "relationship-kept" => {
            "1 (nothing disappears)"
        }
        "spicedb-exact" | "relationship-unexpected" => "5 (SpiceDB holds exactly the model)",
        "converged" | "orphan-annotation" | "orphan-policy" | "counts" | "quiet-writes"
        | "status-kept" | "rotation-pulled" | "run-failed" => "2 (converges on the model)",
        "uncovered-untouched" | "consumer-unexpected" | "restored" => {
            "6 (only what a binding asks for)"
        }
        "flap" => "3 (no flip without a cause)",
        "lease" => "4 (no skip beyond the Lease)",
        _ => "harness",
    }
}

pub fn harness(what: impl std::fmt::Display) -> Violation {
    Violation {
        check: "harness",
        detail: what.to_string(),
    }
}

/// How a run that was killed stops blocking the next ones.
#[derive(Clone, Copy, Debug)]
pub enum LeaseMode {
    /// Today: a killed run's Lease is held for the deadline plus 60 s, so the next run of that
    /// pass goes to a fresh Lease namespace, as an operator would.
    FreshNamespace,
    /// `--lease-duration d` exists: runs keep their Lease namespace and a killed run's Lease
    /// must be taken over within about `d` (invariant 4).
    Takeover(Duration),
}

/// The kbind binary the runs use: this crate's, or `KBIND_BIN` (another build, e.g. the one
/// before a fix, run against the same servers without installing its CRDs; as
/// tests/support/relsync_fx.rs).
pub fn command(args: &[&str]) -> std::process::Command {
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
pub async fn run_kbind(cmd: std::process::Command) -> (i32, Value, String) {
    let out = tokio::process::Command::from(cmd)
        .output()
        .await
        .expect("run kbind");
    support::outcome(out)
}

pub fn help_has(flag: &str) -> bool {
    command(&["resync", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

/// Invariant 3: within a window with no disturbing step, no value of the snapshot returns to
/// an earlier one (A → B → A), and once the window holds two full rounds (schema, resync,
/// schema, resync), nothing changes at all.
pub struct Quiet {
    /// The clean runs that make two full rounds, in order.
    pub rounds: &'static [&'static str],
    pub history: BTreeMap<String, Vec<String>>,
    pub progress: usize,
    pub baseline: Option<BTreeMap<String, String>>,
}

pub const ROUNDS: [Pass; 4] = [Pass::Schema, Pass::Resync, Pass::Schema, Pass::Resync];

impl Quiet {
    pub fn new(rounds: &'static [&'static str]) -> Self {
        Quiet {
            rounds,
            history: BTreeMap::new(),
            progress: 0,
            baseline: None,
        }
    }

    pub fn reset(&mut self, snap: &BTreeMap<String, String>) {
        self.history = snap
            .iter()
            .map(|(k, v)| (k.clone(), vec![v.clone()]))
            .collect();
        self.progress = 0;
        self.baseline = None;
    }

    pub fn see(&mut self, snap: &BTreeMap<String, String>, clean: Option<&str>) -> Vec<String> {
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

/// Where a sequence's time went, by what it waited for: `runs` (kbind processes), `lease-waits`
/// (pauses before retrying a run skipped behind a killed run's Lease), `reads` (observing both
/// clusters for the checks), `actions` (the user's and the world's writes), `crd-waits` (letting
/// the apiserver finish a consumer CRD after a schema run), `setup` (fixture). Printed with the
/// figures; `hack/soak.sh` adds them up.
#[derive(Clone, Debug, Default)]
pub struct Prof(pub BTreeMap<&'static str, Duration>);

impl Prof {
    pub fn add(&mut self, what: &'static str, d: Duration) {
        *self.0.entry(what).or_default() += d;
    }

    pub fn absorb(&mut self, other: &Prof) {
        for (k, d) in &other.0 {
            self.add(k, *d);
        }
    }

    /// `t_runs=12.3 t_reads=4.5 …` (seconds).
    pub fn fields(&self) -> String {
        self.0
            .iter()
            .map(|(k, d)| format!("t_{k}={:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What one sequence (or a soak's sum of them) did: the figure line `hack/soak.sh` adds up.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub steps: usize,
    pub runs: usize,
    pub kills: usize,
    pub lease_lost: usize,
    pub elapsed: Duration,
    pub prof: Prof,
}

impl Figures {
    pub fn of(steps: usize, runs: &Runs, prof: &Prof, started: Instant) -> Self {
        let mut p = prof.clone();
        p.absorb(&runs.prof);
        Figures {
            steps,
            runs: runs.runs,
            kills: runs.kills,
            lease_lost: runs.lease_lost,
            elapsed: started.elapsed(),
            prof: p,
        }
    }

    pub fn absorb(&mut self, o: &Figures) {
        self.steps += o.steps;
        self.runs += o.runs;
        self.kills += o.kills;
        self.lease_lost += o.lease_lost;
        self.elapsed += o.elapsed;
        self.prof.absorb(&o.prof);
    }

    /// `steps=… runs=… killed=… lease_lost=… secs=… t_…=…`.
    pub fn fields(&self) -> String {
        format!(
            "steps={} runs={} killed={} lease_lost={} secs={:.1} {}",
            self.steps,
            self.runs,
            self.kills,
            self.lease_lost,
            self.elapsed.as_secs_f64(),
            self.prof.fields()
        )
    }
}

pub struct RunOutcome {
    pub clean: bool,
    pub summary: Value,
    pub note: String,
}

/// The runs of one sequence, and what a killed run leaves behind: its Lease.
pub struct Runs {
    pub lease: LeaseMode,
    /// Where fresh Lease namespaces are made.
    pub consumer: kube::Client,
    /// Per pass, its Lease namespace when not the default.
    pub lease_ns: BTreeMap<&'static str, String>,
    pub default_ns: String,
    /// Per pass, when a run was last killed, and whether it surely held the Lease then (it
    /// crashed after a data write).
    pub killed_at: BTreeMap<&'static str, (Instant, bool)>,
    /// The longest a run was skipped after a kill (invariant 4).
    pub longest_skip: Duration,
    pub runs: usize,
    pub kills: usize,
    /// Runs that stopped early because they could not renew their Lease in time.
    pub lease_lost: usize,
    /// Time in kbind processes and in pauses between skipped runs.
    pub prof: Prof,
}

/// Stands for the Lease namespace in a command line built ahead.
pub const LEASE_NS: &str = "{lease-namespace}";

impl Runs {
    pub fn new(lease: LeaseMode, consumer: kube::Client, ns: &str) -> Self {
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
            prof: Prof::default(),
        }
    }

    pub fn lease_ns(&self, pass: &str) -> String {
        self.lease_ns
            .get(pass)
            .cloned()
            .unwrap_or_else(|| self.default_ns.clone())
    }

    /// A killed run holds its pass Lease. The one place that decides what the next run does
    /// about it (docs/testing.md): today a fresh Lease namespace for that pass; with
    /// `--lease-duration`, nothing (the next runs must take the Lease over in time).
    pub async fn after_kill(&mut self, pass: &'static str, held_lease: bool) {
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
    pub async fn run(
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
            self.prof.add("runs", took);
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
                        // The killed run's Lease lasts `d` from its last renewal, at the latest
                        // the kill: no attempt before then could take it over. Then every 0.3 s.
                        let expiry = match (self.lease, self.killed_at.get(&pass)) {
                            (LeaseMode::Takeover(d), Some((at, _))) => *at + d,
                            _ => Instant::now(),
                        };
                        let pause = expiry
                            .saturating_duration_since(Instant::now())
                            .max(Duration::from_millis(300));
                        tokio::time::sleep(pause).await;
                        self.prof.add("lease-waits", pause);
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
