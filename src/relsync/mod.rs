//! `kbind relsync`: one bounded pass that syncs upstream directory memberships (Slack, a 1Password
//! SCIM bridge) into SpiceDB, per RelationshipSource (spec 002).
//!
//! observe  list RelationshipSources (this shard, namespace, selector); pick the due ones,
//!          least-recently-synced first
//! per source: resolve kind + config + credential (allowedHosts before any request), enumerate
//!          scopes (sorted), take those after `status.sync.resumeAfter` up to the budget
//! apply    per scope: whole membership → join → diff against SpiceDB → batched writes
//!          (bounded concurrency, paced below the upstream's limits); cross-resource edges;
//!          the reap, only on a pass that covered every enumerated scope
//! record   status (cursor, lastPass, conditions) under `kbind-relsync`

pub mod apply;
pub mod auth;
pub mod encode;
pub mod hosts;
pub mod join;
pub mod kinds;
pub mod plan;
pub mod ratelimit;
pub mod record;
pub mod spicedb;

use std::collections::BTreeSet;
use std::sync::Mutex;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::api::relsync::{LastPass, RelationshipSource, ScopeErrorSample};
use crate::cli::RelsyncArgs;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, list, shard};
use apply::{ScopeResult, SourceCtx, Stats};
use auth::Token;
use join::Directory;
use kinds::{KindConfig, Upstreams};
use plan::Coverage;
use record::{Outcome, PassRecord, sample};
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
    let store = HttpStore::new(&url, token)
        .map_err(|e| PassError::Config(format!("--spicedb-url: {e}")))?;
    store.ping().await.map_err(|e| PassError::Unreachable {
        what: "SpiceDB".into(),
        message: crate::scrub::scrub(&e.to_string()),
    })?;

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
    let now = Timestamp::now().as_second();
    let mut due = Vec::new();
    for s in &sources {
        let k = key(s);
        if !shard::owns(ctx.args.shard, &k) {
            continue;
        }
        if let Some(only) = &args.source {
            if &k == only {
                due.push((k, None));
            }
            continue;
        }
        let interval =
            plan::parse_interval(s.spec.sync.as_ref().and_then(|x| x.interval.as_deref()))
                .unwrap_or(plan::DEFAULT_INTERVAL);
        if plan::is_due(s.status.as_ref(), s.metadata.generation, interval, now) {
            let last = s
                .status
                .as_ref()
                .and_then(|st| st.sync.as_ref())
                .and_then(|y| y.last_sync_time.as_ref())
                .map(|t| t.0.as_second());
            due.push((k, last));
        }
    }
    if let Some(only) = &args.source
        && due.is_empty()
    {
        return Err(PassError::Config(format!(
            "--source {only}: no such RelationshipSource (in this shard)"
        )));
    }
    summary.count("sources", sources.len() as i64);
    summary.count("sourcesDue", due.len() as i64);
    let order = plan::order_due(due);
    let upstreams = Upstreams {
        slack_api_url: args.slack_api_url.clone(),
        rate_scale: args.upstream_rate_scale,
    };
    let writes = Mutex::new(Writes::new(ctx.args.dry_run));
    let mut stopped = None;
    for k in order {
        if let Err(why) = ctx.budget.check() {
            stopped = Some(format!("{why:?}"));
            summary.count("sourcesDeferred", 1);
            continue;
        }
        let Some(src) = sources.iter().find(|s| key(s) == k) else {
            continue;
        };
        let (rec, throttles) = sync_source(&ctx, &args, &store, &upstreams, src, &writes).await?;
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
        let ns = src.namespace().unwrap_or_default();
        let sapi: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
        let go = lock(&writes).will(
            "apply-status",
            format!("RelationshipSource {k}"),
            "sync progress, lastPass, conditions",
        );
        if go {
            record::write(&sapi, &src.name_any(), src, &rec, &ctx.field_manager())
                .await
                .map_err(|e| {
                    PassError::kube(format!("recording status of RelationshipSource {k}"), &e)
                })?;
            lock(&writes).bookkeeping_done();
        }
    }
    let w = writes.into_inner().unwrap_or_else(|e| e.into_inner());
    summary.data_writes = w.data;
    summary.bookkeeping_writes = w.bookkeeping;
    summary.planned = w.planned;
    summary.outcome = if ctx.args.dry_run {
        "dry-run".into()
    } else {
        "completed".into()
    };
    if stopped.is_none()
        && let Err(why) = ctx.budget.check()
    {
        stopped = Some(format!("{why:?}"));
    }
    if let Some(why) = stopped {
        summary.outcome = "partial".into();
        summary.message = format!("stopped early ({why}); the next run continues");
    }
    Ok(summary)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn refused(scoped: bool, reason: &'static str, message: String) -> PassRecord {
    PassRecord {
        scoped,
        outcome: Outcome::Refused { reason, message },
        continued_cycle: true,
        reached_end: false,
        last_done: None,
        counts: LastPass::default(),
        errors: Vec::new(),
        reap: Err(plan::Deferral::EnumerationFailed),
    }
}

/// One source: resolve, enumerate, walk its window of scopes, cross-resource edges, reap.
async fn sync_source<S: RelationshipStore>(
    ctx: &PassContext,
    args: &RelsyncArgs,
    store: &S,
    upstreams: &Upstreams,
    src: &RelationshipSource,
    writes: &Mutex<Writes>,
) -> Result<(PassRecord, u64), PassError> {
    let scoped = !args.scopes.is_empty();
    let ns = src.namespace().unwrap_or_default();
    let spec = &src.spec;
    if let Err(e) = plan::parse_interval(spec.sync.as_ref().and_then(|s| s.interval.as_deref())) {
        return Ok((refused(scoped, "InvalidInterval", e), 0));
    }
    let cfg = match KindConfig::parse(&spec.kind, spec.config.as_ref(), spec.base_url.as_deref()) {
        Ok(c) => c,
        Err(e) => return Ok((refused(scoped, e.reason(), e.to_string()), 0)),
    };
    let cred = match auth::resolve(&ctx.client, &ns, src).await {
        Ok(c) => c,
        Err(e) => return Ok((refused(scoped, e.reason(), e.to_string()), 0)),
    };
    let dir = match directory(&ctx.client, &ns, &cfg).await {
        Ok(d) => d,
        Err(r) => return Ok((refused(scoped, r.reason, r.message), 0)),
    };
    let kind = match kinds::build(&cfg, &cred, upstreams, ctx.budget.clone()) {
        Ok(k) => k,
        Err(e) => {
            return Ok((
                refused(scoped, "InvalidConfig", crate::scrub::scrub(&e.to_string())),
                0,
            ));
        }
    };
    let prefix = plan::source_prefix(&ns, &src.name_any());
    let mut sctx = SourceCtx {
        store,
        kind: kind.as_ref(),
        prefix: &prefix,
        directory: &dir,
        writes,
        held_cache: None,
        cached_kinds: BTreeSet::new(),
    };

    // Which scopes: the explicit ones, or the enumeration after the cursor.
    let prev_sync = src
        .status
        .as_ref()
        .and_then(|s| s.sync.clone())
        .unwrap_or_default();
    let continued = !scoped && plan::cycle_in_progress(src.status.as_ref());
    let (scopes, enumerated, from_start, at_end) = if scoped {
        let mut v = Vec::new();
        for id in &args.scopes {
            v.push(kind.scope(id).ok_or_else(|| {
                PassError::Config(format!("--scope {id:?} is not a scope id of kind {} (e.g. channel/C123, usergroup/S1, group/abc)", spec.kind))
            })?);
        }
        (v, Vec::new(), false, false)
    } else {
        let t = std::time::Instant::now();
        match kind.enumerate().await {
            Ok(all) => {
                tracing::info!(source = %key(src), scopes = all.len(), seconds = t.elapsed().as_secs_f64(), "enumerated");
                let resume = if continued {
                    prev_sync.resume_after.as_str()
                } else {
                    ""
                };
                let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
                let limit = spec
                    .sync
                    .as_ref()
                    .and_then(|s| s.max_scopes_per_pass)
                    .filter(|n| *n > 0)
                    .map(|n| n as usize);
                let (a, b, end) = plan::window(&ids, resume, limit);
                (all[a..b].to_vec(), all, a == 0, end)
            }
            Err(e) => {
                let reason = if matches!(e, kinds::KindError::Auth { .. }) {
                    "UpstreamAuthFailed"
                } else {
                    "EnumerationFailed"
                };
                let msg = crate::scrub::scrub(&e.to_string());
                let mut rec = refused(false, reason, format!("enumerating scopes: {msg}"));
                rec.outcome = Outcome::EnumerationFailed {
                    reason,
                    message: format!("enumerating scopes: {msg}"),
                };
                rec.errors = vec![sample("", &msg)];
                return Ok((rec, 0));
            }
        }
    };

    // A large window reads what SpiceDB holds in one stream per object type rather than one
    // read per scope (SpiceDB, not the upstream, is then the cheaper side).
    if scopes.len() >= PREFETCH_MIN {
        let kinds: BTreeSet<&'static str> = scopes.iter().map(|s| s.object_type).collect();
        match apply::prefetch(store, &prefix, &kinds).await {
            Ok(c) => {
                sctx.held_cache = Some(c);
                sctx.cached_kinds = kinds;
            }
            Err(e) => {
                tracing::warn!(source = %key(src), error = %crate::scrub::scrub(&e.to_string()), "bulk read failed; reading per scope")
            }
        }
    }
    let sctx = sctx;

    // Walk the window in order with bounded concurrency; results come back in order, so the
    // cursor is the last scope before the first one not done.
    let budget = ctx.budget.clone();
    let walk_started = std::time::Instant::now();
    let sctx_ref = &sctx;
    let mut results = futures::stream::iter(scopes.iter())
        .map(|scope| {
            let budget = budget.clone();
            async move {
                if let Err(why) = budget.take() {
                    return (scope, ScopeResult::Stopped(format!("{why:?}")));
                }
                (scope, sctx_ref.process(scope).await)
            }
        })
        .buffered(args.concurrency.max(1));
    let mut total = Stats::default();
    let mut errors: Vec<ScopeErrorSample> = Vec::new();
    let mut last_done = None;
    let mut processed = 0i32;
    let mut stopped = false;
    while let Some((scope, r)) = results.next().await {
        match r {
            ScopeResult::Done(s) => {
                total.written += s.written;
                total.pruned += s.pruned;
                total.reaped += s.reaped;
                total.misses.extend(s.misses);
            }
            ScopeResult::Failed(msg) => errors.push(sample(&scope.id, &msg)),
            ScopeResult::Stopped(why) => {
                tracing::info!(source = %key(src), scope = %scope.id, %why, "stopping this source's walk; the next pass resumes here");
                stopped = true;
                break;
            }
        }
        processed += 1;
        last_done = Some(scope.id.clone());
    }
    drop(results);
    tracing::info!(source = %key(src), processed, seconds = walk_started.elapsed().as_secs_f64(), "scopes walked");
    let reached_end = at_end && !stopped;
    let mut coverage = Coverage {
        scoped,
        enumeration_ok: !scoped,
        enumerated: enumerated.len(),
        from_start,
        reached_end,
        scope_errors: errors.len(),
        cross_ok: true,
    };
    let mut reap = plan::reap_decision(&coverage);
    if !scoped && !stopped {
        match sctx.cross(reap.is_ok()).await {
            Ok((s, cross_objects)) => {
                total.written += s.written;
                total.pruned += s.pruned;
                if reap.is_ok() {
                    let mut keep: BTreeSet<_> = enumerated
                        .iter()
                        .map(|s| sctx.object(s.object_type, &s.upstream_id))
                        .collect();
                    keep.extend(cross_objects);
                    match sctx.reap(&keep).await {
                        Ok(s) => {
                            total.pruned += s.pruned;
                            total.reaped += s.reaped;
                        }
                        Err(e) => {
                            errors.push(sample("", &format!("reap scan: {e}")));
                            reap = Err(plan::Deferral::ScopeErrors);
                        }
                    }
                }
            }
            Err(e) => {
                errors.push(sample("", &format!("cross-resource edges: {e}")));
                coverage.cross_ok = false;
                reap = plan::reap_decision(&coverage);
            }
        }
    } else if !scoped {
        reap = Err(plan::Deferral::PartialCoverage);
    }
    let throttles = kind.throttles();
    if throttles > 0 {
        tracing::info!(source = %key(src), throttles, "upstream throttled this pass; backed off and retried");
    }
    let rec = PassRecord {
        scoped,
        outcome: Outcome::Ran,
        continued_cycle: continued,
        reached_end,
        last_done,
        counts: LastPass {
            join_misses: i32::try_from(total.misses.len()).unwrap_or(i32::MAX),
            pruned: i32::try_from(total.pruned).unwrap_or(i32::MAX),
            reaped_scopes: i32::try_from(total.reaped).unwrap_or(i32::MAX),
            scopes_processed: processed,
            written: i32::try_from(total.written).unwrap_or(i32::MAX),
            ..Default::default()
        },
        errors,
        reap,
    };
    Ok((rec, throttles))
}
