//! Rotation by pull (docs/binding-flow.md "Rotation by pull"): a Connection Secret that
//! `kbind bind` annotated with `core.kbind.io/grant-secret: <namespace>/<name>` names the Grant's
//! issued Secret on the provider. Before using the credential, `kbind schema` GETs that Secret
//! with it (the issued identity may `get` exactly that Secret) and, when the issuer re-issued
//! (its kubeconfig differs from the local one), writes the new kubeconfig (and
//! `iam.kbind.io/expires-at`) into the local Secret, then uses it for the rest of the pass.
//!
//! The provider is not trusted with more than it could already do: the pulled kubeconfig must
//! pass the same policy as any Connection Secret ([`super::kubeconfig`]) before it is written, so
//! a provider cannot push a kubeconfig kbind would refuse (docs/hostile-inputs.md), and it must
//! keep the server, certificate authority, TLS server name and authentication method: a
//! rotation brings a new token, never a new destination. Only Secrets carrying the annotation
//! are ever written, and only their kubeconfig key and expiry annotation.

use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{CredentialError, CredentialPolicy};
use crate::api::core::SecretKeyRef;
use crate::api::keys;
use crate::pass::StatusCode;
use crate::secrets::SecretError;

/// Why the pull did not bring the local Secret in step; the local credential stays in use.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RefreshError {
    #[error(
        "annotation {} on Secret {secret} is {value:?}, not <namespace>/<name>",
        keys::GRANT_SECRET
    )]
    BadAnnotation { secret: String, value: String },
    #[error("reading the Grant's Secret {from} on the provider: {source}")]
    Unreadable {
        from: String,
        #[source]
        source: Arc<SecretError>,
    },
    #[error("the Grant's Secret {from} on the provider has no key {key:?}")]
    KeyMissing { from: String, key: String },
    #[error(
        "the kubeconfig in the Grant's Secret {from} on the provider is refused, the current one is kept: {source}"
    )]
    Refused {
        from: String,
        #[source]
        source: CredentialError,
    },
    /// Not a rotation: the pulled kubeconfig points elsewhere or authenticates otherwise.
    #[error(
        "the kubeconfig in the Grant's Secret {from} on the provider changes the {what}; rotation by pull accepts only a new token for the same server, certificate authority and TLS server name, so the current one is kept (to move to another endpoint, run kbind bind again with the new kubeconfig)"
    )]
    EndpointChanged { from: String, what: &'static str },
    #[error("writing the pulled kubeconfig into Secret {secret}: {source}")]
    WriteFailed {
        secret: String,
        #[source]
        source: Arc<kube::Error>,
    },
}

impl RefreshError {
    /// The reason of the Connection's `CredentialRotation=False` condition.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadAnnotation { .. } => "InvalidAnnotation",
            Self::Unreadable { source, .. } => match source.kube_source() {
                Some(e) if e.is_unauthorized() => "CredentialRejected",
                Some(e) if e.is_forbidden() => "GrantSecretForbidden",
                None => "GrantSecretNotFound",
                Some(_) => "GrantSecretUnreadable",
            },
            Self::KeyMissing { .. } => "KeyNotFound",
            Self::Refused { source, .. } => source.reason(),
            Self::EndpointChanged { .. } => "EndpointChanged",
            Self::WriteFailed { .. } => "WriteFailed",
        }
    }
}

/// How a pull went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refreshed {
    /// The local kubeconfig already is the provider's.
    Current,
    /// The provider's kubeconfig was written into the local Secret.
    Updated,
    /// A dry run: it would have been written.
    WouldUpdate,
}

/// The Grant's Secret `(namespace, name)` a local Secret pulls from; `None` when it carries no
/// annotation (such a Secret is never written).
pub fn grant_secret(local: &Secret) -> Option<Result<(String, String), RefreshError>> {
    let value = local
        .metadata
        .annotations
        .as_ref()?
        .get(keys::GRANT_SECRET)?;
    Some(match value.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => {
            Ok((ns.to_string(), n.to_string()))
        }
        _ => Err(RefreshError::BadAnnotation {
            secret: format!(
                "{}/{}",
                local.metadata.namespace.as_deref().unwrap_or_default(),
                local.metadata.name.as_deref().unwrap_or_default()
            ),
            value: value.clone(),
        }),
    })
}

/// What to write into the local Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pull {
    pub kubeconfig: Vec<u8>,
    /// The provider Secret's `iam.kbind.io/expires-at`, when it has one.
    pub expires_at: Option<String>,
}

/// Pure: the write that brings `local` in step with `remote` (the Grant's Secret), or `None`
/// when it already is (same kubeconfig, and the same expiry where the provider states one).
pub fn plan(
    local: &Secret,
    remote: &Secret,
    key: &str,
    from: &str,
) -> Result<Option<Pull>, RefreshError> {
    let theirs =
        crate::secrets::key_bytes(remote, key).ok_or_else(|| RefreshError::KeyMissing {
            from: from.to_string(),
            key: key.to_string(),
        })?;
    let expiry = |s: &Secret| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(keys::IAM_EXPIRES_AT))
            .cloned()
    };
    let expires_at = expiry(remote);
    let same_data = crate::secrets::key_bytes(local, key).as_deref() == Some(&theirs[..]);
    let same_expiry = expires_at.is_none() || expires_at == expiry(local);
    Ok((!(same_data && same_expiry)).then_some(Pull {
        kubeconfig: theirs,
        expires_at,
    }))
}

/// The local Secret as it will be after `pull` is written (for validation, and for the rest of
/// the pass).
pub fn pulled(local: &Secret, key: &str, pull: &Pull) -> Secret {
    let mut s = local.clone();
    s.data
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), ByteString(pull.kubeconfig.clone()));
    if let Some(sd) = s.string_data.as_mut() {
        sd.remove(key);
    }
    if let Some(e) = &pull.expires_at {
        s.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(keys::IAM_EXPIRES_AT.to_string(), e.clone());
    }
    s
}

/// Which local Secret pulls from which Grant's Secret, under which policy.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The Connection's Secret reference (the local Secret and its kubeconfig key).
    pub secret: &'a SecretKeyRef,
    /// The Grant's Secret on the provider (from [`grant_secret`]).
    pub from: &'a (String, String),
    pub policy: &'a CredentialPolicy,
}

/// Pull the Grant's Secret `from` on the provider with the current credential (`provider`) and
/// bring the local Secret `r` in step. Returns the Secret to use for the rest of the pass (the
/// pulled one once written; the local one otherwise) and how the pull went. `write` announces
/// the write and says whether to make it (false in a dry run).
pub async fn refresh(
    consumer: &Client,
    provider: &Client,
    local: &Secret,
    target: &Target<'_>,
    manager: &str,
    write: impl FnOnce(&str) -> bool,
) -> (Secret, Result<Refreshed, RefreshError>) {
    let from = format!("{}/{}", target.from.0, target.from.1);
    let (pull, next) = match checked_pull(provider, local, target, &from).await {
        Ok(Some(p)) => p,
        Ok(None) => return (local.clone(), Ok(Refreshed::Current)),
        Err(e) => return (local.clone(), Err(e)),
    };
    if !write(&from) {
        return (local.clone(), Ok(Refreshed::WouldUpdate));
    }
    match write_pulled(consumer, local, target.secret, &pull, manager).await {
        Ok(()) => (next, Ok(Refreshed::Updated)),
        Err(e) => (local.clone(), Err(e)),
    }
}

/// Read the provider's Secret and decide the pull: `None` when the local kubeconfig already is
/// the provider's, else the pull and the local Secret as it would be, checked by the rules of
/// any Connection Secret and for the same endpoint.
async fn checked_pull(
    provider: &Client,
    local: &Secret,
    target: &Target<'_>,
    from_s: &str,
) -> Result<Option<(Pull, Secret)>, RefreshError> {
    let Target {
        secret: r,
        from,
        policy,
    } = *target;
    let remote = crate::secrets::read(provider, &from.0, &from.1)
        .await
        .map_err(|e| RefreshError::Unreadable {
            from: from_s.to_string(),
            source: Arc::new(e),
        })?;
    let Some(pull) = plan(local, &remote, &r.key, from_s)? else {
        return Ok(None);
    };
    let next = pulled(local, &r.key, &pull);
    // The same rules as any Connection Secret, before anything is written.
    let theirs = super::kubeconfig(Some(&next), r, policy)
        .await
        .map_err(|source| RefreshError::Refused {
            from: from_s.to_string(),
            source,
        })?;
    // Only a new token for the same endpoint: a provider cannot redirect the consumer.
    // The local kubeconfig just authenticated the read above, so it parses; parsed only (its
    // server was checked when the pass built the provider client), no second DNS lookup. Were
    // it not to parse, nothing is pulled (never a change nobody compared).
    let change = match super::kubeconfig::kubeconfig_from_secret(
        Some(local),
        &r.namespace,
        &r.name,
        &r.key,
        policy,
    ) {
        Ok(ours) => super::kubeconfig::endpoint_change(&ours.kubeconfig, &theirs.kubeconfig),
        Err(_) => Some("the current kubeconfig, which does not parse"),
    };
    if let Some(what) = change {
        return Err(RefreshError::EndpointChanged {
            from: from_s.to_string(),
            what,
        });
    }
    Ok(Some((pull, next)))
}

/// Write the pulled kubeconfig into the local Secret, preconditioned on what was read: a
/// Secret changed meanwhile is pulled again next run.
async fn write_pulled(
    consumer: &Client,
    local: &Secret,
    r: &SecretKeyRef,
    pull: &Pull,
    manager: &str,
) -> Result<(), RefreshError> {
    let mut meta = json!({"name": r.name, "namespace": r.namespace});
    if let Some(rv) = &local.metadata.resource_version {
        meta["resourceVersion"] = json!(rv);
    }
    if let Some(e) = &pull.expires_at {
        meta["annotations"] = json!({ keys::IAM_EXPIRES_AT: e });
    }
    let mut data = serde_json::Map::new();
    data.insert(r.key.clone(), json!(ByteString(pull.kubeconfig.clone())));
    let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data});
    Api::<Secret>::namespaced(consumer.clone(), &r.namespace)
        .patch(
            &r.name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(|e| RefreshError::WriteFailed {
            secret: format!("{}/{}", r.namespace, r.name),
            source: Arc::new(e),
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn secret(data: &str, ann: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.namespace = Some("kbind-system".into());
        s.metadata.name = Some("acme".into());
        s.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.data = Some(BTreeMap::from([(
            "kubeconfig".to_string(),
            ByteString(data.as_bytes().to_vec()),
        )]));
        s
    }

    #[test]
    fn only_annotated_secrets_name_a_grant_secret() {
        assert!(grant_secret(&secret("a", &[])).is_none());
        assert_eq!(
            grant_secret(&secret("a", &[(keys::GRANT_SECRET, "kbind-grants/acme")]))
                .unwrap()
                .unwrap(),
            ("kbind-grants".into(), "acme".into())
        );
        for bad in ["acme", "/acme", "ns/", "a/b/c"] {
            let e = grant_secret(&secret("a", &[(keys::GRANT_SECRET, bad)]))
                .unwrap()
                .unwrap_err();
            assert_eq!(e.reason(), "InvalidAnnotation", "{bad}");
            assert!(e.to_string().contains("kbind-system/acme"), "{e}");
        }
    }

    #[test]
    fn plans_a_write_only_when_the_provider_reissued() {
        let exp = |v: &str| (keys::IAM_EXPIRES_AT, v.to_string());
        // ((local data, expiry), (remote data, expiry), the write expected)
        type Side<'a> = (&'a str, Option<&'a str>);
        type Case<'a> = (Side<'a>, Side<'a>, Option<Side<'a>>);
        let cases: Vec<Case> = vec![
            (("old", None), ("old", None), None),
            (("old", Some("t1")), ("old", Some("t1")), None),
            (
                ("old", Some("t1")),
                ("new", Some("t2")),
                Some(("new", Some("t2"))),
            ),
            (("old", None), ("new", None), Some(("new", None))),
            // Same token, the issuer stated an expiry the local Secret lacks: copy it.
            (
                ("old", None),
                ("old", Some("t1")),
                Some(("old", Some("t1"))),
            ),
            // The provider stopped stating an expiry: nothing to pull.
            (("old", Some("t1")), ("old", None), None),
        ];
        for ((ld, le), (rd, re), want) in cases {
            let la: Vec<(&str, String)> = le.map(exp).into_iter().collect();
            let ra: Vec<(&str, String)> = re.map(exp).into_iter().collect();
            let la: Vec<(&str, &str)> = la.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let ra: Vec<(&str, &str)> = ra.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let got = plan(&secret(ld, &la), &secret(rd, &ra), "kubeconfig", "g/s").unwrap();
            let want = want.map(|(d, e)| Pull {
                kubeconfig: d.as_bytes().to_vec(),
                expires_at: e.map(str::to_string),
            });
            assert_eq!(got, want, "{ld} {le:?} <- {rd} {re:?}");
        }
        let mut no_key = secret("x", &[]);
        no_key.data = None;
        let e = plan(&secret("a", &[]), &no_key, "kubeconfig", "g/s").unwrap_err();
        assert_eq!(e.reason(), "KeyNotFound");
    }

    #[test]
    fn the_pulled_secret_carries_the_new_data_and_expiry_only() {
        let local = secret(
            "old",
            &[(keys::GRANT_SECRET, "g/s"), (keys::IAM_GRANT, "acme")],
        );
        let pull = Pull {
            kubeconfig: b"new".to_vec(),
            expires_at: Some("t2".into()),
        };
        let next = pulled(&local, "kubeconfig", &pull);
        assert_eq!(
            crate::secrets::key_bytes(&next, "kubeconfig").as_deref(),
            Some(&b"new"[..])
        );
        let ann = next.metadata.annotations.unwrap();
        assert_eq!(
            ann.get(keys::IAM_EXPIRES_AT).map(String::as_str),
            Some("t2")
        );
        assert_eq!(ann.get(keys::GRANT_SECRET).map(String::as_str), Some("g/s"));
        assert_eq!(ann.get(keys::IAM_GRANT).map(String::as_str), Some("acme"));
    }
}
