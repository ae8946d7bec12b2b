//! What `kbind issue` reads each run: Grants, the catalog, exported CRDs, and everything issued
//! (found by the label `iam.kbind.io/grant`), in a fixed number of paginated LISTs.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::api::catalog::{Collection, Export};
use crate::api::iam::{EXPIRES_AT, GRANT_KEY, Grant, SERVICE_ACCOUNT_UID, SPEC_HASH};
use crate::api::keys::EXPORTED;
use crate::pass::list;

mod handover;
mod heartbeats;
mod in_use;

use heartbeats::heartbeats;
pub use heartbeats::{Changes, changed, heartbeat_came};

use super::IssueError;
use super::args::Confinement;
use super::plan::handover::Finding;
use super::plan::{Catalog, Issued, SecretObs};
use super::render::{KUBECONFIG_KEY, Kind, ResolvedApi};

/// Everything one run works from.
pub struct Observed {
    /// The Grants this run works on (`--selector`'s, or all).
    pub grants: Vec<Grant>,
    /// Who holds each namespace and cluster-scoped API, from every Grant (selected or not).
    pub tenancy: super::plan::Tenancy,
    /// The provider's namespaces.
    pub namespaces: BTreeSet<String>,
    /// Of the UIDs unpinned Grants' heartbeats name, those other Grants' objects carry.
    pub in_use: super::plan::InUse,
    /// Every consumer cluster pinned, to the Grant pinning it, over every Grant (selected or
    /// not): a run with `--selector` must not pin to one Grant what another holds.
    pub pinned: BTreeMap<String, String>,
    /// Per Grant, the namespaces and cluster-scoped APIs it would newly hold that hold another
    /// consumer's objects, or could not be looked at, not approved (see [`handover::handover`]).
    pub handover: BTreeMap<String, Vec<(String, Finding)>>,
    pub exports: Vec<Export>,
    pub catalog: Catalog,
    /// What is issued, by Grant name (including Grants that no longer exist).
    pub issued: BTreeMap<String, Issued>,
}

fn listed(what: &str, ns: Option<&str>) -> impl Fn(kube::Error) -> IssueError {
    let what = match ns {
        Some(ns) => format!("{what} in {ns}"),
        None => what.to_string(),
    };
    move |source| IssueError::List {
        what: what.clone(),
        source,
    }
}

/// LIST every object of kind `K` labelled with a Grant, as (grant, metadata).
async fn labelled<K>(
    api: Api<K>,
    what: &str,
    ns: Option<&str>,
) -> Result<Vec<(String, K)>, IssueError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let lp = ListParams::default().labels(GRANT_KEY);
    let items = list::all(&api, &lp).await.map_err(listed(what, ns))?;
    Ok(items
        .into_iter()
        .filter_map(|o| {
            let g = o.meta().labels.as_ref()?.get(GRANT_KEY)?.clone();
            Some((g, o))
        })
        .collect())
}

/// LIST the metadata of every object of kind `K` labelled with a Grant and named after it, as
/// (grant, metadata cut down to what [`note`] reads). Roles and RoleBindings are listed in
/// every namespace, where tenants may create labelled objects too: each is reduced as its page
/// arrives, so their number and size cannot push the issuer past its memory limit.
async fn labelled_meta<K>(
    api: Api<K>,
    what: &str,
    ns: Option<&str>,
) -> Result<Vec<(String, ObjectMeta)>, IssueError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let lp = ListParams::default().labels(GRANT_KEY);
    let items = list::map_metadata(&api, &lp, |o| {
        let m = o.metadata;
        let g = m.labels.as_ref()?.get(GRANT_KEY)?.clone();
        // Only the object of the expected name counts (anything else labelled is not ours).
        if m.name.as_deref() != Some(&super::render::object_name(&g)) {
            return None;
        }
        let hash = spec_hash(&m);
        let kept = ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            // Only the owning Grant's UID is read (a ServiceAccount's): every other field of a
            // reference, and a UID past 64 characters, is no Grant's and could be huge.
            owner_references: m.owner_references.map(|o| {
                o.into_iter()
                    .filter(|r| r.kind == "Grant" && r.uid.len() <= 64)
                    .take(1)
                    .map(|r| OwnerReference {
                        kind: r.kind,
                        uid: r.uid,
                        ..Default::default()
                    })
                    .collect()
            }),
            // The issuer writes 24 hex digits; anything past 64 is not one it wrote.
            annotations: (hash.len() <= 64).then(|| [(SPEC_HASH.to_string(), hash)].into()),
            ..Default::default()
        };
        Some((g, kept))
    })
    .await
    .map_err(listed(what, ns))?;
    Ok(items.into_iter().flatten().collect())
}

/// What keeps the shipped policies confining issued identities from being in force, one line
/// each (docs/issue.md "Confinement"); empty when both are.
pub async fn confinement_gaps(c: &Client) -> Result<Vec<String>, IssueError> {
    let mut gaps = Vec::new();
    for name in super::confinement::SHIPPED {
        let read = |what: &str| {
            let what = format!("{what} {name}");
            move |source| IssueError::Read { what, source }
        };
        let policy = Api::<ValidatingAdmissionPolicy>::all(c.clone())
            .get_opt(name)
            .await
            .map_err(read("ValidatingAdmissionPolicy"))?;
        let binding = Api::<ValidatingAdmissionPolicyBinding>::all(c.clone())
            .get_opt(name)
            .await
            .map_err(read("ValidatingAdmissionPolicyBinding"))?;
        gaps.extend(super::confinement::gaps(&super::confinement::Observed {
            name,
            policy: policy.as_ref(),
            binding: binding.as_ref(),
        }));
    }
    Ok(gaps)
}

fn spec_hash(meta: &ObjectMeta) -> String {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(SPEC_HASH))
        .cloned()
        .unwrap_or_default()
}

/// Record each object of `kind` (or, outside the grants namespace `ns`, of `tenant`: the
/// per-namespace kind) under its Grant.
fn note(
    issued: &mut BTreeMap<String, Issued>,
    (kind, tenant): (Kind, Kind),
    ns: &str,
    items: Vec<(String, ObjectMeta)>,
) {
    for (g, o) in items {
        let slot = match o.namespace.as_deref() {
            Some(n) if n != ns && tenant.per_tenant_namespace() => (tenant, n.to_string()),
            Some(n) if n != ns => continue,
            _ => (kind, String::new()),
        };
        let entry = issued.entry(g).or_default();
        entry.hashes.insert(slot, spec_hash(&o));
        if kind == Kind::ServiceAccount {
            entry.sa_uid = o.uid.clone();
            entry.sa_owner = o
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.kind == "Grant")
                .map(|r| r.uid.clone());
        }
    }
}

/// The issued Secret's token, expiry and kubeconfig; the token is registered for scrubbing.
pub fn secret_obs(s: &Secret) -> SecretObs {
    let ann = s.metadata.annotations.clone().unwrap_or_default();
    let kubeconfig =
        crate::secrets::key_bytes(s, KUBECONFIG_KEY).and_then(|b| String::from_utf8(b).ok());
    let token = kubeconfig.as_deref().and_then(|text| {
        use secrecy::ExposeSecret;
        let kc = kube::config::Kubeconfig::from_yaml(text).ok()?;
        let t = kc
            .auth_infos
            .first()?
            .auth_info
            .as_ref()?
            .token
            .as_ref()?
            .expose_secret()
            .to_string();
        crate::scrub::register_secret(&t);
        Some(t)
    });
    SecretObs {
        expires_at: ann
            .get(EXPIRES_AT)
            .and_then(|t| t.parse::<Timestamp>().ok()),
        sa_uid: ann.get(SERVICE_ACCOUNT_UID).cloned().unwrap_or_default(),
        token,
        kubeconfig,
    }
}

pub async fn observe(
    client: &Client,
    ns: &str,
    selector: Option<&str>,
    confinement: Confinement,
) -> Result<Observed, IssueError> {
    let lp = ListParams::default();
    let glp = match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    let grants = list::all(&Api::<Grant>::all(client.clone()), &glp)
        .await
        .map_err(listed("Grants", None))?;
    let (exports, catalog) = catalog(client).await?;
    // Ownership is decided over every Grant: a selected run must not hand out what an
    // unselected, older Grant holds.
    let everyone = match selector {
        Some(_) => list::all(&Api::<Grant>::all(client.clone()), &lp)
            .await
            .map_err(listed("Grants", None))?,
        None => grants.clone(),
    };
    let views: Vec<super::plan::GrantView<'_>> = everyone
        .iter()
        .filter_map(|g| {
            Some(super::plan::GrantView {
                name: g.metadata.name.as_deref()?,
                created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
                spec: &g.spec,
            })
        })
        .collect();
    let tenancy = super::plan::tenancy(&views, &catalog);
    let (namespaces, made) = namespaces(client).await?;
    let issued = issued(client, ns, confinement).await?;
    let pinned = everyone
        .iter()
        .filter_map(|g| {
            let uid = g.status.as_ref()?.consumer_cluster.clone()?;
            Some((uid, g.metadata.name.clone()?))
        })
        .collect();
    let in_use = in_use::in_use(
        client,
        ns,
        (&grants, &everyone),
        &issued,
        (&catalog, &tenancy),
    )
    .await?;
    let handover = handover::handover(
        client,
        &grants,
        &issued,
        (&catalog, &tenancy),
        (&namespaces, &made),
    )
    .await;
    Ok(Observed {
        grants,
        in_use,
        pinned,
        handover,
        tenancy,
        namespaces,
        exports,
        catalog,
        issued,
    })
}

/// The provider's catalog: Exports, Collections and exported CRDs.
async fn catalog(client: &Client) -> Result<(Vec<Export>, Catalog), IssueError> {
    let lp = ListParams::default();
    let exports = list::all(&Api::<Export>::all(client.clone()), &lp)
        .await
        .map_err(listed("Exports", None))?;
    let collections = list::all(&Api::<Collection>::all(client.clone()), &lp)
        .await
        .map_err(listed("Collections", None))?;
    let crd_lp = ListParams::default().labels(&format!("{EXPORTED}=true"));
    let (exported, undecodable) = list::map_decodable(
        &Api::<CustomResourceDefinition>::all(client.clone()),
        &crd_lp,
        |c| ResolvedApi {
            name: format!("{}.{}", c.spec.names.plural, c.spec.group),
            group: c.spec.group,
            namespaced: c.spec.scope != "Cluster",
            // A version objects can be read at: the storage version when served, else any
            // served one; none (empty) when no version is served.
            version: c
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .max_by_key(|v| v.storage)
                .map(|v| v.name.clone())
                .unwrap_or_default(),
            plural: c.spec.names.plural,
        },
    )
    .await
    .map_err(listed("exported CRDs", None))?;
    let catalog = Catalog {
        exports: exports
            .iter()
            .filter_map(|e| Some((e.metadata.name.clone()?, e.spec.clone())))
            .collect(),
        collections: collections
            .into_iter()
            .filter_map(|c| Some((c.metadata.name?, c.spec)))
            .collect(),
        exported: exported.into_iter().map(|a| (a.name.clone(), a)).collect(),
        undecodable: undecodable.into_iter().collect(),
    };
    for (name, why) in &catalog.undecodable {
        tracing::warn!(crd = %name, error = %why, "an exported CRD cannot be read; no Grant gets it");
    }
    Ok((exports, catalog))
}

/// Namespaces the issuer created for a Grant, per namespace: the Grant and when.
type Made = BTreeMap<String, (String, Timestamp)>;

/// The provider's namespaces, and those the issuer created for a Grant (labelled with it; only
/// the issuer and namespace admins can write that label).
async fn namespaces(client: &Client) -> Result<(BTreeSet<String>, Made), IssueError> {
    let listed_namespaces = list::metadata(
        &Api::<Namespace>::all(client.clone()),
        &ListParams::default(),
    )
    .await
    .map_err(listed("Namespaces", None))?;
    let made: Made = listed_namespaces
        .iter()
        .filter_map(|n| {
            let grant = n.metadata.labels.as_ref()?.get(GRANT_KEY)?.clone();
            let created = n.metadata.creation_timestamp.as_ref()?.0;
            Some((n.metadata.name.clone()?, (grant, created)))
        })
        .collect();
    let namespaces = listed_namespaces
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    Ok((namespaces, made))
}

/// Everything issued, by Grant label: ServiceAccounts, RBAC, per-Grant policies (with
/// `--confinement per-grant`), kubeconfig Secrets, heartbeat Leases.
async fn issued(
    c: &Client,
    ns: &str,
    confinement: Confinement,
) -> Result<BTreeMap<String, Issued>, IssueError> {
    let mut issued: BTreeMap<String, Issued> = BTreeMap::new();
    let one = |k: Kind| (k, k);
    note(
        &mut issued,
        one(Kind::ServiceAccount),
        ns,
        labelled_meta(
            Api::<ServiceAccount>::namespaced(c.clone(), ns),
            "ServiceAccounts",
            Some(ns),
        )
        .await?,
    );
    // Roles and RoleBindings in every namespace: the grants namespace's and each Grant's
    // per-namespace ones.
    note(
        &mut issued,
        (Kind::Role, Kind::TenantRole),
        ns,
        labelled_meta(Api::<Role>::all(c.clone()), "Roles", None).await?,
    );
    note(
        &mut issued,
        (Kind::RoleBinding, Kind::TenantRoleBinding),
        ns,
        labelled_meta(Api::<RoleBinding>::all(c.clone()), "RoleBindings", None).await?,
    );
    note(
        &mut issued,
        one(Kind::ClusterRole),
        ns,
        labelled_meta(Api::<ClusterRole>::all(c.clone()), "ClusterRoles", None).await?,
    );
    note(
        &mut issued,
        one(Kind::ClusterRoleBinding),
        ns,
        labelled_meta(
            Api::<ClusterRoleBinding>::all(c.clone()),
            "ClusterRoleBindings",
            None,
        )
        .await?,
    );
    // Per-Grant policies only where the issuer writes them: with the shipped ones it may not
    // even list admission policies (those a 0.2 issuer wrote are left; docs/upgrade.md).
    if confinement == Confinement::PerGrant {
        policies(&mut issued, c, ns).await?;
    }
    for (g, s) in labelled(
        Api::<Secret>::namespaced(c.clone(), ns),
        "Secrets",
        Some(ns),
    )
    .await?
    {
        if s.metadata.name.as_deref() == Some(&super::render::object_name(&g)) {
            issued.entry(g).or_default().secret = Some(secret_obs(&s));
        }
    }
    for (g, beats) in heartbeats(c, ns).await? {
        issued.entry(g).or_default().leases = beats;
    }
    Ok(issued)
}

/// The per-Grant admission policies and their bindings (`--confinement per-grant`).
async fn policies(
    issued: &mut BTreeMap<String, Issued>,
    c: &Client,
    ns: &str,
) -> Result<(), IssueError> {
    note(
        issued,
        (Kind::Policy, Kind::Policy),
        ns,
        labelled_meta(
            Api::<ValidatingAdmissionPolicy>::all(c.clone()),
            "ValidatingAdmissionPolicies",
            None,
        )
        .await?,
    );
    note(
        issued,
        (Kind::PolicyBinding, Kind::PolicyBinding),
        ns,
        labelled_meta(
            Api::<ValidatingAdmissionPolicyBinding>::all(c.clone()),
            "ValidatingAdmissionPolicyBindings",
            None,
        )
        .await?,
    );
    Ok(())
}
