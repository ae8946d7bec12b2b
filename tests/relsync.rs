//! `kbind relsync` run as the real binary against a real SpiceDB (serve-testing, one store per
//! test) and the local Slack/SCIM stand-ins started in this process.

use crate::relsync_fx;
use crate::support;

use kbind::api::relsync::condition::{PARTIAL_FAILURE, READY, REAP_DEFERRED};
use kbind_testkit::{Fault, scim, slack};
use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
use serde_json::json;
use std::collections::BTreeSet;
use support::fx::cond;

/// A Slack source `s` reading workspace `ws` through a fresh fake.
async fn slack_setup(
    prefix: &str,
    ws: slack::Workspace,
    spec: serde_json::Value,
) -> (Rx, kbind_testkit::Running<slack::SlackState>) {
    let rx = Rx::new(prefix).await;
    let fake = slack::start(ws, 0).await.unwrap();
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    let mut spec = spec;
    spec["kind"] = json!("slack");
    rx.source("s", spec).await;
    (rx, fake)
}

fn members(ch: &str, users: &[&str]) -> Vec<String> {
    users
        .iter()
        .map(|u| format!("{ch}#member@{}@example.com", u.to_lowercase()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn first_sync_then_exact_diffs_then_nothing() {
    let ws = workspace(
        vec![
            user("U1"),
            user("U2"),
            user("U3"),
            slack::User {
                id: "U4".into(),
                email: None,
                ..Default::default()
            },
            slack::User {
                id: "B1".into(),
                email: Some("bot@example.com".into()),
                is_bot: true,
                ..Default::default()
            },
            slack::User {
                id: "USLACKBOT".into(),
                ..Default::default()
            },
            slack::User {
                id: "U9".into(),
                email: Some("gone@example.com".into()),
                deleted: true,
                ..Default::default()
            },
        ],
        vec![
            channel("C1", &["U1", "U2", "U4", "B1", "USLACKBOT", "U9"]),
            channel("C2", &["U2"]),
            slack::Channel {
                is_private: true,
                ..channel("C3", &["U3"])
            },
        ],
    );
    let (rx, fake) = slack_setup("rs-first", ws, json!({})).await;
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["sourcesDue"], 1, "{s}");
    let mut want: Vec<String> = [
        members("C1", &["U1", "U2"]),
        members("C2", &["U2"]),
        members("C3", &["U3"]),
    ]
    .concat();
    want.extend(["C1#workspace@T1", "C2#workspace@T1", "C3#workspace@T1"].map(String::from));
    want.sort();
    assert_eq!(rx.held("slack_channel").await, want);
    assert_eq!(
        rx.held("slack_workspace").await,
        members("T1", &["U1", "U2", "U3"])
    );
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).0, "True");
    assert_eq!(cond(&st.conditions, REAP_DEFERRED), ("False", "Reaped", ""));
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "False");
    let lp = rx.last_pass("s").await;
    // U4 (no email), B1 (bot), USLACKBOT and U9 (deleted) are misses, never written.
    assert_eq!(
        (lp.join_misses, lp.scopes_processed, lp.written, lp.pruned),
        (4, 3, 10, 0)
    );
    let sync = st.sync.unwrap();
    assert!(sync.enum_complete && sync.resume_after.is_empty() && sync.last_sync_time.is_some());
    // The token only ever travelled in the Authorization header.
    assert!(
        fake.state
            .control()
            .seen_auth
            .iter()
            .all(|a| a == &format!("Bearer {SLACK_TOKEN}"))
    );

    // Not due again before its interval.
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(
        (s["counts"]["sourcesDue"].clone(), s["data_writes"].clone()),
        (json!(0), json!(0)),
        "{s}"
    );

    // One member joins C2, one leaves C1: exactly that diff.
    {
        let mut w = fake.state.workspace();
        w.channels[1].members.push("U3".into());
        w.channels[0].members.retain(|m| m != "U2");
    }
    let before = fake.state.control().total_calls();
    let s = rx
        .run(&fake.url(), &["--source", &format!("{}/s", rx.ns)])
        .await;
    assert!(fake.state.control().total_calls() > before);
    let lp = rx.last_pass("s").await;
    assert_eq!((lp.written, lp.pruned), (1, 1), "{s}");
    let held = rx.held("slack_channel").await;
    assert!(held.contains(&"C2#member@u3@example.com".to_string()));
    assert!(!held.contains(&"C1#member@u2@example.com".to_string()));

    // Unchanged: zero data writes, one status write (plus the Lease).
    let s = rx
        .run(&fake.url(), &["--source", &format!("{}/s", rx.ns)])
        .await;
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(
        s["bookkeeping_writes"], 3,
        "Lease take, release, one status: {s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn budgeted_passes_resume_and_finish_the_cycle_without_reaping() {
    let chans: Vec<_> = (1..=5)
        .map(|i| channel(&format!("C{i}"), &["U1"]))
        .collect();
    let ws = workspace(vec![user("U1")], chans);
    let (rx, fake) = slack_setup("rs-budget", ws, json!({"sync": {"maxScopesPerPass": 2}})).await;
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    let sync = st.sync.clone().unwrap();
    assert_eq!(
        (sync.resume_after.as_str(), sync.enum_complete),
        ("channel/C2", false)
    );
    assert_eq!(cond(&st.conditions, REAP_DEFERRED).1, "PartialCoverage");
    assert_eq!(cond(&st.conditions, READY).0, "True");
    let started = sync.cycle_started_at.clone();
    // A cycle in progress is due on the next run without --source.
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["sourcesDue"], 1, "{s}");
    let sync = rx.status("s").await.sync.unwrap();
    assert_eq!(
        (sync.resume_after.as_str(), sync.enum_complete),
        ("channel/C4", false)
    );
    assert_eq!(sync.cycle_started_at, started, "same cycle");
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    let sync = st.sync.clone().unwrap();
    assert_eq!((sync.resume_after.as_str(), sync.enum_complete), ("", true));
    assert_eq!(
        cond(&st.conditions, REAP_DEFERRED).1,
        "PartialCoverage",
        "no single pass covered every scope"
    );
    let held = rx.held("slack_channel").await;
    for i in 1..=5 {
        assert!(
            held.contains(&format!("C{i}#member@u1@example.com")),
            "{held:?}"
        );
    }
    // C5 vanishes upstream; a whole new budgeted cycle never reaps it.
    fake.state.workspace().channels.retain(|c| c.id != "C5");
    let src = format!("{}/s", rx.ns);
    for _ in 0..2 {
        rx.run(&fake.url(), &["--source", &src]).await;
    }
    assert!(rx.status("s").await.sync.unwrap().enum_complete);
    assert!(
        rx.held("slack_channel")
            .await
            .iter()
            .any(|h| h.starts_with("C5#")),
        "never reaped by a budgeted pass"
    );
    // Lifting the bound (zero is unbounded, docs/relsync.md): one pass covers everything and reaps C5.
    rx.patch_spec("s", json!({"sync": {"maxScopesPerPass": 0}}))
        .await;
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, REAP_DEFERRED).1, "Reaped");
    assert!(
        !rx.held("slack_channel")
            .await
            .iter()
            .any(|h| h.starts_with("C5#"))
    );
    assert_eq!(rx.last_pass("s").await.reaped_scopes, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn max_items_bounds_scopes_across_sources_least_recently_synced_first() {
    let chans: Vec<_> = (1..=3)
        .map(|i| channel(&format!("C{i}"), &["U1"]))
        .collect();
    let ws = workspace(vec![user("U1")], chans);
    let (rx, fake) = slack_setup("rs-items", ws, json!({})).await;
    rx.source("t", json!({"kind": "slack"})).await;
    let s = rx.run(&fake.url(), &["--max-items", "4"]).await;
    assert_eq!(s["counts"]["scopesProcessed"], 4, "{s}");
    // "s" sorts first among never-synced sources; "t" got the one scope left.
    assert_eq!(rx.last_pass("s").await.scopes_processed, 3);
    assert_eq!(
        rx.status("t").await.sync.unwrap().resume_after,
        "channel/C1"
    );
    let s = rx.run(&fake.url(), &["--max-items", "4"]).await;
    assert_eq!(
        s["counts"]["sourcesDue"], 1,
        "only t is still mid-cycle: {s}"
    );
    assert!(rx.status("t").await.sync.unwrap().enum_complete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn gone_channel_is_swept_and_an_empty_enumeration_prunes_nothing() {
    let ws = workspace(
        vec![user("U1"), user("U2")],
        vec![channel("C1", &["U1"]), channel("C2", &["U1", "U2"])],
    );
    let (rx, fake) = slack_setup("rs-gone", ws, json!({})).await;
    let src = format!("{}/s", rx.ns);
    rx.run(&fake.url(), &[]).await;
    // A scoped pass on a channel Slack no longer knows (channel_not_found) sweeps its object.
    fake.state.workspace().channels.retain(|c| c.id != "C2");
    rx.run(&fake.url(), &["--source", &src, "--scope", "channel/C2"])
        .await;
    let lp = rx.last_pass("s").await;
    assert!(lp.scoped);
    assert_eq!((lp.reaped_scopes, lp.pruned), (1, 3));
    assert!(
        !rx.held("slack_channel")
            .await
            .iter()
            .any(|h| h.starts_with("C2#"))
    );
    // Every channel gone: a complete enumeration of zero scopes refuses to prune.
    fake.state.workspace().channels.clear();
    rx.run(&fake.url(), &["--source", &src]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, REAP_DEFERRED).1, "EmptyEnumeration");
    assert_eq!(
        rx.held("slack_channel").await,
        vec!["C1#member@u1@example.com", "C1#workspace@T1"]
    );
    assert_eq!(rx.held("slack_workspace").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn every_throttle_shape_backs_off_and_the_pass_completes() {
    let ws = workspace(
        vec![user("U1")],
        vec![channel("C1", &["U1"]), channel("C2", &["U1"])],
    );
    let (rx, fake) = slack_setup("rs-throttle", ws, json!({})).await;
    {
        let mut c = fake.state.control();
        c.push_fault(
            "conversations.members",
            Fault::TooManyRequests {
                retry_after: Some(1),
            },
        );
        c.push_fault(
            "conversations.members",
            Fault::TooManyRequests { retry_after: None },
        );
        c.push_fault("users.list", Fault::OkFalseRatelimited);
    }
    let s = rx.run(&fake.url(), &["--concurrency", "1"]).await;
    assert_eq!(s["counts"]["upstreamThrottles"], 3, "{s}");
    assert_eq!(s["counts"]["scopeErrors"], 0, "{s}");
    assert_eq!(rx.held("slack_channel").await.len(), 4);
    assert_eq!(
        fake.state.control().calls("conversations.members"),
        4,
        "two throttled, two served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_rate_limit_wait_past_the_deadline_ends_the_pass_with_the_cycle_open() {
    let ws = workspace(
        vec![user("U1")],
        (1..=3)
            .map(|i| channel(&format!("C{i}"), &["U1"]))
            .collect(),
    );
    let (rx, fake) = slack_setup("rs-deadline", ws, json!({})).await;
    // The first conversations.members asks for an hour: far past a 20 s deadline.
    fake.state.control().push_fault(
        "conversations.members",
        Fault::TooManyRequests {
            retry_after: Some(3600),
        },
    );
    let t = std::time::Instant::now();
    let s = rx
        .run(&fake.url(), &["--concurrency", "1", "--deadline", "20s"])
        .await;
    assert!(
        t.elapsed() < std::time::Duration::from_secs(15),
        "did not wait out the hour"
    );
    let st = rx.status("s").await;
    let sync = st.sync.clone().unwrap();
    assert!(!sync.enum_complete, "{s}");
    assert_eq!(sync.resume_after, "", "stopped before the first scope");
    assert!(
        sync.cycle_started_at.is_some(),
        "the cycle stays open: due on the next run"
    );
    assert_eq!(cond(&st.conditions, REAP_DEFERRED).1, "PartialCoverage");
    assert!(
        rx.held("slack_channel").await.is_empty(),
        "no half-fetched scope written"
    );
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["sourcesDue"], 1, "{s}");
    let sync = rx.status("s").await.sync.unwrap();
    assert!(sync.enum_complete);
    assert_eq!(rx.held("slack_channel").await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_channel_of_2500_members_is_written_in_batches() {
    let users: Vec<_> = (0..2500).map(|i| user(&format!("U{i:05}"))).collect();
    let ids: Vec<String> = users.iter().map(|u| u.id.clone()).collect();
    let mut ws = workspace(
        users,
        vec![slack::Channel {
            id: "C1".into(),
            name: "all".into(),
            members: ids,
            ..Default::default()
        }],
    );
    ws.max_page = 1000;
    let (rx, fake) = slack_setup("rs-big", ws, json!({"config": {"pageSize": 1000}})).await;
    let s = rx.run(&fake.url(), &[]).await;
    // 2500 members + the workspace link in one scope, 2500 workspace members: 3 + 3 batches.
    assert_eq!(s["data_writes"], 6, "{s}");
    assert_eq!(rx.held("slack_channel").await.len(), 2501);
    let lp = rx.last_pass("s").await;
    assert_eq!(lp.written, 5001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_base_url_not_in_allowed_hosts_receives_nothing() {
    let rx = Rx::new("rs-hosts").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let h = hits.clone();
    let task = tokio::spawn(async move {
        while let Ok((_s, _)) = listener.accept().await {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    rx.identity("scim", "scim-secret", &["scim.example.com", "localhost"])
        .await;
    rx.source(
        "op",
        json!({"kind": "onepassword", "baseURL": format!("http://127.0.0.1:{port}"),
        "auth": {"agentIdentity": "agent", "credential": "scim"}}),
    )
    .await;
    rx.run("http://127.0.0.1:9", &[]).await;
    let st = rx.status("op").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!((status, reason), ("False", "HostNotAllowed"));
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the listener received a connection"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn onepassword_over_an_allowed_loopback_bridge() {
    let rx = Rx::new("rs-scim").await;
    let u = |id: &str, email: &str, active| scim::ScimUser {
        id: id.into(),
        user_name: id.into(),
        emails: vec![(email.into(), true)],
        active,
    };
    let dir = scim::Directory {
        token: "scim-secret".into(),
        users: vec![
            u("u1", "Ada@Example.com", true),
            u("u2", "grace@example.com", true),
            u("u3", "old@example.com", false),
        ],
        groups: (1..=3)
            .map(|i| scim::ScimGroup {
                id: format!("g{i}"),
                display_name: format!("g{i}"),
                members: vec!["u1".into(), "u2".into(), "u3".into()],
            })
            .collect(),
        max_results: 2,
        ..Default::default()
    };
    let bridge = scim::start(dir, 0).await.unwrap();
    rx.identity("scim", "scim-secret", &[&bridge.addr.to_string()])
        .await;
    rx.source(
        "op",
        json!({"kind": "onepassword", "baseURL": bridge.url(),
        "auth": {"agentIdentity": "agent", "credential": "scim"}, "config": {"pageSize": 2}}),
    )
    .await;
    rx.run("http://127.0.0.1:9", &[]).await;
    let st = rx.status("op").await;
    assert_eq!(cond(&st.conditions, READY).0, "True", "{:?}", st.conditions);
    let want: Vec<String> = (1..=3)
        .flat_map(|i| {
            [
                format!("g{i}#member@ada@example.com"),
                format!("g{i}#member@grace@example.com"),
            ]
        })
        .collect();
    assert_eq!(rx.held("scim_group").await, want);
    assert_eq!(rx.last_pass("op").await.join_misses, 1, "the inactive user");

    // A bridge that ignores startIndex: an error, never an endless loop or a false end.
    bridge.state.directory().ignore_start_index = true;
    rx.run(
        "http://127.0.0.1:9",
        &["--source", &format!("{}/op", rx.ns)],
    )
    .await;
    let st = rx.status("op").await;
    let (_, reason, message) = cond(&st.conditions, READY);
    assert_eq!(reason, "EnumerationFailed");
    assert!(message.contains("stalled"), "{message}");
    assert_eq!(rx.held("scim_group").await, want, "nothing pruned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn unknown_kind_and_unknown_config_key_say_so() {
    let rx = Rx::new("rs-kind").await;
    rx.identity("slack", SLACK_TOKEN, &[]).await;
    rx.source("k", json!({"kind": "github"})).await;
    rx.source(
        "c",
        json!({"kind": "slack", "config": {"channelTypes": ["public_channel"]}}),
    )
    .await;
    rx.run("http://127.0.0.1:9", &[]).await;
    let st = rx.status("k").await;
    let (s, reason, msg) = cond(&st.conditions, READY);
    assert_eq!((s, reason), ("False", "UnknownKind"));
    assert!(msg.contains("github"), "{msg}");
    let st = rx.status("c").await;
    let (s, reason, msg) = cond(&st.conditions, READY);
    assert_eq!((s, reason), ("False", "InvalidConfig"));
    assert!(msg.contains("channelTypes"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn error_samples_carry_no_token_or_query_string() {
    let ws = workspace(
        vec![user("U1")],
        vec![channel("C1", &["U1"]), channel("C2", &["U1"])],
    );
    let (rx, fake) = slack_setup("rs-scrub", ws, json!({})).await;
    fake.state.control().push_fault(
        "conversations.members",
        Fault::OkFalse(format!(
            "see https://slack.com/api/x?token={SLACK_TOKEN}#frag Bearer {SLACK_TOKEN}"
        )),
    );
    rx.run(&fake.url(), &["--concurrency", "1"]).await;
    let st = rx.status("s").await;
    assert_eq!(
        cond(&st.conditions, READY).0,
        "True",
        "a partial failure stays Ready"
    );
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "True");
    assert_eq!(cond(&st.conditions, REAP_DEFERRED).1, "ScopeErrors");
    let lp = rx.last_pass("s").await;
    assert_eq!(lp.scope_errors, 1);
    let sample = &lp.scope_error_samples[0];
    assert_eq!(sample.scope, "channel/C1");
    assert!(
        sample.message.contains("slack.com/api/x"),
        "{}",
        sample.message
    );
    for bad in [SLACK_TOKEN, "?", "#frag"] {
        assert!(!sample.message.contains(bad), "{bad} in {}", sample.message);
    }
    assert!(
        rx.held("slack_channel")
            .await
            .contains(&"C2#member@u1@example.com".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_scoped_pass_neither_moves_the_cursor_nor_reaps() {
    let chans: Vec<_> = (1..=4)
        .map(|i| channel(&format!("C{i}"), &["U1"]))
        .collect();
    let ws = workspace(vec![user("U1"), user("U2")], chans);
    let (rx, fake) = slack_setup("rs-scoped", ws, json!({"sync": {"maxScopesPerPass": 2}})).await;
    rx.run(&fake.url(), &[]).await;
    let before = rx.status("s").await.sync.unwrap();
    fake.state.workspace().channels[3].members.push("U2".into());
    rx.run(
        &fake.url(),
        &["--source", &format!("{}/s", rx.ns), "--scope", "channel/C4"],
    )
    .await;
    let after = rx.status("s").await.sync.unwrap();
    assert_eq!(after.resume_after, before.resume_after);
    assert_eq!(
        (after.enum_complete, after.cycle_started_at.clone()),
        (before.enum_complete, before.cycle_started_at.clone())
    );
    assert_eq!(after.last_sync_time, before.last_sync_time);
    let lp = after.last_pass.unwrap();
    assert!(lp.scoped);
    assert_eq!(
        (lp.scopes_processed, lp.written, lp.reaped_scopes),
        (1, 3, 0),
        "member, member, workspace link"
    );
    assert!(
        rx.held("slack_channel")
            .await
            .contains(&"C4#member@u2@example.com".to_string())
    );
    // --scope without --source is a usage error.
    let (code, _, _) = rx
        .run_env(&fake.url(), &["--scope", "channel/C1"], &[])
        .await;
    assert_eq!(code, 2);
}

/// The crash scenario: nine channels of one to five members, in a workspace of five: a cold pass
/// makes ten SpiceDB writes, one per channel and one for the workspace's members.
const CRASH_WRITES: u64 = 10;

async fn crash_setup() -> (Rx, kbind_testkit::Running<slack::SlackState>) {
    let users: Vec<_> = (1..=5).map(|i| user(&format!("U{i}"))).collect();
    let chans: Vec<_> = (1..=9)
        .map(|i| {
            channel(
                &format!("C{i}"),
                &["U1", "U2", "U3", "U4", "U5"][..i.min(5)],
            )
        })
        .collect();
    slack_setup("rs-crash", workspace(users, chans), json!({})).await
}

/// What a pass leaves: every relationship the store holds, and the source's status without the
/// per-pass figures and times (a rerun's figures are its own; `written` is checked apart).
async fn crash_state(rx: &Rx) -> (serde_json::Value, BTreeSet<String>) {
    let mut held = BTreeSet::new();
    for t in [
        "slack_workspace",
        "slack_channel",
        "slack_usergroup",
        "scim_group",
    ] {
        held.extend(rx.held(t).await.into_iter().map(|r| format!("{t}:{r}")));
    }
    let st = rx.status("s").await;
    let cycle_started = st
        .sync
        .as_ref()
        .and_then(|s| s.cycle_started_at.as_ref())
        .is_some();
    let mut st = support::normalized(
        &serde_json::to_value(&st).unwrap(),
        &[
            "lastTransitionTime",
            "finishedAt",
            "lastSyncTime",
            "cycleStartedAt",
            "written",
            "pruned",
            "scopesProcessed",
        ],
        &[(rx.ns.as_str(), "NS")],
    );
    st["cycleStarted"] = json!(cycle_started);
    (json!({"status": st, "held": held}), held)
}

/// An uninterrupted cold pass: its state and `relationshipsWritten`.
async fn uninterrupted() -> ((serde_json::Value, BTreeSet<String>), i64) {
    let (rx, fake) = crash_setup().await;
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(
        s["data_writes"], CRASH_WRITES,
        "the scenario's cold pass: {s}"
    );
    let state = crash_state(&rx).await;
    let expected: usize = (1..=9).map(|i: usize| i.min(5) + 1).sum::<usize>() + 5;
    assert_eq!(state.1.len(), expected, "{:?}", state.1);
    assert_eq!(
        cond(&rx.status("s").await.conditions, REAP_DEFERRED).1,
        "Reaped"
    );
    (state, s["counts"]["relationshipsWritten"].as_i64().unwrap())
}

/// The aborted run never released its pass Lease; an operator (or its expiry) frees it.
async fn free_lease(rx: &Rx) {
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        rx.client.clone(),
        &rx.ns,
    );
    let _ = lease.delete("kbind-relsync", &Default::default()).await;
}

/// Crash points: a pass aborted right after each of its SpiceDB writes, then rerun, holds
/// exactly the relationships and status of an uninterrupted pass; the rerun writes exactly the
/// batches and relationships the aborted pass did not (nothing redone, nothing skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_pass_killed_after_any_write_converges_on_the_next_run() {
    let ((want, want_held), want_written) = uninterrupted().await;
    let mut tally = support::Tally::new("relsync", "writes");
    for n in support::crash_points("relsync writes", CRASH_WRITES) {
        let (rx, fake) = crash_setup().await;
        // One scope at a time, so exactly n writes landed when the process aborts.
        let knob = n.to_string();
        let (code, _, stderr) = rx
            .run_env(
                &fake.url(),
                &["--concurrency", "1"],
                &[(kbind::pass::crash::ENV, &knob)],
            )
            .await;
        assert_ne!(code, 0, "the crash knob aborts: {stderr}");
        assert!(stderr.contains(&format!("={n} reached")), "{stderr}");
        let landed = crash_state(&rx).await.1.len() as i64;
        free_lease(&rx).await;
        let (code, s, stderr) = rx.run_env(&fake.url(), &[], &[]).await;
        if code != 0 {
            tally.failed(&format!("write {n}"), format!("{s}\n{stderr}"));
            continue;
        }
        let (got, got_held) = crash_state(&rx).await;
        let written = s["counts"]["relationshipsWritten"].as_i64().unwrap_or(0);
        tally.point(
            &format!("write {n}"),
            &(&want, want_written, CRASH_WRITES - n),
            &(
                &got,
                landed + written,
                s["data_writes"].as_u64().unwrap_or(0),
            ),
            &want_held,
            &got_held,
        );
    }
    tally.finish();
}

/// Signals, at full concurrency and paced as against Slack: a pass killed (SIGKILL) at some
/// moment after its first write converges on the next run; a pass sent SIGTERM stops taking
/// scopes, records its cursor, exits 0 and releases its Lease, and the next run continues the
/// cycle, writing exactly what the stopped pass did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_pass_killed_or_terminated_at_any_moment_converges_on_the_next_run() {
    let ((want, want_held), want_written) = uninterrupted().await;
    let mut tally = support::Tally::new("relsync", "signals");
    for (signal, delays) in [
        (
            "KILL",
            support::kill_delays("relsync SIGKILL", &[100], 1500),
        ),
        ("TERM", support::kill_delays("relsync SIGTERM", &[0], 1500)),
    ] {
        for delay in delays {
            let point = format!("SIG{signal} {}ms after the first write", delay.as_millis());
            let (rx, fake) = crash_setup().await;
            // Scaled pacing a tenth as fast as the other tests': the pass takes about a second.
            let cmd = rx.command(&fake.url(), &["--upstream-rate-scale", "6"]);
            let out = support::signalled_mid_run(cmd, signal, async {
                while rx.held("slack_channel").await.is_empty() {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                tokio::time::sleep(delay).await;
            })
            .await;
            let killed = out.status.code().is_none();
            let (code, first, stderr) = support::outcome(out);
            let landed = crash_state(&rx).await.1.len() as i64;
            println!(
                "{point}: killed by the signal: {killed}, outcome {}, data writes {}, relationships held {landed}",
                first["outcome"], first["data_writes"]
            );
            if signal == "TERM" {
                assert_eq!(code, 0, "{point}: {first}\n{stderr}");
                // The signal landed mid-pass (signalled_mid_run): the run stopped taking work and
                // said why.
                assert_eq!(first["outcome"], "partial", "{point}: {first}");
                assert!(
                    first["message"].as_str().unwrap().contains("Terminated"),
                    "{point}: {first}"
                );
            } else {
                free_lease(&rx).await;
            }
            // The next scheduled run: due while the stopped pass's cycle is in progress. It
            // finishes the cycle's data; the reap of edges no scope asserts waits for a pass that
            // covers every scope (docs/relsync.md), which the next cycle (here forced with --source) is.
            let mut reruns = vec![rx.run_env(&fake.url(), &[], &[]).await];
            let deferred =
                cond(&rx.status("s").await.conditions, REAP_DEFERRED).1 == "PartialCoverage";
            if first["outcome"] == "partial" && reruns[0].0 == 0 && deferred {
                assert_eq!(
                    crash_state(&rx).await.1,
                    want_held,
                    "{point}: data complete"
                );
                let src = format!("{}/s", rx.ns);
                reruns.push(rx.run_env(&fake.url(), &["--source", &src], &[]).await);
            }
            if let Some((_, s, stderr)) = reruns
                .iter()
                .find(|r| r.0 != 0 || r.1["outcome"] != "completed")
            {
                tally.failed(&point, format!("rerun: {s}\n{stderr}"));
                continue;
            }
            let (got, got_held) = crash_state(&rx).await;
            let sum =
                |f: &dyn Fn(&serde_json::Value) -> i64| reruns.iter().map(|r| f(&r.1)).sum::<i64>();
            let written = sum(&|s| s["counts"]["relationshipsWritten"].as_i64().unwrap_or(0));
            let mut want_writes = None;
            let mut got_writes = None;
            if signal == "TERM" {
                want_writes = Some(CRASH_WRITES as i64);
                got_writes = Some(
                    first["data_writes"].as_i64().unwrap_or(0)
                        + sum(&|s| s["data_writes"].as_i64().unwrap_or(0)),
                );
            }
            tally.point(
                &point,
                &(&want, want_written, want_writes),
                &(&got, landed + written, got_writes),
                &want_held,
                &got_held,
            );
        }
    }
    tally.finish();
}

/// The operator's per-namespace step (deploy/components/directory/relsync-credentials-example.yaml): a
/// RoleBinding in `ns` to the ClusterRole kbind-relsync-credentials for the ServiceAccount
/// `kbind-relsync` of `sa_namespace`.
async fn grant_credentials(rx: &Rx, ns: &str, sa_namespace: &str) {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    // The ClusterRole the RoleBinding names ships in deploy/components/directory/relsync-rbac.yaml: apply it here, so
    // no test depends on another having installed it first (server-side apply: idempotent).
    rx.kubectl_apply("deploy/components/directory/namespace.yaml");
    rx.kubectl_apply("deploy/components/directory/relsync-rbac.yaml");
    let mut rb = support::identity::rbac_documents(
        "deploy/components/directory/relsync-credentials-example.yaml",
    )
    .into_iter()
    .find(|d| d["kind"] == "RoleBinding")
    .expect("the example RoleBinding");
    rb["metadata"]["namespace"] = json!(ns);
    rb["subjects"][0]["namespace"] = json!(sa_namespace);
    let rb: RoleBinding = serde_json::from_value(rb).expect("RoleBinding");
    kube::Api::<RoleBinding>::namespaced(rx.client.clone(), ns)
        .patch(
            "kbind-relsync-credentials",
            &kube::api::PatchParams::apply("kbind-relsync-tests").force(),
            &kube::api::Patch::Apply(&rb),
        )
        .await
        .expect("apply the credentials RoleBinding");
}

/// deploy/components/directory/relsync-rbac.yaml, plus the example RoleBinding in the source's namespace, is enough:
/// the pass, run as kbind-relsync/kbind-relsync, reads its sources, identity, Secret and
/// directory ConfigMap, writes status, and takes its Lease in kbind-relsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn the_pass_runs_with_exactly_its_rbac() {
    let ws = workspace(
        vec![user("U1"), user("U2")],
        vec![channel("C1", &["U1", "U2"])],
    );
    let (rx, fake) = slack_setup(
        "rs-rbac",
        ws,
        json!({"config": {"join": {"by": "email", "directory": {"configMapRef": {"name": "people", "key": "map"}}}}}),
    )
    .await;
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "people"}, "data": {"map": "u1@example.com: ada\n"}}))
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(rx.client.clone(), &rx.ns)
        .create(&Default::default(), &cm)
        .await
        .unwrap();
    rx.kubectl_apply("deploy/components/directory/namespace.yaml");
    rx.kubectl_apply("deploy/components/directory/relsync-rbac.yaml");
    grant_credentials(&rx, &rx.ns, "kbind-relsync").await;
    let kc = rx
        .service_account_kubeconfig("kbind-relsync", "kbind-relsync")
        .await;
    let kc = kc.to_string_lossy().to_string();
    let src = format!("{}/s", rx.ns);
    // RBAC reaches the authorizer a moment late, and a concurrent run may hold the shared Lease.
    let run_as_sa = || async {
        let mut last = (0, json!(null), String::new());
        for _ in 0..40 {
            last = rx
                .run_env(
                    &fake.url(),
                    &[
                        "--kubeconfig",
                        &kc,
                        "--lease-namespace",
                        "kbind-relsync",
                        "--source",
                        &src,
                        "--deadline",
                        "1m",
                    ],
                    &[],
                )
                .await;
            if last.0 == 0 && last.1["outcome"] == "completed" {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let (code, summary, stderr) = last;
        assert_eq!(
            (code, summary["outcome"].clone()),
            (0, json!("completed")),
            "{summary}\n{stderr}"
        );
        summary
    };
    run_as_sa().await;
    assert_eq!(
        rx.held("slack_channel").await,
        vec!["C1#member@ada", "C1#workspace@T1"]
    );
    let lp = rx.last_pass("s").await;
    assert_eq!(lp.join_misses, 1, "u2 is not in the directory");
    // The finalizer (added above) and its release after the cleanup are within the same rules.
    rx.delete_source("s").await;
    let summary = run_as_sa().await;
    assert_eq!(summary["counts"]["sourcesCleanedUp"], 1, "{summary}");
    assert!(rx.get_source("s").await.is_none());
    assert!(rx.held_by("s").await.is_empty());
}

/// A window of 32+ scopes reads SpiceDB in bulk (one export stream) instead of per scope: the
/// diffs must be just as exact, and another source's objects must stay invisible to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn bulk_read_windows_diff_exactly_and_see_only_their_source() {
    let chans: Vec<_> = (0..40)
        .map(|i| channel(&format!("C{i:02}"), &["U1", "U2"]))
        .collect();
    let ws = workspace(vec![user("U1"), user("U2"), user("U3")], chans);
    let (rx, fake) = slack_setup("rs-bulk", ws, json!({})).await;
    // A second source on the same workspace: its own objects, never pruned by "s".
    rx.source("other", json!({"kind": "slack"})).await;
    rx.run(&fake.url(), &[]).await;
    assert_eq!(rx.held("slack_channel").await.len(), 2 * 40 * 3);
    {
        let mut w = fake.state.workspace();
        w.channels[3].members.push("U3".into());
        w.channels[7].members.retain(|m| m != "U1");
        w.channels.retain(|c| c.id != "C09");
    }
    let src = format!("{}/s", rx.ns);
    rx.run(&fake.url(), &["--source", &src]).await;
    let lp = rx.last_pass("s").await;
    // +U3 in C03; -U1 in C07; C09 reaped (two members and its workspace link).
    assert_eq!(
        (lp.written, lp.pruned, lp.reaped_scopes),
        (1, 4, 1),
        "{lp:?}"
    );
    let s = rx.run(&fake.url(), &["--source", &src]).await;
    assert_eq!(s["data_writes"], 0, "{s}");
    // "other" was not run again: all of its 120 relationships are intact.
    let all = rx.held("slack_channel").await;
    assert_eq!(all.len(), 120 + 120 + 1 - 4, "{}", all.len());
}

/// deploy/components/directory/relsync-rbac.yaml grants no Secret anywhere: in a namespace whose team has not bound
/// kbind-relsync-credentials, the pass reports PermissionDenied on the source, naming the
/// namespace, the Secret and the missing RoleBinding, and sends nothing upstream. Once the
/// namespace has the example RoleBinding, the same source syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_namespace_without_the_credentials_grant_is_reported_as_permission_denied() {
    let ws = workspace(vec![user("U1")], vec![channel("C1", &["U1"])]);
    let (rx, fake) = slack_setup("rs-norbac", ws, json!({})).await;
    let identity = support::identity::pass_identity(
        &rx.env.consumer,
        "deploy/components/directory/relsync-rbac.yaml",
        &rx.ns,
        support::identity::Without::Nothing,
    )
    .await;
    let kc = identity.kubeconfig();
    let src = format!("{}/s", rx.ns);
    let url = fake.url();
    let args = [
        "--kubeconfig",
        kc.as_str(),
        "--lease-namespace",
        rx.ns.as_str(),
        "--source",
        src.as_str(),
    ];
    let run = || rx.run_env(&url, &args, &[]);
    let ready = || async {
        rx.status("s")
            .await
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.reason.clone(), c.message.clone()))
            .unwrap_or_default()
    };
    // RBAC reaches the authorizer a moment late: retry until the run gets past its Lease.
    let mut last = (String::new(), String::new());
    for _ in 0..40 {
        let (code, _, _) = run().await;
        last = ready().await;
        if code == 0 && last.0 == "PermissionDenied" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let (reason, message) = last.clone();
    assert_eq!(reason, "PermissionDenied", "{message}");
    for needle in [
        format!("Secret {}/", rx.ns),
        format!("namespace {} has no RoleBinding", rx.ns),
        "kbind-relsync-credentials".to_string(),
        "relsync-credentials-example.yaml".to_string(),
    ] {
        assert!(message.contains(&needle), "{needle:?} in {message}");
    }
    assert_eq!(
        fake.state.control().total_calls(),
        0,
        "nothing sent upstream"
    );
    // A join directory's ConfigMap is read under the same per-namespace grant: without it the
    // pass's identity reads no ConfigMap here (it has no cluster-wide ConfigMap read).
    let configmaps = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        support::client(&std::path::PathBuf::from(&kc)).await,
        &rx.ns,
    );
    let directory: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "directory"}, "data": {"users": "{}"}}))
            .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(rx.client.clone(), &rx.ns)
        .create(&Default::default(), &directory)
        .await
        .unwrap();
    let code = |r: Result<k8s_openapi::api::core::v1::ConfigMap, kube::Error>| match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        code(configmaps.get("directory").await),
        403,
        "no ConfigMap read before the grant"
    );

    // The namespace's team grants it: the next run reads the Secret and syncs.
    grant_credentials(&rx, &rx.ns, &rx.ns).await;
    let mut got = 0;
    for _ in 0..40 {
        got = code(configmaps.get("directory").await);
        if got == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(got, 200, "the grant lets it read the join directory");
    for _ in 0..40 {
        let (code, _, _) = run().await;
        last = ready().await;
        if code == 0 && last.0 != "PermissionDenied" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    identity.remove().await;
    assert_ne!(last.0, "PermissionDenied", "{}", last.1);
    let held = rx.held("slack_channel").await;
    assert!(
        held.contains(&members("C1", &["U1"])[0]),
        "{held:?} {last:?}"
    );
}

/// A Slack read that meets a server error (or a dropped connection) is sent again, a few times,
/// before it counts against its scope: one bad answer is not a scope error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_transient_server_error_is_resent_not_counted() {
    let ws = workspace(
        vec![user("U1"), user("U2")],
        vec![channel("C1", &["U1"]), channel("C2", &["U1", "U2"])],
    );
    let (rx, fake) = slack_setup("rs-transient", ws, json!({})).await;
    {
        let mut c = fake.state.control();
        c.push_fault("conversations.members", Fault::Status(503, "{}".into()));
        c.push_fault("conversations.members", Fault::Status(500, "oops".into()));
    }
    let s = rx.run(&fake.url(), &["--concurrency", "1"]).await;
    assert_eq!(s["counts"]["scopeErrors"].as_i64().unwrap_or(0), 0, "{s}");
    assert_eq!(
        fake.state.control().calls("conversations.members"),
        4,
        "two channels, two resends"
    );
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, PARTIAL_FAILURE).0, "False");
    assert_eq!(rx.held("slack_channel").await.len(), 5);
}

fn last_sync(st: &kbind::api::relsync::RelationshipSourceStatus) -> Option<String> {
    st.sync
        .as_ref()
        .and_then(|s| s.last_sync_time.as_ref())
        .map(|t| t.0.to_string())
}

/// `status.sync.lastSyncTime` (the "Last Sync" column) is the last completed full cycle (spec
/// 002): a token Slack refuses records the pass (`lastPass`) and `Ready=False`, never a sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn last_sync_time_moves_only_when_a_full_cycle_completed() {
    let mut ws = workspace(
        vec![user("U1")],
        vec![channel("C1", &["U1"]), channel("C2", &["U1"])],
    );
    // Slack expects another token than the source's credential: invalid_auth.
    ws.token = "xoxb-rotated-0000".into();
    let (rx, fake) = slack_setup("rs-lastsync", ws, json!({})).await;
    let src = format!("{}/s", rx.ns);
    rx.run(&fake.url(), &[]).await;
    let st = rx.status("s").await;
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!((status, reason), ("False", "UpstreamAuthFailed"));
    assert!(message.contains("invalid_auth"), "{message}");
    assert_eq!(last_sync(&st), None, "nothing was synced");
    assert!(
        st.sync.unwrap().last_pass.unwrap().finished_at.is_some(),
        "the pass is recorded"
    );

    // The token fixed: a full cycle completes and sets it.
    fake.state.workspace().token = SLACK_TOKEN.into();
    rx.run(&fake.url(), &["--source", &src]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).0, "True");
    let synced = last_sync(&st).expect("a completed cycle sets lastSyncTime");
    assert_eq!(rx.held("slack_channel").await.len(), 4);

    // lastSyncTime has second precision: a later write would show.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // Refused again by Slack, then refused before any request (the Secret gone): unchanged.
    fake.state.workspace().token = "xoxb-rotated-0001".into();
    rx.run(&fake.url(), &["--source", &src]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).1, "UpstreamAuthFailed");
    assert_eq!(last_sync(&st).as_deref(), Some(synced.as_str()));
    kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(rx.client.clone(), &rx.ns)
        .delete("slack", &Default::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    rx.run(&fake.url(), &["--source", &src]).await;
    let st = rx.status("s").await;
    assert_eq!(cond(&st.conditions, READY).1, "SecretNotFound");
    assert_eq!(last_sync(&st).as_deref(), Some(synced.as_str()));
    assert_eq!(
        rx.held("slack_channel").await.len(),
        4,
        "a refused pass prunes nothing"
    );
}

fn has_finalizer(s: &kbind::api::relsync::RelationshipSource) -> bool {
    s.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == kbind::api::relsync::CLEANUP_FINALIZER)
}

/// Deleting a source deletes what it wrote to SpiceDB (its own prefix), then lets it go; the
/// other source on the same workspace and store keeps every relationship.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn deleting_a_source_deletes_its_relationships_and_nothing_else() {
    let ws = workspace(
        vec![user("U1"), user("U2")],
        vec![channel("C1", &["U1", "U2"]), channel("C2", &["U2"])],
    );
    let (rx, fake) = slack_setup("rs-delete", ws, json!({})).await;
    rx.source("other", json!({"kind": "slack"})).await;
    rx.run(&fake.url(), &[]).await;
    for name in ["s", "other"] {
        let src = rx.get_source(name).await.unwrap();
        assert!(has_finalizer(&src), "{name}: {:?}", src.metadata.finalizers);
    }
    // C1: 2 members + workspace; C2: 1 + workspace; the workspace's 2 members.
    assert_eq!(rx.held_by("s").await.len(), 7);
    let others = rx.held_by("other").await;
    assert_eq!(others.len(), 7);

    rx.delete_source("s").await;
    assert!(
        rx.get_source("s").await.is_some(),
        "the finalizer holds it until relsync ran"
    );
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["sourcesCleanedUp"], 1, "{s}");
    assert_eq!(s["counts"]["relationshipsDeleted"], 7, "{s}");
    assert_eq!(
        s["counts"]["sourcesDue"], 0,
        "a deleted source is not synced: {s}"
    );
    assert!(rx.held_by("s").await.is_empty());
    assert!(rx.get_source("s").await.is_none(), "the source is gone");
    assert_eq!(
        rx.held_by("other").await,
        others,
        "the other source is untouched"
    );

    // Across runs: nothing left to do.
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(rx.held_by("other").await, others);
}

/// With SpiceDB unreachable a deleted source keeps its finalizer and says why; the same failure
/// again changes nothing; once SpiceDB is back the next run deletes its relationships.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_deleted_source_keeps_its_finalizer_until_spicedb_confirms() {
    let ws = workspace(vec![user("U1")], vec![channel("C1", &["U1"])]);
    let (mut rx, fake) = slack_setup("rs-delete-down", ws, json!({})).await;
    rx.run(&fake.url(), &[]).await;
    let held = rx.held_by("s").await;
    assert_eq!(held.len(), 3);
    rx.delete_source("s").await;

    // A closed loopback port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let real = std::mem::replace(&mut rx.env.spicedb_url, format!("http://127.0.0.1:{port}"));
    let (code, _, stderr) = rx.run_env(&fake.url(), &[], &[]).await;
    assert_eq!(code, 1, "SpiceDB unreachable fails the pass: {stderr}");
    let src = rx.get_source("s").await.expect("still there");
    assert!(has_finalizer(&src));
    let st = src.status.clone().unwrap_or_default();
    let (status, reason, message) = cond(&st.conditions, READY);
    assert_eq!((status, reason), ("False", "CleanupFailed"));
    assert!(message.contains("SpiceDB is unreachable"), "{message}");
    assert!(
        message.contains(kbind::api::relsync::CLEANUP_FINALIZER),
        "{message}"
    );
    assert_eq!(rx.held_by("s").await, held, "nothing deleted");

    // The same failure again: no condition changes, no status write.
    let (code, _, _) = rx.run_env(&fake.url(), &[], &[]).await;
    assert_eq!(code, 1);
    let again = rx.get_source("s").await.expect("still there");
    assert_eq!(
        again.metadata.resource_version, src.metadata.resource_version,
        "unchanged"
    );

    rx.env.spicedb_url = real;
    let s = rx.run(&fake.url(), &[]).await;
    assert_eq!(s["counts"]["sourcesCleanedUp"], 1, "{s}");
    assert!(rx.held_by("s").await.is_empty());
    assert!(rx.get_source("s").await.is_none());
}
