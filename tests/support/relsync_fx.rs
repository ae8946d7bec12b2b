//! A relsync fixture: its own namespace, its own SpiceDB store (a unique serve-testing token),
//! the SpiceDB schema from config/samples, and local Slack/SCIM stand-ins started in this test
//! process on 127.0.0.1:0.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use kbind::api::relsync::{AgentIdentity, RelationshipSource};
use kbind::relsync::auth::Token;
use kbind::relsync::spicedb::{Filter, HttpStore, Rel, RelationshipStore};
use kbind_testkit::slack;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::support;

pub const SLACK_TOKEN: &str = "xoxb-test-0000-secret";

pub struct Rx {
    pub env: support::Env,
    pub client: Client,
    pub ns: String,
    pub spicedb: HttpStore,
    pub spicedb_token_file: PathBuf,
}

/// A Slack user with an email derived from its id.
pub fn user(id: &str) -> slack::User {
    slack::User {
        id: id.into(),
        email: Some(format!("{}@example.com", id.to_lowercase())),
        ..Default::default()
    }
}

pub fn channel(id: &str, members: &[&str]) -> slack::Channel {
    slack::Channel {
        id: id.into(),
        name: id.to_lowercase(),
        members: members.iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    }
}

pub fn workspace(users: Vec<slack::User>, channels: Vec<slack::Channel>) -> slack::Workspace {
    slack::Workspace {
        team_id: "T1".into(),
        token: SLACK_TOKEN.into(),
        users,
        channels,
        max_page: 100,
        ..Default::default()
    }
}

impl Rx {
    pub async fn new(prefix: &str) -> Self {
        let env = support::env();
        let client = env.consumer().await;
        support::kbind_crds(&client).await;
        let ns = support::namespace(&client, prefix).await;
        let token = support::unique("relsync-store");
        let spicedb = HttpStore::new(&env.spicedb_url, Token::new(token.clone())).unwrap();
        let schema = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/spicedb-schema.zed"
        ))
        .unwrap();
        spicedb.write_schema(&schema).await.expect("write schema");
        let spicedb_token_file = std::env::temp_dir().join(format!("{token}.key"));
        std::fs::write(&spicedb_token_file, &token).unwrap();
        Self {
            env,
            client,
            ns,
            spicedb,
            spicedb_token_file,
        }
    }

    pub async fn secret(&self, name: &str, value: &str) {
        let s = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([("token".to_string(), value.to_string())])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(&s))
            .await
            .unwrap();
    }

    /// An AgentIdentity `agent` with one credential `cred` (Secret `cred`, key `token`).
    pub async fn identity(&self, cred: &str, token: &str, allowed_hosts: &[&str]) {
        self.identity_with(&[(cred, token, allowed_hosts)]).await;
    }

    /// An AgentIdentity `agent` with these credentials: (name, token, allowedHosts), each in
    /// Secret `<name>`, key `token`.
    pub async fn identity_with(&self, creds: &[(&str, &str, &[&str])]) {
        let mut list = Vec::new();
        for (cred, token, hosts) in creds {
            self.secret(cred, token).await;
            list.push(json!({"name": cred, "secretRef": {"name": cred, "key": "token"}, "allowedHosts": hosts}));
        }
        let id: AgentIdentity = serde_json::from_value(json!({
            "apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "AgentIdentity",
            "metadata": {"name": "agent", "namespace": self.ns},
            "spec": {"credentials": list}
        }))
        .unwrap();
        Api::<AgentIdentity>::namespaced(self.client.clone(), &self.ns)
            .patch(
                "agent",
                &PatchParams::apply("test").force(),
                &Patch::Apply(&id),
            )
            .await
            .unwrap();
    }

    /// A RelationshipSource `name` with this spec (auth defaults to agent/`cred`).
    pub async fn source(&self, name: &str, spec: Value) {
        let mut spec = spec;
        if spec.get("auth").is_none() {
            spec["auth"] = json!({"agentIdentity": "agent", "credential": "slack"});
        }
        let s: RelationshipSource = serde_json::from_value(json!({
            "apiVersion": "agentprimitives.authzed.com/v1alpha1", "kind": "RelationshipSource",
            "metadata": {"name": name, "namespace": self.ns}, "spec": spec
        }))
        .unwrap();
        Api::<RelationshipSource>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &s)
            .await
            .unwrap();
    }

    pub async fn patch_spec(&self, name: &str, spec: Value) {
        Api::<RelationshipSource>::namespaced(self.client.clone(), &self.ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await
            .unwrap();
    }

    pub async fn status(&self, name: &str) -> kbind::api::relsync::RelationshipSourceStatus {
        Api::<RelationshipSource>::namespaced(self.client.clone(), &self.ns)
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    pub async fn last_pass(&self, name: &str) -> kbind::api::relsync::LastPass {
        self.status(name)
            .await
            .sync
            .unwrap_or_default()
            .last_pass
            .unwrap_or_default()
    }

    /// `kbind relsync` on this fixture's namespace, its store and the Slack stand-in at
    /// `slack_url`; `extra` may name another identity (`--kubeconfig`, with its own Lease
    /// namespace) or another `--upstream-rate-scale`.
    pub fn command(&self, slack_url: &str, extra: &[&str]) -> std::process::Command {
        let kc = self.env.consumer.to_string_lossy().to_string();
        let token_file = self.spicedb_token_file.to_string_lossy().to_string();
        let slack_api = format!("{slack_url}/api");
        let mut args: Vec<&str> = vec!["relsync"];
        if !extra.contains(&"--kubeconfig") {
            args.extend(["--kubeconfig", &kc, "--lease-namespace", &self.ns]);
        }
        if !extra.contains(&"--upstream-rate-scale") {
            args.extend(["--upstream-rate-scale", "60"]);
        }
        args.extend([
            "--namespace",
            &self.ns,
            "--spicedb-url",
            &self.env.spicedb_url,
            "--spicedb-token-file",
            &token_file,
            "--slack-api-url",
            &slack_api,
            "-o",
            "json",
        ]);
        args.extend_from_slice(extra);
        // `KBIND_BIN` runs another build of kbind (e.g. the release binary of another commit)
        // against the same stand-ins, to measure before/after figures.
        match std::env::var_os("KBIND_BIN") {
            Some(bin) => {
                let mut cmd = std::process::Command::new(bin);
                cmd.args(&args)
                    .env("RUST_LOG", "info")
                    .env_remove("KUBECONFIG");
                cmd
            }
            None => support::kbind_command(&args),
        }
    }

    /// Run `kbind relsync` on this fixture's namespace with `env` set; returns (exit code,
    /// summary, stderr). Runs on a blocking thread so the in-process fakes keep serving.
    pub async fn run_env(
        &self,
        slack_url: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, Value, String) {
        let mut cmd = self.command(slack_url, extra);
        cmd.envs(env.iter().copied());
        tokio::task::spawn_blocking(move || support::outcome(cmd.output().expect("run kbind")))
            .await
            .unwrap()
    }

    /// Run and require exit 0.
    pub async fn run(&self, slack_url: &str, extra: &[&str]) -> Value {
        let (code, summary, stderr) = self.run_env(slack_url, extra, &[]).await;
        assert_eq!(code, 0, "kbind relsync failed: {summary}\n{stderr}");
        summary
    }

    /// Every relationship of `object_type` this fixture's store holds, as `id#rel@user` strings
    /// with the source prefix removed.
    pub async fn held(&self, object_type: &str) -> Vec<String> {
        let rels: Vec<Rel> = self
            .spicedb
            .read(&Filter {
                resource_type: object_type.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut out: Vec<String> = rels
            .iter()
            .map(|r| {
                let obj = r.resource.id.rsplit('/').next().unwrap_or_default();
                let subj = r.subject.id.rsplit('/').next().unwrap_or_default();
                let subj = kbind::relsync::encode::decode(subj).unwrap_or(subj.to_string());
                format!("{obj}#{}@{subj}", r.relation)
            })
            .collect();
        out.sort();
        out
    }
}

impl Rx {
    /// Every relationship source `name` of this fixture's namespace holds in the store (its
    /// object-id prefix, every object type any kind writes), read back through the gateway.
    pub async fn held_by(&self, name: &str) -> Vec<Rel> {
        let prefix = kbind::relsync::plan::source_prefix(&self.ns, name);
        let mut out = Vec::new();
        for t in kbind::relsync::kinds::all_object_types() {
            out.extend(
                self.spicedb
                    .read(&Filter {
                        resource_type: t.into(),
                        resource_id_prefix: Some(prefix.clone()),
                        ..Default::default()
                    })
                    .await
                    .unwrap(),
            );
        }
        out.sort();
        out
    }

    /// The source `name`, if it still exists.
    pub async fn get_source(&self, name: &str) -> Option<RelationshipSource> {
        Api::<RelationshipSource>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// Delete the source `name` (it stays while a finalizer holds it).
    pub async fn delete_source(&self, name: &str) {
        Api::<RelationshipSource>::namespaced(self.client.clone(), &self.ns)
            .delete(name, &Default::default())
            .await
            .unwrap();
    }
}

impl Rx {
    /// Server-side apply a repository manifest on the consumer apiserver with kubectl.
    pub fn kubectl_apply(&self, file: &str) {
        let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new("kubectl")
            .args(["--kubeconfig", &self.env.consumer.to_string_lossy()])
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=kbind-relsync-tests",
                "-f",
                &path,
            ])
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl apply {file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A kubeconfig file for the existing ServiceAccount `namespace/name` (TokenRequest).
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let kc = support::token_kubeconfig(&self.env.consumer, namespace, name).await;
        let path =
            std::env::temp_dir().join(format!("{}.kubeconfig", support::unique("relsync-sa")));
        std::fs::write(&path, kc).unwrap();
        path
    }
}

impl Drop for Rx {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.spicedb_token_file);
    }
}
