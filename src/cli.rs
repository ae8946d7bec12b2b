//! The `kbind` command line: the flags every pass takes (src/pass/args.rs) and the subcommands,
//! which the registry assembles from each pass's own flags (src/registry.rs). Only `main` uses
//! this module.

use clap::Parser;

use crate::pass::CommonArgs;
pub use crate::registry::Command;

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kbind").chain(args.iter().copied()))
    }

    /// Every registered pass and one-off command is a subcommand (src/registry.rs).
    #[test]
    fn every_registered_job_is_a_subcommand() {
        use clap::CommandFactory;
        let cli = Cli::command();
        for d in crate::registry::JOBS {
            assert!(
                cli.find_subcommand(d.name).is_some(),
                "{} is registered but `kbind {}` is no subcommand",
                d.name,
                d.name
            );
        }
        assert!(parse(&["nope"]).is_err());
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
