//! The pure part of `kbind issue`: from a Grant, the catalog, and what is issued for it now, to
//! the writes it needs (docs/issue.md). No I/O; table tests below.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::catalog::{CollectionSpec, ExportSpec};
use crate::api::iam::GrantSpec;
use crate::api::keys::HEARTBEAT_LEASE_PREFIX;

use super::render::{self, Desired, Kind, Resolved, ResolvedApi};

/// Ready=False reasons of a Grant.
pub const EXPORT_NOT_FOUND: &str = "ExportNotFound";
pub const COLLECTION_NOT_FOUND: &str = "CollectionNotFound";
pub const API_NOT_EXPORTED: &str = "APINotExported";
pub const INVALID_TOKEN_TTL: &str = "InvalidTokenTTL";
pub const PERMISSIONS_NOT_GRANTABLE: &str = "PermissionsNotGrantable";
pub const ISSUE_FAILED: &str = "IssueFailed";
pub const ISSUED: &str = "Issued";

/// TokenRequest's floor and the Grant's ceiling (the CRD enforces both; older objects are
/// clamped here).
pub const MIN_TTL: Duration = Duration::from_secs(600);
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The provider's catalog as the pass saw it.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub exports: BTreeMap<String, ExportSpec>,
    pub collections: BTreeMap<String, CollectionSpec>,
    /// Exported CRDs (label `core.kbind.io/exported: "true"`) by `<plural>.<group>`.
    pub exported: BTreeMap<String, ResolvedApi>,
}

/// Why a Grant issues nothing this run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}

/// The Exports a Grant names (one, or a Collection's), resolved to exported CRDs.
pub fn resolve(spec: &GrantSpec, catalog: &Catalog) -> Result<Resolved, Blocked> {
    let names: Vec<String> = match (&spec.export, &spec.collection) {
        (Some(e), _) => vec![e.clone()],
        (None, Some(c)) => match catalog.collections.get(c) {
            Some(coll) => coll.exports.iter().map(|e| e.name.clone()).collect(),
            None => {
                return Err(Blocked {
                    reason: COLLECTION_NOT_FOUND,
                    message: format!("Collection {c} does not exist"),
                });
            }
        },
        (None, None) => {
            return Err(Blocked {
                reason: EXPORT_NOT_FOUND,
                message: "the Grant names neither an export nor a collection".into(),
            });
        }
    };
    let mut resolved = Resolved::default();
    let mut missing = Vec::new();
    for name in &names {
        let Some(export) = catalog.exports.get(name) else {
            return Err(Blocked {
                reason: EXPORT_NOT_FOUND,
                message: format!("Export {name} does not exist"),
            });
        };
        for api in &export.apis {
            match catalog.exported.get(&api.name) {
                Some(r) => resolved.apis.push(r.clone()),
                None => missing.push(format!("{} (Export {name})", api.name)),
            }
        }
        for p in &export.permissions {
            if !resolved.permissions.contains(p) {
                resolved.permissions.push(p.clone());
            }
        }
    }
    if !missing.is_empty() {
        return Err(Blocked {
            reason: API_NOT_EXPORTED,
            message: format!(
                "not an exported CRD on this cluster (label core.kbind.io/exported=\"true\"): {}",
                missing.join(", ")
            ),
        });
    }
    resolved.apis.sort();
    resolved.apis.dedup();
    resolved.exports = names;
    resolved.exports.sort();
    resolved.exports.dedup();
    Ok(resolved)
}

/// The Grant's token lifetime, clamped to [`MIN_TTL`]..[`MAX_TTL`].
pub fn token_ttl(spec: &GrantSpec) -> Result<Duration, Blocked> {
    crate::pass::duration::parse(&spec.token_ttl)
        .map(|d| d.clamp(MIN_TTL, MAX_TTL))
        .map_err(|e| Blocked {
            reason: INVALID_TOKEN_TTL,
            message: format!("tokenTTL {:?}: {e}", spec.token_ttl),
        })
}

/// The issued Secret as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretObs {
    /// `iam.kbind.io/expires-at`, parsed.
    pub expires_at: Option<Timestamp>,
    /// `iam.kbind.io/service-account-uid`.
    pub sa_uid: String,
    /// The token in its kubeconfig (never logged).
    pub token: Option<String>,
    /// The kubeconfig text.
    pub kubeconfig: Option<String>,
}

/// What is issued for one Grant now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Issued {
    /// Present objects and the hash annotation each carries (empty when it has none).
    pub hashes: BTreeMap<Kind, String>,
    pub sa_uid: Option<String>,
    pub secret: Option<SecretObs>,
    /// Heartbeat Leases labelled with this Grant: (creation time, name).
    pub leases: Vec<(Timestamp, String)>,
}

/// Flags and clock.
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub server: String,
    pub ca_pem: Vec<u8>,
    pub reissue_before: Option<Duration>,
    pub now: Timestamp,
}

/// Keep the token, or issue a new one (and why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    Keep { expires_at: Timestamp },
    Issue { why: String },
}

/// Where the consumer-cluster pin stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// Pinned earlier (from status) or now (from a heartbeat Lease).
    Pinned { uid: String, new: bool },
    /// No heartbeat Lease of this Grant yet.
    Waiting,
    /// Its only candidates are pinned by other Grants.
    Taken { uid: String, by: String },
}

impl Pin {
    pub fn uid(&self) -> Option<&str> {
        match self {
            Pin::Pinned { uid, .. } => Some(uid),
            _ => None,
        }
    }
}

/// What one Grant needs this run.
#[derive(Clone, Debug, PartialEq)]
pub struct GrantPlan {
    pub resolved: Resolved,
    pub ttl: Duration,
    /// Objects whose content differs from what is issued (or missing), in write order.
    pub writes: Vec<Desired>,
    pub token: Token,
    pub pin: Pin,
}

/// A cluster UID as the heartbeat Lease name carries it: a label value with no character that
/// could leave a CEL string literal.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 63
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && uid.as_bytes()[0].is_ascii_alphanumeric()
        && uid.as_bytes()[uid.len() - 1].is_ascii_alphanumeric()
}

/// The pin: kept once recorded; else the oldest heartbeat Lease of this Grant naming a UID no
/// other Grant holds (trust on first use, docs/issue.md "Confinement").
pub fn pin(
    recorded: Option<&str>,
    leases: &[(Timestamp, String)],
    others: &BTreeMap<String, String>,
) -> Pin {
    if let Some(uid) = recorded.filter(|u| valid_uid(u)) {
        return Pin::Pinned {
            uid: uid.to_string(),
            new: false,
        };
    }
    let mut leases = leases.to_vec();
    leases.sort();
    let mut taken = None;
    for (_, name) in &leases {
        let Some(uid) = name
            .strip_prefix(HEARTBEAT_LEASE_PREFIX)
            .filter(|u| valid_uid(u))
        else {
            continue;
        };
        match others.get(uid) {
            Some(by) => {
                taken.get_or_insert(Pin::Taken {
                    uid: uid.to_string(),
                    by: by.clone(),
                });
            }
            None => {
                return Pin::Pinned {
                    uid: uid.to_string(),
                    new: true,
                };
            }
        }
    }
    taken.unwrap_or(Pin::Waiting)
}

/// Whether the token in the Secret can stay, or a new one must be issued.
pub fn token(issued: &Issued, grant: &str, ttl: Duration, cfg: &Config) -> Token {
    let issue = |why: &str| Token::Issue { why: why.into() };
    let Some(s) = &issued.secret else {
        return issue("no kubeconfig Secret yet");
    };
    match &issued.sa_uid {
        Some(uid) if *uid == s.sa_uid => {}
        _ => return issue("the ServiceAccount is new or was re-created"),
    }
    let (Some(token), Some(expires_at), Some(kc)) = (&s.token, s.expires_at, &s.kubeconfig) else {
        return issue("the Secret holds no token or expiry");
    };
    let want = render::kubeconfig(&cfg.server, &cfg.ca_pem, token, &cfg.namespace, grant);
    if *kc != want {
        return issue("the server URL, CA or namespace changed");
    }
    let before = cfg.reissue_before.unwrap_or(ttl / 3);
    let left = expires_at.as_second().saturating_sub(cfg.now.as_second());
    if left <= 0 || (left as u64) <= before.as_secs() {
        return Token::Issue {
            why: format!(
                "{left}s left, re-issued with less than {}s",
                before.as_secs()
            ),
        };
    }
    Token::Keep { expires_at }
}

/// Plan one live Grant. `Err`: it issues nothing this run (what is issued stays; its token is
/// not renewed).
pub fn plan_grant(
    grant: &str,
    spec: &GrantSpec,
    recorded_pin: Option<&str>,
    catalog: &Catalog,
    issued: &Issued,
    pinned_by_others: &BTreeMap<String, String>,
    cfg: &Config,
) -> Result<GrantPlan, Blocked> {
    let resolved = resolve(spec, catalog)?;
    let ttl = token_ttl(spec)?;
    let pin = pin(recorded_pin, &issued.leases, pinned_by_others);
    let writes = render::objects(&resolved, &cfg.namespace, grant, pin.uid())
        .into_iter()
        .filter(|d| issued.hashes.get(&d.kind) != Some(&d.hash))
        .collect();
    let token = token(issued, grant, ttl, cfg);
    Ok(GrantPlan {
        resolved,
        ttl,
        writes,
        token,
        pin,
    })
}

/// What revoking a Grant deletes: every issued kind present, ServiceAccount first (its tokens
/// stop working at once), the policy last (the identity is confined until it is gone).
pub fn revoke(issued: &Issued) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| issued.hashes.contains_key(k))
        .collect();
    kinds.sort_by_key(|k| match k {
        Kind::ServiceAccount => 0,
        Kind::Policy | Kind::PolicyBinding => 2,
        _ => 1,
    });
    kinds
}

#[cfg(test)]
mod tests;
