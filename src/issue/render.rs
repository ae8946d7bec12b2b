//! What `kbind issue` writes for one Grant, built purely from the Grant, its resolved APIs and
//! the flags (docs/issue.md "What a Grant gets"). Every object carries the label
//! `iam.kbind.io/grant: <grant>` (how the issuer finds them again) and an annotation with the
//! hash of its own content (how the issuer tells "unchanged" without comparing defaulted fields).

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::{Value, json};
use sha2::Digest;

use crate::api::iam::{GRANT_KEY, SPEC_HASH};
use crate::api::keys;

use super::args::Confinement;

mod policy;
pub use policy::policy_spec;

/// The data key of the issued kubeconfig: the Connection Secret's default key.
pub use crate::api::keys::KUBECONFIG_KEY;
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Every verb the issued identity has on an exported API's objects and their status.
pub const OBJECT_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// One exported API a Grant gives access to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResolvedApi {
    /// `<plural>.<group>` (also the CRD's name).
    pub name: String,
    pub group: String,
    pub plural: String,
    /// The CRD's scope: namespaced APIs are granted per namespace (Roles), cluster-scoped ones
    /// in the ClusterRole.
    pub namespaced: bool,
    /// The version the issuer lists its objects at: the storage version when served, else a
    /// served one; empty when none is served (no object can be read).
    pub version: String,
}

/// What a Grant resolves to: its APIs (sorted, deduplicated), extra rules, and the provider
/// namespaces it is granted (sorted, deduplicated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    /// The Exports the Grant names (its own, or every Export of its Collection), sorted.
    pub exports: Vec<String>,
    pub apis: Vec<ResolvedApi>,
    pub permissions: Vec<PolicyRule>,
    /// `spec.namespaces`: where the namespaced APIs (and resource permissions) are granted.
    pub namespaces: Vec<String>,
}

/// The Grant everything is issued for. Every issued object names it as its owner, so that the
/// garbage collector revokes what is left when the Grant goes without the issuer's finalizer
/// running (removed by hand, or deleted while no issuer runs; docs/issue.md "Revocation").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantRef<'a> {
    pub name: &'a str,
    /// The Grant's `metadata.uid`; empty (no owner written) only in plans built without one.
    pub uid: &'a str,
    /// Its `metadata.creationTimestamp`: a heartbeat Lease older than the Grant was written for
    /// an earlier Grant of the same name, and pins nothing.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

impl GrantRef<'_> {
    /// `metadata.ownerReferences` naming the Grant. No `blockOwnerDeletion`: the Grant's own
    /// deletion never waits on what it owns (the issuer's finalizer orders revocation), and
    /// setting it would need `update` on `grants/finalizers`.
    fn owner_references(&self) -> Option<Value> {
        (!self.uid.is_empty()).then(|| {
            json!([{
                "apiVersion": <crate::api::iam::Grant as kube::Resource>::api_version(&()),
                "kind": "Grant",
                "name": self.name,
                "uid": self.uid,
            }])
        })
    }
}

/// The name of every object issued for `grant` (a Grant's name is a DNS label, so this is too
/// short to need truncating: at most 75 characters).
pub fn object_name(grant: &str) -> String {
    crate::api::keys::grant_object_name(grant)
}

/// `system:serviceaccount:<ns>:<name>`, the issued identity's user name.
pub fn username(namespace: &str, grant: &str) -> String {
    format!("system:serviceaccount:{namespace}:{}", object_name(grant))
}

/// The kinds issued per Grant. Written in the order of [`objects`] (the policy first, so the
/// identity is never unconfined), revoked in the order of `plan::revoke`. `Role` and
/// `RoleBinding` live in the grants namespace; `TenantRole` and `TenantRoleBinding` (the same
/// API kinds) in each of the Grant's `spec.namespaces`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    ServiceAccount,
    ClusterRole,
    Role,
    ClusterRoleBinding,
    RoleBinding,
    Policy,
    PolicyBinding,
    TenantRole,
    TenantRoleBinding,
}

/// Where one issued object sits: its kind and, for the per-namespace kinds, the namespace
/// (empty for every other kind: there is one of each per Grant).
pub type Slot = (Kind, String);

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ServiceAccount => "ServiceAccount",
            Kind::ClusterRole => "ClusterRole",
            Kind::Role | Kind::TenantRole => "Role",
            Kind::ClusterRoleBinding => "ClusterRoleBinding",
            Kind::RoleBinding | Kind::TenantRoleBinding => "RoleBinding",
            Kind::Policy => "ValidatingAdmissionPolicy",
            Kind::PolicyBinding => "ValidatingAdmissionPolicyBinding",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Kind::ServiceAccount => "v1",
            Kind::ClusterRole
            | Kind::Role
            | Kind::ClusterRoleBinding
            | Kind::RoleBinding
            | Kind::TenantRole
            | Kind::TenantRoleBinding => "rbac.authorization.k8s.io/v1",
            Kind::Policy | Kind::PolicyBinding => "admissionregistration.k8s.io/v1",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::ServiceAccount
                | Kind::Role
                | Kind::RoleBinding
                | Kind::TenantRole
                | Kind::TenantRoleBinding
        )
    }

    /// One per namespace of the Grant's `spec.namespaces`.
    pub fn per_tenant_namespace(self) -> bool {
        matches!(self, Kind::TenantRole | Kind::TenantRoleBinding)
    }

    /// RBAC objects: a 403 writing them means the issuer does not hold what they grant.
    pub fn is_rbac(self) -> bool {
        matches!(
            self,
            Kind::ClusterRole
                | Kind::Role
                | Kind::ClusterRoleBinding
                | Kind::RoleBinding
                | Kind::TenantRole
                | Kind::TenantRoleBinding
        )
    }
}

/// One object to write, with the hash of its content.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub kind: Kind,
    pub name: String,
    pub namespace: Option<String>,
    pub hash: String,
    /// The whole object, hash annotation included, ready for server-side apply.
    pub body: Value,
}

impl Desired {
    pub fn slot(&self) -> Slot {
        let ns = match (self.kind.per_tenant_namespace(), &self.namespace) {
            (true, Some(ns)) => ns.clone(),
            _ => String::new(),
        };
        (self.kind, ns)
    }
}

/// Hash of a JSON value (serde_json writes maps in key order: stable).
pub fn hash(v: &Value) -> String {
    hex::encode(&sha2::Sha256::digest(v.to_string().as_bytes())[..12])
}

fn labels(grant: &str) -> Value {
    json!({GRANT_KEY: grant, MANAGED_BY: "kbind"})
}

fn desired(kind: Kind, grant: GrantRef<'_>, namespace: &str, mut content: Value) -> Desired {
    let name = object_name(grant.name);
    // Not the per-Grant policy (--confinement per-grant): the collector deletes in no order, and
    // the identity must never outlive its confinement; revocation deletes the policy last.
    let owners = grant
        .owner_references()
        .filter(|_| !matches!(kind, Kind::Policy | Kind::PolicyBinding));
    // The owner is hashed with the content: an object of an earlier Grant of the same name (or
    // written before 0.3 without an owner) is rewritten to name this one.
    let h = match &owners {
        Some(o) => hash(&json!([content, o])),
        None => hash(&content),
    };
    let mut metadata = json!({
        "name": name,
        "labels": labels(grant.name),
        "annotations": {SPEC_HASH: h},
    });
    if let Some(o) = owners {
        metadata["ownerReferences"] = o;
    }
    if kind.namespaced() {
        metadata["namespace"] = json!(namespace);
    }
    content["apiVersion"] = json!(kind.api_version());
    content["kind"] = json!(kind.as_str());
    content["metadata"] = metadata;
    Desired {
        kind,
        name,
        namespace: kind.namespaced().then(|| namespace.to_string()),
        hash: h,
        body: content,
    }
}

/// Whether an extra rule is about objects (held per namespace) rather than non-resource URLs.
fn is_resource_rule(p: &PolicyRule) -> bool {
    p.non_resource_urls.as_ref().is_none_or(Vec::is_empty)
}

/// The cluster-wide rules of the issued identity, exactly (docs/issue.md lists them): no read
/// of a namespaced exported API, so no consumer lists another's objects (docs/issue.md "Read
/// isolation").
pub fn cluster_rules(r: &Resolved) -> Vec<Value> {
    let crds: Vec<&str> = r.apis.iter().map(|a| a.name.as_str()).collect();
    let mut rules = vec![
        // `kbind schema` lists exported CRDs by label: a LIST cannot be narrowed by name.
        json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list"]}),
        json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": crds, "verbs": ["get"]}),
    ];
    for a in r.apis.iter().filter(|a| !a.namespaced) {
        rules.push(json!({
            "apiGroups": [a.group],
            "resources": [a.plural, format!("{}/status", a.plural)],
            "verbs": OBJECT_VERBS,
        }));
    }
    // `kbind bind --export` reads the Export it was handed: its own, nothing else.
    if !r.exports.is_empty() {
        rules.push(json!({"apiGroups": [crate::api::catalog::GROUP], "resources": ["exports"], "resourceNames": r.exports, "verbs": ["get"]}));
    }
    // The identity read. No namespace creation: the issuer creates the Grant's namespaces.
    rules.push(json!({"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}));
    // On a provider serving kcp's LogicalCluster API, the identity is that object's UID
    // (docs/schema.md): without this, kbind bind and kbind schema stop at the identity read.
    rules.push(json!({"apiGroups": ["core.kcp.io"], "resources": ["logicalclusters"], "resourceNames": ["cluster"], "verbs": ["get"]}));
    for p in r.permissions.iter().filter(|p| !is_resource_rule(p)) {
        rules.push(serde_json::to_value(p).unwrap_or(Value::Null));
    }
    rules.retain(|v| !v.is_null());
    rules
}

/// The rules in one of the Grant's namespaces: the namespaced exported APIs, reading that
/// namespace itself (resync checks it exists), and the Export's resource rules.
pub fn tenant_rules(r: &Resolved, namespace: &str) -> Vec<Value> {
    let mut rules: Vec<Value> = r
        .apis
        .iter()
        .filter(|a| a.namespaced)
        .map(|a| {
            json!({
                "apiGroups": [a.group],
                "resources": [a.plural, format!("{}/status", a.plural)],
                "verbs": OBJECT_VERBS,
            })
        })
        .collect();
    rules.push(json!({"apiGroups": [""], "resources": ["namespaces"], "resourceNames": [namespace], "verbs": ["get"]}));
    for p in r.permissions.iter().filter(|p| is_resource_rule(p)) {
        rules.push(serde_json::to_value(p).unwrap_or(Value::Null));
    }
    rules.retain(|v| !v.is_null());
    rules
}

/// The rules in the grants namespace: the heartbeat Lease, and its own kubeconfig Secret.
pub fn namespace_rules(grant: &str) -> Vec<Value> {
    vec![
        // Its heartbeat Lease, named after the Grant (server-side apply: get, patch, create;
        // update for older clients). No list: other Grants' Leases carry their cluster UIDs.
        // `create` cannot be narrowed by name: the policy refuses any other name.
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [object_name(grant)], "verbs": ["get", "update", "patch"]}),
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}),
        // Rotation by pull: the consumer reads its own new kubeconfig with its current token.
        json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": [object_name(grant)], "verbs": ["get"]}),
    ]
}

/// Everything issued for a Grant except the Secret, in write order. With per-Grant confinement
/// the admission policy and its binding come first, so RBAC (which a failed write stops) never
/// reaches further than the policy confines; with the shipped policies (checked before any
/// write) there is none (docs/issue.md "Confinement").
pub fn objects(
    r: &Resolved,
    namespace: &str,
    grant: GrantRef<'_>,
    confinement: Confinement,
    pinned: Option<&str>,
) -> Vec<Desired> {
    let name = object_name(grant.name);
    let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": namespace}]);
    let role_ref =
        |kind: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name});
    let mut out = Vec::new();
    if confinement == Confinement::PerGrant {
        out.push(desired(
            Kind::Policy,
            grant,
            namespace,
            json!({"spec": policy_spec(r, namespace, grant.name, pinned)}),
        ));
        out.push(desired(
            Kind::PolicyBinding,
            grant,
            namespace,
            json!({"spec": {"policyName": name, "validationActions": ["Deny"]}}),
        ));
    }
    out.extend([
        desired(Kind::ServiceAccount, grant, namespace, json!({})),
        desired(
            Kind::ClusterRole,
            grant,
            namespace,
            json!({"rules": cluster_rules(r)}),
        ),
        desired(
            Kind::Role,
            grant,
            namespace,
            json!({"rules": namespace_rules(grant.name)}),
        ),
        desired(
            Kind::ClusterRoleBinding,
            grant,
            namespace,
            json!({"roleRef": role_ref("ClusterRole"), "subjects": subject}),
        ),
        desired(
            Kind::RoleBinding,
            grant,
            namespace,
            json!({"roleRef": role_ref("Role"), "subjects": subject}),
        ),
    ]);
    for tenant in &r.namespaces {
        out.push(desired(
            Kind::TenantRole,
            grant,
            tenant,
            json!({"rules": tenant_rules(r, tenant)}),
        ));
        out.push(desired(
            Kind::TenantRoleBinding,
            grant,
            tenant,
            json!({"roleRef": role_ref("Role"), "subjects": subject}),
        ));
    }
    out
}

/// Base64, as Kubernetes serializes bytes.
fn b64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap_or(Value::Null)
}

/// The issued kubeconfig: self-contained (server, embedded CA, token), context namespace the
/// grants namespace, and the Grant it was issued for in a context extension
/// ([`keys::IAM_GRANT`]: the Grant and its issued Secret), so `kbind bind` with this file alone
/// sets up rotation by pull and the heartbeat's Grant label (docs/binding-flow.md). YAML text.
pub fn kubeconfig(
    server: &str,
    ca_pem: &[u8],
    token: &str,
    namespace: &str,
    grant: &str,
) -> String {
    let ca = b64(ca_pem);
    let v = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "provider", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": grant, "user": {"token": token}}],
        "contexts": [{"name": grant, "context": {
            "cluster": "provider", "user": grant, "namespace": namespace,
            "extensions": [{"name": keys::IAM_GRANT, "extension": {
                "grant": grant,
                "secret": format!("{namespace}/{}", object_name(grant)),
            }}],
        }}],
        "current-context": grant,
    });
    serde_saphyr::to_string(&v).unwrap_or_else(|_| v.to_string())
}

/// The issued Secret.
pub fn secret(
    namespace: &str,
    grant: GrantRef<'_>,
    kubeconfig: &str,
    expires_at: &str,
    sa_uid: &str,
) -> Value {
    let mut annotations = BTreeMap::new();
    annotations.insert(crate::api::iam::EXPIRES_AT, expires_at.to_string());
    annotations.insert(GRANT_KEY, grant.name.to_string());
    annotations.insert(crate::api::iam::SERVICE_ACCOUNT_UID, sa_uid.to_string());
    let mut s = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": object_name(grant.name),
            "namespace": namespace,
            "labels": labels(grant.name),
            "annotations": annotations,
        },
        "type": "Opaque",
        "data": {KUBECONFIG_KEY: b64(kubeconfig.as_bytes())},
    });
    if let Some(o) = grant.owner_references() {
        s["metadata"]["ownerReferences"] = o;
    }
    s
}
