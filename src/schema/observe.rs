//! What `kbind schema` reads: the consumer's Connections, bindings and CRDs at the start of a
//! run, and per Connection its provider (credentials, identity, discovery), each provider
//! credential read once per pass and shared by the Connections using it.

use k8s_openapi::api::core::v1::Secret;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PartialObjectMeta};
use kube::discovery::ApiGroup;
use kube::{Api, Client, Resource};

use super::memo::Providers;
use super::plan::{BindingView, CrdMeta, Holding};
use super::{BindingObj, World};
use crate::api::core::Connection;
use crate::api::core::SecretKeyRef;
use crate::api::keys;
use crate::connection::refresh::{self, RefreshError, Refreshed};
use crate::connection::{self, CredentialError, CredentialPolicy};
use crate::pass::writes::Writes;
use crate::pass::{PassContext, PassError, StatusCode, finalizer, list};

pub(super) async fn observe(ctx: &PassContext, selector: Option<&str>) -> Result<World, PassError> {
    let client = ctx.client.clone();
    let lp = ListParams::default();
    let conn_lp = match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    let connections = connection::list(&client, &conn_lp)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if e.is_bad_request() => {
                PassError::Config(format!("--selector: {}", s.message))
            }
            _ => PassError::kube("listing Connections", e),
        })?;
    let (observed, _) = crate::bindings::observe(&client, &connections, false)
        .await
        .map_err(|e| PassError::kube("listing ClusterBindings and Bindings", e))?;
    let crds = list::map_metadata(
        &Api::<CustomResourceDefinition>::all(client.clone()),
        &lp,
        crd_meta,
    )
    .await
    .map_err(|e| PassError::kube("listing CustomResourceDefinitions", e))?
    .into_iter()
    .collect();
    let local_uid = connection::cluster_uid(&client)
        .await
        .map_err(|e| PassError::unreachable("reading the consumer cluster identity", e))?;
    let bindings: Vec<BindingObj> = observed.into_iter().map(BindingObj::from).collect();
    let views = bindings.iter().map(|b| b.view.clone()).collect();
    Ok(World {
        client,
        manager: ctx.field_manager(),
        local_uid,
        connections,
        bindings,
        views,
        crds,
        providers: Providers::default(),
        policy: CredentialPolicy::default(),
    })
}

/// What the plan reads of a consumer CRD.
fn crd_meta(m: PartialObjectMeta<CustomResourceDefinition>) -> (String, CrdMeta) {
    let labels = m.metadata.labels.unwrap_or_default();
    let ann = m.metadata.annotations.unwrap_or_default();
    let meta = CrdMeta {
        uid: m.metadata.uid.unwrap_or_default(),
        managed: labels.get(keys::MANAGED).is_some_and(|v| v == "true"),
        connection: ann.get(keys::CONNECTION).cloned(),
        schema_hash: ann.get(keys::SCHEMA_HASH).cloned(),
        created: ann.get(keys::CREATED).is_some_and(|v| v == "true"),
        deleting: m.metadata.deletion_timestamp.is_some(),
    };
    (m.metadata.name.unwrap_or_default(), meta)
}

impl From<crate::bindings::ObservedBinding> for BindingObj {
    fn from(b: crate::bindings::ObservedBinding) -> Self {
        BindingObj {
            view: BindingView {
                key: b.key,
                connection: b.connection,
                apis: b.apis,
                generation: b.generation,
                status: b.status,
                deleting: b.deleting,
                labels: b.labels,
                admission: b.admission,
            },
            uid: b.uid,
            finalizers: b.finalizers,
            owner_uids: b.owner_uids,
        }
    }
}

/// How far a Connection's Secret got: a provider client, or why not.
pub(super) struct Reached {
    /// The kubeconfig's fingerprint (empty when it did not validate): the key of its memo.
    pub fingerprint: String,
    pub provider: Result<Client, CredentialError>,
    /// The Secret exists, is not deleting, and lacks kbind's cleanup finalizer.
    pub secret_needs_finalizer: bool,
    /// Rotation by pull, for a Secret carrying `core.kbind.io/grant-secret` whose current
    /// kubeconfig validated; `None` otherwise.
    pub refresh: Option<Result<Refreshed, RefreshError>>,
}

impl World {
    /// Read the Connection's Secret now, every run (rotation needs no restart), and only in a
    /// credential namespace (docs/schema.md "Credentials"); pull a re-issued kubeconfig from
    /// the Grant's Secret when the Secret names one (src/connection/refresh.rs); build the
    /// provider client, once per credential and pass.
    pub(super) async fn reach(
        &mut self,
        ctx: &PassContext,
        conn: &Connection,
        writes: &mut Writes,
    ) -> Reached {
        let r = &conn.spec.kubeconfig_secret_ref;
        let secret = connection::read_secret(&self.client, &self.policy, r).await;
        let secret_needs_finalizer = matches!(&secret, Ok(Some(s))
            if s.meta().deletion_timestamp.is_none()
                && !finalizer::has(s.meta().finalizers.as_ref(), keys::CLEANUP_FINALIZER));
        let (secret, refresh) = match secret {
            Ok(Some(s)) => {
                let (s, refresh) = self.pull(ctx, r, s, writes).await;
                (Ok(Some(s)), refresh)
            }
            other => (other, None),
        };
        let pk = match secret {
            Ok(s) => connection::kubeconfig(s.as_ref(), r, &self.policy).await,
            Err(e) => Err(e),
        };
        let fingerprint = pk
            .as_ref()
            .map(|p| p.fingerprint.clone())
            .unwrap_or_default();
        let memo = self.providers.entry(&fingerprint, r);
        let provider = match (&pk, &memo.client) {
            (Ok(_), Some(c)) => Ok(c.clone()),
            (Ok(pk), None) => {
                connection::client(pk, r, ctx.counter.clone(), ctx.args.request_timeout).await
            }
            (Err(e), _) => Err(e.clone()),
        };
        Reached {
            fingerprint,
            provider,
            secret_needs_finalizer,
            refresh,
        }
    }

    /// Rotation by pull: only for a Secret annotated with its Grant's Secret, and only with a
    /// current kubeconfig that itself validates (the pull uses it). Returns the Secret to use.
    async fn pull(
        &mut self,
        ctx: &PassContext,
        r: &SecretKeyRef,
        local: Secret,
        writes: &mut Writes,
    ) -> (Secret, Option<Result<Refreshed, RefreshError>>) {
        let from = match refresh::grant_secret(&local) {
            None => return (local, None),
            Some(Err(e)) => return (local, Some(Err(e))),
            Some(Ok(from)) => from,
        };
        let Ok(pk) = connection::kubeconfig(Some(&local), r, &self.policy).await else {
            return (local, None);
        };
        let memo = self.providers.entry(&pk.fingerprint, r);
        let provider = match &memo.client {
            Some(c) => c.clone(),
            None => match connection::client(&pk, r, ctx.counter.clone(), ctx.args.request_timeout)
                .await
            {
                Ok(c) => {
                    memo.client = Some(c.clone());
                    c
                }
                Err(_) => return (local, None),
            },
        };
        let target = format!("Secret {}/{}", r.namespace, r.name);
        let mut announced = false;
        let (secret, outcome) = refresh::refresh(
            &self.client,
            &provider,
            &local,
            &refresh::Target {
                secret: r,
                from: &from,
                policy: &self.policy,
            },
            &self.manager,
            |from| {
                announced = true;
                writes.will(
                    "update",
                    target.clone(),
                    format!("kubeconfig re-issued, pulled from the Grant's Secret {from} on the provider"),
                )
            },
        )
        .await;
        if announced && matches!(outcome, Ok(Refreshed::Updated)) {
            writes.data_done();
        }
        (secret, Some(outcome))
    }
}

/// Which of `crds` (consumer CRDs a withdrawn autoBind binding's teardown would delete) still
/// hold objects (docs/schema.md "autoBind"): discovery of the CRD's group, then one LIST of at
/// most one object's metadata. A CRD whose objects cannot be read, or that discovery does not
/// show, is kept too: when unsure, nothing is deleted.
pub(super) async fn holding<'c>(
    client: &Client,
    crds: impl IntoIterator<Item = &'c str>,
) -> std::collections::BTreeMap<String, Holding> {
    // Withdrawn CRDs usually share a group: its discovery is read once per run.
    let mut groups: std::collections::BTreeMap<String, Result<Option<ApiGroup>, String>> =
        Default::default();
    let mut out = std::collections::BTreeMap::new();
    for crd in crds {
        // A CRD's name is `<plural>.<group>`; discovery (open to every identity) gives the
        // versions served, so the pass needs no read of the CRD itself.
        let Some((plural, group)) = crd.split_once('.') else {
            out.insert(crd.to_string(), Holding::Unreadable("not served".into()));
            continue;
        };
        if !groups.contains_key(group) {
            let found = match kube::discovery::group(client, group).await {
                Ok(g) => Ok(Some(g)),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
                Err(e) => Err(short_reason(&e)),
            };
            groups.insert(group.to_string(), found);
        }
        let verdict = match groups.get(group) {
            Some(Ok(Some(g))) => match has_objects(client, g, plural).await {
                Ok(Some(false)) => continue,
                Ok(Some(true)) => Holding::Objects,
                Ok(None) => Holding::Unreadable("not served".into()),
                Err(e) => Holding::Unreadable(short_reason(&e)),
            },
            Some(Err(why)) => Holding::Unreadable(why.clone()),
            _ => Holding::Unreadable("not served".into()),
        };
        if let Holding::Unreadable(why) = &verdict {
            tracing::warn!(%crd, reason = %why, "objects of a withdrawn export not listed; the CRD is kept");
        }
        out.insert(crd.to_string(), verdict);
    }
    out
}

/// What refused a read, short enough to name several CRDs in one condition: the API status
/// code and reason, or the error kind.
fn short_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        // Cut short, so scrubbed first: a cut could split what the scrub looks for.
        other => crate::scrub::scrub_bounded(&other.to_string(), 80),
    }
}

/// Whether the resource `plural` of discovered group `found` holds an object; `None` when
/// discovery shows no version of it (not established, or being deleted).
async fn has_objects(
    client: &Client,
    found: &ApiGroup,
    plural: &str,
) -> Result<Option<bool>, kube::Error> {
    // Every served version, not only the group's preferred one: another CRD of the group may
    // set the preferred version.
    let versions: Vec<String> = found.versions().map(String::from).collect();
    let Some(ar) = versions.iter().find_map(|v| {
        found
            .versioned_resources(v)
            .into_iter()
            .find(|(ar, _)| ar.plural == plural)
            .map(|(ar, _)| ar)
    }) else {
        return Ok(None);
    };
    let some = Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar)
        .list_metadata(&ListParams::default().limit(1))
        .await?;
    Ok(Some(!some.items.is_empty()))
}
