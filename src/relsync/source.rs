//! One source in one pass: resolve kind, config and credential (nothing is sent before they
//! are admitted), enumerate or take the explicit scopes, walk the window in order with bounded
//! concurrency, write cross-resource edges, and reap only on full coverage. Everything the
//! source sends upstream ends with its turn (`limits::Turn`). Returns what the status records.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::ResourceExt;
use tokio::sync::SetOnce;

use super::ahead::{self, Slots};
use super::apply::{self, ScopeResult, SourceCtx, Stats};
use super::args::RelsyncArgs;
use super::auth::{self, Credential};
use super::join::Directory;
use super::kinds::{self, Kind, KindConfig, Scope, Upstreams};
use super::limits::Turn;
use super::plan::{self, Coverage, Deferral};
use super::record::{Outcome, PassRecord, sample};
use super::spicedb::RelationshipStore;
use super::{Refusal, SNAPSHOT_MIN, directory, key};
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

/// What a source needs before anything is sent upstream: its kind built for an admitted
/// config and credential, and its join directory.
struct Resolved {
    cred: Credential,
    dir: Directory,
    kind: Box<dyn Kind>,
}

/// The scopes this run walks, and what the coverage decision needs to know about them.
struct Window {
    scopes: Vec<Scope>,
    /// Every scope the enumeration returned (empty with `--scope`).
    enumerated: Vec<Scope>,
    /// The window starts at the first scope (no resume point).
    from_start: bool,
    /// The window ends at the last scope.
    at_end: bool,
}

/// What the walk over the window did.
#[derive(Default)]
struct Walked {
    total: Stats,
    errors: Vec<ScopeErrorSample>,
    /// The last scope completed, in order.
    last_done: Option<String>,
    processed: i32,
    /// The walk stopped before the window's end (budget, deadline, the turn).
    stopped: bool,
}

/// One source's run: what every step of [`sync_source`] reads.
struct SourceRun<'a> {
    args: &'a RelsyncArgs,
    src: &'a RelationshipSource,
    turn: &'a Arc<Turn>,
    /// `--scope` was given: only those scopes, no cursor, no reap.
    scoped: bool,
    /// This run continues the previous cycle (from `status.sync.resumeAfter`).
    continued: bool,
    cred: &'a Credential,
}

/// One source in its `turn`: resolve, enumerate, walk its window of scopes, cross-resource
/// edges, reap. Returns the record for its status and the throttles the upstream answered.
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
    let r = match resolve(ctx, upstreams, src, &turn).await {
        Ok(r) => r,
        Err(Refusal { reason, message }) => return Ok((refused(scoped, reason, message), 0)),
    };
    let run = SourceRun {
        args,
        src,
        turn: &turn,
        scoped,
        continued: !scoped && plan::cycle_in_progress(src.status.as_ref()),
        cred: &r.cred,
    };
    let window = match run.window(r.kind.as_ref()).await? {
        Ok(w) => w,
        Err(rec) => return Ok((rec, r.kind.throttles())),
    };
    let prefix = plan::source_prefix(&src.namespace().unwrap_or_default(), &src.name_any());
    let sctx = SourceCtx {
        store,
        kind: r.kind.as_ref(),
        prefix: &prefix,
        directory: &r.dir,
        writes,
        snapshot_kinds: snapshot_kinds(&window.scopes),
        snapshot: SetOnce::new(),
        slots: Slots::new(args.concurrency, ahead::WAITING_MEMBERS),
    };
    let mut walked = run.walk_with_snapshot(&sctx, &window.scopes).await;
    let reap = run.cross_and_reap(&sctx, &window, &mut walked).await;
    let throttles = r.kind.throttles();
    if throttles > 0 {
        tracing::info!(source = %key(src), throttles, "upstream throttled this pass; backed off and retried");
    }
    Ok((run.record(&window, walked, reap), throttles))
}

/// A large window reads what SpiceDB holds in one stream per object type rather than one read
/// per scope (SpiceDB, not the upstream, is then the cheaper side).
fn snapshot_kinds(scopes: &[Scope]) -> BTreeSet<&'static str> {
    if scopes.len() < SNAPSHOT_MIN {
        return BTreeSet::new();
    }
    scopes.iter().map(|s| s.object_type).collect()
}

/// Resolve kind, config, credential and directory; nothing is sent before they are admitted.
async fn resolve(
    ctx: &PassContext,
    upstreams: &Upstreams,
    src: &RelationshipSource,
    turn: &Arc<Turn>,
) -> Result<Resolved, Refusal> {
    let ns = src.namespace().unwrap_or_default();
    let spec = &src.spec;
    let refusal = |reason, message| Refusal { reason, message };
    plan::parse_interval(spec.sync.as_ref().and_then(|s| s.interval.as_deref()))
        .map_err(|e| refusal("InvalidInterval", e))?;
    let cfg = KindConfig::parse(&spec.kind, spec.config.as_ref(), spec.base_url.as_deref())
        .map_err(|e| refusal(e.reason(), e.to_string()))?;
    let cred = auth::resolve(&ctx.client, &ns, src, cfg.fixed_endpoint(upstreams))
        .await
        .map_err(|e| refusal(e.reason(), e.to_string()))?;
    let dir = directory(&ctx.client, &ns, &cfg).await?;
    let kind = kinds::build(&cfg, &cred, upstreams, turn.clone())
        .map_err(|e| refusal("InvalidConfig", e.to_string()))?;
    Ok(Resolved { cred, dir, kind })
}

impl SourceRun<'_> {
    /// The explicit scopes, or the enumeration's window after the cursor. An enumeration that
    /// failed ends the source here with its record (the inner `Err`).
    async fn window(&self, kind: &dyn Kind) -> Result<Result<Window, PassRecord>, PassError> {
        let spec = &self.src.spec;
        if self.scoped {
            let mut scopes = Vec::new();
            for id in &self.args.scopes {
                scopes.push(kind.scope(id).ok_or_else(|| {
                    PassError::Config(format!("--scope {id:?} is not a scope id of kind {} (e.g. channel/C123, usergroup/S1, group/abc)", spec.kind))
                })?);
            }
            return Ok(Ok(Window {
                scopes,
                enumerated: Vec::new(),
                from_start: false,
                at_end: false,
            }));
        }
        let t = std::time::Instant::now();
        let all = match kind.enumerate().await {
            Ok(all) => all,
            Err(e) => return Ok(Err(self.enumeration_failed(&e))),
        };
        tracing::info!(source = %key(self.src), scopes = all.len(), seconds = t.elapsed().as_secs_f64(), "enumerated");
        let prev_sync = self
            .src
            .status
            .as_ref()
            .and_then(|s| s.sync.clone())
            .unwrap_or_default();
        let resume = if self.continued {
            prev_sync.resume_after.as_str()
        } else {
            ""
        };
        let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
        let limit = plan::scope_limit(spec.sync.as_ref().and_then(|s| s.max_scopes_per_pass));
        let (a, b, end) = plan::window(&ids, resume, limit);
        Ok(Ok(Window {
            scopes: all[a..b].to_vec(),
            from_start: a == 0,
            at_end: end,
            enumerated: all,
        }))
    }

    /// The record of a source whose enumeration failed (or was cut off by its turn).
    fn enumeration_failed(&self, e: &kinds::KindError) -> PassRecord {
        let reason = e.enumeration_reason();
        let msg = self.cred.token.redact(&e.to_string());
        let mut rec = refused(false, reason, format!("enumerating scopes: {msg}"));
        rec.errors = vec![sample("", &msg)];
        if e.stops_pass() {
            // The turn ended first: nothing processed, the cycle and its cursor kept.
            tracing::warn!(source = %key(self.src), share = ?self.turn.share(), "enumeration cut off at the end of this source's share of the deadline");
            rec.outcome = Outcome::OutOfTime {
                message: format!("enumerating scopes: {msg}; the next run continues"),
            };
            rec.reap = Err(Deferral::PartialCoverage);
        } else {
            rec.outcome = Outcome::EnumerationFailed {
                reason,
                message: format!("enumerating scopes: {msg}"),
            };
        }
        rec
    }

    /// The walk, and beside it the snapshot of what SpiceDB holds when the window is large
    /// (`snapshot_kinds`): it is read while the first scopes are fetched upstream instead of
    /// before them. A walk that ends first (stopped, every scope failed) drops the read.
    async fn walk_with_snapshot<S: RelationshipStore>(
        &self,
        sctx: &SourceCtx<'_, S>,
        scopes: &[Scope],
    ) -> Walked {
        let walk = self.walk(sctx, scopes);
        if sctx.snapshot_kinds.is_empty() {
            return walk.await;
        }
        let read = async {
            let t = std::time::Instant::now();
            let held = match apply::snapshot(sctx.store, sctx.prefix, &sctx.snapshot_kinds).await {
                Ok(held) => {
                    tracing::info!(source = %key(self.src), relationships = held.len(), seconds = t.elapsed().as_secs_f64(), "read what SpiceDB holds");
                    Some(held)
                }
                Err(e) => {
                    tracing::warn!(source = %key(self.src), error = %e, "bulk read failed; reading per scope");
                    None
                }
            };
            // Set once, here only.
            let _ = sctx.snapshot.set(held);
        };
        tokio::pin!(walk);
        tokio::select! {
            w = &mut walk => w,
            () = read => walk.await,
        }
    }

    /// Walk the window in order with bounded concurrency; results come back in order, so the
    /// cursor is the last scope before the first one not done.
    async fn walk<S: RelationshipStore>(
        &self,
        sctx: &SourceCtx<'_, S>,
        scopes: &[Scope],
    ) -> Walked {
        let walk_started = std::time::Instant::now();
        let turn = self.turn;
        // The slots bound how many scopes fetch and write at once; scopes started beyond them
        // only wait for one, or for the snapshot outside one (src/relsync/ahead.rs).
        let ahead = if sctx.snapshot_kinds.is_empty() {
            0
        } else {
            ahead::AHEAD_SCOPES
        };
        let mut results = futures::stream::iter(scopes.iter())
            .map(|scope| async move {
                let mut slot = sctx.slots.take().await;
                if let Err(why) = turn.take() {
                    return (scope, ScopeResult::Stopped(format!("{why:?}")));
                }
                (scope, sctx.process(scope, &mut slot).await)
            })
            .buffered(self.args.concurrency.max(1) + ahead);
        let mut w = Walked::default();
        let redact = |msg: &str| self.cred.token.redact(msg);
        while let Some((scope, r)) = results.next().await {
            match r {
                ScopeResult::Done(s) => {
                    w.total.written += s.written;
                    w.total.pruned += s.pruned;
                    w.total.reaped += s.reaped;
                    w.total.misses.extend(s.misses);
                }
                ScopeResult::Failed(msg) => w.errors.push(sample(&scope.id, &redact(&msg))),
                // The first scope of this pass outlasted the whole turn: it fails (the cursor
                // passes it, the sample says why), so a scope that never fits in a turn cannot
                // hold its source in place run after run. Any later one resumes next run.
                ScopeResult::Cut(msg) if w.processed == 0 => {
                    w.errors.push(sample(&scope.id, &redact(&msg)));
                    w.processed += 1;
                    w.last_done = Some(scope.id.clone());
                    w.stopped = true;
                    break;
                }
                ScopeResult::Cut(why) | ScopeResult::Stopped(why) => {
                    tracing::info!(source = %key(self.src), scope = %scope.id, why = %why, "stopping this source's walk; the next pass resumes here");
                    w.stopped = true;
                    break;
                }
            }
            w.processed += 1;
            w.last_done = Some(scope.id.clone());
        }
        drop(results);
        tracing::info!(source = %key(self.src), processed = w.processed, seconds = walk_started.elapsed().as_secs_f64(), "scopes walked");
        w
    }

    /// Cross-resource edges and the reap, after a walk that was not stopped; the reap only when
    /// the pass covered every enumerated scope. Returns whether (or why not) the reap ran.
    async fn cross_and_reap<S: RelationshipStore>(
        &self,
        sctx: &SourceCtx<'_, S>,
        window: &Window,
        w: &mut Walked,
    ) -> Result<(), Deferral> {
        let mut coverage = Coverage {
            scoped: self.scoped,
            enumeration_ok: !self.scoped,
            enumerated: window.enumerated.len(),
            from_start: window.from_start,
            reached_end: window.at_end && !w.stopped,
            scope_errors: w.errors.len(),
            cross_ok: true,
        };
        let reap = plan::reap_decision(&coverage);
        if self.scoped {
            return reap;
        }
        if w.stopped {
            return Err(Deferral::PartialCoverage);
        }
        let redact = |msg: &str| self.cred.token.redact(msg);
        let cross_objects = match sctx.cross(reap.is_ok()).await {
            Ok((s, cross_objects)) => {
                w.total.written += s.written;
                w.total.pruned += s.pruned;
                cross_objects
            }
            Err(e) => {
                w.errors
                    .push(sample("", &redact(&format!("cross-resource edges: {e}"))));
                coverage.cross_ok = false;
                return plan::reap_decision(&coverage);
            }
        };
        reap?;
        let mut keep: BTreeSet<_> = window
            .enumerated
            .iter()
            .map(|s| sctx.object(s.object_type, &s.upstream_id))
            .collect();
        keep.extend(cross_objects);
        match sctx.reap(&keep).await {
            Ok(s) => {
                w.total.pruned += s.pruned;
                w.total.reaped += s.reaped;
                Ok(())
            }
            Err(e) => {
                w.errors
                    .push(sample("", &redact(&format!("reap scan: {e}"))));
                Err(Deferral::ScopeErrors)
            }
        }
    }

    /// What the status records of this run.
    fn record(&self, window: &Window, w: Walked, reap: Result<(), Deferral>) -> PassRecord {
        let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
        PassRecord {
            scoped: self.scoped,
            outcome: Outcome::Ran,
            continued_cycle: self.continued,
            reached_end: window.at_end && !w.stopped,
            last_done: w.last_done,
            counts: LastPass {
                join_misses: i32::try_from(w.total.misses.len()).unwrap_or(i32::MAX),
                pruned: count(w.total.pruned),
                reaped_scopes: count(w.total.reaped),
                scopes_processed: w.processed,
                written: count(w.total.written),
                ..Default::default()
            },
            errors: w.errors,
            reap,
        }
    }
}
