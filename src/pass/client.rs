//! Kubernetes clients for a pass: the job's own cluster (kubeconfig, context or in-cluster) and,
//! for passes that talk to a provider, a client built from kubeconfig bytes. Every client counts
//! its requests so the summary and the benchmarks can report them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Method, Request};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use tower::buffer::BufferLayer;
use tower::util::MapRequestLayer;

use super::args::CommonArgs;
use super::error::PassError;
use super::retry::{self, RetryLayer};

/// Requests a client sent, split into reads and writes.
#[derive(Debug, Default)]
pub struct RequestCounter {
    reads: AtomicU64,
    writes: AtomicU64,
}

impl RequestCounter {
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }
    pub fn total(&self) -> u64 {
        self.reads() + self.writes()
    }
    fn record(&self, method: &Method) {
        let c = if method == Method::GET || method == Method::HEAD {
            &self.reads
        } else {
            &self.writes
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Build a client from a config, counting its requests into `counter` (every attempt, retries
/// included), retrying transient failures with [`retry::Policy`] in place of kube's unbounded
/// default, and sending kbind's User-Agent ([`crate::user_agent`]). Every Kubernetes client a
/// pass builds, for its own cluster or from a provider kubeconfig, goes through here.
pub fn counted_client(
    mut config: Config,
    counter: Arc<RequestCounter>,
) -> Result<Client, kube::Error> {
    config.default_retry = false;
    with_user_agent(&mut config);
    let count = MapRequestLayer::new(move |req: Request<Body>| {
        counter.record(req.method());
        req
    });
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&count)
        .with_layer(&BufferLayer::<Request<Body>>::new(64))
        .with_layer(&RetryLayer(retry::Policy::default()))
        .build())
}

/// Set kbind's User-Agent on `config`, replacing any the config carried.
pub fn with_user_agent(config: &mut Config) {
    let name = http::header::USER_AGENT;
    config.headers.retain(|(k, _)| k != name);
    // Version and pass names are ASCII: this cannot fail, and if it did the request goes without.
    if let Ok(v) = http::HeaderValue::from_str(&crate::user_agent()) {
        config.headers.push((name, v));
    }
}

/// Bound how long any one request may stall, so a hung server cannot hold a pass past its
/// deadline (kube waits forever by default).
pub fn with_timeouts(mut config: Config, timeout: Duration) -> Config {
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config
}

/// The job's own cluster, found as kubectl finds it (see [`own_config`]).
pub async fn own_client(
    args: &CommonArgs,
    counter: Arc<RequestCounter>,
) -> Result<Client, PassError> {
    counted_client(own_config(args).await?, counter)
        .map_err(|e| PassError::kube("building the Kubernetes client", e))
}

/// What went wrong finding the job's own kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum OwnKubeconfigError {
    #[error("reading kubeconfig {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("merging kubeconfig {path} into the files before it in $KUBECONFIG: {source}")]
    Merge {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("none of the kubeconfig files in $KUBECONFIG exists: {}", list(.paths))]
    NoneExists { paths: Vec<PathBuf> },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The job's own kubeconfig, in kubectl's order: the `--kubeconfig` file, else the files
/// `$KUBECONFIG` (`env`) lists, merged; `None` when neither names one (then kube reads
/// ~/.kube/config, else the in-cluster service account).
///
/// `$KUBECONFIG` is a path list (`a:b`) merged as kubectl merges it: empty entries and files
/// that do not exist are skipped, and the first file to set a key wins: a cluster, user or
/// context of a name, and `current-context`. Relative paths inside each file (certificates,
/// token files) are resolved against that file's directory.
pub fn own_kubeconfig(
    flag: Option<&Path>,
    env: Option<&OsStr>,
) -> Result<Option<(Kubeconfig, String)>, OwnKubeconfigError> {
    if let Some(path) = flag {
        let kc = Kubeconfig::read_from(path).map_err(|source| OwnKubeconfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        return Ok(Some((kc, path.display().to_string())));
    }
    let paths: Vec<PathBuf> = env
        .map(|v| {
            std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if paths.is_empty() {
        return Ok(None);
    }
    let mut merged: Option<Kubeconfig> = None;
    for path in &paths {
        if std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            continue;
        }
        let kc = Kubeconfig::read_from(path).map_err(|source| OwnKubeconfigError::Read {
            path: path.clone(),
            source,
        })?;
        merged = Some(match merged {
            None => kc,
            Some(m) => m.merge(kc).map_err(|source| OwnKubeconfigError::Merge {
                path: path.clone(),
                source,
            })?,
        });
    }
    let kc = merged.ok_or_else(|| OwnKubeconfigError::NoneExists {
        paths: paths.clone(),
    })?;
    Ok(Some((kc, format!("$KUBECONFIG ({})", list(&paths)))))
}

/// The configuration behind [`own_client`], for passes that reach other paths or hosts of the
/// same server family with the same credentials (kcp workspaces and virtual workspaces).
pub async fn own_config(args: &CommonArgs) -> Result<Config, PassError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let env = std::env::var_os("KUBECONFIG");
    let found = own_kubeconfig(args.kubeconfig.as_deref(), env.as_deref())
        .map_err(PassError::Kubeconfig)?;
    let config = match found {
        Some((kc, what)) => Config::from_custom_kubeconfig(kc, &options)
            .await
            .map_err(|e| PassError::invalid(format!("kubeconfig {what}"), e))?,
        // Neither names a file: kube reads ~/.kube/config (with --context, only that).
        None if args.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| PassError::invalid("kubeconfig context", e))?,
        None => Config::infer()
            .await
            .map_err(|e| PassError::invalid("no in-cluster config and no kubeconfig", e))?,
    };
    register_secrets(&config.auth_info);
    Ok(with_timeouts(config, args.request_timeout))
}

/// The job's own credentials are redacted by value from here on, as a Connection's are: its
/// apiserver, or a proxy before it, may quote them back in an error that becomes the summary's
/// message or a log line (docs/contract.md). A token file (in-cluster: the ServiceAccount's)
/// is read for it; one that cannot be read now is kube's to report.
fn register_secrets(auth: &kube::config::AuthInfo) {
    use secrecy::ExposeSecret;
    for s in [&auth.token, &auth.password, &auth.client_key_data]
        .into_iter()
        .flatten()
    {
        crate::scrub::register_secret(s.expose_secret());
    }
    if let Some(Ok(t)) = auth.token_file.as_ref().map(std::fs::read_to_string) {
        crate::scrub::register_secret(&t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The User-Agent as sent on the wire by a client built the way every pass builds one,
    /// replacing one the config carried.
    #[tokio::test]
    async fn every_kube_client_sends_kbinds_user_agent() {
        let (url, server) = crate::record_one_request(
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}}"#,
        );
        let mut config = Config::new(url.parse().unwrap());
        config
            .headers
            .push((http::header::USER_AGENT, "someone-else".parse().unwrap()));
        let client = counted_client(config, Arc::default()).unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        api.get("x").await.unwrap();
        let sent = crate::user_agent_lines(&server.join().unwrap());
        assert_eq!(sent, [crate::user_agent()]);
        let want = format!("kbind/{} (", env!("CARGO_PKG_VERSION"));
        assert!(
            sent[0].starts_with(&want) && sent[0].ends_with(')'),
            "{sent:?}"
        );
    }

    /// A fresh directory for one test's kubeconfig files.
    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("kbind-kubeconfig-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The first file: the context (and the current-context) only.
    const CONTEXTS: &str = "apiVersion: v1
kind: Config
current-context: work
contexts:
- name: work
  context: {cluster: c1, user: u1, namespace: team-a}
";

    /// The second file: the cluster and user the first names, plus a context and a
    /// current-context of its own that the first file's shadow.
    const CLUSTERS: &str = "apiVersion: v1
kind: Config
current-context: elsewhere
clusters:
- name: c1
  cluster: {server: 'https://127.0.0.1:6443'}
- name: decoy
  cluster: {server: 'https://127.0.0.1:1'}
users:
- name: u1
  user: {token: not-a-real-token}
contexts:
- name: work
  context: {cluster: decoy, user: u1}
- name: elsewhere
  context: {cluster: decoy, user: u1}
";

    async fn url_of(kc: Kubeconfig) -> String {
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap()
            .cluster_url
            .to_string()
    }

    #[tokio::test]
    async fn kubeconfig_paths_merge_as_kubectl_merges_them() {
        let d = dir("merge");
        let (a, b) = (d.join("contexts"), d.join("clusters"));
        std::fs::write(&a, CONTEXTS).unwrap();
        std::fs::write(&b, CLUSTERS).unwrap();
        // Empty entries and a missing file are skipped.
        let env = std::env::join_paths([&a, &PathBuf::new(), &d.join("missing"), &b]).unwrap();
        let (kc, what) = own_kubeconfig(None, Some(&env)).unwrap().unwrap();
        assert!(what.starts_with("$KUBECONFIG ("), "{what}");
        assert_eq!(kc.current_context.as_deref(), Some("work"));
        assert_eq!(url_of(kc).await, "https://127.0.0.1:6443/");

        // The other order: the second file's context and current-context win.
        let env = std::env::join_paths([&b, &a]).unwrap();
        let (kc, _) = own_kubeconfig(None, Some(&env)).unwrap().unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("elsewhere"));
        assert_eq!(url_of(kc).await, "https://127.0.0.1:1/");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_flag_wins_and_nothing_named_means_the_defaults() {
        let d = dir("order");
        let (a, b) = (d.join("contexts"), d.join("clusters"));
        std::fs::write(&a, CONTEXTS).unwrap();
        std::fs::write(&b, CLUSTERS).unwrap();
        let env = std::env::join_paths([&a, &b]).unwrap();
        let (kc, what) = own_kubeconfig(Some(&b), Some(&env)).unwrap().unwrap();
        assert_eq!(what, b.display().to_string());
        assert_eq!(kc.current_context.as_deref(), Some("elsewhere"));
        for env in [None, Some(OsStr::new("")), Some(OsStr::new(":"))] {
            assert!(own_kubeconfig(None, env).unwrap().is_none(), "{env:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_missing_explicit_file_or_no_existing_listed_file_is_an_error() {
        let d = dir("missing");
        let gone = d.join("gone");
        let e = own_kubeconfig(Some(&gone), None).unwrap_err();
        assert!(matches!(e, OwnKubeconfigError::Read { .. }), "{e}");
        let env = std::env::join_paths([&gone, &d.join("also-gone")]).unwrap();
        let e = own_kubeconfig(None, Some(&env)).unwrap_err();
        assert!(matches!(e, OwnKubeconfigError::NoneExists { .. }), "{e}");
        assert!(e.to_string().contains("also-gone"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
