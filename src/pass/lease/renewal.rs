//! The background renewal of a held pass Lease (every third of its duration), and what it
//! reports when the Lease is lost.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::super::budget::Budget;
use super::super::poison::Tracker;

/// The background renewal of a held Lease; stop it before releasing the Lease.
#[derive(Debug)]
pub struct Renewal {
    pub(super) stop: oneshot::Sender<()>,
    pub(super) task: tokio::task::JoinHandle<RenewalReport>,
}

/// What the renewal did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RenewalReport {
    /// Renewals that landed (Lease writes, for the summary's bookkeeping count).
    pub renewals: u64,
    /// Why the Lease was lost, if it was.
    pub lost: Option<String>,
}

impl Renewal {
    /// Stop renewing (an in-flight renewal is abandoned; the release that follows re-reads the
    /// Lease) and report what happened.
    pub async fn stop(self) -> RenewalReport {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_else(|e| RenewalReport {
            renewals: 0,
            lost: Some(format!("the Lease renewal task ended abnormally: {e}")),
        })
    }
}

/// What one renewal attempt found.
#[derive(Debug)]
enum Renewed {
    Yes,
    /// The Lease is not ours any more; why.
    Lost(String),
}

/// Why a Lease found past its expiry at a renewal tick was not renewed in time: the last attempt's
/// error, or, when no attempt failed, that the renewal itself came too late (the process was
/// stalled: a suspended pod, an overloaded node, a blocked runtime).
pub(super) fn expiry_cause(last_error: &str, late: Duration, since_renewal: Duration) -> String {
    if last_error.is_empty() {
        format!(
            "the renewal came {:.1}s after the Lease expired ({:.1}s after the last renewal): \
             the process was stalled (suspended, or starved of CPU)",
            late.as_secs_f64(),
            since_renewal.as_secs_f64()
        )
    } else {
        format!("the last renewal attempt failed: {last_error}")
    }
}

pub(super) struct Renewer {
    pub(super) api: Api<Lease>,
    /// `Lease <namespace>/<name>`, for messages.
    pub(super) what: String,
    pub(super) name: String,
    pub(super) holder: String,
    pub(super) duration: Duration,
    /// The Lease as last written or read; `None`: read it first.
    pub(super) last: Option<Lease>,
    pub(super) poison: Arc<Tracker>,
}

impl Renewer {
    pub(super) async fn run(
        mut self,
        mut renewed_at: Instant,
        budget: Arc<Budget>,
        mut stopped: oneshot::Receiver<()>,
    ) -> RenewalReport {
        let period = self.duration / 3;
        let mut report = RenewalReport::default();
        let mut next = renewed_at + period;
        let mut last_error = String::new();
        loop {
            // A careful item start (src/pass/poison.rs) is recorded by a renewal now.
            tokio::select! {
                _ = &mut stopped => return report,
                _ = tokio::time::sleep_until(next) => {}
                _ = self.poison.urgent() => {}
            }
            let expires = renewed_at + self.duration;
            let started = Instant::now();
            let lost = if started >= expires {
                Some(format!(
                    "{} not renewed before it expired: {}",
                    self.what,
                    expiry_cause(&last_error, started - expires, started - renewed_at)
                ))
            } else {
                let attempt = tokio::time::timeout(expires - started, self.renew_once());
                let outcome = tokio::select! {
                    _ = &mut stopped => return report,
                    r = attempt => r,
                };
                match outcome {
                    Ok(Ok(Renewed::Yes)) => {
                        report.renewals += 1;
                        renewed_at = started;
                        next = started + period;
                        None
                    }
                    Ok(Ok(Renewed::Lost(why))) => Some(why),
                    Ok(Err(e)) => {
                        tracing::warn!(lease = %self.name, error = %e, "renewing the pass Lease failed; trying again");
                        last_error = e;
                        next = Instant::now() + period;
                        None
                    }
                    Err(_) => Some(format!(
                        "{} not renewed before it expired: the renewal did not finish in time",
                        self.what
                    )),
                }
            };
            if let Some(why) = lost {
                tracing::warn!(lease = %self.name, reason = %why, "pass Lease lost: taking no new work");
                budget.lose_lease();
                report.lost = Some(why);
                return report;
            }
        }
    }

    /// Write a new renewTime over the Lease as last seen. A conflict re-reads it: still ours
    /// (our own earlier write landed, or only annotations changed), it is written again.
    /// `Err` is a failure that says nothing about who holds the Lease (its text, scrubbed where it is printed).
    async fn renew_once(&mut self) -> Result<Renewed, String> {
        let text = |e: kube::Error| e.to_string();
        for _ in 0..3 {
            let mut lease = match self.last.take() {
                Some(l) => l,
                None => match self.api.get_opt(&self.name).await.map_err(text)? {
                    Some(l) => l,
                    None => return Ok(Renewed::Lost(format!("{} was deleted", self.what))),
                },
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            match spec.holder_identity.as_deref() {
                Some(h) if h == self.holder => {}
                Some(h) if !h.is_empty() => {
                    return Ok(Renewed::Lost(format!("{} taken over by {h}", self.what)));
                }
                _ => {
                    return Ok(Renewed::Lost(format!(
                        "{} released by another writer",
                        self.what
                    )));
                }
            }
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            let token = self.poison.annotate_renewal(
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default),
            );
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(l) => {
                    self.last = Some(l);
                    self.poison.written(token);
                    return Ok(Renewed::Yes);
                }
                // Someone wrote the Lease since we last saw it: look again.
                Err(kube::Error::Api(s)) if s.is_conflict() => continue,
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    return Ok(Renewed::Lost(format!("{} was deleted", self.what)));
                }
                Err(e) => return Err(text(e)),
            }
        }
        Err(format!("{} kept changing while being renewed", self.what))
    }
}
