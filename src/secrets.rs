//! Reading a credential out of a Secret, the one way every pass does it: a GET of the Secret,
//! then one key's bytes. What failed stays typed: a forbidden read (an RBAC gap, to be reported
//! as such) is kept apart from a missing Secret and from any other failure.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::pass::StatusCode;

/// Why a Secret could not be read. The API error stays typed; its text is scrubbed where it is printed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("Secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// The job's identity may not read it (403): an RBAC problem, not a bad credential.
    #[error("reading Secret {namespace}/{name} failed: {source}")]
    Forbidden {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading Secret {namespace}/{name} failed: {source}")]
    Unreadable {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl SecretError {
    /// The API error behind a failed read (none for a missing Secret).
    pub fn kube_source(&self) -> Option<&kube::Error> {
        match self {
            Self::NotFound { .. } => None,
            Self::Forbidden { source, .. } | Self::Unreadable { source, .. } => Some(source),
        }
    }

    pub fn is_forbidden(&self) -> bool {
        matches!(self, Self::Forbidden { .. })
    }
}

/// GET Secret `namespace/name`; `Ok(None)` when it does not exist.
pub async fn read_opt(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Secret>, SecretError> {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| {
            let (namespace, name) = (namespace.to_string(), name.to_string());
            if source.is_forbidden() {
                SecretError::Forbidden {
                    namespace,
                    name,
                    source,
                }
            } else {
                SecretError::Unreadable {
                    namespace,
                    name,
                    source,
                }
            }
        })
}

/// GET Secret `namespace/name`; a missing Secret is [`SecretError::NotFound`].
pub async fn read(client: &Client, namespace: &str, name: &str) -> Result<Secret, SecretError> {
    read_opt(client, namespace, name)
        .await?
        .ok_or_else(|| SecretError::NotFound {
            namespace: namespace.into(),
            name: name.into(),
        })
}

/// The bytes under `key`: `data` first, then `stringData` (set only on objects not yet written).
pub fn key_bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
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
}

#[cfg(test)]
mod tests {
    use super::key_bytes;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use std::collections::BTreeMap;

    #[test]
    fn data_wins_over_string_data() {
        let s = Secret {
            data: Some(BTreeMap::from([(
                "a".into(),
                ByteString(b"from data".to_vec()),
            )])),
            string_data: Some(BTreeMap::from([
                ("a".into(), "from stringData".into()),
                ("b".into(), "only here".into()),
            ])),
            ..Default::default()
        };
        assert_eq!(key_bytes(&s, "a").as_deref(), Some(&b"from data"[..]));
        assert_eq!(key_bytes(&s, "b").as_deref(), Some(&b"only here"[..]));
        assert_eq!(key_bytes(&s, "c"), None);
    }
}
