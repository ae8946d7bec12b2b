//! Runs one pass: build the client, take the pass Lease (unless dry-run) and keep renewing it,
//! run, stop renewing, release, print the summary, and turn the outcome into the exit code.

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;

use kube::Client;

use super::args::CommonArgs;
use super::budget::Budget;
use super::client::{RequestCounter, counted_client, own_config};
use super::descriptor::Descriptor;
use super::error::PassError;
use super::events::Recorder;
use super::lease::{self, Acquired};
use super::summary::{Outcome, Summary};
use crate::pass::StatusCode;

/// What a pass gets to work with.
pub struct PassContext {
    pub pass: &'static str,
    pub args: CommonArgs,
    pub client: Client,
    pub counter: Arc<RequestCounter>,
    pub budget: Arc<Budget>,
    pub recorder: Recorder,
    /// Where the previous budget-limited run stopped (from the pass Lease); `None` in a dry run.
    pub resume_after: Option<String>,
    /// Which root objects to skip because runs died on them (src/pass/poison.rs); inert in a
    /// dry run.
    pub poison: Arc<super::poison::Tracker>,
    /// When a run of this pass (shard) last reconciled every root object; `None` when never
    /// recorded, and in a dry run.
    pub swept_at: Option<k8s_openapi::jiff::Timestamp>,
}

impl PassContext {
    pub fn field_manager(&self) -> String {
        crate::api::keys::field_manager(self.pass)
    }
}

/// The Lease name for a pass and optional shard.
pub fn lease_name(pass: &str, args: &CommonArgs) -> String {
    format!(
        "kbind-{pass}{}",
        args.shard.map(|s| s.lease_suffix()).unwrap_or_default()
    )
}

/// Run `body` as pass `pass`; returns the process exit code. `body` fills the summary's counts,
/// writes and outcome; requests and duration are filled in here. The summary is printed, then
/// pushed when `--pushgateway-url` is set (src/pass/metrics.rs; never changes the exit code).
pub async fn run<F, Fut>(pass: Descriptor, args: CommonArgs, body: F) -> i32
where
    F: FnOnce(PassContext) -> Fut,
    Fut: Future<Output = Result<Summary, PassError>>,
{
    let started = std::time::Instant::now();
    let (output, push_args) = (args.output, args.clone());
    let (summary, code) = run_pass(pass.name, args, body).await;
    println!(
        "{}",
        summary.render(output, std::io::stdout().is_terminal())
    );
    let left = push_args.deadline.saturating_sub(started.elapsed());
    super::metrics::push(&push_args, &summary, code, left).await;
    code
}

async fn run_pass<F, Fut>(pass: &'static str, args: CommonArgs, body: F) -> (Summary, i32)
where
    F: FnOnce(PassContext) -> Fut,
    Fut: Future<Output = Result<Summary, PassError>>,
{
    crate::install_crypto_provider();
    crate::set_command(pass);
    let started_at = k8s_openapi::jiff::Timestamp::now();
    let counter = Arc::new(RequestCounter::default());
    let budget = Arc::new(Budget::new(args.max_items, args.deadline));
    // Every client the pass builds bounds its requests by these (src/pass/retry.rs).
    super::retry::set_limits(super::retry::Limits {
        deadline: std::time::Instant::now() + args.deadline,
        request_timeout: args.request_timeout,
    });
    stop_on_sigterm(budget.clone());
    let dry_run = args.dry_run;
    let finish = |mut summary: Summary, code: i32, counter: &RequestCounter, budget: &Budget| {
        summary.requests = counter.total();
        summary.duration_seconds = budget.elapsed().as_secs_f64();
        summary.peak_rss_bytes = super::summary::peak_rss_bytes();
        (summary, code)
    };
    let (client, lease_client) = match clients(&args, &counter).await {
        Ok(c) => c,
        Err(e) => return fail(pass, dry_run, e, finish, &counter, &budget),
    };

    let mut guard = None;
    let mut lease_writes = 0;
    if !dry_run {
        match take_lease(pass, &args, lease_client).await {
            Ok(Acquired::Held(g)) => {
                lease_writes += 1;
                guard = Some(g);
            }
            Ok(Acquired::HeldBy(message)) => {
                let mut s = Summary::new(pass, dry_run);
                s.outcome = Outcome::Skipped;
                s.message = message;
                return finish(s, 0, &counter, &budget);
            }
            Err(e) => return fail(pass, dry_run, e, finish, &counter, &budget),
        }
    }

    let resume_after = guard.as_ref().and_then(|g| g.cursor.clone());
    let taken_over = guard.as_ref().and_then(|g| g.taken_over.clone());
    let poison = guard.as_ref().map(|g| g.poison.clone()).unwrap_or_default();
    let swept_at = guard.as_ref().and_then(|g| g.swept_at);
    let renewal = guard
        .as_mut()
        .map(|g| g.renew_in_background(budget.clone()));
    let ctx = PassContext {
        pass,
        resume_after,
        poison,
        swept_at,
        recorder: Recorder::new(client.clone(), pass, dry_run),
        args,
        client,
        counter: counter.clone(),
        budget: budget.clone(),
    };
    let progress = super::progress::Progress::start(pass, budget.clone(), counter.clone());
    let mut result = body(ctx).await;
    progress.stop();
    if let Ok(s) = result.as_mut() {
        s.lease_taken_over = taken_over;
    }
    lease_writes += give_up_lease(guard, renewal, &mut result, started_at).await;
    match result {
        Ok(mut s) => {
            s.bookkeeping_writes += lease_writes;
            finish(s, 0, &counter, &budget)
        }
        Err(e) => fail(pass, dry_run, e, finish, &counter, &budget),
    }
}

/// The pass's client and the Lease's: its own, so renewals never queue behind the pass's work.
async fn clients(
    args: &CommonArgs,
    counter: &Arc<RequestCounter>,
) -> Result<(Client, Client), PassError> {
    let config = own_config(args).await?;
    let build = |c| {
        counted_client(c, counter.clone())
            .map_err(|e| PassError::kube("building the Kubernetes client", e))
    };
    Ok((build(config.clone())?, build(config)?))
}

/// Stop renewing, then release the Lease with where the next run resumes and, after a complete
/// full sweep, when it started; a lost Lease is said in the summary. Returns the Lease writes.
async fn give_up_lease(
    guard: Option<Box<lease::LeaseGuard>>,
    renewal: Option<lease::Renewal>,
    result: &mut Result<Summary, PassError>,
    started_at: k8s_openapi::jiff::Timestamp,
) -> u64 {
    let mut writes = 0;
    // Renewal stops before the release, so it cannot write the Lease after we give it up.
    if let Some(r) = renewal {
        let report = r.stop().await;
        writes += report.renewals;
        if let (Some(why), Ok(s)) = (report.lost, result.as_mut()) {
            s.message = if s.message.is_empty() {
                format!("lease lost: {why}")
            } else {
                format!("lease lost: {why}; {}", s.message)
            };
        }
    }
    let Some(g) = guard else {
        return writes;
    };
    // A failed run keeps the previous cursor so no work is skipped.
    let cursor = match &*result {
        Ok(s) => s.resume_after.clone(),
        Err(_) => g.cursor.clone(),
    };
    // A full sweep counts once it covered everything: not stopped early, even before its
    // first root object (no resume point then).
    let swept = match &*result {
        Ok(s)
            if s.sweep == Some(super::summary::Sweep::Full) && s.outcome == Outcome::Completed =>
        {
            Some(started_at)
        }
        _ => None,
    };
    g.release(cursor, swept).await;
    writes + 1
}

/// Take the pass Lease `kbind-<pass>[-<i>-of-<n>]`, renewed later while the pass runs so a
/// killed run's Lease expires one duration after its last renewal. `HeldBy` carries the
/// summary message naming the live holder.
async fn take_lease(
    pass: &'static str,
    args: &CommonArgs,
    client: Client,
) -> Result<Acquired, PassError> {
    let ns = args.lease_namespace();
    let name = lease_name(pass, args);
    let secs = i32::try_from(args.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let holder = lease::holder_identity();
    match lease::acquire(client, &ns, &name, &holder, secs).await {
        Ok(Acquired::Held(g)) => {
            if let Some(previous) = &g.taken_over {
                tracing::info!(lease = %name, %previous, "took over the pass Lease");
            }
            Ok(Acquired::Held(g))
        }
        Ok(Acquired::HeldBy(holder)) => {
            tracing::info!(lease = %name, %holder, "another run holds the pass Lease; skipping");
            Ok(Acquired::HeldBy(format!(
                "Lease {ns}/{name} held by {holder}"
            )))
        }
        Err(e) if e.is_not_found() => Err(PassError::Config(format!(
            "Lease namespace {ns:?} does not exist: create it or pass --lease-namespace"
        ))),
        Err(e) => Err(PassError::kube(format!("taking Lease {ns}/{name}"), e)),
    }
}

/// SIGTERM (a CronJob pod past `activeDeadlineSeconds`, a drained node) ends the budget: the
/// pass takes no new work, finishes what is in flight, records its progress and releases its
/// Lease, as at the deadline, within the pod's grace period. A second SIGTERM exits at once.
fn stop_on_sigterm(budget: Arc<Budget>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::spawn(async move {
                    if term.recv().await.is_some() {
                        tracing::warn!(
                            "SIGTERM: taking no new work; finishing what is in flight and recording progress"
                        );
                        budget.terminate();
                    }
                    if term.recv().await.is_some() {
                        tracing::warn!("second SIGTERM: exiting now");
                        std::process::exit(143);
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGTERM"),
        }
    }
    #[cfg(not(unix))]
    let _ = budget;
}

fn fail(
    pass: &str,
    dry_run: bool,
    e: PassError,
    finish: impl Fn(Summary, i32, &RequestCounter, &Budget) -> (Summary, i32),
    counter: &RequestCounter,
    budget: &Budget,
) -> (Summary, i32) {
    tracing::error!(error = %e, "pass failed");
    let mut s = Summary::new(pass, dry_run);
    s.outcome = Outcome::Failed;
    s.message = e.to_string();
    finish(s, e.exit_code(), counter, budget)
}
