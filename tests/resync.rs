//! `kbind resync` against the consumer and provider apiservers, run as the real binary.

use crate::support;

use std::collections::BTreeSet;

use kbind::api::core::ClusterBinding;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fx::{Fx, cond};

struct Setup {
    fx: Fx,
    api: String,
    ar: ApiResource,
    conn: String,
    cb: String,
    ns: String,
}

/// A provider API bound through a ClusterBinding and pulled by `kbind schema`.
async fn setup(prefix: &str, conflict_policy: &str) -> Setup {
    let fx = Fx::new(prefix).await;
    let (api, conn, cb) = fx.bound_api("widgets", "Namespaced").await;
    Api::<ClusterBinding>::all(fx.consumer.clone())
        .patch(
            &cb,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"conflictPolicy": conflict_policy}})),
        )
        .await
        .unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let ns = fx.ns.clone();
    Setup {
        fx,
        api,
        ar,
        conn,
        cb,
        ns,
    }
}

impl Setup {
    fn resync(&self, extra: &[&str]) -> Value {
        self.fx.pass("resync", extra)
    }
    /// The Events with `reason` in the test's namespace (where Events on its objects go).
    async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.fx.consumer.clone(), &self.ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }
    fn consumer(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.consumer.clone(), &self.ns, &self.ar)
    }
    fn provider(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.provider.clone(), &self.ns, &self.ar)
    }
    async fn ensure_provider_ns(&self) {
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": self.ns}})).unwrap();
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.fx.provider.clone())
            .create(&PostParams::default(), &ns)
            .await;
    }
    async fn create(&self, api: &Api<DynamicObject>, name: &str, data: Value) -> DynamicObject {
        let mut o = DynamicObject::new(name, &self.ar).data(data);
        o.metadata.namespace = Some(self.ns.clone());
        api.create(&PostParams::default(), &o).await.unwrap()
    }
    /// A consumer object `name` of another API of the test's group, in the test's namespace;
    /// returns that API.
    async fn create_of(&self, kind: &str, plural: &str, name: &str) -> ApiResource {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&self.fx.group, "v1", kind),
            plural,
        );
        let mut o = DynamicObject::new(name, &ar).data(json!({"spec": {"size": 1}}));
        o.metadata.namespace = Some(self.ns.clone());
        Api::<DynamicObject>::namespaced_with(self.fx.consumer.clone(), &self.ns, &ar)
            .create(&PostParams::default(), &o)
            .await
            .unwrap();
        ar
    }
    async fn set_orphans(&self, policy: &str) {
        Api::<ClusterBinding>::all(self.fx.consumer.clone())
            .patch(
                &self.cb,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"orphans": policy}})),
            )
            .await
            .unwrap();
    }
    async fn binding_api_status(&self) -> kbind::api::core::BoundApi {
        let st = Api::<ClusterBinding>::all(self.fx.consumer.clone())
            .get(&self.cb)
            .await
            .unwrap()
            .status
            .unwrap();
        st.bound_apis
            .into_iter()
            .find(|a| a.name == self.api)
            .unwrap()
    }
}

async fn local_uid(s: &Setup) -> String {
    s.fx.conn(&s.conn)
        .await
        .status
        .unwrap()
        .local_cluster_uid
        .unwrap()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn spec_goes_up_with_markers_and_status_comes_down() {
    let s = setup("up", "Fail").await;
    let c = s
        .create(&s.consumer(), "w1", json!({"spec": {"size": 3}}))
        .await;
    let run = s.resync(&[]);
    assert_eq!(run["outcome"], "completed", "{run}");

    let p = s
        .provider()
        .get("w1")
        .await
        .expect("provider copy created (namespace too)");
    assert_eq!(p.data["spec"], json!({"size": 3}));
    assert_eq!(
        p.labels()["core.kbind.io/consumer-cluster"],
        local_uid(&s).await
    );
    assert_eq!(
        p.annotations()["core.kbind.io/consumer-object-uid"],
        c.uid().unwrap()
    );
    let c = s.consumer().get("w1").await.unwrap();
    assert!(c.finalizers().iter().any(|f| f == "core.kbind.io/syncer"));

    // The provider's controller reports status; the next pass copies it down.
    let mut st = p.clone();
    st.data["status"] = json!({"phase": "Ready", "endpoint": "db.example:5432"});
    s.provider()
        .replace_status("w1", &PostParams::default(), &st)
        .await
        .unwrap();
    // The consumer changes the spec: it goes up.
    s.consumer()
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    s.resync(&[]);
    assert_eq!(
        s.provider().get("w1").await.unwrap().data["spec"],
        json!({"size": 5})
    );
    assert_eq!(
        s.consumer().get("w1").await.unwrap().data["status"]["phase"],
        "Ready"
    );
    let counts = s.binding_api_status().await;
    assert_eq!(
        (counts.in_sync, counts.conflict_count, counts.pending),
        (Some(1), Some(0), Some(0))
    );

    // Nothing changed: no data writes.
    let run = s.resync(&[]);
    assert_eq!(run["data_writes"], 0, "{run}");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn conflicts_under_fail_adopt_and_owned_by_another() {
    let s = setup("conflict", "Fail").await;
    s.ensure_provider_ns().await;
    // The provider already has objects of these names.
    s.create(&s.provider(), "foreign", json!({"spec": {"size": 1}}))
        .await;
    s.create(&s.provider(), "other", json!({"spec": {"size": 1}}))
        .await;
    s.provider()
        .patch(
            "other",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
            "labels": {"core.kbind.io/consumer-cluster": "some-other-cluster"},
            "annotations": {"core.kbind.io/consumer-object-uid": "x"}}})),
        )
        .await
        .unwrap();
    s.create(&s.consumer(), "foreign", json!({"spec": {"size": 9}}))
        .await;
    s.create(&s.consumer(), "other", json!({"spec": {"size": 9}}))
        .await;
    s.resync(&[]);

    for (name, reason) in [
        ("foreign", "ForeignObjectExists"),
        ("other", "OwnedByAnother"),
    ] {
        let c = s.consumer().get(name).await.unwrap();
        assert_eq!(
            c.annotations()
                .get("core.kbind.io/conflict")
                .map(String::as_str),
            Some(reason),
            "{name}"
        );
        assert_eq!(
            s.provider().get(name).await.unwrap().data["spec"]["size"],
            1,
            "{name}: provider object untouched"
        );
    }
    assert_eq!(s.binding_api_status().await.conflict_count, Some(2));
    let st = Api::<ClusterBinding>::all(s.fx.consumer.clone())
        .get(&s.cb)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(cond(&st.conditions, "Conflicts").0, "True");
    assert!(
        !s.events("ForeignObjectExists").await.is_empty(),
        "a warning Event explains it"
    );

    // Adopt takes over the unmarked object, never the other consumer's.
    Api::<ClusterBinding>::all(s.fx.consumer.clone())
        .patch(
            &s.cb,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"conflictPolicy": "Adopt"}})),
        )
        .await
        .unwrap();
    s.resync(&[]);
    let adopted = s.provider().get("foreign").await.unwrap();
    assert_eq!(adopted.data["spec"]["size"], 9);
    assert!(
        adopted
            .labels()
            .contains_key("core.kbind.io/consumer-cluster")
    );
    assert!(
        s.consumer()
            .get("foreign")
            .await
            .unwrap()
            .annotations()
            .get("core.kbind.io/conflict")
            .is_none(),
        "conflict cleared"
    );
    assert_eq!(
        s.provider().get("other").await.unwrap().data["spec"]["size"],
        1,
        "OwnedByAnother even under Adopt"
    );
    assert_eq!(s.binding_api_status().await.conflict_count, Some(1));
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn deletion_paths_never_touch_what_is_not_ours() {
    let s = setup("delete", "Fail").await;
    for n in ["gone", "kept", "recreated", "renamed"] {
        s.create(&s.consumer(), n, json!({"spec": {"size": 1}}))
            .await;
    }
    s.consumer()
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"core.kbind.io/deletion-policy": "Orphan"}}}),
            ),
        )
        .await
        .unwrap();
    s.resync(&[]);
    for n in ["gone", "kept", "recreated", "renamed"] {
        assert!(
            s.provider().get_opt(n).await.unwrap().is_some(),
            "{n} synced"
        );
    }
    // Consumer deletes: the copy is deleted, then the finalizer released (maybe a run later).
    s.consumer()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    s.consumer()
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    // Provider-side deletion while the consumer object lives: re-created.
    s.provider()
        .delete("recreated", &DeleteParams::default())
        .await
        .unwrap();
    s.resync(&[]);
    s.resync(&[]);
    assert!(
        s.consumer().get_opt("gone").await.unwrap().is_none(),
        "finalizer released"
    );
    assert!(
        s.provider().get_opt("gone").await.unwrap().is_none(),
        "our copy deleted"
    );
    let kept = s.provider().get("kept").await.expect("orphaned copy stays");
    assert!(
        !kept.labels().contains_key("core.kbind.io/consumer-cluster"),
        "markers stripped"
    );
    assert!(s.consumer().get_opt("kept").await.unwrap().is_none());
    assert!(
        s.provider().get_opt("recreated").await.unwrap().is_some(),
        "re-created"
    );

    // A consumer object re-created under the same name while the old copy survives: the old
    // copy is our earlier one (our cluster, a UID no longer alive) and is re-adopted.
    let old_uid = s.consumer().get("renamed").await.unwrap().uid().unwrap();
    s.consumer()
        .patch(
            "renamed",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    s.consumer()
        .delete("renamed", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("old object gone", || async {
        s.consumer()
            .get_opt("renamed")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let new = s
        .create(&s.consumer(), "renamed", json!({"spec": {"size": 2}}))
        .await;
    s.resync(&[]);
    let p = s.provider().get("renamed").await.unwrap();
    assert_ne!(new.uid().unwrap(), old_uid);
    assert_eq!(
        p.annotations()["core.kbind.io/consumer-object-uid"],
        new.uid().unwrap(),
        "re-adopted"
    );
    assert_eq!(p.data["spec"]["size"], 2);

    // A copy of ours whose consumer object vanished without kbind (finalizer stripped by hand):
    // an orphan, kept and marked (spec.orphans defaults to Keep); deleted only under an explicit
    // `orphans: Delete`. A foreign provider object is never deleted.
    s.create(&s.provider(), "bystander", json!({"spec": {"size": 1}}))
        .await;
    s.consumer()
        .patch(
            "recreated",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    s.consumer()
        .delete("recreated", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("consumer object gone", || async {
        s.consumer()
            .get_opt("recreated")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    s.resync(&[]);
    let orphan = s.provider().get("recreated").await.expect("orphan kept");
    assert_eq!(
        orphan
            .annotations()
            .get("core.kbind.io/orphaned")
            .map(String::as_str),
        Some("ConsumerObjectGone")
    );
    assert_eq!(s.binding_api_status().await.orphaned, Some(1));
    assert_eq!(
        s.resync(&[])["data_writes"],
        0,
        "a marked orphan is not re-marked"
    );
    s.set_orphans("Delete").await;
    s.resync(&[]);
    assert!(
        s.provider().get_opt("recreated").await.unwrap().is_none(),
        "orphans: Delete deletes it"
    );
    assert_eq!(s.binding_api_status().await.orphaned, Some(0));
    assert!(
        s.provider().get_opt("bystander").await.unwrap().is_some(),
        "not ours: untouched"
    );
}

/// Issue #29: a binding with no objects (just bound, or re-created after an unbind) was never
/// recorded, so `kbind status` could not tell it had been synced and `Conflicts` was absent; and
/// when the last object went, its count stayed at the old figure. Now every run that reads both
/// sides records the counts, zeros included, and writes nothing more while nothing changes.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_empty_binding_is_recorded_with_zero_counts_and_no_conflicts() {
    let s = setup("emptybinding", "Fail").await;
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    let zero = (Some(0), Some(0), Some(0), Some(0), Some(0), Some(0));
    let counts = |a: &kbind::api::core::BoundApi| {
        (
            a.in_sync,
            a.pending,
            a.conflict_count,
            a.denied,
            a.rejected,
            a.orphaned,
        )
    };
    s.resync(&[]);
    let first = cbs.get(&s.cb).await.unwrap();
    let st = first.status.clone().unwrap();
    assert_eq!(counts(&s.binding_api_status().await), zero);
    assert_eq!(cond(&st.conditions, "Conflicts").0, "False");
    assert!(
        st.resync.and_then(|r| r.last_complete_time).is_some(),
        "the complete pass over the empty binding is recorded"
    );
    for run in 2..=3 {
        let summary = s.resync(&[]);
        assert_eq!(summary["data_writes"], 0, "run {run}: {summary}");
        assert_eq!(
            cbs.get(&s.cb).await.unwrap().resource_version(),
            first.resource_version(),
            "run {run}: nothing changed, so the binding is not written"
        );
    }
    // One object, then none again: the count follows it down to 0.
    s.create(&s.consumer(), "only", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    assert_eq!(s.binding_api_status().await.in_sync, Some(1));
    s.consumer()
        .delete("only", &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("the consumer object is gone", || async {
        s.resync(&[]);
        s.consumer()
            .get_opt("only")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    s.resync(&[]);
    let a = s.binding_api_status().await;
    assert_eq!((a.in_sync, a.conflict_count), (Some(0), Some(0)), "{a:?}");
    // The binding re-created under the same name is recorded again.
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    support::eventually("the ClusterBinding is gone", || async {
        s.fx.pass("resync", &[]);
        s.fx.pass("schema", &[]);
        cbs.get_opt(&s.cb).await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(s.fx.cluster_binding("cb", &s.conn, &[&s.api]).await, s.cb);
    // The old CRD may still be terminating (the apiserver removes its instances first): schema
    // installs the new one on a run after it is gone.
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(s.fx.consumer.clone());
    support::eventually("the consumer CRD installed again", || async {
        s.fx.pass("schema", &[]);
        crds.get_opt(&s.api)
            .await
            .unwrap()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|_| ())
    })
    .await;
    support::wait_established(&crds, &s.api).await;
    s.resync(&[]);
    let st = cbs.get(&s.cb).await.unwrap().status.unwrap();
    assert_eq!(cond(&st.conditions, "Conflicts").0, "False");
    let a = s.binding_api_status().await;
    assert_eq!((a.in_sync, a.conflict_count), (Some(0), Some(0)), "{a:?}");
}

/// Issue #10 reproduction: a conflictPolicy Fail conflict used to flap (annotation present,
/// absent, present, …) because the provider LIST, narrowed to our copies, never shows the
/// foreign object. Now it stays reported with no write and no new Event; it clears only when the
/// foreign object goes.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_conflict_stays_reported_across_runs_without_writes() {
    let s = setup("conflictstable", "Fail").await;
    s.ensure_provider_ns().await;
    s.create(&s.provider(), "taken", json!({"spec": {"size": 1}}))
        .await;
    s.create(&s.consumer(), "taken", json!({"spec": {"size": 7}}))
        .await;
    s.resync(&[]);
    for run in 2..=4 {
        let summary = s.resync(&[]);
        let c = s.consumer().get("taken").await.unwrap();
        assert_eq!(
            c.annotations()
                .get("core.kbind.io/conflict")
                .map(String::as_str),
            Some("ForeignObjectExists"),
            "run {run}"
        );
        assert_eq!(summary["data_writes"], 0, "run {run}: {summary}");
        assert_eq!(summary["counts"]["conflicts"], 1, "run {run}: {summary}");
        assert_eq!(s.binding_api_status().await.conflict_count, Some(1));
    }
    let warnings = s.events("ForeignObjectExists").await.len();
    assert_eq!(warnings, 1, "one Event for one conflict");
    assert_eq!(
        s.provider().get("taken").await.unwrap().data["spec"]["size"],
        1,
        "the foreign object is untouched"
    );
    // The cause goes: the next run syncs the object and clears the mark.
    s.provider()
        .delete("taken", &DeleteParams::default())
        .await
        .unwrap();
    s.resync(&[]);
    let c = s.consumer().get("taken").await.unwrap();
    assert!(c.annotations().get("core.kbind.io/conflict").is_none());
    assert_eq!(
        s.provider().get("taken").await.unwrap().data["spec"]["size"],
        7
    );
    assert_eq!(s.resync(&[])["data_writes"], 0);
}

/// Issue #10 reproduction: unbind, then re-bind, used to delete every provider copy (the consumer
/// objects went with the CRD, so resync saw copies without a live owner). Now the copies are kept
/// and marked at the unbind, counted after the re-bind, re-adopted by a returning object, and
/// brought back whole by `orphans: Restore`.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn unbind_then_rebind_keeps_every_provider_copy() {
    let s = setup("rebind", "Fail").await;
    for i in 0..3 {
        s.create(
            &s.consumer(),
            &format!("w{i}"),
            json!({"spec": {"size": i}}),
        )
        .await;
    }
    s.resync(&[]);
    s.resync(&[]);
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    let uid = cbs.get(&s.cb).await.unwrap().uid().unwrap();
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    s.resync(&[]);
    s.fx.run(&[]);
    support::eventually("binding gone", || async {
        cbs.get_opt(&s.cb).await.unwrap().is_none().then_some(())
    })
    .await;
    support::eventually("consumer CRD gone", || async {
        s.fx.consumer_crd(&s.api).await.is_none().then_some(())
    })
    .await;
    for i in 0..3 {
        let p = s
            .provider()
            .get(&format!("w{i}"))
            .await
            .expect("copy kept at unbind");
        assert_eq!(
            p.annotations()
                .get("core.kbind.io/orphaned")
                .map(String::as_str),
            Some("Unbound"),
            "w{i}"
        );
    }
    let note = support::event_note(&s.fx.consumer, "default", "ProviderCopiesKept", &uid)
        .await
        .expect("an Event on the ClusterBinding says the copies stay");
    assert!(note.contains("3 provider copies stay"), "{note}");
    assert!(
        !note.contains("not all marked"),
        "every copy was reached: {note}"
    );

    // The provider labels one copy while no consumer object exists.
    s.provider()
        .patch(
            "w0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await
        .unwrap();

    // Re-bind: two rounds of schema + resync keep every copy.
    let cb = s.fx.cluster_binding("cb", &s.conn, &[&s.api]).await;
    assert_eq!(cb, s.cb);
    for _ in 0..2 {
        s.fx.run(&[]);
        support::wait_established(&Api::all(s.fx.consumer.clone()), &s.api).await;
        s.resync(&[]);
    }
    for i in 0..3 {
        assert!(
            s.provider()
                .get_opt(&format!("w{i}"))
                .await
                .unwrap()
                .is_some(),
            "w{i} survives the re-bind"
        );
    }
    assert_eq!(s.binding_api_status().await.orphaned, Some(3));
    assert_eq!(
        s.resync(&[])["data_writes"],
        0,
        "marked orphans: nothing to write"
    );

    // A consumer object returning under one name re-adopts its copy; its spec wins.
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 10}}))
        .await;
    s.resync(&[]);
    let p = s.provider().get("w1").await.unwrap();
    assert_eq!(p.data["spec"]["size"], 10);
    assert!(
        p.annotations().get("core.kbind.io/orphaned").is_none(),
        "mark cleared"
    );
    assert_eq!(s.binding_api_status().await.orphaned, Some(2));

    // Restore brings the rest back from their copies (spec and labels), then they sync.
    s.set_orphans("Restore").await;
    s.resync(&[]);
    s.resync(&[]);
    for i in [0, 2] {
        let c = s.consumer().get(&format!("w{i}")).await.expect("restored");
        assert_eq!(c.data["spec"]["size"], i);
        assert!(c.labels().keys().all(|k| !k.starts_with("core.kbind.io/")));
        let p = s.provider().get(&format!("w{i}")).await.unwrap();
        assert_eq!(
            p.annotations()["core.kbind.io/consumer-object-uid"],
            c.uid().unwrap(),
            "re-adopted by the restored object"
        );
        assert!(p.annotations().get("core.kbind.io/orphaned").is_none());
    }
    assert_eq!(
        s.consumer()
            .get("w0")
            .await
            .unwrap()
            .labels()
            .get("tier")
            .map(String::as_str),
        Some("gold"),
        "restored with the copy's labels"
    );
    assert_eq!(s.binding_api_status().await.orphaned, Some(0));
    assert_eq!(s.resync(&[])["data_writes"], 0);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_deleting_binding_releases_instances_and_leaves_provider_copies() {
    let s = setup("unbind", "Fail").await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    assert!(s.provider().get_opt("w1").await.unwrap().is_some());
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    s.resync(&[]);
    let st = cbs.get(&s.cb).await.unwrap().status.unwrap();
    assert_eq!(cond(&st.conditions, "InstancesReleased").0, "True");
    let c = s.consumer().get("w1").await.unwrap();
    assert!(
        !c.finalizers().iter().any(|f| f == "core.kbind.io/syncer"),
        "instance finalizer released"
    );
    assert!(
        s.provider().get_opt("w1").await.unwrap().is_some(),
        "provider data is never deleted by an unbind"
    );
    // kbind schema finishes the teardown.
    s.fx.run(&[]);
    support::eventually("binding gone", || async {
        cbs.get_opt(&s.cb).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn nothing_syncs_when_the_provider_identity_changed() {
    let s = setup("resyncid", "Fail").await;
    // The Secret now points at another cluster (the consumer itself).
    s.fx.secret(
        "provider",
        "kubeconfig",
        &std::fs::read_to_string(&s.fx.env.consumer).unwrap(),
    )
    .await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    let run = s.resync(&[]);
    assert_eq!(run["data_writes"], 0, "{run}");
    let c = s.consumer().get("w1").await.unwrap();
    assert!(c.finalizers().is_empty(), "not even a finalizer");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn budgeted_passes_resume_and_converge() {
    let s = setup("budget", "Fail").await;
    for i in 0..6 {
        s.create(
            &s.consumer(),
            &format!("w{i}"),
            json!({"spec": {"size": i}}),
        )
        .await;
    }
    // Each new object needs two writes (finalizer, create): 3 writes per run.
    let first = s.resync(&["--max-items", "3"]);
    assert_eq!(first["outcome"], "partial", "{first}");
    let mut runs = 1;
    loop {
        let mut all = true;
        for i in 0..6 {
            all &= s
                .provider()
                .get_opt(&format!("w{i}"))
                .await
                .unwrap()
                .is_some();
        }
        if all {
            break;
        }
        assert!(runs < 10, "does not converge");
        s.resync(&["--max-items", "3"]);
        runs += 1;
    }
    let last = s.resync(&["--max-items", "3"]);
    assert_eq!(last["data_writes"], 0, "converged: {last}");
    assert_eq!(s.binding_api_status().await.in_sync, Some(6));
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn provider_rejections_are_counted_with_events_and_do_not_starve_the_rest() {
    let s = setup("reject", "Fail").await;
    // After the pull, the provider tightens its schema: the consumer accepts what it refuses.
    let name = format!("widgets.{}", s.fx.group);
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(s.fx.provider.clone());
    let mut crd = crds.get(&name).await.unwrap();
    let schema = crd.spec.versions[0]
        .schema
        .as_mut()
        .unwrap()
        .open_api_v3_schema
        .as_mut()
        .unwrap();
    let spec = schema.properties.as_mut().unwrap().get_mut("spec").unwrap();
    spec.properties
        .as_mut()
        .unwrap()
        .get_mut("size")
        .unwrap()
        .maximum = Some(10.0);
    crds.replace(&name, &PostParams::default(), &crd)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    for i in 0..3 {
        s.create(
            &s.consumer(),
            &format!("a{i}-too-big"),
            json!({"spec": {"size": 50}}),
        )
        .await;
        s.create(
            &s.consumer(),
            &format!("b{i}-fine"),
            json!({"spec": {"size": 5}}),
        )
        .await;
    }
    // A small budget: rejected objects sort first and fail every run; the resume point in the
    // pass Lease moves on, so the rest are reached.
    let mut runs = 0;
    loop {
        s.resync(&["--max-items", "2"]);
        runs += 1;
        let mut fine = 0;
        for i in 0..3 {
            fine += usize::from(
                s.provider()
                    .get_opt(&format!("b{i}-fine"))
                    .await
                    .unwrap()
                    .is_some(),
            );
        }
        if fine == 3 {
            break;
        }
        assert!(runs < 12, "rejected objects starve the rest");
    }
    s.resync(&[]);
    let counts = s.binding_api_status().await;
    assert_eq!(
        (counts.rejected, counts.in_sync),
        (Some(3), Some(3)),
        "{counts:?}"
    );
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(s.fx.consumer.clone(), &s.ns)
            .list(&Default::default())
            .await
            .unwrap();
    let rejected: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Rejected"))
        .collect();
    assert!(!rejected.is_empty());
    assert!(
        rejected[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("less than or equal to 10"),
        "the provider's message: {:?}",
        rejected[0].note
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_restricted_provider_identity_counts_denied_objects_and_syncs_the_rest() {
    let fx = Fx::new("denied").await;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let allowed = fx.ns.clone();
    let other = support::namespace(&fx.consumer, "denied-other").await;
    // Provider identity: identity read, CRD discovery, widgets readable everywhere but writable
    // only in the allowed namespace.
    let pns = support::namespace(&fx.provider, "denied-sa").await;
    let kubeconfig = support::service_account_kubeconfig(&fx.env.provider, &pns, "syncer").await;
    let user = format!("system:serviceaccount:{pns}:syncer");
    let rules = json!([
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "get"]},
        {"apiGroups": [fx.group], "resources": ["widgets"], "verbs": ["list", "get"]}]);
    let role: k8s_openapi::api::rbac::v1::ClusterRole = serde_json::from_value(
        json!({"metadata": {"name": format!("{}-read", fx.label)}, "rules": rules}),
    )
    .unwrap();
    let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": format!("{}-read", fx.label)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{}-read", fx.label)},
        "subjects": [{"kind": "User", "name": user}]})).unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(fx.provider.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(fx.provider.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": allowed}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.provider.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let write: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({"metadata": {"name": "write"},
        "rules": [{"apiGroups": [fx.group], "resources": ["widgets", "widgets/status"], "verbs": ["create", "patch", "update", "delete"]}]})).unwrap();
    let rb: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_json::from_value(json!({"metadata": {"name": "write"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "write"},
        "subjects": [{"kind": "User", "name": user}]}))
        .unwrap();
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(fx.provider.clone(), &allowed)
        .create(&PostParams::default(), &write)
        .await
        .unwrap();
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(fx.provider.clone(), &allowed)
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();

    fx.secret("provider", "kubeconfig", &kubeconfig).await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let cb = fx.cluster_binding("cb", &conn, &[&api]).await;
    support::eventually("Connection ready", || async {
        fx.run(&[]);
        let st = fx.conn(&conn).await.status?;
        (cond(&st.conditions, "Ready").0 == "True").then_some(())
    })
    .await;
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    for ns in [&allowed, &other] {
        let mut o = DynamicObject::new("w", &ar).data(json!({"spec": {"size": 1}}));
        o.metadata.namespace = Some(ns.clone());
        Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), ns, &ar)
            .create(&PostParams::default(), &o)
            .await
            .unwrap();
    }
    // Forbidden instance writes are counted, not fatal: the pass still exits 0.
    fx.pass("resync", &[]);
    assert!(
        Api::<DynamicObject>::namespaced_with(fx.provider.clone(), &allowed, &ar)
            .get_opt("w")
            .await
            .unwrap()
            .is_some(),
        "the permitted object synced"
    );
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&cb)
        .await
        .unwrap()
        .status
        .unwrap();
    let counts = st.bound_apis.iter().find(|a| a.name == api).unwrap();
    assert_eq!(
        (counts.in_sync, counts.denied),
        (Some(1), Some(1)),
        "{counts:?}"
    );
    // Instance-level denials are counts and Events; the setup-level condition stays False.
    assert_eq!(cond(&st.conditions, "PermissionDenied").0, "False");
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(fx.consumer.clone(), &other)
            .list(&Default::default())
            .await
            .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("PermissionDenied"))
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn cluster_scoped_objects_sync_under_a_cluster_binding_and_the_heartbeat_is_renewed() {
    let fx = Fx::new("clusterscoped").await;
    let (_, conn, _) = fx.bound_api("regions", "Cluster").await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Region"),
        "regions",
    );
    let name = format!("{}-eu", fx.label);
    let o = DynamicObject::new(&name, &ar).data(json!({"spec": {"size": 2}}));
    Api::<DynamicObject>::all_with(fx.consumer.clone(), &ar)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
    fx.pass("resync", &[]);
    let p = Api::<DynamicObject>::all_with(fx.provider.clone(), &ar)
        .get(&name)
        .await
        .expect("cluster-scoped copy");
    assert_eq!(p.data["spec"]["size"], 2);
    // Heartbeat: Lease consumer-<localClusterUID> in the provider kubeconfig's namespace.
    let local = fx
        .conn(&conn)
        .await
        .status
        .unwrap()
        .local_cluster_uid
        .unwrap();
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        fx.provider.clone(),
        "default",
    )
    .get(&format!("consumer-{local}"))
    .await
    .expect("heartbeat Lease");
    let renewed = lease.spec.unwrap().renew_time.unwrap().0;
    assert!(
        k8s_openapi::jiff::Timestamp::now()
            .duration_since(renewed)
            .as_secs()
            < 60
    );
}

/// Crash points: a run aborted right after each of its data writes (4 objects x (finalizer +
/// create) = 8), then an ordinary run, redoes nothing and skips nothing: every provider copy
/// exists with its consumer object's spec and owner.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_killed_mid_pass_converges_with_nothing_lost_or_duplicated() {
    let want: BTreeSet<String> = (0..4).map(|i| format!("w{i} size={i} owned")).collect();
    let mut tally = support::Tally::new("resync", "writes");
    for crash_after in support::crash_points("resync writes", 8) {
        let point = format!("write {crash_after}");
        let s = setup("resynccrash", "Fail").await;
        for i in 0..4 {
            s.create(
                &s.consumer(),
                &format!("w{i}"),
                json!({"spec": {"size": i}}),
            )
            .await;
        }
        let kc = s.fx.env.consumer.to_string_lossy().to_string();
        let selector = format!("kbind-test={}", s.fx.label);
        let out = support::kbind_command(&[
            "resync",
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            &s.ns,
            "--credential-namespace",
            &s.ns,
            "--selector",
            &selector,
            // One object at a time: write n is the same write on every run.
            "--write-concurrency",
            "1",
        ])
        .env(kbind::pass::crash::ENV, crash_after.to_string())
        .output()
        .unwrap();
        let (code, _, stderr) = support::outcome(out);
        assert_ne!(code, 0, "aborted at {point}");
        assert!(stderr.contains("reached"), "{point}: {stderr}");
        let other = support::namespace(&s.fx.consumer, "resynccrash-rerun").await;
        let (code, summary, stderr) = support::kbind(&[
            "resync",
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            &other,
            "--credential-namespace",
            &s.ns,
            "--selector",
            &selector,
            "-o",
            "json",
        ]);
        if code != 0 {
            tally.failed(&point, format!("rerun: {summary}\n{stderr}"));
            continue;
        }
        let mut got = BTreeSet::new();
        for i in 0..4 {
            let c = s.consumer().get(&format!("w{i}")).await.unwrap();
            if let Some(p) = s.provider().get_opt(&format!("w{i}")).await.unwrap() {
                let owned = p
                    .annotations()
                    .get("core.kbind.io/consumer-object-uid")
                    .is_some_and(|u| Some(u) == c.uid().as_ref());
                let owner = if owned { "owned" } else { "not owned" };
                got.insert(format!("w{i} size={} {owner}", p.data["spec"]["size"]));
            }
        }
        tally.point(
            &point,
            &(&want, 8 - crash_after),
            &(&got, summary["data_writes"].as_u64().unwrap_or(u64::MAX)),
            &want,
            &got,
        );
    }
    tally.finish();
}

/// A cold pass writing 16 objects at a time, aborted after its 30th data write (other writes
/// were in flight), then an ordinary run: every consumer object ends with exactly one provider
/// copy, owned by it, with its spec; and the run after that writes nothing. Convergence only:
/// which writes landed before the abort differs run to run at this concurrency.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_concurrent_pass_killed_mid_flight_converges_on_the_next_run() {
    const N: usize = 40;
    let s = setup("resyncpar", "Fail").await;
    for i in 0..N {
        s.create(
            &s.consumer(),
            &format!("w{i}"),
            json!({"spec": {"size": i}}),
        )
        .await;
    }
    let kc = s.fx.env.consumer.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", s.fx.label);
    let out = support::kbind_command(&[
        "resync",
        "--kubeconfig",
        &kc,
        "--lease-namespace",
        &s.ns,
        "--credential-namespace",
        &s.ns,
        "--selector",
        &selector,
        "--write-concurrency",
        "16",
    ])
    .env(kbind::pass::crash::ENV, "30")
    .output()
    .unwrap();
    let (code, _, stderr) = support::outcome(out);
    assert_ne!(code, 0, "aborted: {stderr}");
    assert!(stderr.contains("reached"), "{stderr}");
    let other = support::namespace(&s.fx.consumer, "resyncpar-rerun").await;
    let rerun = |lease_ns: &str| {
        support::kbind(&[
            "resync",
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            lease_ns,
            "--credential-namespace",
            &s.ns,
            "--selector",
            &selector,
            "--write-concurrency",
            "16",
            "-o",
            "json",
        ])
    };
    let (code, summary, stderr) = rerun(&other);
    assert_eq!(code, 0, "rerun: {summary}\n{stderr}");
    let copies = s.provider().list(&Default::default()).await.unwrap().items;
    assert_eq!(
        copies.len(),
        N,
        "one provider copy per object, nothing else"
    );
    for i in 0..N {
        let name = format!("w{i}");
        let c = s.consumer().get(&name).await.unwrap();
        assert!(
            c.finalizers().iter().any(|f| f == "core.kbind.io/syncer"),
            "{name}: finalizer"
        );
        let p = s.provider().get(&name).await.unwrap();
        assert_eq!(p.data["spec"]["size"], i, "{name}: spec");
        assert_eq!(
            p.annotations().get("core.kbind.io/consumer-object-uid"),
            c.uid().as_ref(),
            "{name}: owned by its consumer object"
        );
    }
    let (code, quiet, stderr) = rerun(&other);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(quiet["data_writes"], 0, "converged: {quiet}");
}

/// A finalizer kbind added that a GitOps tool also lists (its manifest was copied from the
/// cluster, finalizer included): kbind still releases it, so the deleted object goes away.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_finalizer_another_manager_also_lists_is_still_released() {
    let s = setup("cofinal", "Fail").await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    let body = json!({"apiVersion": format!("{}/v1", s.fx.group), "kind": "Widget",
        "metadata": {"name": "w1", "namespace": s.ns, "finalizers": ["core.kbind.io/syncer"]},
        "spec": {"size": 1}});
    s.consumer()
        .patch("w1", &PatchParams::apply("gitops"), &Patch::Apply(&body))
        .await
        .unwrap();
    s.consumer()
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    // The provider copy goes first, then the finalizer (maybe a run later).
    for _ in 0..3 {
        s.resync(&[]);
        if s.consumer().get_opt("w1").await.unwrap().is_none() {
            break;
        }
    }
    assert!(
        s.consumer().get_opt("w1").await.unwrap().is_none(),
        "the deleted object is gone"
    );
    assert!(s.provider().get_opt("w1").await.unwrap().is_none());
}

/// A namespaced Binding syncs its own namespace end to end (spec up, status down, deletion);
/// a ClusterBinding listing the same API wins over it even when it cannot sync (the spec's
/// resolver), and once that ClusterBinding goes the Binding syncs again.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_namespaced_binding_syncs_its_namespace_and_a_cluster_binding_wins_over_it() {
    let fx = Fx::new("nsbind").await;
    let api = fx
        .provider_crd("gadgets", "Namespaced", Some("true"), None)
        .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    fx.binding("b", &conn, &[&api]).await;
    fx.run(&[]);
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Gadget"),
        "gadgets",
    );
    let other = support::namespace(&fx.consumer, "nsbind-other").await;
    let consumer = |ns: &str| Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), ns, &ar);
    let provider = |ns: &str| Api::<DynamicObject>::namespaced_with(fx.provider.clone(), ns, &ar);
    let make = |name: &str, ns: &str| {
        let mut o = DynamicObject::new(name, &ar).data(json!({"spec": {"size": 3}}));
        o.metadata.namespace = Some(ns.to_string());
        o
    };
    consumer(&fx.ns)
        .create(&PostParams::default(), &make("g1", &fx.ns))
        .await
        .unwrap();
    consumer(&other)
        .create(&PostParams::default(), &make("g1", &other))
        .await
        .unwrap();
    fx.pass("resync", &[]);
    assert!(
        provider(&fx.ns).get_opt("g1").await.unwrap().is_some(),
        "synced in its namespace"
    );
    assert!(
        provider(&other).get_opt("g1").await.unwrap().is_none(),
        "another namespace is not covered"
    );
    assert!(
        consumer(&other)
            .get("g1")
            .await
            .unwrap()
            .finalizers()
            .is_empty(),
        "uncovered objects are not touched"
    );
    provider(&fx.ns)
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}})),
        )
        .await
        .unwrap();
    fx.pass("resync", &[]);
    assert_eq!(
        consumer(&fx.ns).get("g1").await.unwrap().data["status"]["phase"],
        "Ready",
        "status comes down through a Binding"
    );
    let st = Api::<kbind::api::core::Binding>::namespaced(fx.consumer.clone(), &fx.ns)
        .get("b")
        .await
        .unwrap()
        .status
        .unwrap();
    let counts = st.bound_apis.iter().find(|a| a.name == api).unwrap();
    assert_eq!(counts.in_sync, Some(1));

    // A ClusterBinding listing the API wins, though it names another Connection: nothing syncs.
    let cb = fx
        .cluster_binding("shadow", "no-such-connection", &[&api])
        .await;
    consumer(&fx.ns)
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    fx.pass("resync", &[]);
    assert_eq!(
        provider(&fx.ns).get("g1").await.unwrap().data["spec"]["size"],
        3,
        "the ClusterBinding is checked first"
    );
    Api::<ClusterBinding>::all(fx.consumer.clone())
        .delete(&cb, &DeleteParams::default())
        .await
        .unwrap();
    support::eventually("shadowing ClusterBinding gone", || async {
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .get_opt(&cb)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    fx.pass("resync", &[]);
    assert_eq!(
        provider(&fx.ns).get("g1").await.unwrap().data["spec"]["size"],
        4,
        "the Binding syncs again"
    );
    // Deletion through the Binding deletes the copy, then releases the object.
    consumer(&fx.ns)
        .delete("g1", &DeleteParams::default())
        .await
        .unwrap();
    fx.pass("resync", &[]);
    fx.pass("resync", &[]);
    assert!(consumer(&fx.ns).get_opt("g1").await.unwrap().is_none());
    assert!(provider(&fx.ns).get_opt("g1").await.unwrap().is_none());
    assert_eq!(fx.pass("resync", &[])["data_writes"], 0);
}

/// One API whose consumer CRD write is forbidden makes the Connection not Ready; its other,
/// healthy API keeps syncing.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_forbidden_crd_write_for_one_api_does_not_stop_the_others() {
    let fx = Fx::new("oneapi").await;
    let good = fx
        .provider_crd("apples", "Namespaced", Some("true"), None)
        .await;
    let bad = fx
        .provider_crd("pears", "Namespaced", Some("true"), None)
        .await;
    // An admission policy on the consumer refuses (403) writing the second API's CRD.
    let denial = support::Denial::create(
        &fx.consumer,
        &format!("{}-deny", fx.label),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["CREATE", "UPDATE"],
        ),
        &format!("object.metadata.name != '{bad}'"),
        "this CRD may not be installed here",
    )
    .await;
    // Admission policies take effect asynchronously: wait until a dry-run create is refused.
    let probe: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(json!({"metadata": {"name": bad}, "spec": {"group": fx.group, "scope": "Namespaced",
            "names": {"plural": "pears", "kind": "Pear"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object"}}}]}}))
        .unwrap();
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(fx.consumer.clone());
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    support::eventually("the admission policy in effect", || async {
        matches!(crds.create(&dry, &probe).await, Err(kube::Error::Api(s)) if s.code == 403)
            .then_some(())
    })
    .await;
    fx.secret("provider", "kubeconfig", &fx.provider_kubeconfig())
        .await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    fx.cluster_binding("cb", &conn, &[&good, &bad]).await;
    fx.run(&[]);
    let st = fx.conn(&conn).await.status.unwrap_or_default();
    let (s, r, m) = cond(&st.conditions, "PermissionDenied");
    assert_eq!((s, r), ("True", "CRDWriteForbidden"), "{m}");
    assert!(fx.consumer_crd(&bad).await.is_none());
    let st = fx.conn(&conn).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "False");
    support::wait_established(&Api::all(fx.consumer.clone()), &good).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Apple"),
        "apples",
    );
    let mut o = DynamicObject::new("a1", &ar).data(json!({"spec": {"size": 1}}));
    o.metadata.namespace = Some(fx.ns.clone());
    Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &fx.ns, &ar)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
    fx.pass("resync", &[]);
    denial.delete().await;
    assert!(
        Api::<DynamicObject>::namespaced_with(fx.provider.clone(), &fx.ns, &ar)
            .get_opt("a1")
            .await
            .unwrap()
            .is_some(),
        "the healthy API syncs although the Connection is not Ready"
    );
}

/// resync trusts neither what a consumer CRD's labels claim nor what a Connection's status says
/// about the consumer: an API the provider does not export is never synced, and a
/// `localClusterUID` that is not this cluster's (written into status before `kbind schema`
/// pinned it) syncs nothing, so it cannot be used to write copies under another consumer's
/// marker (issue #11).
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_hand_labelled_crd_or_a_forged_local_uid_syncs_nothing() {
    let s = setup("trust", "Fail").await;
    // The provider has an API it does not export; a consumer admin copies its CRD and labels it
    // managed by the Connection.
    let hidden = s.fx.provider_crd("secrets", "Namespaced", None, None).await;
    let mut crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(s.fx.provider.clone())
        .get(&hidden)
        .await
        .unwrap();
    crd.metadata = kube::api::ObjectMeta {
        name: Some(hidden.clone()),
        labels: Some([("core.kbind.io/managed".to_string(), "true".to_string())].into()),
        annotations: Some([("core.kbind.io/connection".to_string(), s.conn.clone())].into()),
        ..Default::default()
    };
    crd.status = None;
    support::apply_crds(&s.fx.consumer, &[crd]).await;
    support::wait_established(&Api::all(s.fx.consumer.clone()), &hidden).await;
    Api::<ClusterBinding>::all(s.fx.consumer.clone())
        .patch(
            &s.cb,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"apis": [{"name": s.api}, {"name": hidden}]}})),
        )
        .await
        .unwrap();
    let ar = s.create_of("Secret", "secrets", "loot").await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    let summary = s.resync(&[]);
    assert!(
        summary["counts"]["apisSkippedNotExported"].as_i64() >= Some(1),
        "{summary}"
    );
    assert!(
        Api::<DynamicObject>::namespaced_with(s.fx.provider.clone(), &s.ns, &ar)
            .get_opt("loot")
            .await
            .unwrap()
            .is_none(),
        "an API the provider does not export is never written to"
    );
    assert!(
        s.provider().get_opt("w1").await.unwrap().is_some(),
        "the exported API still syncs"
    );

    // A second Connection whose status claims another consumer's identity (written by anyone
    // allowed to patch Connection status; `kbind schema` would report ClusterIdentityChanged,
    // so the forger also claims Connected and installs the consumer CRD by hand).
    let remote = Api::<k8s_openapi::api::core::v1::Namespace>::all(s.fx.provider.clone())
        .get("kube-system")
        .await
        .unwrap()
        .uid()
        .unwrap();
    let forged_conn =
        s.fx.connection("forged", "provider", json!({"source": "CRD"}), false)
            .await;
    let api2 =
        s.fx.provider_crd("gizmos", "Namespaced", Some("true"), None)
            .await;
    let now = "2026-01-01T00:00:00Z";
    Api::<kbind::api::core::Connection>::all(s.fx.consumer.clone())
        .patch_status(
            &forged_conn,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"localClusterUID": "someone-elses-cluster", "remoteClusterUID": remote,
                "exportedAPIs": [{"name": api2}],
                "conditions": [{"type": "Connected", "status": "True", "reason": "Connected", "message": "", "lastTransitionTime": now},
                               {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now}]}})),
        )
        .await
        .unwrap();
    let mut crd = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(s.fx.provider.clone())
        .get(&api2)
        .await
        .unwrap();
    crd.metadata = kube::api::ObjectMeta {
        name: Some(api2.clone()),
        labels: Some([("core.kbind.io/managed".to_string(), "true".to_string())].into()),
        annotations: Some([("core.kbind.io/connection".to_string(), forged_conn.clone())].into()),
        ..Default::default()
    };
    crd.status = None;
    support::apply_crds(&s.fx.consumer, &[crd]).await;
    s.fx.cluster_binding("forgedcb", &forged_conn, &[&api2])
        .await;
    support::wait_established(&Api::all(s.fx.consumer.clone()), &api2).await;
    let gar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&s.fx.group, "v1", "Gizmo"),
        "gizmos",
    );
    let mut g = DynamicObject::new("g1", &gar).data(json!({"spec": {"size": 1}}));
    g.metadata.namespace = Some(s.ns.clone());
    Api::<DynamicObject>::namespaced_with(s.fx.consumer.clone(), &s.ns, &gar)
        .create(&PostParams::default(), &g)
        .await
        .unwrap();
    s.resync(&[]);
    assert!(
        Api::<DynamicObject>::namespaced_with(s.fx.provider.clone(), &s.ns, &gar)
            .get_opt("g1")
            .await
            .unwrap()
            .is_none(),
        "nothing is written under a forged consumer identity"
    );
}

/// A provider that keeps kbind's copy terminating (a finalizer of its own) does not hold the
/// consumer object, and its namespace's deletion, for ever: the consumer object waits over
/// several runs, then, past `--provider-deletion-wait` counted from its own deletion, is
/// released with a Warning Event; the provider's copy is left to the provider.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_copy_the_provider_keeps_terminating_releases_the_consumer_object_after_the_wait() {
    let s = setup("stuckcopy", "Fail").await;
    s.create(&s.consumer(), "stuck", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    // The provider holds its copy with a finalizer of its own.
    s.provider()
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["provider.example/hold"]}})),
        )
        .await
        .unwrap();
    s.consumer()
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap();
    // Within the wait (the default 30m): the consumer object waits, run after run.
    for round in 1..=3 {
        s.resync(&[]);
        let copy = s.provider().get("stuck").await.unwrap();
        assert!(
            copy.metadata.deletion_timestamp.is_some(),
            "round {round}: our copy deleted"
        );
        assert!(
            s.consumer().get_opt("stuck").await.unwrap().is_some(),
            "round {round}: the consumer object waits for it"
        );
    }
    // Past the wait: released, with a Warning Event; the copy stays the provider's.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    s.resync(&["--provider-deletion-wait", "1s"]);
    assert!(
        s.consumer().get_opt("stuck").await.unwrap().is_none(),
        "released past the wait"
    );
    assert!(
        s.events("ProviderDeletionStuck").await.iter().any(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("stuck")
        }),
        "a Warning Event says so"
    );
    assert!(
        s.provider().get_opt("stuck").await.unwrap().is_some(),
        "the copy is left to the provider"
    );
    let quiet = s.resync(&["--provider-deletion-wait", "1s"]);
    assert_eq!(
        quiet["data_writes"], 0,
        "a run after writes nothing: {quiet}"
    );
    // The provider finishes its deletion.
    s.provider()
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}

/// A Connection serves only the namespaces its `spec.bindingNamespaces` admits, and lets adopt
/// only those its `spec.adoptionNamespaces` admits (#28 item 2): a tenant's Binding elsewhere
/// gets `NamespaceNotAllowed`, no finalizer and no sync, over several runs; once admitted it
/// syncs; adoption waits for its own consent; admission taken back stops the sync and leaves
/// the provider copies; the Binding then deletes cleanly; and it never holds its Connection.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_connection_serves_only_the_namespaces_it_admits() {
    use k8s_openapi::api::core::v1::Namespace;
    use kbind::api::core::{Binding, Connection};
    let fx = Fx::new("tenants").await;
    let (api, conn) = fx.exported("gadgets", "Namespaced").await;
    // The fixture's own namespace is admitted: its Binding installs the CRD.
    fx.binding("own", &conn, &[&api]).await;
    let tenant = support::namespace(&fx.consumer, "tenant").await;
    let bindings = Api::<Binding>::namespaced(fx.consumer.clone(), &tenant);
    fx.binding_in(
        &tenant,
        "theirs",
        &conn,
        &[&api],
        json!({"conflictPolicy": "Adopt"}),
    )
    .await;
    fx.run(&[]);
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Gadget"),
        "gadgets",
    );
    let consumer = Api::<DynamicObject>::namespaced_with(fx.consumer.clone(), &tenant, &ar);
    let provider = Api::<DynamicObject>::namespaced_with(fx.provider.clone(), &tenant, &ar);
    let mut g = DynamicObject::new("g1", &ar).data(json!({"spec": {"size": 3}}));
    g.metadata.namespace = Some(tenant.clone());
    consumer.create(&PostParams::default(), &g).await.unwrap();
    let status = || async { bindings.get("theirs").await.unwrap() };

    // Not admitted (the fixture's Connection admits its own namespace only), over two rounds.
    let exports = || async {
        fx.conn(&conn)
            .await
            .status
            .unwrap_or_default()
            .exported_apis
    };
    for round in 0..2 {
        let before = exports().await;
        let s = fx.run(&[]);
        // Other tests share the provider: its export list may move under the Connection.
        let moved = exports().await != before;
        let r = fx.pass("resync", &[]);
        let theirs = status().await;
        let st = theirs.status.clone().unwrap();
        let (s_, reason, msg) = cond(&st.conditions, "Ready");
        assert_eq!((s_, reason), ("False", "NamespaceNotAllowed"), "{msg}");
        assert!(
            msg.contains(&format!(
                "namespace {tenant} does not match Connection {conn}'s spec.bindingNamespaces"
            )),
            "{msg}"
        );
        let (d, reason, _) = cond(&st.conditions, "PermissionDenied");
        assert_eq!((d, reason), ("True", "NamespaceNotAllowed"));
        assert!(
            theirs.finalizers().is_empty(),
            "no cleanup finalizer on a Binding its Connection does not serve"
        );
        assert!(
            provider.get_opt("g1").await.unwrap().is_none(),
            "not synced"
        );
        assert!(
            consumer.get("g1").await.unwrap().finalizers().is_empty(),
            "its objects are not touched"
        );
        if round == 1 {
            assert_eq!(s["data_writes"], 0, "second schema run: {s}");
            // Moved during the run, the exports may have moved after its discovery: no write.
            let allowed: &[u64] = if moved { &[2, 3] } else { &[2] };
            assert!(
                s["bookkeeping_writes"]
                    .as_u64()
                    .is_some_and(|n| allowed.contains(&n)),
                "Lease only, and the Connection's status when its exports moved: {s}"
            );
            assert_eq!(r["data_writes"], 0, "second resync run: {r}");
        }
    }

    // A foreign object under the same name on the provider, and the namespace admitted.
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": tenant}})).unwrap();
    Api::<Namespace>::all(fx.provider.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let mut foreign = DynamicObject::new("g2", &ar).data(json!({"spec": {"size": 1}}));
    foreign.metadata.namespace = Some(tenant.clone());
    provider
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let mut g2 = DynamicObject::new("g2", &ar).data(json!({"spec": {"size": 5}}));
    g2.metadata.namespace = Some(tenant.clone());
    consumer.create(&PostParams::default(), &g2).await.unwrap();
    let nss = Api::<Namespace>::all(fx.consumer.clone());
    let label = |v: Value| {
        let (nss, tenant) = (nss.clone(), tenant.clone());
        async move {
            nss.patch(
                &tenant,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"kbind-tenant": v}}})),
            )
            .await
            .unwrap();
        }
    };
    label(json!("yes")).await;
    let conns = Api::<Connection>::all(fx.consumer.clone());
    conns
        .patch(
            &conn,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"bindingNamespaces": {"matchLabels": null, "matchExpressions": [
            {"key": "kbind-tenant", "operator": "In", "values": ["yes"]}]}}}),
            ),
        )
        .await
        .unwrap();
    // The fixture's own namespace no longer matches; label it too.
    Api::<Namespace>::all(fx.consumer.clone())
        .patch(
            &fx.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kbind-tenant": "yes"}}})),
        )
        .await
        .unwrap();
    fx.run(&[]);
    let theirs = status().await;
    let (s_, reason, msg) = cond(&theirs.status.as_ref().unwrap().conditions, "Ready");
    assert_eq!((s_, reason), ("True", "Bound"), "{msg}");
    assert!(
        theirs
            .finalizers()
            .contains(&"core.kbind.io/cleanup".to_string())
    );
    fx.pass("resync", &[]);
    fx.pass("resync", &[]);
    assert_eq!(
        provider.get("g1").await.unwrap().data["spec"]["size"],
        3,
        "admitted: synced"
    );
    // Adopt asked for, not consented to: g2 is a conflict that says why.
    assert_eq!(provider.get("g2").await.unwrap().data["spec"]["size"], 1);
    let st = status().await.status.unwrap();
    let (c, _, msg) = cond(&st.conditions, "Conflicts");
    assert_eq!(c, "True");
    assert!(
        msg.contains(&format!("Connection {conn}'s spec.adoptionNamespaces")),
        "{msg}"
    );
    let r = fx.pass("resync", &[]);
    assert_eq!(r["data_writes"], 0, "a steady conflict writes nothing: {r}");

    // Adoption consented to for the namespace: g2 is taken over.
    conns
        .patch(
            &conn,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"adoptionNamespaces": {"matchLabels": {"kbind-tenant": "yes"}}}}),
            ),
        )
        .await
        .unwrap();
    fx.pass("resync", &[]);
    fx.pass("resync", &[]);
    assert_eq!(
        provider.get("g2").await.unwrap().data["spec"]["size"],
        5,
        "adopted"
    );
    let st = status().await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Conflicts").0, "False");

    // Admission taken back: the sync stops, the provider copies stay, conditions say why.
    label(Value::Null).await;
    consumer
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 9}})),
        )
        .await
        .unwrap();
    for round in 0..2 {
        let s = fx.run(&[]);
        let r = fx.pass("resync", &[]);
        let st = status().await.status.unwrap();
        assert_eq!(cond(&st.conditions, "Ready").1, "NamespaceNotAllowed");
        assert_eq!(
            provider.get("g1").await.unwrap().data["spec"]["size"],
            3,
            "not synced any more"
        );
        assert!(
            provider.get_opt("g2").await.unwrap().is_some(),
            "provider copies stay"
        );
        if round == 1 {
            assert_eq!(s["data_writes"], 0, "{s}");
            assert_eq!(r["data_writes"], 0, "{r}");
        }
    }

    // Deleted while not served: released (consumer side only), the copies stay.
    bindings
        .delete("theirs", &DeleteParams::default())
        .await
        .unwrap();
    for _ in 0..3 {
        fx.pass("resync", &[]);
        fx.run(&[]);
        if bindings.get_opt("theirs").await.unwrap().is_none() {
            break;
        }
    }
    assert!(
        bindings.get_opt("theirs").await.unwrap().is_none(),
        "the Binding is gone"
    );
    assert!(provider.get_opt("g1").await.unwrap().is_some());
    assert!(provider.get_opt("g2").await.unwrap().is_some());
    assert!(
        consumer.get("g1").await.unwrap().finalizers().is_empty(),
        "its objects released"
    );

    // A Binding the Connection does not serve never holds it: deleted with only such a
    // Binding left (and the fixture's own one going), the Connection goes.
    fx.binding_in(&tenant, "holdout", &conn, &[&api], json!({}))
        .await;
    Api::<Binding>::namespaced(fx.consumer.clone(), &fx.ns)
        .delete("own", &DeleteParams::default())
        .await
        .unwrap();
    conns.delete(&conn, &DeleteParams::default()).await.unwrap();
    for _ in 0..4 {
        fx.pass("resync", &[]);
        fx.run(&[]);
        if conns.get_opt(&conn).await.unwrap().is_none() {
            break;
        }
    }
    let left = conns.get_opt(&conn).await.unwrap();
    assert!(
        left.is_none(),
        "the Connection is gone: {:?}",
        left.and_then(|c| c.status).map(|s| s.conditions)
    );
    assert!(bindings.get_opt("holdout").await.unwrap().is_some());
}

/// A copy is re-adopted (or restored) only into the namespace it came from (#28 item 4): a
/// namespace deleted (its object's finalizer removed by hand) and created again under the same
/// name, perhaps by someone else, gets nothing: under `spec.orphans: Restore` the copy is marked
/// `NamespaceRecreated`, not restored; an object of the same name there meets a
/// `NamespaceRecreated` conflict and the copy is untouched; each over two runs, the second
/// writing nothing. Once the copy is gone on the provider, the new object syncs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_namespace_created_again_re_adopts_nothing() {
    use k8s_openapi::api::core::v1::Namespace;
    let s = setup("nsagain", "Fail").await;
    s.set_orphans("Restore").await;
    let nss = Api::<Namespace>::all(s.fx.consumer.clone());
    let t = support::namespace(&s.fx.consumer, "again").await;
    let consumer = Api::<DynamicObject>::namespaced_with(s.fx.consumer.clone(), &t, &s.ar);
    let provider = Api::<DynamicObject>::namespaced_with(s.fx.provider.clone(), &t, &s.ar);
    let object = |size: i64| {
        let mut o = DynamicObject::new("w", &s.ar).data(json!({"spec": {"size": size}}));
        o.metadata.namespace = Some(t.clone());
        o
    };
    consumer
        .create(&PostParams::default(), &object(1))
        .await
        .unwrap();
    s.resync(&[]);
    let first_uid = nss.get(&t).await.unwrap().uid().unwrap();
    let copy = provider.get("w").await.expect("synced");
    assert_eq!(
        copy.annotations()
            .get("core.kbind.io/consumer-namespace-uid"),
        Some(&first_uid),
        "the copy records its namespace"
    );

    // The namespace goes (the object's finalizer removed by hand: the copy stays), and comes
    // back under the same name with another UID.
    consumer
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    nss.delete(&t, &DeleteParams::default()).await.unwrap();
    let mut gone = false;
    for _ in 0..600 {
        if nss.get_opt(&t).await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "namespace {t} deleted within 60 s");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": t}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    assert_ne!(nss.get(&t).await.unwrap().uid().unwrap(), first_uid);

    // Orphans: Restore does not restore into the new namespace; the copy is marked, once.
    for round in 0..2 {
        let r = s.resync(&[]);
        assert!(
            consumer.get_opt("w").await.unwrap().is_none(),
            "not restored into a namespace created again"
        );
        let copy = provider.get("w").await.unwrap();
        assert_eq!(
            copy.annotations()
                .get("core.kbind.io/orphaned")
                .map(String::as_str),
            Some("NamespaceRecreated")
        );
        assert_eq!(copy.data["spec"]["size"], 1);
        if round == 1 {
            assert_eq!(r["data_writes"], 0, "{r}");
        }
    }

    // An object of the same name there: a conflict saying why; the copy untouched.
    consumer
        .create(&PostParams::default(), &object(7))
        .await
        .unwrap();
    for round in 0..2 {
        let r = s.resync(&[]);
        let c = consumer.get("w").await.unwrap();
        assert_eq!(
            c.annotations()
                .get("core.kbind.io/conflict")
                .map(String::as_str),
            Some("NamespaceRecreated")
        );
        let copy = provider.get("w").await.unwrap();
        assert_eq!(copy.data["spec"]["size"], 1, "not taken over");
        assert_eq!(
            copy.annotations()
                .get("core.kbind.io/consumer-namespace-uid"),
            Some(&first_uid)
        );
        if round == 1 {
            assert_eq!(r["data_writes"], 0, "{r}");
        }
    }
    let st = Api::<ClusterBinding>::all(s.fx.consumer.clone())
        .get(&s.cb)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(cond(&st.conditions, "Conflicts").0, "True");

    // The provider removes its old copy: the new object syncs, the conflict clears.
    provider
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    s.resync(&[]);
    s.resync(&[]);
    let copy = provider.get("w").await.expect("the new object synced");
    assert_eq!(copy.data["spec"]["size"], 7);
    assert!(
        consumer
            .get("w")
            .await
            .unwrap()
            .annotations()
            .get("core.kbind.io/conflict")
            .is_none()
    );
}

/// #28 item 5 (docs/operations.md "Poison items"): resync runs that keep dying while syncing
/// through one Connection (killed here by the crash knob as they start on it, as a provider
/// answer blowing the pod's memory would) stop starving the Connections after it: once two
/// runs in a row are known to have died on it, it is skipped, said once with an Event, and
/// the rest sync.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_connection_two_runs_in_a_row_died_on_is_skipped_and_the_rest_sync() {
    let s = setup("rpoison", "Fail").await;
    // A second Connection `q` to the same provider, binding `gadgets`: its API sorts first.
    let gadgets =
        s.fx.provider_crd("gadgets", "Namespaced", Some("true"), None)
            .await;
    let q =
        s.fx.connection("q", "provider", json!({"source": "CRD"}), false)
            .await;
    let cb2 = s.fx.cluster_binding("cb2", &q, &[&gadgets]).await;
    s.fx.run(&[]);
    support::wait_established(&Api::all(s.fx.consumer.clone()), &gadgets).await;
    s.ensure_provider_ns().await;
    // `g1` reaches the provider before `q` turns poison; `w1`, through the other Connection, after.
    let gadget = s.create_of("Gadget", "gadgets", "g1").await;
    s.fx.pass("resync", &[]);
    let gadget_copies =
        Api::<DynamicObject>::namespaced_with(s.fx.provider.clone(), &s.ns, &gadget);
    assert!(gadget_copies.get_opt("g1").await.unwrap().is_some());
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;

    let item = format!("Connection/{q}");
    let knob = [("KBIND_CRASH_AT_ITEM", item.as_str())];
    // The first death names nothing (no renewal recorded `q` yet); the next two, careful,
    // record `q` before dying on it.
    for run in 1..=3 {
        let (code, out, stderr) =
            s.fx.try_pass_env("resync", &["--lease-duration", "1s"], &knob);
        assert_ne!(code, 0, "run {run}: {out}\n{stderr}");
        assert!(stderr.contains("reached, aborting"), "run {run}: {stderr}");
        assert!(
            s.provider().get_opt("w1").await.unwrap().is_none(),
            "run {run}: starved"
        );
        std::thread::sleep(std::time::Duration::from_millis(1500));
    }
    let (code, out, stderr) = s.fx.try_pass_env("resync", &[], &knob);
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert_eq!(out["counts"]["apisSkippedQuarantined"], 1, "{out}");
    assert!(
        s.provider().get_opt("w1").await.unwrap().is_some(),
        "the other Connection syncs: {out}"
    );
    let uid = s.fx.conn(&q).await.uid().unwrap();
    let note = support::event_note(&s.fx.consumer, "default", "Quarantined", &uid)
        .await
        .expect("a Quarantined Event on the Connection");
    assert!(
        note.contains("two runs of kbind resync in a row died"),
        "{note}"
    );
    // The next run: skipped again, no data written, no second Event.
    let (code, out, stderr) = s.fx.try_pass_env("resync", &[], &knob);
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert_eq!(out["counts"]["apisSkippedQuarantined"], 1, "{out}");
    assert_eq!(out["data_writes"], 0, "{out}");
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(s.fx.consumer.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Quarantined")
                    && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
            })
            .count();
    assert_eq!(events, 1, "said once");

    // Unbinding `cb2` must mark its provider copies orphaned through `q`, which no run may
    // contact now: the unbind waits and says why (the model test's seed 98452536 found it
    // released with `g1` unmarked for good), and a second run writes nothing.
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    cbs.delete(&cb2, &DeleteParams::default()).await.unwrap();
    let mut seen = None;
    for run in 1..=2 {
        let (code, out, stderr) = s.fx.try_pass_env("resync", &[], &knob);
        assert_eq!(code, 0, "run {run}: {out}\n{stderr}");
        let b = cbs.get(&cb2).await.unwrap();
        let conds = b.status.clone().unwrap().conditions;
        let (status, reason, message) = cond(&conds, "InstancesReleased");
        assert_eq!(
            (status, reason),
            ("False", "ConnectionQuarantined"),
            "run {run}: {out}"
        );
        assert!(
            message.contains(&format!("Connection {q} is quarantined")),
            "{message}"
        );
        if let Some(rv) = seen.replace(b.resource_version()) {
            assert_eq!(
                rv,
                b.resource_version(),
                "the second run leaves the binding alone: {out}"
            );
            assert_eq!(out["data_writes"], 0, "{out}");
        }
    }
    let copy = gadget_copies.get("g1").await.unwrap();
    assert_eq!(
        copy.annotations().get(kbind::api::keys::ORPHANED),
        None,
        "not contacted"
    );

    // The operator clears the quarantine: the next run marks `g1` and releases `cb2`, and
    // kbind schema finishes the unbind.
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(s.fx.consumer.clone(), &s.fx.ns)
        .patch(
            "kbind-resync",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"kbind.io/quarantined": null}}})),
        )
        .await
        .unwrap();
    let out = s.fx.pass("resync", &[]);
    let copy = gadget_copies.get("g1").await.unwrap();
    assert_eq!(
        copy.annotations()
            .get(kbind::api::keys::ORPHANED)
            .map(String::as_str),
        Some(kbind::api::keys::ORPHANED_UNBOUND),
        "{out}"
    );
    let b = cbs.get(&cb2).await.unwrap();
    assert_eq!(
        cond(&b.status.unwrap().conditions, "InstancesReleased").0,
        "True",
        "{out}"
    );
    s.fx.run(&[]);
    assert!(
        cbs.get_opt(&cb2).await.unwrap().is_none(),
        "the unbind finished"
    );
    assert!(
        gadget_copies.get_opt("g1").await.unwrap().is_some(),
        "the provider copy stays"
    );
}

/// #31 item 10: `kbind schema` and `kbind resync` fire at the same CronJob tick. A binding
/// created since the last tick is set up by schema while resync already runs; with
/// `--first-sync-window` (the shipped CronJob's 30s) resync follows it and its first object,
/// created once its CRD is Established, reaches the provider in that same run, not a period
/// later. The next run finds the binding synced: it follows nothing and writes 0. A new binding
/// that is never set up holds a run no longer than its window; without the flag (a one-off
/// run) there is no window.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_new_binding_syncs_in_the_run_that_sees_it_set_up() {
    let fx = Fx::new("firstsync").await;
    let (api, conn) = fx.exported("widgets", "Namespaced").await;
    fx.run(&[]);
    assert_eq!(
        cond(&fx.conn(&conn).await.status.unwrap().conditions, "Ready").0,
        "True"
    );
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
        "widgets",
    );
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": fx.ns}})).unwrap();
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(fx.provider.clone())
        .create(&PostParams::default(), &ns)
        .await;
    fx.cluster_binding("cb", &conn, &[&api]).await;

    // The tick: resync starts, schema a moment after; the object as soon as its CRD is there.
    let consumer_crds = Api::all(fx.consumer.clone());
    let objects: Api<DynamicObject> = Api::namespaced_with(fx.consumer.clone(), &fx.ns, &ar);
    let resync = fx.pass_async("resync", &["--first-sync-window=30s"]);
    let schema_then_object = async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        fx.pass_async("schema", &[]).await;
        support::wait_established(&consumer_crds, &api).await;
        let mut o = DynamicObject::new("first", &ar).data(json!({"spec": {"size": 1}}));
        o.metadata.namespace = Some(fx.ns.clone());
        objects.create(&PostParams::default(), &o).await.unwrap();
    };
    let (s, ()) = tokio::join!(resync, schema_then_object);
    assert_eq!(s["outcome"], "completed", "{s}");
    assert!(
        s["counts"]["firstSyncLooks"].as_i64().unwrap_or(0) >= 1,
        "{s}"
    );
    let provider: Api<DynamicObject> = Api::namespaced_with(fx.provider.clone(), &fx.ns, &ar);
    let copy = provider.get_opt("first").await.unwrap();
    assert!(
        copy.is_some(),
        "the first object went up in the run that saw it set up: {s}"
    );
    assert_eq!(copy.unwrap().data["spec"]["size"], 1);

    // The next runs: the binding was synced, so nothing is followed and nothing written.
    for _ in 0..2 {
        let s = fx.pass("resync", &["--first-sync-window=30s"]);
        assert_eq!(s["data_writes"], 0, "{s}");
        assert!(s["counts"].get("firstSyncLooks").is_none(), "{s}");
    }

    // A new binding never set up (its API not exported) holds a run for its window only.
    fx.cluster_binding("never", &conn, &[&format!("nothings.{}", fx.group)])
        .await;
    let s = fx.pass("resync", &["--first-sync-window=6s"]);
    assert_eq!(s["outcome"], "completed", "{s}");
    assert!(
        s["counts"]["firstSyncLooks"].as_i64().unwrap_or(0) >= 1,
        "{s}"
    );
    let took = s["duration_seconds"].as_f64().unwrap_or(f64::MAX);
    assert!(took < 6.0 + 10.0, "the window ends on time: {took} s");
    // Without the flag, a run (a one-off, by an operator) has no window.
    let s = fx.pass("resync", &[]);
    assert!(s["counts"].get("firstSyncLooks").is_none(), "{s}");
}

/// A ClusterBinding deleted after its provider withdrew the export: the run's sync no longer goes
/// through that Connection, yet its release reaches the provider and marks the copy orphaned. It
/// used to release as if the provider were unreachable, leaving the copy unmarked for good.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_unbind_after_the_export_is_withdrawn_still_marks_the_copies() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let s = setup("rwithdrawn", "Fail").await;
    s.ensure_provider_ns().await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    assert!(s.provider().get_opt("w1").await.unwrap().is_some());

    // The provider withdraws the export; kbind schema drops it from the Connection's status.
    Api::<CustomResourceDefinition>::all(s.fx.provider.clone())
        .patch(
            &s.api,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"core.kbind.io/exported": null}}})),
        )
        .await
        .unwrap();
    s.fx.run(&[]);
    let exported = s.fx.conn(&s.conn).await.status.unwrap().exported_apis;
    assert!(
        !exported.iter().any(|e| e.name == s.api),
        "withdrawn: {exported:?}"
    );

    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    let out = s.resync(&[]);
    assert_eq!(out["counts"]["apisSkippedNotExported"], 1, "{out}");
    let copy = s.provider().get("w1").await.unwrap();
    assert_eq!(
        copy.annotations()
            .get(kbind::api::keys::ORPHANED)
            .map(String::as_str),
        Some(kbind::api::keys::ORPHANED_UNBOUND),
        "the copy is marked: {out}"
    );
    let b = cbs.get(&s.cb).await.unwrap();
    assert_eq!(
        cond(&b.status.unwrap().conditions, "InstancesReleased").0,
        "True",
        "{out}"
    );

    // Released, the binding waits for kbind schema: the next resync run connects nowhere for it.
    let again = s.resync(&[]);
    assert_eq!(again["data_writes"], 0, "second resync run: {again}");
    assert_eq!(
        again["bookkeeping_writes"], 2,
        "the Lease only, no heartbeat of a needless connect: {again}"
    );
}

/// An unbind while the provider cannot be reached (its credential broken) still releases the
/// binding: the copies stay unmarked, never deleted, and the ProviderCopiesKept Event says so
/// instead of counting copies nobody looked at. The next run writes nothing; with the
/// credential fixed, a re-bind marks the copy `ConsumerObjectGone`, as the Event promises.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_unbind_the_provider_cannot_be_reached_for_says_the_copies_stay_unmarked() {
    let s = setup("runreached", "Fail").await;
    s.ensure_provider_ns().await;
    s.create(&s.consumer(), "w1", json!({"spec": {"size": 1}}))
        .await;
    s.resync(&[]);
    assert!(s.provider().get_opt("w1").await.unwrap().is_some());

    // The credential breaks: resync can no longer build a provider client.
    let r = s.fx.conn(&s.conn).await.spec.kubeconfig_secret_ref;
    s.fx.secret(&r.name, &r.key, "not a kubeconfig").await;
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    let uid = cbs.get(&s.cb).await.unwrap().uid().unwrap();
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    let out = s.resync(&[]);
    let b = cbs.get(&s.cb).await.unwrap();
    assert_eq!(
        cond(&b.status.unwrap().conditions, "InstancesReleased").0,
        "True",
        "{out}"
    );
    let copy = s.provider().get("w1").await.expect("the copy stays");
    assert_eq!(copy.annotations().get(kbind::api::keys::ORPHANED), None);
    let note = support::event_note(&s.fx.consumer, "default", "ProviderCopiesKept", &uid)
        .await
        .expect("an Event on the ClusterBinding");
    assert!(
        note.contains(&format!("copies of {} were not all marked", s.api))
            && note.contains("the provider was not reached"),
        "{note}"
    );
    assert!(
        !note.contains("provider copies stay"),
        "no count of copies nobody looked at: {note}"
    );

    // A second run: the release is done, so nothing is written, not even the binding's status
    // (the Lease's take and release are the only writes).
    let released = cbs.get(&s.cb).await.unwrap();
    let again = s.resync(&[]);
    assert_eq!(again["data_writes"], 0, "{again}");
    assert_eq!(again["bookkeeping_writes"], 2, "{again}");
    assert_eq!(
        cbs.get(&s.cb).await.unwrap().resource_version(),
        released.resource_version(),
        "no condition changed: {again}"
    );
    assert_eq!(
        s.provider().get("w1").await.unwrap().resource_version(),
        copy.resource_version(),
        "the copy untouched"
    );

    // The credential fixed and the unbind finished, a re-bind marks the copy the unbind could
    // not, as the Event promised: its consumer object is gone, and the copy is kept.
    s.fx.secret(&r.name, &r.key, &s.fx.provider_kubeconfig())
        .await;
    s.fx.run(&[]);
    support::eventually("binding gone", || async {
        cbs.get_opt(&s.cb).await.unwrap().is_none().then_some(())
    })
    .await;
    support::eventually("consumer CRD gone", || async {
        s.fx.consumer_crd(&s.api).await.is_none().then_some(())
    })
    .await;
    assert_eq!(s.fx.cluster_binding("cb", &s.conn, &[&s.api]).await, s.cb);
    for _ in 0..2 {
        s.fx.run(&[]);
        support::wait_established(&Api::all(s.fx.consumer.clone()), &s.api).await;
        s.resync(&[]);
    }
    let copy = s
        .provider()
        .get("w1")
        .await
        .expect("kept through the re-bind");
    assert_eq!(
        copy.annotations()
            .get(kbind::api::keys::ORPHANED)
            .map(String::as_str),
        Some(kbind::api::keys::ORPHANED_CONSUMER_OBJECT_GONE)
    );
    assert!(
        s.consumer().get_opt("w1").await.unwrap().is_none(),
        "nothing restored unasked"
    );
    assert_eq!(s.resync(&[])["data_writes"], 0, "marked: nothing to write");
}

/// A run killed while it marks a released binding's provider copies (after its first mark) is
/// blamed on that binding's Connection, as a death while syncing through it would be
/// (docs/operations.md "Poison items"), not on the Connection the sync reached last; and the
/// next run finishes the unbind.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_killed_while_marking_released_copies_is_blamed_on_their_connection() {
    use k8s_openapi::api::coordination::v1::Lease;
    let s = setup("rkillrel", "Fail").await;
    // Two more bound APIs, so the sync reaches the unbound binding's Connection and then another
    // before the release step: `apples` through the same Connection, `zebras` (sorted last)
    // through a second one, `q`.
    let apples =
        s.fx.provider_crd("apples", "Namespaced", Some("true"), None)
            .await;
    let zebras =
        s.fx.provider_crd("zebras", "Namespaced", Some("true"), None)
            .await;
    let q =
        s.fx.connection("q", "provider", json!({"source": "CRD"}), false)
            .await;
    s.fx.cluster_binding("cb-apples", &s.conn, &[&apples]).await;
    s.fx.cluster_binding("cb-zebras", &q, &[&zebras]).await;
    s.fx.run(&[]);
    for api in [&apples, &zebras] {
        support::wait_established(&Api::all(s.fx.consumer.clone()), api).await;
    }
    s.ensure_provider_ns().await;
    for i in 0..2 {
        s.create(
            &s.consumer(),
            &format!("w{i}"),
            json!({"spec": {"size": i}}),
        )
        .await;
    }
    s.resync(&[]);
    assert_eq!(s.resync(&[])["data_writes"], 0);
    let cbs = Api::<ClusterBinding>::all(s.fx.consumer.clone());
    cbs.delete(&s.cb, &DeleteParams::default()).await.unwrap();
    let knob = [("KBIND_CRASH_AFTER_WRITES", "1")];
    let unbound = || async {
        let mut n = 0;
        for i in 0..2 {
            let copy = s
                .provider()
                .get(&format!("w{i}"))
                .await
                .expect("copies are kept");
            if copy
                .annotations()
                .get(kbind::api::keys::ORPHANED)
                .map(String::as_str)
                == Some(kbind::api::keys::ORPHANED_UNBOUND)
            {
                n += 1;
            }
        }
        n
    };
    let leases = Api::<Lease>::namespaced(s.fx.consumer.clone(), &s.ns);
    let working_on = || async {
        let lease = leases.get("kbind-resync").await.unwrap();
        lease
            .annotations()
            .get(kbind::pass::poison::WORKING_ON)
            .cloned()
            .unwrap_or_default()
    };
    // A killed run's Lease, expired now rather than waited out (a holder that died is taken
    // over once its last renewal is a Lease duration old): the next run is careful.
    let expire = || async {
        leases
            .patch(
                "kbind-resync",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"renewTime": "2000-01-01T00:00:00.000000Z"}})),
            )
            .await
            .unwrap();
    };
    // One write at a time, so a crash point is one copy marked (docs/testing.md "Test-only
    // code"). Run 1 dies after marking one copy. Its Lease lasts 60 s, renewed every 20: it
    // dies before a renewal records what it worked on, so nothing is blamed for this death.
    let (code, out, stderr) = s.fx.try_pass_env(
        "resync",
        &["--lease-duration", "60s", "--write-concurrency", "1"],
        &knob,
    );
    assert_ne!(code, 0, "{out}\n{stderr}");
    assert!(stderr.contains("reached, aborting"), "{stderr}");
    assert_eq!(unbound().await, 1);
    assert_eq!(working_on().await, "", "run 1 recorded nothing");
    expire().await;
    // Run 2 takes over from a dead holder, so it is careful: it records each item as it starts
    // it (waiting up to a third of its 30 s Lease for that write). It dies after marking the
    // other copy, inside the release step.
    let (code, out, stderr) = s.fx.try_pass_env(
        "resync",
        &["--lease-duration", "30s", "--write-concurrency", "1"],
        &knob,
    );
    assert_ne!(code, 0, "{out}\n{stderr}");
    assert!(stderr.contains("reached, aborting"), "{stderr}");
    assert_eq!(unbound().await, 2);
    let blamed = working_on().await;
    assert!(
        blamed.contains(&format!("Connection/{}@", s.conn))
            && !blamed.contains(&format!("Connection/{q}@")),
        "the death is blamed on the Connection whose copies were being marked: {blamed:?}"
    );
    expire().await;
    // Run 3 lives: it finishes the unbind, and a death on the Connection once is no quarantine.
    let (code, out, stderr) = s.fx.try_pass_env("resync", &[], &[]);
    assert_eq!(code, 0, "{out}\n{stderr}");
    let b = cbs.get(&s.cb).await.unwrap();
    assert_eq!(
        cond(&b.status.unwrap().conditions, "InstancesReleased").0,
        "True",
        "{out}"
    );
    let lease = leases.get("kbind-resync").await.unwrap();
    assert!(
        !lease
            .annotations()
            .get(kbind::pass::poison::QUARANTINED)
            .is_some_and(|q| q.contains(&s.conn)),
        "{:?}",
        lease.annotations()
    );
    assert_eq!(s.resync(&[])["data_writes"], 0);
}
