//! `catalog.kbind.io/v1alpha1`: Export and Collection, the provider's catalog of offerings for
//! the optional service layer (spec 000 "Export, Collection, and Grant"; docs/issue.md).

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::core::{API_NAME_MESSAGE, API_NAME_RULE};

pub const GROUP: &str = "catalog.kbind.io";

/// One API an Export offers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct ExportApi {
    /// `<plural>.<group>` of a CRD on this cluster labelled `core.kbind.io/exported: "true"`,
    /// e.g. `widgets.example.org`. A name that is not such a CRD is listed in
    /// `status.missingAPIs` and the Grants of this Export are not Ready.
    #[x_kube(validation = Rule::new(API_NAME_RULE).message(API_NAME_MESSAGE))]
    #[schemars(length(min = 3, max = 253))]
    pub name: String,
}

/// An offering: the exported APIs a consumer gets when a Grant names this Export, and any extra
/// permissions its identity needs. Cluster-scoped, on the provider.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "catalog.kbind.io",
    version = "v1alpha1",
    kind = "Export",
    doc = "An offering on the provider: the exported APIs a consumer gets when a Grant names this Export, and any extra permissions its identity needs. `kbind issue` checks every API is an exported CRD (docs/issue.md).",
    status = "ExportStatus",
    shortname = "kbexport",
    category = "kbind",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Description","type":"string","priority":1,"jsonPath":".spec.description"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExportSpec {
    /// What this offering is, for people choosing one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub description: String,
    /// The exported APIs a Grant of this Export gives full access to (objects and their status).
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = 100))]
    pub apis: Vec<ExportApi>,
    /// Extra RBAC rules the consumer identity gets, e.g. reading a ConfigMap the provider's
    /// controller writes. Resource rules hold in the Grant's namespaces only (a Role in each);
    /// `nonResourceURLs` rules are cluster-wide. The issuer can only grant what it holds itself:
    /// a rule it does not hold makes the Grant `Ready=False PermissionsNotGrantable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub permissions: Vec<PolicyRule>,
    /// Who may hold this Export's cluster-scoped APIs. RBAC cannot split a cluster-scoped
    /// resource between consumers, so by default (`Exclusive`) only the oldest Grant reaching
    /// one gets it; `Shared` lets every Grant of this Export hold it, and each such Grant's
    /// `SharedReads` condition says its objects are readable by the others.
    #[serde(default, skip_serializing_if = "ClusterScopedAccess::is_exclusive")]
    pub cluster_scoped_access: ClusterScopedAccess,
}

/// Whether an Export's cluster-scoped APIs may be granted to more than one Grant.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ClusterScopedAccess {
    #[default]
    Exclusive,
    Shared,
}

impl ClusterScopedAccess {
    pub fn is_exclusive(&self) -> bool {
        *self == ClusterScopedAccess::Exclusive
    }
}

/// Observed state of an Export, written by `kbind issue`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportStatus {
    /// APIs in `spec.apis` that are not an exported CRD on this cluster.
    #[serde(rename = "missingAPIs", default, skip_serializing_if = "Vec::is_empty")]
    pub missing_apis: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: every API is an exported CRD (reason `APINotExported` otherwise).
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// One Export of a Collection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct ExportRef {
    /// Name of an Export.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A group of Exports granted together: a Grant naming a Collection gets every Export in it.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "catalog.kbind.io",
    version = "v1alpha1",
    kind = "Collection",
    doc = "A group of Exports granted together: a Grant naming a Collection gets every Export in it (docs/issue.md).",
    shortname = "kbcoll",
    category = "kbind",
    printcolumn = r#"{"name":"Exports","type":"string","jsonPath":".spec.exports[*].name"}"#,
    printcolumn = r#"{"name":"Description","type":"string","priority":1,"jsonPath":".spec.description"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CollectionSpec {
    /// What this collection offers, for people choosing one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub description: String,
    /// The Exports a Grant of this Collection gets, all of them.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(min = 1, max = 100))]
    pub exports: Vec<ExportRef>,
}
