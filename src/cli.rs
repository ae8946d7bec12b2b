//! The `kbind` command line.

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
    Schema(SchemaArgs),
    /// One pass over every bound API: consumer spec up to the provider, provider status down,
    /// conflicts, deletion and the heartbeat; per-API counts recorded on the bindings.
    /// --max-items bounds instance writes in one run.
    Resync(ResyncArgs),
    /// One pass over every CatalogEntry: each tenant APIBinding to its export gets the claims its
    /// requirements and the workspace's Grant call for (core bindings first). --max-items bounds
    /// binding writes in one run. `kbind claims export <entry>` renders the export's claims.
    Claims(Box<crate::claims::ClaimsArgs>),
    /// One pass over due RelationshipSources: upstream directory memberships (Slack, a SCIM
    /// bridge) into SpiceDB. --max-items bounds the scopes handled in one run across sources.
    Relsync(Box<RelsyncArgs>),
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

#[derive(Debug, Clone, clap::Args)]
pub struct SchemaArgs {
    /// Only Connections matching this label selector (e.g. `team=a`), for one-off runs in a
    /// maintenance window. Bindings of missing Connections are then left for a full run.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    #[command(flatten)]
    pub credentials: crate::connection::CredentialArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ResyncArgs {
    /// Only objects covered by bindings matching this label selector (coverage is still resolved
    /// over all bindings, ClusterBindings first).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    #[command(flatten)]
    pub credentials: crate::connection::CredentialArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RelsyncArgs {
    /// Only this RelationshipSource (`namespace/name`), due or not.
    #[arg(long)]
    pub source: Option<String>,
    /// Only these scopes of --source (e.g. `channel/C024BE91L`, `group/abc`), for maintenance
    /// windows. A scoped pass never moves the cursor and never reaps.
    #[arg(long = "scope", requires = "source")]
    pub scopes: Vec<String>,
    /// Only RelationshipSources in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only RelationshipSources matching this label selector.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// SpiceDB HTTP gateway URL (operator-level; tenants cannot choose it).
    #[arg(long, env = "KBIND_SPICEDB_URL")]
    pub spicedb_url: Option<String>,
    /// File holding the SpiceDB preshared key.
    #[arg(long, conflicts_with = "spicedb_token_secret")]
    pub spicedb_token_file: Option<std::path::PathBuf>,
    /// Secret holding the SpiceDB preshared key, as `namespace/name/key`.
    #[arg(long)]
    pub spicedb_token_secret: Option<String>,
    /// Slack Web API root. The Slack kind ignores spec.baseURL.
    #[arg(long, default_value = "https://slack.com/api")]
    pub slack_api_url: String,
    /// Scopes fetched concurrently per source (requests stay paced per upstream method).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Multiply the upstream's published rate limits (tests and benchmarks against local
    /// stand-ins that enforce scaled limits; keep 1 against real services).
    #[arg(long, default_value_t = 1.0, hide = true)]
    pub upstream_rate_scale: f64,
    /// Largest answer read from Slack, a SCIM bridge or SpiceDB (a SpiceDB read stream: each
    /// line), e.g. 16Mi, 512Ki; a larger one fails its request and is never buffered whole.
    #[arg(long, default_value = "16Mi", value_parser = crate::relsync::limits::parse_bytes)]
    pub max_response_bytes: u64,
    /// Most pages one paginated upstream listing may take (an enumeration, a scope's members,
    /// the user list) before it fails: a server that never says "last page" cannot loop a pass.
    #[arg(long, default_value_t = crate::relsync::limits::DEFAULT_MAX_PAGES, value_parser = crate::relsync::limits::parse_pages)]
    pub max_pages: usize,
    /// The least share of the remaining deadline a due source gets (tests use less).
    #[arg(long, env = "KBIND_MIN_SOURCE_SHARE", default_value = "30s", value_parser = crate::pass::args::parse_duration, hide = true)]
    pub min_source_share: std::time::Duration,
}
