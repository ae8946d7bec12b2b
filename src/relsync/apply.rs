//! Applying one scope: fetch its whole membership, join identities, read what SpiceDB holds for
//! its object, diff, and write in batches of at most 1000. A scope that is gone upstream has its
//! whole object swept. Every SpiceDB write is atomic and the diff is recomputed from what is
//! held, so a pass killed between batches converges on the next run.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

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
    /// What SpiceDB held for this source's scope objects when the walk began, read in one
    /// stream per object type instead of one read per scope. Only this source writes objects
    /// under its prefix and the pass Lease keeps runs apart, so the snapshot stays exact.
    pub held_cache: Option<HashMap<Obj, Vec<Rel>>>,
    /// The object types `held_cache` covers.
    pub cached_kinds: BTreeSet<&'static str>,
}

/// Read every relationship under `prefix` of these object types, grouped by object.
pub async fn prefetch<S: RelationshipStore>(
    store: &S,
    prefix: &str,
    kinds: &BTreeSet<&str>,
) -> Result<HashMap<Obj, Vec<Rel>>, SpiceError> {
    let mut out: HashMap<Obj, Vec<Rel>> = HashMap::new();
    for kind in kinds {
        let rels = store
            .read_bulk(&Filter {
                resource_type: kind.to_string(),
                resource_id_prefix: Some(prefix.to_string()),
                ..Default::default()
            })
            .await?;
        for r in rels {
            out.entry(r.resource.clone()).or_default().push(r);
        }
    }
    Ok(out)
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

    async fn held_scope(&self, obj: &Obj) -> Result<Vec<Rel>, SpiceError> {
        match &self.held_cache {
            Some(c) => Ok(c.get(obj).cloned().unwrap_or_default()),
            None => self.held(obj, None).await,
        }
    }

    async fn scope(&self, scope: &Scope) -> Result<Stats, ApplyError> {
        let obj = self.object(scope.object_type, &scope.upstream_id);
        let owned = relations(scope.object_type);
        let mut stats = Stats::default();
        let members = match self.kind.fetch(scope).await? {
            Fetched::Gone => {
                let held = self.held_scope(&obj).await?;
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
        let held = self.held_scope(&obj).await?;
        let diff = plan::diff(&desired, &held, owned);
        let (w, p) = self.apply(&obj, &diff).await?;
        stats.written = w;
        stats.pruned = p;
        Ok(stats)
    }

    /// Process one scope; never panics, never returns a half-written result as Done.
    pub async fn process(&self, scope: &Scope) -> ScopeResult {
        match self.scope(scope).await {
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
            let held: Vec<Rel> = match &self.held_cache {
                Some(cache) if self.cached_kinds.contains(kind) => cache
                    .iter()
                    .filter(|(o, _)| o.kind == *kind && !keep.contains(*o))
                    .flat_map(|(_, rels)| rels.iter().cloned())
                    .collect(),
                _ => {
                    self.store
                        .read_bulk(&Filter {
                            resource_type: kind.to_string(),
                            resource_id_prefix: Some(self.prefix.to_string()),
                            ..Default::default()
                        })
                        .await?
                }
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
