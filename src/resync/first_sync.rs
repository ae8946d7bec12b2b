//! The first-sync window (docs/resync.md "First sync"). `kbind schema` and `kbind resync` fire
//! at the same tick; a binding created since the last tick is set up by schema while resync is
//! already running, and its first objects (created as soon as its CRD is Established) would
//! wait a whole period for the next resync. So once a run has gone over everything, it keeps
//! following its *new* bindings for `--first-sync-window`: every [`EVERY`] it reads the
//! consumer again and syncs each of their APIs as soon as its CRD is there, and for [`TAIL`]
//! after (or, while the provider refuses its writes until its issuer pins this consumer, until
//! the window ends). Settled bindings cost nothing: a run without new bindings ends as before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::record::NOT_PINNED;
use super::{BindingRef, BoundApi, Reach, Run};
use crate::api::BindingKey;
use crate::pass::budget::Exhausted;

/// How often the window looks again.
const EVERY: Duration = Duration::from_secs(2);
/// How long after its creation a never-synced binding counts as new: one missed schema tick
/// (a minute) and then some.
const NEW_FOR_SECONDS: i64 = 150;
/// How long an API of a new binding keeps being synced after its first sync in the window:
/// its first objects are created once its CRD is Established (by a script, a GitOps retry).
const TAIL: Duration = Duration::from_secs(8);

/// The bindings a window follows: selected, not deleting, created less than
/// [`NEW_FOR_SECONDS`] before `now`, and never synced (no `status.resync.lastPassTime`) or
/// refused because the provider has not pinned this consumer yet (`ConsumerPinned=False
/// NotPinned`: a consumer of the service layer, whose first heartbeat this run writes and the
/// provider's issuer, fired at the same tick, pins within seconds in its pin window).
pub fn new_bindings(
    bindings: &[BindingRef],
    selected: &BTreeSet<BindingKey>,
    now: Timestamp,
) -> Vec<(BindingKey, Vec<String>)> {
    bindings
        .iter()
        .filter(|b| !b.deleting && selected.contains(&b.key))
        .filter(|b| {
            b.created
                .is_some_and(|c| now.as_second().saturating_sub(c.as_second()) < NEW_FOR_SECONDS)
        })
        .filter(|b| {
            let never_synced = b
                .status
                .resync
                .as_ref()
                .is_none_or(|r| r.last_pass_time.is_none());
            let not_pinned = b.status.conditions.iter().any(|c| {
                c.type_ == crate::api::core::condition::CONSUMER_PINNED && c.reason == NOT_PINNED
            });
            never_synced || not_pinned
        })
        .map(|b| (b.key.clone(), b.apis.clone()))
        .collect()
}

/// What one look does: the APIs to sync now, and whether to look again.
#[derive(Debug, PartialEq, Eq)]
pub struct Look {
    pub sync: Vec<String>,
    pub again: bool,
}

/// One look: each API a new binding lists that is bound now (its CRD in `bound`) and was
/// first synced in this window less than [`TAIL`] ago, or never, or whose last sync the
/// provider refused because it has not pinned this consumer yet (`refused`: the issuer's pin
/// window pins it seconds after its heartbeat, docs/issue.md "Pin window"), is synced. Look
/// again while any such API is not bound yet, is still in its tail, or is refused.
pub fn look(
    new: &[(BindingKey, Vec<String>)],
    bound: &BTreeSet<&str>,
    (first, refused): (&BTreeMap<String, Instant>, &BTreeSet<String>),
    now: Instant,
) -> Look {
    let wanted: BTreeSet<&str> = new
        .iter()
        .flat_map(|(_, apis)| apis.iter().map(String::as_str))
        .collect();
    let in_tail = |api: &str| {
        refused.contains(api)
            || first
                .get(api)
                .is_none_or(|t| now.saturating_duration_since(*t) < TAIL)
    };
    let sync: Vec<String> = wanted
        .iter()
        .filter(|a| bound.contains(*a) && in_tail(a))
        .map(|a| a.to_string())
        .collect();
    let again = wanted.iter().any(|a| !bound.contains(*a) || in_tail(a));
    Look { sync, again }
}

/// One run's window.
pub(super) struct Window {
    length: Duration,
    /// When each API was first synced in this window.
    first: BTreeMap<String, Instant>,
}

impl Window {
    pub fn new(length: Duration) -> Self {
        Window {
            length,
            first: BTreeMap::new(),
        }
    }

    /// Follow the run's new bindings until they are synced and past their tail, the window
    /// ends, or the deadline nears. The managed CRDs as last read, when read again (for the
    /// run's release step); `Err` when the budget ran out inside an API's sync.
    pub async fn follow(
        mut self,
        run: &mut Run<'_>,
        reach: &mut Reach,
        selector: Option<&str>,
    ) -> Result<Option<Vec<BoundApi>>, Exhausted> {
        let ctx = run.ctx;
        let new = new_bindings(&run.bindings, &run.selected, Timestamp::now());
        if new.is_empty() || ctx.args.dry_run {
            return Ok(None);
        }
        let end = Instant::now() + self.length;
        let mut latest = None;
        let mut looks = 0u64;
        loop {
            // The window never takes the run past its deadline (nor a lost Lease, SIGTERM).
            let now = Instant::now();
            if now + EVERY >= end || ctx.budget.would_cross_deadline(EVERY * 2) {
                break;
            }
            tokio::time::sleep(EVERY).await;
            let seen = match super::observe::consumer(ctx, selector).await {
                Ok(seen) => seen,
                Err(e) => {
                    tracing::warn!(error = %e, "first-sync window: reading the consumer again failed; the next run syncs");
                    break;
                }
            };
            looks += 1;
            run.bindings = seen.bindings;
            run.selected = seen.selected;
            run.namespace_uids = seen.namespace_uids;
            reach.connections = seen.connections;
            let bound: BTreeSet<&str> = seen.apis.iter().map(|a| a.name.as_str()).collect();
            let refused: BTreeSet<String> = run
                .counts
                .iter()
                .filter(|(_, c)| c.unpinned > 0)
                .map(|((_, api), _)| api.clone())
                .collect();
            let plan = look(&new, &bound, (&self.first, &refused), Instant::now());
            for name in &plan.sync {
                let Some(api) = seen.apis.iter().find(|a| &a.name == name) else {
                    continue;
                };
                self.first.entry(name.clone()).or_insert_with(Instant::now);
                // Counted afresh: the counts recorded are this sync's.
                run.counts.retain(|(_, a), _| a != name);
                run.step(reach, api, None).await?;
            }
            latest = Some(seen.apis);
            if !plan.again {
                break;
            }
        }
        run.summary
            .count("firstSyncLooks", i64::try_from(looks).unwrap_or(i64::MAX));
        Ok(latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::core::{BindingStatus, ConflictPolicy, OrphanPolicy, ResyncProgress};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn key(n: &str) -> BindingKey {
        BindingKey {
            namespace: None,
            name: n.into(),
        }
    }

    fn binding(n: &str, age: i64, synced: bool, now: Timestamp) -> BindingRef {
        BindingRef {
            key: key(n),
            connection: "c".into(),
            apis: vec![format!("{n}s.example.org")],
            policy: ConflictPolicy::Fail,
            adopt_refused: false,
            admitted: true,
            orphans: OrphanPolicy::Keep,
            deleting: false,
            has_cleanup: false,
            uid: n.into(),
            created: Some(Timestamp::from_second(now.as_second() - age).unwrap()),
            generation: Some(1),
            status: BindingStatus {
                resync: synced.then(|| ResyncProgress {
                    last_pass_time: Some(Time(now)),
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }

    #[test]
    fn new_means_recent_selected_live_and_never_synced_or_not_pinned() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let mut deleting = binding("d", 10, false, now);
        deleting.deleting = true;
        // Synced, but refused until the provider pins this consumer: followed too.
        let mut unpinned = binding("unpinned", 10, true, now);
        let mut old_unpinned = binding("old-unpinned", 151, true, now);
        for b in [&mut unpinned, &mut old_unpinned] {
            b.status.conditions = vec![
                serde_json::from_value(serde_json::json!({
                "type": "ConsumerPinned", "status": "False", "reason": NOT_PINNED, "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}))
                .unwrap(),
            ];
        }
        let bindings = vec![
            binding("a", 10, false, now),
            binding("old", 151, false, now),
            binding("synced", 10, true, now),
            deleting,
            binding("other", 10, false, now),
            unpinned,
            old_unpinned,
        ];
        let selected: BTreeSet<BindingKey> =
            ["a", "old", "synced", "d", "unpinned", "old-unpinned"]
                .into_iter()
                .map(key)
                .collect();
        let new = new_bindings(&bindings, &selected, now);
        let keys: Vec<BindingKey> = new.into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![key("a"), key("unpinned")]);
    }

    #[test]
    fn an_api_is_synced_once_bound_and_for_its_tail_then_the_window_ends() {
        let new = vec![
            (key("a"), vec!["x".to_string(), "y".to_string()]),
            (key("b"), vec!["y".to_string()]),
        ];
        let t0 = Instant::now();
        let mut first = BTreeMap::new();
        // Nothing bound yet: nothing to sync, look again.
        let none = BTreeSet::new();
        let l = look(&new, &BTreeSet::new(), (&first, &none), t0);
        assert_eq!(
            l,
            Look {
                sync: vec![],
                again: true
            }
        );
        // x bound: synced; y not yet: look again.
        let l = look(&new, &["x"].into(), (&first, &none), t0);
        assert_eq!(l.sync, ["x"]);
        assert!(l.again);
        first.insert("x".to_string(), t0);
        // Both bound, x in its tail, y never synced: both.
        let l = look(
            &new,
            &["x", "y"].into(),
            (&first, &none),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(l.sync, ["x", "y"]);
        first.insert("y".to_string(), t0 + Duration::from_secs(2));
        // x past its tail, y in it: y only, again.
        let l = look(&new, &["x", "y"].into(), (&first, &none), t0 + TAIL);
        assert_eq!(l.sync, ["y"]);
        assert!(l.again);
        // Both past: nothing, done.
        let l = look(&new, &["x", "y"].into(), (&first, &none), t0 + TAIL * 2);
        assert_eq!(
            l,
            Look {
                sync: vec![],
                again: false
            }
        );
        // Past its tail but refused until the provider pins this consumer: synced at every
        // look, and looked again, until the window ends.
        let refused: BTreeSet<String> = ["x".to_string()].into();
        for after in [TAIL * 2, TAIL * 10] {
            let l = look(&new, &["x", "y"].into(), (&first, &refused), t0 + after);
            assert_eq!(
                l,
                Look {
                    sync: vec!["x".to_string()],
                    again: true
                }
            );
        }
    }
}
