//! Provider catalog and workspace consent for `kbind claims` (docs/claims.md, docs/contract.md "Claims").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Reference to an APIExport: a workspace path (empty = the hub's own) and a name.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct ExportRef {
    /// Workspace path of the APIExport, e.g. `root:providers:db`; empty: the hub's own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Name of the APIExport.
    pub name: String,
}

/// One thing a provider needs, claimed on its tenants' bindings.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, KubeSchema,
)]
pub struct Requirement {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// Resource, or a verb coordinate such as `instances/exec`.
    #[x_kube(validation = Rule::new("self.matches('^[a-z][-a-z0-9]*[a-z0-9](/[a-z][-a-z0-9]*[a-z0-9])?$')").message("must be a resource such as instances, or a coordinate such as instances/exec"))]
    #[schemars(length(min = 2, max = 253))]
    pub resource: String,
    /// Another CatalogEntry whose kinds this is (a composition). Empty: the provider's own need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// A provider in the hub's catalog: its APIExport and what it declares it needs.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "providers.kbind.io",
    version = "v1alpha1",
    kind = "CatalogEntry",
    doc = "A provider in the hub's catalog: its APIExport and the permission claims it needs on its tenants' APIBindings. `kbind claims` keeps every tenant binding of the export in step with it (docs/claims.md).",
    status = "CatalogEntryStatus",
    shortname = "kbcat",
    shortname = "cate",
    category = "kbind",
    printcolumn = r#"{"name":"Export","type":"string","jsonPath":".spec.export.name"}"#,
    printcolumn = r#"{"name":"Org","type":"string","jsonPath":".spec.org"}"#,
    printcolumn = r#"{"name":"Checked","type":"integer","jsonPath":".status.bindingsChecked"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntrySpec {
    /// The provider's APIExport.
    pub export: ExportRef,
    /// Owning org; empty for a platform provider.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub org: String,
    /// What the provider needs claimed on its tenants' bindings (at most 200).
    #[serde(default)]
    #[schemars(length(max = 200))]
    pub requires: Vec<Requirement>,
}

/// What `kbind claims` last did for this provider's bindings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntryStatus {
    /// Hash of `spec.requires` the current (cursor set) or last complete cycle applied.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub requirements_hash: String,
    /// `<workspace>|<binding>` of the last binding handled in an unfinished cycle; empty when
    /// the cycle completed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cursor: String,
    #[serde(default)]
    pub bindings_checked: i64,
    #[serde(default)]
    pub bindings_updated: i64,
    /// Requirements the live APIExport does not list, so they are not claimed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200))]
    pub missing_on_export: Vec<Requirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A composition a workspace consented to.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Composition {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// Resource (or verb coordinate) of the other provider's kinds.
    pub resource: String,
}

/// A workspace's recorded consent to a provider's compositions.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[kube(
    group = "tenancy.kbind.io",
    version = "v1alpha1",
    kind = "Grant",
    doc = "A workspace's recorded consent to a provider's compositions (claims on another provider's kinds). `kbind claims` accepts such a claim on the workspace's binding only while a Grant lists it (docs/claims.md).",
    namespaced,
    shortname = "kbgrant",
    category = "kbind",
    printcolumn = r#"{"name":"Workspace","type":"string","jsonPath":".spec.workspace"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GrantSpec {
    /// Logical cluster name of the workspace.
    pub workspace: String,
    /// The CatalogEntry the consent is for.
    pub provider: String,
    /// The compositions consented to.
    #[serde(default)]
    pub compositions: Vec<Composition>,
}
