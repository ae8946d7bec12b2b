//! Provider objects whose consumer object is gone: marked (Keep), deleted or restored per the
//! binding's `spec.orphans`.

use super::*;

/// Handle one orphan (a copy of ours whose consumer object is gone) as its binding's
/// `spec.orphans` says. Returns whether the orphan is gone from the provider's point of view
/// (deleted); a marked or restored copy is still counted as orphaned this run.
pub async fn orphan(
    consumer: &Client,
    provider: &Client,
    api: &BoundApi,
    o: &ProviderObj,
    action: OrphanAction,
    writes: &mut Writes,
) -> bool {
    let ns = o.namespace.as_deref();
    let target = format!(
        "{} {}{}",
        api.resource.kind,
        ns.map(|n| format!("{n}/")).unwrap_or_default(),
        o.name
    );
    let prov = ns_api(provider, api, ns);
    let r = match action {
        OrphanAction::Mark(reason) => {
            if !writes.will("annotate orphaned", format!("{target} (provider)"), reason) {
                return false;
            }
            mark_orphaned(&prov, &o.name, reason).await
        }
        OrphanAction::Delete => {
            if !writes.will(
                "delete",
                format!("{target} (provider)"),
                "consumer object gone; spec.orphans: Delete",
            ) {
                return false;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(o.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match prov.delete(&o.name, &dp).await {
                Err(e) if e.is_not_found() || e.is_conflict() => return true,
                r => r.map(|_| ()),
            }
        }
        OrphanAction::Restore => {
            if !writes.will(
                "restore",
                format!("{target} (consumer)"),
                "from its provider copy; spec.orphans: Restore",
            ) {
                return false;
            }
            restore(consumer, &prov, api, o).await
        }
    };
    match r {
        Ok(()) => {
            writes.data_done();
            action == OrphanAction::Delete
        }
        Err(e) => {
            tracing::warn!(object = %target, error = %e, "orphan not handled; the next run retries");
            false
        }
    }
}

/// Annotate a provider copy `core.kbind.io/orphaned: <reason>`.
pub async fn mark_orphaned(
    prov: &Api<DynamicObject>,
    name: &str,
    reason: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {keys::ORPHANED: reason}}});
    prov.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

/// Re-create the consumer object from the copy's spec and labels (kbind's own keys left out);
/// the next run re-adopts the copy through the usual path. An object of that name appearing in
/// between wins (409 is success: a consumer object exists again).
async fn restore(
    consumer: &Client,
    prov: &Api<DynamicObject>,
    api: &BoundApi,
    o: &ProviderObj,
) -> Result<(), kube::Error> {
    let Some(copy) = prov.get_opt(&o.name).await? else {
        return Ok(());
    };
    let mut labels = copy.metadata.labels.clone().unwrap_or_default();
    labels.retain(|k, _| !k.starts_with("core.kbind.io/"));
    let mut metadata = json!({"name": o.name, "labels": labels});
    if let Some(ns) = &o.namespace {
        metadata["namespace"] = json!(ns);
    }
    let body = json!({"apiVersion": api.resource.api_version, "kind": api.resource.kind,
        "metadata": metadata, "spec": copy.data.get("spec").cloned().unwrap_or(Value::Null)});
    let obj: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let target = ns_api(consumer, api, o.namespace.as_deref());
    // A missing consumer namespace is not created (the pass would need namespace create on the
    // consumer for it): the create fails, is logged, and the next run tries again.
    match target.create(&pp, &obj).await {
        Err(e) if e.is_conflict() => Ok(()),
        r => r.map(|_| ()),
    }
}
