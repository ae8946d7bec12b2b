//! `iam.kbind.io/v1alpha1`: Grant, a credential the provider issues to one consumer for an
//! Export or a Collection (spec 000 "Export, Collection, and Grant"; docs/issue.md).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "iam.kbind.io";

/// Finalizer on a Grant: the issued identity is not revoked yet.
pub const REVOKE_FINALIZER: &str = "iam.kbind.io/revoke";
/// Label on everything issued for a Grant, and on the consumer's heartbeat Lease: the Grant's
/// name. Annotation of the same key on the issued Secret.
pub const GRANT_KEY: &str = "iam.kbind.io/grant";
/// Annotation on a Grant: a consumer cluster UID a person approves for its pin although
/// provider objects already carry it (docs/issue.md "Confinement").
pub const APPROVE_CONSUMER_CLUSTER: &str = "iam.kbind.io/approve-consumer-cluster";
/// Annotation on a Grant: the namespaces and cluster-scoped APIs (comma-separated) a person
/// lets it take over although they hold another consumer's objects (docs/issue.md "Read
/// isolation").
pub const APPROVE_HANDOVER: &str = "iam.kbind.io/approve-handover";
/// Annotation on the issued Secret: when its token expires (RFC 3339).
pub const EXPIRES_AT: &str = "iam.kbind.io/expires-at";
/// Annotation on the issued Secret: the ServiceAccount UID its token was issued for.
pub const SERVICE_ACCOUNT_UID: &str = "iam.kbind.io/service-account-uid";
/// Annotation on issued RBAC and admission objects: hash of what the issuer wrote.
pub const SPEC_HASH: &str = "iam.kbind.io/spec-hash";
/// The shipped admission policy (and its binding) confining every issued identity's writes to
/// labelled objects and its own heartbeat Lease (deploy/components/provider/issue-rbac.yaml).
pub const IDENTITIES_POLICY: &str = "kbind-grant-identities";
/// The shipped admission policy (and its binding) confining an issued identity's writes to the
/// consumer cluster its Grant's `status.consumerCluster` pins; its parameters are the Grants.
pub const PINS_POLICY: &str = "kbind-grant-pins";
/// What the shipped pins policy says when it refuses a write because the Grant's
/// consumer cluster is not pinned yet: `kbind resync` tells that refusal apart by it and says
/// on the binding what to do (docs/resync.md "Bindings").
pub const NOT_PINNED: &str = "is not pinned yet";

fn default_token_ttl() -> String {
    "24h".into()
}

/// A credential for one consumer: a ServiceAccount with exactly the Export's access, a
/// short-lived token re-issued before it expires, and a kubeconfig Secret the consumer pulls.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "iam.kbind.io",
    version = "v1alpha1",
    kind = "Grant",
    doc = "A credential for one consumer of an Export or Collection: `kbind issue` creates a ServiceAccount with exactly that access, confines its writes to one consumer cluster, and keeps a kubeconfig Secret with a short-lived token, re-issued before it expires; deleting the Grant revokes it all (docs/issue.md).",
    status = "GrantStatus",
    shortname = "kbcred",
    category = "kbind",
    // On the root, not on status: a rule on status does not run when status is removed, and
    // the shipped pins policy trusts status.consumerCluster (docs/issue.md "Confinement").
    validation = Rule::new("!has(oldSelf.status) || !has(oldSelf.status.consumerCluster) || (has(self.status) && has(self.status.consumerCluster) && self.status.consumerCluster == oldSelf.status.consumerCluster)").message("status.consumerCluster is pinned once, and stays: re-create the Grant to change it"),
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a Grant's name is a DNS label (at most 63 characters): it is the value of the iam.kbind.io/grant label on what is issued for it"),
    printcolumn = r#"{"name":"Consumer","type":"string","jsonPath":".spec.consumer"}"#,
    printcolumn = r#"{"name":"Export","type":"string","jsonPath":".spec.export"}"#,
    printcolumn = r#"{"name":"Collection","type":"string","priority":1,"jsonPath":".spec.collection"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".status.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.export) != has(self.collection)").message("set exactly one of export or collection"))]
pub struct GrantSpec {
    /// The Export this Grant gives access to (or set `collection`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub export: Option<String>,
    /// The Collection this Grant gives access to: every Export in it (or set `export`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub collection: Option<String>,
    /// Who the credential is for, for people reading the Grant. The identity is the Grant's
    /// own ServiceAccount, never shared.
    #[schemars(length(min = 1, max = 253))]
    pub consumer: String,
    /// Lifetime of each issued token (Go duration, e.g. 24h, 90m): at least 10m (TokenRequest's
    /// floor), at most 168h (7 days). `kbind issue` re-issues it when less than
    /// `--reissue-before` (default a third of this) is left.
    #[serde(rename = "tokenTTL", default = "default_token_ttl")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('10m') && duration(self) <= duration('168h')").message("tokenTTL must be a duration such as 24h or 90m, between 10m and 168h (7 days)"))]
    #[schemars(length(max = 64))]
    pub token_ttl: String,
    /// The provider namespaces this consumer may sync into (exact names; names and namespaces
    /// are kept, so they are the consumer's own namespace names). The issuer creates them and
    /// grants the exported namespaced APIs there only, with no cluster-wide read: one consumer
    /// cannot read another's objects. A namespace belongs to one Grant (the oldest naming it);
    /// required when an Export has namespaced APIs (docs/issue.md "Read isolation").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 100),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    pub namespaces: Vec<String>,
}

/// Reference to the Secret holding the issued kubeconfig.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct SecretRef {
    /// Namespace of the Secret (the issuer's grants namespace).
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
}

/// Observed state of a Grant, written by `kbind issue`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.consumerCluster) || (has(self.consumerCluster) && self.consumerCluster == oldSelf.consumerCluster)").message("consumerCluster is pinned once; re-create the Grant to change it"))]
pub struct GrantStatus {
    /// The Secret holding the issued kubeconfig (key `kubeconfig`), in the grants namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
    /// When the current token expires; a new one is issued before then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The identity issued for this Grant, `<namespace>/<name>` of its ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The consumer cluster this Grant's identity is confined to (its
    /// `core.kbind.io/consumer-cluster` value), pinned from the first heartbeat Lease the
    /// identity wrote. Never changes: re-pinning needs the Grant re-created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_cluster: Option<String>,
    /// The APIs the identity may use (every Export's), `<plural>.<group>`.
    #[serde(rename = "grantedAPIs", default, skip_serializing_if = "Vec::is_empty")]
    pub granted_apis: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (reasons `Issued`; `ExportNotFound`, `CollectionNotFound`, `APINotExported`,
    /// `NamespacesRequired`, `NamespaceTaken`, `NamespaceReserved`, `ClusterScopedAPITaken`,
    /// `PermissionsNotGrantable`, `IssueFailed`), `ConsumerPinned` and `SharedReads`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
