//! kbind as users run it (docs/testing.md "The real node"): the image hack/image.sh built, run
//! by real CronJobs and Jobs on the real node of hack/node.sh (kubelet, containerd, runc), with
//! nothing but the shipped manifests and their RBAC: no admin credential in any Pod.
//!
//! - The Helm chart (on the provider cluster) and the kustomize overlays (on the consumer
//!   cluster), every pass enabled and configured as docs/operations.md says: a Job created from
//!   every CronJob completes, one scheduled firing of each completes, each Pod's summary is in
//!   its log and its metrics reach a real Pushgateway; a bad configuration fails its Job at once
//!   (exit 2, one Pod); the namespaces' `restricted` Pod Security admits every kbind Pod and
//!   refuses a root Pod.
//!
//! Both clusters are shared by the tests of this file: a test that installs into one holds its
//! lock (`Cluster::lock`) and removes what it installed.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use support::node::{self, Cluster, Node};

/// A Pod runs in a few seconds here; a Job that takes this long is stuck.
const JOB_LIMIT: Duration = Duration::from_secs(180);
/// A scheduled firing comes at the next minute: at most a minute, plus the Pod.
const SCHEDULED_LIMIT: Duration = Duration::from_secs(150);

/// The shipped CronJobs: (pass, namespace), from the registry.
fn cronjobs() -> Vec<(&'static str, &'static str)> {
    kbind::registry::PASSES
        .iter()
        .map(|d| (d.name, d.namespace))
        .collect()
}

/// The image reference's repository and tag.
fn image_parts(image: &str) -> (&str, &str) {
    image.rsplit_once(':').expect("the image has a tag")
}

/// A real Pushgateway inside a node's namespace, on its node IP (what the Pods push to), with a
/// loopback forwarder for the test's scrapes.
struct Pushgateway {
    _process: node::Inside,
    forward: node::Forward,
    /// What Pods of that cluster push to.
    url: String,
}

impl Pushgateway {
    fn start(cluster: &Cluster) -> Self {
        let port = node::free_port();
        let listen = format!("{}:{port}", cluster.ip);
        let bin = support::pushgateway::bin();
        let mut process = cluster.spawn_inside(
            "pushgateway",
            &[
                bin.to_str().expect("path"),
                &format!("--web.listen-address={listen}"),
            ],
        );
        std::thread::sleep(Duration::from_millis(300));
        process.assert_running();
        let forward = cluster.forward(&listen);
        Pushgateway {
            _process: process,
            forward,
            url: format!("http://{listen}"),
        }
    }

    /// The text exposition `GET /metrics` serves.
    fn scrape(&self) -> String {
        let out = std::process::Command::new("curl")
            .args(["-sf", "--max-time", "10"])
            .arg(format!("{}/metrics", self.forward.url("http")))
            .output()
            .expect("curl");
        assert!(out.status.success(), "scrape the Pushgateway");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The value of series `name` with label `job="kbind-<pass>"` in a scrape, if present.
fn series(scrape: &str, name: &str, pass: &str, extra: &str) -> Option<f64> {
    let job = format!("job=\"kbind-{pass}\"");
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&job) && l.contains(extra))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// What every pass needs besides the manifests, before its first run: kcp's CRDs for the
/// single-cluster hub (claims), SpiceDB's key Secret (relsync).
fn prerequisites(cluster: &Cluster, relsync_ns: &str) {
    let kcp = support::kbind_command(&["crds", "--kcp"])
        .output()
        .expect("kbind crds --kcp");
    cluster.kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some(&String::from_utf8_lossy(&kcp.stdout)),
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "kbind-spicedb", "namespace": relsync_ns},
        "stringData": {"preshared-key": support::unique("node-spicedb-key")}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&secret.to_string()));
}

/// A Job from every CronJob (as `kubectl create job --from=cronjob/...`) completes: one Pod,
/// exit 0, its summary in its log, `completed`. Returns each pass's summary.
async fn a_job_from_every_cronjob_completes(cluster: &Cluster) -> BTreeMap<String, Value> {
    for (pass, ns) in cronjobs() {
        node::job_from_cronjob(
            cluster,
            ns,
            &format!("kbind-{pass}"),
            &format!("{pass}-now"),
        );
    }
    let mut summaries = BTreeMap::new();
    for (pass, ns) in cronjobs() {
        let end = node::wait_job(cluster, ns, &format!("{pass}-now"), JOB_LIMIT).await;
        let pod = end.pods.first().expect("the Job's Pod");
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log = node::pod_log(cluster, ns, &name);
        assert!(
            end.complete(),
            "{}: the Job from CronJob kbind-{pass} ended {} ({}):\n{log}",
            cluster.name,
            end.condition,
            end.reason
        );
        assert_eq!(end.pods.len(), 1, "{pass}: one Pod, no retry");
        assert_eq!(node::exit_code(pod), Some(0), "{pass}: exit 0");
        let summary = node::summary(&log);
        assert_eq!(summary["pass"], pass, "{log}");
        assert_eq!(summary["outcome"], "completed", "{pass}: {summary}");
        println!("{}: {pass}-now {:?}: {summary}", cluster.name, end.took);
        summaries.insert(pass.to_string(), summary);
    }
    summaries
}

/// Once the CronJobs are unsuspended, each fires on its schedule (every minute here) and that
/// Job completes; it is told apart from a hand-made one by the CronJob controller's annotation.
async fn every_cronjob_fires_on_schedule(cluster: &Cluster) {
    let client = cluster.client().await;
    for (pass, ns) in cronjobs() {
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        let started = std::time::Instant::now();
        let scheduled = loop {
            let list = jobs
                .list(&ListParams::default())
                .await
                .expect("list jobs")
                .items;
            let found = list.into_iter().find(|j| {
                let owned = j
                    .metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| o.iter().any(|r| r.name == format!("kbind-{pass}")));
                let stamped = j.metadata.annotations.as_ref().is_some_and(|a| {
                    a.contains_key("batch.kubernetes.io/cronjob-scheduled-timestamp")
                });
                owned && stamped
            });
            if let Some(j) = found {
                break j.metadata.name.expect("job name");
            }
            assert!(
                started.elapsed() < SCHEDULED_LIMIT,
                "{}: CronJob kbind-{pass} did not fire on its schedule",
                cluster.name
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        let end = node::wait_job(cluster, ns, &scheduled, JOB_LIMIT).await;
        let pod = end.pods.first().expect("pod");
        let log = node::pod_log(
            cluster,
            ns,
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        assert!(
            end.complete(),
            "{pass}: scheduled Job {scheduled}: {}\n{log}",
            end.reason
        );
        let summary = node::summary(&log);
        // The scheduled run may meet the Lease of another run of its pass: both end well. It
        // comes after a run that did the work, with nothing changed since: it writes 0.
        assert!(
            ["completed", "skipped"].contains(&summary["outcome"].as_str().unwrap_or_default()),
            "{pass}: {summary}"
        );
        assert_eq!(
            summary["data_writes"].as_u64().unwrap_or(0),
            0,
            "{pass}: {summary}"
        );
        println!("{}: scheduled {scheduled}: {summary}", cluster.name);
    }
}

/// A run with a flag kbind refuses exits 2, and the Job fails at once (podFailurePolicy): one Pod.
async fn a_bad_configuration_fails_the_job_at_once(cluster: &Cluster, ns: &str) {
    node::job_from_template(cluster, ns, "kbind-schema", "schema-bad", |job| {
        node::args_of(job).push(json!("--shard=5/2"));
    });
    let end = node::wait_job(cluster, ns, "schema-bad", JOB_LIMIT).await;
    assert_eq!(end.condition, "Failed", "a bad flag fails the Job");
    assert_eq!(
        end.reason, "PodFailurePolicy",
        "failed by the exit-code rule, not by retries"
    );
    assert_eq!(end.pods.len(), 1, "no Pod retried for exit 2");
    assert_eq!(node::exit_code(&end.pods[0]), Some(2));
}

/// The namespace's Pod Security `restricted` refuses a Pod running as root (and so did not
/// stand in the way of kbind's).
fn pod_security_refuses_root(cluster: &Cluster, ns: &str, image: &str) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "root-pod", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": image, "imagePullPolicy": "IfNotPresent",
            "securityContext": {"runAsUser": 0}}]}});
    let out = cluster.kubectl_output(&["create", "-f", "-"], Some(&pod.to_string()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a root Pod was admitted into {ns}");
    assert!(err.contains("violates PodSecurity"), "{err}");
}

/// Every pass pushed its figures, `kbind_last_success_timestamp_seconds` included (each run
/// succeeded), under the documented grouping (job=kbind-<pass>, instance=all).
fn metrics_reached_the_pushgateway(pg: &Pushgateway, summaries: &BTreeMap<String, Value>) {
    let scrape = pg.scrape();
    for (pass, summary) in summaries {
        let last = series(
            &scrape,
            "kbind_last_success_timestamp_seconds",
            pass,
            "instance=\"all\"",
        );
        assert!(
            last.is_some_and(|t| t > 1.6e9),
            "{pass}: no success timestamp in\n{scrape}"
        );
        assert_eq!(
            series(&scrape, "kbind_pass_outcome", pass, "outcome=\"completed\""),
            Some(1.0),
            "{pass}"
        );
        assert_eq!(
            series(&scrape, "kbind_pass_exit_code", pass, ""),
            Some(0.0),
            "{pass}"
        );
        // The pushed figures are the summary's: the scheduled runs since may have replaced them
        // with their own, so compare with a figure that does not change from run to run.
        let requests = series(&scrape, "kbind_pass_requests", pass, "");
        assert!(requests.is_some_and(|r| r >= 1.0), "{pass}: {summary}");
    }
}

/// Delete a namespace and wait until it is gone (a later install may create it again).
async fn namespace_gone(cluster: &Cluster, ns: &str) {
    let _ = cluster.kubectl_output(
        &[
            "delete",
            "namespace",
            ns,
            "--ignore-not-found",
            "--wait=false",
        ],
        None,
    );
    let client = cluster.client().await;
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    for _ in 0..240 {
        if api.get_opt(ns).await.expect("get namespace").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("namespace {ns} not gone after 2 minutes");
}

/// The Helm chart with every pass on, on the provider cluster.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers and the real node: run hack/test.sh"
)]
async fn the_helm_chart_runs_every_pass_as_a_cronjob_pod() {
    let node: Node = node::node();
    let c = &node.provider;
    let _lock = c.lock(&node.dir);
    c.takes_pods().await;
    let _reset = node::ResetOnPanic(c);
    let pg = Pushgateway::start(c);
    let (repository, tag) = image_parts(&node.image);
    let spicedb = std::env::var("KBIND_NODE_SPICEDB_URL").expect("KBIND_NODE_SPICEDB_URL");
    let mut sets = vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        format!("pushgatewayUrl={}", pg.url),
        "passes.claims.singleCluster=true".into(),
        format!("passes.relsync.spicedb.url={spicedb}"),
        format!("passes.issue.serverUrl={}", c.url),
    ];
    for (pass, _) in cronjobs() {
        sets.push(format!("passes.{pass}.enabled=true"));
        sets.push(format!("passes.{pass}.suspend=true"));
        sets.push(format!("passes.{pass}.schedule=* * * * *"));
    }
    let chart = node::repo("charts/kbind").display().to_string();
    let mut args = vec!["install", "kbind", chart.as_str(), "--namespace", "default"];
    let ca = format!("caBundle={}", node.ca.display());
    args.extend(["--set-file", &ca]);
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    c.helm(&args);
    prerequisites(c, "kbind-relsync");

    let summaries = a_job_from_every_cronjob_completes(c).await;
    a_bad_configuration_fails_the_job_at_once(c, "kbind-system").await;
    pod_security_refuses_root(c, "kbind-system", &node.image);
    pod_security_refuses_root(c, "kbind-relsync", &node.image);
    metrics_reached_the_pushgateway(&pg, &summaries);

    let mut upgrade = vec![
        "upgrade",
        "kbind",
        chart.as_str(),
        "--namespace",
        "default",
        "--reuse-values",
    ];
    let unsuspend: Vec<String> = cronjobs()
        .iter()
        .map(|(pass, _)| format!("passes.{pass}.suspend=false"))
        .collect();
    for s in &unsuspend {
        upgrade.extend(["--set", s.as_str()]);
    }
    c.helm(&upgrade);
    every_cronjob_fires_on_schedule(c).await;

    c.helm(&["uninstall", "kbind", "--namespace", "default", "--wait"]);
    for ns in ["kbind-system", "kbind-relsync", "kbind-grants"] {
        namespace_gone(c, ns).await;
    }
}

/// The pass's CronJob args as shipped (jobs/<pass>/cronjob.yaml), changed as its comments and
/// deploy/README.md tell a user to: the settings the passes need here, a Pushgateway.
/// What a user sets in the shipped CronJobs' args here: empty fields leave the shipped value.
#[derive(Default)]
struct Settings {
    /// `--pushgateway-url`.
    pushgateway: String,
    /// relsync's `--slack-api-url`.
    slack_url: String,
    /// issue's `--server-url` (default: the cluster's apiserver as the other cluster's Pods
    /// reach it).
    server_url: String,
}

fn configured_args(pass: &str, c: &Cluster, set: &Settings) -> Vec<String> {
    let text = std::fs::read_to_string(node::repo(&format!("jobs/{pass}/cronjob.yaml")))
        .expect("read the CronJob");
    let cj: Value = serde_saphyr::from_str(&text).expect("CronJob YAML");
    let shipped = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string());
    let spicedb = std::env::var("KBIND_NODE_SPICEDB_URL").expect("KBIND_NODE_SPICEDB_URL");
    let mut args = Vec::new();
    for a in shipped {
        match a.split_once('=').map(|(k, _)| k) {
            // The hub here is a plain apiserver with kbind's kcp CRDs (docs/claims.md).
            Some("--core-export" | "--core-export-path") => {}
            Some("--core-binding") => args.push("--single-cluster".into()),
            Some("--spicedb-url") => args.push(format!("--spicedb-url={spicedb}")),
            Some("--server-url") if set.server_url.is_empty() => {
                args.push(format!("--server-url={}", c.url))
            }
            Some("--server-url") => args.push(format!("--server-url={}", set.server_url)),
            _ => args.push(a),
        }
    }
    if pass == "relsync" && !set.slack_url.is_empty() {
        // The Slack stand-in inside the node's namespace.
        args.push(format!("--slack-api-url={}", set.slack_url));
    }
    if !set.pushgateway.is_empty() {
        args.push(format!("--pushgateway-url={}", set.pushgateway));
    }
    args
}

/// A kustomization as a user writes one (deploy/README.md): the repository's base and the roles'
/// components, the image's tag, the roles' CronJobs suspended and every minute with their args
/// configured, plus `extra` patches.
fn overlay(
    node: &Node,
    c: &Cluster,
    roles: &[&str],
    set: &Settings,
    extra: Vec<Value>,
) -> std::path::PathBuf {
    let dir = node::repo("target/node-overlays").join(support::unique("overlay"));
    std::fs::create_dir_all(&dir).expect("overlay dir");
    let (_, tag) = image_parts(&node.image);
    let mut patches = extra;
    for d in kbind::registry::PASSES
        .iter()
        .filter(|d| roles.contains(&d.role))
    {
        let args = configured_args(d.name, c, set);
        let ops = json!([
            {"op": "add", "path": "/spec/suspend", "value": true},
            {"op": "replace", "path": "/spec/schedule", "value": "* * * * *"},
            {"op": "replace", "path": "/spec/jobTemplate/spec/template/spec/containers/0/args", "value": args},
        ]);
        patches.push(json!({"target": {"kind": "CronJob", "name": format!("kbind-{}", d.name)}, "patch": ops.to_string()}));
    }
    // The overlay sits three levels below the repository: kustomize takes relative paths only.
    let components: Vec<String> = roles
        .iter()
        .map(|r| format!("../../../deploy/components/{r}"))
        .collect();
    let mut kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../../deploy/base"],
        "components": components,
        "images": [{"name": "ghcr.io/kbind/kbind", "newTag": tag}],
        "patches": patches,
    });
    if roles.contains(&"directory") {
        // relsync trusts the node CA that signed SpiceDB's certificate (docs/operations.md
        // "Trusting a private CA").
        std::fs::copy(&node.ca, dir.join("ca-bundle.pem")).expect("copy the CA");
        kustomization["configMapGenerator"] = json!([{"name": "kbind-ca-bundle", "namespace": "kbind-relsync",
            "files": ["ca-bundle.pem"], "options": {"disableNameSuffixHash": true}}]);
        let ca = json!([
            {"op": "add", "path": "/spec/jobTemplate/spec/template/spec/volumes/-",
             "value": {"name": "ca-bundle", "configMap": {"name": "kbind-ca-bundle"}}},
            {"op": "add", "path": "/spec/jobTemplate/spec/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "ca-bundle", "mountPath": "/etc/kbind/ca-bundle", "readOnly": true}},
            {"op": "add", "path": "/spec/jobTemplate/spec/template/spec/containers/0/env/-",
             "value": {"name": "SSL_CERT_FILE", "value": "/etc/kbind/ca-bundle/ca-bundle.pem"}},
        ]);
        kustomization["patches"]
            .as_array_mut()
            .expect("patches")
            .push(json!({"target": {"kind": "CronJob", "name": "kbind-relsync"}, "patch": ca.to_string()}));
    }
    std::fs::write(dir.join("kustomization.yaml"), kustomization.to_string()).expect("write");
    dir
}

/// SpiceDB's HTTP API through the node's loopback forwarder, trusting the node CA.
fn spicedb(node: &Node, key: &str, path: &str, body: &Value) -> String {
    let url = std::env::var("KBIND_NODE_SPICEDB_LOCAL_URL").expect("KBIND_NODE_SPICEDB_LOCAL_URL");
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail-with-body", "--max-time", "20", "--cacert"])
        .arg(&node.ca)
        .args([
            "-H",
            &format!("Authorization: Bearer {key}"),
            "-d",
            &body.to_string(),
        ])
        .arg(format!("{url}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "SpiceDB {path}: {text}");
    text
}

/// What relsync and claims work on (a Slack source, a CatalogEntry and a tenant APIBinding), so
/// their Jobs do real work.
struct Work {
    team: String,
    spicedb_key: String,
    binding: String,
}

fn work(node: &Node, c: &Cluster, slack_token: &str) -> Work {
    let team = support::unique("node-team");
    let key = c.kubectl(
        &[
            "get",
            "secret",
            "-n",
            "kbind-relsync",
            "kbind-spicedb",
            "-o",
            "jsonpath={.data.preshared-key}",
        ],
        None,
    );
    let spicedb_key = String::from_utf8(base64_decode(&key)).expect("utf-8 key");
    let schema =
        std::fs::read_to_string(node::repo("config/samples/spicedb-schema.zed")).expect("schema");
    spicedb(
        node,
        &spicedb_key,
        "/v1/schema/write",
        &json!({"schema": schema}),
    );
    let relsync = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "slack-bot-token", "namespace": team},
         "stringData": {"token": slack_token}},
        {"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "AgentIdentity",
         "metadata": {"name": "directory-sync", "namespace": team},
         "spec": {"credentials": [{"name": "slack-bot", "secretRef": {"name": "slack-bot-token", "key": "token"}}]}},
        {"apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
         "metadata": {"name": "slack", "namespace": team},
         "spec": {"kind": "slack", "auth": {"agentIdentity": "directory-sync", "credential": "slack-bot"},
                  "config": {"types": ["public_channel", "private_channel"], "join": {"by": "email"}}}},
        // The per-team step of deploy/components/directory/relsync-credentials-example.yaml.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "kbind-relsync-credentials", "namespace": team},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kbind-relsync-credentials"},
         "subjects": [{"kind": "ServiceAccount", "name": "kbind-relsync", "namespace": "kbind-relsync"}]},
    ]});
    c.kubectl(&["apply", "-f", "-"], Some(&relsync.to_string()));
    let export = format!("{}.example.io", support::unique("node-export"));
    let binding = support::unique("node-binding");
    let claims = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport", "metadata": {"name": export},
         "spec": {"permissionClaims": [{"group": "", "resource": "configmaps", "verbs": ["get", "list"]}]}},
        {"apiVersion": "providers.kbind.io/v1alpha1", "kind": "CatalogEntry", "metadata": {"name": support::unique("node-entry")},
         "spec": {"export": {"path": "", "name": export}, "requires": [{"group": "", "resource": "configmaps"}]}},
        {"apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
         "metadata": {"name": binding, "annotations": {"kcp.io/cluster": team}},
         "spec": {"reference": {"export": {"name": export}}}},
    ]});
    c.kubectl(&["apply", "-f", "-"], Some(&claims.to_string()));
    Work {
        team,
        spicedb_key,
        binding,
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use std::io::Write;
    let mut child = std::process::Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("base64");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(s.as_bytes())
        .expect("write");
    child.wait_with_output().expect("base64 -d").stdout
}

/// The work the Pods did: relsync wrote the Slack stand-in's channel memberships into SpiceDB
/// (through TLS a private CA signed, trusted by the mounted bundle); claims accepted the
/// provider's own claim on the tenant's binding.
fn the_work_was_done(node: &Node, c: &Cluster, w: &Work, summaries: &BTreeMap<String, Value>) {
    let read = spicedb(
        node,
        &w.spicedb_key,
        "/v1/relationships/read",
        &json!({"consistency": {"fullyConsistent": true},
                "relationshipFilter": {"resourceType": "slack_channel", "optionalRelation": "member"}}),
    );
    let members = read
        .lines()
        .filter(|l| l.contains("\"relationship\""))
        .count();
    // The stand-in's directory (crates/kbind-testkit/src/bin/fake_upstreams.rs): #general has
    // U1 and U2 with emails and U3 without (a join miss); #infra has U2.
    assert_eq!(
        members, 3,
        "channel memberships in SpiceDB:\n{read}\n{}",
        summaries["relsync"]
    );
    let status: Value = serde_json::from_str(&c.kubectl(
        &[
            "get",
            "relationshipsources",
            "-n",
            &w.team,
            "slack",
            "-o",
            "json",
        ],
        None,
    ))
    .expect("source json");
    let ready = status["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "True", "{status}");
    let binding: Value =
        serde_json::from_str(&c.kubectl(&["get", "apibindings", &w.binding, "-o", "json"], None))
            .expect("binding json");
    let claims = binding["spec"]["permissionClaims"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        claims
            .iter()
            .any(|c| c["resource"] == "configmaps" && c["state"] == "Accepted"),
        "the provider's own claim accepted on the tenant's binding: {binding}"
    );
}

/// A RelationshipSource deleted while relsync is installed: the next relsync Pod deletes its
/// relationships from SpiceDB and releases its finalizer (docs/relsync.md), so the source and
/// its namespace go.
async fn a_deleted_source_is_cleaned_up_by_a_relsync_pod(node: &Node, c: &Cluster, w: &Work) {
    for (pass, ns) in cronjobs() {
        c.kubectl(
            &[
                "patch",
                "cronjob",
                "-n",
                ns,
                &format!("kbind-{pass}"),
                "-p",
                r#"{"spec":{"suspend":true}}"#,
            ],
            None,
        );
    }
    c.kubectl(
        &[
            "delete",
            "relationshipsource",
            "-n",
            &w.team,
            "slack",
            "--wait=false",
        ],
        None,
    );
    node::job_from_cronjob(c, "kbind-relsync", "kbind-relsync", "relsync-cleanup");
    let end = node::wait_job(c, "kbind-relsync", "relsync-cleanup", JOB_LIMIT).await;
    let pod = end.pods.first().expect("pod");
    let log = node::pod_log(
        c,
        "kbind-relsync",
        pod.metadata.name.as_deref().unwrap_or_default(),
    );
    assert!(end.complete(), "{log}");
    let gone = c.kubectl_output(&["get", "relationshipsource", "-n", &w.team, "slack"], None);
    assert!(
        !gone.status.success(),
        "the source is gone once its cleanup ran:\n{log}"
    );
    let read = spicedb(
        node,
        &w.spicedb_key,
        "/v1/relationships/read",
        &json!({"consistency": {"fullyConsistent": true},
                "relationshipFilter": {"resourceType": "slack_channel"}}),
    );
    assert!(
        !read.contains("\"relationship\""),
        "its relationships are gone: {read}"
    );
}

/// The kustomize overlays of every role, on the consumer cluster.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers and the real node: run hack/test.sh"
)]
async fn the_kustomize_overlays_run_every_pass_as_a_cronjob_pod() {
    let node: Node = node::node();
    let c = &node.consumer;
    let _lock = c.lock(&node.dir);
    c.takes_pods().await;
    let _reset = node::ResetOnPanic(c);
    let pg = Pushgateway::start(c);
    let slack_token = support::unique("xoxb-node");
    let slack_port = node::free_port().to_string();
    let fakes = node::fake_upstreams_bin();
    let mut slack = c.spawn_inside(
        "slack",
        &[
            fakes.to_str().expect("path"),
            "--host",
            &c.ip,
            "--slack-port",
            &slack_port,
            "--scim-port",
            "0",
            "--slack-token",
            &slack_token,
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    slack.assert_running();
    let slack_url = format!("http://{}:{slack_port}/api", c.ip);
    let roles = ["consumer", "hub", "directory", "provider"];
    let set = Settings {
        pushgateway: pg.url.clone(),
        slack_url,
        ..Settings::default()
    };
    let dir = overlay(&node, c, &roles, &set, Vec::new());
    let dir_arg = dir.display().to_string();
    c.kubectl(&["apply", "--server-side", "-k", &dir_arg], None);
    prerequisites(c, "kbind-relsync");
    let w = work(&node, c, &slack_token);

    let summaries = a_job_from_every_cronjob_completes(c).await;
    the_work_was_done(&node, c, &w, &summaries);
    a_bad_configuration_fails_the_job_at_once(c, "kbind-system").await;
    pod_security_refuses_root(c, "kbind-system", &node.image);
    pod_security_refuses_root(c, "kbind-relsync", &node.image);
    metrics_reached_the_pushgateway(&pg, &summaries);

    for (pass, ns) in cronjobs() {
        c.kubectl(
            &[
                "patch",
                "cronjob",
                "-n",
                ns,
                &format!("kbind-{pass}"),
                "-p",
                r#"{"spec":{"suspend":false}}"#,
            ],
            None,
        );
    }
    every_cronjob_fires_on_schedule(c).await;

    a_deleted_source_is_cleaned_up_by_a_relsync_pod(&node, c, &w).await;
    c.kubectl(&["delete", "-k", &dir_arg, "--wait=false"], None);
    for ns in [
        "kbind-system",
        "kbind-relsync",
        "kbind-grants",
        w.team.as_str(),
    ] {
        namespace_gone(c, ns).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run a Job from CronJob `kbind-<pass>` named `job` on `c`: it completes with one Pod; its
/// summary.
async fn run(c: &Cluster, pass: &str, job: &str) -> Value {
    let ns = kbind::registry::find(pass)
        .expect("a registered pass")
        .namespace;
    node::job_from_cronjob(c, ns, &format!("kbind-{pass}"), job);
    let end = node::wait_job(c, ns, job, JOB_LIMIT).await;
    let pod = end.pods.first().expect("the Job's Pod");
    let log = node::pod_log(c, ns, pod.metadata.name.as_deref().unwrap_or_default());
    assert!(
        end.complete(),
        "{}: Job {job}: {} ({})\n{log}",
        c.name,
        end.condition,
        end.reason
    );
    assert_eq!(end.pods.len(), 1, "{job}: one Pod");
    let summary = node::summary(&log);
    println!("{}: {job} {:?}: {summary}", c.name, end.took);
    summary
}

fn condition(obj: &Value, type_: &str) -> (String, String) {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or_default()
}

fn get_json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&c.kubectl(&all, None)).expect("kubectl get json")
}

/// The provider's side of steps 1-2 of docs/binding-flow.md: an exported CRD, the ClusterRole
/// that lets the issuer grant it, an Export and a Grant.
fn provider_offers(p: &Cluster, group: &str, team_ns: &str) {
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": format!("widgets.{group}"), "labels": {"core.kbind.io/exported": "true"}},
         "spec": {"group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": format!("kbind-grantable-{group}"), "labels": {"iam.kbind.io/grantable": "true"}},
         "rules": [{"apiGroups": [group], "resources": ["widgets", "widgets/status"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]},
        {"apiVersion": "catalog.kbind.io/v1alpha1", "kind": "Export", "metadata": {"name": "widgets"},
         "spec": {"description": "Managed widgets", "apis": [{"name": format!("widgets.{group}")}]}},
    ]});
    p.kubectl(&["apply", "-f", "-"], Some(&objects.to_string()));
    p.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            &format!("crd/widgets.{group}"),
            "--timeout=60s",
        ],
        None,
    );
    // The consumer's objects live in `team_ns`; names and namespaces are kept, so the Grant
    // holds that provider namespace (docs/issue.md "Read isolation").
    let grant = json!({"apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant", "metadata": {"name": "acme"},
        "spec": {"export": "widgets", "consumer": "acme-prod", "tokenTTL": "1h", "namespaces": [team_ns]}});
    p.kubectl(&["apply", "-f", "-"], Some(&grant.to_string()));
}

/// jobs/bind/oneoff-job.yaml as the consumer admin uses it (its header): the handed-over
/// kubeconfig as a Secret, the Job's --apis edited, then created; the Job's summary.
async fn bind_job(node: &Node, c: &Cluster, kubeconfig: &str, api: &str, job: &str) -> Value {
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "kbind-bind-provider-kubeconfig", "namespace": "kbind-system"},
        "stringData": {"kubeconfig": kubeconfig}});
    c.kubectl(&["apply", "-f", "-"], Some(&secret.to_string()));
    let text = std::fs::read_to_string(node::repo("jobs/bind/oneoff-job.yaml")).expect("read");
    let mut items = Vec::new();
    for doc in text.split("\n---\n") {
        let mut v: Value = serde_saphyr::from_str(doc).expect("a YAML document");
        if v["kind"] == "Job" {
            v["metadata"]["name"] = json!(job);
            let c0 = &mut v["spec"]["template"]["spec"]["containers"][0];
            c0["image"] = json!(node.image);
            // The Job's args as shipped: the provider's Export `widgets`, no --grant-secret (the
            // issued kubeconfig names its Grant's Secret).
            let args = c0["args"].to_string();
            assert!(
                args.contains("--export=widgets") && !args.contains("--grant-secret"),
                "{args}"
            );
        }
        items.push(v);
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    c.kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
    let end = node::wait_job(c, "kbind-system", job, JOB_LIMIT).await;
    let pod = end.pods.first().expect("the bind Pod");
    let log = node::pod_log(
        c,
        "kbind-system",
        pod.metadata.name.as_deref().unwrap_or_default(),
    );
    assert!(
        end.complete(),
        "{job}: {} ({})\n{log}",
        end.condition,
        end.reason
    );
    let report = log
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["command"] == "bind")
        .unwrap_or_else(|| panic!("no report in the bind log:\n{log}"));
    assert_eq!(report["apis"], json!([api]), "the Export's APIs: {report}");
    println!("consumer: {job} {:?}: {report}", end.took);
    report
}

/// The bound API of the flow test, its namespace, and the slow path to the provider.
struct Flow<'a> {
    p: &'a Cluster,
    c: &'a Cluster,
    group: String,
    api: String,
    ns: String,
    /// Milliseconds each chunk through the path to the provider waits (hack/netns-forward.py
    /// --delay-file).
    delay: std::path::PathBuf,
}

impl Flow<'_> {
    fn slow(&self, ms: u32) {
        std::fs::write(&self.delay, ms.to_string()).expect("write the delay");
        // The proxy reads it every half second.
        std::thread::sleep(Duration::from_millis(700));
    }

    /// `n` consumer Widgets `<prefix>-NN`.
    fn widgets(&self, prefix: &str, n: usize) {
        let items: Vec<Value> = (0..n)
            .map(|i| {
                json!({"apiVersion": format!("{}/v1", self.group), "kind": "Widget",
                    "metadata": {"name": format!("{prefix}-{i:03}"), "namespace": self.ns},
                    "spec": {"size": i}})
            })
            .collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.c
            .kubectl(&["apply", "-f", "-"], Some(&list.to_string()));
    }

    /// How many provider copies of `<prefix>-*` exist.
    fn copies(&self, prefix: &str) -> usize {
        let list = get_json(self.p, &[&self.api, "-n", &self.ns]);
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|i| {
                        i["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// A resync Job from the CronJob's template with `edit`, started; its first Pod once running,
    /// with its log followed.
    async fn start_resync(
        &self,
        job: &str,
        edit: impl FnOnce(&mut Value),
    ) -> (String, node::LogFollower) {
        node::job_from_template(self.c, "kbind-system", "kbind-resync", job, edit);
        let client = self.c.client().await;
        let pod = node::running_pod(&client, "kbind-system", job, JOB_LIMIT).await;
        let log = node::LogFollower::start(self.c, "kbind-system", &pod);
        (pod, log)
    }

    /// Wait until at least one `<prefix>-*` copy reached the provider: the run is mid-write.
    async fn first_copy(&self, prefix: &str) {
        for _ in 0..300 {
            if self.copies(prefix) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("no {prefix}-* copy reached the provider within a minute");
    }
}

const SLOW_OBJECTS: usize = 40;

/// activeDeadlineSeconds shorter than the work: the Job controller ends the Pod (SIGTERM), the
/// run records `partial` with its cursor and releases its Lease, and the next Job carries on
/// from there and converges.
async fn a_run_cut_by_its_pod_deadline_resumes_on_the_next_job(f: &Flow<'_>) {
    // Three times the work the deadline leaves room for (a release build writes one object
    // through the slow path in about a third of a second).
    const CUT_OBJECTS: usize = 120;
    f.widgets("cut", CUT_OBJECTS);
    f.slow(150);
    let started = std::time::Instant::now();
    let (_, log) = f
        .start_resync("resync-cut", |job| {
            job["spec"]["activeDeadlineSeconds"] = json!(15);
            job["spec"]["backoffLimit"] = json!(0);
            node::args_of(job).push(json!("--write-concurrency=1"));
        })
        .await;
    let end = node::wait_job(f.c, "kbind-system", "resync-cut", JOB_LIMIT).await;
    let log = log.finish(Duration::from_secs(60));
    assert_eq!(
        (end.condition.as_str(), end.reason.as_str()),
        ("Failed", "DeadlineExceeded"),
        "{log}"
    );
    let cut = node::summary(&log);
    assert_eq!(cut["outcome"], "partial", "{cut}");
    assert!(
        cut["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Terminated"),
        "{cut}"
    );
    assert!(
        cut["resume_after"].is_string(),
        "the cursor is recorded: {cut}"
    );
    let done = f.copies("cut");
    assert!(
        done > 0 && done < CUT_OBJECTS,
        "the deadline cut the run mid-way: {done} of {CUT_OBJECTS} copies ({cut})"
    );
    let lease = get_json(f.c, &["lease", "-n", "kbind-system", "kbind-resync"]);
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "the run released its Lease on SIGTERM: {lease}"
    );
    println!(
        "consumer: resync-cut ended by its deadline after {:?}: {done} copies, {cut}",
        started.elapsed()
    );
    f.slow(0);
    let next = run(f.c, "resync", "resync-after-cut").await;
    assert_eq!(next["outcome"], "completed", "{next}");
    assert!(
        next.get("leaseTakenOver").is_none(),
        "nothing to take over: {next}"
    );
    assert_eq!(
        f.copies("cut"),
        CUT_OBJECTS,
        "the next Job converged: {next}"
    );
}

/// A Pod deleted with `--grace-period=0 --force` mid-write. The API object goes at once, but the
/// kubelet still stops the container with SIGTERM first (its minimum grace period), so the run
/// records `partial` with its cursor, releases its Lease and exits 0: the Job is Complete with
/// that one Pod, and the next Job carries on at once (nothing to take over) and converges.
async fn a_pod_deleted_by_force_mid_write_stops_cleanly(f: &Flow<'_>) {
    f.widgets("force", SLOW_OBJECTS);
    f.slow(150);
    let (pod, log) = f
        .start_resync("resync-force", |job| {
            node::args_of(job).push(json!("--write-concurrency=1"));
        })
        .await;
    f.first_copy("force").await;
    f.c.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            "kbind-system",
            &pod,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let log = log.finish(Duration::from_secs(60));
    f.slow(0);
    let end = node::wait_job(f.c, "kbind-system", "resync-force", JOB_LIMIT).await;
    let stopped = node::summary(&log);
    assert_eq!(stopped["outcome"], "partial", "{stopped}");
    assert!(
        end.complete(),
        "exit 0 after SIGTERM: {} ({})",
        end.condition,
        end.reason
    );
    let job = get_json(f.c, &["job", "-n", "kbind-system", "resync-force"]);
    assert_eq!(job["status"]["succeeded"], 1, "{job}");
    assert!(
        job["status"]["failed"].as_u64().unwrap_or(0) == 0,
        "no Pod retried: {job}"
    );
    let next = run(f.c, "resync", "resync-after-force").await;
    assert!(
        next.get("leaseTakenOver").is_none(),
        "the Lease was released: {next}"
    );
    assert_eq!(f.copies("force"), SLOW_OBJECTS, "{next}");
}

/// The container's process SIGKILLed mid-write (as by the OOM killer): nothing recorded, the
/// Lease left held. The Job's replacement Pod takes its predecessor's Lease over at once (the
/// holder is JOB_NAME/POD_NAME: same Job) and converges.
async fn a_pod_killed_mid_write_is_replaced_and_takes_its_lease_over(f: &Flow<'_>) {
    f.widgets("kill", SLOW_OBJECTS);
    f.slow(150);
    let (pod, _) = f
        .start_resync("resync-kill", |job| {
            node::args_of(job).push(json!("--write-concurrency=1"));
        })
        .await;
    f.first_copy("kill").await;
    let uid = pod_uid(f.c, &pod);
    assert_eq!(
        node::sigkill_in_pod(&uid, "kbind"),
        1,
        "SIGKILL kbind in {pod}"
    );
    f.slow(0);
    let end = node::wait_job(f.c, "kbind-system", "resync-kill", JOB_LIMIT).await;
    assert_eq!(end.pods.len(), 2, "the killed Pod and its replacement");
    assert_eq!(
        node::exit_code(&end.pods[0]),
        Some(137),
        "killed by SIGKILL"
    );
    let retry_name = end.pods[1].metadata.name.clone().unwrap_or_default();
    let log = node::pod_log(f.c, "kbind-system", &retry_name);
    assert!(end.complete(), "{log}");
    let summary = node::summary(&log);
    assert_eq!(
        summary["leaseTakenOver"],
        format!("resync-kill/{pod}"),
        "the replacement took the killed Pod's Lease over at once: {summary}"
    );
    assert_eq!(f.copies("kill"), SLOW_OBJECTS, "{summary}");
}

fn pod_uid(c: &Cluster, pod: &str) -> String {
    c.kubectl(
        &[
            "get",
            "pod",
            "-n",
            "kbind-system",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )
}

/// A Job whose process is SIGKILLed mid-write, with no retry: another Job's run skips while the
/// dead holder's Lease lives (exit 0, naming it), takes it over within --lease-duration, then
/// converges.
async fn a_killed_jobs_lease_is_taken_over_within_the_lease_duration(f: &Flow<'_>) {
    const LEASE: Duration = Duration::from_secs(15);
    f.widgets("expire", SLOW_OBJECTS);
    f.slow(150);
    let (pod, _) = f
        .start_resync("resync-dies", |job| {
            job["spec"]["backoffLimit"] = json!(0);
            let args = node::args_of(job);
            args.push(json!("--write-concurrency=1"));
            args.push(json!("--lease-duration=15s"));
        })
        .await;
    f.first_copy("expire").await;
    let uid = pod_uid(f.c, &pod);
    assert_eq!(
        node::sigkill_in_pod(&uid, "kbind"),
        1,
        "SIGKILL kbind in {pod}"
    );
    let killed = std::time::Instant::now();
    f.slow(0);
    let mut skipped = 0;
    for i in 0.. {
        let job = format!("resync-next-{i}");
        node::job_from_template(f.c, "kbind-system", "kbind-resync", &job, |job| {
            node::args_of(job).push(json!("--lease-duration=15s"));
        });
        let end = node::wait_job(f.c, "kbind-system", &job, JOB_LIMIT).await;
        let log = node::pod_log(
            f.c,
            "kbind-system",
            end.pods[0].metadata.name.as_deref().unwrap_or_default(),
        );
        assert!(end.complete(), "{log}");
        let summary = node::summary(&log);
        if summary["outcome"] == "skipped" {
            assert!(
                summary["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&format!("resync-dies/{pod}")),
                "a skipped run names the holder: {summary}"
            );
            skipped += 1;
            assert!(
                killed.elapsed() < LEASE + Duration::from_secs(30),
                "still skipped {:?} after the kill",
                killed.elapsed()
            );
            continue;
        }
        assert_eq!(
            summary["leaseTakenOver"],
            format!("resync-dies/{pod}"),
            "{summary}"
        );
        let after = killed.elapsed();
        println!(
            "consumer: {job} took the Lease over {after:?} after the kill ({skipped} runs skipped before)"
        );
        assert!(
            after < LEASE + Duration::from_secs(30),
            "taken over {after:?} after the kill"
        );
        break;
    }
    assert!(
        skipped > 0,
        "a run while the Lease lived skipped (the Lease held)"
    );
    assert_eq!(f.copies("expire"), SLOW_OBJECTS);
}

/// The CronJob's concurrencyPolicy Forbid and the pass Lease together: while a scheduled run
/// is still working at the next minute, the CronJob starts no second Job, and a Job created by
/// hand meanwhile skips (exit 0) naming the running one.
async fn never_two_runs_of_a_pass_at_once(f: &Flow<'_>) {
    // One run longer than a minute: many objects, one write at a time, a slow path, and a
    // deadline above the minute (the shipped 45s would end it first: that is how the shipped
    // schedule avoids overlap in the first place).
    f.widgets("forbid", 120);
    let patch = json!({"spec": {"suspend": false, "jobTemplate": {"spec": {"activeDeadlineSeconds": 300,
        "template": {"spec": {"containers": [{"name": "kbind", "args": [
            "resync", "--deadline=4m", "--lease-namespace=kbind-system", "--log-format=json",
            "--write-concurrency=1"]}]}}}}}});
    f.slow(400);
    f.c.kubectl(
        &[
            "patch",
            "cronjob",
            "-n",
            "kbind-system",
            "kbind-resync",
            "--type=strategic",
            "-p",
            &patch.to_string(),
        ],
        None,
    );
    let client = f.c.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "kbind-system");
    let scheduled = |list: &[Job]| -> Vec<String> {
        list.iter()
            .filter(|j| {
                j.metadata.annotations.as_ref().is_some_and(|a| {
                    a.contains_key("batch.kubernetes.io/cronjob-scheduled-timestamp")
                })
            })
            .filter_map(|j| j.metadata.name.clone())
            .collect()
    };
    let first = loop {
        let list = jobs.list(&ListParams::default()).await.expect("jobs").items;
        if let Some(j) = scheduled(&list).into_iter().next() {
            break j;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let pod = node::running_pod(&client, "kbind-system", &first, JOB_LIMIT).await;
    let holder = format!("{first}/{pod}");
    let by_hand = run(f.c, "resync", "resync-by-hand").await;
    assert_eq!(by_hand["outcome"], "skipped", "{by_hand}");
    assert!(
        by_hand["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&holder),
        "{by_hand}"
    );
    // Past the next minute boundary, with the first run still going.
    let started = std::time::Instant::now();
    loop {
        let list = jobs.list(&ListParams::default()).await.expect("jobs").items;
        let active: Vec<&Job> = list
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0)
            .collect();
        assert!(
            active.len() <= 1,
            "two resync Jobs ran at once: {:?}",
            active.iter().map(|j| &j.metadata.name).collect::<Vec<_>>()
        );
        assert_eq!(
            scheduled(&list),
            vec![first.clone()],
            "Forbid: no second scheduled Job while {first} runs"
        );
        let cj = get_json(f.c, &["cronjob", "-n", "kbind-system", "kbind-resync"]);
        let still_running = cj["status"]["active"]
            .as_array()
            .is_some_and(|a| a.len() == 1);
        if started.elapsed() > Duration::from_secs(75) {
            assert!(
                still_running,
                "the first run outlived a schedule period: {cj}"
            );
            break;
        }
        assert!(
            still_running || started.elapsed() > Duration::from_secs(75),
            "{first} ended too early for the test to mean anything: {cj}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    f.c.kubectl(
        &[
            "patch",
            "cronjob",
            "-n",
            "kbind-system",
            "kbind-resync",
            "-p",
            r#"{"spec":{"suspend":true}}"#,
        ],
        None,
    );
    f.slow(0);
    let end = node::wait_job(f.c, "kbind-system", &first, Duration::from_secs(300)).await;
    assert!(end.complete(), "{first}: {}", end.reason);
}

/// The release binary the image holds (hack/image.sh builds it for the musl target), for
/// baselines run on this machine.
fn release_binary() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| node::repo("target"));
    let bin = target.join("x86_64-unknown-linux-musl/release/kbind");
    assert!(
        bin.is_file(),
        "{} is missing: hack/image.sh builds it",
        bin.display()
    );
    bin
}

/// One consumer CronJob cycle on the node (docs/performance.md "On a real node"): for schema and
/// resync, a Job from the CronJob timed from its creation to its Pod running and to its end,
/// with the memory peaks of the kbind container's cgroup and of the Pod's; beside the same
/// release binary run as a process on this machine against the same cluster (the baseline).
/// Figures, never assertions.
async fn one_consumer_cycle_figures(c: &Cluster) {
    let mib = |b: u64| b as f64 / 1048576.0;
    let client = c.client().await;
    for pass in ["schema", "resync"] {
        let job = format!("{pass}-cycle");
        let t0 = std::time::Instant::now();
        node::job_from_cronjob(c, "kbind-system", &format!("kbind-{pass}"), &job);
        let uid = loop {
            if let Some(p) = node::job_pods(&client, "kbind-system", &job).await.first() {
                break p.metadata.uid.clone().unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let watch = node::watch_cgroup_peak(uid, "kbind", JOB_LIMIT);
        let pod = node::running_pod(&client, "kbind-system", &job, JOB_LIMIT).await;
        let running = t0.elapsed();
        let end = node::wait_job(c, "kbind-system", &job, JOB_LIMIT).await;
        let total = t0.elapsed();
        let peak = watch.join().unwrap_or_default();
        let summary = node::summary(&node::pod_log(c, "kbind-system", &pod));
        assert!(end.complete(), "{summary}");
        // Inside the node's network namespace, as the Pod is: the provider's node IP is
        // reachable there and nowhere else (from this machine's own namespace a dial to it would
        // follow the default route off the machine).
        let kc = std::path::PathBuf::from(std::env::var("KBIND_NODE_DIR").expect("KBIND_NODE_DIR"))
            .join(c.name)
            .join("admin-inside.kubeconfig")
            .display()
            .to_string();
        let bin = release_binary();
        let host = std::time::Instant::now();
        let out = std::process::Command::new("nsenter")
            .args(["-t", &c.holder.to_string(), "--net", "--"])
            .arg(bin)
            .args([
                pass,
                "--kubeconfig",
                &kc,
                "--lease-namespace",
                "kbind-system",
                "-o",
                "json",
            ])
            .env_remove("KUBECONFIG")
            .output()
            .expect("run the release binary");
        let host_took = host.elapsed();
        let (_, base, _) = support::outcome(out);
        let line = format!(
            "node cycle: {pass}: Job created -> Pod running {:.1} s -> Job Complete {:.1} s \
             (the run itself {:.2} s); cgroup peak: container {:.1} MiB, Pod {:.1} MiB (VmHWM \
             {:.1} MiB); baseline, the same binary as a process in the node's network namespace: \
             {:.2} s, VmHWM {:.1} MiB; \
             Job/process ratio {:.1}x",
            running.as_secs_f64(),
            total.as_secs_f64(),
            summary["duration_seconds"].as_f64().unwrap_or_default(),
            mib(peak.container),
            mib(peak.pod),
            mib(summary["peak_rss_bytes"].as_u64().unwrap_or_default()),
            host_took.as_secs_f64(),
            mib(base["peak_rss_bytes"].as_u64().unwrap_or_default()),
            total.as_secs_f64() / host_took.as_secs_f64().max(0.001),
        );
        println!("{line}");
        // Also for the suite's log: hack/test.sh prints this file after the tests, whose
        // output cargo keeps only when they fail.
        if let Ok(dir) = std::env::var("KBIND_NODE_DIR") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(std::path::Path::new(&dir).join("figures.txt"))
            {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// Steps 1-5 of docs/binding-flow.md, through Pods only: `kbind issue` (a Job from its CronJob
/// on the provider) issues a Grant's kubeconfig; `kbind bind` (jobs/bind/oneoff-job.yaml) binds
/// the consumer with it; schema and resync Jobs on the consumer sync an object up and its
/// status down once the issuer pinned the consumer; second runs write 0; unbinding through the
/// Pods removes the consumer CRD and leaves the provider's copy.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers and the real node: run hack/test.sh"
)]
async fn an_issued_kubeconfig_binds_and_syncs_through_pods_only() {
    let node: Node = node::node();
    let (p, c) = (&node.provider, &node.consumer);
    let _locks = (p.lock(&node.dir), c.lock(&node.dir));
    p.takes_pods().await;
    c.takes_pods().await;
    let _reset = (node::ResetOnPanic(p), node::ResetOnPanic(c));
    let group = format!("{}.example.org", support::unique("flow"));
    let api = format!("widgets.{group}");

    // A path to the provider's apiserver the test can make slow (a proxy in front of it, as a
    // load balancer would be): the issuer hands it out as the server consumers reach.
    let delay = node.dir.join(support::unique("delay"));
    std::fs::write(&delay, "0").expect("write the delay");
    let proxy = format!("{}:{}", p.ip, node::free_port());
    let forward = node::repo("hack/netns-forward.py");
    let mut slow_path = p.spawn_inside(
        "slow-path",
        &[
            "python3",
            forward.to_str().expect("path"),
            "--delay-file",
            delay.to_str().expect("path"),
            &format!("{proxy}=127.0.0.1:443"),
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    slow_path.assert_running();
    let server_url = format!("https://{proxy}");

    // The provider: kbind's provider role (deploy/provider) and what it offers.
    let set = Settings {
        server_url: server_url.clone(),
        ..Settings::default()
    };
    let pdir = overlay(&node, p, &["provider"], &set, Vec::new());
    let pdir_arg = pdir.display().to_string();
    p.kubectl(&["apply", "--server-side", "-k", &pdir_arg], None);
    // The shipped pins policy refuses labelled writes until the apiserver has found the Grant
    // CRD installed with it (docs/issue.md "Confinement").
    support::grant_pins_ready(&p.client().await).await;
    let ns = support::unique("flow-team");
    provider_offers(p, &group, &ns);
    let issued = run(p, "issue", "issue-1").await;
    assert!(issued["data_writes"].as_u64() > Some(0), "{issued}");
    let grant = get_json(p, &["grants.iam.kbind.io", "acme"]);
    assert_eq!(
        condition(&grant, "Ready"),
        ("True".into(), "Issued".into()),
        "{grant}"
    );
    let secret = grant["status"]["secretRef"]["name"]
        .as_str()
        .expect("secretRef")
        .to_string();
    let data = p.kubectl(
        &[
            "get",
            "secret",
            "-n",
            "kbind-grants",
            &secret,
            "-o",
            "jsonpath={.data.kubeconfig}",
        ],
        None,
    );
    let kubeconfig = String::from_utf8(base64_decode(&data)).expect("kubeconfig text");
    assert!(kubeconfig.contains(&server_url), "issued for {server_url}");

    // The consumer: the consumer role (deploy/consumer) with resync's instance RBAC for the
    // bound group (the example ClusterRole in resync-rbac.yaml, edited as it says).
    let instances = json!([
        {"op": "replace", "path": "/rules/0/apiGroups", "value": [group]},
        {"op": "replace", "path": "/rules/1/apiGroups", "value": [group]},
    ]);
    let extra = vec![
        json!({"target": {"kind": "ClusterRole", "name": "kbind-resync-instances-example"},
        "patch": instances.to_string()}),
    ];
    let cdir = overlay(&node, c, &["consumer"], &Settings::default(), extra);
    let cdir_arg = cdir.display().to_string();
    c.kubectl(&["apply", "--server-side", "-k", &cdir_arg], None);

    let bound = bind_job(&node, c, &kubeconfig, &api, "kbind-bind").await;
    assert_eq!(
        bound["writes"], 3,
        "the Secret, the Connection and the ClusterBinding: {bound}"
    );
    let schema = run(c, "schema", "schema-1").await;
    assert_eq!(schema["outcome"], "completed");
    let connection = get_json(c, &["connections", "widgets-provider"]);
    assert_eq!(condition(&connection, "Ready").0, "True", "{connection}");
    c.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            &format!("crd/{api}"),
            "--timeout=60s",
        ],
        None,
    );

    c.kubectl(&["create", "namespace", &ns], None);
    let widget = json!({"apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w1", "namespace": ns}, "spec": {"size": 3}});
    c.kubectl(&["apply", "-f", "-"], Some(&widget.to_string()));

    // The first resync announces the consumer (its heartbeat); the issuer pins it on its next
    // run, and from then on the admission policy admits its writes.
    run(c, "resync", "resync-1").await;
    run(p, "issue", "issue-2").await;
    let grant = get_json(p, &["grants.iam.kbind.io", "acme"]);
    let pinned = grant["status"]["consumerCluster"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !pinned.is_empty(),
        "the issuer pinned the consumer: {grant}"
    );
    let synced = run(c, "resync", "resync-2").await;
    assert!(synced["data_writes"].as_u64() > Some(0), "{synced}");
    let copy = get_json(p, &[&api, "-n", &ns, "w1"]);
    assert_eq!(copy["spec"]["size"], 3, "{copy}");
    assert_eq!(
        copy["metadata"]["labels"]["core.kbind.io/consumer-cluster"],
        pinned.as_str()
    );

    // The provider's controller writes status; the next resync brings it down.
    p.kubectl(
        &[
            "patch",
            &format!("widgets.{group}"),
            "-n",
            &ns,
            "w1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Ready"}}"#,
        ],
        None,
    );
    run(c, "resync", "resync-3").await;
    let mine = get_json(c, &[&api, "-n", &ns, "w1"]);
    assert_eq!(mine["status"]["phase"], "Ready", "{mine}");
    let quiet = run(c, "resync", "resync-4").await;
    assert_eq!(quiet["data_writes"], 0, "a second run writes 0: {quiet}");
    let quiet = run(c, "schema", "schema-2").await;
    assert_eq!(quiet["data_writes"], 0, "a second run writes 0: {quiet}");
    let again = bind_job(&node, c, &kubeconfig, &api, "kbind-bind-again").await;
    assert_eq!(again["writes"], 0, "bind again writes nothing: {again}");

    // Runs cut short and killed, and two at once, with the provider made slow.
    let flow = Flow {
        p,
        c,
        group: group.clone(),
        api: api.clone(),
        ns: ns.clone(),
        delay: delay.clone(),
    };
    a_run_cut_by_its_pod_deadline_resumes_on_the_next_job(&flow).await;
    a_pod_deleted_by_force_mid_write_stops_cleanly(&flow).await;
    a_pod_killed_mid_write_is_replaced_and_takes_its_lease_over(&flow).await;
    a_killed_jobs_lease_is_taken_over_within_the_lease_duration(&flow).await;
    never_two_runs_of_a_pass_at_once(&flow).await;
    let quiet = run(c, "resync", "resync-quiet").await;
    assert_eq!(quiet["data_writes"], 0, "converged: {quiet}");
    one_consumer_cycle_figures(c).await;

    // Unbinding through the Pods: resync releases the instances, schema removes the consumer
    // CRD and the binding; the provider's copy stays (docs/resync.md "Unbinding").
    c.kubectl(
        &[
            "delete",
            "clusterbinding",
            "widgets-provider",
            "--wait=false",
        ],
        None,
    );
    for round in 0..3 {
        run(c, "resync", &format!("resync-unbind-{round}")).await;
        run(c, "schema", &format!("schema-unbind-{round}")).await;
        if !c
            .kubectl_output(&["get", "clusterbinding", "widgets-provider"], None)
            .status
            .success()
        {
            break;
        }
    }
    assert!(
        !c.kubectl_output(&["get", "clusterbinding", "widgets-provider"], None)
            .status
            .success(),
        "the ClusterBinding is gone after its teardown"
    );
    assert!(
        !c.kubectl_output(&["get", "crd", &api], None)
            .status
            .success(),
        "the consumer CRD went with the binding"
    );
    let kept = get_json(p, &[&api, "-n", &ns, "w1"]);
    assert_eq!(kept["spec"]["size"], 3, "the provider's copy stays: {kept}");

    // Leave both clusters as they were: the Connection, the Grant (revoked by the issuer), the
    // installs.
    c.kubectl(
        &["delete", "connection", "widgets-provider", "--wait=false"],
        None,
    );
    for round in 0..3 {
        run(c, "schema", &format!("schema-forget-{round}")).await;
        if !c
            .kubectl_output(&["get", "connection", "widgets-provider"], None)
            .status
            .success()
        {
            break;
        }
    }
    p.kubectl(
        &["delete", "grants.iam.kbind.io", "acme", "--wait=false"],
        None,
    );
    run(p, "issue", "issue-revoke").await;
    c.kubectl(&["delete", "-k", &cdir_arg, "--wait=false"], None);
    p.kubectl(&["delete", "-k", &pdir_arg, "--wait=false"], None);
    for ns in ["kbind-system", ns.as_str()] {
        namespace_gone(c, ns).await;
    }
    for ns in ["kbind-system", "kbind-grants", ns.as_str()] {
        namespace_gone(p, ns).await;
    }
    let _ = c.kubectl_output(
        &["delete", "-f", "-", "--ignore-not-found"],
        Some(&std::fs::read_to_string(node::repo("jobs/bind/oneoff-job.yaml")).expect("read")),
    );
    p.kubectl(&["delete", "crd", &api, "--ignore-not-found"], None);
    for d in [pdir, cdir] {
        let _ = std::fs::remove_dir_all(d);
    }
}
