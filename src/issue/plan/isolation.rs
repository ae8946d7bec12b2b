//! Read isolation (docs/issue.md "Read isolation"): who holds each provider namespace and
//! cluster-scoped API across every Grant, why a Grant is refused, and what a refused Grant still
//! loses. Pure; table tests in `plan/tests.rs`.

use std::collections::BTreeMap;

use crate::api::catalog::ClusterScopedAccess;
use crate::api::iam::GrantSpec;

use super::render::{self, Desired, GrantRef, Kind, Resolved, Slot};
use super::{
    Blocked, CLUSTER_SCOPED_API_TAKEN, Catalog, Config, Issued, NAMESPACE_RESERVED,
    NAMESPACE_TAKEN, NAMESPACES_REQUIRED, Provider, resolve,
};
use k8s_openapi::jiff::Timestamp;

/// Who holds what across every Grant: each provider namespace belongs to the oldest Grant
/// naming it; each cluster-scoped exported API to the oldest Grant reaching it, plus, when
/// every Export listing it says `clusterScopedAccess: Shared`, every later one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenancy {
    pub namespace_owner: BTreeMap<String, String>,
    /// Cluster-scoped API name to the Grants holding it, oldest first.
    pub cluster_grantees: BTreeMap<String, Vec<String>>,
}

/// One Grant as [`tenancy`] reads it.
pub struct GrantView<'a> {
    pub name: &'a str,
    pub created: Option<Timestamp>,
    pub spec: &'a GrantSpec,
}

/// Whether a cluster-scoped API may be held by more than one Grant: every Export listing it
/// opts in (one Export saying `Exclusive` keeps it exclusive).
fn shareable(api: &str, catalog: &Catalog) -> bool {
    let mut listing = catalog
        .exports
        .values()
        .filter(|e| e.apis.iter().any(|a| a.name == api))
        .peekable();
    listing.peek().is_some()
        && listing.all(|e| e.cluster_scoped_access == ClusterScopedAccess::Shared)
}

/// Who holds each namespace and cluster-scoped API, oldest Grant first (creation time, then
/// name). Deleting Grants still hold theirs until they are gone.
pub fn tenancy(grants: &[GrantView<'_>], catalog: &Catalog) -> Tenancy {
    let mut order: Vec<&GrantView<'_>> = grants.iter().collect();
    order.sort_by_key(|g| (g.created, g.name));
    let mut t = Tenancy::default();
    for g in order {
        for ns in &g.spec.namespaces {
            t.namespace_owner
                .entry(ns.clone())
                .or_insert_with(|| g.name.to_string());
        }
        let Ok(r) = resolve(g.spec, catalog) else {
            continue;
        };
        for a in r.apis.iter().filter(|a| !a.namespaced) {
            let holders = t.cluster_grantees.entry(a.name.clone()).or_default();
            if holders.is_empty() || shareable(&a.name, catalog) {
                holders.push(g.name.to_string());
            }
        }
    }
    t
}

/// A namespace no Grant may name: the grants namespace (every consumer's kubeconfig Secret)
/// and the cluster's own (`kube-*`).
fn reserved(ns: &str, cfg: &Config) -> bool {
    ns == cfg.namespace || ns.starts_with("kube-")
}

/// Where the Grant stands against every other: its namespaces and cluster-scoped APIs its
/// own, or shared by consent. `Ok`: the cluster-scoped APIs it shares.
pub fn isolation(
    grant: &str,
    r: &Resolved,
    tenancy: &Tenancy,
    cfg: &Config,
) -> Result<Vec<String>, Blocked> {
    let namespaced: Vec<&str> = r
        .apis
        .iter()
        .filter(|a| a.namespaced)
        .map(|a| a.name.as_str())
        .collect();
    if r.namespaces.is_empty() && !namespaced.is_empty() {
        return Err(Blocked {
            reason: NAMESPACES_REQUIRED,
            message: format!(
                "{} namespaced: set spec.namespaces to the provider namespaces this consumer may sync into (its own namespace names); without them nothing is issued for it, as a cluster-wide grant would let it read every other consumer's objects",
                namespaced.join(", ")
            ),
        });
    }
    if let Some(ns) = r.namespaces.iter().find(|ns| reserved(ns, cfg)) {
        return Err(Blocked {
            reason: NAMESPACE_RESERVED,
            message: format!(
                "namespace {ns} cannot be granted (the grants namespace and kube-* are reserved): name another in spec.namespaces"
            ),
        });
    }
    for ns in &r.namespaces {
        match tenancy.namespace_owner.get(ns) {
            Some(owner) if owner != grant => {
                return Err(Blocked {
                    reason: NAMESPACE_TAKEN,
                    message: format!(
                        "namespace {ns} belongs to Grant {owner} (the oldest Grant naming it): a namespace is one consumer's; name another in spec.namespaces"
                    ),
                });
            }
            _ => {}
        }
    }
    let mut shared = Vec::new();
    for a in r.apis.iter().filter(|a| !a.namespaced) {
        let holders = tenancy
            .cluster_grantees
            .get(&a.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if !holders.iter().any(|h| h == grant) {
            return Err(Blocked {
                reason: CLUSTER_SCOPED_API_TAKEN,
                message: format!(
                    "{} is cluster-scoped and Grant {} holds it: RBAC cannot keep one consumer's cluster-scoped objects from another, so it is granted to one Grant unless every Export listing it sets spec.clusterScopedAccess: Shared",
                    a.name,
                    holders.first().map_or("another", String::as_str)
                ),
            });
        }
        if holders.len() > 1 {
            shared.push(a.name.clone());
        }
    }
    Ok(shared)
}

/// What a Grant blocked by read isolation still loses: RBAC only ever shrinks while it waits.
/// Its ClusterRole, when issued, is rewritten without what it may no longer hold (a namespaced
/// API cluster-wide, as issued before 0.3; a cluster-scoped API another Grant holds), and the
/// per-namespace RBAC of namespaces it no longer holds is deleted. Nothing is created.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reduction {
    pub cluster_role: Option<Desired>,
    pub stale: Vec<Slot>,
}

/// The reduction of a Grant `plan_grant` refused for read isolation (docs/issue.md "Read
/// isolation"); empty when its Export does not resolve or nothing is to reduce.
pub fn reduce(
    owner: GrantRef<'_>,
    spec: &GrantSpec,
    issued: &Issued,
    p: &Provider<'_>,
) -> Reduction {
    let grant = owner.name;
    let Ok(mut r) = resolve(spec, p.catalog) else {
        return Reduction::default();
    };
    r.apis.retain(|a| {
        a.namespaced
            || p.tenancy
                .cluster_grantees
                .get(&a.name)
                .is_some_and(|h| h.iter().any(|g| g == grant))
    });
    r.namespaces.retain(|ns| {
        p.tenancy.namespace_owner.get(ns).map(String::as_str) == Some(grant) && !reserved(ns, p.cfg)
    });
    let role = render::objects(&r, &p.cfg.namespace, owner, p.cfg.confinement, None)
        .into_iter()
        .find(|d| d.kind == Kind::ClusterRole);
    let cluster_role = role.filter(|d| issued.hashes.get(&d.slot()).is_some_and(|h| *h != d.hash));
    let mut stale: Vec<Slot> = issued
        .hashes
        .keys()
        .filter(|(k, ns)| k.per_tenant_namespace() && !r.namespaces.contains(ns))
        .cloned()
        .collect();
    stale.sort_by_key(|(k, ns)| (*k != Kind::TenantRoleBinding, ns.clone()));
    Reduction {
        cluster_role,
        stale,
    }
}

/// The Ready=False reasons of read isolation: a Grant refused for one of them still has its
/// RBAC reduced ([`reduce`]).
pub fn is_isolation(reason: &str) -> bool {
    [
        NAMESPACES_REQUIRED,
        NAMESPACE_TAKEN,
        NAMESPACE_RESERVED,
        CLUSTER_SCOPED_API_TAKEN,
        super::HANDOVER_APPROVAL_REQUIRED,
    ]
    .contains(&reason)
}
