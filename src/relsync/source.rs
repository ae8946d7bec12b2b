//! One source in one pass: resolve kind, config and credential (nothing is sent before they
//! are admitted), enumerate or take the explicit scopes, walk the window in order with bounded
//! concurrency, write cross-resource edges, and reap only on full coverage. Everything the
//! source sends upstream ends with its turn (`limits::Turn`). Returns what the status records.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::ResourceExt;

use super::apply::{self, ScopeResult, SourceCtx, Stats};
use super::args::RelsyncArgs;
use super::kinds::{self, KindConfig, Upstreams};
use super::limits::Turn;
use super::plan::{self, Coverage};
use super::record::{Outcome, PassRecord, sample};
use super::spicedb::RelationshipStore;
use super::{PREFETCH_MIN, auth, directory, key};
use crate::api::relsync::{LastPass, RelationshipSource, ScopeErrorSample};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError};

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

/// One source in its `turn`: resolve, enumerate, walk its window of scopes, cross-resource
/// edges, reap.
pub(super) async fn sync_source<S: RelationshipStore>(
    ctx: &PassContext,
    args: &RelsyncArgs,
    store: &S,
    upstreams: &Upstreams,
    src: &RelationshipSource,
    writes: &Mutex<Writes>,
    turn: Arc<Turn>,
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
    let cred = match auth::resolve(&ctx.client, &ns, src, cfg.fixed_endpoint(upstreams)).await {
        Ok(c) => c,
        Err(e) => return Ok((refused(scoped, e.reason(), e.to_string()), 0)),
    };
    let dir = match directory(&ctx.client, &ns, &cfg).await {
        Ok(d) => d,
        Err(r) => return Ok((refused(scoped, r.reason, r.message), 0)),
    };
    let kind = match kinds::build(&cfg, &cred, upstreams, turn.clone()) {
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
                let limit =
                    plan::scope_limit(spec.sync.as_ref().and_then(|s| s.max_scopes_per_pass));
                let (a, b, end) = plan::window(&ids, resume, limit);
                (all[a..b].to_vec(), all, a == 0, end)
            }
            Err(e) => {
                let reason = e.enumeration_reason();
                let msg = crate::scrub::scrub(&cred.token.redact(&e.to_string()));
                let mut rec = refused(false, reason, format!("enumerating scopes: {msg}"));
                rec.errors = vec![sample("", &msg)];
                if e.stops_pass() {
                    // The turn ended first: nothing processed, the cycle and its cursor kept.
                    tracing::warn!(source = %key(src), share = ?turn.share(), "enumeration cut off at the end of this source's share of the deadline");
                    rec.outcome = Outcome::OutOfTime {
                        message: format!("enumerating scopes: {msg}; the next run continues"),
                    };
                    rec.reap = Err(plan::Deferral::PartialCoverage);
                } else {
                    rec.outcome = Outcome::EnumerationFailed {
                        reason,
                        message: format!("enumerating scopes: {msg}"),
                    };
                }
                return Ok((rec, kind.throttles()));
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
    let walk_started = std::time::Instant::now();
    let sctx_ref = &sctx;
    let turn_ref = &turn;
    let mut results = futures::stream::iter(scopes.iter())
        .map(|scope| async move {
            if let Err(why) = turn_ref.take() {
                return (scope, ScopeResult::Stopped(format!("{why:?}")));
            }
            (scope, sctx_ref.process(scope).await)
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
            ScopeResult::Failed(msg) => errors.push(sample(&scope.id, &cred.token.redact(&msg))),
            // The first scope of this pass outlasted the whole turn: it fails (the cursor
            // passes it, the sample says why), so a scope that never fits in a turn cannot hold
            // its source in place run after run. Any later one resumes next run.
            ScopeResult::Cut(msg) if processed == 0 => {
                errors.push(sample(&scope.id, &cred.token.redact(&msg)));
                processed += 1;
                last_done = Some(scope.id.clone());
                stopped = true;
                break;
            }
            ScopeResult::Cut(why) | ScopeResult::Stopped(why) => {
                tracing::info!(source = %key(src), scope = %scope.id, why = %crate::scrub::scrub(&why), "stopping this source's walk; the next pass resumes here");
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
                            errors.push(sample("", &cred.token.redact(&format!("reap scan: {e}"))));
                            reap = Err(plan::Deferral::ScopeErrors);
                        }
                    }
                }
            }
            Err(e) => {
                errors.push(sample(
                    "",
                    &cred.token.redact(&format!("cross-resource edges: {e}")),
                ));
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
