//! `kbind bind` step 1: observe the provider with the kubeconfig being bound, after it passed the
//! rules `kbind schema` applies to a Connection's Secret (src/connection/).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::{Api, Client};

use super::plan::{Chosen, GrantInfo};
use super::{BindArgs, BindError, KUBECONFIG_KEY, Request};
use crate::api::core::{ExportedApi, SchemaSource, SecretKeyRef};
use crate::api::keys;
use crate::connection::{self, CredentialArgs, CredentialPolicy, IdentityError};
use crate::discovery;
use crate::pass::CommonArgs;
use crate::pass::client::RequestCounter;

/// What the provider showed: its identity, what it exports, the Grant's issued Secret.
pub(super) struct Seen {
    pub uid: String,
    pub exports: Vec<ExportedApi>,
    pub grant: Option<GrantInfo>,
}

/// Check the kubeconfig (`bytes`), then read the provider's identity, exports, the Export
/// `--export` names (into `req`), and the Grant's issued Secret (`--grant-secret`, or the one
/// a kubeconfig from `kbind issue` names).
pub(super) async fn observe(
    common: &CommonArgs,
    args: &BindArgs,
    req: &mut Request,
    bytes: &[u8],
) -> Result<Seen, BindError> {
    let path = req.path.clone();
    // The kubeconfig, checked exactly as `kbind schema` will check it in the Secret.
    let r = SecretKeyRef {
        namespace: args.credential_namespace.clone(),
        name: args.name.clone(),
        key: KUBECONFIG_KEY.into(),
    };
    let policy = CredentialPolicy::new(
        &CredentialArgs {
            credential_namespaces: vec![args.credential_namespace.clone()],
            allow_kubeconfig_fields: args.allow_kubeconfig_fields.clone(),
        },
        args.credential_namespace.clone(),
    );
    let candidate = Secret {
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_string(),
            ByteString(bytes.to_vec()),
        )])),
        ..Default::default()
    };
    let kerr = |source| BindError::Kubeconfig {
        path: path.clone(),
        source,
    };
    let pk = connection::kubeconfig(Some(&candidate), &r, &policy)
        .await
        .map_err(kerr)?;
    let counter = Arc::new(RequestCounter::default());
    let provider = connection::client(&pk, &r, counter, common.request_timeout)
        .await
        .map_err(kerr)?;

    // The provider: identity (the credential works), exports, the Export, the Grant Secret.
    let provider_uid = identity(&provider, &path).await?;
    let exports: Vec<ExportedApi> = discovery::discover(&provider, SchemaSource::Auto)
        .await
        .map_err(BindError::Discovery)?
        .exports
        .into_iter()
        .map(|e| e.api)
        .collect();
    if let Chosen::Export { name, apis } = &mut req.chosen {
        *apis = read_export(&provider, name).await?;
    }
    // `--grant-secret`, or else the Secret a kubeconfig from `kbind issue` names itself.
    let grant_secret = match req.grant_secret.take() {
        Some(s) => Some(s),
        None => connection::issued_grant_secret(&pk.kubeconfig).map_err(|why| {
            BindError::GrantExtension {
                path: path.clone(),
                why,
            }
        })?,
    };
    let grant = match &grant_secret {
        Some((ns, n)) => Some(read_grant_secret(&provider, ns, n).await?),
        None => None,
    };
    Ok(Seen {
        uid: provider_uid,
        exports,
        grant,
    })
}

/// The provider's identity: the credential works (else it is rejected, or may not read it).
async fn identity(provider: &Client, path: &str) -> Result<String, BindError> {
    connection::cluster_uid(provider)
        .await
        .map_err(|source| match source {
            IdentityError::Unauthorized(_) => BindError::CredentialRejected {
                path: path.to_string(),
                source,
            },
            IdentityError::Forbidden(_) => BindError::IdentityForbidden {
                path: path.to_string(),
                source,
            },
            _ => BindError::ProviderUnreachable { source },
        })
}

/// `spec.apis[].name` of the provider's Export `name`, read as JSON (`catalog.kbind.io`).
async fn read_export(provider: &Client, name: &str) -> Result<Vec<String>, BindError> {
    let gvk = GroupVersionKind::gvk("catalog.kbind.io", "v1alpha1", "Export");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "exports");
    let api: Api<DynamicObject> = Api::all_with(provider.clone(), &ar);
    match api.get_opt(name).await {
        Ok(Some(o)) => Ok(o.data["spec"]["apis"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()),
        Ok(None) => Err(BindError::ExportNotFound {
            export: name.into(),
        }),
        Err(source) => Err(BindError::ExportUnreadable {
            export: name.into(),
            source,
        }),
    }
}

/// The Grant's issued Secret on the provider, read with the kubeconfig being bound (as
/// `kbind schema` will read it to pull each re-issued kubeconfig): its Grant and expiry.
async fn read_grant_secret(
    provider: &Client,
    namespace: &str,
    name: &str,
) -> Result<GrantInfo, BindError> {
    let secret = format!("{namespace}/{name}");
    let s = crate::secrets::read(provider, namespace, name)
        .await
        .map_err(|e| BindError::GrantSecret {
            secret: secret.clone(),
            why: format!(
                "the provider kubeconfig cannot read it, so kbind schema could not pull a re-issued kubeconfig from it: {e}"
            ),
        })?;
    if crate::secrets::key_bytes(&s, KUBECONFIG_KEY).is_none() {
        return Err(BindError::GrantSecret {
            secret,
            why: format!("it has no key {KUBECONFIG_KEY:?}: not a Grant's issued Secret"),
        });
    }
    let ann = s.metadata.annotations.unwrap_or_default();
    Ok(GrantInfo {
        namespace: namespace.into(),
        name: name.into(),
        grant: ann.get(keys::IAM_GRANT).cloned(),
        expires_at: ann.get(keys::IAM_EXPIRES_AT).cloned(),
    })
}
