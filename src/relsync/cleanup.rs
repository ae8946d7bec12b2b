//! A deleted RelationshipSource takes its relationships with it (docs/relsync.md "Deleting a
//! source"). relsync keeps the finalizer `kbind.io/relsync-cleanup` on every source it syncs,
//! added before the source's first SpiceDB write. When a source is deleted, every relationship
//! under its own object-id prefix `<namespace>/<name>/` is deleted from SpiceDB
//! (DeleteRelationships, one filter per object type and owned relation), and only then is the
//! finalizer released. Until SpiceDB confirms, the finalizer stays and the reason is on the
//! source's `Ready` condition (`CleanupFailed`); every run retries, due or not.
//!
//! Finalizers are added and released by server-side apply under `kbind-relsync-finalizer`, so
//! other owners' finalizers are never touched (`pass::finalizer` also removes an entry another
//! manager co-owns).

use std::sync::Mutex;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use k8s_openapi::jiff::Timestamp;

use super::kinds::{all_object_types, relations};
use super::spicedb::{Filter, RelationshipStore, SpiceError};
use super::{key, plan, record};
use crate::api::relsync::{CLEANUP_FINALIZER, RelationshipSource};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, Summary, lock};

/// The field manager of the finalizer, beside `kbind-relsync` (status).
pub fn manager(pass_manager: &str) -> String {
    crate::api::keys::finalizer_manager_of(pass_manager)
}

pub fn has_finalizer(src: &RelationshipSource) -> bool {
    src.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
}

pub fn deleting(src: &RelationshipSource) -> bool {
    src.metadata.deletion_timestamp.is_some()
}

/// The filters that delete everything a source wrote: every object type any kind writes (the
/// source's kind may have changed since it wrote), under the source's prefix, one owned relation
/// at a time. A relation someone else writes on these objects is left alone, as in every diff.
pub fn filters(prefix: &str) -> Vec<Filter> {
    all_object_types()
        .flat_map(|t| {
            relations(t).iter().map(move |r| Filter {
                resource_type: t.to_string(),
                resource_id: None,
                resource_id_prefix: Some(prefix.to_string()),
                relation: Some(r.to_string()),
            })
        })
        .collect()
}

/// Delete every relationship of the source with this prefix; returns how many SpiceDB reported
/// deleted. Each filter that deleted something is one data write. A dry run reads instead and
/// plans a delete for each filter that matches something.
pub async fn delete_relationships<S: RelationshipStore>(
    store: &S,
    prefix: &str,
    writes: &Mutex<Writes>,
) -> Result<u64, SpiceError> {
    let mut total = 0;
    for f in filters(prefix) {
        let target = format!(
            "spicedb {}:{prefix}*#{}",
            f.resource_type,
            f.relation.as_deref().unwrap_or_default()
        );
        if lock(writes).dry_run() {
            let held = store.read(&f).await?.len();
            if held > 0 {
                lock(writes).will(
                    "delete",
                    target,
                    format!("{held} relationships of the deleted source"),
                );
            }
            continue;
        }
        lock(writes).will("delete", target, "");
        let n = store.delete(&f).await?;
        if n > 0 {
            lock(writes).data_done();
        }
        total += n;
    }
    Ok(total)
}

fn body(src: &RelationshipSource, finalizers: &[&str], resource_version: Option<&str>) -> Value {
    let mut metadata = json!({
        "name": src.name_any(),
        "namespace": src.namespace(),
        "finalizers": finalizers,
    });
    // The precondition keeps an apply from re-creating a source deleted since it was listed
    // (an apply creates what does not exist) and from acting on a stale copy.
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({
        "apiVersion": "agentprimitives.authzed.com/v1alpha1",
        "kind": "RelationshipSource",
        "metadata": metadata,
    })
}

/// Add the finalizer to a live source that lacks it. Returns the updated source, or `None` when
/// it was deleted meanwhile (or began deleting: no finalizer may be added then, and it has none
/// of ours to honour).
pub async fn add_finalizer(
    api: &Api<RelationshipSource>,
    src: &RelationshipSource,
    manager: &str,
) -> Result<Option<RelationshipSource>, kube::Error> {
    let mut obj = src.clone();
    for attempt in 0..5 {
        if deleting(&obj) {
            return Ok(None);
        }
        if has_finalizer(&obj) {
            return Ok(Some(obj));
        }
        let b = body(
            &obj,
            &[CLEANUP_FINALIZER],
            obj.metadata.resource_version.as_deref(),
        );
        match api
            .patch(
                &obj.name_any(),
                &PatchParams::apply(manager),
                &Patch::Apply(&b),
            )
            .await
        {
            Ok(o) => return Ok(Some(o)),
            Err(kube::Error::Api(s)) if s.is_conflict() && attempt < 4 => {
                match api.get_opt(&obj.name_any()).await? {
                    Some(o) => obj = o,
                    None => return Ok(None),
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => {
                // Gone since it was listed: the precondition refused to re-create it.
                if api.get_opt(&obj.name_any()).await?.is_none() {
                    return Ok(None);
                }
                return Err(e);
            }
        }
    }
    Ok(None)
}

/// Release the finalizer (the source then goes away unless another finalizer holds it).
pub async fn release_finalizer(
    api: &Api<RelationshipSource>,
    src: &RelationshipSource,
    manager: &str,
) -> Result<(), kube::Error> {
    let b = body(src, &[], None);
    match crate::pass::finalizer::release(api, &src.name_any(), &b, manager, CLEANUP_FINALIZER)
        .await
    {
        Ok(()) => Ok(()),
        // An apply to an object that is gone would create it, which its missing spec refuses:
        // gone is released.
        Err(e) => match api.get_opt(&src.name_any()).await? {
            None => Ok(()),
            Some(o) if o.metadata.uid != src.metadata.uid || !has_finalizer(&o) => Ok(()),
            Some(_) => Err(e),
        },
    }
}

/// Add the cleanup finalizer to the live sources that lack it; a source deleted meanwhile is
/// dropped from `mine`.
pub(super) async fn add_finalizers(
    ctx: &PassContext,
    mine: &mut Vec<RelationshipSource>,
    writes: &Mutex<Writes>,
) -> Result<(), PassError> {
    let finalizer_manager = manager(&ctx.field_manager());
    let mut gone = Vec::new();
    for src in mine.iter_mut().filter(|s| !has_finalizer(s)) {
        let k = key(src);
        let go = lock(writes).will(
            "add finalizer",
            format!("RelationshipSource {k}"),
            CLEANUP_FINALIZER,
        );
        if !go {
            continue;
        }
        let ns = src.namespace().unwrap_or_default();
        let sapi: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
        match add_finalizer(&sapi, src, &finalizer_manager)
            .await
            .map_err(|e| {
                PassError::kube(
                    format!("adding finalizer {CLEANUP_FINALIZER} to RelationshipSource {k}"),
                    e,
                )
            })? {
            Some(updated) => {
                *src = updated;
                lock(writes).bookkeeping_done();
            }
            None => gone.push(k),
        }
    }
    mine.retain(|s| !gone.contains(&key(s)));
    Ok(())
}

/// One deleted source that still carries our finalizer: delete its relationships from SpiceDB,
/// then release the finalizer. A failure leaves the finalizer and says why on the source
/// (`Ready=False CleanupFailed`); the next run retries. Never fails the pass: one source's
/// cleanup must not hold up the others.
pub(super) async fn clean_up<S: RelationshipStore>(
    ctx: &PassContext,
    store: &S,
    unreachable: Option<&String>,
    src: &RelationshipSource,
    writes: &Mutex<Writes>,
    summary: &mut Summary,
) {
    let k = key(src);
    let ns = src.namespace().unwrap_or_default();
    let api: Api<RelationshipSource> = Api::namespaced(ctx.client.clone(), &ns);
    // Deleting costs no --max-items; only the deadline (or SIGTERM) defers it to the next run.
    if unreachable.is_none() && ctx.budget.remaining().is_zero() {
        summary.count("sourcesCleanupDeferred", 1);
        return;
    }
    let deleted = match unreachable {
        Some(m) => Err(format!("SpiceDB is unreachable: {m}")),
        None => {
            let prefix = plan::source_prefix(&ns, &src.name_any());
            delete_relationships(store, &prefix, writes)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let failure = match deleted {
        Ok(n) => {
            summary.count("relationshipsDeleted", i64::try_from(n).unwrap_or(i64::MAX));
            let go = lock(writes).will(
                "release finalizer",
                format!("RelationshipSource {k}"),
                CLEANUP_FINALIZER,
            );
            if !go {
                return;
            }
            let manager = manager(&ctx.field_manager());
            match release_finalizer(&api, src, &manager).await {
                Ok(()) => {
                    lock(writes).bookkeeping_done();
                    summary.count("sourcesCleanedUp", 1);
                    tracing::info!(source = %k, relationships = n, "deleted source: its relationships are deleted and its finalizer released");
                    return;
                }
                Err(e) => format!(
                    "its relationships were deleted from SpiceDB but finalizer {CLEANUP_FINALIZER} could not be released; the next run retries: {e}"
                ),
            }
        }
        Err(e) => format!(
            "its relationships could not be deleted from SpiceDB, so finalizer {CLEANUP_FINALIZER} stays; the next run retries: {e}"
        ),
    };
    summary.count("sourcesCleanupFailed", 1);
    tracing::warn!(source = %k, reason = %failure, "deleted source not cleaned up yet");
    record_failure(ctx, &api, src, &failure, writes).await;
}

/// `Ready=False CleanupFailed` saying why.
async fn record_failure(
    ctx: &PassContext,
    api: &Api<RelationshipSource>,
    src: &RelationshipSource,
    failure: &str,
    writes: &Mutex<Writes>,
) {
    let k = key(src);
    let go = lock(writes).will(
        "apply-status",
        format!("RelationshipSource {k}"),
        "Ready=False CleanupFailed",
    );
    if !go {
        return;
    }
    let now = Timestamp::now();
    match record::apply(
        api,
        &src.name_any(),
        src,
        &ctx.field_manager(),
        |prev, generation| record::cleanup_failed(prev, generation, failure, now),
    )
    .await
    {
        Ok(true) => lock(writes).bookkeeping_done(),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(source = %k, error = %e, "recording the cleanup failure")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_cover_every_object_type_under_the_prefix_only() {
        let f = filters("team-a/slack/");
        let got: Vec<(String, String)> = f
            .iter()
            .map(|f| (f.resource_type.clone(), f.relation.clone().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("slack_channel", "member"),
                ("slack_channel", "workspace"),
                ("slack_usergroup", "member"),
                ("slack_workspace", "member"),
                ("scim_group", "member"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        for f in &f {
            assert_eq!(f.resource_id_prefix.as_deref(), Some("team-a/slack/"));
            assert_eq!(f.resource_id, None);
            assert_eq!(
                f.to_json()["optionalResourceIdPrefix"],
                json!("team-a/slack/"),
                "the prefix reaches the gateway under the proto's name"
            );
        }
    }

    #[test]
    fn the_finalizer_body_names_the_source_and_its_version() {
        let src: RelationshipSource = serde_json::from_value(json!({
            "apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "42"},
            "spec": {"kind": "slack", "auth": {"agentIdentity": "a", "credential": "c"}}
        }))
        .unwrap();
        assert_eq!(
            body(&src, &[CLEANUP_FINALIZER], Some("42")),
            json!({"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
                "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "42",
                    "finalizers": ["kbind.io/relsync-cleanup"]}})
        );
        assert_eq!(
            body(&src, &[], None)["metadata"],
            json!({"name": "s", "namespace": "ns", "finalizers": []})
        );
    }
}
