//! Recording a pass on the RelationshipSource status (docs/relsync.md "Status"): the cursor and cycle
//! fields, `lastPass`, and the `Ready`, `PartialFailure` and `ReapDeferred` conditions. The new
//! status is a pure function of the previous one and the pass; it is applied with server-side
//! apply as `kbind-relsync`, with a resourceVersion precondition because it moves the cursor.
//!
//! The status says only what happened: every pass records `lastPass`, but `lastSyncTime` (the
//! last *completed full cycle*, docs/relsync.md "Status") moves only when a non-scoped pass ran and its walk
//! reached the last enumerated scope. A refused source, a failed enumeration and a pass that
//! stopped partway leave it where it was (docs/relsync.md "Status").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use super::plan::Deferral;
use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::relsync::condition::{CLEANUP_FAILED, PARTIAL_FAILURE, READY, REAP_DEFERRED};
use crate::api::relsync::{
    LastPass, RelationshipSource, RelationshipSourceStatus, ScopeErrorSample, SyncProgress,
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
/// retried in the next cycle (docs/relsync.md: one scope failing is not a pass failure).
pub fn completed_cycle(rec: &PassRecord) -> bool {
    !rec.scoped && rec.outcome == Outcome::Ran && rec.reached_end
}

/// The status of a deleting source whose cleanup could not finish: `Ready=False`
/// `CleanupFailed` with the reason (scrubbed as every condition message is); nothing else changes. The same failure again
/// yields the same status, so a retry that fails the same way writes nothing.
pub fn cleanup_failed(
    prev: Option<&RelationshipSourceStatus>,
    generation: Option<i64>,
    message: &str,
    now: Timestamp,
) -> RelationshipSourceStatus {
    let mut st = prev.cloned().unwrap_or_default();
    st.conditions
        .set_condition(READY, S::False, CLEANUP_FAILED, message, generation, now);
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
    st.sync = Some(next_sync(st.sync.clone().unwrap_or_default(), rec, now));
    st.observed_generation = generation;
    let resume_after = st.sync.as_ref().map(|s| s.resume_after.as_str());
    set_conditions(&mut st.conditions, rec, resume_after, generation, now);
    st
}

/// The sync progress after `rec`: its lastPass, the cycle and the cursor.
fn next_sync(prev_sync: SyncProgress, rec: &PassRecord, now: Timestamp) -> SyncProgress {
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
    sync
}

/// `Ready`, `PartialFailure` and `ReapDeferred` after `rec`.
fn set_conditions(
    c: &mut Vec<Condition>,
    rec: &PassRecord,
    resume_after: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) {
    match &rec.outcome {
        Outcome::Refused { reason, message } | Outcome::EnumerationFailed { reason, message } => {
            c.set_condition(READY, S::False, reason, message, generation, now);
        }
        Outcome::OutOfTime { message } => {
            c.set_condition(READY, S::False, DEADLINE_EXCEEDED, message, generation, now);
        }
        Outcome::Ran => {
            let msg = if rec.scoped {
                "scoped pass completed".to_string()
            } else if rec.reached_end {
                "cycle complete".to_string()
            } else {
                format!(
                    "cycle in progress: the next pass resumes after {}",
                    resume_after
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
mod tests;
