//! The real node (hack/node.sh, docs/testing.md "The real node"): two clusters, "consumer" and
//! "provider", each with one Ready node that runs real Pods from the image hack/image.sh built,
//! each inside a network namespace of its own. Helpers for tests/node.rs: kubectl and helm
//! against either cluster, servers started inside a node's namespace, loopback forwarders to
//! them, Jobs waited for, Pods counted, and the summary line read from a Pod's log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::Value;

/// One of the two node clusters.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub name: &'static str,
    /// Admin kubeconfig (reaches the apiserver through a loopback forwarder).
    pub kubeconfig: PathBuf,
    /// The process that holds the node's network and mount namespaces.
    pub holder: u32,
    /// The node's IP: where servers started inside listen, what the other cluster's Pods dial.
    pub ip: String,
    /// The apiserver as the other cluster's Pods reach it.
    pub url: String,
}

/// Both clusters, the CA every server there is signed by, and the kbind image's reference.
#[derive(Clone, Debug)]
pub struct Node {
    pub consumer: Cluster,
    pub provider: Cluster,
    pub ca: PathBuf,
    pub dir: PathBuf,
    pub image: String,
}

fn var(k: &str) -> String {
    std::env::var(k)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{k} is not set: the real node is not running. Run the suite with `hack/test.sh` \
                 (it builds the image and starts the node), or `hack/test.sh --node-only`"
            )
        })
}

/// The node `hack/test.sh` started. Like [`super::env`], a missing node is a failure.
pub fn node() -> Node {
    kbind::install_crypto_provider();
    let cluster = |name: &'static str, upper: &str| Cluster {
        name,
        kubeconfig: var(&format!("KBIND_NODE_{upper}_KUBECONFIG")).into(),
        holder: var(&format!("KBIND_NODE_{upper}_HOLDER_PID"))
            .parse()
            .expect("holder pid"),
        ip: var(&format!("KBIND_NODE_{upper}_IP")),
        url: var(&format!("KBIND_NODE_{upper}_URL")),
    };
    Node {
        consumer: cluster("consumer", "CONSUMER"),
        provider: cluster("provider", "PROVIDER"),
        ca: var("KBIND_NODE_CA").into(),
        dir: var("KBIND_NODE_DIR").into(),
        image: var("KBIND_NODE_IMAGE"),
    }
}

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

impl Cluster {
    pub async fn client(&self) -> Client {
        super::client(&self.kubeconfig).await
    }

    /// kubectl against this cluster; the output whatever the exit code.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        super::output_with_stdin(&mut cmd, stdin)
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.kubectl_output(args, stdin);
        assert!(
            out.status.success(),
            "{}: kubectl {}: {}",
            self.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// helm against this cluster (the binary hack/build-servers.sh builds).
    pub fn helm(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(helm());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        let out = super::output_with_stdin(&mut cmd, None);
        assert!(
            out.status.success(),
            "{}: helm {}: {}",
            self.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run `cmd` inside this node's network namespace, listening where it is told to (the node
    /// IP); killed when dropped.
    pub fn spawn_inside(&self, what: &str, cmd: &[&str]) -> Inside {
        let log = std::env::temp_dir().join(super::unique(&format!("node-{what}")));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("nsenter")
            .arg("-t")
            .arg(self.holder.to_string())
            .arg("--net")
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {what} inside the {} node: {e}", self.name));
        Inside {
            what: what.into(),
            child,
            log,
        }
    }

    /// A loopback port of this machine forwarded to `target` (`ADDR:PORT` inside the node's
    /// namespace), for tests that read what a Pod sent there.
    pub fn forward(&self, target: &str) -> Forward {
        let port = free_port();
        let child = Command::new("python3")
            .arg(repo("hack/netns-forward.py"))
            .arg("--netns")
            .arg(self.holder.to_string())
            .arg(format!("127.0.0.1:{port}={target}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start hack/netns-forward.py");
        let mut f = Forward { child, port };
        f.wait_ready();
        f
    }

    /// Why Pods did not run, for a test that waited in vain: the node's conditions and taints,
    /// the Pods in `ns` (those of Job `job` described), the namespace's latest Events, and the
    /// last lines of the kubelet's and containerd's logs.
    pub fn explain(&self, ns: &str, job: Option<&str>) -> String {
        let show = |args: &[&str]| {
            let out = self.kubectl_output(args, None);
            format!(
                "--- kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let mut text = vec![
            show(&["describe", "node"]),
            show(&["get", "pods", "-n", ns, "-o", "wide"]),
        ];
        if let Some(job) = job {
            let selector = format!("batch.kubernetes.io/job-name={job}");
            text.push(show(&["describe", "pods", "-n", ns, "-l", &selector]));
            text.push(show(&[
                "logs", "-n", ns, "-l", &selector, "-c", "kbind", "--tail", "20",
            ]));
        }
        text.push(show(&[
            "get",
            "events",
            "-n",
            ns,
            "--sort-by=.lastTimestamp",
        ]));
        // Every server hack/node.sh started ("PID NODE-NAME" lines): one that is gone explains
        // Pods that never came, whatever the apiserver still says.
        let top = PathBuf::from(var("KBIND_NODE_DIR"));
        let pids = std::fs::read_to_string(top.join("pids")).unwrap_or_default();
        let gone: Vec<&str> = pids
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(pid, _)| !Path::new(&format!("/proc/{pid}")).exists())
            .map(|(_, name)| name)
            .collect();
        text.push(format!("--- node servers no longer running: {gone:?}"));
        let dir = top.join(self.name);
        let mut servers = vec!["kubelet", "containerd"];
        servers.extend(gone.iter().filter_map(|name| {
            name.strip_prefix(self.name)
                .and_then(|s| s.strip_prefix('-'))
                .filter(|s| !servers_default(s))
        }));
        for server in servers {
            let log =
                std::fs::read_to_string(dir.join(format!("{server}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            text.push(format!(
                "--- the {} {server}'s last lines\n{tail}",
                self.name
            ));
        }
        text.join("\n")
    }

    /// The node takes Pods: Ready and without a NoSchedule or NoExecute taint (disk or memory
    /// pressure, say), and nothing of an earlier test is left in the namespaces kbind installs
    /// into. Otherwise the test fails at once, saying why, instead of waiting out a Job.
    pub async fn takes_pods(&self) {
        let client = self.client().await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
        let start = Instant::now();
        loop {
            let list = nodes
                .list(&ListParams::default())
                .await
                .expect("list nodes");
            let ready = !list.items.is_empty()
                && list.items.iter().all(|n| {
                    let status = n.status.as_ref();
                    let is_ready = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                        c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                    let tainted = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|t| t.iter().any(|t| t.effect != "PreferNoSchedule"));
                    is_ready && !tainted
                });
            let mut left = Vec::new();
            for ns in ["kbind-system", "kbind-relsync", "kbind-grants"] {
                if namespaces
                    .get_opt(ns)
                    .await
                    .expect("get namespace")
                    .is_some()
                {
                    left.push(ns);
                }
            }
            if ready && left.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the {} node does not take Pods (Ready and untainted: {ready}; left by an earlier \
                 test: {left:?})\n{}",
                self.name,
                self.explain("kube-system", None)
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Best effort to leave the cluster as a test found it after that test failed half-way: the
    /// Helm release uninstalled, the finalizers of kbind's objects and the tests' own (whose
    /// kbind runs will not come) dropped, kbind's namespaces deleted. The next test waits for
    /// them to go ([`Cluster::takes_pods`]).
    pub fn reset(&self) {
        let run = |args: &[&str]| {
            let out = self.kubectl_output(args, None);
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let mut helm = Command::new(helm());
        helm.arg("--kubeconfig").arg(&self.kubeconfig).args([
            "uninstall",
            "kbind",
            "--namespace",
            "default",
            "--ignore-not-found",
            "--wait",
            "--timeout",
            "90s",
        ]);
        let _ = super::output_with_stdin(&mut helm, None);
        let crds = run(&["get", "crd", "-o", "jsonpath={.items[*].metadata.name}"]);
        for crd in crds
            .split_whitespace()
            .filter(|c| c.ends_with("kbind.io") || c.ends_with("example.org"))
        {
            let objects = run(&[
                "get",
                crd,
                "-A",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}"#,
            ]);
            for object in objects.lines() {
                let (ns, name) = object.split_once('/').unwrap_or(("", object));
                let mut args = vec!["patch", crd, name, "--type=merge"];
                if !ns.is_empty() {
                    args.extend(["-n", ns]);
                }
                args.extend(["-p", r#"{"metadata":{"finalizers":null}}"#]);
                run(&args);
            }
        }
        for ns in ["kbind-system", "kbind-relsync", "kbind-grants"] {
            run(&[
                "delete",
                "namespace",
                ns,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }

    /// Serialize the tests that install into this cluster (cluster-scoped objects, the
    /// kbind-system namespace): a file lock in the node's directory, held until dropped.
    pub fn lock(&self, dir: &Path) -> std::fs::File {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{}.lock", self.name)))
            .expect("open the cluster lock");
        f.lock().expect("take the cluster lock");
        f
    }
}

fn servers_default(server: &str) -> bool {
    matches!(server, "kubelet" | "containerd")
}

/// [`Cluster::reset`] when the test holding it panics (hold it after the cluster's lock, so it
/// runs first when both drop).
pub struct ResetOnPanic<'a>(pub &'a Cluster);

impl Drop for ResetOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.reset();
        }
    }
}

fn helm() -> PathBuf {
    let out = Command::new(repo("hack/build-servers.sh"))
        .arg("--print-helm")
        .output()
        .expect("run hack/build-servers.sh --print-helm");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A process inside a node's namespace (see [`Cluster::spawn_inside`]).
pub struct Inside {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Inside {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test if the process already exited (it could not listen, say).
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}): {}", self.what, self.log());
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A loopback forwarder (see [`Cluster::forward`]).
pub struct Forward {
    child: Child,
    pub port: u16,
}

impl Forward {
    fn wait_ready(&mut self) {
        use std::io::BufRead;
        let out = self.child.stdout.take().expect("forwarder stdout");
        let mut line = String::new();
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("forwarder output");
        assert!(line.contains("ready"), "forwarder did not start: {line:?}");
    }

    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a Job ended, with its Pods.
#[derive(Debug)]
pub struct JobEnd {
    pub name: String,
    /// `Complete` or `Failed` (the condition that ended it).
    pub condition: String,
    /// The ending condition's reason (`DeadlineExceeded`, `PodFailurePolicy`, `BackoffLimitExceeded`).
    pub reason: String,
    pub pods: Vec<Pod>,
    pub took: Duration,
}

impl JobEnd {
    pub fn complete(&self) -> bool {
        self.condition == "Complete"
    }
}

/// Wait until Job `name` in `ns` is Complete or Failed, at most `limit`; past it, fail with what
/// the node says about the Job's Pods ([`Cluster::explain`]).
pub async fn wait_job(cluster: &Cluster, ns: &str, name: &str, limit: Duration) -> JobEnd {
    let client = &cluster.client().await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        if let Some(job) = jobs.get_opt(name).await.expect("get job") {
            let ended = job
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default()
                .into_iter()
                .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
            if let Some(c) = ended {
                return JobEnd {
                    name: name.into(),
                    condition: c.type_,
                    reason: c.reason.unwrap_or_default(),
                    pods: job_pods(client, ns, name).await,
                    took: start.elapsed(),
                };
            }
        }
        assert!(
            start.elapsed() < limit,
            "Job {ns}/{name} did not end within {limit:?}\n{}",
            cluster.explain(ns, Some(name))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The Pods of Job `name`, oldest first.
pub async fn job_pods(client: &Client, ns: &str, name: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut list = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")))
        .await
        .expect("list pods")
        .items;
    list.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    list
}

/// The exit code of a Pod's kbind container, once it terminated.
pub fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "kbind")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// A Pod's log (its kbind container), through the apiserver and the kubelet.
pub fn pod_log(cluster: &Cluster, ns: &str, pod: &str) -> String {
    let log = cluster.kubectl(&["logs", "-n", ns, pod, "-c", "kbind"], None);
    keep_log(&log);
    log
}

/// The summary line of a pass's log: the last line that parses as JSON with a `pass` field.
pub fn summary(log: &str) -> Value {
    log.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("pass").is_some())
        .unwrap_or_else(|| panic!("no summary line in the log:\n{log}"))
}

/// Pod logs go to the suite's secret scan like every other kbind run's output.
fn keep_log(log: &str) {
    if let Some(dir) = std::env::var_os("KBIND_TEST_EMIT_DIR") {
        let path = Path::new(&dir).join(format!("{}.log", super::unique("node-pod")));
        let _ = std::fs::write(path, log);
    }
}

/// Create Job `job` from CronJob `cronjob` as an operator would
/// (`kubectl create job --from=cronjob/...`).
pub fn job_from_cronjob(cluster: &Cluster, ns: &str, cronjob: &str, job: &str) {
    cluster.kubectl(
        &[
            "create",
            "job",
            "-n",
            ns,
            &format!("--from=cronjob/{cronjob}"),
            job,
        ],
        None,
    );
}

/// A CronJob's job template as a Job named `name`, changed by `edit` (its args, its deadline),
/// created: for runs an operator would start from an edited copy of the CronJob.
pub fn job_from_template(
    cluster: &Cluster,
    ns: &str,
    cronjob: &str,
    name: &str,
    edit: impl FnOnce(&mut Value),
) {
    let cj: Value = serde_json::from_str(
        &cluster.kubectl(&["get", "cronjob", "-n", ns, cronjob, "-o", "json"], None),
    )
    .expect("cronjob json");
    let mut job = serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns,
            "labels": cj["spec"]["jobTemplate"]["metadata"]["labels"].clone()},
        "spec": cj["spec"]["jobTemplate"]["spec"].clone(),
    });
    edit(&mut job);
    cluster.kubectl(&["create", "-f", "-"], Some(&job.to_string()));
}

/// The container args of a Job (or CronJob job template) spec, to edit.
pub fn args_of(job: &mut Value) -> &mut Vec<Value> {
    job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .expect("container args")
}

/// The Slack and SCIM stand-ins' binary (crates/kbind-testkit), which `cargo test --workspace`
/// builds beside the test binaries.
pub fn fake_upstreams_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    let bin = dir.join("kbind-fake-upstreams");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p kbind-testkit --bin kbind-fake-upstreams` \
         (hack/test.sh does)",
        bin.display()
    );
    bin
}

/// `kubectl logs -f` of a Pod from while it runs: the whole log even when the Pod is deleted
/// as it ends (a Job past its activeDeadlineSeconds, a Pod deleted by force).
pub struct LogFollower {
    child: Child,
}

impl LogFollower {
    pub fn start(cluster: &Cluster, ns: &str, pod: &str) -> Self {
        let child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["logs", "-f", "-n", ns, pod, "-c", "kbind"])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl logs -f");
        LogFollower { child }
    }

    /// What it read, once the Pod's container ended (or after `limit`).
    pub fn finish(mut self, limit: Duration) -> String {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let out = self.child.wait_with_output().expect("log output");
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        keep_log(&log);
        log
    }
}

/// The name of Job `job`'s newest Pod once its container runs (or ran), at most `limit`.
pub async fn running_pod(client: &Client, ns: &str, job: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let pods = job_pods(client, ns, job).await;
        if let Some(p) = pods.last() {
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.state
                            .as_ref()
                            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
                    })
                });
            if started {
                return p.metadata.name.clone().unwrap_or_default();
            }
        }
        assert!(
            start.elapsed() < limit,
            "Job {ns}/{job}: no Pod running within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGKILL the process named `comm` in Pod `pod_uid`'s containers, as the kernel's OOM killer
/// or a dying node would: no signal it can handle, nothing recorded, its Lease left held. Found
/// through the Pod's cgroup (`pod<uid>` in /proc/<pid>/cgroup). Returns how many were killed.
pub fn sigkill_in_pod(pod_uid: &str, comm: &str) -> usize {
    let needle = format!("pod{pod_uid}");
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if cgroup.contains(&needle) && name.trim() == comm {
            let ok = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            killed += usize::from(ok);
        }
    }
    killed
}

/// Memory figures of one Pod's run, from its cgroups (cgroup v1 here): the peak of its `comm`
/// container and of the whole Pod (the sandbox included).
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupPeak {
    pub container: u64,
    pub pod: u64,
}

/// Watch Pod `pod_uid` from another thread: find its `comm` process, read its container's
/// memory cgroup peak (`memory.max_usage_in_bytes`) every 10 ms until it exits, then the Pod
/// cgroup's. At most `limit`.
pub fn watch_cgroup_peak(
    pod_uid: String,
    comm: &'static str,
    limit: Duration,
) -> std::thread::JoinHandle<CgroupPeak> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let needle = format!("pod{pod_uid}");
        let mut found = None;
        while found.is_none() && start.elapsed() < limit {
            found = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|e| {
                    let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
                    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                    let mem = cg.lines().find(|l| l.contains(":memory:"))?;
                    (name.trim() == comm && mem.contains(&needle)).then(|| {
                        (
                            pid,
                            mem.split(":memory:").nth(1).unwrap_or_default().to_string(),
                        )
                    })
                });
            std::thread::sleep(Duration::from_millis(5));
        }
        let Some((pid, path)) = found else {
            return CgroupPeak::default();
        };
        let dir = PathBuf::from(format!("/sys/fs/cgroup/memory{path}"));
        let read = |d: &Path| {
            std::fs::read_to_string(d.join("memory.max_usage_in_bytes"))
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let mut peak = CgroupPeak::default();
        while Path::new(&format!("/proc/{pid}")).exists() && start.elapsed() < limit {
            if let Some(v) = read(&dir) {
                peak.container = peak.container.max(v);
            }
            if let Some(v) = dir.parent().and_then(read) {
                peak.pod = peak.pod.max(v);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(v) = dir.parent().and_then(read) {
            peak.pod = peak.pod.max(v);
        }
        peak
    })
}
