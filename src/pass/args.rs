//! Flags every pass takes (docs/contract.md "A run").

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::shard::Shard;

/// How the summary and dry-run plans are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
    Yaml,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Log level (the least severe level printed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// As `RUST_LOG` and tracing spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Warn => "warn",
            Self::Info => "info",
            Self::Debug => "debug",
            Self::Trace => "trace",
        }
    }

    /// The filter this level stands for: kbind's own lines at this level, other libraries'
    /// (kube, hyper, rustls) at warn at most, so `debug` shows what kbind does rather than TLS
    /// handshakes and request URLs (`RUST_LOG=debug` shows those). kube's client warns with a
    /// whole response body when it cannot decode one (megabytes for a list of CRDs, and whatever
    /// the objects hold): kbind's own error names what failed, so those lines are left out.
    pub fn filter(self) -> String {
        let level = match self {
            Self::Error | Self::Warn => self.as_str().to_string(),
            _ => format!("warn,kbind={}", self.as_str()),
        };
        format!("{level},{QUIET_BODIES}")
    }
}

/// The filter directive that leaves out kube's client's undecodable-response warnings.
const QUIET_BODIES: &str = "kube_client::client=error,kube_client::client::tls=warn";

#[derive(Clone, Debug, Args)]
pub struct CommonArgs {
    /// Kubeconfig of the cluster this job runs against. Tried in order, as kubectl does: this
    /// file; else $KUBECONFIG, files (`a:b`) merged, the first to set a cluster, user, context or
    /// current-context winning, missing ones skipped; else ~/.kube/config; else in-cluster.
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Observe and plan only: print the writes the pass would make, and make none.
    #[arg(long, global = true)]
    pub dry_run: bool,
    /// Format of the summary and of dry-run plans. Default: text on a terminal, JSON otherwise
    /// (`kbind status`: a table unless json or yaml is asked for).
    #[arg(short = 'o', long = "output", value_enum, global = true)]
    pub output: Option<OutputFormat>,
    /// Stop taking new work after this many items (what counts is per pass; see --help of each).
    #[arg(long, global = true)]
    pub max_items: Option<u64>,
    /// Stop taking new work this long after start, persist progress, exit 0 (e.g. 10m, 90s, 1h).
    #[arg(long, default_value = "10m", value_parser = parse_duration, global = true)]
    pub deadline: Duration,
    /// Give up on any one request not finished within this long, from connect through headers to
    /// the last byte of the body; the request is retried if it was a read. Applies to every server
    /// a pass talks to.
    #[arg(long, env = "KBIND_REQUEST_TIMEOUT", default_value = "60s", value_parser = parse_duration, global = true)]
    pub request_timeout: Duration,
    /// Run shard i of n (0-based), e.g. `--shard $(JOB_COMPLETION_INDEX)/4` in an Indexed Job.
    #[arg(long, value_parser = Shard::parse, global = true)]
    pub shard: Option<Shard>,
    /// Namespace of the pass Lease. Default: $POD_NAMESPACE, else kbind-system.
    #[arg(long, env = "KBIND_LEASE_NAMESPACE", global = true)]
    pub lease_namespace: Option<String>,
    /// How long the pass Lease stays ours without renewal (whole seconds, at least 1s). The
    /// running pass renews it every third of this, so a killed run locks later runs out for at
    /// most this long (docs/operations.md, "The pass Lease").
    #[arg(long, env = "KBIND_LEASE_DURATION", default_value = "60s", value_parser = parse_lease_duration, global = true)]
    pub lease_duration: Duration,
    /// Prometheus Pushgateway to push the summary's figures to when the pass ends, grouped by
    /// job=kbind-<pass> and instance=<i-of-n, or all> (docs/monitoring.md). A failed push is
    /// a warning, never a failed pass.
    #[arg(
        long,
        env = "KBIND_PUSHGATEWAY_URL",
        hide_env_values = true,
        value_name = "URL",
        global = true
    )]
    pub pushgateway_url: Option<String>,
    /// Log format. Default: text on a terminal, JSON otherwise.
    #[arg(long, value_enum, global = true)]
    pub log_format: Option<LogFormat>,
    /// Least severe level of kbind's log lines (stderr); other libraries log warnings and errors
    /// only (kube's client errors only: its warnings quote whole response bodies). RUST_LOG, when
    /// set, wins over this flag (e.g. `RUST_LOG=debug` for every library,
    /// `RUST_LOG=kbind=debug,kube=info`).
    #[arg(long, value_enum, default_value_t = LogLevel::Info, global = true)]
    pub log_level: LogLevel,
}

/// The namespace kbind is installed in when nothing says otherwise (docs/operations.md).
pub const DEFAULT_INSTALL_NAMESPACE: &str = "kbind-system";

/// The install namespace: `$POD_NAMESPACE` in a Pod, else [`DEFAULT_INSTALL_NAMESPACE`]. It
/// never follows `--lease-namespace`: the credential namespaces default to it, so a one-off run
/// with another Lease namespace reads the same Secrets as the CronJob (docs/contract.md
/// "Boundaries").
pub fn install_namespace() -> String {
    install_namespace_from(std::env::var("POD_NAMESPACE").ok())
}

fn install_namespace_from(pod_namespace: Option<String>) -> String {
    pod_namespace
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_INSTALL_NAMESPACE.into())
}

impl CommonArgs {
    /// `--lease-namespace`, else the install namespace.
    pub fn lease_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .unwrap_or_else(install_namespace)
    }
}

/// Every duration flag's parser: Go's `time.ParseDuration` grammar, at most a year
/// (src/pass/duration.rs).
pub use super::duration::parse as parse_duration;

/// `--lease-duration`: a duration in whole seconds (a Lease counts whole seconds), at least 1s.
pub fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
        return Err(format!(
            "invalid Lease duration {s:?}: a whole number of seconds, at least 1s"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_namespace_is_the_pods_else_kbind_system() {
        assert_eq!(install_namespace_from(Some("team-x".into())), "team-x");
        assert_eq!(install_namespace_from(Some(String::new())), "kbind-system");
        assert_eq!(install_namespace_from(None), "kbind-system");
    }

    #[test]
    fn lease_durations_are_whole_seconds() {
        assert_eq!(parse_lease_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_lease_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["0s", "500ms", "1500ms", "x"] {
            assert!(parse_lease_duration(bad).is_err(), "{bad}");
        }
    }
}
