//! The Helm chart (charts/kbind) against kustomize (deploy/) and the real consumer apiserver:
//! `helm lint` passes; combinations of the five passes (every subset of the first four, with
//! issue on in half of them: see `combinations`) render with `helm template`, install exactly the
//! passes switched on, and pass a server-side dry-run apply; the default rendering is applied for
//! real; for each role the chart and the kustomize overlay hold the same objects (kind,
//! namespace, name) with the same RBAC rules, bindings, CronJob schedules, args, podFailurePolicy
//! and pod security; the chart's `crds/` are deploy/crds and its `jobs/` (the job definitions its
//! CronJob template reads) are jobs/; and the documented CRD upgrade path (Helm never upgrades
//! `crds/`: apply them with server-side apply first) keeps existing objects.
//!
//! helm is built from Go modules by hack/build-servers.sh (like the test servers).

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

const PASSES: [&str; 5] = ["schema", "resync", "claims", "relsync", "issue"];

/// What a user must set to enable claims, relsync and issue: the examples kustomize ships
/// (jobs/claims/cronjob.yaml, jobs/relsync/cronjob.yaml, jobs/issue/cronjob.yaml), so the two
/// renderings can be compared.
const REQUIRED: [&str; 5] = [
    "passes.claims.coreExport=core.example.io",
    "passes.claims.coreExportPath=root:hub",
    "passes.claims.coreBinding=core",
    "passes.relsync.spicedb.url=http://spicedb.spicedb.svc.cluster.local:8443",
    "passes.issue.serverUrl=https://provider.example.com:6443",
];

/// The Kubernetes version the chart is rendered for (the harness apiserver's).
const KUBE_VERSION: &str = "1.36.3";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The helm binary hack/build-servers.sh builds (`--print-helm`).
fn helm() -> PathBuf {
    let out = Command::new(repo("hack/build-servers.sh"))
        .arg("--print-helm")
        .output()
        .expect("run hack/build-servers.sh --print-helm");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        path.is_file(),
        "no helm at {}: run hack/build-servers.sh (it builds helm from Go modules)",
        path.display()
    );
    path
}

fn run(cmd: &mut Command, stdin: Option<&str>) -> Output {
    support::output_with_stdin(cmd, stdin)
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `helm template` of the chart with `sets` (and the CRDs from `crds/`).
fn template(sets: &[String]) -> String {
    let mut cmd = Command::new(helm());
    cmd.args(["template", "kbind"])
        .arg(repo("charts/kbind"))
        .args(["--include-crds", "--kube-version", KUBE_VERSION]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    ok(run(&mut cmd, None), &format!("helm template {sets:?}"))
}

/// The `--set`s enabling exactly `on`.
fn passes_on(on: &[&str]) -> Vec<String> {
    let mut sets: Vec<String> = PASSES
        .iter()
        .map(|p| format!("passes.{p}.enabled={}", on.contains(p)))
        .collect();
    sets.extend(REQUIRED.iter().map(|s| s.to_string()));
    sets
}

fn documents(yaml: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap_or_else(|e| panic!("parse {what}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn kustomize(dir: &str) -> Vec<Value> {
    let out = run(
        Command::new("kubectl").arg("kustomize").arg(repo(dir)),
        None,
    );
    documents(&ok(out, &format!("kubectl kustomize {dir}")), dir)
}

fn key(d: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&d["kind"]),
        s(&d["metadata"]["namespace"]),
        s(&d["metadata"]["name"]),
    )
}

fn kubectl(env: &support::Env, args: &[&str], stdin: Option<&str>) -> Output {
    run(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&env.consumer)
            .args(args),
        stdin,
    )
}

/// Server-side apply (`dry_run`: `--dry-run=server`); returns how many objects the server took.
fn apply(env: &support::Env, yaml: &str, dry_run: bool, what: &str) -> usize {
    let mut args = vec![
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=kbind-install-tests",
    ];
    if dry_run {
        args.push("--dry-run=server");
    }
    args.extend(["-f", "-"]);
    let out = kubectl(env, &args, Some(yaml));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let stdout = ok(out, what);
    assert!(
        !err.contains("PodSecurity"),
        "{what}: pods must meet Pod Security restricted:\n{err}"
    );
    stdout.lines().count()
}

/// The namespaces kbind's objects live in, for real (a dry run needs them to exist).
fn namespaces(env: &support::Env) {
    for file in [
        "deploy/base/namespace.yaml",
        "deploy/components/directory/namespace.yaml",
        "deploy/components/provider/grants-namespace.yaml",
    ] {
        apply(env, &read(file), false, file);
    }
}

/// 16 of the 32 subsets of the passes, a covering set: every subset of the first four once, and
/// issue on exactly when an even number of them is (so issue alone, as deploy/provider, and
/// all five are among them). Issue's state is a parity of the other four, so for every two or
/// three passes each of their on/off states occurs: any clash between the objects of up to
/// three passes shows, at half the dry-run applies of all 32.
fn combinations() -> Vec<Vec<&'static str>> {
    (0..16u32)
        .map(|mask| {
            let mask = if mask.count_ones() % 2 == 0 {
                mask | 1 << 4
            } else {
                mask
            };
            PASSES
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, p)| *p)
                .collect()
        })
        .collect()
}

/// The covering property `combinations` promises: every state of every three passes.
#[test]
fn combinations_cover_every_three_passes() {
    let combos = combinations();
    assert_eq!(combos.len(), 16);
    for (a, pa) in PASSES.iter().enumerate() {
        for (b, pb) in PASSES.iter().enumerate().skip(a + 1) {
            for pc in PASSES.iter().skip(b + 1) {
                for state in 0..8u32 {
                    let want = |bit: u32| state & (1 << bit) != 0;
                    assert!(
                        combos.iter().any(|on| on.contains(pa) == want(0)
                            && on.contains(pb) == want(1)
                            && on.contains(pc) == want(2)),
                        "{pa} {pb} {pc} state {state:03b}"
                    );
                }
            }
        }
    }
    assert!(combos.contains(&vec!["issue"]), "issue alone");
    assert!(combos.contains(&PASSES.to_vec()), "all five");
}

/// `helm lint` (strict: warnings fail) with the defaults, with every pass on, and with every
/// pass on and issue's optional settings set.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn helm_lint_passes() {
    let chart = repo("charts/kbind");
    let all = passes_on(&PASSES);
    let mut issue_options = all.clone();
    issue_options.extend([
        "passes.issue.serverCa.configMap=provider-ca".to_string(),
        "passes.issue.reissueBefore=6m".to_string(),
    ]);
    for sets in [vec![], all, issue_options] {
        let mut cmd = Command::new(helm());
        cmd.args(["lint", "--strict", "--kube-version", KUBE_VERSION])
            .arg(&chart);
        for s in &sets {
            cmd.args(["--set", s]);
        }
        ok(run(&mut cmd, None), &format!("helm lint {sets:?}"));
    }
}

/// Enabling claims, relsync or issue without the settings they cannot run without fails the
/// render, naming the value (rather than installing a job that fails every run); so does an
/// issue server URL that is not https:// (`kbind issue` refuses it with exit code 2).
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn chart_refuses_a_pass_without_its_required_settings() {
    for (pass, extra, value) in [
        ("claims", None, "passes.claims.coreExport"),
        ("relsync", None, "passes.relsync.spicedb.url"),
        ("issue", None, "passes.issue.serverUrl"),
        (
            "issue",
            Some("passes.issue.serverUrl=http://provider.example.com:6443"),
            "must be https://",
        ),
    ] {
        let mut cmd = Command::new(helm());
        cmd.args(["template", "kbind"])
            .arg(repo("charts/kbind"))
            .args(["--kube-version", KUBE_VERSION])
            .args(["--set", &format!("passes.{pass}.enabled=true")]);
        if let Some(set) = extra {
            cmd.args(["--set", set]);
        }
        let out = run(&mut cmd, None);
        assert!(!out.status.success(), "{pass} rendered without {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(value), "{pass}: {err}");
    }
}

/// The chart's CRDs are deploy/crds/kbind.yaml (which tests/crds.rs keeps equal to the binary).
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn chart_crds_are_deploy_crds() {
    assert_eq!(
        read("charts/kbind/crds/kbind.yaml"),
        read("deploy/crds/kbind.yaml"),
        "charts/kbind/crds/kbind.yaml is stale: cp deploy/crds/kbind.yaml charts/kbind/crds/"
    );
}

/// The job definitions a directory holds, by path below it (`<pass>/<file>`): every file in
/// its pass folders except `skip`.
fn job_files(dir: &str, skip: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let entries = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap_or_else(|e| panic!("read {}: {e}", d.display()))
            .map(|e| e.expect("dir entry").path())
            .collect::<Vec<_>>()
    };
    for pass in entries(&repo(dir)) {
        if !pass.is_dir() {
            continue;
        }
        for file in entries(&pass) {
            let name = file.file_name().expect("file name").to_string_lossy();
            if skip.contains(&name.as_ref()) {
                continue;
            }
            let pass = pass.file_name().expect("dir name").to_string_lossy();
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            out.insert(format!("{pass}/{name}"), text);
        }
    }
    out
}

/// The chart's copies of the job definitions (charts/kbind/jobs/: Helm reads only files inside
/// the chart, and its CronJob template starts from them) are byte-identical to jobs/, file for
/// file: each job definition in jobs/<pass>/ has its copy (the kustomizations are kustomize's,
/// not job definitions) and the chart holds no job that jobs/ does not.
#[test]
fn chart_jobs_are_jobs() {
    let jobs = job_files("jobs", &["kustomization.yaml"]);
    let copies = job_files("charts/kbind/jobs", &[]);
    for pass in PASSES {
        let cronjob = format!("{pass}/cronjob.yaml");
        assert!(jobs.contains_key(&cronjob), "no jobs/{cronjob}");
    }
    assert_eq!(
        copies.keys().collect::<Vec<_>>(),
        jobs.keys().collect::<Vec<_>>(),
        "charts/kbind/jobs/ holds a copy of each job definition in jobs/, and nothing else"
    );
    for (file, text) in &jobs {
        assert!(
            copies[file] == *text,
            "charts/kbind/jobs/{file} differs from jobs/{file}: edit jobs/{file}, then \
             cp jobs/{file} charts/kbind/jobs/{file}"
        );
    }
}

/// Each of the 16 combinations of the passes (`combinations`) renders, holds the CronJobs of
/// exactly the passes switched on (and their identities), never a Job, and passes a server-side dry-run;
/// the defaults (schema and resync, as `kubectl apply -k deploy/`) are applied for real.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn every_combination_renders_and_applies() {
    let env = support::env();
    namespaces(&env);
    for on in combinations() {
        let what = format!("passes {on:?}");
        let rendered = template(&passes_on(&on));
        let docs = documents(&rendered, &what);
        let mut cronjobs: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "CronJob")
            .map(|d| key(d).2)
            .collect();
        cronjobs.sort();
        let mut want: Vec<String> = on.iter().map(|p| format!("kbind-{p}")).collect();
        want.sort();
        assert_eq!(cronjobs, want, "{what}");
        for d in &docs {
            assert_ne!(d["kind"], "Job", "{what}: a Job would run at once");
            if let Some(c) = d["metadata"]["labels"]["app.kubernetes.io/component"].as_str() {
                assert!(on.contains(&c), "{what}: {:?} of a pass not on", key(d));
            }
        }
        for p in &on {
            for kind in [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
            ] {
                assert!(
                    docs.iter()
                        .any(|d| d["kind"] == kind && key(d).2.starts_with(&format!("kbind-{p}"))),
                    "{what}: no {kind} for {p}"
                );
            }
        }
        let applied = apply(&env, &rendered, true, &what);
        assert_eq!(applied, docs.len(), "{what}: every object applies");
    }
    // For real: the defaults. The CronJobs are suspended so the harness's controller manager
    // starts no Jobs (its pods could never be scheduled); everything else is as installed.
    let mut sets = passes_on(&["schema", "resync"]);
    sets.extend([
        "passes.schema.suspend=true".into(),
        "passes.resync.suspend=true".into(),
    ]);
    let rendered = template(&sets);
    let docs = documents(&rendered, "defaults");
    apply(&env, &rendered, false, "the defaults, for real");
    for d in docs.iter().filter(|d| d["kind"] == "CronJob") {
        let (_, ns, name) = key(d);
        let out = kubectl(
            &env,
            &["get", "cronjob", "-n", &ns, &name, "-o", "json"],
            None,
        );
        let got: Value = serde_json::from_str(&ok(out, &name)).expect("CronJob json");
        // (The server adds `status: "True"` to the Ignore rule's pod condition.)
        assert_eq!(
            got["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][0],
            json!({"action": "FailJob", "onExitCodes":
                {"containerName": "kbind", "operator": "In", "values": [2]}}),
            "{name}: the server kept the podFailurePolicy"
        );
        assert_eq!(got["spec"]["suspend"], true, "{name}");
    }
}

/// Integral floats as integers (one YAML parser reads `0` where another wrote `0.0`).
fn normalized(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
        other => other,
    }
}

/// Objects by (kind, namespace, name), with the chart's instance role named like kustomize's
/// example.
fn by_key(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter()
        .map(|d| {
            let mut k = key(d);
            if k.2 == "kbind-resync-instances" {
                k.2 = "kbind-resync-instances-example".into();
            }
            (k, normalized(d.clone()))
        })
        .collect()
}

/// What must agree between the chart and kustomize for one object (labels and comments may
/// differ: the chart adds Helm's labels).
fn essence(d: &Value) -> Value {
    let pod_spec = |job: &Value| {
        let pod = &job["template"]["spec"];
        let c = &pod["containers"][0];
        json!({
            "serviceAccountName": pod["serviceAccountName"],
            "restartPolicy": pod["restartPolicy"],
            "securityContext": pod["securityContext"],
            "volumes": pod["volumes"],
            "containers": pod["containers"].as_array().map(Vec::len),
            "name": c["name"],
            "args": c["args"],
            "env": c["env"],
            "volumeMounts": c["volumeMounts"],
            "resources": c["resources"],
            "containerSecurityContext": c["securityContext"],
            "imagePullPolicy": c["imagePullPolicy"],
        })
    };
    match d["kind"].as_str().unwrap_or_default() {
        "ClusterRole" | "Role" => {
            let mut rules = d["rules"].clone();
            if d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("kbind-resync-instances"))
            {
                // The chart's role is for the groups in values; compare its rules only.
                return json!({"rules": rules});
            }
            if let Some(r) = rules.as_array_mut() {
                r.sort_by_key(|x| x.to_string());
            }
            // kbind-issue-grantable: its rules are the aggregated ClusterRoles'.
            json!({"rules": rules, "aggregationRule": d["aggregationRule"]})
        }
        "ClusterRoleBinding" | "RoleBinding" => {
            let mut role_ref = d["roleRef"].clone();
            if role_ref["name"] == "kbind-resync-instances" {
                role_ref["name"] = json!("kbind-resync-instances-example");
            }
            json!({"roleRef": role_ref, "subjects": d["subjects"]})
        }
        "CronJob" => {
            let s = &d["spec"];
            let job = &s["jobTemplate"]["spec"];
            json!({
                "schedule": s["schedule"],
                "concurrencyPolicy": s["concurrencyPolicy"],
                "startingDeadlineSeconds": s["startingDeadlineSeconds"],
                "history": [s["successfulJobsHistoryLimit"], s["failedJobsHistoryLimit"]],
                "backoffLimit": job["backoffLimit"],
                "podFailurePolicy": job["podFailurePolicy"],
                "activeDeadlineSeconds": job["activeDeadlineSeconds"],
                "ttlSecondsAfterFinished": job["ttlSecondsAfterFinished"],
                "pod": pod_spec(job),
            })
        }
        "Namespace" => {
            let psa: Vec<Value> = ["enforce", "warn", "audit"]
                .iter()
                .map(|m| d["metadata"]["labels"][format!("pod-security.kubernetes.io/{m}")].clone())
                .collect();
            json!({ "psa": psa })
        }
        "CustomResourceDefinition" => d["spec"].clone(),
        // kbind-schema-secrets: the same rule, for the same identity.
        "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding" => d["spec"].clone(),
        "ServiceAccount" => json!({}),
        other => panic!("unexpected kind {other}"),
    }
}

/// For each role (and deploy/all, and none), the chart and the kustomize overlay hold the same
/// objects with the same rules, bindings, CronJob specs and CRDs; the image is the chart's
/// appVersion, which kustomize's manifests name too.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn chart_and_kustomize_agree() {
    let instances = [
        "passes.resync.boundAPIs[0].group=example.org".to_string(),
        "passes.resync.boundAPIs[0].resources[0]=widgets".to_string(),
    ];
    for (overlay, on) in [
        ("deploy/base", vec![]),
        ("deploy", vec!["schema", "resync"]),
        ("deploy/consumer", vec!["schema", "resync"]),
        ("deploy/hub", vec!["claims"]),
        ("deploy/directory", vec!["relsync"]),
        ("deploy/provider", vec!["issue"]),
        // Every role of one cluster: the provider side runs on the provider cluster.
        ("deploy/all", vec!["schema", "resync", "claims", "relsync"]),
    ] {
        let mut sets = passes_on(&on);
        sets.extend(instances.iter().cloned());
        let chart = by_key(&documents(&template(&sets), overlay));
        let kust = by_key(&kustomize(overlay));
        let chart_keys: Vec<_> = chart.keys().collect();
        let kust_keys: Vec<_> = kust.keys().collect();
        assert_eq!(chart_keys, kust_keys, "{overlay}: the same objects");
        for (k, kd) in &kust {
            assert_eq!(essence(&chart[k]), essence(kd), "{overlay}: {k:?}");
            if k.0 == "CronJob" {
                let image = |d: &Value| {
                    d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                };
                assert_eq!(image(&chart[k]), image(kd), "{overlay}: {k:?} image");
            }
        }
    }
}

/// issue's optional settings reach its command line: the CA ConfigMap is mounted and
/// --server-ca-file names the mounted key (a path outside a volume would not exist: the root
/// filesystem is read-only and holds only the binary), --reissue-before and --grants-namespace
/// are passed, and the issuer's Role follows the grants namespace.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn chart_passes_issue_its_settings() {
    let mut sets = passes_on(&["issue"]);
    sets.extend([
        "passes.issue.serverCa.configMap=provider-ca".to_string(),
        "passes.issue.serverCa.key=ca.pem".to_string(),
        "passes.issue.reissueBefore=6m".to_string(),
        "passes.issue.grantsNamespace.name=issued".to_string(),
    ]);
    let docs = documents(&template(&sets), "issue settings");
    let cron = docs
        .iter()
        .find(|d| d["kind"] == "CronJob")
        .expect("a CronJob");
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--server-url=https://provider.example.com:6443",
        "--grants-namespace=issued",
        "--reissue-before=6m",
    ] {
        assert!(args.contains(&want), "{want} in {args:?}");
    }
    let ca_file = args
        .iter()
        .find_map(|a| a.strip_prefix("--server-ca-file="))
        .expect("--server-ca-file");
    let mount = &pod["containers"][0]["volumeMounts"][0];
    let dir = mount["mountPath"].as_str().expect("mountPath");
    assert_eq!(ca_file, format!("{dir}/ca.pem"));
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert_eq!(volume["configMap"]["name"], "provider-ca");
    assert_eq!(
        volume["configMap"]["items"],
        json!([{"key": "ca.pem", "path": "ca.pem"}])
    );
    for kind in ["Namespace", "Role", "RoleBinding"] {
        assert!(
            docs.iter().any(|d| d["kind"] == kind
                && (key(d).1 == "issued" || (kind == "Namespace" && key(d).2 == "issued"))),
            "{kind} of the grants namespace"
        );
    }
    assert!(
        !docs.iter().any(|d| serde_json::to_string(d)
            .expect("json")
            .contains("kbind-grants")),
        "nothing left in kbind-grants"
    );
}

/// The image value: a digest pins `repository:tag@digest`; the tag defaults to appVersion.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn chart_pins_the_image_by_digest() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let mut sets = passes_on(&["schema"]);
    sets.push(format!("image.digest={digest}"));
    let docs = documents(&template(&sets), "digest");
    let chart_yaml = read("charts/kbind/Chart.yaml");
    let app_version = chart_yaml
        .lines()
        .find_map(|l| l.strip_prefix("appVersion: "))
        .expect("appVersion")
        .trim_matches('"');
    let cron = docs
        .iter()
        .find(|d| d["kind"] == "CronJob")
        .expect("a CronJob");
    assert_eq!(
        cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("ghcr.io/kbind/kbind:{app_version}@{digest}")
    );
}

/// Helm installs `crds/` once and never upgrades them. The documented upgrade path
/// (docs/upgrade.md, "Helm"): `kubectl apply --server-side --force-conflicts -f
/// charts/kbind/crds/` before `helm upgrade`. Checked on kbind's real CRDs under a group of this
/// test's own (the shared ones stay untouched): the 0.1 CRDs created the way Helm creates them
/// (its own field manager, not server-side apply), objects stored, then the current CRDs
/// applied with that command: it succeeds, the objects survive unchanged, the new schema is
/// served.
#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn crd_upgrade_path_keeps_existing_objects() {
    let env = support::env();
    let unique = support::unique("crdup");
    let regroup = |docs: Vec<Value>| -> Vec<Value> {
        docs.into_iter()
            .map(|mut d| {
                let group = d["spec"]["group"].as_str().unwrap_or_default().to_string();
                let new_group = format!("{}.{unique}.test", group.replace('.', "-"));
                let plural = d["spec"]["names"]["plural"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                d["spec"]["group"] = json!(new_group);
                d["metadata"]["name"] = json!(format!("{plural}.{new_group}"));
                // Not in `kubectl get kbind` nor under kbind's short names.
                if let Some(names) = d["spec"]["names"].as_object_mut() {
                    names.remove("shortNames");
                    names.remove("categories");
                }
                d
            })
            .collect()
    };
    let old = regroup(documents(
        &read("tests/fixtures/kbind-crds-0.1.yaml"),
        "0.1 CRDs",
    ));
    let new = regroup(documents(&read("charts/kbind/crds/kbind.yaml"), "CRDs"));
    let as_list =
        |docs: &[Value]| json!({"apiVersion": "v1", "kind": "List", "items": docs}).to_string();
    let connection_crd = old
        .iter()
        .find(|d| d["spec"]["names"]["kind"] == "Connection")
        .expect("Connection CRD")
        .clone();
    let group = connection_crd["spec"]["group"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let names: Vec<String> = old
        .iter()
        .map(|d| {
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();

    // helm install: the CRDs created with Helm's field manager.
    ok(
        kubectl(
            &env,
            &["create", "--field-manager=helm", "-f", "-"],
            Some(&as_list(&old)),
        ),
        "create the 0.1 CRDs",
    );
    let crd_args: Vec<String> = names.iter().map(|n| format!("crd/{n}")).collect();
    let mut wait = vec!["wait", "--for", "condition=Established", "--timeout=60s"];
    wait.extend(crd_args.iter().map(String::as_str));
    ok(kubectl(&env, &wait, None), "wait for the 0.1 CRDs");

    let conn = json!({
        "apiVersion": format!("{group}/v1alpha1"), "kind": "Connection",
        "metadata": {"name": "survivor"},
        "spec": {"kubeconfigSecretRef": {"namespace": "kbind-system", "name": "provider"}}});
    ok(
        kubectl(&env, &["create", "-f", "-"], Some(&conn.to_string())),
        "create a Connection under the 0.1 CRDs",
    );
    let resource = format!("connections.{group}");
    let get = || -> Value {
        let out = kubectl(&env, &["get", &resource, "survivor", "-o", "json"], None);
        serde_json::from_str(&ok(out, "get the Connection")).expect("json")
    };
    let before = get();

    // Without --force-conflicts the apply is refused: Helm's field manager owns the fields.
    let plain = kubectl(
        &env,
        &["apply", "--server-side", "-f", "-"],
        Some(&as_list(&new)),
    );
    assert!(!plain.status.success(), "Helm's CRDs took a plain apply");
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(err.contains("conflict with \"helm\""), "{err}");
    // The documented step: the new CRDs by server-side apply, before `helm upgrade`.
    ok(
        kubectl(
            &env,
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&as_list(&new)),
        ),
        "apply the current CRDs over Helm's",
    );
    ok(kubectl(&env, &wait, None), "wait for the current CRDs");
    let after = get();
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        after["spec"], before["spec"],
        "the object survives unchanged"
    );
    let new_conn = new
        .iter()
        .find(|d| d["spec"]["names"]["kind"] == "Connection")
        .expect("Connection CRD");
    let served: Value = serde_json::from_str(&ok(
        kubectl(&env, &["get", "crd", &resource, "-o", "json"], None),
        "get the CRD",
    ))
    .expect("json");
    assert_eq!(
        served["spec"]["versions"][0]["schema"], new_conn["spec"]["versions"][0]["schema"],
        "the server serves the new schema"
    );

    let mut delete = vec!["delete", "--wait=false"];
    delete.extend(crd_args.iter().map(String::as_str));
    let _ = kubectl(&env, &delete, None);
}

/// One version everywhere: the crate (what `kbind --version` and the User-Agent say), the
/// chart's version and appVersion, the image every job definition (jobs/) and kustomize
/// manifest names, and the Dockerfile's version label (its `ARG VERSION` default: the published
/// build does not pass it).
#[test]
fn versions_agree() {
    let version = env!("CARGO_PKG_VERSION");
    let dockerfile = read("Dockerfile");
    let args: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("ARG VERSION="))
        .collect();
    assert_eq!(args, [version], "Dockerfile ARG VERSION");
    let chart = read("charts/kbind/Chart.yaml");
    for field in ["version: ", "appVersion: "] {
        let v = chart
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .unwrap_or_else(|| panic!("Chart.yaml has no {field}"))
            .trim_matches('"');
        assert_eq!(v, version, "Chart.yaml {field}");
    }
    let mut images = 0;
    for dir in [
        "jobs/schema",
        "jobs/resync",
        "jobs/claims",
        "jobs/relsync",
        "jobs/issue",
        "deploy/components/consumer",
        "deploy/components/hub",
        "deploy/components/directory",
        "deploy/components/provider",
    ] {
        for e in std::fs::read_dir(repo(dir)).expect("read dir") {
            let text = std::fs::read_to_string(e.expect("entry").path()).expect("read");
            for line in text
                .lines()
                .filter(|l| l.trim_start().starts_with("image: "))
            {
                images += 1;
                assert_eq!(
                    line.trim(),
                    format!("image: ghcr.io/kbind/kbind:{version}"),
                    "{dir}"
                );
            }
        }
    }
    // Five CronJobs, the schema one-off Job and the sharded resync Job.
    assert!(images >= 7, "{images} images");
}
