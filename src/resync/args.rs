//! Flags of `kbind resync` (the flags every pass takes are in src/pass/args.rs).

#[derive(Debug, Clone, clap::Args)]
pub struct ResyncArgs {
    /// Only objects covered by bindings matching this label selector (coverage is still resolved
    /// over all bindings, ClusterBindings first).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    #[command(flatten)]
    pub write: crate::pass::concurrency::WriteConcurrencyArgs,
    #[command(flatten)]
    pub credentials: crate::connection::CredentialArgs,
    /// How long a deleted consumer object waits for its provider copy to go. A provider that
    /// keeps the copy terminating (a finalizer of its own) would otherwise hold the consumer
    /// object, and its namespace's deletion, forever; past this, counted from the consumer
    /// object's deletion, its finalizer is released with a Warning Event and the copy is left
    /// to the provider (docs/resync.md "Deletion").
    #[arg(long, env = "KBIND_PROVIDER_DELETION_WAIT", default_value = "30m", value_parser = crate::pass::args::parse_duration)]
    pub provider_deletion_wait: std::time::Duration,
}
