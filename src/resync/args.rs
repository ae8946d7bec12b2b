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
}
