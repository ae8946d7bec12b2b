//! Recording a pass on the RelationshipSource status (spec 002 "Status"): the cursor and cycle
//! fields, `lastPass`, and the `Ready`, `PartialFailure` and `ReapDeferred` conditions. The new
//! status is a pure function of the previous one and the pass; it is applied with server-side
//! apply as `kbind-relsync`, with a resourceVersion precondition because it moves the cursor.
//!
//! The status says only what happened: every pass records `lastPass`, but `lastSyncTime` (the
//! last *completed full cycle*, spec 002) moves only when a non-scoped pass ran and its walk
//! reached the last enumerated scope. A refused source, a failed enumeration and a pass that
//! stopped partway leave it where it was (docs/relsync.md "Status").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use super::plan::Deferral;
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::relsync::condition::{CLEANUP_FAILED, PARTIAL_FAILURE, READY, REAP_DEFERRED};
use crate::api::relsync::{
    LastPass, RelationshipSource, RelationshipSourceStatus, ScopeErrorSample,
};

/// Samples kept in status.
pub const MAX_SAMPLES: usize = 5;
/// Bytes per sample message.
pub const MAX_SAMPLE_LEN: usize = 256;

/// How the pass ended for this source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Kind, config or credential refused: nothing was sent upstream.
    Refused {
        reason: &'static str,
        message: String,
    },
    /// The scope enumeration failed: the cycle is abandoned.
    EnumerationFailed {
        reason: &'static str,
        message: String,
    },
    /// The source's turn (its share of the pass deadline) ended before its enumeration did:
    /// nothing was processed, and the cycle — cursor included — stays as it was.
    OutOfTime { message: String },
    /// Scopes were processed.
    Ran,
}

/// The `Ready=False` reason of [`Outcome::OutOfTime`].
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// Everything the status needs from one pass over one source.
#[derive(Clone, Debug, PartialEq)]
pub struct PassRecord {
    pub scoped: bool,
    pub outcome: Outcome,
    /// This pass continued the previous cycle (else it began a new one).
    pub continued_cycle: bool,
    /// The walk reached the last enumerated scope.
    pub reached_end: bool,
    /// The last scope completed, in order, this pass.
    pub last_done: Option<String>,
    pub counts: LastPass,
    pub errors: Vec<ScopeErrorSample>,
    pub reap: Result<(), Deferral>,
}

/// A scope error as it may be stored: scrubbed (no query, fragment, userinfo or token) and
/// bounded.
pub fn sample(scope: &str, message: &str) -> ScopeErrorSample {
    ScopeErrorSample {
        scope: scope.to_string(),
        message: crate::scrub::bound(&crate::scrub::scrub(message), MAX_SAMPLE_LEN),
    }
}

/// Sort by (scope, message), drop duplicates, keep the first few.
pub fn cap_samples(mut all: Vec<ScopeErrorSample>) -> Vec<ScopeErrorSample> {
    all.sort();
    all.dedup();
    all.truncate(MAX_SAMPLES);
    all
}

/// Keep the previous samples verbatim when the failure count and the sampled scopes did not
/// change, so error text that varies run to run (a rate-limit wait) does not rewrite status.
pub fn stable_samples(
    prev: Option<&LastPass>,
    errors: i32,
    new: Vec<ScopeErrorSample>,
) -> Vec<ScopeErrorSample> {
    if let Some(p) = prev
        && p.scope_errors == errors
        && p.scope_error_samples.len() == new.len()
        && p.scope_error_samples
            .iter()
            .zip(&new)
            .all(|(a, b)| a.scope == b.scope)
    {
        return p.scope_error_samples.clone();
    }
    new
}

/// Whether `rec` completed a full cycle: a non-scoped pass that ran and whose walk reached the
/// last enumerated scope (a cycle may span several passes). Scope errors do not make it
/// incomplete: they are reported on `lastPass` and `PartialFailure`, and the failed scopes are
/// retried in the next cycle (spec 002: "one scope failing is not a pass failure").
pub fn completed_cycle(rec: &PassRecord) -> bool {
    !rec.scoped && rec.outcome == Outcome::Ran && rec.reached_end
}

/// The status of a deleting source whose cleanup could not finish: `Ready=False`
/// `CleanupFailed` with the (scrubbed) reason; nothing else changes. The same failure again
/// yields the same status, so a retry that fails the same way writes nothing.
pub fn cleanup_failed(
    prev: Option<&RelationshipSourceStatus>,
    generation: Option<i64>,
    message: &str,
    now: Timestamp,
) -> RelationshipSourceStatus {
    let mut st = prev.cloned().unwrap_or_default();
    let message = crate::scrub::scrub(message);
    st.conditions
        .set_condition(READY, S::False, CLEANUP_FAILED, &message, generation, now);
    st
}

/// The status after `rec`.
pub fn next_status(
    prev: Option<&RelationshipSourceStatus>,
    generation: Option<i64>,
    rec: &PassRecord,
    now: Timestamp,
) -> RelationshipSourceStatus {
    let mut st = prev.cloned().unwrap_or_default();
    let prev_sync = st.sync.clone().unwrap_or_default();
    let mut sync = prev_sync.clone();
    let mut last = rec.counts.clone();
    last.finished_at = Some(Time(now));
    last.scoped = rec.scoped;
    last.scope_errors = i32::try_from(rec.errors.len()).unwrap_or(i32::MAX);
    let samples = cap_samples(rec.errors.clone());
    last.scope_error_samples =
        stable_samples(prev_sync.last_pass.as_ref(), last.scope_errors, samples);
    sync.last_pass = Some(last);
    if completed_cycle(rec) {
        sync.last_sync_time = Some(Time(now));
    }
    if !rec.scoped {
        match &rec.outcome {
            Outcome::Refused { .. } | Outcome::OutOfTime { .. } => {}
            Outcome::EnumerationFailed { .. } => {
                sync.cycle_started_at = None;
                sync.enum_complete = false;
                sync.resume_after.clear();
            }
            Outcome::Ran => {
                if !rec.continued_cycle {
                    sync.cycle_started_at = Some(Time(now));
                    sync.resume_after.clear();
                }
                if rec.reached_end {
                    sync.enum_complete = true;
                    sync.resume_after.clear();
                } else {
                    sync.enum_complete = false;
                    if let Some(l) = &rec.last_done {
                        sync.resume_after = l.clone();
                    }
                }
            }
        }
    }
    st.sync = Some(sync);
    st.observed_generation = generation;
    let c = &mut st.conditions;
    match &rec.outcome {
        Outcome::Refused { reason, message } | Outcome::EnumerationFailed { reason, message } => {
            let message = crate::scrub::scrub(message);
            c.set_condition(READY, S::False, reason, &message, generation, now);
        }
        Outcome::OutOfTime { message } => {
            let message = crate::scrub::scrub(message);
            c.set_condition(
                READY,
                S::False,
                DEADLINE_EXCEEDED,
                &message,
                generation,
                now,
            );
        }
        Outcome::Ran => {
            let msg = if rec.scoped {
                "scoped pass completed".to_string()
            } else if rec.reached_end {
                "cycle complete".to_string()
            } else {
                format!(
                    "cycle in progress: the next pass resumes after {}",
                    st.sync
                        .as_ref()
                        .map(|s| s.resume_after.as_str())
                        .filter(|s| !s.is_empty())
                        .unwrap_or("the start")
                )
            };
            c.set_condition(READY, S::True, "Synced", &msg, generation, now);
        }
    }
    if rec.outcome == Outcome::Ran {
        if rec.errors.is_empty() {
            c.set_condition(
                PARTIAL_FAILURE,
                S::False,
                "NoScopeErrors",
                "",
                generation,
                now,
            );
        } else {
            let msg = format!(
                "{} scope(s) failed this pass; see status.sync.lastPass.scopeErrorSamples",
                rec.errors.len()
            );
            c.set_condition(
                PARTIAL_FAILURE,
                S::True,
                "ScopeErrors",
                &msg,
                generation,
                now,
            );
        }
    }
    // A refused source learned nothing about coverage: ReapDeferred keeps what it said.
    if !rec.scoped && !matches!(rec.outcome, Outcome::Refused { .. }) {
        match rec.reap {
            Ok(()) => c.set_condition(REAP_DEFERRED, S::False, "Reaped", "", generation, now),
            Err(d) => c.set_condition(
                REAP_DEFERRED,
                S::True,
                d.reason(),
                d.message(),
                generation,
                now,
            ),
        };
    }
    st
}

/// Write the status for `rec`, re-reading and recomputing on a 409.
pub async fn write(
    api: &Api<RelationshipSource>,
    name: &str,
    first: &RelationshipSource,
    rec: &PassRecord,
    manager: &str,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    apply(api, name, first, manager, |prev, generation| {
        next_status(prev, generation, rec, now)
    })
    .await
}

/// Apply the status `next` computes from the object's current status and generation, with a
/// resourceVersion precondition, re-reading and recomputing on a 409. Returns whether it wrote:
/// a status that would not change is not written.
pub async fn apply<F>(
    api: &Api<RelationshipSource>,
    name: &str,
    first: &RelationshipSource,
    manager: &str,
    next: F,
) -> Result<bool, kube::Error>
where
    F: Fn(Option<&RelationshipSourceStatus>, Option<i64>) -> RelationshipSourceStatus,
{
    let mut obj = first.clone();
    for attempt in 0..5 {
        let next = next(obj.status.as_ref(), obj.metadata.generation);
        if obj.status.as_ref() == Some(&next) {
            return Ok(false);
        }
        let body = serde_json::to_value(&next).map_err(kube::Error::SerdeError)?;
        match crate::pass::status::apply_status(
            api,
            name,
            manager,
            body,
            obj.metadata.resource_version.as_deref(),
        )
        .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() && attempt < 4 => {
                obj = api.get(name).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
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

    /// `lastSyncTime` is the last completed full cycle (spec 002): only a non-scoped pass whose
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
            !s.message.contains("xoxb")
                && !s.message.contains("sekrit")
                && !s.message.contains('?'),
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
}
