//! The pure part of `kbind issue`: from a Grant, the catalog, and what is issued for it now, to
//! the writes it needs (docs/issue.md). No I/O; table tests below.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::catalog::{CollectionSpec, ExportSpec};
use crate::api::iam::GrantSpec;
use crate::api::keys::HEARTBEAT_LEASE_PREFIX;

use super::render::{self, Desired, GrantRef, Kind, Resolved, ResolvedApi, Slot};

/// Ready=False reasons of a Grant.
pub const EXPORT_NOT_FOUND: &str = "ExportNotFound";
pub const COLLECTION_NOT_FOUND: &str = "CollectionNotFound";
pub const API_NOT_EXPORTED: &str = "APINotExported";
pub const INVALID_TOKEN_TTL: &str = "InvalidTokenTTL";
pub const PERMISSIONS_NOT_GRANTABLE: &str = "PermissionsNotGrantable";
pub const NAMESPACES_REQUIRED: &str = "NamespacesRequired";
pub const NAMESPACE_TAKEN: &str = "NamespaceTaken";
pub const NAMESPACE_RESERVED: &str = "NamespaceReserved";
pub const CLUSTER_SCOPED_API_TAKEN: &str = "ClusterScopedAPITaken";
pub const HANDOVER_APPROVAL_REQUIRED: &str = "HandoverApprovalRequired";
pub const ISSUE_FAILED: &str = "IssueFailed";
pub const ISSUED: &str = "Issued";
/// The `ConsumerPinned=False` reason of an issued Grant no heartbeat has named a UID for yet.
pub const WAITING_FOR_HEARTBEAT: &str = "WaitingForHeartbeat";

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
    /// Exported CRDs the client cannot decode, by name, with why: no Grant can be issued them,
    /// and the pin check cannot look through them.
    pub undecodable: BTreeMap<String, String>,
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
    resolved.namespaces = spec.namespaces.clone();
    resolved.namespaces.sort();
    resolved.namespaces.dedup();
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
    pub hashes: BTreeMap<Slot, String>,
    pub sa_uid: Option<String>,
    /// The UID of the Grant its ServiceAccount names as owner, if any.
    pub sa_owner: Option<String>,
    pub secret: Option<SecretObs>,
    /// Heartbeat Leases labelled with this Grant.
    pub leases: Vec<Heartbeat>,
}

/// A heartbeat Lease labelled with a Grant, as observed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Heartbeat {
    pub created: Timestamp,
    pub name: String,
    /// Its `core.kbind.io/consumer-cluster` label.
    pub cluster: Option<String>,
}

impl Heartbeat {
    /// The consumer cluster it names: the Grant's own Lease (`kbind-grant-<grant>`) in its
    /// label; a Lease written before 0.3 in its name (`consumer-<uid>`).
    pub fn uid(&self, grant: &str) -> Option<&str> {
        let uid = if self.name == render::object_name(grant) {
            self.cluster.as_deref()?
        } else {
            self.name.strip_prefix(HEARTBEAT_LEASE_PREFIX)?
        };
        valid_uid(uid).then_some(uid)
    }
}

/// Flags and clock.
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub server: String,
    pub ca_pem: Vec<u8>,
    pub reissue_before: Option<Duration>,
    pub now: Timestamp,
    pub confinement: super::args::Confinement,
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
    /// Provider objects this Grant does not hold already carry this UID, or the issuer could
    /// not look (`why` says which): pinned only once a person approves it on the Grant
    /// (`iam.kbind.io/approve-consumer-cluster`).
    NeedsApproval { uid: String, why: String },
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
    /// Of `spec.namespaces`, those that do not exist yet: created before their Role.
    pub create_namespaces: Vec<String>,
    /// Per-namespace RBAC of namespaces the Grant no longer names: deleted after the writes
    /// (the namespaces and what is in them stay: provider data).
    pub stale: Vec<Slot>,
    /// Heartbeat Leases older than the Grant ([`stale`]): deleted.
    pub stale_leases: Vec<String>,
    /// The ServiceAccount was issued for an earlier Grant of this name (it names that one as
    /// owner): deleted first, so whoever held that Grant's tokens holds nothing, then issued anew.
    pub stale_identity: bool,
    /// Cluster-scoped APIs this Grant holds together with other Grants (their reads are shared).
    pub shared: Vec<String>,
    pub token: Token,
    pub pin: Pin,
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

/// What every Grant's plan reads besides its own objects.
pub struct Provider<'a> {
    pub catalog: &'a Catalog,
    pub tenancy: &'a Tenancy,
    /// The provider's namespaces now.
    pub namespaces: &'a BTreeSet<String>,
    /// Per UID, the Grants whose provider objects carry it (unpinned Grants' heartbeats only).
    pub in_use: &'a InUse,
    /// Per Grant, what it would newly hold although it holds another consumer's objects, and
    /// no person approved: `(namespace or API, one such object)`.
    pub handover: &'a BTreeMap<String, Vec<(String, handover::Finding)>>,
    pub cfg: &'a Config,
}

/// Plan one live Grant. `Err`: it issues nothing this run (what is issued stays, reduced by
/// [`reduce`] when refused for read isolation; its token is not renewed).
pub fn plan_grant(
    owner: GrantRef<'_>,
    spec: &GrantSpec,
    recorded_pin: Option<&str>,
    approved: Option<&str>,
    issued: &Issued,
    pinned_by_others: &BTreeMap<String, String>,
    p: &Provider<'_>,
) -> Result<GrantPlan, Blocked> {
    let grant = owner.name;
    let (fresh, old): (Vec<Heartbeat>, Vec<Heartbeat>) = issued
        .leases
        .iter()
        .cloned()
        .partition(|h| !stale(h, owner.created));
    let resolved = resolve(spec, p.catalog)?;
    let ttl = token_ttl(spec)?;
    let shared = isolation(grant, &resolved, p.tenancy, p.cfg)?;
    if let Some((what, finding)) = p.handover.get(grant).and_then(|h| h.first()) {
        return Err(Blocked {
            reason: HANDOVER_APPROVAL_REQUIRED,
            message: handover::message(grant, what, finding, crate::api::iam::APPROVE_HANDOVER),
        });
    }
    let pin = pin(&PinInputs {
        grant,
        recorded: recorded_pin,
        leases: &fresh,
        others: pinned_by_others,
        in_use: p.in_use,
        approved,
    });
    let desired = render::objects(
        &resolved,
        &p.cfg.namespace,
        owner,
        p.cfg.confinement,
        pin.uid(),
    );
    let (writes, stale) = differ(desired, issued);
    let create_namespaces = resolved
        .namespaces
        .iter()
        .filter(|ns| !p.namespaces.contains(*ns))
        .cloned()
        .collect();
    let stale_identity = issued
        .sa_owner
        .as_deref()
        .is_some_and(|o| !owner.uid.is_empty() && o != owner.uid);
    let token = if stale_identity {
        Token::Issue {
            why: "the ServiceAccount was issued for an earlier Grant of this name".into(),
        }
    } else {
        token(issued, grant, ttl, p.cfg)
    };
    Ok(GrantPlan {
        resolved,
        ttl,
        writes,
        create_namespaces,
        stale,
        stale_leases: old.into_iter().map(|h| h.name).collect(),
        stale_identity,
        shared,
        token,
        pin,
    })
}

/// Of `desired`, what differs from what is issued (by hash), and the per-namespace RBAC issued
/// that is no longer desired, bindings before Roles (the identity loses the namespace before
/// the rules go).
fn differ(desired: Vec<Desired>, issued: &Issued) -> (Vec<Desired>, Vec<Slot>) {
    let wanted: BTreeSet<Slot> = desired.iter().map(Desired::slot).collect();
    let writes = desired
        .into_iter()
        .filter(|d| issued.hashes.get(&d.slot()) != Some(&d.hash))
        .collect();
    let mut stale: Vec<Slot> = issued
        .hashes
        .keys()
        .filter(|s| s.0.per_tenant_namespace() && !wanted.contains(*s))
        .cloned()
        .collect();
    stale.sort_by_key(|(k, ns)| (*k != Kind::TenantRoleBinding, ns.clone()));
    (writes, stale)
}

/// What revoking a Grant deletes: every issued object present, ServiceAccount first (its
/// tokens stop working at once), the policy last (the identity is confined until it is gone).
/// The Grant's namespaces and what is in them stay: provider data.
pub fn revoke(issued: &Issued) -> Vec<Slot> {
    let mut slots: Vec<Slot> = issued.hashes.keys().cloned().collect();
    slots.sort_by_key(|(k, _)| match k {
        Kind::ServiceAccount => 0,
        Kind::Policy | Kind::PolicyBinding => 2,
        _ => 1,
    });
    slots
}

pub mod handover;
mod isolation;
mod pinning;
pub mod sweep;

pub use isolation::{GrantView, Reduction, Tenancy, is_isolation, isolation, reduce, tenancy};
pub use pinning::{Holder, InUse, PinInputs, candidates, labelled_with, pin, stale, valid_uid};

#[cfg(test)]
mod tests;
