//! The relsync edition of the model test (docs/testing.md): Slack membership changes and runs
//! of `kbind relsync`, checked against SpiceDB (invariant 5 and the relsync editions of 1-4).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use kbind_testkit::slack;
use serde_json::json;

use crate::model::model_gen::{self, Kill, RModel, RStep, Rng};
use crate::model::runs::{Figures, Prof, Quiet, RunOutcome, Runs, Violation};
use crate::model::{Config, Failure};
use crate::relsync_fx::{Rx, SLACK_TOKEN, workspace};

/// One relsync fixture (its namespace, SpiceDB store, Slack stand-in, source `s`) and its model.
pub struct RWorld {
    pub rx: Rx,
    pub fake: kbind_testkit::Running<slack::SlackState>,
    pub runs: Runs,
    pub extra: Vec<String>,
    pub m: RModel,
    /// What SpiceDB held after the previous step.
    pub held: BTreeSet<String>,
    pub quiet: Quiet,
    pub ignore: BTreeSet<String>,
    pub ignored: Vec<String>,
    pub step_no: usize,
    pub prof: Prof,
}

impl RWorld {
    pub async fn new(cfg: &Config) -> Self {
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
            prof: Prof::default(),
        };
        w.to_fake();
        let snap = w.snapshot().await;
        w.quiet.reset(&snap);
        w
    }

    /// Make the stand-in's workspace what the model says.
    pub fn to_fake(&self) {
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

    /// Both relationship types at once.
    pub async fn spicedb(&self) -> BTreeSet<String> {
        let (ch, ws) = tokio::join!(
            self.rx.held("slack_channel"),
            self.rx.held("slack_workspace")
        );
        ch.into_iter().chain(ws).collect()
    }

    pub async fn snapshot(&self) -> BTreeMap<String, String> {
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

    pub fn report(&mut self, problems: Vec<(&'static str, String)>) -> Result<(), Violation> {
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
    pub async fn after(&mut self, disturbing: bool, clean: bool) -> Result<(), Violation> {
        // SpiceDB and the source's status at once.
        let t = Instant::now();
        let (now, snap) = tokio::join!(self.spicedb(), self.snapshot());
        self.prof.add("reads", t.elapsed());
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
        if disturbing {
            self.quiet.reset(&snap);
        } else {
            let flaps = self.quiet.see(&snap, clean.then_some("relsync"));
            self.report(flaps.into_iter().map(|f| ("flap", f)).collect())?;
        }
        Ok(())
    }

    pub async fn run(&mut self, kill: Kill) -> Result<RunOutcome, Violation> {
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

    pub async fn step(&mut self, step: &RStep) -> Result<String, Violation> {
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
    pub async fn settle(&mut self) -> Result<String, Violation> {
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

/// One relsync sequence, as [`crate::model::sequence`].
pub async fn rsequence(
    cfg: &Config,
    seed: Option<u64>,
    replay: Option<&[RStep]>,
) -> (Figures, Result<String, Failure>) {
    let started = Instant::now();
    let mut w = RWorld::new(cfg).await;
    w.prof.add("setup", started.elapsed());
    let mut rng = Rng::new(seed.unwrap_or(0) ^ 0x5e1f_5e1f);
    let n = replay.map_or(cfg.relsync_steps + 1, <[RStep]>::len);
    let mut steps: Vec<(String, String)> = Vec::new();
    let mut since_settle = 0;
    let mut failed = None;
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
                failed = Some((i + 1, violation));
                break;
            }
        }
    }
    let figures = Figures::of(steps.len(), &w.runs, &w.prof, started);
    let result = match &failed {
        Some((_, v)) => format!("fail check={}", v.check),
        None => "ok".into(),
    };
    println!(
        "model-figures relsync seed={} {} result={result}",
        seed.unwrap_or(0),
        figures.fields()
    );
    if let Some((step, violation)) = failed {
        return (
            figures,
            Err(Failure {
                seed,
                step,
                violation,
                steps,
                ignored: w.ignored,
                vars: ("KBIND_MODEL_RELSYNC_STEPS", "KBIND_MODEL_RELSYNC_REPLAY"),
            }),
        );
    }
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
    (figures, Ok(s))
}
