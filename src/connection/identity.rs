//! Cluster identity: the kcp LogicalCluster `cluster` UID where that API exists, else the UID of
//! the `kube-system` Namespace. A forbidden read is an error to report, never a reason to skip
//! the check.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ApiResource;
use kube::core::{DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use std::sync::Arc;

use crate::pass::StatusCode;

/// Why the identity could not be read. The API error stays typed (shared, as one provider's
/// identity is read once per pass and reused); its text is scrubbed where it is printed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IdentityError {
    #[error("reading the cluster identity was forbidden: {0}")]
    Forbidden(#[source] Arc<kube::Error>),
    #[error("the cluster identity object has no UID")]
    NoUid,
    #[error("cluster unreachable or refused the request: {0}")]
    Unreachable(#[source] Arc<kube::Error>),
    #[error("credentials were rejected (401): {0}")]
    Unauthorized(#[source] Arc<kube::Error>),
}

pub fn classify(e: kube::Error) -> IdentityError {
    if e.is_forbidden() {
        IdentityError::Forbidden(Arc::new(e))
    } else if e.is_unauthorized() {
        IdentityError::Unauthorized(Arc::new(e))
    } else {
        IdentityError::Unreachable(Arc::new(e))
    }
}

/// The identity UID of the cluster `client` talks to.
pub async fn cluster_uid(client: &Client) -> Result<String, IdentityError> {
    // Ask discovery first (any authenticated user may): on a plain cluster a GET on the missing
    // LogicalCluster resource is refused (403) before it could be found missing.
    if serves_logical_clusters(client).await? {
        let gvk = GroupVersionKind::gvk("core.kcp.io", "v1alpha1", "LogicalCluster");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "logicalclusters");
        let lc: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        match lc.get("cluster").await {
            Ok(o) => return o.metadata.uid.ok_or(IdentityError::NoUid),
            // The API is installed (e.g. kcp's CRDs on a plain cluster) but holds no `cluster`.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(classify(e)),
        }
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    match ns.get("kube-system").await {
        Ok(n) => n.metadata.uid.ok_or(IdentityError::NoUid),
        Err(e) => Err(classify(e)),
    }
}

async fn serves_logical_clusters(client: &Client) -> Result<bool, IdentityError> {
    match client
        .list_api_group_resources("core.kcp.io/v1alpha1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "logicalclusters")),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(classify(e)),
    }
}
