//! `--pushgateway-url` (docs/monitoring.md "Pushgateway"): the real binary runs `kbind schema`
//! with nothing to do against the test apiservers and pushes its summary to a real Prometheus
//! Pushgateway of its own (tests/support/pushgateway.rs); the tests scrape it as Prometheus does
//! and check the documented series, labels and values, and what a failed, skipped or dry run
//! leaves of the last successful run's. The testkit's stand-in serves only what a real
//! Pushgateway cannot do: hang, or answer 5xx as a proxy in front of it would.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kbind::pass::lease::{self, Acquired};
use serde_json::Value;
use support::fx::Fx;
use support::pushgateway::{BasicAuth, Labels, Options, Pushgateway, Scrape};

/// The series docs/monitoring.md lists, each a gauge.
const DOCUMENTED: [&str; 9] = [
    "kbind_pass_duration_seconds",
    "kbind_pass_data_writes",
    "kbind_pass_bookkeeping_writes",
    "kbind_pass_requests",
    "kbind_pass_count",
    "kbind_pass_outcome",
    "kbind_pass_exit_code",
    "kbind_pass_peak_rss_bytes",
    "kbind_last_success_timestamp_seconds",
];

/// The outcomes `kbind_pass_outcome` carries, one series each.
const OUTCOMES: [&str; 5] = ["completed", "partial", "skipped", "dry-run", "failed"];

const JOB: &str = "kbind-schema";

/// Test credentials for a Pushgateway behind basic auth (bcrypt cost 4: checked on every request).
const AUTH: BasicAuth = BasicAuth {
    user: "kbind",
    password: "pg-basic-auth-test-pw",
    bcrypt: "$2a$04$.uWpZGEGYB9CAPQVMxgdf./haV95xHd50qhSWZI.uRScqKCyfiPvK",
};

/// One kbind run: its exit code, summary line, stderr, and the Unix time around it.
struct Run {
    code: i32,
    summary: Value,
    stderr: String,
    before: f64,
    after: f64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// `kbind schema` with nothing to do (the fixture's selector matches no Connection).
async fn schema(
    fx: &Fx,
    kubeconfig: &Path,
    lease_ns: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Run {
    let selector = format!("kbind-test={}", fx.label);
    let kubeconfig = kubeconfig.to_string_lossy();
    let mut args = vec![
        "schema",
        "--kubeconfig",
        &kubeconfig,
        "--lease-namespace",
        lease_ns,
        "--selector",
        &selector,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let before = unix_now();
    let (code, summary, stderr) = support::kbind_async_env(&args, envs).await;
    Run {
        code,
        summary,
        stderr,
        before,
        after: unix_now(),
    }
}

/// The summary's `counts` as `kbind_pass_count` series.
fn counts(summary: &Value) -> BTreeMap<Labels, f64> {
    summary["counts"]
        .as_object()
        .expect("counts")
        .iter()
        .map(|(k, v)| {
            (
                Labels::from([("name".to_string(), k.clone())]),
                v.as_f64().expect("count"),
            )
        })
        .collect()
}

/// Every kbind series in the scrape is a documented gauge with help, carries the grouping
/// labels, and no other label than the documented one (`name`, `outcome`).
fn assert_documented_shape(s: &Scrape) {
    for (name, labels, _) in s.samples.iter().filter(|(n, _, _)| n.starts_with("kbind_")) {
        assert!(DOCUMENTED.contains(&name.as_str()), "undocumented {name}");
        assert_eq!(s.types[name], "gauge", "{name}");
        assert!(!s.help[name].is_empty(), "{name} has help");
        let mut keys: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
        assert!(
            keys.remove("job") && keys.remove("instance"),
            "{name}{labels:?}"
        );
        let own: BTreeSet<&str> = match name.as_str() {
            "kbind_pass_count" => ["name"].into(),
            "kbind_pass_outcome" => ["outcome"].into(),
            _ => BTreeSet::new(),
        };
        assert_eq!(keys, own, "{name}{labels:?}");
    }
}

/// The group `kbind-schema`/`instance` holds the figures of `run` exactly as its summary
/// printed them, a push time within the run, and no failed push.
fn assert_last_run(s: &Scrape, instance: &str, run: &Run) {
    let sum = &run.summary;
    let v = |name: &str| {
        s.value(name, JOB, instance)
            .unwrap_or_else(|| panic!("{name} in {instance}: {sum}"))
    };
    let f = |key: &str| sum[key].as_f64().unwrap_or_else(|| panic!("{key}: {sum}"));
    assert_eq!(v("kbind_pass_duration_seconds"), f("duration_seconds"));
    assert_eq!(v("kbind_pass_data_writes"), f("data_writes"));
    assert_eq!(v("kbind_pass_bookkeeping_writes"), f("bookkeeping_writes"));
    assert_eq!(v("kbind_pass_requests"), f("requests"));
    assert_eq!(v("kbind_pass_peak_rss_bytes"), f("peak_rss_bytes"));
    assert_eq!(v("kbind_pass_exit_code"), f64::from(run.code));
    let outcome = sum["outcome"].as_str().expect("outcome");
    let expected: BTreeMap<Labels, f64> = OUTCOMES
        .iter()
        .map(|o| {
            (
                Labels::from([("outcome".to_string(), o.to_string())]),
                f64::from(u8::from(*o == outcome)),
            )
        })
        .collect();
    assert_eq!(s.group("kbind_pass_outcome", JOB, instance), expected);
    let pushed = v("push_time_seconds");
    assert!(
        run.before <= pushed && pushed <= run.after,
        "push_time_seconds {pushed} within the run [{}, {}]",
        run.before,
        run.after
    );
    assert_eq!(v("push_failure_time_seconds"), 0.0, "no push was refused");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_pass_pushes_the_documented_series_grouped_by_pass_and_shard() {
    let fx = Fx::new("push").await;
    // A Pushgateway behind a path prefix and basic auth: the prefix is kept, the query string
    // dropped, the URL's credentials sent as basic auth.
    let pg = Pushgateway::start_with(Options {
        route_prefix: Some("/pg"),
        basic_auth: Some(AUTH),
    })
    .await;
    let with_credentials = |password: &str| {
        pg.url()
            .replacen("http://", &format!("http://{}:{password}@", AUTH.user), 1)
    };
    let base = with_credentials(AUTH.password);
    let url = format!("{base}/?token=abcdefgh12345678");

    let run = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", &url],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.summary, run.stderr);
    assert_eq!(run.summary["outcome"], "completed", "{}", run.summary);
    assert!(!run.stderr.contains("could not push"), "{}", run.stderr);
    let s = pg.scrape().await;
    assert_documented_shape(&s);
    let mut names: BTreeSet<String> = DOCUMENTED.iter().map(|n| n.to_string()).collect();
    names.extend([
        "push_time_seconds".into(),
        "push_failure_time_seconds".into(),
    ]);
    if counts(&run.summary).is_empty() {
        names.remove("kbind_pass_count");
    }
    assert_eq!(s.names_in(JOB, "all"), names, "every documented series");
    assert_last_run(&s, "all", &run);
    assert_eq!(
        s.group("kbind_pass_count", JOB, "all"),
        counts(&run.summary)
    );
    let last = s
        .value("kbind_last_success_timestamp_seconds", JOB, "all")
        .expect("a success pushes its time");
    assert!(
        run.before <= last && last <= run.after,
        "{last} within the run"
    );

    // A shard is a group of its own; the flag's environment variable works as the flag does.
    let shard = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--shard", "1/3"],
        &[("KBIND_PUSHGATEWAY_URL", &base)],
    )
    .await;
    assert_eq!(shard.code, 0, "{}", shard.stderr);
    let s = pg.scrape().await;
    assert_documented_shape(&s);
    assert_last_run(&s, "1-of-3", &shard);
    let shard_last = s
        .value("kbind_last_success_timestamp_seconds", JOB, "1-of-3")
        .expect("the shard's success time");
    assert!(shard.before <= shard_last && shard_last <= shard.after);
    assert_last_run(&s, "all", &run);
    assert_eq!(
        s.value("kbind_last_success_timestamp_seconds", JOB, "all"),
        Some(last),
        "the unsharded group is untouched"
    );
    assert!(s.names_in(JOB, "2-of-3").is_empty());

    // A dry run pushes nothing: its figures are not the job's.
    let dry = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", &base, "--dry-run"],
        &[],
    )
    .await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert_eq!(dry.summary["outcome"], "dry-run");
    let after_dry = pg.scrape().await;
    assert_eq!(
        after_dry.pushed(),
        s.pushed(),
        "a dry run changes no series"
    );
    assert_eq!(
        after_dry.pushes_answered(),
        BTreeMap::from([("200".to_string(), 2.0)]),
        "two pushes, both taken; none from the dry run"
    );

    // Wrong credentials: refused (401), a warning that does not show them, nothing changed.
    let wrong = "wrong-pg-password-42";
    let refused = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", &with_credentials(wrong)],
        &[],
    )
    .await;
    assert_eq!(refused.code, 0, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("could not push metrics") && refused.stderr.contains("HTTP 401"),
        "{}",
        refused.stderr
    );
    for leak in [wrong, AUTH.password] {
        assert!(
            !refused.stderr.contains(leak),
            "{leak} in {}",
            refused.stderr
        );
    }
    assert_eq!(pg.scrape().await.pushed(), s.pushed());
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn only_a_successful_run_pushes_a_success_time_and_nothing_else_erases_it() {
    let fx = Fx::new("pushfailed").await;
    let pg = Pushgateway::start().await;
    let push = ["--pushgateway-url", pg.url()];
    let no_success = |s: &Scrape| {
        s.value("kbind_last_success_timestamp_seconds", JOB, "all")
            .is_none()
    };

    // A job that has never succeeded has no success time, so none is made up: a configuration
    // error (exit 2) first ...
    let config_error = schema(&fx, &fx.env.consumer, "kbind-no-such-ns", &push, &[]).await;
    assert_eq!(config_error.code, 2, "{}", config_error.stderr);
    let s = pg.scrape().await;
    assert_documented_shape(&s);
    assert_last_run(&s, "all", &config_error);
    assert!(no_success(&s), "no success yet");
    assert!(counts(&config_error.summary).is_empty());
    assert!(s.group("kbind_pass_count", JOB, "all").is_empty());

    // ... then a pass that cannot read its own cluster (no RBAC: exit 1).
    let failed = schema(&fx, &fx.env.consumer_restricted, &fx.ns, &push, &[]).await;
    assert_eq!(failed.code, 1, "{}\n{}", failed.summary, failed.stderr);
    assert_eq!(failed.summary["outcome"], "failed");
    let s = pg.scrape().await;
    assert_last_run(&s, "all", &failed);
    assert!(no_success(&s), "a failed run pushes no success time");

    // A success replaces the whole group, its time and counts included.
    let ok = schema(&fx, &fx.env.consumer, &fx.ns, &push, &[]).await;
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let s = pg.scrape().await;
    assert_last_run(&s, "all", &ok);
    let last = s
        .value("kbind_last_success_timestamp_seconds", JOB, "all")
        .expect("a success pushes its time");
    assert!(ok.before <= last && last <= ok.after);
    let ok_counts = s.group("kbind_pass_count", JOB, "all");
    assert_eq!(ok_counts, counts(&ok.summary));

    // A failed run after it: the last run's figures are the failed run's, but the success time
    // and the counts stay the successful run's (docs/monitoring.md "Last success survives a
    // failure").
    let failed = schema(&fx, &fx.env.consumer_restricted, &fx.ns, &push, &[]).await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    let s = pg.scrape().await;
    assert_documented_shape(&s);
    assert_last_run(&s, "all", &failed);
    assert_eq!(
        s.value("kbind_last_success_timestamp_seconds", JOB, "all"),
        Some(last),
        "the failure kept the last success time"
    );
    assert_eq!(s.group("kbind_pass_count", JOB, "all"), ok_counts);

    // A run skipped because another run holds the pass Lease is no success either.
    let Acquired::Held(other) = lease::acquire(fx.consumer.clone(), &fx.ns, JOB, "other-run", 600)
        .await
        .expect("take the pass Lease")
    else {
        panic!("the pass Lease is free");
    };
    let skipped = schema(&fx, &fx.env.consumer, &fx.ns, &push, &[]).await;
    other.release(None, None).await;
    assert_eq!(skipped.code, 0, "{}", skipped.stderr);
    assert_eq!(skipped.summary["outcome"], "skipped", "{}", skipped.summary);
    let s = pg.scrape().await;
    assert_last_run(&s, "all", &skipped);
    assert_eq!(
        s.value("kbind_last_success_timestamp_seconds", JOB, "all"),
        Some(last)
    );
    assert_eq!(s.group("kbind_pass_count", JOB, "all"), ok_counts);

    // The next success moves it on.
    let again = schema(&fx, &fx.env.consumer, &fx.ns, &push, &[]).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let s = pg.scrape().await;
    assert_last_run(&s, "all", &again);
    let next = s
        .value("kbind_last_success_timestamp_seconds", JOB, "all")
        .expect("success time");
    assert!(next > last && again.before <= next && next <= again.after);
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_push_that_fails_is_a_scrubbed_warning_and_the_exit_code_stands() {
    let fx = Fx::new("pushfail").await;
    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let secret = "s3cret-pushgateway-pw";
    let unreachable = format!("http://kbind:{secret}@127.0.0.1:{port}/?token=abcdefgh12345678");
    let run = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", &unreachable, "--request-timeout", "5s"],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.summary, run.stderr);
    assert_eq!(run.summary["outcome"], "completed");
    assert!(
        run.stderr.contains("could not push metrics"),
        "{}",
        run.stderr
    );
    for leak in [secret, "abcdefgh12345678"] {
        assert!(!run.stderr.contains(leak), "{leak} in {}", run.stderr);
    }

    // A real Pushgateway refuses a push whose metric clashes with one another client pushed
    // (here a counter of the same name): HTTP 400, none of the push is kept, and the refusal shows
    // as the group's push_failure_time_seconds.
    let pg = Pushgateway::start().await;
    let (status, answer) = pg
        .push(
            "PUT",
            "other",
            "x",
            "# TYPE kbind_pass_exit_code counter\nkbind_pass_exit_code 3\n",
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let run = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", pg.url()],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("HTTP 400") && run.stderr.contains("kbind_pass_exit_code"),
        "{}",
        run.stderr
    );
    let s = pg.scrape().await;
    assert_eq!(
        s.names_in(JOB, "all"),
        BTreeSet::from([
            "push_failure_time_seconds".into(),
            "push_time_seconds".into()
        ])
    );
    let refused = s.value("push_failure_time_seconds", JOB, "all").unwrap();
    assert!(run.before <= refused && refused <= run.after);
    assert_eq!(s.value("push_time_seconds", JOB, "all"), Some(0.0));
    assert_eq!(s.pushes_answered().get("400"), Some(&1.0));

    // What a real one cannot do, the testkit's stand-in does: a proxy in front answering 503 ...
    let standin = kbind_testkit::pushgateway::start().await.unwrap();
    *standin.state.status.lock().unwrap() = Some(503);
    let run = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &["--pushgateway-url", &standin.url()],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("HTTP 503"), "{}", run.stderr);
    assert_eq!(standin.state.pushes(), 1);

    // ... and one that takes the request and never answers, which holds the pass no longer
    // than --request-timeout.
    *standin.state.status.lock().unwrap() = None;
    *standin.state.delay.lock().unwrap() = Some(std::time::Duration::from_secs(120));
    let started = std::time::Instant::now();
    let run = schema(
        &fx,
        &fx.env.consumer,
        &fx.ns,
        &[
            "--pushgateway-url",
            &standin.url(),
            "--request-timeout",
            "2s",
        ],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr.contains("could not push metrics"),
        "{}",
        run.stderr
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(standin.state.pushes(), 2, "the hung push did arrive");
}
