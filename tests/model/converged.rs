//! Invariant 2 of the model test (docs/testing.md): after two clean rounds the servers equal
//! the model, binding by binding, and a third round writes nothing.

use std::collections::BTreeSet;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kbind::api::keys;
use kube::ResourceExt;
use serde_json::json;

use crate::model::model_gen::{Cover, Key, Kill, Orphans, PObj, Pass};
use crate::model::runs::{ROUNDS, Violation, command, run_kbind};
use crate::model::world::{FOREIGN_OBJECT_EXISTS, ORPHAN_REASONS, ORPHANED, Obs, World};

impl World {
    /// Invariant 2: two clean rounds, then the servers must equal the model, and a third round
    /// must write no data (invariant 3 watches its conditions and annotations).
    pub async fn settle(&mut self) -> Result<String, Violation> {
        let (mut notes, mut last) = (Vec::new(), None);
        // Kills in a row can quarantine a Connection (docs/operations.md "Poison items"), which
        // the model does not predict: clear the record as an operator would, and say so. The
        // suspicion goes too: else this settle's first run, taking over from the last killed
        // one, could quarantine what the last two kills were working on.
        for pass in [Pass::Schema, Pass::Resync] {
            if let Some(q) = self.clear_quarantine(pass).await {
                notes.push(format!("{}: quarantine of {q} cleared", pass.name()));
            }
        }
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

    /// Remove the pass Lease's `kbind.io/quarantined` and `kbind.io/suspects` annotations; what
    /// the first held, if anything.
    async fn clear_quarantine(&self, pass: Pass) -> Option<String> {
        use k8s_openapi::api::coordination::v1::Lease;
        let ns = self.runs.lease_ns(pass.name());
        let api = kube::Api::<Lease>::namespaced(self.runs.consumer.clone(), &ns);
        let name = format!("kbind-{}", pass.name());
        let lease = api.get_opt(&name).await.ok().flatten()?;
        let held = lease.annotations().get("kbind.io/quarantined").cloned();
        if held.is_none() && !lease.annotations().contains_key("kbind.io/suspects") {
            return None;
        }
        let patch = json!({"metadata": {"annotations":
            {"kbind.io/quarantined": null, "kbind.io/suspects": null}}});
        api.patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .ok()?;
        held
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
        let ready = cond(o.conn.status.as_ref().map(|s| &s.conditions), "Ready");
        if !ready.starts_with("True") {
            p.push(("converged", format!("Connection Ready is {ready}")));
        }
        let rotation = cond(
            o.conn.status.as_ref().map(|s| &s.conditions),
            "CredentialRotation",
        );
        if !rotation.starts_with("True") {
            p.push((
                "rotation-pulled",
                format!("Connection CredentialRotation is {rotation}"),
            ));
        }
        let cb = o.cb.as_ref().map(|b| b.status.clone().unwrap_or_default());
        let nb = o.nb.as_ref().map(|b| b.status.clone().unwrap_or_default());
        for (c, live, st) in [
            (Cover::Cluster, self.m.bound, cb),
            (Cover::Ns, self.m.ns_bound, nb),
        ] {
            let kind = match c {
                Cover::Cluster => "ClusterBinding",
                Cover::Ns => "Binding",
            };
            match (live, st) {
                (false, None) => {}
                (false, Some(_)) => p.push((
                    "converged",
                    format!("the {kind} is still there after its deletion"),
                )),
                (true, None) => p.push(("converged", format!("the {kind} is gone"))),
                (true, Some(st)) => self.binding_counts(c, kind, &st, &mut p),
            }
        }
        if o.crd_deleting() {
            p.push((
                "converged",
                format!(
                    "the consumer CRD is still being deleted after two rounds ({} objects left: {:?})",
                    o.consumer.len(),
                    o.consumer.keys().collect::<Vec<_>>()
                ),
            ));
        }
        if self.m.bound || self.m.ns_bound {
            if !o.crd_established() {
                p.push(("converged", "the consumer CRD is not Established".into()));
            }
        } else if self.m.crd_must_go && o.crd.is_some() {
            p.push((
                "converged",
                "the consumer CRD is still there after the unbind".into(),
            ));
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
            let held = obj.finalizers().iter().any(|f| f == keys::SYNCER_FINALIZER);
            if self.m.cover(k).is_none() {
                // Released when its binding went (docs/resync.md "A binding being deleted").
                if held {
                    p.push((
                        "converged",
                        format!("{k}: no binding covers it, yet it holds the syncer finalizer"),
                    ));
                }
                continue;
            }
            let ann = obj.annotations();
            let conflict = ann.get(keys::CONFLICT).map(String::as_str);
            if self.m.foreign(k) {
                if conflict != Some(FOREIGN_OBJECT_EXISTS) {
                    p.push(("converged", format!("{k}: a foreign provider object holds the name; conflict annotation is {conflict:?}, want {FOREIGN_OBJECT_EXISTS}")));
                }
                continue;
            }
            if let Some(c) = conflict {
                p.push((
                    "converged",
                    format!(
                        "{k}: conflict annotation {c} though the provider holds no foreign object"
                    ),
                ));
            }
            if !held {
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
        // Copies without a consumer object: orphans, as the covering binding's spec.orphans
        // says (docs/resync.md "Orphans"); with no binding, marked at the ClusterBinding's
        // teardown.
        for (k, pobj) in &self.m.provider {
            if !matches!(pobj, PObj::Copy { .. }) || self.m.consumer.contains_key(k) {
                continue;
            }
            let Some(copy) = o.provider.get(k) else {
                continue;
            };
            let r = copy.annotations().get(ORPHANED).cloned();
            let marked = r.as_deref().is_some_and(|r| ORPHAN_REASONS.contains(&r));
            match self.m.orphan_policy(k) {
                Some(Orphans::Keep) if !marked => p.push(("orphan-annotation", format!("{k}: copy without a consumer object has {ORPHANED} {r:?}, want one of {ORPHAN_REASONS:?}"))),
                None if self.m.crd_must_go && !marked => p.push(("orphan-annotation", format!("{k}: copy left by the unbind has {ORPHANED} {r:?}, want one of {ORPHAN_REASONS:?}"))),
                Some(Orphans::Delete) => p.push(("orphan-policy", format!("{k}: copy without a consumer object is still there under spec.orphans: Delete"))),
                Some(Orphans::Restore) => p.push(("orphan-policy", format!("{k}: copy without a consumer object was not restored under spec.orphans: Restore"))),
                _ => {}
            }
        }
        self.report(p)
    }

    /// One live binding's counts and `Conflicts` condition against the slots it covers (none
    /// for a Binding a ClusterBinding shadows), and its `Ready`.
    fn binding_counts(
        &self,
        c: Cover,
        kind: &str,
        st: &kbind::api::core::BindingStatus,
        p: &mut Vec<(&'static str, String)>,
    ) {
        let ready = cond(Some(&st.conditions), "Ready");
        if !ready.starts_with("True") {
            p.push(("converged", format!("{kind} Ready is {ready}")));
        }
        let mine = |k: &Key| self.m.cover(k) == Some(c);
        let conflicts: BTreeSet<Key> = self
            .m
            .consumer
            .keys()
            .filter(|k| mine(k) && self.m.foreign(k))
            .copied()
            .collect();
        let consumer = self.m.consumer.keys().filter(|k| mine(k)).count();
        let orphans = self
            .m
            .provider
            .iter()
            .filter(|(k, p)| {
                mine(k) && matches!(p, PObj::Copy { .. }) && !self.m.consumer.contains_key(k)
            })
            .count();
        let want_conflicts = if conflicts.is_empty() {
            "False"
        } else {
            "True"
        };
        let got = cond(Some(&st.conditions), "Conflicts");
        if !got.starts_with(want_conflicts) {
            p.push((
                "counts",
                format!("{kind} Conflicts is {got}, conflicts {conflicts:?}"),
            ));
        }
        let a = st.bound_apis.iter().find(|a| a.name == self.api);
        let got = a.map(|a| (a.in_sync, a.conflict_count, a.pending, a.orphaned));
        let n = |x: usize| Some(x as i64);
        let want = Some((
            n(consumer - conflicts.len()),
            n(conflicts.len()),
            n(0),
            n(orphans),
        ));
        if got != want {
            p.push(("counts", format!("{kind} boundAPIs (inSync, conflictCount, pending, orphaned) = {got:?}, model {want:?}")));
        }
    }
}

/// Condition `t` of `conds` as `status reason`, or `(none)`.
fn cond(conds: Option<&Vec<Condition>>, t: &str) -> String {
    conds
        .and_then(|cs| cs.iter().find(|c| c.type_ == t))
        .map_or("(none)".into(), |c| format!("{} {}", c.status, c.reason))
}
