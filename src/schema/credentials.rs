//! Provider credentials: the Connection's Secret holds a kubeconfig that must work inside a
//! CronJob pod, so it must be self-contained (embedded CA, certificate and token; no exec
//! plugin, auth provider or file path). Every run builds its client from the Secret's current
//! data, so a rotated credential is used on the next run without any restart.

use std::time::Duration;

use sha2::Digest;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use std::sync::Arc;

use crate::pass::client::{RequestCounter, counted_client, with_timeouts};
use crate::scrub::scrub;

/// Why a Connection's Secret cannot be used; each maps to a `SecretValid=False` reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    #[error("reading Secret {namespace}/{name} failed: {message}")]
    SecretUnreadable {
        namespace: String,
        name: String,
        message: String,
    },
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
    #[error("kubeconfig in Secret {namespace}/{name} is not self-contained: {what}")]
    NotSelfContained {
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
            Self::InvalidKubeconfig { .. } => "InvalidKubeconfig",
            Self::NotSelfContained { .. } => "NotSelfContained",
        }
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
}

/// Largest kubeconfig accepted (a kubeconfig is a few KiB; a huge blob is a mistake or an attack).
const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

/// Extract and validate the kubeconfig from the Secret (`None`: Secret missing).
pub fn kubeconfig_from_secret(
    secret: Option<&Secret>,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<ProviderKubeconfig, CredentialError> {
    let (ns, n, k) = (namespace.to_string(), name.to_string(), key.to_string());
    let secret = secret.ok_or_else(|| CredentialError::SecretNotFound {
        namespace: ns.clone(),
        name: n.clone(),
    })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| CredentialError::KeyNotFound {
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
    Ok(ProviderKubeconfig {
        kubeconfig,
        fingerprint,
        default_namespace,
    })
}

fn scrub_yaml_error(msg: &str) -> String {
    // Keep the first line (it says what and where), drop any quoted snippet.
    let first = msg.lines().next().unwrap_or("parse error");
    scrub(first.split(" at line").next().unwrap_or(first))
}

/// Checks the current context's cluster and user; returns the context namespace.
fn check_self_contained(kc: &Kubeconfig) -> Result<String, String> {
    let ctx_name = kc
        .current_context
        .clone()
        .or_else(|| (kc.contexts.len() == 1).then(|| kc.contexts[0].name.clone()))
        .ok_or("no current-context")?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("current-context {ctx_name:?} is not defined"))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| format!("cluster {:?} is not defined", ctx.cluster))?;
    match cluster.server.as_deref() {
        Some(s) if s.starts_with("https://") || s.starts_with("http://") => {}
        Some(_) => return Err("cluster.server is not an http(s) URL".into()),
        None => return Err("cluster.server is missing".into()),
    }
    if cluster.certificate_authority.is_some() {
        return Err(
            "cluster.certificate-authority is a file path; embed certificate-authority-data".into(),
        );
    }
    if let Some(user) = &ctx.user {
        let auth = kc
            .auth_infos
            .iter()
            .find(|a| &a.name == user)
            .and_then(|a| a.auth_info.as_ref())
            .ok_or_else(|| format!("user {user:?} is not defined"))?;
        let fields = [
            (auth.exec.is_some(), "user.exec runs a credential plugin"),
            (
                auth.auth_provider.is_some(),
                "user.auth-provider needs an interactive login",
            ),
            (
                auth.token_file.is_some(),
                "user.tokenFile is a file path; embed token",
            ),
            (
                auth.client_certificate.is_some(),
                "user.client-certificate is a file path; embed client-certificate-data",
            ),
            (
                auth.client_key.is_some(),
                "user.client-key is a file path; embed client-key-data",
            ),
        ];
        if let Some((_, what)) = fields.iter().find(|(bad, _)| *bad) {
            return Err((*what).to_string());
        }
    }
    Ok(ctx
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into()))
}

/// Build a counted client for the provider with bounded timeouts (an unreachable provider must
/// not hang the pass): `timeout` is the pass's `--request-timeout`.
pub async fn provider_client(
    pk: &ProviderKubeconfig,
    counter: Arc<RequestCounter>,
    timeout: Duration,
) -> Result<Client, String> {
    let config =
        Config::from_custom_kubeconfig(pk.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| scrub(&e.to_string()))?;
    counted_client(with_timeouts(config, timeout), counter).map_err(|e| scrub(&e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(key: &str, value: &str) -> Secret {
        Secret {
            data: Some(BTreeMap::from([(
                key.to_string(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    fn kubeconfig(cluster_extra: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: p\n  cluster:\n    server: https://127.0.0.1:6443\n{cluster_extra}contexts:\n- name: c\n  context:\n    cluster: p\n    user: u\n    namespace: tenant\nusers:\n- name: u\n  user:\n{user}"
        )
    }

    #[test]
    fn table() {
        let ok_user = "    token: abc\n";
        let cases: Vec<(&str, Option<Secret>, Result<&str, &str>)> = vec![
            ("missing secret", None, Err("SecretNotFound")),
            ("wrong key", Some(secret("config", "x")), Err("KeyNotFound")),
            (
                "not yaml",
                Some(secret("kubeconfig", "::: [")),
                Err("InvalidKubeconfig"),
            ),
            (
                "binary",
                Some(Secret {
                    data: Some(BTreeMap::from([(
                        "kubeconfig".into(),
                        ByteString(vec![0xff, 0xfe, 0]),
                    )])),
                    ..Default::default()
                }),
                Err("InvalidKubeconfig"),
            ),
            (
                "huge",
                Some(secret("kubeconfig", &"a".repeat(300_000))),
                Err("InvalidKubeconfig"),
            ),
            (
                "exec",
                Some(secret(
                    "kubeconfig",
                    &kubeconfig(
                        "",
                        "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: gcloud\n",
                    ),
                )),
                Err("user.exec"),
            ),
            (
                "ca path",
                Some(secret(
                    "kubeconfig",
                    &kubeconfig("    certificate-authority: /etc/ca.crt\n", ok_user),
                )),
                Err("certificate-authority is a file path"),
            ),
            (
                "cert path",
                Some(secret(
                    "kubeconfig",
                    &kubeconfig("", "    client-certificate: /home/me/.kube/c.crt\n"),
                )),
                Err("client-certificate is a file path"),
            ),
            (
                "token file",
                Some(secret(
                    "kubeconfig",
                    &kubeconfig("", "    tokenFile: /var/run/token\n"),
                )),
                Err("tokenFile"),
            ),
            (
                "ok",
                Some(secret("kubeconfig", &kubeconfig("", ok_user))),
                Ok("tenant"),
            ),
        ];
        for (what, s, want) in cases {
            let got = kubeconfig_from_secret(s.as_ref(), "ns", "name", "kubeconfig");
            match (got, want) {
                (Ok(pk), Ok(ns)) => assert_eq!(pk.default_namespace, ns, "{what}"),
                (Err(e), Err(needle)) => assert!(
                    e.reason() == needle || e.to_string().contains(needle),
                    "{what}: {e} lacks {needle}"
                ),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn errors_never_quote_the_secret() {
        let s = secret("kubeconfig", "token: xoxb-secret-value\n  bad: [indent");
        let e = kubeconfig_from_secret(Some(&s), "ns", "n", "kubeconfig").unwrap_err();
        assert!(!e.to_string().contains("secret-value"), "{e}");
    }
}
