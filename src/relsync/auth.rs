//! Resolve a source's credential: its AgentIdentity (same namespace), the named credential, the
//! Secret key holding the token, and the credential's `allowedHosts` admitting every destination
//! the kind will send it to — `baseURL` when the source sets one, and the kind's own endpoint
//! (Slack's `--slack-api-url`) when the credential lists allowedHosts. Both are checked before
//! the Secret is read; nothing is sent anywhere until this succeeds.

use kube::{Api, Client};

use super::hosts::{self, Destination, HostError};
use crate::api::relsync::{AgentIdentity, RelationshipSource};
use crate::pass::StatusCode;

/// A token read from a Secret. Its Debug form never shows the value.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    pub fn new(s: impl Into<String>) -> Self {
        let s = s.into();
        // Redacted by value in every scrubbed text from now on, whatever echoes it.
        crate::scrub::register_secret(&s);
        Self(s)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this token replaced: an upstream may echo the
    /// credential back (a SCIM `detail`, a URL in an error), in a shape no generic scrub
    /// recognises. Done before scrubbing (so a bound never cuts the token in half), with a
    /// marker free of brackets (so the scrub still finds where a URL ends).
    pub fn redact(&self, text: &str) -> String {
        let t = self.0.trim();
        if t.is_empty() {
            return text.to_string();
        }
        text.replace(t, "REDACTED")
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token([REDACTED])")
    }
}

/// What a source may use to read its upstream.
#[derive(Debug, Clone)]
pub struct Credential {
    pub token: Token,
    /// The admitted baseURL, when the source sets one.
    pub base_url: Option<Destination>,
}

/// Why the credential could not be used; each names the object at fault.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("AgentIdentity {0:?} not found in the source's namespace")]
    IdentityNotFound(String),
    #[error("AgentIdentity {identity:?} has no credential named {credential:?}")]
    CredentialNotFound {
        identity: String,
        credential: String,
    },
    #[error("Secret {0:?} (credential secretRef) not found")]
    SecretNotFound(String),
    #[error("Secret {secret:?} has no key {key:?} (or it is empty)")]
    SecretKeyMissing { secret: String, key: String },
    #[error("{0}")]
    Host(#[from] HostError),
    /// The job's identity may not read the credential's Secret: the source's namespace has not
    /// granted it (docs/relsync.md, "RBAC").
    #[error(
        "may not read Secret {namespace}/{secret}: namespace {namespace} has no RoleBinding granting \
         relsync's ServiceAccount the ClusterRole kbind-relsync-credentials; a namespace admin \
         creates one as deploy/components/directory/relsync-credentials-example.yaml shows ({})",
        source.api_message().unwrap_or_default()
    )]
    SecretForbidden {
        namespace: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
    /// A read failed; a 403 is an RBAC problem of the job's identity, not a bad credential.
    #[error("reading {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl AuthError {
    /// The Ready condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::IdentityNotFound(_) => "AgentIdentityNotFound",
            Self::CredentialNotFound { .. } => "CredentialNotFound",
            Self::SecretNotFound(_) | Self::SecretKeyMissing { .. } => "SecretNotFound",
            Self::Host(
                HostError::NoAllowlist { .. }
                | HostError::NotAllowed { .. }
                | HostError::EndpointNotAllowed { .. }
                | HostError::Forbidden { .. },
            ) => "HostNotAllowed",
            Self::Host(HostError::BadEndpoint { .. }) => "InvalidConfig",
            Self::Host(_) => "InvalidBaseURL",
            Self::Kube { source, .. } if source.is_forbidden() => "PermissionDenied",
            Self::SecretForbidden { .. } => "PermissionDenied",
            Self::Kube { .. } => "CredentialUnreadable",
        }
    }
}

fn kube_err(what: String) -> impl FnOnce(kube::Error) -> AuthError {
    move |source| AuthError::Kube { what, source }
}

/// A failed Secret read: 403 says which grant is missing, anything else as any failed read.
fn secret_err(what: String, e: crate::secrets::SecretError) -> AuthError {
    match e {
        crate::secrets::SecretError::Forbidden {
            namespace,
            name,
            source,
        } => AuthError::SecretForbidden {
            namespace,
            secret: name,
            source,
        },
        crate::secrets::SecretError::Unreadable { source, .. } => kube_err(what)(source),
        crate::secrets::SecretError::NotFound { name, .. } => AuthError::SecretNotFound(name),
    }
}

/// Resolve the credential of `src` (namespaced; the caller checked `metadata.namespace`).
/// `endpoint` is where the kind sends the token when that is not the baseURL, with its name for
/// messages (Slack: `--slack-api-url`).
pub async fn resolve(
    client: &Client,
    ns: &str,
    src: &RelationshipSource,
    endpoint: Option<(&str, &'static str)>,
) -> Result<Credential, AuthError> {
    let auth = &src.spec.auth;
    let identity = Api::<AgentIdentity>::namespaced(client.clone(), ns)
        .get_opt(&auth.agent_identity)
        .await
        .map_err(kube_err(format!(
            "AgentIdentity {ns}/{}",
            auth.agent_identity
        )))?
        .ok_or_else(|| AuthError::IdentityNotFound(auth.agent_identity.clone()))?;
    let cred = identity
        .spec
        .credentials
        .iter()
        .find(|c| c.name == auth.credential)
        .ok_or_else(|| AuthError::CredentialNotFound {
            identity: auth.agent_identity.clone(),
            credential: auth.credential.clone(),
        })?;
    // The destination is checked before the Secret is even read.
    let base_url = match src
        .spec
        .base_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
    {
        Some(u) => Some(hosts::admit(u, &cred.name, &cred.allowed_hosts)?),
        None => None,
    };
    if let Some((url, what)) = endpoint {
        hosts::admit_endpoint(url, what, &cred.name, &cred.allowed_hosts)?;
    }
    let secret_name = &cred.secret_ref.name;
    let secret = crate::secrets::read_opt(client, ns, secret_name)
        .await
        .map_err(|e| secret_err(format!("Secret {ns}/{secret_name}"), e))?
        .ok_or_else(|| AuthError::SecretNotFound(secret_name.clone()))?;
    let token = crate::secrets::key_bytes(&secret, &cred.secret_ref.key)
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| AuthError::SecretKeyMissing {
            secret: secret_name.clone(),
            key: cred.secret_ref.key.clone(),
        })?;
    Ok(Credential {
        token: Token::new(token),
        base_url,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_debug_is_redacted() {
        let c = Credential {
            token: Token::new("xoxb-secret"),
            base_url: None,
        };
        assert!(!format!("{c:?}").contains("xoxb-secret"));
    }

    #[test]
    fn an_echoed_token_is_redacted_whatever_its_shape() {
        let t = Token::new("op-bridge-7f3a\n");
        assert_eq!(
            t.redact("HTTP 401: bearer token op-bridge-7f3a is not valid; op-bridge-7f3a"),
            "HTTP 401: bearer token REDACTED is not valid; REDACTED"
        );
        assert_eq!(Token::new("  ").redact("left alone"), "left alone");
    }
}
