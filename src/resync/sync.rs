//! One bound API, end to end: observe both sides (each page reduced to what the plan reads as it
//! arrives), plan each consumer object (pure, `plan`), apply its writes within the budget, count
//! how it stands; then the copies of ours whose consumer object is gone (orphans).

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};

use super::observe::{consumer_obj, obj_key, observe_conflicts, provider_obj};
use super::plan::{self, ConsumerObj, ProviderObj, Standing};
use super::{BindingRef, BoundApi, Provider, Run, apply, covering};
use crate::api::BindingKey;
use crate::api::core::{BindingStatus, ConflictPolicy, OrphanPolicy};
use crate::api::keys;
use crate::pass::budget::Exhausted;
use crate::pass::concurrency::InFlight;
use crate::pass::list;
use crate::pass::writes::Writes;
use crate::pass::{PassContext, StatusCode};

/// One object's result: its counts slot, standing, write outcome and writes.
type ObjectDone = ((BindingKey, String), Standing, apply::Outcome, Writes);

/// The `ProviderNamespaceDenied` Event on a binding with objects in a namespace the provider
/// does not let this consumer read.
async fn namespace_denied(s: &ApiSync<'_>, b: &BindingRef, ns: &str) {
    let (kind, namespace) = match &b.key.namespace {
        Some(n) => ("Binding", Some(n.clone())),
        None => ("ClusterBinding", None),
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("core.kbind.io/v1alpha1".into()),
        kind: Some(kind.into()),
        namespace,
        name: Some(b.key.name.clone()),
        uid: Some(b.uid.clone()),
        ..Default::default()
    };
    let note = format!(
        "the provider does not let this consumer read {} in namespace {ns} (403): its objects there are not synced and count as denied; the provider's Grant names the namespaces this consumer may use (spec.namespaces)",
        s.api.name
    );
    s.ctx
        .recorder
        .publish(
            &reference,
            crate::pass::events::EventType::Warning,
            "ProviderNamespaceDenied",
            &note,
        )
        .await;
}

/// One bound API being synced through its Connection's provider.
pub(super) struct ApiSync<'a> {
    pub ctx: &'a PassContext,
    pub client: &'a Client,
    pub provider: &'a Provider,
    pub api: &'a BoundApi,
}

/// Both sides of one bound API as observed, the consumer side in resume order.
struct Sides {
    consumer: Vec<ConsumerObj>,
    provider_by_key: BTreeMap<String, ProviderObj>,
    live_uids: BTreeSet<String>,
}

impl Run<'_> {
    /// Sync one bound API, starting after `start_after` (a resumed run). `Err` when the budget
    /// ran out.
    pub(super) async fn sync_api(
        &mut self,
        s: &ApiSync<'_>,
        start_after: Option<&str>,
    ) -> Result<(), Exhausted> {
        let Some(mut sides) = self.observe_api(s).await else {
            return Ok(());
        };
        // Both sides were read: every selected binding of this API gets its counts recorded,
        // zero objects included, so an empty (or re-created) binding still shows that resync
        // went over it (counts 0, Conflicts=False, resync.lastCompleteTime).
        for b in self.bindings.iter().filter(|b| {
            !b.deleting
                && b.connection == s.api.connection
                && b.apis.contains(&s.api.name)
                && self.selected.contains(&b.key)
        }) {
            self.counts
                .entry((b.key.clone(), s.api.name.clone()))
                .or_default();
        }
        if let Some(after) = start_after {
            let split = sides
                .consumer
                .partition_point(|c| obj_key(c.namespace.as_deref(), &c.name).as_str() <= after);
            sides.consumer.rotate_left(split);
        }
        let result = self.sync_objects(s, &sides).await;
        self.sync_orphans(s, &sides).await;
        result
    }

    /// List both sides. `None` when a list failed (counted; a failed provider read counts every
    /// covered object as denied).
    async fn observe_api(&mut self, s: &ApiSync<'_>) -> Option<Sides> {
        let api = s.api;
        let consumer_api: Api<DynamicObject> = Api::all_with(s.client.clone(), &api.resource);
        let provider_api: Api<DynamicObject> =
            Api::all_with(s.provider.client.clone(), &api.resource);
        // Each page is reduced to what the plan reads as it arrives: full objects (managedFields
        // and all) are never held for a whole API.
        let mut consumer = match list::map_all(&consumer_api, &ListParams::default(), |o| {
            consumer_obj(&o)
        })
        .await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(api = %api.name, error = %e, "listing consumer objects failed");
                self.summary.count("errors", 1);
                return None;
            }
        };
        let marker = ListParams::default().labels(&format!(
            "{}={}",
            keys::CONSUMER_CLUSTER,
            s.provider.local_uid
        ));
        let listed = match list::map_all(&provider_api, &marker, |o| provider_obj(&o)).await {
            // An identity confined to its Grant's namespaces (docs/issue.md "Read isolation")
            // may not list cluster-wide: read each namespace this consumer has objects in.
            Err(e) if e.is_forbidden() && api.namespaced => {
                let (objs, denied) = self.observe_per_namespace(s, &consumer, &marker).await;
                // A deleting object stays: with no copy it can see, its finalizer is released
                // (the provider took the namespace back; the copy is the provider's).
                consumer.retain(|c| {
                    c.deleting || c.namespace.as_ref().is_none_or(|ns| !denied.contains(ns))
                });
                Ok(objs)
            }
            r => r,
        };
        let mut provider_by_key: BTreeMap<String, ProviderObj> = match listed {
            Ok(objs) => objs
                .into_iter()
                .map(|p| (obj_key(p.namespace.as_deref(), &p.name), p))
                .collect(),
            Err(e) => {
                tracing::warn!(api = %api.name, error = %e, "listing provider objects failed");
                self.provider_unread(api, &consumer);
                return None;
            }
        };
        if let Err(e) = observe_conflicts(&provider_api, &consumer, &mut provider_by_key).await {
            // Not fatal: the conflicted objects meet their 409 again and stay marked.
            tracing::warn!(api = %api.name, error = %e, "listing provider names for conflicted objects failed");
        }
        self.namespace_uids_of(&mut consumer, &provider_by_key);
        let live_uids: BTreeSet<String> = consumer.iter().map(|c| c.uid.clone()).collect();
        consumer.sort_by_cached_key(|c| obj_key(c.namespace.as_deref(), &c.name));
        Some(Sides {
            consumer,
            provider_by_key,
            live_uids,
        })
    }

    /// A forbidden or failed provider read: every covered object counts as denied, and its
    /// binding as unread this run.
    fn provider_unread(&mut self, api: &BoundApi, consumer: &[ConsumerObj]) {
        self.summary.count("errors", 1);
        for c in consumer {
            if let Some(b) = covering(
                &self.bindings,
                &api.name,
                &api.connection,
                c.namespace.as_deref(),
            ) {
                self.counts
                    .entry((b.key.clone(), api.name.clone()))
                    .or_default()
                    .denied += 1;
                self.unread.insert(b.key.clone());
            }
        }
    }

    /// Each consumer object's namespace UID, for the copy's marker. Unknown this run (the
    /// namespaces could not be listed): our own copy keeps the namespace it recorded, as an
    /// apply without it would drop the marker.
    fn namespace_uids_of(
        &self,
        consumer: &mut [ConsumerObj],
        provider_by_key: &BTreeMap<String, ProviderObj>,
    ) {
        for c in consumer {
            c.namespace_uid = c
                .namespace
                .as_ref()
                .and_then(|ns| self.namespace_uids.get(ns).cloned())
                .or_else(|| {
                    let p = provider_by_key.get(&obj_key(c.namespace.as_deref(), &c.name))?;
                    (p.object_marker.as_deref() == Some(c.uid.as_str()))
                        .then(|| p.namespace_marker.clone())?
                });
        }
    }

    /// The provider side read namespace by namespace, for the namespaces of the consumer objects
    /// this Connection covers. A namespace the provider refuses (not one of the Grant's) is not
    /// an error of the pass: its objects count as denied, and each binding with objects there
    /// gets a Warning Event naming it. Such objects are then left out of this run's sync.
    async fn observe_per_namespace(
        &mut self,
        s: &ApiSync<'_>,
        consumer: &[ConsumerObj],
        marker: &ListParams,
    ) -> (Vec<ProviderObj>, BTreeSet<String>) {
        let api = s.api;
        let mut by_ns: BTreeMap<&str, Vec<&BindingRef>> = BTreeMap::new();
        for c in consumer {
            let Some(ns) = c.namespace.as_deref() else {
                continue;
            };
            if let Some(b) = covering(&self.bindings, &api.name, &api.connection, Some(ns)) {
                by_ns.entry(ns).or_default().push(b);
            }
        }
        let (mut out, mut denied) = (Vec::new(), BTreeSet::new());
        for (ns, covered) in by_ns {
            let in_ns: Api<DynamicObject> =
                Api::namespaced_with(s.provider.client.clone(), ns, &api.resource);
            match list::map_all(&in_ns, marker, |o| provider_obj(&o)).await {
                Ok(objs) => out.extend(objs),
                Err(e) => {
                    let forbidden = e.is_forbidden();
                    tracing::warn!(api = %api.name, namespace = %ns, error = %e, "listing provider objects in a namespace failed");
                    if !forbidden {
                        self.summary.count("errors", 1);
                    }
                    let mut told = BTreeSet::new();
                    for b in covered {
                        self.counts
                            .entry((b.key.clone(), api.name.clone()))
                            .or_default()
                            .denied += 1;
                        self.unread.insert(b.key.clone());
                        if forbidden && told.insert(b.key.clone()) {
                            namespace_denied(s, b, ns).await;
                        }
                    }
                    denied.insert(ns.to_string());
                }
            }
        }
        (out, denied)
    }

    /// Plan and apply each consumer object of the API, counting how each stands. Up to
    /// `--write-concurrency` objects' writes are in flight at once, each object's in plan order.
    /// Budget and resume cursor are decided as each object is started, in key order, exactly as
    /// one object at a time would (a take never depended on the write's outcome).
    async fn sync_objects(&mut self, s: &ApiSync<'_>, sides: &Sides) -> Result<(), Exhausted> {
        let (ctx, api) = (s.ctx, s.api);
        let mut result = Ok(());
        let mut last_handled: Option<String> = None;
        let mut flight = InFlight::new(self.write_concurrency);
        for c in &sides.consumer {
            let key = obj_key(c.namespace.as_deref(), &c.name);
            // Uncovered objects are not touched, except deleting ones still holding our finalizer.
            let fallback = (c.deleting && c.has_finalizer).then_some(&*FALLBACK);
            let Some(binding) = covering(
                &self.bindings,
                &api.name,
                &api.connection,
                c.namespace.as_deref(),
            )
            .or(fallback) else {
                continue;
            };
            if !binding.key.name.is_empty() && !self.selected.contains(&binding.key) {
                continue;
            }
            // A binding kbind schema has not set up yet (no cleanup finalizer) still covers its
            // objects, but nothing is written for them until it is: deleted before that, it goes
            // at once, with no release to take back what resync put on them (docs/resync.md
            // "Gate"). A deleting object holding our finalizer is still let go.
            if !binding.key.name.is_empty() && !binding.has_cleanup && !c.deleting {
                self.counts
                    .entry((binding.key.clone(), api.name.clone()))
                    .or_default()
                    .pending += 1;
                continue;
            }
            let p = sides.provider_by_key.get(&key);
            let (actions, standing) = plan::plan_object(
                c,
                p,
                &s.provider.local_uid,
                &sides.live_uids,
                binding.policy,
                self.waited_out,
            );
            let (slot, policy) = ((binding.key.clone(), api.name.clone()), binding.policy);
            if actions.iter().any(apply::is_data)
                && let Err(why) = ctx.budget.check()
            {
                if result.is_ok() {
                    // The first object this run could not handle: the next run starts after the
                    // last one it did handle.
                    self.resume_after = last_handled
                        .take()
                        .or_else(|| Some(format!("{}|", api.name)));
                }
                self.counts.entry(slot).or_default().pending += 1;
                result = Err(why);
                continue;
            }
            for a in &actions {
                if apply::is_data(a) {
                    let _ = ctx.budget.take();
                }
            }
            if actions.is_empty() {
                self.tally(slot, standing, apply::Outcome::Done, None);
                continue;
            }
            last_handled = Some(format!("{}|{key}", api.name));
            flight.room(|d| self.tally_done(d)).await;
            let mut writes = self.writes.for_one();
            flight.push(async move {
                let outcome = apply::object(s, c, p, &actions, policy, &mut writes).await;
                (slot, standing, outcome, writes)
            });
        }
        while let Some(d) = flight.next().await {
            self.tally_done(d);
        }
        result
    }

    fn tally_done(&mut self, (slot, standing, outcome, writes): ObjectDone) {
        self.tally(slot, standing, outcome, Some(writes));
    }

    /// Count how one object stands after its writes.
    fn tally(
        &mut self,
        slot: (BindingKey, String),
        standing: Standing,
        outcome: apply::Outcome,
        writes: Option<Writes>,
    ) {
        if let Some(w) = writes {
            self.writes.absorb(w);
        }
        let entry = self.counts.entry(slot).or_default();
        match (outcome, standing) {
            (apply::Outcome::Denied, _) => entry.denied += 1,
            (apply::Outcome::Unpinned, _) => {
                entry.denied += 1;
                entry.unpinned += 1;
            }
            (apply::Outcome::Rejected, _) => entry.rejected += 1,
            (apply::Outcome::Conflict, _) | (apply::Outcome::Done, Standing::Conflict) => {
                entry.conflicts += 1
            }
            (apply::Outcome::Failed, _) => entry.pending += 1,
            (apply::Outcome::Done, Standing::InSync | Standing::Pending) => entry.in_sync += 1,
            (apply::Outcome::Done, Standing::Deleting) => {}
        }
    }

    /// Copies of ours whose consumer object is gone, in namespaces a live binding covers:
    /// orphans, handled by that binding's `spec.orphans` (docs/resync.md "Orphans").
    async fn sync_orphans(&mut self, s: &ApiSync<'_>, sides: &Sides) {
        let (ctx, api) = (s.ctx, s.api);
        let consumer_keys: BTreeSet<String> = sides
            .consumer
            .iter()
            .map(|c| obj_key(c.namespace.as_deref(), &c.name))
            .collect();
        for o in plan::orphans(
            &sides.provider_by_key,
            &consumer_keys,
            &s.provider.local_uid,
            &sides.live_uids,
        ) {
            let Some(b) = covering(
                &self.bindings,
                &api.name,
                &api.connection,
                o.namespace.as_deref(),
            ) else {
                continue;
            };
            // Orphans wait, counted, for a binding kbind schema has set up (see sync_objects).
            if !self.selected.contains(&b.key) {
                continue;
            }
            if !b.has_cleanup {
                self.counts
                    .entry((b.key.clone(), api.name.clone()))
                    .or_default()
                    .orphaned += 1;
                continue;
            }
            let entry = self
                .counts
                .entry((b.key.clone(), api.name.clone()))
                .or_default();
            let namespace_uid = o
                .namespace
                .as_ref()
                .and_then(|ns| self.namespace_uids.get(ns))
                .map(String::as_str);
            let Some(action) = plan::plan_orphan(o, b.orphans, namespace_uid) else {
                entry.orphaned += 1;
                continue;
            };
            if ctx.budget.check().is_err() {
                entry.orphaned += 1;
                continue;
            }
            let _ = ctx.budget.take();
            if !apply::orphan(
                s.client,
                &s.provider.client,
                api,
                o,
                action,
                &mut self.writes,
            )
            .await
            {
                entry.orphaned += 1;
            }
            self.summary.count(
                match action {
                    plan::OrphanAction::Mark(_) => "orphansMarked",
                    plan::OrphanAction::Delete => "orphansDeleted",
                    plan::OrphanAction::Restore => "orphansRestored",
                },
                1,
            );
        }
    }
}

/// Stand-in binding for deleting objects no binding covers any more: Fail policy, no counts owner.
static FALLBACK: std::sync::LazyLock<BindingRef> = std::sync::LazyLock::new(|| BindingRef {
    key: BindingKey {
        namespace: None,
        name: String::new(),
    },
    connection: String::new(),
    apis: vec![],
    policy: ConflictPolicy::Fail,
    adopt_refused: false,
    admitted: true,
    orphans: OrphanPolicy::Keep,
    deleting: false,
    has_cleanup: false,
    uid: String::new(),
    created: None,
    generation: None,
    status: BindingStatus::default(),
});
