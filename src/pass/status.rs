//! Status writes: server-side apply under the pass's own field manager (so two passes can own
//! different fields of one object), optionally with a resourceVersion precondition for cursors.

use std::fmt::Debug;
use std::future::Future;

use crate::pass::StatusCode;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Apply `status` to the object's status subresource as `manager`. With `resource_version`
/// the write only succeeds if the object has not changed since it was read (409 otherwise).
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: Value,
    resource_version: Option<&str>,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut metadata = json!({ "name": name });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// Run `attempt` again while it fails with 409 Conflict (it must re-read what it depends on),
/// up to `max` times.
pub async fn retry_on_conflict<T, F, Fut>(max: u32, mut attempt: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Err(e) if e.is_conflict() && tries + 1 < max => {
                tries += 1;
                tracing::debug!(tries, "conflict writing status; re-reading");
            }
            other => return other,
        }
    }
}
