//! `core.kbind.io/v1alpha1`: Connection, ClusterBinding and Binding (docs/schema.md, docs/resync.md).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "core.kbind.io";
pub const VERSION: &str = "v1alpha1";

/// CEL: `<plural>.<group>`, lower-case DNS labels; refuses Kinds, versions and URLs.
pub const API_NAME_RULE: &str =
    r"self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$')";
/// The most APIs one binding lists (its CRD's `spec.apis` maxItems; a test keeps them equal).
pub const MAX_BINDING_APIS: usize = 500;

pub const API_NAME_MESSAGE: &str = "must be <plural>.<group> in lower case, e.g. widgets.example.org (not a Kind, a version or a URL)";

/// Where the provider credentials live. The reference is immutable; the Secret's data is not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct SecretKeyRef {
    /// Namespace of the Secret (required: never resolved relative to a binding).
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
    /// Key in the Secret's data holding a self-contained kubeconfig.
    #[serde(default = "default_kubeconfig_key")]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    super::keys::KUBECONFIG_KEY.into()
}

/// Which provider discovery mechanism finds exported APIs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum SchemaSource {
    /// Labelled CRDs first; a successful empty list falls through to OpenAPI.
    #[default]
    Auto,
    /// Provider CRDs labelled `core.kbind.io/exported: "true"`.
    #[serde(rename = "CRD")]
    Crd,
    /// Non-built-in discovery groups and `/openapi/v3`.
    #[serde(rename = "OpenAPI")]
    OpenApi,
}

impl SchemaSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "Auto",
            Self::Crd => "CRD",
            Self::OpenApi => "OpenAPI",
        }
    }
}

/// Which consumer CRDs are installed.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum PullPolicy {
    /// Only APIs named by a Binding or ClusterBinding.
    #[default]
    Bound,
    /// Every discovered exported API.
    All,
    /// Never create consumer CRDs; an external manager supplies them.
    None,
}

/// Whether an installed consumer CRD follows provider changes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum UpdatePolicy {
    /// Follow provider schema changes (by schema hash).
    #[default]
    Always,
    /// Pin the first pulled schema.
    Once,
}

/// Schema policy of a Connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaPolicy {
    /// How exported APIs are found: `Auto` (default), `CRD` or `OpenAPI`.
    #[serde(default)]
    pub source: SchemaSource,
    /// Which consumer CRDs are installed: `Bound` (default), `All` or `None`.
    #[serde(default)]
    pub pull_policy: PullPolicy,
    /// Whether installed CRDs follow provider changes: `Always` (default) or `Once`.
    #[serde(default)]
    pub update_policy: UpdatePolicy,
}

/// A link to one provider cluster: credentials, pinned identity, discovery and schema policy.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "Connection",
    doc = "A link from this (consumer) cluster to one provider cluster: the Secret holding its kubeconfig, the provider's identity pinned at the first connection, and how its exported APIs are discovered and their schemas pulled. `kbind schema` reconciles it (docs/schema.md).",
    status = "ConnectionStatus",
    shortname = "kbconn",
    category = "kbind",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".status.activeSchemaSource"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","priority":1,"jsonPath":".status.remoteClusterUID"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionSpec {
    /// The Secret holding the provider kubeconfig. Immutable: a new provider is a new Connection.
    #[x_kube(validation = Rule::new("self == oldSelf").message("kubeconfigSecretRef is immutable; create a new Connection for another provider"))]
    pub kubeconfig_secret_ref: SecretKeyRef,
    /// How the provider's exported APIs are discovered and their schemas installed here.
    #[serde(default)]
    pub schema: SchemaPolicy,
    /// Maintain a ClusterBinding named after this Connection listing every exported API.
    #[serde(default)]
    pub auto_bind: bool,
    /// The namespaces whose Bindings may use this Connection, by their labels (a label
    /// selector, Kubernetes semantics): omitted, no namespaced Binding may; `{}`, every
    /// namespace. ClusterBindings are not affected. A tenant of one namespace must not drive a
    /// credential someone else owns (docs/schema.md "Namespaced Bindings").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_namespaces: Option<LabelSelector>,
    /// The namespaces whose Bindings may use `conflictPolicy: Adopt`, i.e. take over provider
    /// objects kbind did not create: omitted, none may (their conflicts are reported as under
    /// `Fail`). ClusterBindings are not affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption_namespaces: Option<LabelSelector>,
}

/// One API the provider exports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportedApi {
    /// `<plural>.<group>`.
    pub name: String,
    /// `Namespaced` or `Cluster`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scope: String,
    /// The version the consumer CRD serves and instance sync uses.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Hash of the provider schema as kbind would install it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schema_hash: String,
}

/// Observed state of a Connection. Written by `kbind schema`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.remoteClusterUID) || (has(self.remoteClusterUID) && self.remoteClusterUID == oldSelf.remoteClusterUID)").message("remoteClusterUID is immutable once recorded"))]
#[x_kube(validation = Rule::new("!has(oldSelf.localClusterUID) || (has(self.localClusterUID) && self.localClusterUID == oldSelf.localClusterUID)").message("localClusterUID is immutable once recorded"))]
pub struct ConnectionStatus {
    /// Provider cluster identity, pinned on first successful connection.
    #[serde(
        rename = "remoteClusterUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub remote_cluster_uid: Option<String>,
    /// Consumer cluster identity, pinned on first successful connection.
    #[serde(
        rename = "localClusterUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub local_cluster_uid: Option<String>,
    /// The source Auto selected (`CRD` or `OpenAPI`), or the explicit one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_schema_source: Option<String>,
    /// Exported APIs, sorted by name.
    #[serde(rename = "exportedAPIs", default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub exported_apis: Vec<ExportedApi>,
    /// Consecutive successful discoveries that found no exports (autoBind deletes only at 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_discoveries: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `kbind schema` last finished this Connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass_time: Option<Time>,
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// Reference to a Connection (cluster-scoped, so no namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct ConnectionRef {
    /// Name of the Connection.
    pub name: String,
}

/// One API a binding activates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct ApiRef {
    /// `<plural>.<group>`, e.g. `widgets.example.org`.
    #[x_kube(validation = Rule::new(API_NAME_RULE).message(API_NAME_MESSAGE))]
    #[schemars(length(min = 3, max = 253))]
    pub name: String,
}

/// What to do with a provider object that kbind does not own.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ConflictPolicy {
    /// Report a conflict and leave the provider object alone.
    #[default]
    Fail,
    /// Take over a provider object that carries no ownership markers.
    Adopt,
}

/// What happens to a provider copy of ours whose consumer object vanished without kbind (the CRD
/// removed at an unbind, a finalizer removed by hand, a restore from backup): docs/resync.md
/// "Orphans". A consumer object of the same namespace/name re-adopts the copy under every policy.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum OrphanPolicy {
    /// Keep the copy, mark it `core.kbind.io/orphaned` and count it in `boundAPIs[].orphaned`.
    #[default]
    Keep,
    /// Delete the copy (kbind before 0.2 did this unasked; now an explicit opt-in).
    Delete,
    /// Re-create the consumer object from the copy's spec and labels, then sync as usual.
    Restore,
}

/// Activates synchronization of the listed APIs across the consumer cluster.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "ClusterBinding",
    doc = "Activates the listed provider APIs across the whole consumer cluster: `kbind schema` installs their CRDs here, `kbind resync` copies each object's spec to the provider and its status back (docs/resync.md).",
    status = "BindingStatus",
    shortname = "kbcb",
    category = "kbind",
    printcolumn = r#"{"name":"Connection","type":"string","jsonPath":".spec.connectionRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Conflicts","type":"string","jsonPath":".status.conditions[?(@.type==\"Conflicts\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBindingSpec {
    /// The Connection to the provider serving these APIs.
    pub connection_ref: ConnectionRef,
    /// The provider APIs to activate (1 to 500), each `<plural>.<group>`.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = 500))]
    pub apis: Vec<ApiRef>,
    /// A provider object kbind does not own: `Fail` (default: report a conflict) or `Adopt`.
    #[serde(default)]
    pub conflict_policy: ConflictPolicy,
    /// Provider copies whose consumer object is gone: `Keep` (default), `Delete` or `Restore`.
    #[serde(default)]
    pub orphans: OrphanPolicy,
}

/// Activates synchronization of the listed namespaced APIs in this namespace.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "core.kbind.io",
    version = "v1alpha1",
    kind = "Binding",
    doc = "Activates the listed namespaced provider APIs in this namespace only: `kbind schema` installs their CRDs, `kbind resync` syncs this namespace's objects (docs/resync.md).",
    namespaced,
    status = "BindingStatus",
    shortname = "kbb",
    category = "kbind",
    printcolumn = r#"{"name":"Connection","type":"string","jsonPath":".spec.connectionRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Conflicts","type":"string","jsonPath":".status.conditions[?(@.type==\"Conflicts\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// The Connection to the provider serving these APIs.
    pub connection_ref: ConnectionRef,
    /// The provider APIs to activate (1 to 500), each `<plural>.<group>`.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = 500))]
    pub apis: Vec<ApiRef>,
    /// A provider object kbind does not own: `Fail` (default: report a conflict) or `Adopt`.
    #[serde(default)]
    pub conflict_policy: ConflictPolicy,
    /// Provider copies whose consumer object is gone: `Keep` (default), `Delete` or `Restore`.
    #[serde(default)]
    pub orphans: OrphanPolicy,
}

/// Per-API status. `kbind schema` owns name/scope/version/schemaHash; `kbind resync` owns the counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BoundApi {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_hash: Option<String>,
    /// Objects whose provider copy matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_sync: Option<i64>,
    /// Objects not yet synced (budget, deadline, transient errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    /// Objects that do not sync because of an ownership conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict_count: Option<i64>,
    /// Objects whose provider write was forbidden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied: Option<i64>,
    /// Objects whose provider write was rejected (400/422, admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<i64>,
    /// Provider copies of ours whose consumer object is gone (see `spec.orphans`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphaned: Option<i64>,
}

/// Where `kbind resync` stopped, so the next run continues.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResyncProgress {
    /// Deprecated and never written: the resume point of an unfinished pass is kept on the
    /// pass Lease (annotation `kbind.io/resume-after`). Kept so no field leaves v1alpha1.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cursor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass_time: Option<Time>,
    /// When a pass last covered every object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_complete_time: Option<Time>,
}

/// Observed state of a ClusterBinding or Binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingStatus {
    #[serde(rename = "boundAPIs", default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub bound_apis: Vec<BoundApi>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<ResyncProgress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// Condition types and reasons of the core kinds (docs/schema.md, docs/resync.md).
pub mod condition {
    pub const READY: &str = "Ready";
    pub const SECRET_VALID: &str = "SecretValid";
    pub const CONNECTED: &str = "Connected";
    pub const PERMISSION_DENIED: &str = "PermissionDenied";
    pub const SCHEMA_IN_SYNC: &str = "SchemaInSync";
    pub const SYNCED: &str = "Synced";
    pub const CONFLICTS: &str = "Conflicts";
    /// Binding synced through an issued credential: False `NotPinned` while the provider's Grant
    /// refuses its writes for want of a pinned consumer cluster (set by resync, only once that
    /// happened; True `Pinned` after).
    pub const CONSUMER_PINNED: &str = "ConsumerPinned";
    pub const INSTANCES_RELEASED: &str = "InstancesReleased";
    /// Connection: whether autoBind maintains its ClusterBinding (`NameTaken` when another
    /// binding holds that name).
    pub const AUTO_BIND: &str = "AutoBind";
    /// Connection whose Secret carries `core.kbind.io/grant-secret`: whether its kubeconfig is in
    /// step with the Grant's Secret on the provider (rotation by pull, docs/binding-flow.md).
    pub const CREDENTIAL_ROTATION: &str = "CredentialRotation";

    pub const REASON_CLUSTER_IDENTITY_CHANGED: &str = "ClusterIdentityChanged";
    pub const REASON_FOREIGN_CRD: &str = "ForeignCRD";
    /// Connected=False: the provider refused the credential (401: revoked or expired).
    pub const REASON_CREDENTIAL_REJECTED: &str = "CredentialRejected";
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn a_binding_crd_lists_at_most_max_binding_apis() {
        for crd in [ClusterBinding::crd(), Binding::crd()] {
            let v = serde_json::to_value(&crd).unwrap();
            let apis = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["properties"]["apis"];
            assert_eq!(
                apis["maxItems"].as_u64(),
                Some(MAX_BINDING_APIS as u64),
                "{}",
                crd.spec.names.kind
            );
        }
    }
}
