//! The pin check's LISTs (docs/issue.md "Confinement", item 3): which provider objects already
//! carry the consumer cluster UIDs that unpinned Grants' heartbeats name, and who holds their
//! place.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::iam::Grant;
use crate::issue::IssueError;
use crate::pass::StatusCode;

use super::super::plan::{Catalog, Holder, Issued};
use super::super::render::Kind;
use super::handover;

/// Of the UIDs the heartbeats of unpinned Grants name, those already carried
/// (`core.kbind.io/consumer-cluster`) by provider objects, with who holds the place of the
/// first one found ([`holder`]): an unpinned Grant's identity can have written none of them,
/// so such a UID pins only with a person's approval (docs/issue.md "Confinement"). Only while
/// a Grant waits for its pin, and not for a UID another Grant holds (it is taken whatever is
/// found) or one a person approved for it: per UID, pages of one labelled metadata LIST per
/// [`carriers`] until an object turns up, so no tenant can make a run read every object of a
/// large consumer.
pub(super) async fn in_use(
    client: &Client,
    grants_ns: &str,
    (grants, everyone): (&[Grant], &[Grant]),
    issued: &BTreeMap<String, Issued>,
    (catalog, tenancy): (&Catalog, &super::super::plan::Tenancy),
) -> Result<super::super::plan::InUse, IssueError> {
    let pinned: BTreeSet<&str> = everyone
        .iter()
        .filter_map(|g| g.status.as_ref()?.consumer_cluster.as_deref())
        .collect();
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
        let approved = g
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::api::iam::APPROVE_CONSUMER_CLUSTER));
        if let Some(i) = issued.get(name) {
            let grant = super::super::render::GrantRef {
                name,
                uid: "",
                created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
            };
            uids.extend(
                super::super::plan::candidates(grant, &i.leases)
                    .into_iter()
                    .filter(|u| !pinned.contains(u.as_str()) && approved != Some(u)),
            );
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
            // Grant of the run; an object found later says more.
            let found = match source {
                Ok(ar) => first_carrying(client, (ar, api.as_deref()), &uid, grants_ns)
                    .await
                    .map_err(|e| format!("listing {what}: {}", e)),
                Err(why) => Err(why.clone()),
            };
            match found {
                Ok(None) => {}
                Ok(Some((ns, name))) => {
                    let owner = holder(everyone, issued, tenancy, (api.as_deref(), ns.as_deref()));
                    let place = ns.as_ref().map(|n| format!("{n}/")).unwrap_or_default();
                    seen.retain(|(h, _)| *h != Holder::Unchecked);
                    seen.push((owner, format!("{what} {place}{name}")));
                    break;
                }
                Err(why) => {
                    if !seen.iter().any(|(h, _)| *h == Holder::Unchecked) {
                        seen.push((Holder::Unchecked, why));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The first object of `ar` (of exported CRD `crd`, if it is one) labelled with `uid`, page by
/// page (100 a page), but a heartbeat: a Lease in the grants namespace named after the Grant
/// its label names carries a UID to pin, and is all of Leases an identity may write
/// (kbind-grant-identities).
async fn first_carrying(
    client: &Client,
    (ar, crd): (&kube::api::ApiResource, Option<&str>),
    uid: &str,
    grants_ns: &str,
) -> Result<Option<(Option<String>, String)>, kube::Error> {
    let api = Api::<kube::api::DynamicObject>::all_with(client.clone(), ar);
    let leases = ar.group == "coordination.k8s.io" && ar.plural == "leases";
    let mut lp = ListParams::default()
        .labels(&super::super::plan::labelled_with(uid))
        .limit(100);
    loop {
        let page = match api.list_metadata(&lp).await {
            Ok(page) => page,
            Err(e) if e.is_not_found() => {
                return match crd {
                    Some(name) if !established(client, name).await? => Ok(None),
                    _ => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        for m in page.items {
            let heartbeat = leases
                && m.metadata.namespace.as_deref() == Some(grants_ns)
                && m.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::api::iam::GRANT_KEY))
                    .is_some_and(|g| {
                        m.metadata.name.as_deref()
                            == Some(super::super::render::object_name(g).as_str())
                    });
            if !heartbeat {
                return Ok(Some((
                    m.metadata.namespace,
                    m.metadata.name.unwrap_or_default(),
                )));
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(None),
        }
    }
}

/// Whether exported CRD `name` exists and is Established. A LIST answering 404 holds nothing
/// when it does not: exported a moment ago (served once the apiserver has accepted its names)
/// or deleted since the catalog was read, and a pin must not wait for a person over that. An
/// Established one answering 404 (its version no longer served, objects kept under another)
/// stays a place the issuer could not look.
async fn established(client: &Client, name: &str) -> Result<bool, kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(name)
        .await?;
    Ok(crd
        .and_then(|c| c.status)
        .and_then(|s| s.conditions)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        }))
}

/// Where objects carrying a consumer cluster UID can be, each with what a message calls it
/// and its exported API's name (none for a permission resource): every exported CRD serving
/// a version (one serving none holds nothing anyone can read or write), and every resource
/// any Export's `spec.permissions` let an identity write (a revoked Grant's Export may be any
/// of them). `Err`: why the issuer cannot list it (a `*`, a rule reaching past what it names,
/// a failed discovery, an exported CRD it cannot decode, served or not). A CRD no longer exported is looked at when it is granted again (the
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
    // One it cannot decode may hold objects all the same: it cannot look through it.
    out.extend(catalog.undecodable.iter().map(|(name, why)| {
        let what = format!("exported CRD {name}");
        let why = format!("{what} cannot be read: {why}");
        (what, Some(name.clone()), Err(why))
    }));
    // Any Export's: what a rule cannot be looked through for names the Export holding it.
    let mut written: Vec<Target> = Vec::new();
    for (export, e) in &catalog.exports {
        for t in written_targets(&e.permissions) {
            let t = match t {
                Target::Unlistable(why) => Target::Unlistable(format!("Export {export}: {why}")),
                t => t,
            };
            if !written.contains(&t) {
                written.push(t);
            }
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

#[cfg(test)]
mod tests {
    use http::{Request, Response, StatusCode as Http};
    use kube::client::Body;

    use super::*;

    /// `first_carrying` on exported CRD `widgets.example.test` against an apiserver answering
    /// its LIST with `status` and `body`, and a GET of the CRD with `crd` (404 when `None`).
    async fn first_carrying_when(
        status: Http,
        body: serde_json::Value,
        crd: Option<serde_json::Value>,
    ) -> Result<Option<(Option<String>, String)>, kube::Error> {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let (code, body) =
                    match (req.uri().path().contains("customresourcedefinitions"), &crd) {
                        (false, _) => (status, body.clone()),
                        (true, Some(c)) => (Http::OK, c.clone()),
                        (true, None) => (Http::NOT_FOUND, self::status(404, "NotFound")),
                    };
                let mut r = Response::new(Body::from(body.to_string().into_bytes()));
                *r.status_mut() = code;
                send.send_response(r);
            }
        });
        let ar = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("example.test", "v1", "Widget"),
            "widgets",
        );
        let crd = Some("widgets.example.test");
        let found =
            first_carrying(&Client::new(mock, "default"), (&ar, crd), "uid-1", "grants").await;
        server.abort();
        found
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": "refused"})
    }

    fn crd(established: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.test"},
            "spec": {"group": "example.test", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true}]},
            "status": {"conditions": [{"type": "Established", "status": established}]}})
    }

    /// An exported CRD not served yet (not Established) or gone holds nothing; one Established
    /// whose LIST answers 404 (its version no longer served, objects kept under another) and a
    /// refused LIST stay errors (the UID then waits for a person); an object found is named.
    #[tokio::test]
    async fn an_api_not_served_carries_nothing_and_a_refusal_stays_an_error() {
        let not_found = || status(404, "NotFound");
        for crd in [None, Some(crd("False"))] {
            let found = first_carrying_when(Http::NOT_FOUND, not_found(), crd.clone()).await;
            assert_eq!(found.unwrap(), None, "{crd:?}");
        }
        let served = first_carrying_when(Http::NOT_FOUND, not_found(), Some(crd("True"))).await;
        assert!(served.unwrap_err().is_not_found());

        let refused = first_carrying_when(Http::FORBIDDEN, status(403, "Forbidden"), None).await;
        assert!(refused.unwrap_err().is_forbidden());

        let list = serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {}, "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "w1", "namespace": "team"}}]});
        let found = first_carrying_when(Http::OK, list, None).await;
        assert_eq!(found.unwrap(), Some((Some("team".into()), "w1".into())));
    }
}
