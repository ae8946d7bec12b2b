//! Flags of `kbind schema` (the flags every pass takes are in src/pass/args.rs).

#[derive(Debug, Clone, clap::Args)]
pub struct SchemaArgs {
    /// Only Connections matching this label selector (e.g. `team=a`), for one-off runs in a
    /// maintenance window. Bindings of missing Connections are then left for a full run.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    #[command(flatten)]
    pub write: crate::pass::concurrency::WriteConcurrencyArgs,
    #[command(flatten)]
    pub credentials: crate::connection::CredentialArgs,
}
