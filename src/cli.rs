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
1 no progress was possible (API unreachable, auth failure); 2 usage or configuration error; \
3 (`kbind status` only) something is not Ready."
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
    /// Provider side of the service layer: one pass over every Grant (iam.kbind.io): its
    /// ServiceAccount, RBAC and write-confining admission policy, a token re-issued before it
    /// expires into a kubeconfig Secret, revocation on deletion. --max-items bounds the Grants
    /// written in one run. `--print-kubeconfig GRANT` prints an issued kubeconfig.
    Issue(crate::issue::IssueArgs),
    /// Read-only overview of every kbind resource on the cluster: Connections, ClusterBindings
    /// and Bindings (per-API counts), CatalogEntries, RelationshipSources and Grants, as tables
    /// (or -o json|yaml). Kinds not installed are skipped. Takes no Lease and writes nothing.
    /// Exit 0 when everything is Ready, 3 when something is not.
    Status(crate::status::StatusArgs),
    /// Bind this cluster to a provider in one command: validate --provider-kubeconfig as kbind
    /// schema would, check the chosen APIs (--apis, or --export) are exported, then write the
    /// Secret (in --credential-namespace), the Connection and a ClusterBinding (or, with
    /// --namespace, a Binding), all named --name. A second run writes nothing. Refuses (exit 2)
    /// to overwrite objects it did not write, unless --force. --dry-run prints the manifests
    /// (docs/binding-flow.md).
    Bind(Box<crate::bind::BindArgs>),
    /// Print the CustomResourceDefinitions kbind uses (what deploy/crds/ holds).
    Crds {
        /// Print the kcp CRDs (APIBinding, APIExport, APIExportEndpointSlice, LogicalCluster)
        /// instead, for running `kbind claims` against a plain Kubernetes API server.
        #[arg(long)]
        kcp: bool,
    },
    /// Release every finalizer kbind put on objects (core.kbind.io/syncer, core.kbind.io/cleanup,
    /// kbind.io/relsync-cleanup), so deleting kbind leaves nothing Terminating. A dry run unless
    /// --yes (alias --confirm). Suspend or delete the kbind CronJobs first: with --yes it refuses
    /// (exit 2) while a pass Lease is held, unless --force. Deletes nothing; prints what to delete
    /// next (docs/operations.md, "Uninstall"). Exit 1 if an object could not be released.
    Uninstall(crate::uninstall::UninstallArgs),
    /// Print the version.
    Version,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kbind").chain(args.iter().copied()))
    }

    /// Every duration flag takes Go's grammar (src/pass/duration.rs), `1.5h` included.
    #[test]
    fn every_duration_flag_takes_go_durations() {
        let cli = parse(&[
            "--deadline",
            "1.5h",
            "--request-timeout",
            "2m3.5s",
            "--lease-duration",
            "1h30m",
            "relsync",
            "--min-source-share",
            "300ms",
        ])
        .unwrap();
        assert_eq!(cli.common.deadline, Duration::from_secs(5400));
        assert_eq!(cli.common.request_timeout, Duration::from_millis(123_500));
        assert_eq!(cli.common.lease_duration, Duration::from_secs(5400));
        let Command::Relsync(args) = cli.command else {
            panic!("relsync")
        };
        assert_eq!(args.min_source_share, Duration::from_millis(300));
    }

    #[test]
    fn relsync_pace_defaults_to_0_9_and_refuses_more_than_the_tier() {
        let pace = |args: &[&str]| match parse(args).map(|c| c.command) {
            Ok(Command::Relsync(a)) => Ok(a.pace),
            Ok(_) => panic!("relsync"),
            Err(e) => Err(e),
        };
        assert_eq!(pace(&["relsync"]).unwrap(), 0.9);
        assert_eq!(pace(&["relsync", "--pace", "1"]).unwrap(), 1.0);
        for bad in ["--pace=1.5", "--pace=0", "--pace=-1", "--pace=nan"] {
            let e = pace(&["relsync", bad]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            assert!(e.to_string().contains("--pace"), "{e}");
        }
    }

    #[test]
    fn log_level_defaults_to_info_and_takes_the_five_levels() {
        use crate::pass::args::LogLevel;
        assert_eq!(parse(&["status"]).unwrap().common.log_level, LogLevel::Info);
        for (flag, want) in [
            ("error", LogLevel::Error),
            ("warn", LogLevel::Warn),
            ("info", LogLevel::Info),
            ("debug", LogLevel::Debug),
            ("trace", LogLevel::Trace),
        ] {
            let cli = parse(&["schema", "--log-level", flag]).unwrap();
            assert_eq!(cli.common.log_level, want);
            assert_eq!(want.as_str(), flag);
        }
        let e = parse(&["--log-level", "verbose", "status"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn duration_flags_refuse_what_go_refuses_and_what_is_too_long() {
        for (flag, value, says) in [
            ("--deadline", "600", "needs a unit"),
            ("--deadline=-1m", "", "negative"),
            ("--deadline", "2d", "no days"),
            ("--deadline", "99999999999999999h", "too long"),
            ("--request-timeout", "1h 30m", "unknown unit"),
            ("--lease-duration", "1.5s", "whole number of seconds"),
        ] {
            let args: Vec<&str> = [flag, value, "schema"]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect();
            let e = parse(&args).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag} {value}"
            );
            let text = e.to_string();
            let name = flag.split('=').next().unwrap_or(flag);
            assert!(text.contains(name) && text.contains(says), "{text}");
        }
    }
}
