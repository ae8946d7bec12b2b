//! ClusterBindings and Bindings flattened into one shape, as every pass that reads them needs:
//! one paginated LIST of each kind, sorted by key (ClusterBindings first).

use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};

use crate::api::core::{
    ApiRef, Binding, BindingStatus, ClusterBinding, ConflictPolicy, OrphanPolicy,
};
use crate::pass::list;
use crate::schema::plan::BindingKey;

/// A binding of either kind as observed.
#[derive(Clone, Debug)]
pub struct ObservedBinding {
    pub key: BindingKey,
    pub connection: String,
    pub apis: Vec<String>,
    pub conflict_policy: ConflictPolicy,
    pub orphans: OrphanPolicy,
    pub generation: Option<i64>,
    pub status: BindingStatus,
    pub deleting: bool,
    pub uid: String,
    pub finalizers: Vec<String>,
    pub owner_uids: Vec<String>,
}

fn observed<K: Resource>(
    b: &K,
    namespace: Option<String>,
    connection: &str,
    apis: &[ApiRef],
    (policy, orphans): (ConflictPolicy, OrphanPolicy),
    status: &Option<BindingStatus>,
) -> ObservedBinding {
    let m = b.meta();
    ObservedBinding {
        key: BindingKey {
            namespace,
            name: m.name.clone().unwrap_or_default(),
        },
        connection: connection.to_string(),
        apis: apis.iter().map(|a| a.name.clone()).collect(),
        conflict_policy: policy,
        orphans,
        generation: m.generation,
        status: status.clone().unwrap_or_default(),
        deleting: m.deletion_timestamp.is_some(),
        uid: m.uid.clone().unwrap_or_default(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        owner_uids: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect(),
    }
}

/// Every ClusterBinding and Binding in the cluster, sorted by key.
pub async fn observe(client: &Client) -> Result<Vec<ObservedBinding>, kube::Error> {
    let lp = ListParams::default();
    let cbs = list::all(&Api::<ClusterBinding>::all(client.clone()), &lp).await?;
    let bs = list::all(&Api::<Binding>::all(client.clone()), &lp).await?;
    let mut out: Vec<ObservedBinding> = cbs
        .iter()
        .map(|b| {
            observed(
                b,
                None,
                &b.spec.connection_ref.name,
                &b.spec.apis,
                (b.spec.conflict_policy, b.spec.orphans),
                &b.status,
            )
        })
        .collect();
    out.extend(bs.iter().map(|b| {
        observed(
            b,
            b.namespace(),
            &b.spec.connection_ref.name,
            &b.spec.apis,
            (b.spec.conflict_policy, b.spec.orphans),
            &b.status,
        )
    }));
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
