//! One run at a time: a `coordination.k8s.io/v1` Lease per pass (and shard). A run that finds the
//! Lease held by a live holder skips; an expired Lease is taken over. Every write carries the
//! resourceVersion it read, so two runs racing for one Lease cannot both win.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

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
    name: String,
    holder: String,
    /// Where the previous budget-limited run stopped (the Lease's cursor annotation).
    pub cursor: Option<String>,
}

/// Lease annotation holding a pass-level resume point between runs.
pub const CURSOR_ANNOTATION: &str = "kbind.io/resume-after";

/// A holder identity that is unique per process: the pod name (or host) plus pid and time.
pub fn holder_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kbind".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        Timestamp::now().as_millisecond() % 1_000_000
    )
}

fn is_live(spec: &LeaseSpec, now: Timestamp) -> bool {
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

/// Try to take the Lease `name` in `namespace` for `duration_secs`.
pub async fn acquire(
    client: Client,
    namespace: &str,
    name: &str,
    holder: &str,
    duration_secs: i32,
) -> Result<Acquired, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let now = Timestamp::now();
    let spec = LeaseSpec {
        holder_identity: Some(holder.to_string()),
        lease_duration_seconds: Some(duration_secs),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    };
    let guard = |cursor: Option<String>| LeaseGuard {
        api: api.clone(),
        name: name.to_string(),
        holder: holder.to_string(),
        cursor,
    };
    match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    lease_transitions: Some(0),
                    ..spec
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Acquired::Held(Box::new(guard(None)))),
                Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => {
                    // Our own earlier attempt may be what the conflict is with.
                    Ok(match current_holder(&api, name).await {
                        h if h == holder => Acquired::Held(Box::new(guard(None))),
                        h => Acquired::HeldBy(h),
                    })
                }
                Err(e) if landed(&api, name, holder).await => {
                    tracing::debug!(error = %crate::scrub::scrub(&e.to_string()), "Lease write reported an error but landed");
                    Ok(Acquired::Held(Box::new(guard(None))))
                }
                Err(e) => Err(e),
            }
        }
        Some(existing) => {
            let old = existing.spec.clone().unwrap_or_default();
            if is_live(&old, now) {
                return Ok(Acquired::HeldBy(old.holder_identity.unwrap_or_default()));
            }
            let transitions = old.lease_transitions.unwrap_or(0) + 1;
            let cursor = existing
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CURSOR_ANNOTATION))
                .cloned();
            let mut taken = existing;
            taken.spec = Some(LeaseSpec {
                lease_transitions: Some(transitions),
                ..spec
            });
            // replace carries metadata.resourceVersion: a racing taker gets 409.
            match api.replace(name, &PostParams::default(), &taken).await {
                Ok(_) => Ok(Acquired::Held(Box::new(guard(cursor)))),
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    Ok(match current_holder(&api, name).await {
                        h if h == holder => Acquired::Held(Box::new(guard(cursor))),
                        h => Acquired::HeldBy(h),
                    })
                }
                Err(e) if landed(&api, name, holder).await => {
                    tracing::debug!(error = %crate::scrub::scrub(&e.to_string()), "Lease write reported an error but landed");
                    Ok(Acquired::Held(Box::new(guard(cursor))))
                }
                Err(e) => Err(e),
            }
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
    pub async fn release(self, cursor: Option<String>) {
        for attempt in 1..=3u64 {
            match self.try_release(&cursor).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(lease = %self.name, attempt, error = %crate::scrub::scrub(&e.to_string()), "lease release failed");
                    if attempt < 3 {
                        tokio::time::sleep(std::time::Duration::from_millis(300 * attempt)).await;
                    }
                }
            }
        }
        tracing::warn!(lease = %self.name, "could not release the pass Lease; it will expire");
    }

    async fn try_release(&self, cursor: &Option<String>) -> Result<(), kube::Error> {
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
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| Some(MicroTime(Timestamp::from_second(s).unwrap()));
        let spec = |holder: Option<&str>, renew, dur| LeaseSpec {
            holder_identity: holder.map(String::from),
            renew_time: renew,
            lease_duration_seconds: Some(dur),
            ..Default::default()
        };
        assert!(is_live(&spec(Some("a"), at(999_990), 60), now));
        assert!(!is_live(&spec(Some("a"), at(999_000), 60), now), "expired");
        assert!(!is_live(&spec(None, at(999_990), 60), now), "released");
        assert!(!is_live(&spec(Some(""), at(999_990), 60), now), "released");
        assert!(!is_live(&spec(Some("a"), None, 60), now), "never renewed");
    }
}
