//! One run at a time: a `coordination.k8s.io/v1` Lease per pass (and shard). A run that finds the
//! Lease held by a live holder skips; an expired Lease is taken over, and so is a live one left
//! by an earlier pod of the same Job (a retried pod). Every write carries the resourceVersion it
//! read, so two runs racing for one Lease cannot both win.
//!
//! The Lease lasts `--lease-duration` (default 60 s) and the running pass renews it every third
//! of that, so a killed run holds later runs off for at most one duration. A renewal that finds
//! the Lease gone to another holder, or that cannot land before the Lease expires, ends the
//! pass's budget like its deadline (docs/operations.md, "The pass Lease").

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::budget::Budget;
use super::poison::{self, Tracker};

mod renewal;
use renewal::Renewer;
#[cfg(test)]
use renewal::expiry_cause;
pub use renewal::{Renewal, RenewalReport};

/// Result of trying to take the Lease.
#[derive(Debug)]
pub enum Acquired {
    /// We hold it; release it when done.
    Held(Box<LeaseGuard>),
    /// A live holder has it.
    HeldBy(String),
}

#[derive(Debug)]
pub struct LeaseGuard {
    api: Api<Lease>,
    namespace: String,
    name: String,
    holder: String,
    duration: Duration,
    /// When the Lease was last made ours (by this process's clock).
    renewed_at: Instant,
    /// The Lease as we last wrote it, when the write's answer came back: its resourceVersion
    /// guards the first renewal.
    written: Option<Lease>,
    /// Where the previous budget-limited run stopped (the Lease's cursor annotation).
    pub cursor: Option<String>,
    /// The holder this run took the Lease from: an expired holder (a killed run), or an earlier
    /// pod of the same Job. `None` when the Lease was free or released.
    pub taken_over: Option<String>,
    /// Poison isolation's record (src/pass/poison.rs), shared with the renewal.
    pub poison: Arc<Tracker>,
    /// When a run last reconciled every root object (the Lease's swept-at annotation).
    pub swept_at: Option<Timestamp>,
}

/// Lease annotation holding a pass-level resume point between runs.
pub const CURSOR_ANNOTATION: &str = "kbind.io/resume-after";

/// Lease annotation holding when a run last reconciled every root object of the pass (its
/// shard), so runs in between can reconcile only what changed (docs/schema.md "Full sweeps").
pub const SWEPT_ANNOTATION: &str = "kbind.io/swept-at";

fn swept_at(lease: &Lease) -> Option<Timestamp> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(SWEPT_ANNOTATION)?
        .parse()
        .ok()
}

/// This process's holder identity: `$POD_NAME` if set, else the host name and pid; prefixed
/// with `$JOB_NAME/` when set, so a retried pod of a Job recognises its predecessor's Lease.
pub fn holder_identity() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    identity(
        var("POD_NAME").as_deref(),
        var("JOB_NAME").as_deref(),
        &host_name(),
        std::process::id(),
    )
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kbind".into())
}

/// `[<job>/]<pod>`, or `[<job>/]<host>-<pid>` outside a pod. Pod, Job and host names never
/// contain `/`, so the part before it is the Job.
fn identity(pod: Option<&str>, job: Option<&str>, host: &str, pid: u32) -> String {
    let me = match pod {
        Some(p) => p.to_string(),
        None => format!("{host}-{pid}"),
    };
    match job {
        Some(j) => format!("{j}/{me}"),
        None => me,
    }
}

/// The Job a holder identity names, if any.
fn job_of(holder: &str) -> Option<&str> {
    holder
        .split_once('/')
        .map(|(j, _)| j)
        .filter(|j| !j.is_empty())
}

/// Whether a holder has the Lease and its last renewal is less than its duration ago.
pub fn is_live(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(holder) = spec.holder_identity.as_deref() else {
        return false;
    };
    if holder.is_empty() {
        return false;
    }
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    renewed.0 + SignedDuration::from_secs(secs) > now
}

/// What a run may do with a Lease it found.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Take it; `previous` is the holder it still named (expired or of our own Job).
    Take { previous: Option<String> },
    /// A live holder that is not ours keeps it.
    Skip(String),
}

/// The takeover rule. A live Lease is taken only from an earlier incarnation of ourselves: the
/// same identity (a container restarted in its pod: the identity is unique per live process),
/// or another pod of the same Job (a Job with parallelism 1 starts a new pod only after the
/// previous one failed; shards of an Indexed Job each have their own Lease).
fn verdict(spec: &LeaseSpec, now: Timestamp, me: &str) -> Verdict {
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Verdict::Take { previous: None };
    };
    let same_job = matches!((job_of(&holder), job_of(me)), (Some(a), Some(b)) if a == b);
    if !is_live(spec, now) || holder == me || same_job {
        Verdict::Take {
            previous: Some(holder),
        }
    } else {
        Verdict::Skip(holder)
    }
}

/// Try to take the Lease `name` in `namespace` for `duration_secs` (at least 1).
pub async fn acquire(
    client: Client,
    namespace: &str,
    name: &str,
    holder: &str,
    duration_secs: i32,
) -> Result<Acquired, kube::Error> {
    let duration_secs = duration_secs.max(1);
    let taking = Taking {
        api: Api::namespaced(client, namespace),
        namespace,
        name,
        holder,
        duration: Duration::from_secs(u64::from(duration_secs.unsigned_abs())),
        started: Instant::now(),
    };
    let now = Timestamp::now();
    let spec = LeaseSpec {
        holder_identity: Some(holder.to_string()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    };
    match taking.api.get_opt(name).await? {
        None => taking.create(spec).await,
        Some(existing) => taking.take_over(existing, spec, now).await,
    }
}

/// One attempt at the Lease.
struct Taking<'a> {
    api: Api<Lease>,
    namespace: &'a str,
    name: &'a str,
    holder: &'a str,
    duration: Duration,
    started: Instant,
}

/// What a Lease taken over carries from the runs before.
struct Carried {
    cursor: Option<String>,
    taken_over: Option<String>,
    poison: Arc<Tracker>,
    swept_at: Option<Timestamp>,
}

impl Taking<'_> {
    /// A careful item start waits for its Lease write at most one renewal period.
    fn tracker(&self, record: poison::Record) -> Arc<Tracker> {
        Arc::new(Tracker::new(record, self.duration / 3))
    }

    /// Nothing carried: a new Lease, or one created by our own earlier attempt.
    fn fresh(&self) -> Carried {
        Carried {
            cursor: None,
            taken_over: None,
            poison: self.tracker(Default::default()),
            swept_at: None,
        }
    }

    fn held(&self, written: Option<Lease>, c: Carried) -> Acquired {
        Acquired::Held(Box::new(LeaseGuard {
            api: self.api.clone(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            holder: self.holder.to_string(),
            duration: self.duration,
            renewed_at: self.started,
            written,
            cursor: c.cursor,
            taken_over: c.taken_over,
            poison: c.poison,
            swept_at: c.swept_at,
        }))
    }

    /// No Lease yet: create it; a racing creator wins unless it was us.
    async fn create(&self, spec: LeaseSpec) -> Result<Acquired, kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                lease_transitions: Some(0),
                ..spec
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(l) => Ok(self.held(Some(l), self.fresh())),
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => {
                // Our own earlier attempt may be what the conflict is with.
                Ok(match current_holder(&self.api, self.name).await {
                    h if h == self.holder => self.held(None, self.fresh()),
                    h => Acquired::HeldBy(h),
                })
            }
            Err(e) if landed(&self.api, self.name, self.holder).await => {
                tracing::debug!(error = %e, "Lease write reported an error but landed");
                Ok(self.held(None, self.fresh()))
            }
            Err(e) => Err(e),
        }
    }

    /// A Lease exists: skip while another live holder has it, else take it over, carrying its
    /// cursor, last full sweep and poison record (a holder that did not release it died).
    async fn take_over(
        &self,
        existing: Lease,
        spec: LeaseSpec,
        now: Timestamp,
    ) -> Result<Acquired, kube::Error> {
        let old = existing.spec.clone().unwrap_or_default();
        let previous = match verdict(&old, now, self.holder) {
            Verdict::Skip(h) => return Ok(Acquired::HeldBy(h)),
            Verdict::Take { previous } => previous,
        };
        let transitions = old.lease_transitions.unwrap_or(0) + 1;
        let cursor = existing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CURSOR_ANNOTATION))
            .cloned();
        let swept = swept_at(&existing);
        let mut taken = existing;
        // A holder that did not release the Lease died (src/pass/poison.rs).
        let record = poison::take(
            taken
                .metadata
                .annotations
                .as_ref()
                .unwrap_or(&Default::default()),
            previous.is_some(),
        );
        if !record.newly_quarantined.is_empty() {
            tracing::warn!(items = ?record.newly_quarantined, "two runs in a row died while working on these: skipping them until they change");
        }
        Tracker::annotate_takeover(
            &record,
            taken
                .metadata
                .annotations
                .get_or_insert_with(Default::default),
        );
        let carried = || Carried {
            cursor: cursor.clone(),
            taken_over: previous.clone(),
            poison: self.tracker(record.clone()),
            swept_at: swept,
        };
        taken.spec = Some(LeaseSpec {
            lease_transitions: Some(transitions),
            ..spec
        });
        // replace carries metadata.resourceVersion: a racing taker gets 409.
        match self
            .api
            .replace(self.name, &PostParams::default(), &taken)
            .await
        {
            Ok(l) => Ok(self.held(Some(l), carried())),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                Ok(match current_holder(&self.api, self.name).await {
                    h if h == self.holder => self.held(None, carried()),
                    h => Acquired::HeldBy(h),
                })
            }
            Err(e) if landed(&self.api, self.name, self.holder).await => {
                tracing::debug!(error = %e, "Lease write reported an error but landed");
                Ok(self.held(None, carried()))
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether a Lease write whose response was lost (a reset, a cut-off body) took effect: the
/// Lease now names us. Without this check the run would fail and leave the next runs skipping
/// until the Lease expires.
async fn landed(api: &Api<Lease>, name: &str, holder: &str) -> bool {
    matches!(api.get_opt(name).await, Ok(Some(l))
        if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(holder))
}

async fn current_holder(api: &Api<Lease>, name: &str) -> String {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec.and_then(|s| s.holder_identity))
        .unwrap_or_else(|| "another run".into())
}

impl LeaseGuard {
    /// Give the Lease up so the next run need not wait for it to expire, recording where a
    /// budget-limited run stopped (`None`: the pass covered everything). Best effort: an
    /// unreleased Lease simply expires, and the next run starts from the beginning.
    ///
    /// The release is tried a few times: a lost one costs the next runs until the Lease expires,
    /// and the cursor with it. Each try re-reads, so a try that landed despite an error is seen.
    /// `swept`: this run reconciled every root object, at that time (recorded for the next
    /// runs; `None` keeps the previous record).
    pub async fn release(self, cursor: Option<String>, swept: Option<Timestamp>) {
        for attempt in 1..=3u64 {
            match self.try_release(&cursor, swept).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(lease = %self.name, attempt, error = %e, "lease release failed");
                    if attempt < 3 {
                        tokio::time::sleep(std::time::Duration::from_millis(300 * attempt)).await;
                    }
                }
            }
        }
        tracing::warn!(lease = %self.name, "could not release the pass Lease; it will expire");
    }

    async fn try_release(
        &self,
        cursor: &Option<String>,
        swept: Option<Timestamp>,
    ) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        match cursor {
            Some(c) => annotations.insert(CURSOR_ANNOTATION.to_string(), c.clone()),
            None => annotations.remove(CURSOR_ANNOTATION),
        };
        if let Some(t) = swept {
            annotations.insert(SWEPT_ANNOTATION.to_string(), t.to_string());
        }
        self.poison.annotate_release(annotations);
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renew the Lease every third of its duration until [`Renewal::stop`], on a task of its
    /// own. When the Lease is lost (another holder has it, it was released or deleted under us,
    /// or no renewal landed before it expired) the task ends `budget` with
    /// [`Budget::lose_lease`], as the deadline would, and stops renewing. A renewal that fails
    /// otherwise is tried again at the next tick while the Lease is still unexpired.
    pub fn renew_in_background(&mut self, budget: Arc<Budget>) -> Renewal {
        let (stop, stopped) = oneshot::channel();
        let renewer = Renewer {
            api: self.api.clone(),
            what: format!("Lease {}/{}", self.namespace, self.name),
            name: self.name.clone(),
            holder: self.holder.clone(),
            duration: self.duration,
            last: self.written.take(),
            poison: self.poison.clone(),
        };
        let task = tokio::spawn(renewer.run(self.renewed_at, budget, stopped));
        Renewal { stop, task }
    }
}

#[cfg(test)]
mod tests;
