//! The kubeconfig in a Connection's Secret and the rules it must meet: the Secret holds a kubeconfig that must work inside a
//! CronJob pod, so it must be self-contained (embedded CA, certificate and token; no exec
//! plugin, auth provider or file path). Every run builds its client from the Secret's current
//! data, so a rotated credential is used on the next run without any restart.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use sha2::Digest;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::sync::Arc;

use crate::api::keys;
use crate::pass::client::{RequestCounter, counted_client, with_timeouts};
use crate::scrub::scrub;
use crate::secrets::SecretError;

/// Why a Connection's Secret cannot be used; each maps to a `SecretValid=False` reason.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CredentialError {
    #[error("Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    /// The GET failed (403 included: [`SecretError::is_forbidden`] tells it apart).
    #[error(transparent)]
    SecretUnreadable(Arc<SecretError>),
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    KeyNotFound {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secret {namespace}/{name} key {key:?} is not a valid kubeconfig: {message}")]
    InvalidKubeconfig {
        namespace: String,
        name: String,
        key: String,
        message: String,
    },
    /// The kubeconfig validated, yet no client could be built from it.
    #[error("Secret {namespace}/{name} key {key:?} is not a valid kubeconfig: {source}")]
    ClientFailed {
        namespace: String,
        name: String,
        key: String,
        #[source]
        source: Arc<ClientError>,
    },
    #[error("kubeconfig in Secret {namespace}/{name} is not self-contained: {what}")]
    NotSelfContained {
        namespace: String,
        name: String,
        what: String,
    },
    /// What to set is spelled out for every way kbind is installed: the spec's own example
    /// keeps its Secret in `kbind`, outside the default (docs/schema.md "The spec's example").
    #[error(
        "Secret {namespace}/{name} is outside the credential namespaces ({allowed}); kbind reads Connection Secrets only there. To use it, give kbind schema and kbind resync --credential-namespace={allowed},{namespace} (Helm: credentialNamespaces: [{namespace}]; kustomize: the flag on both CronJobs, and the Roles kbind-schema-credentials and kbind-resync-credentials with their RoleBindings copied into {namespace}), or move the Secret into {allowed}"
    )]
    SecretNamespaceNotAllowed {
        namespace: String,
        name: String,
        allowed: String,
    },
    #[error("kubeconfig in Secret {namespace}/{name}: {what}")]
    FieldNotAllowed {
        namespace: String,
        name: String,
        what: String,
    },
}

impl CredentialError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretNotFound { .. } => "SecretNotFound",
            Self::SecretUnreadable { .. } => "SecretUnreadable",
            Self::KeyNotFound { .. } => "KeyNotFound",
            Self::InvalidKubeconfig { .. } | Self::ClientFailed { .. } => "InvalidKubeconfig",
            Self::NotSelfContained { .. } => "NotSelfContained",
            Self::SecretNamespaceNotAllowed { .. } => "SecretNamespaceNotAllowed",
            Self::FieldNotAllowed { .. } => "KubeconfigFieldNotAllowed",
        }
    }
}

/// Kubeconfig fields that widen a credential's reach beyond "this provider, over verified TLS, as
/// this identity". Refused unless `--allow-kubeconfig-field` re-allows one (docs/schema.md
/// "Credentials").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum KubeconfigField {
    /// `cluster.proxy-url`: the token goes through a proxy of the Secret writer's choosing.
    ProxyUrl,
    /// `cluster.insecure-skip-tls-verify`: anyone on the path can impersonate the provider.
    InsecureSkipTlsVerify,
    /// An `http://` server: the token travels in clear text.
    Http,
    /// `user.as`, `as-groups`, `as-uid`, `as-user-extra`: acting as another identity.
    Impersonation,
}

/// Where Connection Secrets may live and which widening fields are re-allowed: shared by every
/// pass that reads a Connection's credentials (schema, resync).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct CredentialArgs {
    /// Namespace Connection Secrets may live in (repeatable, or comma-separated). A Connection
    /// naming a Secret elsewhere gets SecretValid=False SecretNamespaceNotAllowed and is never
    /// read. Default: the install namespace ($POD_NAMESPACE, else kbind-system), whatever
    /// --lease-namespace says.
    #[arg(
        long = "credential-namespace",
        env = "KBIND_CREDENTIAL_NAMESPACES",
        value_delimiter = ','
    )]
    pub credential_namespaces: Vec<String>,
    /// Re-allow a kubeconfig field refused by default (repeatable): proxy-url,
    /// insecure-skip-tls-verify, http, impersonation.
    #[arg(long = "allow-kubeconfig-field", value_enum)]
    pub allow_kubeconfig_fields: Vec<KubeconfigField>,
}

/// [`CredentialArgs`] resolved for one run.
#[derive(Clone, Debug, Default)]
pub struct CredentialPolicy {
    namespaces: BTreeSet<String>,
    allowed: BTreeSet<KubeconfigField>,
}

impl CredentialPolicy {
    pub fn new(args: &CredentialArgs, install_namespace: String) -> Self {
        let mut namespaces: BTreeSet<String> = args
            .credential_namespaces
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect();
        if namespaces.is_empty() {
            namespaces.insert(install_namespace);
        }
        Self {
            namespaces,
            allowed: args.allow_kubeconfig_fields.iter().copied().collect(),
        }
    }

    /// Refuse a Secret outside the credential namespaces before anything reads it: RBAC alone
    /// made kbind a confused deputy for anyone allowed to create a Connection.
    pub fn check_namespace(&self, namespace: &str, name: &str) -> Result<(), CredentialError> {
        if self.namespaces.contains(namespace) {
            return Ok(());
        }
        Err(CredentialError::SecretNamespaceNotAllowed {
            namespace: namespace.into(),
            name: name.into(),
            allowed: self
                .namespaces
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
        })
    }
}

/// A validated provider kubeconfig.
#[derive(Clone, Debug)]
pub struct ProviderKubeconfig {
    pub kubeconfig: Kubeconfig,
    /// SHA-256 of the kubeconfig bytes: Connections sharing credentials share one provider
    /// client, identity read and discovery per pass. Never logged.
    pub fingerprint: String,
    /// The context's namespace (heartbeat location), `default` if none.
    pub default_namespace: String,
    /// `namespace/name` of the Secret it came from, for error messages.
    pub(super) secret: (String, String),
    /// Where the server's host name resolved when it was checked: the client connects there,
    /// not to a second lookup's answer (no DNS-rebinding window; docs/hostile-inputs.md).
    pub pinned: Option<IpAddr>,
}

/// Largest kubeconfig accepted (a kubeconfig is a few KiB; a huge blob is a mistake or an attack).
const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

/// Extract and validate the kubeconfig from the Secret (`None`: Secret missing).
pub fn kubeconfig_from_secret(
    secret: Option<&Secret>,
    namespace: &str,
    name: &str,
    key: &str,
    policy: &CredentialPolicy,
) -> Result<ProviderKubeconfig, CredentialError> {
    let (ns, n, k) = (namespace.to_string(), name.to_string(), key.to_string());
    let secret = secret.ok_or_else(|| CredentialError::SecretNotFound {
        namespace: ns.clone(),
        name: n.clone(),
    })?;
    let bytes =
        crate::secrets::key_bytes(secret, key).ok_or_else(|| CredentialError::KeyNotFound {
            namespace: ns.clone(),
            name: n.clone(),
            key: k.clone(),
        })?;
    let invalid = |message: String| CredentialError::InvalidKubeconfig {
        namespace: ns.clone(),
        name: n.clone(),
        key: k.clone(),
        message,
    };
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(invalid(format!(
            "{} bytes is larger than the {MAX_KUBECONFIG_BYTES} allowed",
            bytes.len()
        )));
    }
    let fingerprint = hex::encode(sha2::Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text".into()))?;
    // The parser's message can quote the document: never let it carry credentials out.
    let kubeconfig =
        Kubeconfig::from_yaml(&text).map_err(|e| invalid(scrub_yaml_error(&e.to_string())))?;
    let default_namespace =
        check_self_contained(&kubeconfig).map_err(|what| CredentialError::NotSelfContained {
            namespace: ns.clone(),
            name: n.clone(),
            what,
        })?;
    register_secrets(&kubeconfig);
    check_fields(&kubeconfig, &policy.allowed).map_err(|what| {
        CredentialError::FieldNotAllowed {
            namespace: ns.clone(),
            name: n.clone(),
            what,
        }
    })?;
    Ok(ProviderKubeconfig {
        kubeconfig,
        fingerprint,
        default_namespace,
        secret: (ns, n),
        pinned: None,
    })
}

/// Every credential in the kubeconfig is redacted by value from then on: an apiserver or proxy
/// echoing it back in an error must not carry it into status, an Event or a log.
fn register_secrets(kc: &Kubeconfig) {
    use secrecy::ExposeSecret;
    for a in kc.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        for s in [&a.token, &a.password, &a.client_key_data]
            .into_iter()
            .flatten()
        {
            crate::scrub::register_secret(s.expose_secret());
        }
    }
}

/// The current context's cluster and user (already known to exist: checked by
/// [`check_self_contained`] first).
/// The Grant's issued Secret (`<namespace>`, `<name>`) that a kubeconfig `kbind issue` wrote
/// names in its context's `iam.kbind.io/grant` extension; `Ok(None)` for any other kubeconfig
/// (docs/binding-flow.md). An extension that is there but malformed is an error naming it.
pub fn issued_grant_secret(kc: &Kubeconfig) -> Result<Option<(String, String)>, String> {
    let ctx_name = kc
        .current_context
        .clone()
        .or_else(|| (kc.contexts.len() == 1).then(|| kc.contexts[0].name.clone()));
    let Some(ext) = kc
        .contexts
        .iter()
        .find(|c| Some(&c.name) == ctx_name.as_ref())
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.extensions.as_ref())
        .and_then(|e| e.iter().find(|e| e.name == keys::IAM_GRANT))
    else {
        return Ok(None);
    };
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match ext.extension["secret"]
        .as_str()
        .and_then(|s| s.split_once('/'))
    {
        Some((ns, name)) if valid(ns) && valid(name) => Ok(Some((ns.into(), name.into()))),
        _ => Err(format!(
            "the context's {} extension does not name a Secret as <namespace>/<name>",
            keys::IAM_GRANT
        )),
    }
}

/// What rotation by pull may not change (docs/binding-flow.md "Rotation by pull"): where the
/// credential is sent and how it authenticates. Only the token (and its expiry) may move.
/// The first part `next` changes of `current`, named for a condition; `None` when only the
/// credential itself differs.
pub fn endpoint_change(current: &Kubeconfig, next: &Kubeconfig) -> Option<&'static str> {
    let ((c_cluster, c_user), (n_cluster, n_user)) = (self::current(current), self::current(next));
    let ca = |c: Option<&kube::config::Cluster>| {
        c.map(|c| {
            (
                c.certificate_authority_data.clone(),
                c.certificate_authority.clone(),
            )
        })
    };
    let auth = |u: Option<&kube::config::AuthInfo>| match u {
        Some(u) if u.token.is_some() || u.token_file.is_some() => "token",
        Some(u) if u.client_certificate_data.is_some() || u.client_certificate.is_some() => {
            "client certificate"
        }
        Some(u) if u.username.is_some() => "basic",
        Some(u) if u.exec.is_some() || u.auth_provider.is_some() => "plugin",
        _ => "none",
    };
    if c_cluster.and_then(|c| c.server.as_deref()) != n_cluster.and_then(|c| c.server.as_deref()) {
        Some("server")
    } else if ca(c_cluster) != ca(n_cluster) {
        Some("certificate authority")
    } else if c_cluster.and_then(|c| c.tls_server_name.as_deref())
        != n_cluster.and_then(|c| c.tls_server_name.as_deref())
    {
        Some("TLS server name")
    } else if c_cluster.and_then(|c| c.proxy_url.as_deref())
        != n_cluster.and_then(|c| c.proxy_url.as_deref())
    {
        Some("proxy")
    } else if auth(c_user) != auth(n_user) {
        Some("authentication method")
    } else if c_cluster.map(|c| c.insecure_skip_tls_verify)
        != n_cluster.map(|c| c.insecure_skip_tls_verify)
    {
        Some("TLS verification")
    } else if c_user.map(|u| {
        (
            &u.impersonate,
            &u.impersonate_groups,
            &u.impersonate_uid,
            &u.impersonate_user_extra,
        )
    }) != n_user.map(|u| {
        (
            &u.impersonate,
            &u.impersonate_groups,
            &u.impersonate_uid,
            &u.impersonate_user_extra,
        )
    }) {
        Some("impersonation")
    } else {
        None
    }
}

pub(super) fn current(
    kc: &Kubeconfig,
) -> (
    Option<&kube::config::Cluster>,
    Option<&kube::config::AuthInfo>,
) {
    let ctx_name = kc
        .current_context
        .clone()
        .or_else(|| (kc.contexts.len() == 1).then(|| kc.contexts[0].name.clone()));
    let ctx = kc
        .contexts
        .iter()
        .find(|c| Some(&c.name) == ctx_name.as_ref())
        .and_then(|c| c.context.as_ref());
    let cluster = ctx.and_then(|ctx| {
        kc.clusters
            .iter()
            .find(|c| c.name == ctx.cluster)
            .and_then(|c| c.cluster.as_ref())
    });
    let user = ctx.and_then(|ctx| ctx.user.as_ref()).and_then(|u| {
        kc.auth_infos
            .iter()
            .find(|a| &a.name == u)
            .and_then(|a| a.auth_info.as_ref())
    });
    (cluster, user)
}

/// Why no client could be built from a validated kubeconfig; the text is scrubbed where it is printed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Config(#[source] kube::config::KubeconfigError),
    #[error("{0}")]
    Client(#[source] kube::Error),
}

/// Build a counted client for the provider with bounded timeouts (an unreachable provider must
/// not hang the pass): `timeout` is the pass's `--request-timeout`.
pub async fn provider_client(
    pk: &ProviderKubeconfig,
    counter: Arc<RequestCounter>,
    timeout: Duration,
) -> Result<Client, ClientError> {
    let mut config =
        Config::from_custom_kubeconfig(pk.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(ClientError::Config)?;
    if let Some(ip) = pk.pinned {
        pin_to(&mut config, ip);
    }
    counted_client(with_timeouts(config, timeout), counter).map_err(ClientError::Client)
}

pub use super::address::{check_server_address, is_forbidden_address, pin_to};

mod checks;
use checks::{check_fields, check_self_contained, scrub_yaml_error};

#[cfg(test)]
mod tests;
