use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::pass::poison::{Annotations, Record, WORKING_ON};

/// A pass whose roots answer as scripted; it records each call.
#[derive(Default)]
struct Script {
    looks: BTreeMap<&'static str, Look>,
    /// Roots whose turn fails, or runs out of budget inside.
    failing: Vec<&'static str>,
    exhausting: Vec<&'static str>,
    calls: Vec<String>,
    /// What the poison tracker was working on during each turn.
    working: Vec<String>,
    tracker: Option<std::sync::Arc<Tracker>>,
}

impl Script {
    fn turn(&mut self, what: &str, name: &str) -> Result<(), TurnError<String>> {
        self.calls.push(format!("{what} {name}"));
        if let Some(t) = &self.tracker {
            let mut a = Annotations::new();
            t.annotate_renewal(&mut a);
            self.working
                .push(a.get(WORKING_ON).cloned().unwrap_or_default());
        }
        if self.failing.contains(&name) {
            return Err(TurnError::Failed(format!("{name} refused")));
        }
        if self.exhausting.contains(&name) {
            return Err(TurnError::Exhausted(Exhausted::MaxItems));
        }
        Ok(())
    }
}

impl Roots for Script {
    type Error = String;
    fn look(&mut self, name: &str) -> Look {
        self.looks.get(name).copied().unwrap_or(Look::Due {
            generation: 1,
            phase: Phase::Apply,
        })
    }
    async fn quarantined(&mut self, name: &str, generation: i64) {
        self.calls.push(format!("quarantined {name}@{generation}"));
    }
    async fn apply(&mut self, name: &str) -> Result<(), TurnError<String>> {
        self.turn("apply", name)
    }
    async fn cleanup(&mut self, name: &str) -> Result<(), TurnError<String>> {
        self.turn("cleanup", name)
    }
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_order_is_this_shards_roots_by_name_from_after_the_cursor() {
    let all = names(&["c", "a", "d", "b"]);
    let order = |resume: Option<&str>| Walk::new("X", all.clone(), None, resume).order().to_vec();
    assert_eq!(order(None), names(&["a", "b", "c", "d"]));
    assert_eq!(order(Some("b")), names(&["c", "d", "a", "b"]));
    // A cursor naming a root since deleted resumes at the next name.
    assert_eq!(order(Some("bb")), names(&["c", "d", "a", "b"]));
    assert_eq!(order(Some("z")), names(&["a", "b", "c", "d"]));
    // Shards split the roots, and each walks only its own.
    let many: Vec<String> = (0..50).map(|i| format!("conn-{i:02}")).collect();
    let mut seen: Vec<String> = (0..3)
        .flat_map(|i| {
            let s = Some(Shard { index: i, count: 3 });
            Walk::new("X", many.clone(), s, None).order().to_vec()
        })
        .collect();
    seen.sort();
    assert_eq!(seen, many);
}

#[test]
fn phases_follow_the_finalizer_split() {
    assert_eq!(Phase::of(false, false), Phase::Apply);
    assert_eq!(Phase::of(false, true), Phase::Apply);
    assert_eq!(Phase::of(true, true), Phase::Cleanup);
    assert_eq!(Phase::of(true, false), Phase::Done);
}

#[tokio::test]
async fn a_failed_root_is_counted_and_the_others_go_on() {
    let budget = Budget::unlimited();
    let mut s = Script {
        failing: vec!["b"],
        ..Script::default()
    };
    s.looks.insert("c", Look::Unchanged);
    s.looks.insert("d", Look::Absent);
    s.looks.insert(
        "e",
        Look::Due {
            generation: 3,
            phase: Phase::Cleanup,
        },
    );
    s.looks.insert(
        "f",
        Look::Due {
            generation: 3,
            phase: Phase::Done,
        },
    );
    let w = Walk::new("X", names(&["a", "b", "c", "d", "e", "f"]), None, None);
    let walked = w.run(&budget, &Tracker::default(), &mut s).await;
    assert_eq!(s.calls, ["apply a", "apply b", "cleanup e"]);
    assert_eq!(
        walked,
        Walked {
            done: 4,
            failed: 1,
            last: Some("e".into()),
            stopped: None,
            left: 0,
        }
    );
    // Unchanged, absent and finished deleting roots take no budget; every other one takes one.
    assert_eq!(budget.used(), 3);
    assert_eq!(walked.stopped("roots"), None);
}

#[tokio::test]
async fn the_budget_stops_the_walk_and_the_next_run_resumes_after_the_last_root() {
    let all = names(&["a", "b", "c", "d", "e"]);
    let mut s = Script::default();
    s.looks.insert("b", Look::Unchanged);
    let budget = Budget::new(Some(2), Duration::from_secs(3600));
    let w = Walk::new("X", all.clone(), None, None);
    let walked = w.run(&budget, &Tracker::default(), &mut s).await;
    assert_eq!(s.calls, ["apply a", "apply c"]);
    assert_eq!((walked.done, walked.left), (3, 2));
    assert_eq!(walked.last.as_deref(), Some("c"));
    let stop = walked.stopped("roots").expect("stopped");
    assert_eq!(stop.resume_after.as_deref(), Some("c"));
    assert!(stop.message.contains("2 roots left"), "{}", stop.message);

    // The next run starts after it and wraps around.
    let mut s = Script::default();
    let budget = Budget::new(Some(2), Duration::from_secs(3600));
    let w = Walk::new("X", all.clone(), None, stop.resume_after.as_deref());
    w.run(&budget, &Tracker::default(), &mut s).await;
    assert_eq!(s.calls, ["apply d", "apply e"]);

    // A run that stops before working on any root keeps the cursor it started from.
    let budget = Budget::new(Some(0), Duration::from_secs(3600));
    let w = Walk::new("X", all, None, Some("c"));
    let walked = w
        .run(&budget, &Tracker::default(), &mut Script::default())
        .await;
    assert_eq!(
        walked.stopped("roots").unwrap().resume_after.as_deref(),
        Some("c")
    );
}

#[tokio::test]
async fn a_turn_that_runs_out_of_budget_inside_stops_the_walk_without_moving_the_cursor() {
    let budget = Budget::new(Some(10), Duration::from_secs(3600));
    let mut s = Script {
        exhausting: vec!["b"],
        ..Script::default()
    };
    let w = Walk::new("X", names(&["a", "b", "c"]), None, None).items(Items::PerWrite);
    let walked = w.run(&budget, &Tracker::default(), &mut s).await;
    assert_eq!(s.calls, ["apply a", "apply b"]);
    assert_eq!(walked.last.as_deref(), Some("a"), "b starts the next run");
    assert_eq!(walked.stopped, Some(Exhausted::MaxItems));
    assert_eq!(budget.used(), 0, "per write: the walk only checks");
}

#[tokio::test]
async fn an_isolated_walk_skips_a_quarantined_root_and_records_each_turn() {
    let mut quarantined = BTreeMap::new();
    quarantined.insert("Connection/b".to_string(), 7);
    // Quarantined at another generation: changed since, tried again.
    quarantined.insert("Connection/c".to_string(), 1);
    let tracker = std::sync::Arc::new(Tracker::new(
        Record {
            quarantined,
            ..Record::default()
        },
        Duration::from_secs(1),
    ));
    let mut s = Script {
        failing: vec!["c"],
        tracker: Some(tracker.clone()),
        ..Script::default()
    };
    for n in ["a", "b", "c"] {
        s.looks.insert(
            n,
            Look::Due {
                generation: 7,
                phase: Phase::Apply,
            },
        );
    }
    let budget = Budget::unlimited();
    let w = Walk::new("Connection", names(&["a", "b", "c"]), None, None).isolated();
    let walked = w.run(&budget, &tracker, &mut s).await;
    assert_eq!(s.calls, ["apply a", "quarantined b@7", "apply c"]);
    assert_eq!(s.working, ["Connection/a@7", "Connection/c@7"]);
    assert_eq!((walked.done, walked.failed), (3, 1));
    // Nothing stays in progress, a failed turn included.
    let mut after = Annotations::new();
    tracker.annotate_renewal(&mut after);
    assert_eq!(after.get(WORKING_ON).map(String::as_str).unwrap_or(""), "");

    // Without isolation the quarantine is not consulted.
    let mut s = Script::default();
    let w = Walk::new("Connection", names(&["b"]), None, None);
    w.run(&budget, &tracker, &mut s).await;
    assert_eq!(s.calls, ["apply b"]);
}
