//! `--pushgateway-url` (docs/monitoring.md "Pushgateway"): the real binary runs `kbind schema`
//! with nothing to do against the test apiservers and pushes its summary to a loopback
//! Pushgateway stand-in; the pushes are checked for method, grouping path, content type and a
//! strictly parsed text exposition body.

mod support;

use std::collections::BTreeMap;

use kbind_testkit::pushgateway;
use support::fx::Fx;

/// A strict reader of the Prometheus text format (0.0.4) as kbind writes it: `# HELP` and
/// `# TYPE` before a family's samples, each family once, samples `name{labels} value`, names
/// and label names by the grammar, `_total` only on counters, one newline at the end. Returns
/// each sample (`name{labels}` as written, labels sorted) with its value.
fn parse_exposition(body: &str) -> BTreeMap<String, f64> {
    fn is_name(s: &str, colon: bool) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    }
    assert!(body.ends_with('\n'), "the body ends with a newline");
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut samples = BTreeMap::new();
    for line in body.strip_suffix('\n').unwrap_or(body).split('\n') {
        assert!(!line.is_empty(), "no blank lines:\n{body}");
        if let Some(rest) = line.strip_prefix("# ") {
            let (kw, rest) = rest.split_once(' ').expect("comment keyword");
            let (name, arg) = rest.split_once(' ').expect("comment name and text");
            assert!(is_name(name, true), "metric name {name:?}");
            match kw {
                "HELP" => assert!(!arg.is_empty()),
                "TYPE" => {
                    assert!(
                        ["counter", "gauge", "summary", "histogram", "untyped"].contains(&arg),
                        "{line}"
                    );
                    assert!(
                        types.insert(name.into(), arg.into()).is_none(),
                        "{name} typed twice"
                    );
                    assert_eq!(
                        name.ends_with("_total"),
                        arg == "counter",
                        "_total only on counters: {line}"
                    );
                    current = Some(name.into());
                }
                other => panic!("unknown comment {other:?}: {line}"),
            }
            continue;
        }
        assert!(!line.starts_with('#'), "{line}");
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?} in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let mut labels = BTreeMap::new();
                let mut rest = rest.strip_suffix('}').expect("closing brace");
                while !rest.is_empty() {
                    let (label, after) = rest.split_once("=\"").expect("label=\"");
                    assert!(is_name(label, false), "label name {label:?}");
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let end = loop {
                        match chars.next().expect("closing quote") {
                            (i, '"') => break i,
                            (_, '\\') => match chars.next().expect("escape").1 {
                                'n' => value.push('\n'),
                                c @ ('\\' | '"') => value.push(c),
                                c => panic!("bad escape \\{c} in {line}"),
                            },
                            (_, c) => value.push(c),
                        }
                    };
                    assert!(labels.insert(label.to_string(), value).is_none());
                    rest = &after[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
                (name, labels)
            }
        };
        assert_eq!(
            current.as_deref(),
            Some(name),
            "a sample under its own # TYPE: {line}"
        );
        let key = if labels.is_empty() {
            name.to_string()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            format!("{name}{{{}}}", l.join(","))
        };
        assert!(samples.insert(key, value).is_none(), "duplicate {line}");
    }
    assert!(samples.keys().all(|k| k.starts_with("kbind_")), "{body}");
    samples
}

fn schema_args(fx: &Fx, lease_ns: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "schema",
        "--kubeconfig",
        &fx.env.consumer.to_string_lossy(),
        "--lease-namespace",
        lease_ns,
        "--selector",
        &format!("kbind-test={}", fx.label),
        "-o",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

async fn schema(
    fx: &Fx,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (i32, serde_json::Value, String) {
    let args = schema_args(fx, &fx.ns, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    support::kbind_async_env(&args, envs).await
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn pass_pushes_its_summary_grouped_by_pass_and_shard() {
    let fx = Fx::new("push").await;
    let pg = pushgateway::start().await.unwrap();
    // A path prefix is kept; a query string is not sent on.
    let url = format!("{}/pg/?token=abcdefgh12345678", pg.url());

    let (code, summary, stderr) = schema(&fx, &["--pushgateway-url", &url], &[]).await;
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(summary["outcome"], "completed", "{summary}");
    let pushes = pg.state.pushes();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    let p = &pushes[0];
    assert_eq!(p.method, "PUT", "a success replaces the whole group");
    assert_eq!(p.path, "/pg/metrics/job/kbind-schema/instance/all");
    assert_eq!(p.query, None);
    assert_eq!(
        p.content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let m = parse_exposition(&p.body);
    assert_eq!(m["kbind_pass_outcome{outcome=\"completed\"}"], 1.0);
    assert_eq!(m["kbind_pass_outcome{outcome=\"failed\"}"], 0.0);
    assert_eq!(m["kbind_pass_exit_code"], 0.0);
    assert_eq!(
        m["kbind_pass_requests"],
        summary["requests"].as_f64().unwrap()
    );
    assert_eq!(m["kbind_pass_data_writes"], 0.0);
    assert_eq!(
        m["kbind_pass_bookkeeping_writes"],
        summary["bookkeeping_writes"].as_f64().unwrap()
    );
    assert!(m["kbind_pass_duration_seconds"] > 0.0);
    for (k, v) in summary["counts"].as_object().unwrap() {
        assert_eq!(
            m[&format!("kbind_pass_count{{name=\"{k}\"}}")],
            v.as_f64().unwrap()
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = m["kbind_last_success_timestamp_seconds"];
    assert!(now - last < 120.0 && last <= now, "{last} vs {now}");

    // A shard is its own instance; the flag's environment variable works as the flag does.
    let (code, _, stderr) = schema(
        &fx,
        &["--shard", "1/3"],
        &[("KBIND_PUSHGATEWAY_URL", &pg.url())],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let pushes = pg.state.pushes();
    assert_eq!(pushes.len(), 2);
    assert_eq!(pushes[1].path, "/metrics/job/kbind-schema/instance/1-of-3");
    assert_eq!(pushes[1].method, "PUT");

    // A failed run POSTs (replacing only the names it carries) without a success time, so the
    // last one pushed stays in the group for a staleness alert.
    let args = schema_args(&fx, "kbind-no-such-ns", &["--pushgateway-url", &pg.url()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = support::kbind_async(&args).await;
    assert_eq!(
        code, 2,
        "a missing Lease namespace is a configuration error: {stderr}"
    );
    let pushes = pg.state.pushes();
    assert_eq!(pushes.len(), 3);
    assert_eq!(pushes[2].method, "POST");
    assert_eq!(pushes[2].path, "/metrics/job/kbind-schema/instance/all");
    let m = parse_exposition(&pushes[2].body);
    assert_eq!(m["kbind_pass_outcome{outcome=\"failed\"}"], 1.0);
    assert_eq!(m["kbind_pass_exit_code"], 2.0);
    assert!(!m.contains_key("kbind_last_success_timestamp_seconds"));

    // A dry run pushes nothing: its figures are not the job's.
    let (code, _, stderr) = schema(&fx, &["--pushgateway-url", &pg.url(), "--dry-run"], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(pg.state.pushes().len(), 3);
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
    let (code, summary, stderr) = schema(
        &fx,
        &["--pushgateway-url", &unreachable, "--request-timeout", "5s"],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(summary["outcome"], "completed");
    assert!(stderr.contains("could not push metrics"), "{stderr}");
    for leak in [secret, "abcdefgh12345678"] {
        assert!(!stderr.contains(leak), "{leak} in {stderr}");
    }

    // A Pushgateway that refuses (e.g. a 400 for a clash with pushed metrics) likewise.
    let pg = pushgateway::start().await.unwrap();
    *pg.state.status.lock().unwrap() = Some(400);
    let (code, _, stderr) = schema(&fx, &["--pushgateway-url", &pg.url()], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("HTTP 400"), "{stderr}");
    assert_eq!(pg.state.pushes().len(), 1);

    // A Pushgateway that takes the request and never answers holds the pass no longer than
    // --request-timeout.
    *pg.state.status.lock().unwrap() = None;
    *pg.state.delay.lock().unwrap() = Some(std::time::Duration::from_secs(120));
    let started = std::time::Instant::now();
    let (code, _, stderr) = schema(
        &fx,
        &["--pushgateway-url", &pg.url(), "--request-timeout", "2s"],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("could not push metrics"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(pg.state.pushes().len(), 2, "the hung push did arrive");
}
