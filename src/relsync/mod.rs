//! `kbind relsync`: one bounded pass that syncs upstream directory memberships (Slack, a 1Password
//! SCIM bridge) into SpiceDB, per RelationshipSource (docs/relsync.md).
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
//!
//! The files, in the order of a run:
//! - `mod.rs`: [`run`] — observe the sources, clean up deleted ones, order the due ones, give
//!   each its turn, record; `source.rs`: one source's turn, step by step;
//! - observe: `auth.rs` (the source's credential, admitted by `hosts.rs`), `kinds/` (each
//!   upstream service: enumerate scopes, fetch a scope's members, paced by `ratelimit.rs`,
//!   bounded by `limits.rs`), `join.rs` (upstream members to SpiceDB subjects);
//! - plan (pure): `plan.rs` (due order, windows, diffs, the reap decision), `encode.rs` (object
//!   ids);
//! - apply: `apply.rs` (one scope's diff written in batches, cross-resource edges, the reap;
//!   `held.rs`, the compact snapshot of what SpiceDB holds that a large window diffs against;
//!   `ahead.rs`, the walk's slots, which scopes waiting for that snapshot leave to the next),
//!   `spicedb/` (the relationship store and its HTTP gateway client), `cleanup.rs` (deleted
//!   sources and the finalizer);
//! - record: `record.rs` (the source's status: computed purely, written once per source).

pub mod ahead;
pub mod apply;
pub mod args;
pub mod auth;
pub mod cleanup;
pub mod encode;
pub mod held;
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

use crate::api::relsync::RelationshipSource;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, list, lock, shard};
use args::RelsyncArgs;
use auth::Token;
use join::Directory;
use kinds::{KindConfig, Upstreams};
use record::Outcome;
use spicedb::HttpStore;

pub const PASS: &str = "relsync";

/// Windows of at least this many scopes read SpiceDB in bulk (see `apply::snapshot`).
const SNAPSHOT_MIN: usize = 32;

/// Why a source could not even start (Ready=False), phrased for the condition.
struct Refusal {
    reason: &'static str,
    message: String,
}

/// Read the SpiceDB preshared key from `--spicedb-token-file` or `--spicedb-token-secret`.
async fn spicedb_token(client: &Client, args: &RelsyncArgs) -> Result<Token, PassError> {
    if let Some(path) = &args.spicedb_token_file {
        let t = std::fs::read_to_string(path).map_err(|e| {
            PassError::invalid(format!("--spicedb-token-file {}", path.display()), e)
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
            .map_err(|e| PassError::kube(format!("reading Secret {ns}/{name}"), e))?;
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
        .map_err(|e| match &e {
            // Granted per namespace with the credentials, never cluster-wide (docs/relsync.md "RBAC").
            kube::Error::Api(s) if s.code == 403 => Refusal {
                reason: "PermissionDenied",
                message: format!(
                    "may not read ConfigMap {ns}/{}: namespace {ns} has no RoleBinding granting relsync's ServiceAccount the ClusterRole kbind-relsync-credentials; a namespace admin creates one as deploy/components/directory/relsync-credentials-example.yaml shows",
                    r.name
                ),
            },
            _ => Refusal {
                reason: "DirectoryUnreadable",
                message: format!(
                    "reading ConfigMap {:?}: {}",
                    r.name,
                    e
                ),
            },
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
    let store = spicedb_store(&ctx, &args).await?;
    // Checked once, before any source. An unreachable SpiceDB still lets this run say, on each
    // deleted source, why its finalizer stays; then the pass fails.
    let reachable = store.ping().await;
    let unreachable = reachable.as_ref().err().map(ToString::to_string);

    // Observe.
    let mut mine = observe_sources(&ctx, &args, &mut summary).await?;
    let writes = Mutex::new(Writes::new(ctx.args.dry_run));

    // Deleted sources first, due or not: they take their relationships with them.
    for src in mine
        .iter()
        .filter(|s| cleanup::deleting(s) && cleanup::has_finalizer(s))
    {
        cleanup::clean_up(
            &ctx,
            &store,
            unreachable.as_ref(),
            src,
            &writes,
            &mut summary,
        )
        .await;
    }
    if let Err(e) = reachable {
        return Err(PassError::unreachable("SpiceDB", e));
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
    cleanup::add_finalizers(&ctx, &mut mine, &writes).await?;

    let order = due_order(&args, &mine, &mut summary);
    let stopped = sync_due(&ctx, &args, &store, (&mine, order), &writes, &mut summary).await?;
    let w = writes.into_inner().unwrap_or_else(|e| e.into_inner());
    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!("stopped early ({why}); the next run continues"),
        resume_after: None,
    });
    summary.finish(w, stopped);
    Ok(summary)
}

/// Sync the due sources in `order`, each with an equal share of what is left of the deadline;
/// returns why the run stopped early, if it did.
async fn sync_due(
    ctx: &PassContext,
    args: &RelsyncArgs,
    store: &HttpStore,
    (mine, order): (&[RelationshipSource], Vec<String>),
    writes: &Mutex<Writes>,
    summary: &mut Summary,
) -> Result<Option<String>, PassError> {
    let upstreams = Upstreams {
        slack_api_url: args.slack_api_url.clone(),
        rate: ratelimit::Rate {
            pace: args.pace,
            scale: args.upstream_rate_scale,
        },
        limits: limits::Limits::of(ctx, args),
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
            source::sync_source(ctx, args, store, &upstreams, src, writes, turn.clone()).await?;
        if turn.remaining().is_zero() && ctx.budget.check().is_ok() {
            summary.count("sourcesOutOfShare", 1);
            out_of_share += 1;
        }
        summary.count("upstreamThrottles", throttles as i64);
        count_source(summary, &k, &rec);
        record_source(ctx, src, &rec, writes).await?;
    }
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
    Ok(stopped)
}

/// The SpiceDB store, its requests ending with the pass. Upstream work stops where the budget
/// does (the deadline less its margin); SpiceDB work in flight may use half of the margin; the
/// rest is for recording status.
async fn spicedb_store(ctx: &PassContext, args: &RelsyncArgs) -> Result<HttpStore, PassError> {
    let url = args
        .spicedb_url
        .clone()
        .ok_or_else(|| PassError::Config("--spicedb-url is required".into()))?;
    let token = spicedb_token(&ctx.client, args).await?;
    let stop_at = Instant::now() + ctx.budget.remaining();
    let pass_end = Instant::now() + ctx.args.deadline.saturating_sub(ctx.budget.elapsed());
    let spicedb_end = stop_at + pass_end.saturating_duration_since(stop_at) / 2;
    Ok(HttpStore::with_limits(
        &url,
        token,
        ctx.args.request_timeout,
        args.max_response_bytes,
    )
    .map_err(|e| PassError::invalid("--spicedb-url", e))?
    .ending_at(spicedb_end))
}

/// This run's RelationshipSources: the namespace and selector's, this shard's share, or the one
/// `--source` names.
async fn observe_sources(
    ctx: &PassContext,
    args: &RelsyncArgs,
    summary: &mut Summary,
) -> Result<Vec<RelationshipSource>, PassError> {
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
        _ => PassError::kube("listing RelationshipSources", e),
    })?;
    summary.count("sources", sources.len() as i64);
    Ok(sources
        .into_iter()
        .filter(|s| {
            let k = key(s);
            shard::owns(ctx.args.shard, &k) && args.source.as_ref().is_none_or(|only| &k == only)
        })
        .collect())
}

/// The due sources' keys, least recently synced first (`--source`: that one, due or not).
fn due_order(
    args: &RelsyncArgs,
    mine: &[RelationshipSource],
    summary: &mut Summary,
) -> Vec<String> {
    let now = Timestamp::now().as_second();
    let mut due = Vec::new();
    for s in mine {
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
    plan::order_due(due)
}

/// Add one source's record to the summary's counts.
fn count_source(summary: &mut Summary, k: &str, rec: &record::PassRecord) {
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
}

/// Write one source's status (sync progress, lastPass, conditions).
async fn record_source(
    ctx: &PassContext,
    src: &RelationshipSource,
    rec: &record::PassRecord,
    writes: &Mutex<Writes>,
) -> Result<(), PassError> {
    let k = key(src);
    let ns = src.namespace().unwrap_or_default();
    let sapi: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
    let go = lock(writes).will(
        "apply-status",
        format!("RelationshipSource {k}"),
        "sync progress, lastPass, conditions",
    );
    if go {
        let wrote = record::write(&sapi, &src.name_any(), src, rec, &ctx.field_manager())
            .await
            .map_err(|e| {
                PassError::kube(format!("recording status of RelationshipSource {k}"), e)
            })?;
        if wrote {
            lock(writes).bookkeeping_done();
        }
    }
    Ok(())
}
