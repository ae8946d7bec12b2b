//! The pin check's LISTs (docs/issue.md "Confinement", item 3): which provider objects already
//! carry the consumer cluster UIDs that unpinned Grants' heartbeats name, and who holds their
//! place.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::iam::Grant;
use crate::issue::IssueError;
use crate::pass::list;
use crate::scrub::scrub;

use super::super::plan::{Catalog, Holder, Issued};
use super::super::render::Kind;
use super::handover;

/// Of the UIDs the heartbeats of unpinned Grants name, those already carried
/// (`core.kbind.io/consumer-cluster`) by provider objects, each with who holds their place
/// ([`holder`]) and one such object: an unpinned Grant's identity can have written none of
/// them, so such a UID pins only with a person's approval (docs/issue.md "Confinement"). Only
/// while a Grant waits for its pin: per UID, one labelled metadata LIST per [`carriers`].
pub(super) async fn in_use(
    client: &Client,
    (grants, everyone): (&[Grant], &[Grant]),
    issued: &BTreeMap<String, Issued>,
    (catalog, tenancy): (&Catalog, &super::super::plan::Tenancy),
) -> Result<super::super::plan::InUse, IssueError> {
    let mut uids = BTreeSet::new();
    for g in grants {
        let (Some(name), None) = (
            g.metadata.name.as_deref(),
            g.status
                .as_ref()
                .and_then(|s| s.consumer_cluster.as_deref()),
        ) else {
            continue;
        };
        if let Some(i) = issued.get(name) {
            let grant = super::super::render::GrantRef {
                name,
                uid: "",
                created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
            };
            uids.extend(super::super::plan::candidates(grant, &i.leases));
        }
    }
    let mut out = super::super::plan::InUse::new();
    if uids.is_empty() {
        return Ok(out);
    }
    let sources = carriers(client, catalog).await;
    for uid in uids {
        let seen = out.entry(uid.clone()).or_default();
        for (what, api, source) in &sources {
            // A source the issuer cannot list makes this UID wait for a person, not every
            // Grant of the run.
            let ar = match source {
                Ok(ar) => ar,
                Err(why) => {
                    if !seen.iter().any(|(h, _)| *h == Holder::Unchecked) {
                        seen.push((Holder::Unchecked, why.clone()));
                    }
                    continue;
                }
            };
            let lp = ListParams::default().labels(&super::super::plan::labelled_with(&uid));
            let found = list::map_metadata(
                &Api::<kube::api::DynamicObject>::all_with(client.clone(), ar),
                &lp,
                |m| {
                    let heartbeat = ar.group == "coordination.k8s.io"
                        && ar.plural == "leases"
                        && m.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(crate::api::iam::GRANT_KEY))
                            .is_some_and(|g| {
                                m.metadata.name.as_deref()
                                    == Some(super::super::render::object_name(g).as_str())
                            });
                    (
                        heartbeat,
                        m.metadata.namespace,
                        m.metadata.name.unwrap_or_default(),
                    )
                },
            )
            .await;
            let found = match found {
                Ok(found) => found,
                Err(e) => {
                    let why = format!("listing {what}: {}", scrub(&e.to_string()));
                    if !seen.iter().any(|(h, _)| *h == Holder::Unchecked) {
                        seen.push((Holder::Unchecked, why));
                    }
                    continue;
                }
            };
            // A heartbeat (a Lease named after the Grant its label names) carries a UID to
            // pin, and is all of Leases an identity may write (kbind-grant-identities).
            for (_, ns, name) in found.into_iter().filter(|(heartbeat, ..)| !heartbeat) {
                let owner = holder(everyone, issued, tenancy, (api.as_deref(), ns.as_deref()));
                let place = ns.as_ref().map(|n| format!("{n}/")).unwrap_or_default();
                if !seen.iter().any(|(o, _)| *o == owner) {
                    seen.push((owner, format!("{what} {place}{name}")));
                }
            }
        }
    }
    Ok(out)
}

/// Where objects carrying a consumer cluster UID can be, each with what a message calls it
/// and its exported API's name (none for a permission resource): every exported CRD serving
/// a version (one serving none holds nothing anyone can read or write), and every resource
/// any Export's `spec.permissions` let an identity write (a revoked Grant's Export may be any
/// of them). `Err`: why the issuer cannot list it (a `*`, a rule reaching past what it names,
/// a failed discovery). A CRD no longer exported is looked at when it is granted again (the
/// hand-over check, docs/issue.md "Read isolation").
async fn carriers(
    client: &Client,
    catalog: &Catalog,
) -> Vec<(
    String,
    Option<String>,
    Result<kube::api::ApiResource, String>,
)> {
    use super::super::plan::handover::{Target, written_targets};
    let mut out: Vec<_> = catalog
        .exported
        .values()
        .filter(|a| !a.version.is_empty())
        .map(|a| {
            let ar = kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk(&a.group, &a.version, ""),
                &a.plural,
            );
            (a.name.clone(), Some(a.name.clone()), Ok(ar))
        })
        .collect();
    let mut written: Vec<Target> = Vec::new();
    for t in catalog
        .exports
        .values()
        .flat_map(|e| written_targets(&e.permissions))
    {
        if !written.contains(&t) {
            written.push(t);
        }
    }
    let mut groups = BTreeMap::new();
    for t in written {
        match t {
            Target::Unlistable(why) => out.push((why.clone(), None, Err(why))),
            Target::Permission {
                group, resource, ..
            } => {
                let what = match group.as_str() {
                    "" => resource.clone(),
                    g => format!("{resource}.{g}"),
                };
                match handover::discovered(client, &group, &resource, &mut groups).await {
                    Ok(Some(ar)) => out.push((what, None, Ok(ar))),
                    // Not served: nothing of it exists.
                    Ok(None) => {}
                    Err(why) => out.push((what, None, Err(why))),
                }
            }
            Target::Api(_) => {}
        }
    }
    out
}

/// Who holds the place of an object of `api` (none: a permission resource) in namespace `ns`
/// (none: cluster-scoped): in a namespace, the Grant with its Role there and `api` in its
/// `status.grantedAPIs` (any Grant with its Role there, for a permission resource);
/// cluster-scoped, the Grant holding `api` alone (granted, and no other Grant reaching it).
/// [`Holder::Nobody`] otherwise: objects left by a revoked Grant, or of a shared cluster-scoped
/// API. Only said in the message: an unpinned Grant can have written none of them, wherever
/// they are (docs/issue.md "Confinement").
fn holder(
    everyone: &[Grant],
    issued: &BTreeMap<String, Issued>,
    tenancy: &super::super::plan::Tenancy,
    (api, ns): (Option<&str>, Option<&str>),
) -> Holder {
    let granted = |g: &Grant| {
        g.metadata.deletion_timestamp.is_none()
            && api.is_none_or(|api| {
                g.status
                    .as_ref()
                    .is_some_and(|s| s.granted_apis.iter().any(|a| a == api))
            })
    };
    let mut holders = everyone.iter().filter(|g| granted(g)).filter_map(|g| {
        let name = g.metadata.name.as_deref()?;
        let here = match ns {
            Some(ns) => issued
                .get(name)
                .is_some_and(|i| i.hashes.contains_key(&(Kind::TenantRole, ns.to_string()))),
            None => api.is_some_and(|api| {
                tenancy
                    .cluster_grantees
                    .get(api)
                    .is_some_and(|h| h.len() == 1 && h[0] == name)
            }),
        };
        here.then_some(name)
    });
    match (holders.next(), holders.next()) {
        (Some(one), None) => Holder::Grant(one.to_string()),
        _ => Holder::Nobody,
    }
}
