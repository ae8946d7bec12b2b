//! Which permission claims a tenant's binding to a provider's export should carry (spec 001's
//! policy, adapted to kcp's real rules). Pure: no I/O, so every rule has a table test below.
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
mod tests {
    use super::*;

    fn req(group: &str, resource: &str, provider: Option<&str>) -> Requirement {
        Requirement {
            group: group.into(),
            resource: resource.into(),
            provider: provider.map(String::from),
        }
    }

    fn exp(group: &str, resource: &str, verbs: &[&str], hash: &str) -> PermissionClaim {
        PermissionClaim {
            group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            identity_hash: hash.into(),
        }
    }

    fn consent(items: &[(&str, &str)]) -> Consent {
        items
            .iter()
            .map(|(g, r)| (g.to_string(), r.to_string()))
            .collect()
    }

    fn states(d: &Desired) -> Vec<(String, ClaimState, bool)> {
        d.claims
            .iter()
            .map(|c| {
                (
                    format!("{}/{}", c.claim.group, c.claim.resource),
                    c.state,
                    c.consented,
                )
            })
            .collect()
    }

    use ClaimState::{Accepted, Rejected};

    /// The identities the table tests' entry `compute` owns: its export's and the core's.
    fn own_ids() -> OwnIdentities {
        OwnIdentities::new(Some("h-compute".into()), Some("h-core".into()))
    }

    #[test]
    fn desired_rules() {
        let export = vec![
            exp("", "configmaps", &["get", "list"], ""),
            exp("compute.io", "instances", &["*"], "h-compute"),
            exp("storage.io", "volumes", &["get"], "h-storage"),
        ];
        let own = req("", "configmaps", None);
        let comp = req("storage.io", "volumes", Some("storage"));
        type Case = (
            &'static str,
            Vec<Requirement>,
            Option<Consent>,
            Vec<(&'static str, ClaimState, bool)>,
        );
        let cases: Vec<Case> = vec![
            (
                "own requirement accepted without any Grant",
                vec![own.clone()],
                None,
                vec![("/configmaps", Accepted, false)],
            ),
            (
                "no Grant: composition rejected",
                vec![comp.clone()],
                None,
                vec![("storage.io/volumes", Rejected, false)],
            ),
            (
                "Grant without this composition: rejected",
                vec![comp.clone()],
                Some(consent(&[("other.io", "x")])),
                vec![("storage.io/volumes", Rejected, false)],
            ),
            (
                "consented composition accepted and marked",
                vec![comp.clone()],
                Some(consent(&[("storage.io", "volumes")])),
                vec![("storage.io/volumes", Accepted, true)],
            ),
            (
                "naming itself as provider is an own requirement",
                vec![req("compute.io", "instances", Some("compute"))],
                None,
                vec![("compute.io/instances", Accepted, false)],
            ),
            (
                "empty provider is an own requirement",
                vec![req("compute.io", "instances", Some(""))],
                None,
                vec![("compute.io/instances", Accepted, false)],
            ),
            (
                "verb coordinate claimed as its resource",
                vec![req("compute.io", "instances/exec", None)],
                None,
                vec![("compute.io/instances", Accepted, false)],
            ),
            (
                "coordinates on one resource merge into one claim",
                vec![
                    req("compute.io", "instances", None),
                    req("compute.io", "instances/exec", None),
                ],
                None,
                vec![("compute.io/instances", Accepted, false)],
            ),
            (
                "a merged claim with an unconsented composition is rejected",
                vec![
                    req("compute.io", "instances", None),
                    req("compute.io", "instances/exec", Some("other")),
                ],
                None,
                vec![("compute.io/instances", Rejected, false)],
            ),
            (
                "consent is per coordinate: consent to exec does not cover the whole resource",
                vec![
                    req("compute.io", "instances", Some("other")),
                    req("compute.io", "instances/exec", Some("other")),
                ],
                Some(consent(&[("compute.io", "instances/exec")])),
                vec![("compute.io/instances", Rejected, false)],
            ),
            (
                "duplicates collapse",
                vec![own.clone(), own.clone()],
                None,
                vec![("/configmaps", Accepted, false)],
            ),
            (
                "sorted by key",
                vec![comp.clone(), own.clone()],
                Some(consent(&[("storage.io", "volumes")])),
                vec![
                    ("/configmaps", Accepted, false),
                    ("storage.io/volumes", Accepted, true),
                ],
            ),
        ];
        for (name, requires, consent, want) in cases {
            let d = desired("compute", &requires, &export, &own_ids(), consent.as_ref());
            let want: Vec<(String, ClaimState, bool)> = want
                .into_iter()
                .map(|(k, s, c)| (k.to_string(), s, c))
                .collect();
            assert_eq!(states(&d), want, "{name}");
            assert!(d.missing_on_export.is_empty(), "{name}");
        }
    }

    /// Which requirements need consent is decided by the identityHash the live export's claim
    /// carries, not by the `provider` field the provider writes itself.
    #[test]
    fn the_identity_hash_decides_what_is_a_composition() {
        let export = vec![
            exp("", "configmaps", &["get"], ""),
            exp("compute.io", "instances", &["*"], "h-compute"),
            exp("hub.io", "tenants", &["get"], "h-core"),
            exp("storage.io", "volumes", &["get"], "h-storage"),
        ];
        let ids = |export: Option<&str>, core: Option<&str>| {
            OwnIdentities::new(export.map(String::from), core.map(String::from))
        };
        type Case = (
            &'static str,
            Requirement,
            OwnIdentities,
            Option<Consent>,
            (&'static str, ClaimState, bool),
        );
        let cases: Vec<Case> = vec![
            (
                "provider omitted, foreign identityHash: a composition, Rejected without a Grant",
                req("storage.io", "volumes", None),
                own_ids(),
                None,
                ("storage.io/volumes", Rejected, false),
            ),
            (
                "provider omitted, foreign identityHash: Accepted with the Grant",
                req("storage.io", "volumes", None),
                own_ids(),
                Some(consent(&[("storage.io", "volumes")])),
                ("storage.io/volumes", Accepted, true),
            ),
            (
                "a Grant for another coordinate does not cover it",
                req("storage.io", "volumes", None),
                own_ids(),
                Some(consent(&[("storage.io", "snapshots")])),
                ("storage.io/volumes", Rejected, false),
            ),
            (
                "naming itself as provider does not make a foreign identity its own",
                req("storage.io", "volumes", Some("compute")),
                own_ids(),
                None,
                ("storage.io/volumes", Rejected, false),
            ),
            (
                "an empty provider with a foreign identity is a composition",
                req("storage.io", "volumes", Some("")),
                own_ids(),
                None,
                ("storage.io/volumes", Rejected, false),
            ),
            (
                "the entry's own export identity: own",
                req("compute.io", "instances", None),
                own_ids(),
                None,
                ("compute.io/instances", Accepted, false),
            ),
            (
                "the core export's identity: own",
                req("hub.io", "tenants", None),
                own_ids(),
                None,
                ("hub.io/tenants", Accepted, false),
            ),
            (
                "built-in (empty identityHash): own",
                req("", "configmaps", None),
                own_ids(),
                None,
                ("/configmaps", Accepted, false),
            ),
            (
                "naming another provider on an own identity still needs consent",
                req("compute.io", "instances", Some("storage")),
                own_ids(),
                None,
                ("compute.io/instances", Rejected, false),
            ),
            (
                "own export identity unreadable: its claims need consent",
                req("compute.io", "instances", None),
                ids(None, Some("h-core")),
                None,
                ("compute.io/instances", Rejected, false),
            ),
            (
                "own export identity unreadable: Accepted with consent",
                req("compute.io", "instances", None),
                ids(None, Some("h-core")),
                Some(consent(&[("compute.io", "instances")])),
                ("compute.io/instances", Accepted, true),
            ),
            (
                "core identity unreadable or not configured: its claims need consent",
                req("hub.io", "tenants", None),
                ids(Some("h-compute"), None),
                None,
                ("hub.io/tenants", Rejected, false),
            ),
            (
                "an empty identity read is unknown, not a match",
                req("hub.io", "tenants", None),
                ids(Some(""), Some("")),
                None,
                ("hub.io/tenants", Rejected, false),
            ),
            (
                "built-ins stay own when no identity could be read",
                req("", "configmaps", None),
                ids(None, None),
                None,
                ("/configmaps", Accepted, false),
            ),
        ];
        for (name, requirement, own, consent, (key, state, consented)) in cases {
            let d = desired("compute", &[requirement], &export, &own, consent.as_ref());
            assert_eq!(
                states(&d),
                vec![(key.to_string(), state, consented)],
                "{name}"
            );
        }
    }

    #[test]
    fn one_entry_per_export_the_oldest_then_the_first_name_wins() {
        let at = |s: i64| Some(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let x = ExportRef {
            path: "root:p".into(),
            name: "x.io".into(),
        };
        let y = ExportRef {
            path: "root:q".into(),
            name: "x.io".into(),
        };
        let same_name_elsewhere = ExportRef {
            path: String::new(),
            name: "x.io".into(),
        };
        let got = duplicate_entries([
            (&x, at(5), "a-newer"),
            (&x, at(1), "z-oldest"),
            (&x, at(1), "zz-same-second"),
            (&x, None, "0-no-time"),
            (&y, at(9), "alone"),
            (&same_name_elsewhere, at(0), "other-path"),
        ]);
        let want: BTreeMap<String, String> = [
            ("a-newer", "z-oldest"),
            ("zz-same-second", "z-oldest"),
            ("0-no-time", "z-oldest"),
        ]
        .into_iter()
        .map(|(l, w)| (l.to_string(), w.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn verbs_and_identity_come_from_the_live_export() {
        let export = vec![exp("compute.io", "instances", &["get", "create"], "h1")];
        let d = desired(
            "compute",
            &[req("compute.io", "instances/exec", None)],
            &export,
            &OwnIdentities::new(Some("h1".into()), None),
            None,
        );
        assert_eq!(d.claims[0].claim, export[0]);
    }

    #[test]
    fn requirements_missing_on_the_export_are_reported_not_claimed() {
        let export = vec![exp("", "configmaps", &["get"], "")];
        let requires = vec![
            req("", "configmaps", None),
            req("", "secrets", None),
            req("x.io", "things/exec", Some("x")),
        ];
        let d = desired("p", &requires, &export, &own_ids(), None);
        assert_eq!(
            states(&d),
            vec![("/configmaps".to_string(), Accepted, false)]
        );
        assert_eq!(
            d.missing_on_export,
            vec![
                req("", "secrets", None),
                req("x.io", "things/exec", Some("x"))
            ]
        );
    }

    #[test]
    fn core_desired_accepts_every_core_export_claim() {
        let core = vec![
            exp("apis.kcp.io", "apibindings", &["get", "list", "update"], ""),
            exp("", "namespaces", &["*"], ""),
        ];
        let d = core_desired(&core);
        assert!(d.claims.iter().all(|c| c.state == Accepted));
        assert_eq!(d.claims.len(), 2);
    }

    #[test]
    fn export_claims_use_the_same_grouping_every_verb_and_the_serving_identity() {
        let requires = vec![
            req("", "configmaps", None),
            req("compute.io", "instances", None),
            req("compute.io", "instances/exec", None),
            req("storage.io", "volumes", Some("storage")),
        ];
        let ids: BTreeMap<&str, &str> = [("compute", "h-c"), ("storage", "h-s")].into();
        let got = export_claims("compute", &requires, |p| {
            ids.get(p).map(|s| s.to_string()).ok_or(p.to_string())
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                exp("", "configmaps", &["*"], ""),
                exp("compute.io", "instances", &["*"], "h-c"),
                exp("storage.io", "volumes", &["*"], "h-s"),
            ]
        );
        // And a binding computed against that export carries exactly those claims.
        let d = desired(
            "compute",
            &requires,
            &got,
            &OwnIdentities::new(Some("h-c".into()), None),
            Some(&consent(&[("storage.io", "volumes")])),
        );
        let claimed: Vec<PermissionClaim> = d.claims.into_iter().map(|c| c.claim).collect();
        assert_eq!(claimed, got);
    }

    #[test]
    fn export_claims_name_the_provider_whose_identity_is_missing() {
        let requires = vec![req("storage.io", "volumes", Some("storage"))];
        let err = export_claims("compute", &requires, |p| Err::<String, _>(p.to_string()));
        assert_eq!(err, Err("storage".to_string()));
    }

    #[test]
    fn requirements_hash_ignores_order_and_duplicates_but_not_content() {
        let a = vec![req("", "configmaps", None), req("x.io", "t", Some("x"))];
        let b = vec![
            req("x.io", "t", Some("x")),
            req("", "configmaps", None),
            req("", "configmaps", None),
        ];
        assert_eq!(requirements_hash(&a), requirements_hash(&b));
        let c = vec![req("", "configmaps", None), req("x.io", "t", None)];
        assert_ne!(requirements_hash(&a), requirements_hash(&c));
    }
}
