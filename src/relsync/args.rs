//! Flags of `kbind relsync` (the flags every pass takes are in src/pass/args.rs).

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
    /// Share of each upstream method's published rate limit to use, above 0 and at most 1:
    /// 0.9 leaves a tenth to other clients of the same Slack app; up to 1.0 when the app is
    /// kbind's alone (docs/relsync.md "Rate limits").
    #[arg(long, default_value_t = crate::relsync::ratelimit::DEFAULT_PACE, value_parser = crate::relsync::ratelimit::parse_pace)]
    pub pace: f64,
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
