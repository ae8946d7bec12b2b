//! ClusterBindings and Bindings flattened into one shape, as every pass that reads them needs:
//! one paginated LIST of each kind, sorted by key (ClusterBindings first); and the two writes
//! more than one pass makes to a binding of either kind, by [`BindingKey`]: its status (each pass
//! applies only the fields it owns, under its own field manager) and kbind's cleanup finalizer.

pub mod admission;

use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;

use crate::api::BindingKey;
use crate::api::core::{
    ApiRef, Binding, BindingStatus, ClusterBinding, ConflictPolicy, Connection, OrphanPolicy,
};
use crate::api::keys;
use crate::pass::finalizer;
use crate::pass::list;
use crate::pass::status::apply_status as apply_object_status;
use admission::{Admission, NamespaceLabels, admission, may_adopt};

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
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    pub finalizers: Vec<String>,
    pub owner_uids: Vec<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Whether its Connection serves it (always, for a ClusterBinding).
    pub admission: Admission,
    /// A Binding in a namespace its Connection lets adopt, or a ClusterBinding.
    pub may_adopt: bool,
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
        created: m.creation_timestamp.as_ref().map(|t| t.0),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        labels: m.labels.clone().unwrap_or_default(),
        admission: Admission::Admitted,
        may_adopt: true,
        owner_uids: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect(),
    }
}

/// Every ClusterBinding and Binding in the cluster, sorted by key, each Binding with whether
/// its Connection (among `connections`) admits its namespace; and the namespaces' UIDs when
/// they were read (a namespaced Binding exists, or `namespaces` asks for them).
pub async fn observe(
    client: &Client,
    connections: &[Connection],
    namespaces: bool,
) -> Result<(Vec<ObservedBinding>, admission::NamespaceUids), kube::Error> {
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
    let (labels, uids) = NamespaceLabels::read(client, namespaces || !bs.is_empty()).await;
    for b in &mut out {
        let Some(ns) = b.key.namespace.as_deref() else {
            continue;
        };
        let conn = connections.iter().find(|c| c.name_any() == b.connection);
        (b.admission, b.may_adopt) = match conn {
            Some(c) => (admission(c, ns, &labels), may_adopt(c, ns, &labels)),
            None => (
                Admission::NotAllowed(format!("Connection {} not found", b.connection)),
                false,
            ),
        };
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((out, uids))
}

/// Server-side apply `status` to the Binding or ClusterBinding `key` as `manager`.
pub async fn apply_status(
    client: &Client,
    manager: &str,
    key: &BindingKey,
    status: Value,
) -> Result<(), kube::Error> {
    match &key.namespace {
        Some(ns) => apply_object_status(
            &Api::<Binding>::namespaced(client.clone(), ns),
            &key.name,
            manager,
            status,
            None,
        )
        .await
        .map(|_| ()),
        None => apply_object_status(
            &Api::<ClusterBinding>::all(client.clone()),
            &key.name,
            manager,
            status,
            None,
        )
        .await
        .map(|_| ()),
    }
}

/// Add (or release) kbind's cleanup finalizer on the binding `key`.
pub async fn set_finalizer(
    client: &Client,
    manager: &str,
    key: &BindingKey,
    present: bool,
) -> Result<(), kube::Error> {
    let f = keys::CLEANUP_FINALIZER;
    match &key.namespace {
        Some(ns) => {
            let api = Api::<Binding>::namespaced(client.clone(), ns);
            finalizer::set(&api, &key.name, Some(ns), manager, f, present).await
        }
        None => {
            let api = Api::<ClusterBinding>::all(client.clone());
            finalizer::set(&api, &key.name, None, manager, f, present).await
        }
    }
}
