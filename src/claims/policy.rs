//! Which permission claims a tenant's binding to a provider's export should carry
//! (docs/claims.md, docs/contract.md "Claims": the catalog's policy, adapted to kcp's real rules). Pure: no I/O, so every rule has a table test below.
//!
//! kcp keys export claims by (group, resource) and binding claims by (group, resource,
//! identityHash); a claim's resource cannot hold `/`, and a binding claim only grants what both
//! sides' verbs share. So requirements are grouped per (group, resource) with verb coordinates
//! folded into their resource, and verbs and identityHash are always copied from the live export.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::kcp::{ClaimState, PermissionClaim};
use crate::api::providers::{ExportRef, Requirement};
use k8s_openapi::jiff::Timestamp;

/// Groups whose resources are built into kcp, so their claims carry no identityHash.
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "rbac.authorization.k8s.io",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "admissionregistration.k8s.io",
    "events.k8s.io",
    "apiextensions.k8s.io",
    "authorization.k8s.io",
    "authentication.k8s.io",
    "core.kcp.io",
    "apis.kcp.io",
];

/// A claim's key on an export: group and resource (a verb coordinate's resource part).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimResource {
    pub group: String,
    pub resource: String,
}

impl std::fmt::Display for ClaimResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// Requirements folded into one claim: `instances` and `instances/exec` are one claim on
/// `instances`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coordinate<'a> {
    pub key: ClaimResource,
    pub requirements: Vec<&'a Requirement>,
}

/// A requirement's claim key: the resource part of a verb coordinate.
pub fn claim_resource(r: &Requirement) -> ClaimResource {
    let resource = r.resource.split('/').next().unwrap_or_default();
    ClaimResource {
        group: r.group.clone(),
        resource: resource.to_string(),
    }
}

/// Whether kcp serves this group's resources itself (claims on them need no identityHash).
pub fn is_builtin_group(group: &str) -> bool {
    BUILTIN_GROUPS.contains(&group)
}

/// `spec.requires` grouped into claims, sorted by key; duplicates collapse.
pub fn coordinates(requires: &[Requirement]) -> Vec<Coordinate<'_>> {
    let mut by_key: BTreeMap<ClaimResource, Vec<&Requirement>> = BTreeMap::new();
    for r in requires {
        let reqs = by_key.entry(claim_resource(r)).or_default();
        if !reqs.contains(&r) {
            reqs.push(r);
        }
    }
    by_key
        .into_iter()
        .map(|(key, requirements)| Coordinate { key, requirements })
        .collect()
}

/// The export identities a claim may carry and still be the provider's own (docs/claims.md, "The
/// policy"). `None` is an identity that could not be read (or, for the core export, is not
/// configured): it matches nothing, so such claims count as compositions and need consent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnIdentities {
    /// `status.identityHash` of the entry's own APIExport.
    pub export: Option<String>,
    /// `status.identityHash` of the configured core APIExport.
    pub core: Option<String>,
}

impl OwnIdentities {
    /// An empty identity is treated as unknown, never as a match for a non-empty hash.
    pub fn new(export: Option<String>, core: Option<String>) -> Self {
        Self {
            export: export.filter(|h| !h.is_empty()),
            core: core.filter(|h| !h.is_empty()),
        }
    }

    /// Whether a claim carrying `identity_hash` is on the provider's own (or built-in, or the
    /// hub's core) kinds.
    pub fn is_own(&self, identity_hash: &str) -> bool {
        identity_hash.is_empty()
            || self.export.as_deref() == Some(identity_hash)
            || self.core.as_deref() == Some(identity_hash)
    }
}

/// Whether the requirement names another provider in its `provider` field.
pub fn names_other_provider(entry: &str, r: &Requirement) -> bool {
    r.provider
        .as_deref()
        .is_some_and(|p| !p.is_empty() && p != entry)
}

/// Whether a requirement is a composition (a claim on another provider's kinds) needing the
/// workspace's consent. The identityHash the live export's claim carries decides: any identity
/// other than the entry's own export's or the core export's makes it a composition, whatever
/// `provider` says, so leaving `provider` out cannot skip consent. `provider` can only add a
/// consent requirement: naming another provider is a composition even on an own identity.
pub fn is_composition(
    entry: &str,
    r: &Requirement,
    identity_hash: &str,
    own: &OwnIdentities,
) -> bool {
    !own.is_own(identity_hash) || names_other_provider(entry, r)
}

/// The compositions a Grant consents to, as declared coordinates (`group`, `resource`).
pub type Consent = BTreeSet<(String, String)>;

/// One claim the binding should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredClaim {
    pub claim: PermissionClaim,
    pub state: ClaimState,
    /// Accepted because the workspace's Grant consents to every composition in it: a Rejected
    /// the hub itself wrote earlier may be replaced.
    pub consented: bool,
}

/// What a provider's tenants' bindings should carry, and what could not be claimed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub claims: Vec<DesiredClaim>,
    /// Requirements the live export does not list (so they are not claimed), as declared.
    pub missing_on_export: Vec<Requirement>,
}

/// `Desired(provider, export, grant)`: every declared requirement the live export also lists,
/// with verbs and identityHash copied from the export. The provider's own requirements are
/// Accepted; a claim holding a composition ([`is_composition`], judged by the identityHash the
/// export's claim carries against `own`) is Accepted only when `consent` (the workspace's
/// Grant; `None` when there is none or no Grant store) covers every composition coordinate in
/// it, and Rejected otherwise.
pub fn desired(
    entry: &str,
    requires: &[Requirement],
    export: &[PermissionClaim],
    own: &OwnIdentities,
    consent: Option<&Consent>,
) -> Desired {
    let mut out = Desired::default();
    for coord in coordinates(requires) {
        let Some(live) = export
            .iter()
            .find(|c| c.group == coord.key.group && c.resource == coord.key.resource)
        else {
            out.missing_on_export
                .extend(coord.requirements.iter().map(|r| (*r).clone()));
            continue;
        };
        let compositions: Vec<&&Requirement> = coord
            .requirements
            .iter()
            .filter(|r| is_composition(entry, r, &live.identity_hash, own))
            .collect();
        let all_consented = compositions
            .iter()
            .all(|r| consent.is_some_and(|c| c.contains(&(r.group.clone(), r.resource.clone()))));
        let accepted = compositions.is_empty() || all_consented;
        out.claims.push(DesiredClaim {
            claim: PermissionClaim {
                group: live.group.clone(),
                resource: live.resource.clone(),
                verbs: live.verbs.clone(),
                identity_hash: live.identity_hash.clone(),
            },
            state: if accepted {
                ClaimState::Accepted
            } else {
                ClaimState::Rejected
            },
            consented: !compositions.is_empty() && all_consented,
        });
    }
    out
}

/// The core binding's claim set: every claim of the core export, Accepted (the hub's own
/// binding to its own export).
pub fn core_desired(core_export: &[PermissionClaim]) -> Desired {
    Desired {
        claims: core_export
            .iter()
            .map(|c| DesiredClaim {
                claim: c.clone(),
                state: ClaimState::Accepted,
                consented: false,
            })
            .collect(),
        missing_on_export: Vec::new(),
    }
}

/// The claims a provider's APIExport should list, from the same grouping bindings use: one
/// claim per (group, resource), every verb (a verb coordinate is the capability; which HTTP
/// method carries it is the provider's detail), and the identityHash of the export serving
/// the kinds (`identity` answers for a provider name; builtins need none).
pub fn export_claims<E>(
    entry: &str,
    requires: &[Requirement],
    identity: impl Fn(&str) -> Result<String, E>,
) -> Result<Vec<PermissionClaim>, E> {
    coordinates(requires)
        .into_iter()
        .map(|coord| {
            let identity_hash = if is_builtin_group(&coord.key.group) {
                String::new()
            } else {
                let provider = coord
                    .requirements
                    .iter()
                    .find_map(|r| r.provider.as_deref().filter(|p| !p.is_empty()))
                    .unwrap_or(entry);
                identity(provider)?
            };
            Ok(PermissionClaim {
                group: coord.key.group,
                resource: coord.key.resource,
                verbs: vec!["*".into()],
                identity_hash,
            })
        })
        .collect()
}

/// One CatalogEntry per export: given every entry's export, creation time and name, each entry
/// that loses mapped to the name of the one that wins. The oldest wins; equal creation times
/// (they have second resolution) are broken by name. An entry without a creation time (never
/// one read from an API server) cannot be the oldest.
pub fn duplicate_entries<'a, I>(entries: I) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (&'a ExportRef, Option<Timestamp>, &'a str)>,
{
    // Sort key: no creation time last, then the oldest, then the name.
    type Age<'a> = (bool, Option<Timestamp>, &'a str);
    let mut by_export: BTreeMap<&ExportRef, Vec<Age<'a>>> = BTreeMap::new();
    for (export, created, name) in entries {
        by_export
            .entry(export)
            .or_default()
            .push((created.is_none(), created, name));
    }
    let mut losers = BTreeMap::new();
    for mut named in by_export.into_values() {
        named.sort();
        let mut it = named.into_iter();
        let Some((_, _, winner)) = it.next() else {
            continue;
        };
        for (_, _, loser) in it {
            losers.insert(loser.to_string(), winner.to_string());
        }
    }
    losers
}

/// A stable hash of `spec.requires` (order and duplicates do not matter), recorded in the
/// CatalogEntry status so a changed requirement starts a new cycle.
pub fn requirements_hash(requires: &[Requirement]) -> String {
    use sha2::{Digest, Sha256};
    let set: BTreeSet<(&str, &str, &str)> = requires
        .iter()
        .map(|r| {
            (
                r.group.as_str(),
                r.resource.as_str(),
                r.provider.as_deref().unwrap_or(""),
            )
        })
        .collect();
    let mut h = Sha256::new();
    for (g, r, p) in set {
        h.update(format!("{g}\0{r}\0{p}\n"));
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests;
