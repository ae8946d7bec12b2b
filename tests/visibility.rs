//! What operators see of a run besides its summary (issue #15): the User-Agent every client
//! sends, so an apiserver's audit log tells the passes apart, and `--log-level`. The apiserver's
//! audit log is not available here: a loopback proxy in front of each real server records the
//! User-Agent headers that reach it.

use crate::relsync_fx;
use crate::support;

use kbind_testkit::faults::{FaultConfig, FaultProxy};
use serde_json::json;
use support::fx::Fx;

fn agent(pass: &str) -> String {
    format!("kbind/{} ({pass})", env!("CARGO_PKG_VERSION"))
}

/// A recording proxy in front of the server of `kubeconfig` (text), and the kubeconfig aimed at it.
async fn recorded(kubeconfig: &str) -> (FaultProxy, String) {
    let proxy = FaultProxy::start(&support::server_of(kubeconfig), FaultConfig::rate(0.0, 1))
        .await
        .unwrap();
    let via = support::via(kubeconfig, &proxy.url());
    (proxy, via)
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_pass_says_kbind_and_its_name_to_its_own_cluster_and_to_the_provider() {
    let fx = Fx::new("agent").await;
    fx.provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let (consumer, consumer_kc) =
        recorded(&std::fs::read_to_string(&fx.env.consumer).unwrap()).await;
    let (provider, provider_kc) = recorded(&fx.provider_kubeconfig()).await;
    fx.secret("provider", "kubeconfig", &provider_kc).await;
    let conn = fx
        .connection("p", "provider", json!({"source": "CRD"}), false)
        .await;
    let kc = support::temp_file("agent-consumer", &consumer_kc);
    let selector = format!("kbind-test={}", fx.label);
    let (code, summary, stderr) = support::kbind_async(&[
        "schema",
        "--kubeconfig",
        &kc.to_string_lossy(),
        "--lease-namespace",
        &fx.ns,
        "--credential-namespace",
        &fx.ns,
        "--selector",
        &selector,
        // The recording proxy speaks plain HTTP on loopback.
        "--allow-kubeconfig-field",
        "http",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{summary}\n{stderr}");
    let st = fx.conn(&conn).await.status.unwrap();
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "the provider was reached through its proxy: {st:?}"
    );
    for (name, p) in [("consumer", &consumer), ("provider", &provider)] {
        assert!(p.stats.requests() > 0, "nothing reached the {name}");
        assert_eq!(
            p.stats.user_agents(),
            [agent("schema")].into(),
            "every request to the {name} carries the pass's User-Agent"
        );
    }

    // A read-only command says its own name.
    let (status, status_kc) = recorded(&std::fs::read_to_string(&fx.env.consumer).unwrap()).await;
    let kc = support::temp_file("agent-status", &status_kc);
    let out = tokio::process::Command::from(support::kbind_command(&[
        "status",
        "--kubeconfig",
        &kc.to_string_lossy(),
        "-l",
        &selector,
    ]))
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(status.stats.user_agents(), [agent("status")].into());
}

/// `kbind status` logs one debug line per kind it listed: seen at `--log-level debug`, not at
/// the default, and `RUST_LOG` wins over the flag.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn log_level_sets_the_level_and_rust_log_wins() {
    let env = support::env();
    let kc = env.consumer.to_string_lossy().into_owned();
    let run = |flags: &[&str], rust_log: Option<&str>| {
        let mut args = vec![
            "status",
            "--kubeconfig",
            &kc,
            "-l",
            "kbind-test=none",
            "--log-format",
            "text",
        ];
        args.extend_from_slice(flags);
        let mut cmd = support::kbind_command(&args);
        cmd.env_remove("RUST_LOG");
        if let Some(v) = rust_log {
            cmd.env("RUST_LOG", v);
        }
        let out = cmd.output().unwrap();
        support::keep_emitted(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let listed = |log: &str| log.lines().filter(|l| l.contains("listed")).count();
    assert_eq!(listed(&run(&[], None)), 0, "info is the default");
    let debug = run(&["--log-level", "debug"], None);
    assert_eq!(
        listed(&debug),
        9,
        "one line per kind (nine kinds):\n{debug}"
    );
    assert!(
        !debug.contains("rustls") && !debug.contains("hyper"),
        "other libraries stay at warn:\n{debug}"
    );
    assert_eq!(
        listed(&run(&["--log-level", "error"], Some("kbind=debug"))),
        9,
        "RUST_LOG wins over --log-level"
    );
    assert_eq!(listed(&run(&["--log-level", "debug"], Some("error"))), 0);

    let mut bad = support::kbind_command(&["--log-level", "verbose", "status"]);
    let out = bad.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// relsync's upstream (the Slack stand-in) and SpiceDB clients come from one builder
/// (src/upstream): both say `kbind/<version> (relsync)`, and so does its Kubernetes client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn relsync_says_kbind_and_its_name_to_the_upstream_and_to_spicedb() {
    use kbind_testkit::slack;
    use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
    let mut rx = Rx::new("agent-rel").await;
    let fake = slack::start(
        workspace(vec![user("U1")], vec![channel("C01", &["U1"])]),
        0,
    )
    .await
    .unwrap();
    let upstream = FaultProxy::start(&fake.url(), FaultConfig::rate(0.0, 1))
        .await
        .unwrap();
    let spicedb = FaultProxy::start(&rx.env.spicedb_url, FaultConfig::rate(0.0, 1))
        .await
        .unwrap();
    rx.env.spicedb_url = spicedb.url();
    let (kube, kc) = recorded(&std::fs::read_to_string(&rx.env.consumer).unwrap()).await;
    let kc = support::temp_file("agent-rel", &kc);
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("s", json!({"kind": "slack"})).await;
    let kc = kc.to_string_lossy().into_owned();
    let ns = rx.ns.clone();
    rx.run(
        &upstream.url(),
        &["--kubeconfig", &kc, "--lease-namespace", &ns],
    )
    .await;
    assert!(
        !rx.held("slack_channel").await.is_empty(),
        "the membership went through both proxies"
    );
    for (name, p) in [("slack", &upstream), ("spicedb", &spicedb), ("kube", &kube)] {
        assert!(p.stats.requests() > 0, "nothing reached {name}");
        assert_eq!(
            p.stats.user_agents(),
            [agent("relsync")].into(),
            "every request to {name} carries the pass's User-Agent"
        );
    }
}
