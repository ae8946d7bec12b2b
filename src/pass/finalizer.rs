//! Releasing kbind's finalizers. They are added and released with server-side apply under a
//! manager of their own, so other owners' finalizers are never touched. But a release by apply
//! only withdraws *kbind's* claim on the entry: when another manager also lists it (a GitOps tool
//! applying a manifest copied from the cluster, finalizer included), the finalizer stays and the
//! deleted object never goes away. [`release`] then removes that one entry by position, guarded
//! by a JSON-patch `test`, so it can only ever remove kbind's own finalizer. [`set`] adds or
//! releases one, [`has`] reads one.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use crate::api::keys;
use crate::pass::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Whether `finalizer` is among `finalizers`.
pub fn has(finalizers: Option<&Vec<String>>, finalizer: &str) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Add (or release) `finalizer` with server-side apply as `{manager}-finalizer`: finalizers are a
/// set, so other owners' finalizers are untouched.
pub async fn set<K>(
    api: &Api<K>,
    name: &str,
    namespace: Option<&str>,
    manager: &str,
    finalizer: &str,
    present: bool,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    if present {
        return add(api, name, namespace, manager, finalizer)
            .await
            .map(|_| ());
    }
    let body = identity::<K>(name, namespace, &[]);
    release(
        api,
        name,
        &body,
        &keys::finalizer_manager_of(manager),
        finalizer,
    )
    .await
}

/// Add `finalizer` as [`set`] does; returns the object as it is after the write (its new
/// `resourceVersion`, for a later write preconditioned on the version this pass observed).
pub async fn add<K>(
    api: &Api<K>,
    name: &str,
    namespace: Option<&str>,
    manager: &str,
    finalizer: &str,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let body = identity::<K>(name, namespace, &[finalizer]);
    let manager = keys::finalizer_manager_of(manager);
    api.patch(name, &PatchParams::apply(&manager), &Patch::Apply(&body))
        .await
}

/// The apply body naming the object and listing `finalizers` (kbind's claim on them).
fn identity<K: Resource<DynamicType = ()>>(
    name: &str,
    namespace: Option<&str>,
    finalizers: &[&str],
) -> Value {
    let mut metadata = json!({"name": name, "finalizers": finalizers});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": K::api_version(&()), "kind": K::kind(&()), "metadata": metadata})
}

/// Apply `body` (the object's identity with `metadata.finalizers` empty) as `manager`; if
/// `finalizer` is still listed afterwards, remove it. An object already gone is released.
pub async fn release<K>(
    api: &Api<K>,
    name: &str,
    body: &Value,
    manager: &str,
    finalizer: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let after = match api
        .patch(name, &PatchParams::apply(manager), &Patch::Apply(body))
        .await
    {
        Ok(o) => o,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e),
    };
    let Some(i) = after.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    tracing::debug!(
        object = name,
        finalizer,
        "another field manager also lists the finalizer; removing it by position"
    );
    let path = format!("/metadata/finalizers/{i}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]))
    .map_err(kube::Error::SerdeError)?;
    match api
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        // 422: the list moved between the two patches (the test failed); the next run retries.
        Err(e) => Err(e),
    }
}
