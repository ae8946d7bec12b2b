//! Benchmark of `kbind relsync` (run through `hack/bench.sh relsync`, which starts the servers).
//!
//! A Slack workspace of BENCH_CHANNELS channels (default 2,000) averaging 100 members (50–150)
//! drawn from BENCH_USERS users (default 5,000): about 200k relationships. The local Slack
//! stand-in enforces Slack's tier limits scaled by BENCH_RATE_SCALE (default 60: a per-minute
//! tier becomes per-second) and answers 429 beyond them; kbind is told the same scale. Figures:
//! achieved `conversations.members` rate as a fraction of the permitted rate, unexpected 429s,
//! relationships written per second, writes on an unchanged cycle, peak RSS; and, in the same
//! run, baselines writing the same relationships straight into SpiceDB in batches of 1000, one
//! at a time and BENCH_CONCURRENCY at a time, with the ratios (the cycle cannot beat the
//! rate-limit floor, so each ratio is against the larger of baseline and floor). `BENCH_PACE`
//! (default 0.9) is kbind's `--pace`. Prints figures; asserts nothing about time.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use futures::StreamExt;

use kbind::relsync::auth::Token;
use kbind::relsync::spicedb::{HttpStore, MAX_UPDATES, Obj, Op, Rel, RelationshipStore};
use kbind_testkit::slack;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

fn num(k: &str, default: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Deterministic pseudo-random numbers (no dependency, same data every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Server-side apply one object given as JSON through its typed API.
async fn apply<K>(api: Api<K>, v: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let name = v["metadata"]["name"].as_str().unwrap().to_string();
    api.patch(
        &name,
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&v),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

use common::{client, env, kbind};

#[tokio::main]
async fn main() {
    kbind::install_crypto_provider();
    let n_channels = num("BENCH_CHANNELS", 2000);
    let n_users = num("BENCH_USERS", 5000);
    let scale = num("BENCH_RATE_SCALE", 60) as f64;
    let kubeconfig = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let spicedb_url = env("KBIND_TEST_SPICEDB_URL");

    // The workspace.
    let mut rng = Lcg(7);
    let users: Vec<slack::User> = (0..n_users)
        .map(|i| slack::User {
            id: format!("U{i:06}"),
            email: Some(format!("user{i}@example.com")),
            ..Default::default()
        })
        .collect();
    let mut relationships = 0usize;
    let channels: Vec<slack::Channel> = (0..n_channels)
        .map(|c| {
            let size = 50 + (rng.next() % 101) as usize;
            let mut m = BTreeSet::new();
            while m.len() < size {
                m.insert(format!("U{:06}", rng.next() as usize % n_users));
            }
            relationships += size + 1;
            slack::Channel {
                id: format!("C{c:06}"),
                name: format!("c{c}"),
                members: m.into_iter().collect(),
                ..Default::default()
            }
        })
        .collect();
    relationships += n_users;
    // Published per-minute tiers, enforced per one-second window at `scale`.
    let tier = |per_min: u32| ((f64::from(per_min) * scale / 60.0).round() as u32).max(1);
    let tier_limits: HashMap<String, u32> = [
        ("conversations.list", 20),
        ("conversations.members", 100),
        ("users.list", 20),
        ("users.info", 100),
        ("auth.test", 100),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_string(), tier(t)))
    .collect();
    let permitted = f64::from(tier(100));
    let token = "xoxb-bench-token";
    let ws = slack::Workspace {
        team_id: "TBENCH".into(),
        token: token.into(),
        users,
        channels: channels.clone(),
        max_page: 1000,
        tier_limits,
        ..Default::default()
    };
    let fake = slack::start(ws, 0).await.expect("start fake slack");
    println!(
        "bench relsync: {n_channels} channels, {n_users} users, {relationships} relationships; tiers x{scale} (conversations.members {permitted}/s)"
    );

    // Kubernetes objects and the SpiceDB store.
    let kube = client(&kubeconfig).await;
    common::install_crds(&kube, &kbind::crds::kbind_crds()).await;
    let ns = "bench-relsync";
    apply(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(kube.clone()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    apply(Api::<k8s_openapi::api::core::v1::Secret>::namespaced(kube.clone(), ns), json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "slack", "namespace": ns}, "stringData": {"token": token}})).await;
    apply(Api::<kbind::api::relsync::AgentIdentity>::namespaced(kube.clone(), ns), json!({"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "AgentIdentity",
        "metadata": {"name": "agent", "namespace": ns},
        "spec": {"credentials": [{"name": "slack", "secretRef": {"name": "slack", "key": "token"}}]}})).await;
    apply(Api::<kbind::api::relsync::RelationshipSource>::namespaced(kube.clone(), ns), json!({"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
        "metadata": {"name": "ws", "namespace": ns},
        "spec": {"kind": "slack", "auth": {"agentIdentity": "agent", "credential": "slack"}, "config": {"pageSize": 200}}})).await;
    let schema = std::fs::read_to_string("config/samples/spicedb-schema.zed").expect("schema");
    let store_token = format!("bench-{}", std::process::id());
    let store = HttpStore::new(&spicedb_url, Token::new(store_token.clone())).expect("store");
    store.write_schema(&schema).await.expect("schema");
    let key_file = std::env::temp_dir().join(format!("{store_token}.key"));
    std::fs::write(&key_file, &store_token).expect("key file");

    let pace: f64 = std::env::var("BENCH_PACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(kbind::relsync::ratelimit::DEFAULT_PACE);
    let args: Vec<String> = [
        "relsync",
        "--kubeconfig",
        &kubeconfig,
        "--lease-namespace",
        ns,
        "--namespace",
        ns,
        "--source",
        &format!("{ns}/ws"),
        "--spicedb-url",
        &spicedb_url,
        "--spicedb-token-file",
        &key_file.to_string_lossy(),
        "--slack-api-url",
        &format!("{}/api", fake.url()),
        "--upstream-rate-scale",
        &scale.to_string(),
        "--deadline",
        "30m",
        "--concurrency",
        &num("BENCH_CONCURRENCY", 16).to_string(),
        "--pace",
        &pace.to_string(),
        "-o",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    // Cold cycle.
    let t = Instant::now();
    let cold = kbind(&args);
    let cold_secs = t.elapsed().as_secs_f64();
    let (calls, span, rejected) = {
        let c = fake.state.control();
        (
            c.calls("conversations.members"),
            c.span("conversations.members"),
            c.total_tier_rejections(),
        )
    };
    let achieved = calls.saturating_sub(1) as f64 / span.as_secs_f64().max(1e-9);
    let written = cold["counts"]["relationshipsWritten"]
        .as_f64()
        .unwrap_or(0.0);
    println!();
    println!(
        "cold cycle: {cold_secs:.1}s, outcome {}, {} scopes, {written} relationships written, {} data writes (SpiceDB write calls), {} requests to Kubernetes",
        cold["outcome"], cold["counts"]["scopesProcessed"], cold["data_writes"], cold["requests"]
    );
    println!(
        "  conversations.members: {calls} calls in {:.1}s = {achieved:.1}/s of {permitted}/s permitted = {:.0}% (kbind paces at {:.0}%)",
        span.as_secs_f64(),
        100.0 * achieved / permitted,
        100.0 * pace
    );
    println!(
        "  unexpected 429s (tier limit exceeded): {rejected} (target 0); throttles seen by kbind: {}",
        cold["counts"]["upstreamThrottles"]
    );
    println!("  relationships written/s: {:.0}", written / cold_secs);
    println!(
        "  peak RSS: {:.1} MiB",
        cold["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0
    );

    // Unchanged cycle.
    let t = Instant::now();
    let again = kbind(&args);
    println!();
    println!(
        "unchanged cycle: {:.1}s, data writes {} (target 0), relationships written {}, pruned {}",
        t.elapsed().as_secs_f64(),
        again["data_writes"],
        again["counts"]["relationshipsWritten"],
        again["counts"]["relationshipsPruned"]
    );
    println!(
        "  peak RSS: {:.1} MiB (target < 64 MiB; the snapshot of what SpiceDB holds, src/relsync/held.rs)",
        again["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0
    );

    // Baseline: the same relationships written straight into a fresh store, sequentially.
    let base_store =
        HttpStore::new(&spicedb_url, Token::new(format!("{store_token}-baseline"))).expect("store");
    base_store.write_schema(&schema).await.expect("schema");
    let user = |id: &str| {
        Obj::new(
            "user",
            kbind::relsync::encode::email_user_id(&format!(
                "user{}@example.com",
                id.trim_start_matches('U')
                    .trim_start_matches('0')
                    .parse::<usize>()
                    .unwrap_or(0)
            )),
        )
    };
    let mut all: Vec<(Op, Rel)> = Vec::with_capacity(relationships);
    for c in &channels {
        let obj = Obj::new("slack_channel", format!("base/ws/{}", c.id));
        for m in &c.members {
            all.push((
                Op::Touch,
                Rel {
                    resource: obj.clone(),
                    relation: "member".into(),
                    subject: user(m),
                },
            ));
        }
        all.push((
            Op::Touch,
            Rel {
                resource: obj.clone(),
                relation: "workspace".into(),
                subject: Obj::new("slack_workspace", "base/ws/TBENCH"),
            },
        ));
    }
    let t = Instant::now();
    for batch in all.chunks(MAX_UPDATES) {
        base_store.write(batch).await.expect("baseline write");
    }
    let base_secs = t.elapsed().as_secs_f64();
    // Parallel baseline: the same relationships under another prefix, `--concurrency` batches
    // in flight at a time (kbind writes that many scopes at once).
    let workers = num("BENCH_CONCURRENCY", 16);
    let par: Vec<(Op, Rel)> = all
        .iter()
        .map(|(op, r)| {
            let mut r = r.clone();
            r.resource.id = r.resource.id.replacen("base/", "par/", 1);
            if r.subject.kind == "slack_workspace" {
                r.subject.id = r.subject.id.replacen("base/", "par/", 1);
            }
            (*op, r)
        })
        .collect();
    let t = Instant::now();
    futures::stream::iter(par.chunks(MAX_UPDATES))
        .for_each_concurrent(workers, |batch| {
            let store = &base_store;
            async move { store.write(batch).await.expect("parallel baseline write") }
        })
        .await;
    let par_secs = t.elapsed().as_secs_f64();
    let floor = n_channels as f64 / (permitted * pace);
    println!();
    println!(
        "baseline: {} relationships written straight to SpiceDB in batches of {MAX_UPDATES}: {base_secs:.1}s ({:.0}/s)",
        all.len(),
        all.len() as f64 / base_secs
    );
    println!(
        "parallel baseline: the same, {workers} batches at a time: {par_secs:.1}s ({:.0}/s)",
        par.len() as f64 / par_secs
    );
    println!(
        "rate-limit floor (one conversations.members call per channel at {:.0}% of the tier): {floor:.1}s",
        100.0 * pace
    );
    println!(
        "ratio cold cycle / max(baseline, floor): {:.2}; / max(parallel baseline, floor): {:.2}",
        cold_secs / base_secs.max(floor),
        cold_secs / par_secs.max(floor)
    );
    let _ = std::fs::remove_file(&key_file);
}
