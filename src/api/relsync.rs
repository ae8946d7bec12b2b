//! `agentprimitives.authzed.com/v1alpha1`: RelationshipSource and the AgentIdentity holding its
//! credentials (docs/relsync.md, docs/contract.md "relsync").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which credential reads the upstream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceAuth {
    /// AgentIdentity (same namespace) holding the credential.
    pub agent_identity: String,
    /// Credential name on that identity (e.g. a Slack bot token).
    pub credential: String,
}

/// Re-poll cadence and per-pass budget.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceSync {
    /// Interval between full passes, e.g. `15m`. Empty: 15m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Scopes one pass processes at most. Zero or absent: unbounded. A bound below the
    /// source's scope count defers cross-resource reaping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_scopes_per_pass: Option<i32>,
}

/// One upstream directory polled and synced into SpiceDB.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "agentprimitives.authzed.com",
    version = "v1alpha1",
    kind = "RelationshipSource",
    doc = "One upstream directory (Slack, SCIM, ...) that `kbind relsync` polls and syncs into SpiceDB as relationships, with the credential it reads it with (docs/relsync.md).",
    namespaced,
    status = "RelationshipSourceStatus",
    shortname = "relsrc",
    category = "kbind",
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.kind"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Last Sync","type":"date","jsonPath":".status.sync.lastSyncTime"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RelationshipSourceSpec {
    /// The credential that reads the upstream: an AgentIdentity in this namespace and one of its
    /// credentials.
    pub auth: SourceAuth,
    /// Upstream endpoint for customer-hosted kinds. Deliberately unconstrained in the schema
    /// (in-cluster and loopback are legitimate); the credential's allowedHosts must admit it.
    #[serde(rename = "baseURL", default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The kind's own configuration, parsed and validated by the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub config: Option<serde_json::Value>,
    /// The registered relsync kind, e.g. `slack` or `onepassword`.
    pub kind: String,
    /// Re-poll cadence and per-pass budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SourceSync>,
}

fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A failed scope in a pass; `scope` is empty when the failure is not attributable to one.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct ScopeErrorSample {
    #[serde(default)]
    pub scope: String,
    /// Scrubbed and truncated failure text.
    #[serde(default)]
    pub message: String,
}

/// Summary of the most recent pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastPass {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    #[serde(default)]
    pub join_misses: i32,
    #[serde(default)]
    pub pruned: i32,
    #[serde(default)]
    pub reaped_scopes: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope_error_samples: Vec<ScopeErrorSample>,
    #[serde(default)]
    pub scope_errors: i32,
    #[serde(default)]
    pub scoped: bool,
    #[serde(default)]
    pub scopes_processed: i32,
    #[serde(default)]
    pub written: i32,
}

/// Resumption marker for the in-progress or most recent enumeration cycle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncProgress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycle_started_at: Option<Time>,
    #[serde(default)]
    pub enum_complete: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pass: Option<LastPass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// ScopeID of the last scope completed this cycle; empty starts from the beginning.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resume_after: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelationshipSourceStatus {
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncProgress>,
}

/// Reference to a key of a Secret in the AgentIdentity's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialSecretRef {
    /// Name of the Secret (in the AgentIdentity's namespace).
    pub name: String,
    /// Key in the Secret's data.
    pub key: String,
}

/// One named credential and the hosts it may be sent to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCredential {
    /// The credential's name, which a RelationshipSource's `spec.auth.credential` names.
    pub name: String,
    /// The Secret key holding the credential.
    pub secret_ref: CredentialSecretRef,
    /// `host`, `host:port` (exact, case-insensitive) or `*.domain`. Required for any source that
    /// sets `baseURL`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// An agent's credentials, each scoped to the hosts it may be sent to.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "agentprimitives.authzed.com",
    version = "v1alpha1",
    kind = "AgentIdentity",
    doc = "An agent's named credentials (Secret keys in this namespace), each scoped to the hosts it may be sent to. A RelationshipSource names one in `spec.auth` (docs/relsync.md).",
    namespaced,
    shortname = "agentid",
    category = "kbind",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentIdentitySpec {
    /// The credentials, by name.
    #[serde(default)]
    pub credentials: Vec<AgentCredential>,
}

/// Condition types and reasons of RelationshipSource (docs/relsync.md "Status").
pub mod condition {
    pub const READY: &str = "Ready";
    pub const PARTIAL_FAILURE: &str = "PartialFailure";
    pub const REAP_DEFERRED: &str = "ReapDeferred";
    /// `Ready=False` reason of a deleted source whose relationships could not be deleted yet.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
}

/// The finalizer `kbind relsync` keeps on every RelationshipSource it syncs: a deleted source
/// stays until its relationships are deleted from SpiceDB (docs/relsync.md "Deleting a source").
pub const CLEANUP_FINALIZER: &str = "kbind.io/relsync-cleanup";
