//! Tests of `relsync::record`.

use super::*;
use crate::api::relsync::SyncProgress;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn ran(reached_end: bool, continued: bool, last_done: Option<&str>) -> PassRecord {
    PassRecord {
        scoped: false,
        outcome: Outcome::Ran,
        continued_cycle: continued,
        reached_end,
        last_done: last_done.map(str::to_string),
        counts: LastPass::default(),
        errors: Vec::new(),
        reap: if reached_end && !continued {
            Ok(())
        } else {
            Err(Deferral::PartialCoverage)
        },
    }
}

fn sync(st: &RelationshipSourceStatus) -> &SyncProgress {
    st.sync.as_ref().unwrap()
}

#[test]
fn budgeted_cycle_moves_the_cursor_then_completes() {
    let s1 = next_status(None, Some(1), &ran(false, false, Some("channel/B")), t(100));
    assert_eq!(sync(&s1).resume_after, "channel/B");
    assert!(!sync(&s1).enum_complete);
    assert_eq!(sync(&s1).cycle_started_at, Some(Time(t(100))));
    assert!(s1.conditions.is_true(REAP_DEFERRED));
    assert!(crate::relsync::plan::cycle_in_progress(Some(&s1)));
    let s2 = next_status(
        Some(&s1),
        Some(1),
        &ran(true, true, Some("channel/D")),
        t(200),
    );
    assert_eq!(sync(&s2).resume_after, "");
    assert!(sync(&s2).enum_complete);
    assert_eq!(sync(&s2).cycle_started_at, Some(Time(t(100))), "same cycle");
    assert_eq!(sync(&s2).last_sync_time, Some(Time(t(200))));
    let (_, reason, _) = cond(&s2, REAP_DEFERRED);
    assert_eq!(reason, "PartialCoverage");
    let s3 = next_status(
        Some(&s2),
        Some(1),
        &ran(true, false, Some("channel/D")),
        t(300),
    );
    assert_eq!(sync(&s3).cycle_started_at, Some(Time(t(300))), "new cycle");
    assert!(!s3.conditions.is_true(REAP_DEFERRED));
}

fn cond<'a>(st: &'a RelationshipSourceStatus, t: &str) -> (&'a str, &'a str, &'a str) {
    let c = st.conditions.condition(t).unwrap();
    (&c.status, &c.reason, &c.message)
}

#[test]
fn a_stop_before_any_scope_keeps_the_cursor() {
    let s1 = next_status(None, Some(1), &ran(false, false, Some("channel/B")), t(100));
    let s2 = next_status(Some(&s1), Some(1), &ran(false, true, None), t(200));
    assert_eq!(sync(&s2).resume_after, "channel/B");
}

#[test]
fn scoped_pass_touches_only_last_pass() {
    let s0 = next_status(None, Some(1), &ran(true, false, Some("channel/Z")), t(50));
    let s1 = next_status(
        Some(&s0),
        Some(1),
        &ran(false, false, Some("channel/B")),
        t(100),
    );
    let mut rec = ran(true, false, Some("channel/Z"));
    rec.scoped = true;
    rec.reap = Err(Deferral::Scoped);
    let s2 = next_status(Some(&s1), Some(1), &rec, t(200));
    assert_eq!(sync(&s2).resume_after, "channel/B");
    assert_eq!(sync(&s2).last_sync_time, Some(Time(t(50))));
    assert!(sync(&s2).last_pass.as_ref().unwrap().scoped);
    assert_eq!(
        cond(&s2, REAP_DEFERRED).1,
        "PartialCoverage",
        "unchanged by a scoped pass"
    );
}

/// `lastSyncTime` is the last completed full cycle (docs/relsync.md "Status"): only a non-scoped pass whose
/// walk reached the last scope moves it; every pass records `lastPass.finishedAt`.
#[test]
fn last_sync_time_moves_only_when_a_full_cycle_completed() {
    let refused = PassRecord {
        outcome: Outcome::Refused {
            reason: "SecretNotFound",
            message: "Secret \"slack\" not found".into(),
        },
        ..ran(false, true, None)
    };
    let auth_failed = PassRecord {
        outcome: Outcome::EnumerationFailed {
            reason: "UpstreamAuthFailed",
            message: "enumerating scopes: invalid_auth".into(),
        },
        reap: Err(Deferral::EnumerationFailed),
        ..ran(false, true, None)
    };
    let with_errors = PassRecord {
        errors: vec![sample("channel/B", "not_in_channel")],
        reap: Err(Deferral::ScopeErrors),
        ..ran(true, false, Some("channel/C"))
    };
    let scoped = PassRecord {
        scoped: true,
        reap: Err(Deferral::Scoped),
        ..ran(true, false, Some("channel/C"))
    };
    let cases = [
        ("refused", refused, false),
        ("upstream refused the credential", auth_failed, false),
        (
            "budget cut the walk",
            ran(false, false, Some("channel/B")),
            false,
        ),
        ("stopped before any scope", ran(false, true, None), false),
        (
            "new cycle reached the end",
            ran(true, false, Some("channel/C")),
            true,
        ),
        (
            "continued cycle reached the end",
            ran(true, true, Some("channel/C")),
            true,
        ),
        ("reached the end with scope errors", with_errors, true),
        ("scoped", scoped, false),
    ];
    let earlier = next_status(None, Some(1), &ran(true, false, Some("channel/C")), t(100));
    for (what, rec, moves) in cases {
        for prev in [None, Some(&earlier)] {
            let before = prev.and_then(|p| sync(p).last_sync_time.clone());
            let st = next_status(prev, Some(1), &rec, t(200));
            let want = if moves { Some(Time(t(200))) } else { before };
            assert_eq!(sync(&st).last_sync_time, want, "{what}, prev {prev:?}");
            assert_eq!(
                sync(&st).last_pass.as_ref().unwrap().finished_at,
                Some(Time(t(200))),
                "{what}: lastPass records every pass"
            );
            assert_eq!(completed_cycle(&rec), moves, "{what}");
        }
    }
}

#[test]
fn a_failed_cleanup_says_why_and_the_same_failure_changes_nothing() {
    let s1 = next_status(None, Some(1), &ran(true, false, Some("channel/C")), t(100));
    let msg = "deleting its relationships from SpiceDB: connection refused \
               (http://127.0.0.1:9/v1/relationships/delete?token=xoxb-1)";
    let s2 = cleanup_failed(Some(&s1), Some(2), msg, t(200));
    let (status, reason, message) = cond(&s2, READY);
    assert_eq!((status, reason), ("False", CLEANUP_FAILED));
    assert!(message.contains("connection refused"), "{message}");
    assert!(
        !message.contains("xoxb") && !message.contains('?'),
        "{message}"
    );
    assert_eq!(s2.sync, s1.sync, "a cleanup is not a pass");
    assert_eq!(
        s2.conditions.condition(READY).unwrap().last_transition_time,
        Time(t(200))
    );
    let s3 = cleanup_failed(Some(&s2), Some(2), msg, t(300));
    assert_eq!(s3, s2, "the same failure again: nothing to write");
}

#[test]
fn refusal_and_enumeration_failure() {
    let rec = PassRecord {
        outcome: Outcome::Refused {
            reason: "HostNotAllowed",
            message: "baseURL host 127.0.0.1:9 is not allowed".into(),
        },
        ..ran(false, false, None)
    };
    let s = next_status(None, Some(3), &rec, t(10));
    assert_eq!(
        cond(&s, READY),
        (
            "False",
            "HostNotAllowed",
            "baseURL host 127.0.0.1:9 is not allowed"
        )
    );
    assert_eq!(s.observed_generation, Some(3));
    assert!(
        s.conditions.condition(REAP_DEFERRED).is_none(),
        "a refusal says nothing about coverage"
    );
    let s1 = next_status(None, Some(1), &ran(false, false, Some("channel/B")), t(100));
    let rec = PassRecord {
        outcome: Outcome::EnumerationFailed {
            reason: "UpstreamAuthFailed",
            message: "invalid_auth".into(),
        },
        reap: Err(Deferral::EnumerationFailed),
        ..ran(false, true, None)
    };
    let s2 = next_status(Some(&s1), Some(1), &rec, t(200));
    assert_eq!(sync(&s2).cycle_started_at, None, "cycle abandoned");
    assert_eq!(sync(&s2).resume_after, "");
    assert_eq!(cond(&s2, READY).1, "UpstreamAuthFailed");
}

#[test]
fn an_enumeration_cut_off_by_the_deadline_keeps_the_cycle() {
    let s1 = next_status(None, Some(1), &ran(false, false, Some("group/b")), t(100));
    let rec = PassRecord {
        outcome: Outcome::OutOfTime {
            message: "enumerating scopes: cut off".into(),
        },
        reap: Err(Deferral::PartialCoverage),
        ..ran(false, true, None)
    };
    let s2 = next_status(Some(&s1), Some(1), &rec, t(200));
    assert_eq!(
        cond(&s2, READY),
        ("False", DEADLINE_EXCEEDED, "enumerating scopes: cut off")
    );
    assert_eq!(sync(&s2).resume_after, "group/b", "the cursor stays");
    assert_eq!(sync(&s2).cycle_started_at, Some(Time(t(100))));
    assert!(sync(&s2).last_sync_time.is_none());
    assert_eq!(
        sync(&s2).last_pass.as_ref().unwrap().finished_at,
        Some(Time(t(200)))
    );
    assert!(crate::relsync::plan::cycle_in_progress(Some(&s2)));
}

#[test]
fn partial_failure_stays_ready() {
    let mut rec = ran(true, false, Some("channel/C"));
    rec.errors = vec![sample("channel/B", "conversations.members: fatal_error")];
    rec.reap = Err(Deferral::ScopeErrors);
    let s = next_status(None, Some(1), &rec, t(1));
    assert_eq!(cond(&s, READY).0, "True");
    assert_eq!(cond(&s, PARTIAL_FAILURE).0, "True");
    assert_eq!(cond(&s, REAP_DEFERRED).1, "ScopeErrors");
    assert_eq!(sync(&s).last_pass.as_ref().unwrap().scope_errors, 1);
}

#[test]
fn samples_are_scrubbed_sorted_capped_and_stable() {
    let s = sample(
        "channel/A",
        &format!(
            "GET https://slack.com/api/x?token=xoxb-1&cursor=abc failed: Bearer sekrit {}",
            "x".repeat(600)
        ),
    );
    assert!(
        !s.message.contains("xoxb") && !s.message.contains("sekrit") && !s.message.contains('?'),
        "{}",
        s.message
    );
    assert!(s.message.len() <= MAX_SAMPLE_LEN);
    let many: Vec<_> = (0..9)
        .rev()
        .map(|i| sample(&format!("channel/{i}"), "boom"))
        .collect();
    let capped = cap_samples(many);
    assert_eq!(capped.len(), MAX_SAMPLES);
    assert_eq!(capped[0].scope, "channel/0");
    // Same count and scopes, different text: the previous samples stay verbatim.
    let prev = LastPass {
        scope_errors: 2,
        scope_error_samples: vec![sample("a", "retry in 3s"), sample("b", "x")],
        ..Default::default()
    };
    let new = vec![sample("a", "retry in 7s"), sample("b", "x")];
    assert_eq!(
        stable_samples(Some(&prev), 2, new.clone()),
        prev.scope_error_samples
    );
    assert_eq!(
        stable_samples(Some(&prev), 3, new.clone()),
        new,
        "count changed"
    );
    let moved = vec![sample("a", "x"), sample("c", "x")];
    assert_eq!(
        stable_samples(Some(&prev), 2, moved.clone()),
        moved,
        "scopes changed"
    );
}
