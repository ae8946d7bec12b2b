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
    /// How long a run keeps following bindings that are new (created in the last few minutes
    /// and never synced), once it has gone over everything: every 2 s it looks again, syncs each
    /// of their APIs as soon as `kbind schema` (running at the same tick) has installed its CRD,
    /// and keeps syncing it for a few seconds after, so a new binding's first objects go up in
    /// the run that sees it set up, not a CronJob period later (docs/resync.md "First sync").
    /// Never past `--deadline`. 0: off (the default, so a one-off run ends when its work does);
    /// the shipped CronJob sets 30s.
    #[arg(long, env = "KBIND_FIRST_SYNC_WINDOW", default_value = "0s", value_parser = crate::pass::args::parse_duration)]
    pub first_sync_window: std::time::Duration,
}
