//! What tests do to the shared provider that other tests' fixtures would see.
//!
//! - **Exports.** A Connection with `pullPolicy: All` installs every export of the provider,
//!   other tests' too, and owns them on the consumer: their own Connections then meet a CRD
//!   another Connection owns.
//! - **Copies.** The servers have one consumer apiserver, so one consumer cluster UID, and
//!   every test that syncs writes provider copies labelled with it. The issuer pins a consumer
//!   cluster to a Grant only while no provider object carries its UID, unless a person
//!   approved it (docs/issue.md "Confinement"): a test that pins that cluster must run while
//!   no other test can have copies of it, and start from none.
//!
//! So every fixture ([`crate::support::fx::Fx::new`], deploy.rs's setup) holds
//! [`ProviderHold::shared`] for its life, and a test that needs the provider alone holds
//! [`ProviderHold::alone`] (or [`ProviderHold::pinning`], which also clears what earlier tests
//! left): it waits until no fixture lives and keeps new ones from starting until it is
//! dropped. File locks in the servers' directory, so they hold across test processes
//! (nextest) as well.

use std::cell::Cell;
use std::fs::File;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kbind::api::iam::Grant;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client};

const LOCK: &str = "provider.lock";
/// Held by a test waiting to be alone: flock favours no waiter, so without it fixtures starting one
/// after another on the other test threads could keep the lock shared for the whole suite.
const TURNSTILE: &str = "provider.turnstile";

thread_local! {
    /// Holds this thread's test keeps: shared ones (it passes no turnstile for a second
    /// fixture), or `usize::MAX` while it is alone (a fixture it made would wait for itself).
    static KEPT: Cell<usize> = const { Cell::new(0) };
}

/// Held, never read: dropped, the lock is released. Locks are taken in one order everywhere:
/// `unscoped.lock` ([`super::scoped`]), the turnstile, `provider.lock`.
pub struct ProviderHold {
    _shared: Option<Arc<File>>,
    _alone: Option<File>,
}

impl Drop for ProviderHold {
    fn drop(&mut self) {
        KEPT.with(|k| {
            k.set(match (k.get(), self._alone.is_some()) {
                (_, true) => 0,
                (n, false) => n.saturating_sub(1),
            })
        });
    }
}

impl ProviderHold {
    /// The shared hold. One flock per process while any hold lives; a thread taking its first
    /// passes the turnstile (an alone test waiting holds it), a thread taking another (a test
    /// with a second fixture, or a test-level hold) does not, so it never waits behind a test
    /// that waits for its first.
    pub fn shared() -> Self {
        static HELD: Mutex<Weak<File>> = Mutex::new(Weak::new());
        super::scoped();
        let held = || HELD.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = KEPT.with(Cell::get);
        assert!(
            kept != usize::MAX,
            "a test holding the provider alone made a fixture: it would wait for itself"
        );
        let waited = std::time::Instant::now();
        let turnstile = (kept == 0).then(|| super::lock_file(TURNSTILE, true));
        // Bound first: a guard in the match's scrutinee would live through its arms.
        let live = held().upgrade();
        let f = match live {
            Some(f) => f,
            None => {
                let taken = Arc::new(super::lock_file(LOCK, false));
                let mut slot = held();
                // Another thread of this process may have taken one meanwhile: keep one.
                slot.upgrade().unwrap_or_else(|| {
                    *slot = Arc::downgrade(&taken);
                    taken
                })
            }
        };
        drop(turnstile);
        said("shared", waited);
        KEPT.with(|k| k.set(kept + 1));
        Self {
            _shared: Some(f),
            _alone: None,
        }
    }

    /// The exclusive hold. A test holding it creates no other fixture: that one would wait
    /// for this hold (and [`ProviderHold::shared`] refuses it).
    pub fn alone() -> Self {
        super::scoped();
        assert_eq!(
            KEPT.with(Cell::get),
            0,
            "a test holding a fixture asked for the provider alone: it would wait for itself"
        );
        let waited = std::time::Instant::now();
        let turnstile = super::lock_file(TURNSTILE, true);
        let lock = super::lock_file(LOCK, true);
        drop(turnstile);
        said("exclusive", waited);
        KEPT.with(|k| k.set(usize::MAX));
        Self {
            _shared: None,
            _alone: Some(lock),
        }
    }

    /// [`ProviderHold::alone`] for a test that pins the consumer cluster, then what earlier
    /// tests left deleted: a Grant still pinned to it (a pinning test that failed before
    /// revoking it), and every provider copy carrying its UID (objects no Grant holds make the
    /// next pin wait for a person's approval, as they would for a user).
    pub async fn pinning(provider: &Client, consumer: &Client) -> Self {
        let hold = Self::alone();
        clear(provider, consumer).await;
        hold
    }
}

/// A wait of a second or more, in the test's output: a test that seems slow says why.
fn said(how: &str, waited: std::time::Instant) {
    let waited = waited.elapsed();
    if waited.as_secs() >= 1 {
        eprintln!("waited {waited:.1?} for {LOCK} ({how})");
    }
}

/// [`ProviderHold::pinning`]'s clean start.
async fn clear(provider: &Client, consumer: &Client) {
    let uid = Api::<Namespace>::all(consumer.clone())
        .get("kube-system")
        .await
        .expect("the consumer's kube-system")
        .metadata
        .uid
        .expect("its UID");
    let grants = Api::<Grant>::all(provider.clone());
    let leftovers = grants.list(&ListParams::default()).await.map(|l| l.items);
    for g in leftovers.unwrap_or_default() {
        if g.status
            .as_ref()
            .and_then(|s| s.consumer_cluster.as_deref())
            == Some(uid.as_str())
        {
            remove(&grants, &g.metadata.name.unwrap_or_default()).await;
        }
    }
    let labelled = ListParams::default().labels(&format!("core.kbind.io/consumer-cluster={uid}"));
    // Heartbeats of Grants no pinning test made (bind.rs's), which the pin check reads once an
    // Export's permissions name Leases.
    let leases = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
        "leases",
    );
    let mut carriers = vec![leases];
    // By name, then one by one: an exported CRD kube cannot decode (tests/hostile.rs's deep
    // schema) must not hide the rest.
    let crds = Api::<CustomResourceDefinition>::all(provider.clone());
    let exported = crds
        .list_metadata(&ListParams::default().labels("core.kbind.io/exported=true"))
        .await
        .expect("exported CRDs");
    for name in exported.items.into_iter().filter_map(|m| m.metadata.name) {
        let Ok(crd) = crds.get(&name).await else {
            continue;
        };
        if let Some(v) = crd.spec.versions.iter().find(|v| v.served) {
            carriers.push(ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(&crd.spec.group, &v.name, &crd.spec.names.kind),
                &crd.spec.names.plural,
            ));
        }
    }
    for ar in carriers {
        let all = Api::<DynamicObject>::all_with(provider.clone(), &ar);
        // A CRD established moments ago may not be served yet: nothing of it to clear.
        let Ok(copies) = all.list_metadata(&labelled).await else {
            continue;
        };
        for o in copies.items {
            let name = o.metadata.name.unwrap_or_default();
            match o.metadata.namespace.as_deref() {
                Some(ns) => {
                    let api = Api::<DynamicObject>::namespaced_with(provider.clone(), ns, &ar);
                    remove(&api, &name).await;
                }
                None => remove(&all, &name).await,
            }
        }
    }
}

/// Deleted, and its finalizers dropped: a copy a test's own finalizer holds (tests/resync.rs's
/// terminating copy, should that test fail) still carries the UID while it terminates.
async fn remove<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let _ = api.delete(name, &Default::default()).await;
    let _ = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
}
