//! The steps of a schema/resync model sequence (docs/testing.md): each user or world action
//! made on the real servers and recorded in the model, then checked (tests/model/world.rs).

use k8s_openapi::api::core::v1::Secret;
use kbind::api::core::{Binding, ClusterBinding};
use kbind::api::keys;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Instant;

use crate::model::model_gen::{BINDING_NS, CObj, Cover, PObj, Pass, Step};
use crate::model::runs::{Violation, harness};
use crate::model::world::{SA, World};
use crate::support;

impl World {
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
                let cbs = Api::<ClusterBinding>::all(self.fx.consumer.clone());
                let set_up = cbs
                    .get_opt(&self.cb)
                    .await
                    .map_err(h("unbind".into()))?
                    .is_some_and(|b| b.finalizers().iter().any(|f| f == keys::CLEANUP_FINALIZER));
                cbs.delete(&self.cb, &DeleteParams::default())
                    .await
                    .map_err(h("unbind".into()))?;
                self.m.bound = false;
                // With no Binding listing the API, the teardown of a ClusterBinding kbind schema
                // had set up (its cleanup finalizer) removes the consumer CRD and its objects
                // (observed as it happens) and marks every copy Unbound. One not set up goes at
                // once, with no teardown: a CRD kept from before stays.
                self.m.crd_must_go = !self.m.ns_bound && set_up;
                if set_up {
                    "ClusterBinding deleted".into()
                } else {
                    "ClusterBinding deleted (not set up yet: gone at once)".into()
                }
            }
            Step::Rebind => {
                if self.m.bound || !self.m.teardown_done {
                    return skip("the old binding is still there");
                }
                let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                    "metadata": {"name": self.cb, "labels": {"kbind-test": self.fx.label}},
                    "spec": {"connectionRef": {"name": self.conn}, "apis": [{"name": self.api}],
                        "conflictPolicy": "Fail", "orphans": self.m.orphans.name()}});
                Api::<ClusterBinding>::all(self.fx.consumer.clone())
                    .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
                    .await
                    .map_err(h("rebind".into()))?;
                self.m.bound = true;
                self.m.crd_must_go = false;
                "ClusterBinding created again".into()
            }
            Step::NsBind => {
                if self.m.ns_bound || !self.m.ns_teardown_done {
                    return skip("the old Binding is still there");
                }
                let ns = &self.nss[BINDING_NS as usize];
                let b = json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Binding",
                    "metadata": {"name": self.nb, "namespace": ns, "labels": {"kbind-test": self.fx.label}},
                    "spec": {"connectionRef": {"name": self.conn}, "apis": [{"name": self.api}],
                        "conflictPolicy": "Fail", "orphans": self.m.ns_orphans.name()}});
                Api::<Binding>::namespaced(self.fx.consumer.clone(), ns)
                    .create(&PostParams::default(), &serde_json::from_value(b).unwrap())
                    .await
                    .map_err(h("bind b".into()))?;
                self.m.ns_bound = true;
                self.m.crd_must_go = false;
                "Binding created".into()
            }
            Step::NsUnbind => {
                if !self.m.ns_bound {
                    return skip("no Binding");
                }
                Api::<Binding>::namespaced(
                    self.fx.consumer.clone(),
                    &self.nss[BINDING_NS as usize],
                )
                .delete(&self.nb, &DeleteParams::default())
                .await
                .map_err(h("unbind b".into()))?;
                self.m.ns_bound = false;
                "Binding deleted".into()
            }
            Step::Orphans { on, policy } => {
                let patch = Patch::Merge(json!({"spec": {"orphans": policy.name()}}));
                let pp = PatchParams::default();
                match on {
                    Cover::Cluster if self.m.bound => {
                        Api::<ClusterBinding>::all(self.fx.consumer.clone())
                            .patch(&self.cb, &pp, &patch)
                            .await
                            .map_err(h("orphans".into()))?;
                        self.m.orphans = policy;
                    }
                    Cover::Ns if self.m.ns_bound => {
                        Api::<Binding>::namespaced(
                            self.fx.consumer.clone(),
                            &self.nss[BINDING_NS as usize],
                        )
                        .patch(&self.nb, &pp, &patch)
                        .await
                        .map_err(h("orphans b".into()))?;
                        self.m.ns_orphans = policy;
                    }
                    _ => return skip("no such binding"),
                }
                format!("spec.orphans: {}", policy.name())
            }
            Step::Reissue => {
                let fresh = support::token_kubeconfig(&self.fx.env.provider, &self.sa_ns, SA).await;
                Api::<Secret>::namespaced(self.fx.provider.clone(), &self.sa_ns)
                    .patch(
                        &self.grant,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"stringData": {"kubeconfig": fresh}})),
                    )
                    .await
                    .map_err(h("reissue".into()))?;
                "the Grant's Secret re-issued with a fresh token".into()
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
}
