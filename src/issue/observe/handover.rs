//! The hand-over check's LISTs (docs/issue.md "Read isolation"): for each place a Grant would
//! newly hold ([`looks`]), one LIST of at most one object per target, stopping at the first
//! found. A LIST that fails, or is refused, leaves that Grant's place unchecked (it waits for
//! a person's approval, named); it never stops the other Grants.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::ApiGroup;
use kube::{Api, Client};

use crate::api::iam::{APPROVE_HANDOVER, Grant};
use crate::api::keys::CONSUMER_CLUSTER;
use crate::issue::record::CONSUMER_PINNED;
use crate::pass::{StatusCode, list};

use super::super::plan::handover::{Finding, Look, Target, counts, looks, namespace_defaults};
use super::super::plan::{Catalog, Issued, Tenancy, resolve};
use super::super::render::Kind;

/// Per live Grant, the places it would newly hold with what was found there (another
/// consumer's object, or why it could not look); places found empty are left out.
pub async fn handover(
    client: &Client,
    grants: &[Grant],
    issued: &BTreeMap<String, Issued>,
    (catalog, tenancy): (&Catalog, &Tenancy),
    (namespaces, made): (&BTreeSet<String>, &BTreeMap<String, (String, Timestamp)>),
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
        let created = g.metadata.creation_timestamp.as_ref().map(|t| t.0);
        // A namespace the issuer created for this Grant (labelled with it, younger than it)
        // while it was never issued held nobody's objects: one whose Role write failed (a
        // permission not grantable yet) is not looked at again. Once issued, a Grant's
        // namespaces may have passed through other hands.
        let never_issued = status.is_none_or(|s| s.secret_ref.is_none());
        let made_for_it = |ns: &str| {
            never_issued
                && made
                    .get(ns)
                    .is_some_and(|(grant, at)| grant == name && created.is_some_and(|c| *at >= c))
        };
        let owned = |ns: &str| {
            tenancy.namespace_owner.get(ns).map(String::as_str) == Some(name)
                && namespaces.contains(ns)
                && !made_for_it(ns)
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
        // When the Grant was pinned: `ConsumerPinned` turned True then and stays so.
        let pinned = status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == CONSUMER_PINNED && c.status == "True")
                .map(|c| c.last_transition_time.0)
        });
        let whose = Whose {
            pin: status.and_then(|s| s.consumer_cluster.as_deref()),
            pinned,
        };
        for look in looks(&resolved, &owned, &held, &granted, &exclusive, &approved) {
            if let Some(f) = look_at(client, &look, whose, &mut groups).await {
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
    whose: Whose<'_>,
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
        match first(&api, whose, skip, names).await {
            Ok(Some(obj)) => {
                let at = ns.map(|n| format!("{n}/")).unwrap_or_default();
                return Some(Finding::Object(format!("{what} {at}{obj}")));
            }
            Ok(None) => {}
            Err(e) => {
                return Some(Finding::Unchecked(format!("listing {what}: {}", e)));
            }
        }
    }
    None
}

/// The Grant a look is for: its pin and when it was pinned ([`counts`]).
#[derive(Clone, Copy)]
struct Whose<'a> {
    pin: Option<&'a str>,
    pinned: Option<Timestamp>,
}

/// One object of `api` that [`counts`] as another consumer's, but unlabelled ones `skip`
/// excludes; of `names` only (read by name), when the rule names some. One LIST of at most one
/// unlabelled object, one of at most one labelled with another consumer cluster (any, while
/// unpinned), then the pin's own objects (metadata, paged) for one not younger than the pin.
async fn first(
    api: &Api<DynamicObject>,
    whose: Whose<'_>,
    skip: &[&str],
    names: &[String],
) -> Result<Option<String>, kube::Error> {
    let mine = |o: &kube::core::ObjectMeta| {
        let label = o.labels.as_ref().and_then(|l| l.get(CONSUMER_CLUSTER));
        let created = o.creation_timestamp.as_ref().map(|t| t.0);
        !counts(whose.pin, whose.pinned, label.map(String::as_str), created)
    };
    // What a namespace holds from its creation is skipped only unlabelled: an object labelled
    // with a consumer cluster is a consumer's, whatever its name or type.
    let skipped = |o: &kube::core::ObjectMeta| {
        let name = o.name.as_deref().unwrap_or_default();
        let labelled = o
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONSUMER_CLUSTER));
        !labelled && skip.contains(&format!("metadata.name!={name}").as_str())
    };
    if !names.is_empty() {
        for n in names {
            if let Some(o) = api.get_metadata_opt(n).await?
                && !skipped(&o.metadata)
                && !mine(&o.metadata)
            {
                return Ok(o.metadata.name);
            }
        }
        return Ok(None);
    }
    let mut unlabelled = ListParams::default().labels(&format!("!{CONSUMER_CLUSTER}"));
    if !skip.is_empty() {
        unlabelled = unlabelled.fields(&skip.join(","));
    }
    let others = match whose.pin {
        None => CONSUMER_CLUSTER.to_string(),
        Some(pin) => format!("{CONSUMER_CLUSTER},{CONSUMER_CLUSTER}!={pin}"),
    };
    for lp in [unlabelled, ListParams::default().labels(&others)] {
        let found = api.list_metadata(&lp.limit(1)).await?;
        if let Some(o) = found.items.into_iter().next() {
            return Ok(o.metadata.name);
        }
    }
    let Some(pin) = whose.pin else {
        return Ok(None);
    };
    let own = ListParams::default().labels(&format!("{CONSUMER_CLUSTER}={pin}"));
    let older = list::map_metadata(api, &own, |o| {
        (!mine(&o.metadata)).then_some(o.metadata.name)
    })
    .await?;
    Ok(older.into_iter().flatten().flatten().next())
}

/// The resource `group`/`resource` as served, the group read once per run; `None` when the
/// group is not served.
pub(super) async fn discovered(
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
                return Err(format!("discovering API group {group:?}: {}", e));
            }
        };
        groups.insert(group.to_string(), g);
    }
    let Some(g) = groups.get(group).and_then(Option::as_ref) else {
        return Ok(None);
    };
    // Any version serving it, the preferred first: a resource may be served at a version the
    // group does not prefer, and two of a group's resources may share a kind.
    let preferred = g.preferred_version_or_latest().to_string();
    let versions = std::iter::once(preferred.as_str()).chain(g.versions());
    for v in versions {
        if let Some((ar, _)) = g
            .versioned_resources(v)
            .into_iter()
            .find(|(ar, _)| ar.plural == resource)
        {
            return Ok(Some(ar));
        }
    }
    // The group is served but not this resource: fail closed, a person decides.
    Err(format!(
        "API group {group:?} serves no resource {resource:?}"
    ))
}
