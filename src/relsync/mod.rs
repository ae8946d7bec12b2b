//! `kbind relsync`: one bounded pass that syncs upstream directory memberships (Slack, a 1Password
//! SCIM bridge) into SpiceDB, per RelationshipSource (spec 002).
//!
//! observe  list RelationshipSources (this shard, namespace, selector); pick the due ones,
//!          least-recently-synced first
//! per source: in its turn — an equal share of what is left of the deadline (`limits`) —
//!          resolve kind + config + credential (allowedHosts before any request), enumerate
//!          scopes (sorted), take those after `status.sync.resumeAfter` up to the budget
//! apply    per scope: whole membership → join → diff against SpiceDB → batched writes
//!          (bounded concurrency, paced below the upstream's limits); cross-resource edges;
//!          the reap, only on a pass that covered every enumerated scope
//! record   status (cursor, lastPass, conditions) under `kbind-relsync`
//!
//! Before any due source, every run handles the deleted ones (their relationships are deleted
//! from SpiceDB, then the finalizer `kbind.io/relsync-cleanup` is released) and adds that
//! finalizer to live sources that lack it (see `cleanup`).

pub mod apply;
pub mod auth;
pub mod cleanup;
pub mod encode;
pub mod hosts;
pub mod join;
pub mod kinds;
pub mod limits;
pub mod plan;
pub mod ratelimit;
pub mod record;
mod source;
pub mod spicedb;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::api::relsync::{CLEANUP_FINALIZER, RelationshipSource};
use crate::cli::RelsyncArgs;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, list, shard};
use auth::Token;
use join::Directory;
use kinds::{KindConfig, Upstreams};
use record::Outcome;
use spicedb::{HttpStore, RelationshipStore};

pub const PASS: &str = "relsync";

/// Windows of at least this many scopes read SpiceDB in bulk (see `apply::prefetch`).
const PREFETCH_MIN: usize = 32;

/// Why a source could not even start (Ready=False), phrased for the condition.
struct Refusal {
    reason: &'static str,
    message: String,
}

/// Read the SpiceDB preshared key from `--spicedb-token-file` or `--spicedb-token-secret`.
async fn spicedb_token(client: &Client, args: &RelsyncArgs) -> Result<Token, PassError> {
    if let Some(path) = &args.spicedb_token_file {
        let t = std::fs::read_to_string(path).map_err(|e| {
            PassError::Config(format!("--spicedb-token-file {}: {e}", path.display()))
        })?;
        return Ok(Token::new(t.trim()));
    }
    if let Some(r) = &args.spicedb_token_secret {
        let parts: Vec<&str> = r.split('/').collect();
        let [ns, name, key] = parts.as_slice() else {
            return Err(PassError::Config(format!(
                "--spicedb-token-secret {r:?}: expected namespace/name/key"
            )));
        };
        let s = Api::<Secret>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .map_err(|e| PassError::kube(format!("reading Secret {ns}/{name}"), &e))?;
        let v = s
            .data
            .and_then(|d| {
                d.get(*key)
                    .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
            })
            .filter(|v| !v.is_empty())
            .ok_or_else(|| PassError::Config(format!("Secret {ns}/{name} has no key {key:?}")))?;
        return Ok(Token::new(v));
    }
    Err(PassError::Config(
        "the SpiceDB preshared key is required: --spicedb-token-file or --spicedb-token-secret"
            .into(),
    ))
}

/// Load the join directory, if the config names one.
async fn directory(client: &Client, ns: &str, cfg: &KindConfig) -> Result<Directory, Refusal> {
    let Some(d) = &cfg.join().directory else {
        return Ok(Directory::Derived);
    };
    let r = &d.config_map_ref;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(&r.name)
        .await
        .map_err(|e| Refusal {
            reason: "DirectoryUnreadable",
            message: format!(
                "reading ConfigMap {:?}: {}",
                r.name,
                crate::scrub::scrub(&e.to_string())
            ),
        })?
        .ok_or_else(|| Refusal {
            reason: "DirectoryNotFound",
            message: format!("join directory ConfigMap {:?} not found", r.name),
        })?;
    let text = cm
        .data
        .and_then(|d| d.get(&r.key).cloned())
        .ok_or_else(|| Refusal {
            reason: "DirectoryNotFound",
            message: format!(
                "join directory ConfigMap {:?} has no key {:?}",
                r.name, r.key
            ),
        })?;
    Directory::parse(&text).map_err(|e| Refusal {
        reason: "InvalidDirectory",
        message: format!("ConfigMap {:?} key {:?}: {e}", r.name, r.key),
    })
}

fn key(s: &RelationshipSource) -> String {
    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())
}

pub async fn run(ctx: PassContext, args: RelsyncArgs) -> Result<Summary, PassError> {
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let url = args
        .spicedb_url
        .clone()
        .ok_or_else(|| PassError::Config("--spicedb-url is required".into()))?;
    let token = spicedb_token(&ctx.client, &args).await?;
    // Upstream work stops where the budget does (the deadline less its margin); SpiceDB work in
    // flight may use half of the margin; the rest is for recording status.
    let stop_at = Instant::now() + ctx.budget.remaining();
    let pass_end = Instant::now() + ctx.args.deadline.saturating_sub(ctx.budget.elapsed());
    let spicedb_end = stop_at + pass_end.saturating_duration_since(stop_at) / 2;
    let store = HttpStore::with_limits(
        &url,
        token,
        ctx.args.request_timeout,
        args.max_response_bytes,
    )
    .map_err(|e| PassError::Config(format!("--spicedb-url: {e}")))?
    .ending_at(spicedb_end);
    // Checked once, before any source. An unreachable SpiceDB still lets this run say, on each
    // deleted source, why its finalizer stays; then the pass fails.
    let reachable = store
        .ping()
        .await
        .map_err(|e| crate::scrub::scrub(&e.to_string()));

    // Observe.
    let api: Api<RelationshipSource> = match &args.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let mut lp = ListParams::default();
    if let Some(sel) = &args.selector {
        lp = lp.labels(sel);
    }
    let sources = list::all(&api, &lp).await.map_err(|e| match &e {
        kube::Error::Api(s) if s.code == 400 => {
            PassError::Config(format!("--selector: {}", s.message))
        }
        _ => PassError::kube("listing RelationshipSources", &e),
    })?;
    summary.count("sources", sources.len() as i64);
    let mut mine: Vec<RelationshipSource> = sources
        .into_iter()
        .filter(|s| {
            let k = key(s);
            shard::owns(ctx.args.shard, &k) && args.source.as_ref().is_none_or(|only| &k == only)
        })
        .collect();
    let writes = Mutex::new(Writes::new(ctx.args.dry_run));

    // Deleted sources first, due or not: they take their relationships with them.
    for src in mine
        .iter()
        .filter(|s| cleanup::deleting(s) && cleanup::has_finalizer(s))
    {
        clean_up(
            &ctx,
            &store,
            reachable.as_ref().err(),
            src,
            &writes,
            &mut summary,
        )
        .await;
    }
    if let Err(message) = reachable {
        return Err(PassError::Unreachable {
            what: "SpiceDB".into(),
            message,
        });
    }
    if let Some(only) = &args.source
        && mine.is_empty()
    {
        return Err(PassError::Config(format!(
            "--source {only}: no such RelationshipSource (in this shard)"
        )));
    }
    // A deleted source is never synced, whoever's finalizer keeps it.
    mine.retain(|s| !cleanup::deleting(s));

    // Live sources carry the finalizer before their first SpiceDB write.
    let finalizer_manager = cleanup::manager(&ctx.field_manager());
    let mut gone = Vec::new();
    for src in mine.iter_mut().filter(|s| !cleanup::has_finalizer(s)) {
        let k = key(src);
        let go = lock(&writes).will(
            "add finalizer",
            format!("RelationshipSource {k}"),
            CLEANUP_FINALIZER,
        );
        if !go {
            continue;
        }
        let ns = src.namespace().unwrap_or_default();
        let sapi: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
        match cleanup::add_finalizer(&sapi, src, &finalizer_manager)
            .await
            .map_err(|e| {
                PassError::kube(
                    format!("adding finalizer {CLEANUP_FINALIZER} to RelationshipSource {k}"),
                    &e,
                )
            })? {
            Some(updated) => {
                *src = updated;
                lock(&writes).bookkeeping_done();
            }
            None => gone.push(k),
        }
    }
    mine.retain(|s| !gone.contains(&key(s)));

    let now = Timestamp::now().as_second();
    let mut due = Vec::new();
    for s in &mine {
        let k = key(s);
        if args.source.is_some() {
            due.push((k, None));
            continue;
        }
        let interval =
            plan::parse_interval(s.spec.sync.as_ref().and_then(|x| x.interval.as_deref()))
                .unwrap_or(plan::DEFAULT_INTERVAL);
        if plan::is_due(s.status.as_ref(), s.metadata.generation, interval, now) {
            due.push((k, plan::last_pass_time(s.status.as_ref())));
        }
    }
    summary.count("sourcesDue", due.len() as i64);
    let order = plan::order_due(due);
    let upstreams = Upstreams {
        slack_api_url: args.slack_api_url.clone(),
        rate_scale: args.upstream_rate_scale,
        limits: limits::Limits {
            max_response_bytes: args.max_response_bytes,
            request_timeout: ctx.args.request_timeout,
            max_pages: args.max_pages,
        },
    };
    let mut stopped = None;
    let mut out_of_share = 0;
    let n = order.len();
    for (i, k) in order.into_iter().enumerate() {
        if let Err(why) = ctx.budget.check() {
            stopped = Some(format!("{why:?}"));
            summary.count("sourcesDeferred", 1);
            continue;
        }
        let Some(src) = mine.iter().find(|s| key(s) == k) else {
            continue;
        };
        // Each due source gets an equal share of what is left, so one slow or hostile upstream
        // cannot take the others' time (docs/relsync.md "Bounds").
        let share = limits::share(ctx.budget.remaining(), n - i, args.min_source_share);
        let turn = Arc::new(limits::Turn::new(ctx.budget.clone(), share));
        tracing::debug!(source = %k, share = ?turn.share(), "source's turn");
        let (rec, throttles) =
            source::sync_source(&ctx, &args, &store, &upstreams, src, &writes, turn.clone())
                .await?;
        if turn.remaining().is_zero() && ctx.budget.check().is_ok() {
            summary.count("sourcesOutOfShare", 1);
            out_of_share += 1;
        }
        summary.count("upstreamThrottles", throttles as i64);
        let c = &rec.counts;
        summary.count("scopesProcessed", i64::from(c.scopes_processed));
        summary.count("relationshipsWritten", i64::from(c.written));
        summary.count("relationshipsPruned", i64::from(c.pruned));
        summary.count("reapedScopes", i64::from(c.reaped_scopes));
        summary.count("joinMisses", i64::from(c.join_misses));
        summary.count("scopeErrors", rec.errors.len() as i64);
        if !rec.reached_end && rec.outcome == Outcome::Ran && !rec.scoped {
            summary.count("sourcesIncomplete", 1);
        }
        if let Outcome::Refused { reason, .. } | Outcome::EnumerationFailed { reason, .. } =
            &rec.outcome
        {
            summary.count("sourcesNotReady", 1);
            tracing::warn!(source = %k, reason, "source not synced");
        }
        if let Outcome::OutOfTime { .. } = &rec.outcome {
            summary.count("sourcesNotReady", 1);
            tracing::warn!(source = %k, reason = record::DEADLINE_EXCEEDED, "source not synced: its share of the deadline ran out while enumerating");
        }
        let ns = src.namespace().unwrap_or_default();
        let sapi: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
        let go = lock(&writes).will(
            "apply-status",
            format!("RelationshipSource {k}"),
            "sync progress, lastPass, conditions",
        );
        if go {
            let wrote = record::write(&sapi, &src.name_any(), src, &rec, &ctx.field_manager())
                .await
                .map_err(|e| {
                    PassError::kube(format!("recording status of RelationshipSource {k}"), &e)
                })?;
            if wrote {
                lock(&writes).bookkeeping_done();
            }
        }
    }
    let w = writes.into_inner().unwrap_or_else(|e| e.into_inner());
    if stopped.is_none()
        && let Err(why) = ctx.budget.check()
    {
        stopped = Some(format!("{why:?}"));
    }
    if stopped.is_none() && out_of_share > 0 {
        stopped = Some(format!(
            "{out_of_share} source(s) used up their share of the deadline"
        ));
    }
    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!("stopped early ({why}); the next run continues"),
        resume_after: None,
    });
    summary.finish(w, stopped);
    Ok(summary)
}

/// One deleted source that still carries our finalizer: delete its relationships from SpiceDB,
/// then release the finalizer. A failure leaves the finalizer and says why on the source
/// (`Ready=False CleanupFailed`); the next run retries. Never fails the pass: one source's
/// cleanup must not hold up the others.
async fn clean_up<S: RelationshipStore>(
    ctx: &PassContext,
    store: &S,
    unreachable: Option<&String>,
    src: &RelationshipSource,
    writes: &Mutex<Writes>,
    summary: &mut Summary,
) {
    let k = key(src);
    let ns = src.namespace().unwrap_or_default();
    let api: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
    // Deleting costs no --max-items; only the deadline (or SIGTERM) defers it to the next run.
    if unreachable.is_none() && ctx.budget.remaining().is_zero() {
        summary.count("sourcesCleanupDeferred", 1);
        return;
    }
    let deleted = match unreachable {
        Some(m) => Err(format!("SpiceDB is unreachable: {m}")),
        None => {
            let prefix = plan::source_prefix(&ns, &src.name_any());
            cleanup::delete_relationships(store, &prefix, writes)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let failure = match deleted {
        Ok(n) => {
            summary.count("relationshipsDeleted", i64::try_from(n).unwrap_or(i64::MAX));
            let go = lock(writes).will(
                "release finalizer",
                format!("RelationshipSource {k}"),
                CLEANUP_FINALIZER,
            );
            if !go {
                return;
            }
            let manager = cleanup::manager(&ctx.field_manager());
            match cleanup::release_finalizer(&api, src, &manager).await {
                Ok(()) => {
                    lock(writes).bookkeeping_done();
                    summary.count("sourcesCleanedUp", 1);
                    tracing::info!(source = %k, relationships = n, "deleted source: its relationships are deleted and its finalizer released");
                    return;
                }
                Err(e) => format!(
                    "its relationships were deleted from SpiceDB but finalizer {CLEANUP_FINALIZER} could not be released; the next run retries: {e}"
                ),
            }
        }
        Err(e) => format!(
            "its relationships could not be deleted from SpiceDB, so finalizer {CLEANUP_FINALIZER} stays; the next run retries: {e}"
        ),
    };
    let failure = crate::scrub::scrub(&failure);
    summary.count("sourcesCleanupFailed", 1);
    tracing::warn!(source = %k, reason = %failure, "deleted source not cleaned up yet");
    let go = lock(writes).will(
        "apply-status",
        format!("RelationshipSource {k}"),
        "Ready=False CleanupFailed",
    );
    if !go {
        return;
    }
    let now = Timestamp::now();
    match record::apply(
        &api,
        &src.name_any(),
        src,
        &ctx.field_manager(),
        |prev, generation| record::cleanup_failed(prev, generation, &failure, now),
    )
    .await
    {
        Ok(true) => lock(writes).bookkeeping_done(),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(source = %k, error = %crate::scrub::scrub(&e.to_string()), "recording the cleanup failure")
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
