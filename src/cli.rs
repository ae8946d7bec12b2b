//! The `kbind` command line: assembles the commands from each pass's own flags
//! (`<pass>/args.rs`) and the flags every pass takes (src/pass/args.rs). No pass imports this
//! module.

use clap::{Parser, Subcommand};

use crate::pass::CommonArgs;

#[derive(Debug, Parser)]
#[command(
    name = "kbind",
    version,
    about = "Batch reconcilers for cross-cluster API binding, permission claims and directory-to-SpiceDB sync",
    long_about = "kbind runs as Kubernetes CronJobs: each subcommand does one bounded pass and exits, \
keeping everything the next run needs in custom resource status.\n\n\
Exit codes: 0 the pass did its work (or skipped because another run holds its Lease); \
1 no progress was possible (API unreachable, auth failure); 2 usage or configuration error."
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One pass over every Connection: credentials, cluster identity, exported-API discovery,
    /// consumer CRD install per pullPolicy/updatePolicy, the setup side of bindings, autoBind
    /// and teardown. --max-items bounds the Connections handled in one run.
    Schema(crate::schema::args::SchemaArgs),
    /// One pass over every bound API: consumer spec up to the provider, provider status down,
    /// conflicts, deletion and the heartbeat; per-API counts recorded on the bindings.
    /// --max-items bounds instance writes in one run.
    Resync(crate::resync::args::ResyncArgs),
    /// One pass over every CatalogEntry: each tenant APIBinding to its export gets the claims its
    /// requirements and the workspace's Grant call for (core bindings first). --max-items bounds
    /// binding writes in one run. `kbind claims export <entry>` renders the export's claims.
    Claims(Box<crate::claims::args::ClaimsArgs>),
    /// One pass over due RelationshipSources: upstream directory memberships (Slack, a SCIM
    /// bridge) into SpiceDB. --max-items bounds the scopes handled in one run across sources.
    Relsync(Box<crate::relsync::args::RelsyncArgs>),
    /// Print the CustomResourceDefinitions kbind uses (what deploy/crds/ holds).
    Crds {
        /// Print the kcp CRDs (APIBinding, APIExport, APIExportEndpointSlice, LogicalCluster)
        /// instead, for running `kbind claims` against a plain Kubernetes API server.
        #[arg(long)]
        kcp: bool,
    },
    /// Print the version.
    Version,
}
