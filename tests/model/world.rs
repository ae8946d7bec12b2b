//! The schema/resync fixture of the model test (docs/testing.md) and its checks: one step at a
//! time against the real servers, then invariants 1-3 against the model
//! (tests/support/model_gen.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind::api::core::{ClusterBinding, Connection};
use kbind::api::keys;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::Config;
use crate::model_gen::{self, CObj, Key, Kill, Model, PObj, Pass, Step};
use crate::runs::{
    LEASE_NS, Prof, Quiet, ROUNDS, RunOutcome, Runs, Violation, command, harness, run_kbind,
};
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
    pub conn: Connection,
}

impl Obs {
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
        Api::<ClusterBinding>::all(fx.consumer.clone())
            .patch(
                &cb,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"conflictPolicy": "Fail"}})),
            )
            .await
            .expect("conflictPolicy");
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
                ..Default::default()
            },
            quiet: Quiet::new(&["schema", "resync", "schema", "resync"]),
            ignore: cfg.ignore.clone(),
            ignored: Vec::new(),
            step_no: 0,
            prof: Prof::default(),
        };
        let o = w.observe().await.expect("first observation");
        w.m.crd_ready = o.crd_established();
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

    /// Read both clusters: the five reads at once (nothing writes between steps, so their
    /// order does not matter), one round trip's time instead of five.
    pub async fn read_both(&self) -> Result<Obs, Violation> {
        let h = |what: &'static str| move |e: kube::Error| harness(format!("{what}: {e}"));
        let lp = ListParams::default();
        let consumer_api = Api::<DynamicObject>::all_with(self.fx.consumer.clone(), &self.ar);
        let provider_api = Api::<DynamicObject>::all_with(self.fx.provider.clone(), &self.ar);
        let crds = Api::<CustomResourceDefinition>::all(self.fx.consumer.clone());
        let cbs = Api::<ClusterBinding>::all(self.fx.consumer.clone());
        let conns = Api::<Connection>::all(self.fx.consumer.clone());
        let (crd, consumer_list, provider_list, cb, conn) = tokio::join!(
            crds.get_opt(&self.api),
            consumer_api.list(&lp),
            provider_api.list(&lp),
            cbs.get_opt(&self.cb),
            conns.get(&self.conn),
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
            conn: conn.map_err(h("reading the Connection"))?,
        })
    }

    /// What invariant 3 watches: every condition of the Connection and the ClusterBinding
    /// (status and reason), and kbind's annotations on every consumer object.
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

    /// After every step: observe, check what must always hold (invariant 1 and the provider's
    /// own data), bring the model's observed facts up to date, and feed invariant 3.
    pub async fn after(&mut self, disturbing: bool, clean: Option<Pass>) -> Result<Obs, Violation> {
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
            match pobj {
                PObj::Copy { may_go: true, .. } => {}
                PObj::Copy { .. } => p.push((
                    "copy-kept",
                    format!(
                        "provider copy {k} was deleted, though its consumer object was never deleted through the syncer finalizer (the consumer object {consumer}; binding {})",
                        if self.m.bound { "bound" } else { "unbound" }
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
                Some(PObj::Copy {
                    status: Some(st), ..
                }) => {
                    if &obj.data["status"] != st {
                        p.push((
                            "status-kept",
                            format!(
                                "the provider's status on {k} was {st}, now {}",
                                obj.data["status"]
                            ),
                        ));
                    }
                }
                Some(PObj::Copy { .. }) => {}
            }
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
        if self.m.bound && o.crd_established() {
            for k in self.m.consumer.keys() {
                if !o.consumer.contains_key(k) {
                    p.push((
                        "consumer-kept",
                        format!("consumer object {k} vanished while bound"),
                    ));
                }
            }
        }
        self.m
            .consumer
            .retain(|k, _| o.consumer.contains_key(k) || !o.crd_established());
        self.m.crd_ready = self.m.bound && o.crd_established();
        self.m.teardown_done = !self.m.bound && o.cb.is_none() && o.crd.is_none();
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
    /// (Established, or deleted), so the next step sees the same state on every replay.
    pub async fn wait_for_crd(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.fx.consumer.clone());
        for _ in 0..100 {
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

    /// Perform one step; returns what happened (for the replay listing).
    pub async fn step(&mut self, step: &Step) -> Result<String, Violation> {
        let h = |what: String| move |e: kube::Error| harness(format!("{what}: {e}"));
        let skip = |why: &str| Ok(format!("skipped: {why}"));
        let t = Instant::now();
        let note = match *step {
            Step::Create { key, size } => {
                if !self.m.crd_ready {
                    return skip("no consumer API");
                }
                if self.m.consumer.contains_key(&key) || self.m.terminating.contains(&key) {
                    return skip("the name is taken");
                }
                let mut o = DynamicObject::new(&key.object_name(), &self.ar)
                    .data(json!({"spec": {"size": size}}));
                o.metadata.namespace = Some(self.nss[key.ns as usize].clone());
                match self
                    .consumer_api(key)
                    .create(&PostParams::default(), &o)
                    .await
                {
                    Ok(c) => {
                        self.m.consumer.insert(
                            key,
                            CObj {
                                size,
                                uid: c.uid().unwrap_or_default(),
                            },
                        );
                        "created".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return skip("the name is taken");
                    }
                    Err(e) => return Err(harness(format!("create {key}: {e}"))),
                }
            }
            Step::Update { key, size } => {
                if !self.m.consumer.contains_key(&key) {
                    return skip("no such object");
                }
                self.consumer_api(key)
                    .patch(
                        &key.object_name(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"size": size}})),
                    )
                    .await
                    .map_err(h(format!("update {key}")))?;
                if let Some(c) = self.m.consumer.get_mut(&key) {
                    c.size = size;
                }
                "updated".into()
            }
            Step::Delete { key } => {
                if !self.m.consumer.contains_key(&key) {
                    return skip("no such object");
                }
                let api = self.consumer_api(key);
                let name = key.object_name();
                let Some(obj) = api.get_opt(&name).await.map_err(h(format!("get {key}")))? else {
                    return skip("no such object");
                };
                let held = obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER);
                api.delete(&name, &DeleteParams::default())
                    .await
                    .map_err(h(format!("delete {key}")))?;
                self.m.consumer.remove(&key);
                if held {
                    self.m.terminating.insert(key);
                    if let Some(PObj::Copy { may_go, .. }) = self.m.provider.get_mut(&key) {
                        *may_go = true;
                    }
                    "deleted (syncer finalizer held)".into()
                } else {
                    "deleted (no syncer finalizer yet)".into()
                }
            }
            Step::ProviderStatus { key, phase } => {
                if !matches!(self.m.provider.get(&key), Some(PObj::Copy { .. })) {
                    return skip("no copy");
                }
                let status = json!({"phase": format!("P{phase}")});
                match self
                    .provider_api(key)
                    .patch_status(
                        &key.object_name(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "status": status })),
                    )
                    .await
                {
                    Ok(o) => {
                        if let Some(PObj::Copy { status, .. }) = self.m.provider.get_mut(&key) {
                            *status = Some(o.data["status"].clone());
                        }
                        "status written".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => return skip("no copy"),
                    Err(e) => return Err(harness(format!("status {key}: {e}"))),
                }
            }
            Step::Foreign { key, size } => {
                if self.m.provider.contains_key(&key) {
                    return skip("the provider name is taken");
                }
                let ns = self.nss[key.ns as usize].clone();
                let n: k8s_openapi::api::core::v1::Namespace =
                    serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
                let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.fx.provider.clone())
                    .create(&PostParams::default(), &n)
                    .await;
                let mut o = DynamicObject::new(&key.object_name(), &self.ar)
                    .data(json!({"spec": {"size": size}}));
                o.metadata.namespace = Some(ns);
                match self
                    .provider_api(key)
                    .create(&PostParams::default(), &o)
                    .await
                {
                    Ok(_) => {
                        self.m.provider.insert(key, PObj::Foreign { size });
                        "created on the provider".into()
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return skip("the provider name is taken");
                    }
                    Err(e) => return Err(harness(format!("foreign {key}: {e}"))),
                }
            }
            Step::Unbind => {
                if !self.m.bound {
                    return skip("not bound");
                }
                Api::<ClusterBinding>::all(self.fx.consumer.clone())
                    .delete(&self.cb, &DeleteParams::default())
                    .await
                    .map_err(h("unbind".into()))?;
                self.m.bound = false;
                self.m.crd_ready = false;
                // The consumer CRD and its objects go with the binding.
                self.m.consumer.clear();
                "ClusterBinding deleted".into()
            }
            Step::Rebind => {
                if self.m.bound || !self.m.teardown_done {
                    return skip("the old binding is still there");
                }
                let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                    "metadata": {"name": self.cb, "labels": {"kbind-test": self.fx.label}},
                    "spec": {"connectionRef": {"name": self.conn}, "apis": [{"name": self.api}], "conflictPolicy": "Fail"}});
                Api::<ClusterBinding>::all(self.fx.consumer.clone())
                    .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
                    .await
                    .map_err(h("rebind".into()))?;
                self.m.bound = true;
                "ClusterBinding created again".into()
            }
            Step::Rotate { fresh } => {
                self.rotations += 1;
                let text = if fresh {
                    self.kubeconfig =
                        support::token_kubeconfig(&self.fx.env.provider, &self.sa_ns, SA).await;
                    self.kubeconfig.clone()
                } else {
                    format!("{}\n# rewritten {}\n", self.kubeconfig, self.rotations)
                };
                self.fx.secret("provider", "kubeconfig", &text).await;
                if fresh {
                    "Secret rewritten with a fresh token".into()
                } else {
                    "Secret rewritten, same kubeconfig".into()
                }
            }
            Step::Run { pass, kill } => {
                let r = self.run(pass, kill).await?;
                if r.clean && pass == Pass::Resync {
                    self.m.pending_work = false;
                }
                self.after(!r.clean, r.clean.then_some(pass)).await?;
                return Ok(r.note);
            }
            Step::Settle => return self.settle().await,
        };
        self.m.pending_work = true;
        self.prof.add("actions", t.elapsed());
        self.after(step.disturbs(), None).await?;
        Ok(note)
    }

    /// Invariant 2: two clean rounds, then the servers must equal the model, and a third round
    /// must write no data (invariant 3 watches its conditions and annotations).
    pub async fn settle(&mut self) -> Result<String, Violation> {
        let (mut notes, mut last) = (Vec::new(), None);
        for pass in ROUNDS {
            let r = self.run(pass, Kill::No).await?;
            notes.push(format!("{}: {}", pass.name(), r.summary["data_writes"]));
            last = Some(self.after(false, Some(pass)).await?);
        }
        self.m.pending_work = false;
        // What the last round's checks read: nothing ran since.
        if let Some(o) = last {
            self.check_converged(o)?;
        }
        for pass in [Pass::Schema, Pass::Resync] {
            let r = self.run(pass, Kill::No).await?;
            self.after(false, Some(pass)).await?;
            let n = r.summary["data_writes"].as_u64().unwrap_or(u64::MAX);
            if n != 0 {
                let planned = self.dry_run(pass).await;
                self.report(vec![(
                    "quiet-writes",
                    format!(
                        "the third {} run wrote {n} data ({}); a dry run now would: {planned}",
                        pass.name(),
                        r.summary["counts"]
                    ),
                )])?;
            }
        }
        Ok(format!(
            "data writes per run {}; converged; third round quiet",
            notes.join(", ")
        ))
    }

    /// The writes a run would make now (to explain a third-round write).
    pub async fn dry_run(&mut self, pass: Pass) -> String {
        let mut args = self.args(pass, &self.runs.lease_ns(pass.name()));
        args.push("--dry-run".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let t = Instant::now();
        let (_, s, _) = run_kbind(command(&argv)).await;
        self.runs.prof.add("runs", t.elapsed());
        s["planned"].to_string()
    }

    pub fn check_converged(&mut self, o: Obs) -> Result<(), Violation> {
        let mut p: Vec<(&'static str, String)> = Vec::new();
        let conds = |st: Option<&Vec<Condition>>, t: &str| -> String {
            st.and_then(|cs| cs.iter().find(|c| c.type_ == t))
                .map_or("(none)".into(), |c| format!("{} {}", c.status, c.reason))
        };
        let ready = conds(o.conn.status.as_ref().map(|s| &s.conditions), "Ready");
        if !ready.starts_with("True") {
            p.push(("converged", format!("Connection Ready is {ready}")));
        }
        if self.m.bound {
            let conflicts: BTreeSet<Key> = self
                .m
                .consumer
                .keys()
                .filter(|k| self.m.foreign(k))
                .copied()
                .collect();
            match &o.cb {
                None => p.push(("converged", "the ClusterBinding is gone".into())),
                Some(cb) => {
                    let st = cb.status.clone().unwrap_or_default();
                    let ready = conds(Some(&st.conditions), "Ready");
                    if !ready.starts_with("True") {
                        p.push(("converged", format!("ClusterBinding Ready is {ready}")));
                    }
                    let want_conflicts = if conflicts.is_empty() {
                        "False"
                    } else {
                        "True"
                    };
                    let got = conds(Some(&st.conditions), "Conflicts");
                    if !got.starts_with(want_conflicts) {
                        p.push((
                            "counts",
                            format!("ClusterBinding Conflicts is {got}, conflicts {conflicts:?}"),
                        ));
                    }
                    let a = st.bound_apis.iter().find(|a| a.name == self.api);
                    let got = a.map(|a| (a.in_sync, a.conflict_count, a.pending, a.orphaned));
                    let n = |x: usize| Some(x as i64);
                    let orphans = self
                        .m
                        .provider
                        .iter()
                        .filter(|(k, p)| {
                            matches!(p, PObj::Copy { .. }) && !self.m.consumer.contains_key(k)
                        })
                        .count();
                    let want = Some((
                        n(self.m.consumer.len() - conflicts.len()),
                        n(conflicts.len()),
                        n(0),
                        n(orphans),
                    ));
                    if got != want {
                        p.push(("counts", format!("boundAPIs (inSync, conflictCount, pending, orphaned) = {got:?}, model {want:?}")));
                    }
                }
            }
            if !o.crd_established() {
                p.push(("converged", "the consumer CRD is not Established".into()));
            }
            for k in &self.m.terminating {
                p.push(("converged", format!("consumer object {k} was deleted but is still there (syncer finalizer not released)")));
            }
            for k in o.consumer.keys() {
                if !self.m.consumer.contains_key(k) && !self.m.terminating.contains(k) {
                    p.push((
                        "converged",
                        format!("consumer object {k} exists, the model has none"),
                    ));
                }
            }
            for (k, c) in &self.m.consumer {
                let Some(obj) = o.consumer.get(k) else {
                    p.push(("converged", format!("consumer object {k} is missing")));
                    continue;
                };
                let ann = obj.annotations();
                let conflict = ann.get(keys::CONFLICT).map(String::as_str);
                if self.m.foreign(k) {
                    if conflict != Some(FOREIGN_OBJECT_EXISTS) {
                        p.push(("converged", format!("{k}: a foreign provider object holds the name; conflict annotation is {conflict:?}, want {FOREIGN_OBJECT_EXISTS}")));
                    }
                    continue;
                }
                if let Some(c) = conflict {
                    p.push(("converged", format!("{k}: conflict annotation {c} though the provider holds no foreign object")));
                }
                if !obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER) {
                    p.push(("converged", format!("{k}: no syncer finalizer")));
                }
                let Some(copy) = o.provider.get(k) else {
                    p.push(("converged", format!("{k}: no provider copy")));
                    continue;
                };
                if copy.data["spec"] != json!({"size": c.size}) {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider spec {} but the consumer's is size {}",
                            copy.data["spec"], c.size
                        ),
                    ));
                }
                if copy.labels().get(keys::CONSUMER_CLUSTER) != Some(&self.local_uid) {
                    p.push((
                        "converged",
                        format!("{k}: provider copy lacks the cluster marker"),
                    ));
                }
                let owner = copy.annotations().get(keys::CONSUMER_OBJECT_UID).cloned();
                if owner.as_ref() != Some(&c.uid) {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider copy's object marker {owner:?}, consumer object uid {}",
                            c.uid
                        ),
                    ));
                }
                if let Some(r) = copy.annotations().get(ORPHANED) {
                    p.push((
                        "orphan-annotation",
                        format!("{k}: adopted copy still marked {ORPHANED}: {r}"),
                    ));
                }
                let st = &copy.data["status"];
                if !st.is_null() && &obj.data["status"] != st {
                    p.push((
                        "converged",
                        format!(
                            "{k}: provider status {st} not copied down (consumer has {})",
                            obj.data["status"]
                        ),
                    ));
                }
            }
        } else {
            if o.cb.is_some() {
                p.push((
                    "converged",
                    "the ClusterBinding is still there after the unbind".into(),
                ));
            }
            if o.crd.is_some() {
                p.push((
                    "converged",
                    "the consumer CRD is still there after the unbind".into(),
                ));
            }
        }
        for (k, pobj) in &self.m.provider {
            if !matches!(pobj, PObj::Copy { .. })
                || (self.m.bound && self.m.consumer.contains_key(k))
            {
                continue;
            }
            let Some(copy) = o.provider.get(k) else {
                continue;
            };
            let r = copy.annotations().get(ORPHANED).cloned();
            if !r.as_deref().is_some_and(|r| ORPHAN_REASONS.contains(&r)) {
                p.push(("orphan-annotation", format!("{k}: copy without a consumer object has {ORPHANED} {r:?}, want one of {ORPHAN_REASONS:?}")));
            }
        }
        self.report(p)
    }
}
