//! The hand-over check's LISTs (docs/issue.md "Read isolation"): for each place a Grant would
//! newly hold ([`looks`]), one LIST of at most one object per target, stopping at the first
//! found. A LIST that fails, or is refused, leaves that Grant's place unchecked (it waits for
//! a person's approval, named); it never stops the other Grants.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::ApiGroup;
use kube::{Api, Client};

use crate::api::iam::{APPROVE_HANDOVER, Grant};
use crate::api::keys::CONSUMER_CLUSTER;
use crate::pass::StatusCode;
use crate::scrub::scrub;

use super::super::plan::handover::{Finding, Look, Target, looks, namespace_defaults};
use super::super::plan::{Catalog, Issued, Tenancy, resolve};
use super::super::render::Kind;

/// Per live Grant, the places it would newly hold with what was found there (another
/// consumer's object, or why it could not look); places found empty are left out.
pub async fn handover(
    client: &Client,
    grants: &[Grant],
    issued: &BTreeMap<String, Issued>,
    (catalog, tenancy): (&Catalog, &Tenancy),
    namespaces: &BTreeSet<String>,
) -> BTreeMap<String, Vec<(String, Finding)>> {
    let mut groups = BTreeMap::new();
    let mut out = BTreeMap::new();
    for g in grants
        .iter()
        .filter(|g| g.metadata.deletion_timestamp.is_none())
    {
        let Some(name) = g.metadata.name.as_deref() else {
            continue;
        };
        let Ok(resolved) = resolve(&g.spec, catalog) else {
            continue;
        };
        let approved: BTreeSet<&str> = g
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPROVE_HANDOVER))
            .map(|v| v.split(',').map(str::trim).collect())
            .unwrap_or_default();
        let status = g.status.as_ref();
        let granted = |api: &str| status.is_some_and(|s| s.granted_apis.iter().any(|g| g == api));
        let owned = |ns: &str| {
            tenancy.namespace_owner.get(ns).map(String::as_str) == Some(name)
                && namespaces.contains(ns)
        };
        let held = |ns: &str| {
            issued
                .get(name)
                .is_some_and(|i| i.hashes.contains_key(&(Kind::TenantRole, ns.to_string())))
        };
        let exclusive = |api: &str| {
            tenancy
                .cluster_grantees
                .get(api)
                .is_some_and(|h| h.len() == 1 && h[0] == name)
        };
        let pin = status.and_then(|s| s.consumer_cluster.as_deref());
        for look in looks(&resolved, &owned, &held, &granted, &exclusive, &approved) {
            if let Some(f) = look_at(client, &look, pin, &mut groups).await {
                out.entry(name.to_string())
                    .or_insert_with(Vec::new)
                    .push((look.what, f));
            }
        }
    }
    out
}

/// The first finding of one place's targets, if any.
async fn look_at(
    client: &Client,
    look: &Look,
    pin: Option<&str>,
    groups: &mut BTreeMap<String, Option<ApiGroup>>,
) -> Option<Finding> {
    let ns = look.namespace.as_deref();
    for t in &look.targets {
        let (ar, names, what) = match t {
            Target::Unlistable(why) => return Some(Finding::Unchecked(why.clone())),
            Target::Api(a) if a.version.is_empty() => continue,
            Target::Api(a) => (
                ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(&a.group, &a.version, ""),
                    &a.plural,
                ),
                &[][..],
                a.name.clone(),
            ),
            Target::Permission {
                group,
                resource,
                names,
            } => {
                let found = match discovered(client, group, resource, groups).await {
                    Ok(Some(ar)) => ar,
                    // Not served: nothing of it to read.
                    Ok(None) => continue,
                    Err(e) => return Some(Finding::Unchecked(e)),
                };
                let what = match group.as_str() {
                    "" => resource.clone(),
                    g => format!("{resource}.{g}"),
                };
                (found, names.as_slice(), what)
            }
        };
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let skip = match t {
            Target::Permission {
                group, resource, ..
            } => namespace_defaults(group, resource),
            _ => &[],
        };
        match first(&api, pin, skip, names).await {
            Ok(Some(obj)) => {
                let at = ns.map(|n| format!("{n}/")).unwrap_or_default();
                return Some(Finding::Object(format!("{what} {at}{obj}")));
            }
            Ok(None) => {}
            Err(e) => {
                return Some(Finding::Unchecked(format!(
                    "listing {what}: {}",
                    scrub(&e.to_string())
                )));
            }
        }
    }
    None
}

/// One object of `api` not labelled with the Grant's pin (any object while unpinned; an
/// unlabelled one too: a copy handed over with deletion-policy Orphan keeps its data and loses
/// the label), but those named in `skip`; of `names` only (read by name), when the rule names
/// some.
async fn first(
    api: &Api<DynamicObject>,
    pin: Option<&str>,
    skip: &[&str],
    names: &[String],
) -> Result<Option<String>, kube::Error> {
    if names.is_empty() {
        let mut lp = ListParams::default().limit(1);
        if let Some(pin) = pin {
            lp = lp.labels(&format!("{CONSUMER_CLUSTER}!={pin}"));
        }
        let fields: Vec<String> = skip.iter().map(|n| format!("metadata.name!={n}")).collect();
        if !fields.is_empty() {
            lp = lp.fields(&fields.join(","));
        }
        let found = api.list_metadata(&lp).await?;
        return Ok(found.items.into_iter().next().and_then(|o| o.metadata.name));
    }
    for n in names.iter().filter(|n| !skip.contains(&n.as_str())) {
        let Some(o) = api.get_metadata_opt(n).await? else {
            continue;
        };
        let label = o
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CONSUMER_CLUSTER));
        if pin.is_none() || label.map(String::as_str) != pin {
            return Ok(o.metadata.name);
        }
    }
    Ok(None)
}

/// The resource `group`/`resource` as served (the group's preferred version), read once per
/// group and run; `None` when not served.
async fn discovered(
    client: &Client,
    group: &str,
    resource: &str,
    groups: &mut BTreeMap<String, Option<ApiGroup>>,
) -> Result<Option<ApiResource>, String> {
    if !groups.contains_key(group) {
        let g = match kube::discovery::group(client, group).await {
            Ok(g) => Some(g),
            Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => None,
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                return Err(format!(
                    "discovering API group {group:?}: {}",
                    scrub(&e.to_string())
                ));
            }
        };
        groups.insert(group.to_string(), g);
    }
    Ok(groups.get(group).and_then(Option::as_ref).and_then(|g| {
        g.recommended_resources()
            .into_iter()
            .find(|(ar, _)| ar.plural == resource)
            .map(|(ar, _)| ar)
    }))
}
