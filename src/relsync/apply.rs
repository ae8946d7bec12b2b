//! Applying one scope: fetch its whole membership, join identities, read what SpiceDB holds for
//! its object, diff, and write in batches of at most 1000. A scope that is gone upstream has its
//! whole object swept. Every SpiceDB write is atomic and the diff is recomputed from what is
//! held, so a pass killed between batches converges on the next run.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::SetOnce;

use super::ahead::{Slot, Slots};
use super::held::Held;
use super::join::{Directory, join};
use super::kinds::{Fetched, Kind, KindError, Scope, relations};
use super::plan::{self, Diff};
use super::spicedb::{Filter, Obj, Rel, RelationshipStore, SpiceError};
use crate::pass::lock;
use crate::pass::writes::Writes;

/// What one scope (or cross-resource set) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub written: i64,
    pub pruned: i64,
    pub reaped: i64,
    /// Upstream member ids that did not join.
    pub misses: BTreeSet<String>,
}

/// How a scope ended.
#[derive(Debug)]
pub enum ScopeResult {
    Done(Stats),
    Failed(String),
    /// The pass must stop before this scope (budget or deadline); nothing of it was written.
    Stopped(String),
    /// The source's turn ended while this scope's fetch was in flight; nothing of it was
    /// written.
    Cut(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Kind(#[from] KindError),
    #[error(transparent)]
    Spice(#[from] SpiceError),
}

/// Shared by the scope tasks of one source.
pub struct SourceCtx<'a, S> {
    pub store: &'a S,
    pub kind: &'a dyn Kind,
    pub prefix: &'a str,
    pub directory: &'a Directory,
    pub writes: &'a Mutex<Writes>,
    /// The object types a snapshot of what SpiceDB holds is read for (a large window; empty:
    /// none, each scope reads its own object).
    pub snapshot_kinds: BTreeSet<&'static str>,
    /// That snapshot, once read (`None` inside: the read failed, each scope reads its own). It
    /// is read while the walk's first scopes are fetched upstream; a scope waits for it before
    /// diffing, so no write of this pass precedes it. Only this source writes objects under its
    /// prefix and the pass Lease keeps runs apart, so it is exact for every object it is used
    /// for: each scope's, and the objects no scope enumerated (the reap).
    pub snapshot: SetOnce<Option<Held>>,
    /// The walk's slots; a scope waiting for the snapshot may wait outside its own.
    pub slots: Slots,
}

/// Read every relationship under `prefix` of these object types into one compact snapshot.
pub async fn snapshot<S: RelationshipStore>(
    store: &S,
    prefix: &str,
    kinds: &BTreeSet<&str>,
) -> Result<Held, SpiceError> {
    let mut held = Held::default();
    for kind in kinds {
        let mut part = Held::default();
        store
            .read_bulk(
                &Filter {
                    resource_type: kind.to_string(),
                    resource_id_prefix: Some(prefix.to_string()),
                    ..Default::default()
                },
                &mut part,
            )
            .await?;
        held.merge(part);
    }
    held.shrink();
    Ok(held)
}

impl<S: RelationshipStore> SourceCtx<'_, S> {
    pub fn object(&self, kind: &str, upstream_id: &str) -> Obj {
        plan::object(self.prefix, kind, upstream_id)
    }

    /// Write a diff in batches; returns (touched, deleted).
    pub async fn apply(&self, target: &Obj, diff: &Diff) -> Result<(i64, i64), SpiceError> {
        for batch in diff.batches() {
            let touches = batch
                .iter()
                .filter(|(op, _)| *op == super::spicedb::Op::Touch)
                .count();
            let detail = format!("touch {touches}, delete {}", batch.len() - touches);
            let go = lock(self.writes).will(
                "write",
                format!("spicedb {}:{}", target.kind, target.id),
                detail,
            );
            if go {
                self.store.write(&batch).await?;
                lock(self.writes).data_done();
            }
        }
        Ok((diff.touch.len() as i64, diff.delete.len() as i64))
    }

    /// Held relationships of one object.
    pub async fn held(&self, obj: &Obj, relation: Option<&str>) -> Result<Vec<Rel>, SpiceError> {
        self.store
            .read(&Filter {
                resource_type: obj.kind.clone(),
                resource_id: Some(obj.id.clone()),
                relation: relation.map(str::to_string),
                ..Default::default()
            })
            .await
    }

    /// From the snapshot when there is one (waiting for it to be read), else from SpiceDB.
    /// Waiting rather than reading the first scopes' objects one by one meanwhile: those reads
    /// would double SpiceDB's work while the export runs, and on a shared machine made the pass
    /// slower (docs/performance.md "relsync").
    /// `members`: what the scope holds while it waits (src/relsync/ahead.rs).
    async fn held_scope(
        &self,
        obj: &Obj,
        slot: &mut Slot,
        members: usize,
    ) -> Result<Vec<Rel>, SpiceError> {
        if self.snapshot_kinds.contains(obj.kind.as_str()) {
            let snapshot = match self.snapshot.get() {
                Some(read) => read,
                None => {
                    self.slots
                        .outside(slot, members, self.snapshot.wait())
                        .await
                }
            };
            if let Some(held) = snapshot {
                return Ok(held.of(obj));
            }
        }
        self.held(obj, None).await
    }

    async fn scope(&self, scope: &Scope, slot: &mut Slot) -> Result<Stats, ApplyError> {
        let obj = self.object(scope.object_type, &scope.upstream_id);
        let owned = relations(scope.object_type);
        let mut stats = Stats::default();
        let members = match self.kind.fetch(scope).await? {
            Fetched::Gone => {
                let held = self.held_scope(&obj, slot, 0).await?;
                let (n, delete) = plan::sweep(&held, &BTreeSet::new(), owned);
                let (_, pruned) = self
                    .apply(
                        &obj,
                        &Diff {
                            touch: Vec::new(),
                            delete,
                        },
                    )
                    .await?;
                stats.pruned = pruned;
                stats.reaped = n as i64;
                return Ok(stats);
            }
            Fetched::Members(m) => m,
        };
        let links = self.kind.links(scope).await?;
        let mut desired = BTreeSet::new();
        for m in &members {
            match join(m, self.directory) {
                Ok(user) => {
                    desired.insert(Rel {
                        resource: obj.clone(),
                        relation: "member".into(),
                        subject: Obj::new("user", user),
                    });
                }
                Err(_) => {
                    stats.misses.insert(m.id.clone());
                }
            }
        }
        for (relation, kind, id) in links {
            desired.insert(Rel {
                resource: obj.clone(),
                relation: relation.to_string(),
                subject: self.object(kind, &id),
            });
        }
        let held = self.held_scope(&obj, slot, desired.len()).await?;
        let diff = plan::diff(&desired, &held, owned);
        let (w, p) = self.apply(&obj, &diff).await?;
        stats.written = w;
        stats.pruned = p;
        Ok(stats)
    }

    /// Process one scope in its slot; never panics, never returns a half-written result as
    /// Done.
    pub async fn process(&self, scope: &Scope, slot: &mut Slot) -> ScopeResult {
        match self.scope(scope, slot).await {
            Ok(s) => ScopeResult::Done(s),
            Err(ApplyError::Kind(e)) if e.cut_off() => ScopeResult::Cut(e.to_string()),
            Err(ApplyError::Kind(e)) if e.stops_pass() => ScopeResult::Stopped(e.to_string()),
            Err(e) => ScopeResult::Failed(e.to_string()),
        }
    }

    /// Cross-resource sets: additions always, deletions only when `reap` allows.
    pub async fn cross(&self, reap: bool) -> Result<(Stats, BTreeSet<Obj>), ApplyError> {
        let mut stats = Stats::default();
        let mut objects = BTreeSet::new();
        for set in self.kind.cross().await? {
            let obj = self.object(set.object_type, &set.upstream_id);
            objects.insert(obj.clone());
            let desired: BTreeSet<Rel> = set
                .members
                .iter()
                .filter_map(|m| join(m, self.directory).ok())
                .map(|user| Rel {
                    resource: obj.clone(),
                    relation: set.relation.to_string(),
                    subject: Obj::new("user", user),
                })
                .collect();
            let held = self.held(&obj, Some(set.relation)).await?;
            let mut diff = plan::diff(&desired, &held, &[set.relation]);
            if !reap {
                diff.delete.clear();
            }
            let (w, p) = self.apply(&obj, &diff).await?;
            stats.written += w;
            stats.pruned += p;
        }
        Ok((stats, objects))
    }

    /// Sweep objects of this source no longer enumerated (scopes gone, an old workspace).
    pub async fn reap(&self, keep: &BTreeSet<Obj>) -> Result<Stats, ApplyError> {
        let mut stats = Stats::default();
        for kind in self.kind.object_types() {
            // Objects not enumerated were not touched by this pass: the snapshot taken before
            // the walk still holds exactly their relationships.
            let held: Vec<Rel> = match self.snapshot.get() {
                Some(Some(held)) if self.snapshot_kinds.contains(kind) => held.outside(kind, keep),
                _ => snapshot(self.store, self.prefix, &BTreeSet::from([*kind]))
                    .await?
                    .outside(kind, keep),
            };
            let (n, delete) = plan::sweep(&held, keep, relations(kind));
            if delete.is_empty() {
                continue;
            }
            let target = Obj::new(kind, format!("{}*", self.prefix));
            let (_, p) = self
                .apply(
                    &target,
                    &Diff {
                        touch: Vec::new(),
                        delete,
                    },
                )
                .await?;
            stats.pruned += p;
            stats.reaped += n as i64;
        }
        Ok(stats)
    }
}
