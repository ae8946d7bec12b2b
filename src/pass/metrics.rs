//! `--pushgateway-url`: once the summary is final, push its figures to a Prometheus Pushgateway
//! in the text exposition format (docs/monitoring.md "Pushgateway").
//!
//! Grouping key: `job=kbind-<pass>`, `instance=<i-of-n>` for `--shard i/n`, else `all`.
//!
//! A run that succeeded (outcome `completed` or `partial`) PUTs: the whole group is replaced,
//! `kbind_last_success_timestamp_seconds` included. Any other run POSTs without it: a POST
//! replaces only the metric names it carries, so a failed or skipped run never erases the last
//! success time an alert watches for staleness (docs/monitoring.md says which figures are the
//! last run's and which the last successful run's). A dry run pushes nothing.
//!
//! A push that fails only logs a warning (its text scrubbed by the log writer: no query string, no credentials);
//! it never changes the exit code. It is bounded by `--request-timeout` and by the pass
//! deadline plus its grace (at least one second, so a pass that used all its time still
//! reports).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::args::CommonArgs;
use super::retry::DEADLINE_GRACE;
use super::summary::{Outcome, Summary};
use crate::upstream::{self, UpstreamError};

/// The Prometheus text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every outcome a summary reports; each gets a `kbind_pass_outcome` sample, 1 for this run's.
pub const OUTCOMES: [&str; 5] = ["completed", "partial", "skipped", "dry-run", "failed"];

/// The most of an error answer kept for the warning.
const ERROR_BODY_CAP: u64 = 4 << 10;

/// Why a push did not land.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("--pushgateway-url is not an http(s) URL")]
    BadUrl,
    #[error(transparent)]
    Client(UpstreamError),
    #[error("sending the metrics: {0}")]
    Send(#[source] reqwest::Error),
    #[error("the Pushgateway answered HTTP {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("no answer within {0:?} (--request-timeout, or the pass deadline)")]
    Timeout(Duration),
}

/// The grouping key's `instance`: `i-of-n` for a shard, else `all`.
pub fn instance(args: &CommonArgs) -> String {
    args.shard
        .map(|s| format!("{}-of-{}", s.index, s.count))
        .unwrap_or_else(|| "all".into())
}

/// Whether a run with this outcome and exit code counts as a success.
pub fn succeeded(summary: &Summary, code: i32) -> bool {
    code == 0 && matches!(summary.outcome, Outcome::Completed | Outcome::Partial)
}

/// Push `summary` if `--pushgateway-url` is set and this is not a dry run. `left` is the time
/// remaining before the pass deadline. Never fails: a failed push is a warning.
pub async fn push(args: &CommonArgs, summary: &Summary, code: i32, left: Duration) {
    let Some(url) = args.pushgateway_url.as_deref().filter(|u| !u.is_empty()) else {
        return;
    };
    if args.dry_run {
        tracing::info!("dry run: not pushing metrics to the Pushgateway");
        return;
    }
    let bound = args
        .request_timeout
        .min(left + DEADLINE_GRACE)
        .max(Duration::from_secs(1));
    let success = succeeded(summary, code);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let body = exposition(summary, code, success.then_some(now));
    let result = send(
        url,
        &summary.pass,
        &instance(args),
        success,
        body,
        args.request_timeout,
        bound,
    )
    .await;
    match result {
        Ok(()) => tracing::debug!("pushed the summary to the Pushgateway"),
        Err(e) => tracing::warn!(
            error = %chain(&e),
            "could not push metrics to the Pushgateway; the pass result stands"
        ),
    }
}

/// An error with its causes (reqwest's own text says only "error sending request"), each once.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

/// The push URL: `<base>/metrics/job/kbind-<pass>/instance/<instance>`, the base's own path
/// kept (a Pushgateway behind a path prefix), its query and fragment dropped.
pub fn push_url(base: &str, pass: &str, instance: &str) -> Result<reqwest::Url, PushError> {
    let mut url = reqwest::Url::parse(base).map_err(|_| PushError::BadUrl)?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(PushError::BadUrl);
    }
    url.set_query(None);
    url.set_fragment(None);
    url.path_segments_mut()
        .map_err(|_| PushError::BadUrl)?
        .pop_if_empty()
        .extend([
            "metrics",
            "job",
            &format!("kbind-{pass}"),
            "instance",
            instance,
        ]);
    Ok(url)
}

async fn send(
    base: &str,
    pass: &str,
    instance: &str,
    replace_group: bool,
    body: String,
    request_timeout: Duration,
    bound: Duration,
) -> Result<(), PushError> {
    let url = push_url(base, pass, instance)?;
    let client = upstream::client(request_timeout).map_err(PushError::Client)?;
    let request = if replace_group {
        client.put(url)
    } else {
        client.post(url)
    }
    .header(http::header::CONTENT_TYPE, CONTENT_TYPE)
    .body(body);
    let exchange = async {
        let resp = request
            .send()
            .await
            .map_err(|e| PushError::Send(e.without_url()))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let body = upstream::read_capped(resp, ERROR_BODY_CAP)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        Err(PushError::Refused {
            status: status.as_u16(),
            body,
        })
    };
    tokio::time::timeout(bound, exchange)
        .await
        .map_err(|_| PushError::Timeout(bound))?
}

/// One sample: its label (name and value), if any, and its value.
type Sample<'a> = (Option<(&'a str, &'a str)>, f64);

/// The summary's figures in the text exposition format: gauges (each is this run's figure, not
/// a running total, hence no `_total`), `last_success` only when given.
pub fn exposition(summary: &Summary, code: i32, last_success: Option<f64>) -> String {
    let mut out = String::new();
    let plain = [
        (
            "kbind_pass_duration_seconds",
            "How long the last run took.",
            summary.duration_seconds,
        ),
        (
            "kbind_pass_data_writes",
            "Data writes the last run made (instances, CRDs, binding specs, APIBindings, relationships).",
            summary.data_writes as f64,
        ),
        (
            "kbind_pass_bookkeeping_writes",
            "Bookkeeping writes the last run made (Leases, status).",
            summary.bookkeeping_writes as f64,
        ),
        (
            "kbind_pass_requests",
            "Requests the last run sent to its own cluster.",
            summary.requests as f64,
        ),
        (
            "kbind_pass_exit_code",
            "Exit code of the last run (0 ok, 1 failed, 2 configuration error).",
            f64::from(code),
        ),
    ];
    for (name, help, value) in plain {
        gauge(&mut out, name, help, &[(None, value)]);
    }
    gauge(
        &mut out,
        "kbind_pass_outcome",
        "1 for the outcome of the last run, 0 for the others.",
        &outcomes(summary),
    );
    if let Some(rss) = summary.peak_rss_bytes {
        gauge(
            &mut out,
            "kbind_pass_peak_rss_bytes",
            "Peak resident memory of the last run.",
            &[(None, rss as f64)],
        );
    }
    if !summary.counts.is_empty() {
        let counts: Vec<Sample<'_>> = summary
            .counts
            .iter()
            .map(|(k, v)| (Some(("name", k.as_str())), *v as f64))
            .collect();
        gauge(
            &mut out,
            "kbind_pass_count",
            "The pass's own counts (objects seen, conflicts, scopes, ...) from the last run that reported them.",
            &counts,
        );
    }
    if let Some(t) = last_success {
        gauge(
            &mut out,
            "kbind_last_success_timestamp_seconds",
            "When the last successful run (completed or partial) ended, in Unix seconds.",
            &[(None, t)],
        );
    }
    out
}

/// One sample per known outcome, 1 for this run's (an unknown one is added).
fn outcomes(summary: &Summary) -> Vec<Sample<'_>> {
    let mine = summary.outcome.as_str();
    let mut samples: Vec<Sample<'_>> = OUTCOMES
        .iter()
        .map(|o| (Some(("outcome", *o)), f64::from(u8::from(mine == *o))))
        .collect();
    if !OUTCOMES.contains(&mine) {
        samples.push((Some(("outcome", mine)), 1.0));
    }
    samples
}

/// A gauge family: its HELP and TYPE lines, then its samples.
fn gauge(out: &mut String, name: &str, help: &str, samples: &[Sample<'_>]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (label, value) in samples {
        match label {
            Some((k, v)) => {
                let _ = writeln!(out, "{name}{{{k}=\"{}\"}} {value}", escape(v));
            }
            None => {
                let _ = writeln!(out, "{name} {value}");
            }
        }
    }
}

/// A label value as the text format writes it: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_url_keeps_a_prefix_and_drops_the_query() {
        let u = push_url("http://pg:9091", "schema", "all").unwrap();
        assert_eq!(
            u.as_str(),
            "http://pg:9091/metrics/job/kbind-schema/instance/all"
        );
        let u = push_url("https://h/prefix/?x=1#f", "resync", "1-of-4").unwrap();
        assert_eq!(
            u.as_str(),
            "https://h/prefix/metrics/job/kbind-resync/instance/1-of-4"
        );
        for bad in ["pg:9091", "ftp://h", "", "mailto:a@b"] {
            assert!(
                matches!(push_url(bad, "p", "all"), Err(PushError::BadUrl)),
                "{bad}"
            );
        }
    }

    #[test]
    fn success_only_for_completed_or_partial_with_exit_zero() {
        let mut s = Summary::new("schema", false);
        for (o, code, ok) in [
            (Outcome::Completed, 0, true),
            (Outcome::Partial, 0, true),
            (Outcome::Skipped, 0, false),
            (Outcome::Failed, 1, false),
            (Outcome::Completed, 1, false),
        ] {
            s.outcome = o;
            assert_eq!(succeeded(&s, code), ok, "{o} {code}");
        }
    }

    #[test]
    fn exposition_escapes_labels_and_carries_last_success_only_when_given() {
        let mut s = Summary::new("schema", false);
        s.outcome = Outcome::Failed;
        s.count("we\"ird\\\n", 2);
        let text = exposition(&s, 1, None);
        assert!(
            text.contains("kbind_pass_count{name=\"we\\\"ird\\\\\\n\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("kbind_pass_outcome{outcome=\"failed\"} 1\n"));
        assert!(text.contains("kbind_pass_outcome{outcome=\"completed\"} 0\n"));
        assert!(!text.contains("kbind_last_success_timestamp_seconds"));
        assert!(
            exposition(&s, 0, Some(17.5)).contains("kbind_last_success_timestamp_seconds 17.5\n")
        );
    }
}
