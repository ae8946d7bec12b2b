//! The writes of `kbind issue`: server-side apply of what a Grant's plan says differs, a new
//! token when one is due, and revocation (docs/issue.md).

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde_json::Value;

use crate::pass::StatusCode;
use crate::pass::writes::Writes;

use super::plan::{Blocked, Config, GrantPlan, ISSUE_FAILED, PERMISSIONS_NOT_GRANTABLE, Token};
use super::render::{self, GrantRef, Kind, Slot, object_name};

fn resource(kind: Kind) -> ApiResource {
    let (group, version) = match kind.api_version().split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", kind.api_version()),
    };
    let plural = match kind {
        Kind::ServiceAccount => "serviceaccounts",
        Kind::ClusterRole => "clusterroles",
        Kind::Role | Kind::TenantRole => "roles",
        Kind::ClusterRoleBinding => "clusterrolebindings",
        Kind::RoleBinding | Kind::TenantRoleBinding => "rolebindings",
        Kind::Policy => "validatingadmissionpolicies",
        Kind::PolicyBinding => "validatingadmissionpolicybindings",
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind.as_str()),
        plural,
    )
}

fn api(client: &Client, kind: Kind, ns: &str) -> Api<DynamicObject> {
    let ar = resource(kind);
    if kind.namespaced() {
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

fn target(kind: &str, ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// What a Grant's writes came to.
#[derive(Debug, Default)]
pub struct Applied {
    /// Expiry of a token issued this run.
    pub issued_until: Option<Timestamp>,
    /// The ServiceAccount's UID (written or observed), for the Secret annotation.
    pub sa_uid: Option<String>,
}

/// Why a write failed, as a Ready=False reason: a 403 on RBAC is the apiserver's escalation
/// check (the issuer holds no `escalate`/`bind`): it does not hold what it would grant.
fn blocked(kind: &str, is_rbac: bool, name: &str, e: &kube::Error) -> Blocked {
    if is_rbac && e.is_forbidden() {
        return Blocked {
            reason: PERMISSIONS_NOT_GRANTABLE,
            message: format!(
                "the issuer may not grant what {kind} {name} holds (it can only grant permissions it holds itself): {}",
                e
            ),
        };
    }
    Blocked {
        reason: ISSUE_FAILED,
        message: format!("writing {kind} {name}: {}", e),
    }
}

/// Apply the plan's objects, then the token and Secret when due.
pub async fn issue(
    client: &Client,
    manager: &str,
    owner: GrantRef<'_>,
    plan: &GrantPlan,
    observed_sa_uid: Option<&str>,
    cfg: &Config,
    writes: &mut Writes,
) -> Result<Applied, Blocked> {
    let grant = owner.name;
    let pp = PatchParams::apply(manager).force();
    let ns = cfg.namespace.as_str();
    let mut out = Applied {
        sa_uid: observed_sa_uid.map(String::from),
        ..Default::default()
    };
    if plan.stale_identity {
        // Its tokens stop working with it; the writes below create the identity anew.
        revoke(
            client,
            grant,
            ns,
            (&[(Kind::ServiceAccount, String::new())], &[]),
            true,
            writes,
        )
        .await
        .map_err(|message| Blocked {
            reason: ISSUE_FAILED,
            message,
        })?;
        out.sa_uid = None;
    }
    for d in &plan.writes {
        let in_ns = d.namespace.as_deref().unwrap_or(ns);
        if d.kind == Kind::TenantRole && plan.create_namespaces.iter().any(|n| n == in_ns) {
            create_namespace(client, grant, in_ns, writes).await?;
        }
        if !writes.will(
            "apply",
            target(d.kind.as_str(), d.namespace.as_deref(), &d.name),
            format!("for Grant {grant}"),
        ) {
            continue;
        }
        let written = api(client, d.kind, in_ns)
            .patch(&d.name, &pp, &Patch::Apply(&d.body))
            .await
            .map_err(|e| blocked(d.kind.as_str(), d.kind.is_rbac(), &d.name, &e))?;
        writes.data_done();
        if d.kind == Kind::ServiceAccount {
            out.sa_uid = written.metadata.uid;
        }
    }
    prune(client, grant, &plan.stale, writes).await?;
    stale_heartbeats(client, grant, ns, &plan.stale_leases, writes).await;
    let Token::Issue { why } = &plan.token else {
        return Ok(out);
    };
    if !writes.will(
        "issue",
        target("Secret", Some(ns), &object_name(grant)),
        format!("new token for Grant {grant}: {why}"),
    ) {
        return Ok(out);
    }
    let sa_uid = out.sa_uid.as_deref();
    out.issued_until = Some(token(client, (manager, owner), plan, sa_uid, cfg, writes).await?);
    Ok(out)
}

/// Heartbeats older than their Grant go. Never in the way of the token: a refused delete (RBAC
/// from before 0.3) is only logged; a stale heartbeat pins nothing either way.
async fn stale_heartbeats(
    client: &Client,
    grant: &str,
    ns: &str,
    leases: &[String],
    writes: &mut Writes,
) {
    if let Err((name, e)) = delete_leases(client, ns, leases, "older than its Grant", writes).await
    {
        tracing::warn!(grant = %grant, lease = %name, error = %e, "a heartbeat older than its Grant was not deleted");
    }
}

/// A new token by TokenRequest for the Grant's ServiceAccount (of UID `sa_uid`), written into
/// its kubeconfig Secret; when it expires.
async fn token(
    client: &Client,
    (manager, owner): (&str, GrantRef<'_>),
    plan: &GrantPlan,
    sa_uid: Option<&str>,
    cfg: &Config,
    writes: &mut Writes,
) -> Result<Timestamp, Blocked> {
    let (grant, ns) = (owner.name, cfg.namespace.as_str());
    let name = object_name(grant);
    let sa_uid = match sa_uid {
        Some(u) => u,
        None => {
            return Err(Blocked {
                reason: ISSUE_FAILED,
                message: format!("ServiceAccount {ns}/{name} has no UID yet"),
            });
        }
    };
    let ttl = i64::try_from(plan.ttl.as_secs()).unwrap_or(i64::MAX);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(ttl),
            audiences: Vec::new(),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let tr = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(&name, &PostParams::default(), &tr)
        .await
        .map_err(|e| blocked("TokenRequest for ServiceAccount", false, &name, &e))?;
    let Some(status) = tr.status else {
        return Err(Blocked {
            reason: ISSUE_FAILED,
            message: format!("the TokenRequest for ServiceAccount {ns}/{name} returned no token"),
        });
    };
    crate::scrub::register_secret(&status.token);
    let expires = status.expiration_timestamp.0;
    let kc = render::kubeconfig(&cfg.server, &cfg.ca_pem, &status.token, ns, grant);
    let body = render::secret(ns, owner, &kc, &expires.to_string(), sa_uid);
    let pp = PatchParams::apply(manager).force();
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(&name, &pp, &Patch::Apply(&body))
        .await
        .map_err(|e| blocked("Secret", false, &name, &e))?;
    writes.data_done();
    Ok(expires)
}

/// Create one of the Grant's namespaces (labelled with it, for people reading the cluster).
/// Already there (a concurrent create): fine.
async fn create_namespace(
    client: &Client,
    grant: &str,
    ns: &str,
    writes: &mut Writes,
) -> Result<(), Blocked> {
    if !writes.will(
        "create",
        target("Namespace", None, ns),
        format!("for Grant {grant}"),
    ) {
        return Ok(());
    }
    let body: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": ns, "labels": {
            crate::api::iam::GRANT_KEY: grant,
            "app.kubernetes.io/managed-by": "kbind",
        }},
    }))
    .map_err(|e| Blocked {
        reason: ISSUE_FAILED,
        message: format!("building Namespace {ns}: {e}"),
    })?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &body)
        .await
    {
        Ok(_) => {
            writes.data_done();
            Ok(())
        }
        Err(e) if e.is_conflict() => Ok(()),
        Err(e) => Err(blocked("Namespace", false, ns, &e)),
    }
}

/// Apply a blocked Grant's [`Reduction`](super::plan::Reduction): its ClusterRole narrowed,
/// stale per-namespace RBAC deleted.
pub async fn reduce(
    client: &Client,
    manager: &str,
    grant: &str,
    ns: &str,
    r: &super::plan::Reduction,
    writes: &mut Writes,
) -> Result<(), Blocked> {
    if let Some(d) = &r.cluster_role
        && writes.will(
            "apply",
            target(d.kind.as_str(), None, &d.name),
            format!("narrowed: Grant {grant} is not Ready"),
        )
    {
        api(client, d.kind, ns)
            .patch(
                &d.name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&d.body),
            )
            .await
            .map_err(|e| blocked(d.kind.as_str(), d.kind.is_rbac(), &d.name, &e))?;
        writes.data_done();
    }
    prune(client, grant, &r.stale, writes).await
}

/// Delete the per-namespace RBAC of namespaces the Grant no longer names.
async fn prune(
    client: &Client,
    grant: &str,
    stale: &[Slot],
    writes: &mut Writes,
) -> Result<(), Blocked> {
    let name = object_name(grant);
    for (kind, ns) in stale {
        if !writes.will(
            "delete",
            target(kind.as_str(), Some(ns), &name),
            format!("Grant {grant} no longer names namespace {ns}"),
        ) {
            continue;
        }
        match api(client, *kind, ns)
            .delete(&name, &DeleteParams::background())
            .await
        {
            Ok(_) => writes.data_done(),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(blocked(kind.as_str(), false, &name, &e)),
        }
    }
    Ok(())
}

/// Delete the heartbeat Leases `names` in the grants namespace `ns` (bookkeeping: a heartbeat
/// holds nothing but the UID it names); the first failure with the Lease's name.
async fn delete_leases(
    client: &Client,
    ns: &str,
    names: &[String],
    why: &str,
    writes: &mut Writes,
) -> Result<(), (String, kube::Error)> {
    let api = Api::<Lease>::namespaced(client.clone(), ns);
    for name in names {
        if !writes.will("delete", target("Lease", Some(ns), name), why) {
            continue;
        }
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => writes.bookkeeping_done(),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err((name.clone(), e)),
        }
    }
    Ok(())
}

/// Delete what is issued for `grant`: the objects in `slots` (revocation order), the Secret
/// when `secret`, then its heartbeat Leases `leases` (so a Grant re-created under the name is
/// pinned from a fresh heartbeat, never from one written for this one). Returns the first
/// failure; what was deleted stays deleted.
pub async fn revoke(
    client: &Client,
    grant: &str,
    ns: &str,
    (slots, leases): (&[Slot], &[String]),
    secret: bool,
    writes: &mut Writes,
) -> Result<(), String> {
    let name = object_name(grant);
    let dp = DeleteParams::background();
    let mut steps: Vec<(String, Option<Slot>)> = slots
        .iter()
        .map(|s| (s.0.as_str().to_string(), Some(s.clone())))
        .collect();
    if secret {
        // Right after the ServiceAccount: the identity is gone, then its kubeconfig.
        let at = usize::from(slots.first().map(|s| s.0) == Some(Kind::ServiceAccount));
        steps.insert(at, ("Secret".into(), None));
    }
    for (kind, slot) in steps {
        let in_ns = match &slot {
            Some((k, n)) if k.per_tenant_namespace() => n.as_str(),
            _ => ns,
        };
        let namespaced = slot.as_ref().is_none_or(|s| s.0.namespaced());
        let t = target(&kind, namespaced.then_some(in_ns), &name);
        if !writes.will("delete", t, format!("revoke Grant {grant}")) {
            continue;
        }
        let r: Result<(), kube::Error> = match slot {
            Some((k, _)) => api(client, k, in_ns).delete(&name, &dp).await.map(|_| ()),
            None => Api::<Secret>::namespaced(client.clone(), ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => writes.data_done(),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(format!("deleting {kind} {name}: {}", e)),
        }
    }
    delete_leases(client, ns, leases, &format!("revoke Grant {grant}"), writes)
        .await
        .map_err(|(name, e)| format!("deleting Lease {name}: {}", e))
}

/// Body for a status write.
pub fn status_body(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
