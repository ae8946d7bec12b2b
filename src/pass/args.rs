//! Flags every pass takes (CONTRACT "CLI").

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

#[derive(Clone, Debug, Args)]
pub struct CommonArgs {
    /// Kubeconfig of the cluster this job runs against. Default: in-cluster, then $KUBECONFIG.
    #[arg(long, env = "KUBECONFIG", global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Observe and plan only: print the writes the pass would make, and make none.
    #[arg(long, global = true)]
    pub dry_run: bool,
    /// Format of the summary and of dry-run plans. Default: text on a terminal, JSON otherwise.
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
    /// Log format. Default: text on a terminal, JSON otherwise.
    #[arg(long, value_enum, global = true)]
    pub log_format: Option<LogFormat>,
}

impl CommonArgs {
    pub fn lease_namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kbind-system".into())
    }
}

/// The longest duration a flag accepts (a year): anything longer is a typo, and arithmetic on
/// it (Lease durations, deadlines) must never overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parse `90s`, `10m`, `1h`, `1h30m`, `500ms`, or bare seconds; at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let too_long = || {
        format!(
            "duration {s:?} is too long (at most {}h)",
            MAX_DURATION.as_secs() / 3600
        )
    };
    if s.chars().all(|c| c.is_ascii_digit()) {
        let secs: u64 = s.parse().map_err(|_| too_long())?;
        let d = Duration::from_secs(secs);
        return if d > MAX_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    let mut total = Duration::ZERO;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        if num.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: expected e.g. 90s, 10m, 1h30m"
            ));
        }
        // Digits only, so a parse failure is an overflow.
        let n: u64 = num.parse().map_err(|_| too_long())?;
        num.clear();
        let part = match unit.as_str() {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            _ => {
                return Err(format!(
                    "invalid duration unit {unit:?} in {s:?}: use ms, s, m or h"
                ));
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .filter(|t| *t <= MAX_DURATION)
            .ok_or_else(too_long)?;
    }
    if !num.is_empty() {
        return Err(format!(
            "invalid duration {s:?}: a number needs a unit (ms, s, m, h)"
        ));
    }
    Ok(total)
}

/// `--lease-duration`: a duration in whole seconds (a Lease counts whole seconds), at least 1s.
pub fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
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
    fn durations() {
        let ok = [
            ("90", 90_000),
            ("90s", 90_000),
            ("10m", 600_000),
            ("1h30m", 5_400_000),
            ("250ms", 250),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s).unwrap(), Duration::from_millis(ms), "{s}");
        }
        for bad in [
            "",
            "10x",
            "m",
            "10m5",
            "-1s",
            "18446744073709551616",
            "18446744073709551615",
            "99999999999999999h",
            "5124095576030431h",
            "8761h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
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
