//! Client-side types for the slice of kcp kbind uses: APIExport and APIBinding permission claims
//! (`apis.kcp.io/v1alpha2`), APIExportEndpointSlice, and LogicalCluster (`core.kcp.io/v1alpha1`).
//! Their CRDs (generated from these types) let tests and non-kcp users run on a plain apiserver.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelectorRequirement};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A claim an APIExport makes (keyed by group and resource on the export).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionClaim {
    #[serde(default)]
    pub group: String,
    pub resource: String,
    #[schemars(length(min = 1))]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub identity_hash: String,
}

/// Selector of a binding's claim: a label selector or `matchAll`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub match_all: bool,
}

/// Acceptance of a claim; kcp knows exactly these two.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ClaimState {
    Accepted,
    #[default]
    Rejected,
}

/// A claim on a binding (keyed by group, resource and identityHash).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceptablePermissionClaim {
    #[serde(default)]
    pub group: String,
    pub resource: String,
    pub verbs: Vec<String>,
    #[serde(default)]
    pub identity_hash: String,
    #[x_kube(validation = Rule::new("self == oldSelf").message("Permission claim selector is immutable"))]
    pub selector: ClaimSelector,
    pub state: ClaimState,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExportReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct BindingReference {
    #[x_kube(validation = Rule::new("self == oldSelf").message("APIExport reference must not be changed"))]
    pub export: ExportReference,
}

/// kcp APIBinding (v1alpha2), as far as claims go.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "apis.kcp.io",
    version = "v1alpha2",
    kind = "APIBinding",
    plural = "apibindings",
    status = "APIBindingStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct APIBindingSpec {
    pub reference: BindingReference,
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["group".into(), "resource".into(), "identityHash".into()]))]
    pub permission_claims: Vec<AcceptablePermissionClaim>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct APIBindingStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_permission_claims: Vec<PermissionClaim>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// kcp APIExport (v1alpha2), as far as claims go.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "apis.kcp.io",
    version = "v1alpha2",
    kind = "APIExport",
    plural = "apiexports",
    status = "APIExportStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct APIExportSpec {
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["group".into(), "resource".into()]))]
    pub permission_claims: Vec<PermissionClaim>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct APIExportStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity_hash: String,
}

/// kcp APIExportEndpointSlice: where an export's virtual workspace is served (one URL per shard).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[kube(
    group = "apis.kcp.io",
    version = "v1alpha1",
    kind = "APIExportEndpointSlice",
    plural = "apiexportendpointslices",
    status = "APIExportEndpointSliceStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct APIExportEndpointSliceSpec {
    pub export: ExportReference,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct APIExportEndpointSliceStatus {
    #[serde(default, rename = "endpoints")]
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Endpoint {
    pub url: String,
}

/// kcp LogicalCluster; kbind reads only its UID (the object is always named `cluster`).
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[kube(
    group = "core.kcp.io",
    version = "v1alpha1",
    kind = "LogicalCluster",
    plural = "logicalclusters"
)]
pub struct LogicalClusterSpec {
    #[serde(
        rename = "directlyDeletable",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub directly_deletable: Option<bool>,
}
