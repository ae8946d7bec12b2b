//! The pass Lease across runs, with the real binary against the real apiserver
//! (docs/operations.md, "The pass Lease"): a killed run holds later runs off for one
//! `--lease-duration` and no longer; a run longer than its Lease keeps it by renewing; a run that
//! loses its Lease stops like at its deadline; a pod a Job retries takes its predecessor's Lease.
//!
//! The slow pass is `kbind relsync` reading the local Slack stand-in through a fault proxy that
//! answers every Slack request a second late, one scope at a time: the Kubernetes traffic (the
//! Lease's included) goes straight to the apiserver.

use crate::relsync_fx;
use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kbind_testkit::faults::{FaultConfig, FaultProxy, Injected};
use kbind_testkit::slack;
use kube::Api;
use kube::api::PostParams;
use relsync_fx::{Rx, SLACK_TOKEN, channel, user, workspace};
use serde_json::{Value, json};
use tokio::time::Instant;

const LEASE: &str = "kbind-relsync";

/// A relsync source over twelve channels, and a Slack that answers each request a second late.
struct Slow {
    rx: Rx,
    fake: kbind_testkit::Running<slack::SlackState>,
    proxy: FaultProxy,
}

impl Slow {
    async fn new(prefix: &str) -> Self {
        let rx = Rx::new(prefix).await;
        let ids = ["U1", "U2", "U3"];
        let users: Vec<_> = ids.iter().map(|i| user(i)).collect();
        let chans: Vec<_> = (1..=12)
            .map(|i| channel(&format!("C{i:02}"), &ids[..(i % 3) + 1]))
            .collect();
        let fake = slack::start(workspace(users, chans), 0).await.unwrap();
        let proxy = FaultProxy::start(
            &fake.url(),
            FaultConfig {
                kinds: vec![Injected::Slow],
                slow: Duration::from_secs(1),
                ..FaultConfig::rate(1.0, 1)
            },
        )
        .await
        .unwrap();
        rx.identity("slack", SLACK_TOKEN, &[]).await;
        rx.source("s", json!({"kind": "slack"})).await;
        Self { rx, fake, proxy }
    }

    /// `kbind relsync` as pod `pod` (no Job): through the slow Slack, or straight to it.
    fn command(&self, pod: &str, slow: bool, extra: &[&str]) -> Command {
        let mut args = extra.to_vec();
        let url = if slow {
            args.extend(["--concurrency", "1"]);
            self.proxy.url()
        } else {
            self.fake.url()
        };
        let mut cmd = self.rx.command(&url, &args);
        cmd.env("POD_NAME", pod).env_remove("JOB_NAME");
        cmd
    }

    /// A quick run as pod `pod`; returns its summary (it must exit 0).
    async fn run(&self, pod: &str, extra: &[&str]) -> Value {
        let cmd = self.command(pod, false, extra);
        let (code, s, stderr) = output(cmd).await;
        assert_eq!(code, 0, "{s}\n{stderr}");
        s
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.rx.client.clone(), &self.rx.ns)
    }

    async fn spec(&self) -> LeaseSpec {
        self.leases()
            .get(LEASE)
            .await
            .unwrap()
            .spec
            .unwrap_or_default()
    }

    /// Wait (up to 30 s) until the Lease names `holder`; returns when it was seen.
    async fn wait_for_holder(&self, holder: &str) -> Instant {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let seen = self
                .leases()
                .get_opt(LEASE)
                .await
                .unwrap()
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity);
            if seen.as_deref() == Some(holder) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the Lease never named {holder}");
    }
}

async fn output(cmd: Command) -> (i32, Value, String) {
    let out = tokio::process::Command::from(cmd)
        .output()
        .await
        .expect("run kbind");
    support::outcome(out)
}

fn spawn(cmd: Command) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("start kbind")
}

fn message(s: &Value) -> &str {
    s["message"].as_str().unwrap_or_default()
}

/// A run SIGKILLed mid-pass never releases its Lease. Runs before the Lease expires skip, naming
/// it; the first run after `--lease-duration` takes it over, says so, and does the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_killed_run_holds_later_runs_off_for_one_lease_duration_only() {
    let s = Slow::new("lease-kill").await;
    // 9 s: the run after the kill has half of it to start and skip, on a machine where other
    // areas' tests run beside this one (docs/testing.md "One test binary").
    let duration = Duration::from_secs(9);
    let killed = support::unique("killed");
    let cmd = s.command(&killed, true, &["--lease-duration", "9s"]);
    let out = support::signalled_mid_run(cmd, "KILL", async {
        s.wait_for_holder(&killed).await;
        // Past its first renewal (every 3 s), in the middle of its twelve slow scopes.
        tokio::time::sleep(Duration::from_millis(3500)).await;
    })
    .await;
    let killed_at = Instant::now();
    assert!(
        out.status.code().is_none(),
        "the pass ended before it was killed; it must be slower: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Before expiry: skipped, naming the dead holder.
    let early = s
        .run(&support::unique("early"), &["--lease-duration", "9s"])
        .await;
    assert!(
        killed_at.elapsed() < duration / 2,
        "the early run must start well before expiry"
    );
    assert_eq!(early["outcome"], "skipped", "{early}");
    assert!(message(&early).contains(&killed), "{early}");
    assert!(early.get("leaseTakenOver").is_none(), "{early}");

    // One Lease duration after the kill (plus a margin), the next run is not locked out.
    tokio::time::sleep_until(killed_at + duration + Duration::from_secs(3)).await;
    let next = support::unique("next");
    let after = s.run(&next, &["--lease-duration", "9s"]).await;
    assert_eq!(after["outcome"], "completed", "{after}");
    assert_eq!(after["leaseTakenOver"], killed.as_str(), "{after}");
    let spec = s.spec().await;
    assert_eq!(spec.holder_identity, None, "released at the end: {spec:?}");
    assert_eq!(spec.lease_duration_seconds, Some(9));
}

/// A pass running for several Lease durations keeps its Lease: it renews it, so a run started
/// long after the first duration ran out still skips; the pass completes without losing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_pass_longer_than_its_lease_keeps_it_by_renewing() {
    let s = Slow::new("lease-renew").await;
    let pod = support::unique("slow");
    let child = spawn(s.command(&pod, true, &["--lease-duration", "3s"]));
    let taken = s.wait_for_holder(&pod).await;
    // More than two durations: without renewal the Lease would have expired twice over.
    tokio::time::sleep_until(taken + Duration::from_secs(7)).await;
    let second = s
        .run(&support::unique("second"), &["--lease-duration", "3s"])
        .await;
    assert_eq!(second["outcome"], "skipped", "{second}");
    assert!(message(&second).contains(&pod), "{second}");
    let spec = s.spec().await;
    assert_eq!(spec.holder_identity.as_deref(), Some(pod.as_str()));
    let (acquired, renewed) = (spec.acquire_time.unwrap().0, spec.renew_time.unwrap().0);
    assert!(
        renewed.duration_since(acquired) >= k8s_openapi::jiff::SignedDuration::from_secs(4),
        "renewed well after it was taken: {acquired} .. {renewed}"
    );

    let (code, first, stderr) = support::outcome(child.wait_with_output().await.unwrap());
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(
        first["outcome"], "completed",
        "the pass outlived its Lease duration and kept it: {first}"
    );
    assert!(!message(&first).contains("lease lost"), "{first}");
    // Taken, renewed at least twice (the pass ran for more than two durations), released.
    assert!(
        first["bookkeeping_writes"].as_u64().unwrap() >= 4,
        "{first}"
    );
    assert_eq!(s.spec().await.holder_identity, None);
}

/// A run whose Lease is taken from it (an operator, a run that judged it expired) stops as at
/// its deadline: no new work, exit 0, `partial`, the summary saying the Lease was lost and to
/// whom; it leaves the new holder's Lease alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_run_that_loses_its_lease_stops_like_at_its_deadline() {
    let s = Slow::new("lease-lost").await;
    let pod = support::unique("loser");
    let child = spawn(s.command(&pod, true, &["--lease-duration", "3s"]));
    s.wait_for_holder(&pod).await;
    let intruder = support::unique("intruder");
    let mut lease = s.leases().get(LEASE).await.unwrap();
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(intruder.clone());
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    spec.lease_duration_seconds = Some(600);
    let stolen_at = Instant::now();
    // The pass may renew between our read and write: take it on a fresh read then.
    if s.leases()
        .replace(LEASE, &PostParams::default(), &lease)
        .await
        .is_err()
    {
        let mut lease = s.leases().get(LEASE).await.unwrap();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(intruder.clone());
        spec.lease_duration_seconds = Some(600);
        s.leases()
            .replace(LEASE, &PostParams::default(), &lease)
            .await
            .unwrap();
    }

    let (code, first, stderr) = support::outcome(child.wait_with_output().await.unwrap());
    assert_eq!(code, 0, "{first}\n{stderr}");
    assert_eq!(first["outcome"], "partial", "stopped early: {first}");
    let msg = message(&first);
    assert!(
        msg.contains("lease lost") && msg.contains(&intruder),
        "says why and to whom: {first}"
    );
    // Twelve one-second scopes remained; it stopped at the next renewal (one second) plus the
    // scope in flight. The margin is generous: this asserts that it stopped, not how fast.
    assert!(
        stolen_at.elapsed() < Duration::from_secs(10),
        "stopped soon after losing the Lease: {:?}",
        stolen_at.elapsed()
    );
    assert_eq!(
        s.spec().await.holder_identity.as_deref(),
        Some(intruder.as_str()),
        "the new holder's Lease is left alone"
    );
}

/// A Job retries a failed pod with a new pod: the new pod takes its predecessor's live Lease
/// (same Job) instead of skipping until it expires; a pod of another Job still skips.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_retried_pod_of_the_same_job_takes_over_its_predecessors_lease() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    let ns = support::namespace(&client, "lease-job").await;
    let job = support::unique("job");
    let other_job = support::unique("other");
    let predecessor = format!("{job}/pod-a");
    // The crashed pod a of Job `job`: its Lease is live for ten minutes.
    let held = kbind::pass::lease::acquire(client.clone(), &ns, "kbind-schema", &predecessor, 600)
        .await
        .unwrap();
    assert!(matches!(held, kbind::pass::lease::Acquired::Held(_)));

    let kc = env.consumer.to_string_lossy().to_string();
    let selector = format!("kbind-test={}", support::unique("none"));
    let run = |job: &str, pod: &str| {
        let mut cmd = support::kbind_command(&[
            "schema",
            "--kubeconfig",
            &kc,
            "--lease-namespace",
            &ns,
            "--selector",
            &selector,
            "-o",
            "json",
        ]);
        cmd.env("JOB_NAME", job).env("POD_NAME", pod);
        cmd
    };
    let (code, other, stderr) = output(run(&other_job, "pod-b")).await;
    assert_eq!(code, 0, "{other}\n{stderr}");
    assert_eq!(other["outcome"], "skipped", "another Job waits: {other}");
    assert!(message(&other).contains(&predecessor), "{other}");

    let (code, retried, stderr) = output(run(&job, "pod-b")).await;
    assert_eq!(code, 0, "{retried}\n{stderr}");
    assert_eq!(retried["outcome"], "completed", "{retried}");
    assert_eq!(retried["leaseTakenOver"], predecessor.as_str(), "{retried}");
    let lease = Api::<Lease>::namespaced(client, &ns)
        .get("kbind-schema")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity, None, "released: {spec:?}");
    assert_eq!(spec.lease_transitions, Some(1));
}
