//! Labels, annotations, finalizers and field managers (docs/contract.md "Keys").

/// Provider CRD label that exports an API (exact value "true" only).
pub const EXPORTED: &str = "core.kbind.io/exported";
/// Consumer CRD label: kbind manages this CRD.
pub const MANAGED: &str = "core.kbind.io/managed";
/// Consumer CRD annotation: the one Connection that owns it.
pub const CONNECTION: &str = "core.kbind.io/connection";
/// Finalizer on Connection, its Secret, Binding and ClusterBinding: teardown not finished.
pub const CLEANUP_FINALIZER: &str = "core.kbind.io/cleanup";
/// Consumer CRD annotation, value `"true"`: kbind created this CRD. Set only when `kbind schema`
/// creates it (kept by its schema updates), never by stamping; teardown deletes only CRDs
/// carrying it (docs/contract.md "Unbind and teardown").
pub const CREATED: &str = "core.kbind.io/created";
/// Consumer CRD annotation: hash of the provider schema it was made from.
pub const SCHEMA_HASH: &str = "core.kbind.io/schema-hash";
/// Provider object label: the consumer cluster UID that owns it.
pub const CONSUMER_CLUSTER: &str = "core.kbind.io/consumer-cluster";
/// Provider object annotation: the consumer object UID that owns it.
pub const CONSUMER_OBJECT_UID: &str = "core.kbind.io/consumer-object-uid";
/// Annotation on a namespaced provider copy: the UID of its consumer object's namespace. A copy
/// is re-adopted (or restored) only into the same namespace, not one of the same name that was
/// deleted and created again by someone else (docs/resync.md "Orphans").
pub const CONSUMER_NAMESPACE_UID: &str = "core.kbind.io/consumer-namespace-uid";
/// Finalizer on synced consumer objects: provider copy not yet handled.
pub const SYNCER_FINALIZER: &str = "core.kbind.io/syncer";
/// Consumer object annotation: why it does not sync.
pub const CONFLICT: &str = "core.kbind.io/conflict";
/// Consumer object annotation: on delete, hand the provider copy over instead of deleting it.
pub const DELETION_POLICY: &str = "core.kbind.io/deletion-policy";
/// The only value of [`DELETION_POLICY`] kbind acts on.
pub const DELETION_POLICY_ORPHAN: &str = "Orphan";

/// Provider object annotation: a copy of ours whose consumer object is gone, and why
/// ([`ORPHANED_CONSUMER_OBJECT_GONE`] or [`ORPHANED_UNBOUND`]).
pub const ORPHANED: &str = "core.kbind.io/orphaned";
/// The consumer object vanished without kbind (finalizer removed by hand, restore from backup).
pub const ORPHANED_CONSUMER_OBJECT_GONE: &str = "ConsumerObjectGone";
/// The ClusterBinding was deleted: the consumer CRD and its objects go, the copy stays.
pub const ORPHANED_UNBOUND: &str = "Unbound";
/// `core.kbind.io/orphaned` (and the conflict reason) for a copy whose consumer namespace was
/// deleted and created again: it is never re-adopted or restored there.
pub const NAMESPACE_RECREATED: &str = "NamespaceRecreated";

/// Prefix of the heartbeat Lease on the provider.
pub const HEARTBEAT_LEASE_PREFIX: &str = "consumer-";

/// Consumer Secret annotation written by `kbind bind`: `<namespace>/<name>` of the Grant's issued
/// Secret on the provider, which `kbind schema` pulls a re-issued kubeconfig from
/// (docs/binding-flow.md "Rotation by pull"). Only Secrets carrying it are ever written.
pub const GRANT_SECRET: &str = "core.kbind.io/grant-secret";
/// Issued Secret annotation (provider; copied to the consumer Secret): the Grant's name.
pub const IAM_GRANT: &str = "iam.kbind.io/grant";
/// Issued Secret annotation (provider; copied to the consumer Secret): when its token expires,
/// RFC 3339.
pub const IAM_EXPIRES_AT: &str = "iam.kbind.io/expires-at";

/// The prefix of every name kbind derives from a pass: its Lease `kbind-<pass>[-<i>-of-<n>]`, its
/// field managers, its CronJob and ServiceAccount.
pub const PASS_PREFIX: &str = "kbind-";

/// Field manager for a pass's server-side apply writes.
pub fn field_manager(pass: &str) -> String {
    format!("{PASS_PREFIX}{pass}")
}

/// The field manager that owns the finalizers a writer under `manager` adds: apart from its other
/// fields, so releasing a finalizer never drops a field the writer still wants.
pub fn finalizer_manager_of(manager: &str) -> String {
    format!("{manager}-finalizer")
}

/// The field manager of a pass's finalizers, `kbind-<pass>-finalizer`.
pub fn finalizer_manager(pass: &str) -> String {
    finalizer_manager_of(&field_manager(pass))
}

/// The name of every object `kbind issue` makes for a Grant (ServiceAccount, RBAC, admission
/// policy, kubeconfig Secret), so `kbind uninstall` can say how to revoke it by hand.
pub fn grant_object_name(grant: &str) -> String {
    format!("{PASS_PREFIX}grant-{grant}")
}

/// The Secret key holding a kubeconfig: a Connection's default, `kbind bind`'s and the issued one.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
