//! Flags of `kbind uninstall` (the flags every command takes are in src/pass/args.rs).

#[derive(Debug, Clone, clap::Args)]
pub struct UninstallArgs {
    /// Release the finalizers. Without it (or with --dry-run) the command only lists what it
    /// would release and changes nothing.
    #[arg(long, short = 'y', visible_alias = "confirm")]
    pub yes: bool,
    /// Release even while a kbind pass Lease is held (a pass is running, or one was killed less
    /// than --lease-duration ago). A running pass adds finalizers back: suspend or delete the
    /// CronJobs first.
    #[arg(long)]
    pub force: bool,
    /// Only Connections, Bindings, ClusterBindings, RelationshipSources and Grants matching this label
    /// selector, the Secrets only selected Connections use, and the objects of the consumer CRDs
    /// the selected Connections own. For releasing part of an installation; a full uninstall
    /// takes no selector.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// Where `kbind issue` keeps what it issued (`--grants-namespace` of the issuer): named in
    /// the revoke-by-hand commands of an `iam.kbind.io` Grant whose status does not say.
    #[arg(long, env = "KBIND_GRANTS_NAMESPACE", default_value = "kbind-grants")]
    pub grants_namespace: String,
}
