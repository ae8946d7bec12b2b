//! `kbind uninstall`: release every finalizer kbind put on objects, so that deleting kbind (its
//! CronJobs, RBAC, CRDs and namespaces) never leaves an object or a namespace `Terminating`
//! (docs/operations.md, "Uninstall"). The finalizers are the ones docs/contract.md "Keys" lists:
//! `core.kbind.io/syncer` on synced consumer objects (every kind whose CRD carries
//! `core.kbind.io/managed`), `core.kbind.io/cleanup` on Connections, their Secrets, Bindings and
//! ClusterBindings, `kbind.io/relsync-cleanup` on RelationshipSources, and `iam.kbind.io/revoke`
//! on the issuer's Grants (`iam.kbind.io`, on a provider).
//!
//! Releasing a Grant's `iam.kbind.io/revoke` skips its revocation: the ServiceAccount, RBAC,
//! per-Grant ValidatingAdmissionPolicy (`--confinement per-grant`) and kubeconfig Secret issued
//! for it stay, and its token keeps
//! working until it expires. The report says so per Grant, with the kubectl commands that revoke
//! by hand ([`revoke_commands`]).
//!
//! Dry run unless `--yes`. Each finalizer is released by server-side apply under the field
//! manager that added it (`<pass manager>-finalizer`, docs/contract.md "Who writes what"), with
//! the object's uid in the body so an object deleted meanwhile is never re-created; when another
//! manager also lists the entry, `pass::finalizer::release` removes that one entry behind a
//! JSON-patch `test`. Nothing is deleted, and only the job's own cluster is touched: provider
//! copies and SpiceDB relationships stay as they are.
//!
//! A pass running meanwhile would add finalizers back: with `--yes`, a held pass Lease makes the
//! command refuse (exit 2) unless `--force`.

pub mod args;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::api::core::{Binding, ClusterBinding, Connection};
use crate::api::iam::Grant as IssuedGrant;
use crate::api::keys;
use crate::api::relsync::RelationshipSource;
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::descriptor::{Descriptor, Finalized, Finalizer, Kind};
use crate::pass::{CommonArgs, OutputFormat, PassError};
use crate::scrub::scrub;

pub use args::UninstallArgs;

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("configuration error: {0}")]
    Config(String),
    #[error(transparent)]
    Client(#[from] PassError),
    #[error(
        "refusing to release finalizers while a kbind pass may be running: {}. Suspend or delete \
         the kbind CronJobs and let their Jobs finish (a killed run's Lease expires after \
         --lease-duration), or pass --force",
        held_list(.0)
    )]
    LeaseHeld(Vec<HeldLease>),
    #[error(
        "cannot check the kbind pass Leases in namespace {namespace} (--force skips the check): {source}"
    )]
    LeaseCheck {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing {what}: {source}")]
    List {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl UninstallError {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) | Self::LeaseHeld(_) => 2,
            Self::Client(e) => e.exit_code(),
            Self::LeaseCheck { .. } | Self::List { .. } => 1,
        }
    }
}

fn held_list(held: &[HeldLease]) -> String {
    held.iter()
        .map(|h| {
            format!(
                "Lease {}/{} is held by {} (renewed {})",
                h.namespace,
                h.name,
                h.holder,
                h.renewed.as_deref().unwrap_or("never")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A pass Lease with a live holder.
#[derive(Clone, Debug, Serialize)]
pub struct HeldLease {
    pub namespace: String,
    pub name: String,
    pub holder: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed: Option<String>,
}

/// What happened (or would happen) to one object's finalizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    WouldRelease,
    Released,
    /// Deleted or replaced since it was listed: nothing left to release.
    Gone,
    Failed,
}

#[derive(Clone, Debug, Serialize)]
pub struct ObjectReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(skip)]
    uid: String,
    /// Already being deleted: releasing lets it go.
    pub deleting: bool,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// An `iam.kbind.io` Grant: what releasing leaves behind, and how to revoke it by hand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unrevoked: Option<Unrevoked>,
}

/// What stays when a Grant's `iam.kbind.io/revoke` is released instead of run by `kbind issue`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unrevoked {
    /// The grants namespace of its ServiceAccount, Role, RoleBinding and Secret.
    pub namespace: String,
    /// The name of every object issued for it (`kbind-grant-<grant>`).
    pub objects: String,
    /// When its current token stops working by itself (`status.expiresAt`; none: not recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<String>,
    /// The kubectl commands that revoke it by hand, in order.
    pub revoke_by_hand: Vec<String>,
}

/// The kubectl commands that do what `kbind issue` does when a Grant goes (docs/issue.md): the
/// ServiceAccount first (its tokens stop working at once) and its kubeconfig Secret, then the
/// RBAC (in the grants namespace, in the Grant's namespaces, cluster-wide), the per-Grant
/// ValidatingAdmissionPolicy and its binding last where there is one (`--confinement
/// per-grant`: the identity stays confined until it is gone).
pub fn revoke_commands(namespace: &str, grant: &str) -> Vec<String> {
    let name = keys::grant_object_name(grant);
    vec![
        format!("kubectl delete serviceaccount,secret -n {namespace} {name} --ignore-not-found"),
        format!("kubectl delete rolebinding,role -n {namespace} {name} --ignore-not-found"),
        // And in each of the Grant's namespaces (docs/issue.md "Read isolation").
        format!(
            "kubectl delete rolebinding,role -A -l {}={grant} --ignore-not-found",
            keys::IAM_GRANT
        ),
        format!("kubectl delete clusterrolebinding,clusterrole {name} --ignore-not-found"),
        format!(
            "kubectl delete validatingadmissionpolicybinding,validatingadmissionpolicy {name} --ignore-not-found"
        ),
    ]
}

/// The grants namespace of a Grant: its status names it (`secretRef`, `serviceAccount`), else
/// `fallback` (`--grants-namespace`).
fn grants_namespace(g: &IssuedGrant, fallback: &str) -> String {
    let st = g.status.as_ref();
    st.and_then(|s| s.secret_ref.as_ref())
        .map(|r| r.namespace.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            st.and_then(|s| s.service_account.as_deref())
                .and_then(|sa| sa.split_once('/'))
                .map(|(ns, _)| ns.to_string())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| fallback.to_string())
}

fn unrevoked(g: &IssuedGrant, fallback: &str) -> Unrevoked {
    let namespace = grants_namespace(g, fallback);
    let grant = g.name_any();
    Unrevoked {
        objects: keys::grant_object_name(&grant),
        token_expires_at: g
            .status
            .as_ref()
            .and_then(|s| s.expires_at.as_ref())
            .map(|t| t.0.to_string()),
        revoke_by_hand: revoke_commands(&namespace, &grant),
        namespace,
    }
}

impl ObjectReport {
    fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// One kind and one finalizer.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindReport {
    pub kind: String,
    /// `<plural>.<group>` (`secrets` for the core group).
    pub resource: String,
    pub finalizer: String,
    pub manager: String,
    /// Why the kind was not looked at (its CRD is not installed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    pub found: usize,
    pub released: usize,
    pub failed: usize,
    pub objects: Vec<ObjectReport>,
    #[serde(skip)]
    ar: ApiResource,
}

impl KindReport {
    fn new(ar: ApiResource, resource: String, finalizer: &str, pass: &str) -> Self {
        Self {
            kind: ar.kind.clone(),
            resource,
            finalizer: finalizer.to_string(),
            manager: keys::finalizer_manager(pass),
            skipped: None,
            found: 0,
            released: 0,
            failed: 0,
            objects: Vec::new(),
            ar,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub command: &'static str,
    pub dry_run: bool,
    /// Pass Leases held when the command ran (with `--yes`, only with `--force`).
    pub leases_held: Vec<HeldLease>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_check_error: Option<String>,
    pub kinds: Vec<KindReport>,
    pub found: usize,
    pub released: usize,
    pub failed: usize,
    /// What the user deletes next, in order (kubectl commands).
    pub next: Vec<String>,
}

/// Run and print; returns the exit code: 0 done, 1 something could not be released or listed,
/// 2 usage error or a held pass Lease.
pub async fn run(common: CommonArgs, args: UninstallArgs, passes: &[Descriptor]) -> i32 {
    crate::set_command("uninstall");
    crate::install_crypto_provider();
    match uninstall(&common, &args, passes).await {
        Ok(report) => {
            let is_tty = std::io::stdout().is_terminal();
            println!("{}", render(&report, common.output, is_tty));
            if report.failed > 0 { 1 } else { 0 }
        }
        Err(e) => {
            crate::logging::print_error("uninstall", &e);
            e.exit_code()
        }
    }
}

async fn uninstall(
    common: &CommonArgs,
    args: &UninstallArgs,
    passes: &[Descriptor],
) -> Result<Report, UninstallError> {
    if common.dry_run && args.yes {
        return Err(UninstallError::Config(
            "--dry-run and --yes contradict each other (uninstall is a dry run unless --yes)"
                .into(),
        ));
    }
    let dry_run = !args.yes;
    let config = own_config(common).await?;
    let client = counted_client(config, Arc::new(RequestCounter::default()))
        .map_err(|e| PassError::kube("building the Kubernetes client", e))?;

    let mut leases_held = Vec::new();
    let mut lease_check_error = None;
    for ns in lease_namespaces(common, passes) {
        match held_leases(&client, &ns, passes).await {
            Ok(h) => leases_held.extend(h),
            Err(source) if dry_run || args.force => {
                lease_check_error = Some(scrub(&format!("namespace {ns}: {source}")));
            }
            Err(source) => {
                return Err(UninstallError::LeaseCheck {
                    namespace: ns,
                    source,
                });
            }
        }
    }
    if !dry_run && !args.force && !leases_held.is_empty() {
        return Err(UninstallError::LeaseHeld(leases_held));
    }

    let mut kinds = find(
        &client,
        args.selector.as_deref(),
        &args.grants_namespace,
        passes,
    )
    .await?;
    for k in &mut kinds {
        let mut objects = std::mem::take(&mut k.objects);
        for o in &mut objects {
            if dry_run {
                o.outcome = Outcome::WouldRelease;
                continue;
            }
            match release(&client, k, o).await {
                Ok(outcome) => o.outcome = outcome,
                Err(e) => {
                    o.outcome = Outcome::Failed;
                    o.error = Some(scrub(&short(&e)));
                }
            }
        }
        k.objects = objects;
        k.found = k.objects.len();
        k.released = count(&k.objects, Outcome::Released);
        k.failed = count(&k.objects, Outcome::Failed);
    }
    Ok(Report {
        command: "uninstall",
        dry_run,
        leases_held,
        lease_check_error,
        found: kinds.iter().map(|k| k.found).sum(),
        released: kinds.iter().map(|k| k.released).sum(),
        failed: kinds.iter().map(|k| k.failed).sum(),
        kinds,
        next: next_steps(),
    })
}

/// The server's own message for an API error (not the whole Status), else the error.
fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => format!("{} ({})", s.message, s.code),
        e => e.to_string(),
    }
}

fn count(objects: &[ObjectReport], outcome: Outcome) -> usize {
    objects.iter().filter(|o| o.outcome == outcome).count()
}

/// `--lease-namespace` when given; else the default one and every namespace a registered pass
/// runs in (relsync's Lease lives in its own namespace, not in kbind-system).
fn lease_namespaces(common: &CommonArgs, passes: &[Descriptor]) -> Vec<String> {
    let mut namespaces = vec![common.lease_namespace()];
    if common.lease_namespace.is_some() {
        return namespaces;
    }
    for p in passes.iter().filter(|p| p.takes_lease) {
        if !namespaces.iter().any(|n| n == p.namespace) {
            namespaces.push(p.namespace.to_string());
        }
    }
    namespaces
}

/// Whether `name` is a registered pass's Lease, for any shard (docs/contract.md "Keys").
pub fn is_pass_lease(passes: &[Descriptor], name: &str) -> bool {
    passes.iter().any(|p| p.is_lease(name))
}

async fn held_leases(
    client: &Client,
    ns: &str,
    passes: &[Descriptor],
) -> Result<Vec<HeldLease>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let now = Timestamp::now();
    Ok(crate::pass::list::all(&api, &ListParams::default())
        .await?
        .into_iter()
        .filter(|l| is_pass_lease(passes, &l.name_any()))
        .filter_map(|l| {
            let spec = l.spec.as_ref()?;
            crate::pass::lease::is_live(spec, now).then(|| HeldLease {
                namespace: ns.to_string(),
                name: l.name_any(),
                holder: spec.holder_identity.clone().unwrap_or_default(),
                renewed: spec
                    .renew_time
                    .as_ref()
                    .or(spec.acquire_time.as_ref())
                    .map(|t| t.0.to_string()),
            })
        })
        .collect())
}

/// Release one object's finalizer under the manager that added it.
async fn release(
    client: &Client,
    k: &KindReport,
    o: &ObjectReport,
) -> Result<Outcome, kube::Error> {
    let api: Api<DynamicObject> = match &o.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &k.ar),
        None => Api::all_with(client.clone(), &k.ar),
    };
    // The uid makes an apply to an object deleted (or replaced) since it was listed fail instead
    // of creating a new one.
    let mut metadata = json!({"name": o.name, "uid": o.uid, "finalizers": []});
    if let Some(ns) = &o.namespace {
        metadata["namespace"] = json!(ns);
    }
    let body = json!({"apiVersion": k.ar.api_version, "kind": k.ar.kind, "metadata": metadata});
    match crate::pass::finalizer::release(&api, &o.name, &body, &k.manager, &k.finalizer).await {
        Ok(()) => Ok(Outcome::Released),
        Err(e) => match api.get_metadata_opt(&o.name).await {
            Ok(None) => Ok(Outcome::Gone),
            Ok(Some(m))
                if m.uid().as_deref() != Some(o.uid.as_str())
                    || !m.finalizers().contains(&k.finalizer) =>
            {
                Ok(Outcome::Gone)
            }
            _ => Err(e),
        },
    }
}

/// What to delete afterwards, in order (docs/operations.md, "Uninstall").
mod render;
mod scan;

use render::next_steps;
pub use render::render;
use scan::find;
pub use scan::releases;

#[cfg(test)]
mod tests;
