//! The schema/resync fixture of the model test (docs/testing.md) and its checks: one step at a
//! time against the real servers, then invariants 1-3 against the model
//! (tests/support/model_gen.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind::api::core::{Binding, ClusterBinding, Connection};
use kbind::api::keys;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::model::Config;
use crate::model::model_gen::{self, BINDING_NS, CObj, Key, Kill, Model, Orphans, PObj, Pass};
use crate::model::runs::{LEASE_NS, Prof, Quiet, RunOutcome, Runs, Violation, command, harness};
use crate::support::{self, fx::Fx};

pub const ORPHANED: &str = keys::ORPHANED;
pub const ORPHAN_REASONS: [&str; 2] = [keys::ORPHANED_UNBOUND, keys::ORPHANED_CONSUMER_OBJECT_GONE];
pub const FOREIGN_OBJECT_EXISTS: &str = "ForeignObjectExists";

/// What the servers hold, read after every step.
pub struct Obs {
    pub crd: Option<CustomResourceDefinition>,
    pub consumer: BTreeMap<Key, DynamicObject>,
    pub provider: BTreeMap<Key, DynamicObject>,
    pub cb: Option<ClusterBinding>,
    /// The Binding in namespace `b`.
    pub nb: Option<Binding>,
    pub conn: Connection,
    /// The kubeconfig in the Connection's Secret, and in the Grant's Secret on the provider
    /// (compared, never printed).
    pub secret_kc: Option<String>,
    pub grant_kc: Option<String>,
}

/// The `kubeconfig` key of a Secret, as text.
fn kubeconfig_of(s: Option<Secret>) -> Option<String> {
    let bytes = s?.data?.remove("kubeconfig")?;
    String::from_utf8(bytes.0).ok()
}

impl Obs {
    pub fn crd_deleting(&self) -> bool {
        self.crd
            .as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some())
    }

    pub fn crd_established(&self) -> bool {
        self.crd.as_ref().is_some_and(|c| {
            c.metadata.deletion_timestamp.is_none()
                && c.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
        })
    }
}

/// One fixture (its own API group, namespaces, Connection, ClusterBinding) and the model of it.
pub struct World {
    pub fx: Fx,
    pub api: String,
    pub ar: ApiResource,
    pub conn: String,
    pub cb: String,
    /// The Binding's name (in namespace `b`, `nss[1]`), created by `bind b`.
    pub nb: String,
    /// The Grant's Secret on the provider (in `sa_ns`), which `kbind schema` pulls the
    /// Connection's kubeconfig from (rotation by pull).
    pub grant: String,
    pub nss: Vec<String>,
    pub sa_ns: String,
    pub crb: String,
    pub kubeconfig: String,
    pub rotations: u32,
    pub local_uid: String,
    pub runs: Runs,
    pub extra: Vec<String>,
    pub credential_ns: bool,
    pub m: Model,
    pub quiet: Quiet,
    pub ignore: BTreeSet<String>,
    /// Violations of ignored checks, reported at the end.
    pub ignored: Vec<String>,
    pub step_no: usize,
    /// Where this sequence's time went, besides its runs (those are in `runs.prof`).
    pub prof: Prof,
    /// The pass of the run this step made (clean or killed), for the checks after it.
    pub ran: Option<Pass>,
    /// Per slot, the provider copy's spec and whether the consumer object held the syncer
    /// finalizer, as last observed: an object no binding covers is not touched.
    pub last_seen: BTreeMap<Key, (Option<Value>, bool)>,
}

pub const SA: &str = "model-syncer";

impl World {
    pub async fn new(cfg: &Config) -> Self {
        let fx = Fx::new("model").await;
        let (api, conn, cb) = fx.bound_api("widgets", "Namespaced").await;
        let ns_b = support::namespace(&fx.consumer, "model-b").await;
        // The Connection's identity: a ServiceAccount of the provider (fresh tokens on rotation).
        let sa_ns = support::namespace(&fx.provider, "model-sa").await;
        let kubeconfig = support::service_account_kubeconfig(&fx.env.provider, &sa_ns, SA).await;
        let crb = format!("{}-syncer", fx.label);
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
            serde_json::from_value(json!({"metadata": {"name": crb},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": sa_ns}]}))
            .unwrap();
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(fx.provider.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("ClusterRoleBinding");
        fx.secret("provider", "kubeconfig", &kubeconfig).await;
        // Rotation by pull (docs/binding-flow.md): the Secret names the Grant's Secret on the
        // provider, which `reissue` rewrites and `kbind schema` pulls from.
        let grant = "model-grant".to_string();
        let gs: Secret = serde_json::from_value(json!({"metadata": {"name": grant},
            "stringData": {"kubeconfig": kubeconfig}}))
        .unwrap();
        Api::<Secret>::namespaced(fx.provider.clone(), &sa_ns)
            .create(&PostParams::default(), &gs)
            .await
            .expect("the Grant's Secret");
        Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
            .patch(
                "provider",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {keys::GRANT_SECRET: format!("{sa_ns}/{grant}")}}})),
            )
            .await
            .expect("grant-secret annotation");
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .patch(
                &cb,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"conflictPolicy": "Fail"}})),
            )
            .await
            .expect("conflictPolicy");
        // The Binding lives in namespace b: its Connection serves it (docs/schema.md
        // "Namespaced Bindings").
        Api::<kbind::api::core::Connection>::all(fx.consumer.clone())
            .patch(
                &conn,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"bindingNamespaces": {"matchLabels": null, "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [&fx.ns, &ns_b]}]}}})),
            )
            .await
            .expect("bindingNamespaces");
        let local_uid = fx
            .conn(&conn)
            .await
            .status
            .and_then(|s| s.local_cluster_uid)
            .expect("the setup run pinned the local cluster");
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&fx.group, "v1", "Widget"),
            "widgets",
        );
        let nss = vec![fx.ns.clone(), ns_b];
        let runs = Runs::new(cfg.lease, fx.consumer.clone(), &fx.ns);
        let mut w = World {
            fx,
            api,
            ar,
            conn,
            cb,
            nb: "model-nb".into(),
            grant,
            nss,
            sa_ns,
            crb,
            kubeconfig,
            rotations: 0,
            local_uid,
            runs,
            extra: cfg.extra.clone(),
            credential_ns: cfg.credential_ns,
            m: Model {
                bound: true,
                ns_teardown_done: true,
                ..Default::default()
            },
            quiet: Quiet::new(&["schema", "resync", "schema", "resync"]),
            ignore: cfg.ignore.clone(),
            ignored: Vec::new(),
            step_no: 0,
            prof: Prof::default(),
            ran: None,
            last_seen: BTreeMap::new(),
        };
        let o = w.observe().await.expect("first observation");
        w.m.crd_ready = o.crd_established();
        w.remember(&o);
        let snap = w.snapshot(&o);
        w.quiet.reset(&snap);
        w
    }

    /// Best effort: the cluster-scoped object this fixture made on the provider.
    pub async fn cleanup(&self) {
        let _ =
            Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(self.fx.provider.clone())
                .delete(&self.crb, &DeleteParams::default())
                .await;
    }

    pub fn key_of(&self, o: &DynamicObject) -> Option<Key> {
        let ns = self
            .nss
            .iter()
            .position(|n| Some(n) == o.metadata.namespace.as_ref())?;
        let name: u8 = o.name_any().strip_prefix('w')?.parse().ok()?;
        (name < model_gen::NAMES).then_some(Key { ns: ns as u8, name })
    }

    pub fn consumer_api(&self, k: Key) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.consumer.clone(), &self.nss[k.ns as usize], &self.ar)
    }

    pub fn provider_api(&self, k: Key) -> Api<DynamicObject> {
        Api::namespaced_with(self.fx.provider.clone(), &self.nss[k.ns as usize], &self.ar)
    }

    /// [`World::read_both`], timed as `reads`.
    pub async fn observe(&mut self) -> Result<Obs, Violation> {
        let t = Instant::now();
        let o = self.read_both().await;
        self.prof.add("reads", t.elapsed());
        o
    }

    /// Read both clusters: all reads at once (nothing writes between steps, so their order
    /// does not matter), one round trip's time instead of eight.
    pub async fn read_both(&self) -> Result<Obs, Violation> {
        let h = |what: &'static str| move |e: kube::Error| harness(format!("{what}: {e}"));
        let lp = ListParams::default();
        let (consumer, provider) = (&self.fx.consumer, &self.fx.provider);
        let consumer_api = Api::<DynamicObject>::all_with(consumer.clone(), &self.ar);
        let provider_api = Api::<DynamicObject>::all_with(provider.clone(), &self.ar);
        let crds = Api::<CustomResourceDefinition>::all(consumer.clone());
        let cbs = Api::<ClusterBinding>::all(consumer.clone());
        let nbs = Api::<Binding>::namespaced(consumer.clone(), &self.nss[BINDING_NS as usize]);
        let conns = Api::<Connection>::all(consumer.clone());
        let secrets = Api::<Secret>::namespaced(consumer.clone(), &self.fx.ns);
        let grants = Api::<Secret>::namespaced(provider.clone(), &self.sa_ns);
        let (crd, consumer_list, provider_list, cb, nb, conn, secret, grant) = tokio::join!(
            crds.get_opt(&self.api),
            consumer_api.list(&lp),
            provider_api.list(&lp),
            cbs.get_opt(&self.cb),
            nbs.get_opt(&self.nb),
            conns.get(&self.conn),
            secrets.get_opt("provider"),
            grants.get_opt(&self.grant),
        );
        let crd = crd.map_err(h("reading the consumer CRD"))?;
        let mut consumer = BTreeMap::new();
        match consumer_list {
            Ok(l) => {
                for o in l.items {
                    if let Some(k) = self.key_of(&o) {
                        consumer.insert(k, o);
                    }
                }
            }
            // No CRD, or being created or torn down: nothing is served.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(harness(format!("listing consumer objects: {e}"))),
        }
        if crd.is_none() {
            // Listed before the CRD went: what is gone is gone.
            consumer.clear();
        }
        let mut provider = BTreeMap::new();
        for o in provider_list.map_err(h("listing provider objects"))?.items {
            if let Some(k) = self.key_of(&o) {
                provider.insert(k, o);
            }
        }
        Ok(Obs {
            crd,
            consumer,
            provider,
            cb: cb.map_err(h("reading the ClusterBinding"))?,
            nb: nb.map_err(h("reading the Binding"))?,
            conn: conn.map_err(h("reading the Connection"))?,
            secret_kc: kubeconfig_of(secret.map_err(h("reading the Connection's Secret"))?),
            grant_kc: kubeconfig_of(grant.map_err(h("reading the Grant's Secret"))?),
        })
    }

    /// What invariant 3 watches: every condition of the Connection and both bindings (status
    /// and reason), and kbind's annotations on every consumer object.
    pub fn snapshot(&self, o: &Obs) -> BTreeMap<String, String> {
        let mut s = BTreeMap::new();
        let mut conds = |kind: &str, cs: &[Condition]| {
            for c in cs {
                s.insert(
                    format!("{kind} condition {}", c.type_),
                    format!("{} {}", c.status, c.reason),
                );
            }
        };
        if let Some(st) = &o.conn.status {
            conds("Connection", &st.conditions);
        }
        if let Some(st) = o.cb.as_ref().and_then(|b| b.status.as_ref()) {
            conds("ClusterBinding", &st.conditions);
        }
        if let Some(st) = o.nb.as_ref().and_then(|b| b.status.as_ref()) {
            conds("Binding", &st.conditions);
        }
        for (k, obj) in &o.consumer {
            let ann = obj.annotations();
            let mut names: BTreeSet<&str> = [keys::CONFLICT, ORPHANED].into_iter().collect();
            names.extend(
                ann.keys()
                    .map(String::as_str)
                    .filter(|a| a.starts_with("core.kbind.io/")),
            );
            for a in names {
                s.insert(
                    format!("{k} annotation {a}"),
                    ann.get(a).cloned().unwrap_or_else(|| "-".into()),
                );
            }
        }
        s
    }

    /// Record problems: the first check not ignored fails the step; ignored ones are kept for
    /// the report.
    pub fn report(&mut self, problems: Vec<(&'static str, String)>) -> Result<(), Violation> {
        let mut failing: Option<Violation> = None;
        for (check, detail) in problems {
            if self.ignore.contains(check) {
                self.ignored
                    .push(format!("step {} [{check}] {detail}", self.step_no));
                continue;
            }
            match &mut failing {
                Some(v) if v.check == check => v.detail.push_str(&format!("\n  {detail}")),
                Some(_) => {}
                None => {
                    failing = Some(Violation {
                        check,
                        detail: format!("\n  {detail}"),
                    })
                }
            }
        }
        failing.map_or(Ok(()), Err)
    }

    /// After every step: observe, check what must always hold (invariant 1, the provider's own
    /// data, objects no binding covers left alone, the `spec.orphans` of the covering binding,
    /// the pulled credential), bring the model's observed facts up to date, and feed
    /// invariant 3.
    pub async fn after(&mut self, disturbing: bool, clean: Option<Pass>) -> Result<Obs, Violation> {
        let ran = self.ran.take();
        let resync_ran = ran == Some(Pass::Resync);
        let o = self.observe().await?;
        let mut p: Vec<(&'static str, String)> = Vec::new();
        for (k, pobj) in self.m.provider.clone() {
            if o.provider.contains_key(&k) {
                continue;
            }
            let consumer = match (
                self.m.consumer.contains_key(&k),
                self.m.terminating.contains(&k),
            ) {
                (true, _) => "lives",
                (_, true) => "is being deleted",
                _ => "is gone",
            };
            // `spec.orphans: Delete`: a resync run deletes a copy whose consumer object is gone,
            // in a namespace a binding with that policy covers.
            let orphan_deleted = resync_ran
                && consumer == "is gone"
                && self.m.orphan_policy(&k) == Some(Orphans::Delete);
            match pobj {
                PObj::Copy { may_go: true, .. } => {}
                PObj::Copy { .. } if orphan_deleted => {}
                PObj::Copy { .. } => p.push((
                    "copy-kept",
                    format!(
                        "provider copy {k} was deleted, though its consumer object was never deleted through the syncer finalizer (the consumer object {consumer}; covered by {:?}, orphans {:?})",
                        self.m.cover(&k),
                        self.m.orphan_policy(&k)
                    ),
                )),
                PObj::Foreign { .. } => {
                    p.push(("foreign-untouched", format!("foreign provider object {k} was deleted")))
                }
            }
            self.m.provider.remove(&k);
        }
        for (k, obj) in &o.provider {
            match self.m.provider.get(k) {
                None => {
                    if obj.labels().get(keys::CONSUMER_CLUSTER) != Some(&self.local_uid) {
                        p.push((
                            "harness",
                            format!(
                                "provider object {k} appeared without kbind's cluster marker: {:?}",
                                obj.metadata.labels
                            ),
                        ));
                    }
                    if ran.is_some() && self.m.cover(k).is_none() {
                        p.push((
                            "uncovered-untouched",
                            format!("provider copy {k} was created though no binding covers it"),
                        ));
                    }
                    self.m.provider.insert(
                        *k,
                        PObj::Copy {
                            may_go: false,
                            status: None,
                        },
                    );
                }
                Some(PObj::Foreign { size }) => {
                    let marked: Vec<&String> = obj
                        .labels()
                        .keys()
                        .chain(obj.annotations().keys())
                        .filter(|k| k.starts_with("core.kbind.io/"))
                        .collect();
                    if obj.data["spec"] != json!({"size": size}) || !marked.is_empty() {
                        p.push(("foreign-untouched", format!("foreign provider object {k} was changed: spec {} (was size {size}), kbind keys {marked:?}", obj.data["spec"])));
                    }
                }
                Some(PObj::Copy { status, .. }) => {
                    if let Some(st) = status
                        && &obj.data["status"] != st
                    {
                        p.push((
                            "status-kept",
                            format!(
                                "the provider's status on {k} was {st}, now {}",
                                obj.data["status"]
                            ),
                        ));
                    }
                    // Docs/resync.md "Gate": uncovered objects are not touched.
                    let before = self.last_seen.get(k).and_then(|(s, _)| s.as_ref());
                    if ran.is_some()
                        && self.m.cover(k).is_none()
                        && before.is_some_and(|b| b != &obj.data["spec"])
                    {
                        p.push((
                            "uncovered-untouched",
                            format!(
                                "provider copy {k}'s spec went from {} to {} though no binding covers it",
                                before.map_or(Value::Null, Clone::clone),
                                obj.data["spec"]
                            ),
                        ));
                    }
                }
            }
        }
        // A CRD being deleted lists what is left of its objects (stuck ones are reported at the
        // next settle); only a served CRD gets new ones.
        let served: BTreeMap<Key, DynamicObject> = if o.crd_established() {
            o.consumer.clone()
        } else {
            BTreeMap::new()
        };
        for (k, obj) in &served {
            let held = obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER);
            let held_before = self.last_seen.get(k).is_some_and(|(_, h)| *h);
            if ran.is_some() && held && !held_before && self.m.cover(k).is_none() {
                p.push((
                    "uncovered-untouched",
                    format!(
                        "consumer object {k} got the syncer finalizer though no binding covers it"
                    ),
                ));
            }
            if self.m.consumer.contains_key(k) || self.m.terminating.contains(k) {
                continue;
            }
            // `spec.orphans: Restore`: a resync run re-creates the consumer object of an orphan
            // from the copy's spec; it is the user's object from then on.
            let restorable = resync_ran
                && self.m.orphan_policy(k) == Some(Orphans::Restore)
                && matches!(self.m.provider.get(k), Some(PObj::Copy { .. }));
            if !restorable {
                p.push((
                    "consumer-unexpected",
                    format!(
                        "consumer object {k} appeared, though nobody created it (covered by {:?}, orphans {:?})",
                        self.m.cover(k),
                        self.m.orphan_policy(k)
                    ),
                ));
                continue;
            }
            let copy_spec = o.provider.get(k).map(|c| c.data["spec"].clone());
            if copy_spec.as_ref() != Some(&obj.data["spec"]) {
                p.push((
                    "restored",
                    format!(
                        "consumer object {k} was restored with spec {}, its copy's is {copy_spec:?}",
                        obj.data["spec"]
                    ),
                ));
            }
            let size = obj.data["spec"]["size"].as_u64().unwrap_or(0) as u32;
            self.m.consumer.insert(
                *k,
                CObj {
                    size,
                    uid: obj.uid().unwrap_or_default(),
                },
            );
        }
        // A consumer object released by the syncer finalizer whose copy is still there: the copy
        // is an orphan from now on, and stays.
        for (k, pobj) in self.m.provider.iter_mut() {
            if let PObj::Copy { may_go, .. } = pobj
                && *may_go
                && !o.consumer.contains_key(k)
            {
                *may_go = false;
            }
        }
        self.m.terminating.retain(|k| o.consumer.contains_key(k));
        // Consumer objects go only when deleted, or with their CRD, which goes only at the
        // teardown of a ClusterBinding no other live binding lists it beside (docs/contract.md
        // "Unbind and teardown").
        if o.crd_established() {
            for k in self.m.consumer.keys() {
                if !o.consumer.contains_key(k) {
                    p.push(("consumer-kept", format!("consumer object {k} vanished")));
                }
            }
            self.m.consumer.retain(|k, _| o.consumer.contains_key(k));
        } else if o.crd.is_none() || o.crd_deleting() {
            if self.m.crd_ready && (self.m.bound || self.m.ns_bound) {
                p.push((
                    "consumer-kept",
                    format!(
                        "the consumer CRD was removed while a binding lists it (ClusterBinding {}, Binding {})",
                        self.m.bound, self.m.ns_bound
                    ),
                ));
            }
            if o.crd.is_none() {
                self.m.consumer.clear();
            }
        }
        if clean == Some(Pass::Schema) && o.secret_kc != o.grant_kc {
            p.push((
                "rotation-pulled",
                format!(
                    "after a clean schema run the Connection's Secret holds another kubeconfig than the Grant's Secret ({} and {} bytes)",
                    o.secret_kc.as_ref().map_or(0, String::len),
                    o.grant_kc.as_ref().map_or(0, String::len)
                ),
            ));
        }
        self.m.crd_ready = o.crd_established();
        self.m.teardown_done = !self.m.bound && o.cb.is_none() && !o.crd_deleting();
        self.m.ns_teardown_done = !self.m.ns_bound && o.nb.is_none();
        self.remember(&o);
        self.report(p)?;

        let snap = self.snapshot(&o);
        if disturbing {
            self.quiet.reset(&snap);
        } else {
            let flaps = self.quiet.see(&snap, clean.map(Pass::name));
            self.report(flaps.into_iter().map(|f| ("flap", f)).collect())?;
        }
        Ok(o)
    }

    /// Keep what the next step's checks compare with.
    fn remember(&mut self, o: &Obs) {
        let keys: BTreeSet<Key> = o
            .provider
            .keys()
            .chain(o.consumer.keys())
            .copied()
            .collect();
        self.last_seen =
            keys.into_iter()
                .map(|k| {
                    let spec = o.provider.get(&k).map(|c| c.data["spec"].clone());
                    let held = o.consumer.get(&k).is_some_and(|c| {
                        c.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER)
                    });
                    (k, (spec, held))
                })
                .collect();
    }

    pub fn args(&self, pass: Pass, lease_ns: &str) -> Vec<String> {
        let mut a: Vec<String> = [
            pass.name(),
            "--kubeconfig",
            &self.fx.env.consumer.to_string_lossy(),
            "--lease-namespace",
            lease_ns,
            "--selector",
            &format!("kbind-test={}", self.fx.label),
            "-o",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.credential_ns {
            // The Secret stays in the fixture's namespace whatever the Lease namespace is.
            a.extend(["--credential-namespace".into(), self.fx.ns.clone()]);
        }
        a.extend(self.extra.iter().cloned());
        a
    }

    pub async fn run(&mut self, pass: Pass, kill: Kill) -> Result<RunOutcome, Violation> {
        self.ran = Some(pass);
        let template = self.args(pass, LEASE_NS);
        let out = self
            .runs
            .run(pass.name(), kill, move |ns: &str| {
                let args: Vec<&str> = template
                    .iter()
                    .map(|a| if a == LEASE_NS { ns } else { a.as_str() })
                    .collect();
                command(&args)
            })
            .await?;
        if pass == Pass::Schema {
            let t = Instant::now();
            self.wait_for_crd().await;
            self.prof.add("crd-waits", t.elapsed());
        }
        Ok(out)
    }

    /// After a schema run, let the apiserver finish what the run started on the consumer CRD
    /// (Established, or deleted), so the next step sees the same state on every replay. At most
    /// 30 s: a loaded apiserver can take seconds to empty and remove a CRD; one that never goes
    /// is reported at the next settle.
    pub async fn wait_for_crd(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.fx.consumer.clone());
        for _ in 0..300 {
            let Ok(crd) = crds.get_opt(&self.api).await else {
                return;
            };
            let done = match &crd {
                None => true,
                Some(c) if c.metadata.deletion_timestamp.is_some() => false,
                Some(c) => c
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    }),
            };
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
