//! `kbind bind` steps 3-4: observe the consumer, decide per object (create, update, leave
//! alone, or refuse an object `kbind bind` did not write), then write by server-side apply.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use super::plan::{self, Action, Desired, Kind};
use super::{BindArgs, BindError, ObjectReport};
use crate::api::core::{Binding, ClusterBinding, Connection};
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::{CommonArgs, PassError};

/// Write `desired` to the consumer, refusing foreign objects and a Connection pinned to
/// another provider than `provider_uid`; what was done to each.
pub(super) async fn write(
    common: &CommonArgs,
    args: &BindArgs,
    desired: &[Desired],
    provider_uid: &str,
) -> Result<Vec<ObjectReport>, BindError> {
    // The consumer: compare first, refuse foreign objects, then write.
    let config = own_config(common).await?;
    let consumer = counted_client(config, Arc::new(RequestCounter::default()))
        .map_err(|e| PassError::kube("building the Kubernetes client", e))?;
    namespace_exists(
        &consumer,
        &args.credential_namespace,
        "--credential-namespace",
    )
    .await?;
    if let Some(ns) = &args.namespace {
        namespace_exists(&consumer, ns, "--namespace").await?;
    }
    let mut decided = Vec::new();
    for d in desired {
        let api = dynamic_api(&consumer, d);
        let have = api
            .get_opt(&d.name)
            .await
            .map_err(|source| BindError::ConsumerRequest {
                what: format!("reading {}", d.key()),
                source,
            })?
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null));
        if d.kind == Kind::Connection {
            plan::check_identity(&d.name, have.as_ref(), provider_uid)?;
        }
        decided.push(plan::decide(d, have.as_ref(), args.force)?);
    }
    let mut objects = Vec::new();
    for (d, action) in desired.iter().zip(decided) {
        if action != Action::Unchanged {
            dynamic_api(&consumer, d)
                .patch(
                    &d.name,
                    &PatchParams::apply(plan::MANAGER).force(),
                    &Patch::Apply(&d.body),
                )
                .await
                .map_err(|source| BindError::ConsumerRequest {
                    what: format!("writing {}", d.key()),
                    source,
                })?;
            tracing::info!(object = %d.key(), action = action.as_str(), "written");
        }
        objects.push(ObjectReport {
            kind: d.kind.as_str(),
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            action,
        });
    }
    Ok(objects)
}

async fn namespace_exists(consumer: &Client, ns: &str, what: &str) -> Result<(), BindError> {
    match Api::<Namespace>::all(consumer.clone()).get_opt(ns).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(BindError::NamespaceMissing {
            namespace: ns.into(),
            what: what.into(),
        }),
        Err(source) => Err(BindError::ConsumerRequest {
            what: format!("reading namespace {ns}"),
            source,
        }),
    }
}

fn dynamic_api(client: &Client, d: &Desired) -> Api<DynamicObject> {
    let ar = match d.kind {
        Kind::Secret => ApiResource::erase::<Secret>(&()),
        Kind::Connection => ApiResource::erase::<Connection>(&()),
        Kind::ClusterBinding => ApiResource::erase::<ClusterBinding>(&()),
        Kind::Binding => ApiResource::erase::<Binding>(&()),
    };
    match &d.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}
