//! A Connection's provider, reached the one way `kbind schema` and `kbind resync` both use
//! (docs/schema.md "Credentials"): the Secret it names, read only in a credential namespace →
//! a self-contained kubeconfig that passes the field policy and the server address check → a
//! counted client with bounded timeouts → the provider's cluster identity ([`identity`]).
//!
//! Every run reads the Secret again, so a rotated credential is used on the next run. A Secret
//! `kbind bind` annotated with its Grant's Secret is first brought in step with the provider's
//! re-issued kubeconfig ([`refresh`], rotation by pull).

mod address;
pub mod identity;
pub mod kubeconfig;
pub mod refresh;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;

use crate::api::core::SecretKeyRef;
use crate::pass::client::RequestCounter;

pub use identity::{IdentityError, cluster_uid};
pub use kubeconfig::{
    ClientError, CredentialArgs, CredentialError, CredentialPolicy, KubeconfigField,
    ProviderKubeconfig, issued_grant_secret,
};

/// Connections per LIST page. A page is decoded whole before its managedFields are dropped, and
/// a Connection with many exports is large (~0.3 KiB an export with its managedFields): at 200
/// Connections × 50 exports one page of all 200 was a schema pass's peak memory
/// (docs/performance.md "schema memory").
const CONNECTION_PAGE: u32 = 50;

/// Every Connection matching `lp`, in pages of [`CONNECTION_PAGE`], without managedFields: a
/// pass reads spec, status and the rest of metadata, and the server-side-applied
/// `exportedAPIs` list-map makes managedFields about half of a Connection.
pub async fn list(
    client: &Client,
    lp: &kube::api::ListParams,
) -> Result<Vec<crate::api::core::Connection>, kube::Error> {
    crate::pass::list::map_all(
        &kube::Api::all(client.clone()),
        &lp.clone().limit(CONNECTION_PAGE),
        |mut c: crate::api::core::Connection| {
            c.metadata.managed_fields = None;
            c
        },
    )
    .await
}

/// The Secret `r` names, refused outside the credential namespaces before anything reads it.
/// `Ok(None)`: it does not exist.
pub async fn read_secret(
    client: &Client,
    policy: &CredentialPolicy,
    r: &SecretKeyRef,
) -> Result<Option<Secret>, CredentialError> {
    policy.check_namespace(&r.namespace, &r.name)?;
    crate::secrets::read_opt(client, &r.namespace, &r.name)
        .await
        .map_err(|e| CredentialError::SecretUnreadable(Arc::new(e)))
}

/// The kubeconfig under `r.key`, validated: self-contained, no refused field, and a server that
/// does not resolve to a link-local or cloud metadata address. `secret: None` is a missing Secret.
pub async fn kubeconfig(
    secret: Option<&Secret>,
    r: &SecretKeyRef,
    policy: &CredentialPolicy,
) -> Result<ProviderKubeconfig, CredentialError> {
    let mut pk = kubeconfig::kubeconfig_from_secret(secret, &r.namespace, &r.name, &r.key, policy)?;
    pk.pinned = kubeconfig::check_server_address(&pk).await?;
    Ok(pk)
}

/// A counted client for the provider, with the pass's `--request-timeout` as its bound.
pub async fn client(
    pk: &ProviderKubeconfig,
    r: &SecretKeyRef,
    counter: Arc<RequestCounter>,
    timeout: Duration,
) -> Result<Client, CredentialError> {
    kubeconfig::provider_client(pk, counter, timeout)
        .await
        .map_err(|e| CredentialError::ClientFailed {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            key: r.key.clone(),
            source: Arc::new(e),
        })
}
