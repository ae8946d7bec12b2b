//! Releasing kbind's finalizers. They are added and released with server-side apply under a
//! manager of their own, so other owners' finalizers are never touched. But a release by apply
//! only withdraws *kbind's* claim on the entry: when another manager also lists it (a GitOps tool
//! applying a manifest copied from the cluster, finalizer included), the finalizer stays and the
//! deleted object never goes away. [`release`] then removes that one entry by position, guarded
//! by a JSON-patch `test`, so it can only ever remove kbind's own finalizer.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

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
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
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
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        // 422: the list moved between the two patches (the test failed); the next run retries.
        Err(e) => Err(e),
    }
}
