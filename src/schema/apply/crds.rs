//! Consumer CRDs installed per the Connection's pull and update policy, and autoBind's bindings.

use super::*;

/// The consumer CRD writes of one Connection, up to `concurrency` in flight (each CRD has one
/// write); outcomes in the order of `actions`. Dry-run plans are recorded in that order too.
pub(in crate::schema) async fn apply_crds(
    client: &Client,
    manager: &str,
    actions: &[CrdAction],
    writes: &mut Writes,
    concurrency: NonZeroUsize,
) -> Vec<CrdOutcome> {
    // Dynamic: bodies and answers stay JSON values, never decoded CRDs (some 50 times larger).
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<CustomResourceDefinition>(&()),
    );
    let mut out: Vec<Option<CrdOutcome>> = vec![None; actions.len()];
    let concurrency = if writes.dry_run() {
        NonZeroUsize::MIN
    } else {
        concurrency
    };
    let mut flight = InFlight::new(concurrency);
    for (i, a) in actions.iter().enumerate() {
        let (verb, detail) = match a {
            CrdAction::Create(_) => ("create", "consumer CRD"),
            CrdAction::Update(_) => ("update", "consumer CRD schema (provider changed)"),
            CrdAction::Stamp { .. } => ("patch", "add kbind markers (pullPolicy None)"),
        };
        if !writes.will(
            verb,
            format!("CustomResourceDefinition {}", a.name()),
            detail,
        ) {
            out[i] = Some(CrdOutcome::Done);
            continue;
        }
        while !flight.has_room() {
            if let Some((j, o, w)) = flight.next().await {
                writes.absorb(w);
                out[j] = Some(o);
            }
        }
        let mut one = writes.for_one();
        let api = &api;
        flight.push(async move {
            let o = apply_crd(api, manager, a, &mut one).await;
            (i, o, one)
        });
    }
    while let Some((j, o, w)) = flight.next().await {
        writes.absorb(w);
        out[j] = Some(o);
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| CrdOutcome::Failed("not attempted".into())))
        .collect()
}

/// One consumer CRD write.
async fn apply_crd(
    api: &Api<DynamicObject>,
    manager: &str,
    a: &CrdAction,
    writes: &mut Writes,
) -> CrdOutcome {
    let body = match a {
        CrdAction::Create(c) | CrdAction::Update(c) => match c.body() {
            Ok(b) => b,
            Err(e) => return CrdOutcome::Failed(format!("the export's CRD cannot be read: {e}")),
        },
        CrdAction::Stamp { .. } => Value::Null,
    };
    let r = match a {
        CrdAction::Create(_) => match serde_json::from_value::<DynamicObject>(body) {
            Ok(o) => api.create(&PostParams::default(), &o).await.map(|_| ()),
            Err(e) => return CrdOutcome::Failed(format!("the export's CRD cannot be read: {e}")),
        },
        CrdAction::Update(_) => api
            .patch(
                &a.name(),
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ()),
        CrdAction::Stamp { name, connection } => {
            // Markers only: the schema stays the external manager's.
            let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": name, "labels": {keys::MANAGED: "true"}, "annotations": {keys::CONNECTION: connection}}});
            api.patch(
                name,
                &PatchParams::apply(&format!("{manager}-stamp")),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
        }
    };
    match r {
        Ok(()) => {
            writes.data_done();
            CrdOutcome::Done
        }
        Err(e) if e.is_forbidden() => {
            CrdOutcome::Forbidden(e.api_message().unwrap_or_default().to_string())
        }
        Err(e) => CrdOutcome::Failed(e.to_string()),
    }
}

pub(super) async fn apply_autobind(
    client: &Client,
    manager: &str,
    conn: &Connection,
    plan: &AutoBind,
    existing_uid: Option<String>,
    writes: &mut Writes,
) -> Result<(), kube::Error> {
    let name = conn.name_any();
    let api: Api<ClusterBinding> = Api::all(client.clone());
    match plan {
        AutoBind::Leave => Ok(()),
        AutoBind::Apply(apis) => {
            if !writes.will(
                "apply",
                format!("ClusterBinding {name}"),
                format!("autoBind: {} APIs", apis.len()),
            ) {
                return Ok(());
            }
            let body = json!({
                "apiVersion": "core.kbind.io/v1alpha1", "kind": "ClusterBinding",
                "metadata": {"name": name, "labels": conn.labels(), "ownerReferences": [{
                    "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection", "name": name,
                    "uid": conn.uid(), "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"connectionRef": {"name": name}, "apis": apis.iter().map(|a| json!({"name": a})).collect::<Vec<_>>()},
            });
            api.patch(
                &name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&body),
            )
            .await?;
            writes.data_done();
            Ok(())
        }
        AutoBind::Delete => {
            if !writes.will(
                "delete",
                format!("ClusterBinding {name}"),
                "autoBind: two consecutive runs found no exports",
            ) {
                return Ok(());
            }
            if let Some(uid) = existing_uid
                && teardown::delete_observed(&api, &name, &uid).await?
            {
                writes.data_done();
            }
            Ok(())
        }
    }
}
