//! Merging the desired claims onto a binding without overriding a tenant's decision. Pure.
//!
//! kcp's `state` holds only Accepted or Rejected, so which Rejected claims kbind itself wrote
//! (placeholders for compositions without consent) is recorded in an annotation on the binding;
//! only those may later become Accepted.

use std::collections::BTreeSet;

use crate::api::kcp::{AcceptablePermissionClaim, ClaimSelector, ClaimState, PermissionClaim};

use super::policy::{Desired, DesiredClaim};

/// Binding annotation listing the Rejected claims kbind wrote as placeholders.
pub const PLACEHOLDERS: &str = "providers.kbind.io/rejected-placeholders";

/// A binding claim's key in kcp: group, resource and identityHash.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimKey {
    pub group: String,
    pub resource: String,
    pub identity_hash: String,
}

impl ClaimKey {
    fn of_binding(c: &AcceptablePermissionClaim) -> Self {
        Self {
            group: c.group.clone(),
            resource: c.resource.clone(),
            identity_hash: c.identity_hash.clone(),
        }
    }

    fn of_export(c: &PermissionClaim) -> Self {
        Self {
            group: c.group.clone(),
            resource: c.resource.clone(),
            identity_hash: c.identity_hash.clone(),
        }
    }
}

/// Parse the placeholder annotation (`group/resource/identityHash`, comma-separated; group,
/// resource and hash cannot contain `/` or `,`). Malformed entries are ignored: the worst case
/// is a placeholder treated as the tenant's own rejection, which stays Rejected.
pub fn parse_placeholders(value: Option<&str>) -> BTreeSet<ClaimKey> {
    value
        .unwrap_or_default()
        .split(',')
        .filter_map(|item| {
            let mut parts = item.trim().splitn(3, '/');
            let (g, r, h) = (parts.next()?, parts.next()?, parts.next()?);
            (!r.is_empty()).then(|| ClaimKey {
                group: g.into(),
                resource: r.into(),
                identity_hash: h.into(),
            })
        })
        .collect()
}

/// Render the placeholder annotation; `None` when there is none (the annotation is removed).
pub fn render_placeholders(keys: &BTreeSet<ClaimKey>) -> Option<String> {
    (!keys.is_empty()).then(|| {
        keys.iter()
            .map(|k| format!("{}/{}/{}", k.group, k.resource, k.identity_hash))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// How the claims on one binding should end up.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    pub claims: Vec<AcceptablePermissionClaim>,
    pub placeholders: BTreeSet<ClaimKey>,
    /// Anything differs from what the binding holds (claims or placeholder annotation).
    pub changed: bool,
}

/// Merge `desired` onto a binding's `existing` claims.
///
/// - A desired claim the binding lacks is added (selector `matchAll`); a Rejected one is
///   recorded as kbind's placeholder.
/// - A claim the binding holds Rejected stays Rejected unless kbind wrote it (a placeholder) or
///   `force` (the hub's own core binding).
/// - An Accepted claim whose consent was withdrawn becomes a Rejected placeholder.
/// - Verbs follow the export; an existing claim keeps its selector (kcp makes it immutable).
/// - An Accepted claim matching no live `export` claim (group, resource, identityHash) is removed
///   whoever wrote it: it grants nothing and makes kcp mark the binding invalid.
/// - A placeholder no longer desired is removed; any other claim kbind did not derive is left.
pub fn merge(
    existing: &[AcceptablePermissionClaim],
    placeholders: &BTreeSet<ClaimKey>,
    desired: &Desired,
    export: &[PermissionClaim],
    force: bool,
) -> Merged {
    let live: BTreeSet<ClaimKey> = export.iter().map(ClaimKey::of_export).collect();
    let mut marks = placeholders.clone();
    let mut handled = BTreeSet::new();
    let mut claims = Vec::with_capacity(existing.len() + desired.claims.len());

    for e in existing {
        let key = ClaimKey::of_binding(e);
        let want = desired
            .claims
            .iter()
            .find(|d| ClaimKey::of_export(&d.claim) == key);
        let Some(want) = want else {
            let stale_accept = e.state == ClaimState::Accepted && !live.contains(&key);
            let own_placeholder = e.state == ClaimState::Rejected && marks.contains(&key);
            if !(stale_accept || own_placeholder) {
                claims.push(e.clone());
            }
            continue;
        };
        handled.insert(key.clone());
        claims.push(held_claim(e, want, key, force, &mut marks));
    }

    for want in &desired.claims {
        let key = ClaimKey::of_export(&want.claim);
        if handled.contains(&key) {
            continue;
        }
        if want.state == ClaimState::Rejected {
            marks.insert(key.clone());
        } else {
            marks.remove(&key);
        }
        handled.insert(key);
        claims.push(AcceptablePermissionClaim {
            group: want.claim.group.clone(),
            resource: want.claim.resource.clone(),
            verbs: want.claim.verbs.clone(),
            identity_hash: want.claim.identity_hash.clone(),
            selector: ClaimSelector {
                match_all: true,
                ..Default::default()
            },
            state: want.state,
        });
    }

    let held: BTreeSet<ClaimKey> = claims.iter().map(ClaimKey::of_binding).collect();
    marks.retain(|k| held.contains(k));
    let changed = claims != existing || &marks != placeholders;
    Merged {
        claims,
        placeholders: marks,
        changed,
    }
}

/// A claim the binding holds and the policy wants: what it becomes, with the hub's own
/// rejection marks (`marks`) kept in step. A tenant's own rejection is left exactly as it is.
fn held_claim(
    e: &AcceptablePermissionClaim,
    want: &DesiredClaim,
    key: ClaimKey,
    force: bool,
    marks: &mut BTreeSet<ClaimKey>,
) -> AcceptablePermissionClaim {
    let mut next = e.clone();
    let ours = marks.contains(&key);
    match (e.state, want.state) {
        (ClaimState::Rejected, ClaimState::Accepted) if force || ours => {
            next.state = ClaimState::Accepted;
            next.verbs.clone_from(&want.claim.verbs);
            marks.remove(&key);
        }
        (ClaimState::Rejected, _) => {
            if ours {
                next.verbs.clone_from(&want.claim.verbs);
            }
        }
        (ClaimState::Accepted, ClaimState::Accepted) => {
            next.verbs.clone_from(&want.claim.verbs);
            marks.remove(&key);
        }
        (ClaimState::Accepted, ClaimState::Rejected) => {
            next.state = ClaimState::Rejected;
            next.verbs.clone_from(&want.claim.verbs);
            marks.insert(key);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::claims::policy::DesiredClaim;
    use ClaimState::{Accepted, Rejected};

    fn pc(gr: &str, verbs: &[&str], hash: &str) -> PermissionClaim {
        let (group, resource) = gr.split_once('/').unwrap_or(("", gr));
        PermissionClaim {
            group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            identity_hash: hash.into(),
        }
    }

    fn bc(gr: &str, verbs: &[&str], hash: &str, state: ClaimState) -> AcceptablePermissionClaim {
        let c = pc(gr, verbs, hash);
        AcceptablePermissionClaim {
            group: c.group,
            resource: c.resource,
            verbs: c.verbs,
            identity_hash: c.identity_hash,
            selector: ClaimSelector {
                match_all: true,
                ..Default::default()
            },
            state,
        }
    }

    fn want(claim: PermissionClaim, state: ClaimState, consented: bool) -> DesiredClaim {
        DesiredClaim {
            claim,
            state,
            consented,
        }
    }

    fn key(gr: &str, hash: &str) -> ClaimKey {
        ClaimKey::of_export(&pc(gr, &["*"], hash))
    }

    fn view(m: &Merged) -> Vec<(String, ClaimState, Vec<String>)> {
        m.claims
            .iter()
            .map(|c| {
                (
                    format!("{}/{}#{}", c.group, c.resource, c.identity_hash),
                    c.state,
                    c.verbs.clone(),
                )
            })
            .collect()
    }

    struct Case {
        name: &'static str,
        existing: Vec<AcceptablePermissionClaim>,
        placeholders: Vec<ClaimKey>,
        desired: Vec<DesiredClaim>,
        force: bool,
        want: Vec<(&'static str, ClaimState, &'static [&'static str])>,
        want_placeholders: Vec<ClaimKey>,
        changed: bool,
    }

    #[test]
    fn merge_rules() {
        let vol = pc("storage.io/volumes", &["get"], "hs");
        let cm = pc("configmaps", &["get", "list"], "");
        let export = vec![vol.clone(), cm.clone()];
        let cases = vec![
            Case {
                name: "missing claims are added; a Rejected one is kbind's placeholder",
                existing: vec![],
                placeholders: vec![],
                desired: vec![
                    want(cm.clone(), Accepted, false),
                    want(vol.clone(), Rejected, false),
                ],
                force: false,
                want: vec![
                    ("/configmaps#", Accepted, &["get", "list"]),
                    ("storage.io/volumes#hs", Rejected, &["get"]),
                ],
                want_placeholders: vec![key("storage.io/volumes", "hs")],
                changed: true,
            },
            Case {
                name: "a tenant's Rejected stays Rejected even when the policy accepts",
                existing: vec![bc("configmaps", &["get", "list"], "", Rejected)],
                placeholders: vec![],
                desired: vec![want(cm.clone(), Accepted, false)],
                force: false,
                want: vec![("/configmaps#", Rejected, &["get", "list"])],
                want_placeholders: vec![],
                changed: false,
            },
            Case {
                name: "kbind's placeholder becomes Accepted once consented",
                existing: vec![bc("storage.io/volumes", &["get"], "hs", Rejected)],
                placeholders: vec![key("storage.io/volumes", "hs")],
                desired: vec![want(vol.clone(), Accepted, true)],
                force: false,
                want: vec![("storage.io/volumes#hs", Accepted, &["get"])],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "an unconsented placeholder stays as it is (no write)",
                existing: vec![bc("storage.io/volumes", &["get"], "hs", Rejected)],
                placeholders: vec![key("storage.io/volumes", "hs")],
                desired: vec![want(vol.clone(), Rejected, false)],
                force: false,
                want: vec![("storage.io/volumes#hs", Rejected, &["get"])],
                want_placeholders: vec![key("storage.io/volumes", "hs")],
                changed: false,
            },
            Case {
                name: "withdrawn consent turns Accepted into a placeholder Rejected",
                existing: vec![bc("storage.io/volumes", &["get"], "hs", Accepted)],
                placeholders: vec![],
                desired: vec![want(vol.clone(), Rejected, false)],
                force: false,
                want: vec![("storage.io/volumes#hs", Rejected, &["get"])],
                want_placeholders: vec![key("storage.io/volumes", "hs")],
                changed: true,
            },
            Case {
                name: "verbs follow the export",
                existing: vec![bc("configmaps", &["get"], "", Accepted)],
                placeholders: vec![],
                desired: vec![want(cm.clone(), Accepted, false)],
                force: false,
                want: vec![("/configmaps#", Accepted, &["get", "list"])],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "an Accepted claim on no live export claim is removed whoever wrote it",
                existing: vec![
                    bc("secrets", &["*"], "", Accepted),
                    bc("configmaps", &["get", "list"], "", Accepted),
                ],
                placeholders: vec![],
                desired: vec![want(cm.clone(), Accepted, false)],
                force: false,
                want: vec![("/configmaps#", Accepted, &["get", "list"])],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "a stale identityHash is another key: Accepted stale entry removed, new one added",
                existing: vec![bc("storage.io/volumes", &["get"], "old", Accepted)],
                placeholders: vec![],
                desired: vec![want(vol.clone(), Accepted, false)],
                force: false,
                want: vec![("storage.io/volumes#hs", Accepted, &["get"])],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "a tenant's Rejected leftover is harmless and left alone",
                existing: vec![bc("secrets", &["*"], "", Rejected)],
                placeholders: vec![],
                desired: vec![],
                force: false,
                want: vec![("/secrets#", Rejected, &["*"])],
                want_placeholders: vec![],
                changed: false,
            },
            Case {
                name: "kbind's placeholder no longer desired is removed",
                existing: vec![bc("storage.io/volumes", &["get"], "hs", Rejected)],
                placeholders: vec![key("storage.io/volumes", "hs")],
                desired: vec![],
                force: false,
                want: vec![],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "an Accepted claim the export lists but no requirement derives is left alone",
                existing: vec![bc("storage.io/volumes", &["get"], "hs", Accepted)],
                placeholders: vec![],
                desired: vec![],
                force: false,
                want: vec![("storage.io/volumes#hs", Accepted, &["get"])],
                want_placeholders: vec![],
                changed: false,
            },
            Case {
                name: "force (core binding) accepts a Rejected claim",
                existing: vec![bc("configmaps", &["get", "list"], "", Rejected)],
                placeholders: vec![],
                desired: vec![want(cm.clone(), Accepted, false)],
                force: true,
                want: vec![("/configmaps#", Accepted, &["get", "list"])],
                want_placeholders: vec![],
                changed: true,
            },
            Case {
                name: "placeholder marks for claims the binding no longer holds are dropped",
                existing: vec![],
                placeholders: vec![key("gone.io/x", "h")],
                desired: vec![],
                force: false,
                want: vec![],
                want_placeholders: vec![],
                changed: true,
            },
        ];
        for c in cases {
            let desired = Desired {
                claims: c.desired,
                missing_on_export: vec![],
            };
            let placeholders: BTreeSet<ClaimKey> = c.placeholders.into_iter().collect();
            let m = merge(&c.existing, &placeholders, &desired, &export, c.force);
            let want: Vec<(String, ClaimState, Vec<String>)> = c
                .want
                .into_iter()
                .map(|(k, s, v)| (k.to_string(), s, v.iter().map(|x| x.to_string()).collect()))
                .collect();
            assert_eq!(view(&m), want, "{}", c.name);
            assert_eq!(
                m.placeholders,
                c.want_placeholders.into_iter().collect::<BTreeSet<_>>(),
                "{}",
                c.name
            );
            assert_eq!(m.changed, c.changed, "{}", c.name);
        }
    }

    #[test]
    fn an_existing_claim_keeps_its_selector() {
        let cm = pc("configmaps", &["get", "list"], "");
        let mut existing = bc("configmaps", &["get"], "", Accepted);
        existing.selector = ClaimSelector {
            match_labels: Some(BTreeMap::from([("team".to_string(), "a".to_string())])),
            ..Default::default()
        };
        let desired = Desired {
            claims: vec![want(cm.clone(), Accepted, false)],
            missing_on_export: vec![],
        };
        let m = merge(
            &[existing.clone()],
            &BTreeSet::new(),
            &desired,
            &[cm],
            false,
        );
        assert_eq!(m.claims[0].selector, existing.selector);
        assert_eq!(m.claims[0].verbs, vec!["get", "list"]);
    }

    #[test]
    fn merging_twice_changes_nothing() {
        let vol = pc("storage.io/volumes", &["get"], "hs");
        let cm = pc("configmaps", &["get"], "");
        let desired = Desired {
            claims: vec![
                want(cm.clone(), Accepted, false),
                want(vol.clone(), Rejected, false),
            ],
            missing_on_export: vec![],
        };
        let export = [cm, vol];
        let first = merge(&[], &BTreeSet::new(), &desired, &export, false);
        let second = merge(&first.claims, &first.placeholders, &desired, &export, false);
        assert!(first.changed);
        assert!(!second.changed);
        assert_eq!(second.claims, first.claims);
    }

    #[test]
    fn placeholder_annotation_round_trips_and_tolerates_junk() {
        let keys: BTreeSet<ClaimKey> =
            [key("configmaps", ""), key("storage.io/volumes", "hs")].into();
        let text = render_placeholders(&keys).unwrap();
        assert_eq!(text, "/configmaps/,storage.io/volumes/hs");
        assert_eq!(parse_placeholders(Some(&text)), keys);
        assert_eq!(parse_placeholders(Some("junk,,a//")), BTreeSet::new());
        assert_eq!(render_placeholders(&BTreeSet::new()), None);
        assert!(parse_placeholders(None).is_empty());
    }
}
