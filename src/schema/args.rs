//! Flags of `kbind schema` (the flags every pass takes are in src/pass/args.rs).

#[derive(Debug, Clone, clap::Args)]
pub struct SchemaArgs {
    /// Only Connections matching this label selector (e.g. `team=a`), for one-off runs in a
    /// maintenance window. Bindings of missing Connections are then left for a full run.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// How often a run reconciles every Connection; runs in between reconcile only the
    /// Connections that changed or whose bindings are new, changed or deleting, and ask no
    /// provider anything about the rest (docs/schema.md "Full sweeps"). 0: every run (the
    /// default, so a one-off run does everything); the shipped CronJob runs every minute with 5m.
    #[arg(long, env = "KBIND_FULL_SWEEP_EVERY", default_value = "0s", value_parser = crate::pass::args::parse_duration)]
    pub full_sweep_every: std::time::Duration,
    #[command(flatten)]
    pub write: crate::pass::concurrency::WriteConcurrencyArgs,
    #[command(flatten)]
    pub credentials: crate::connection::CredentialArgs,
}
