//! Kubernetes clients for a pass: the job's own cluster (kubeconfig, context or in-cluster) and,
//! for passes that talk to a provider, a client built from kubeconfig bytes. Every client counts
//! its requests so the summary and the benchmarks can report them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{Method, Request};
use kube::client::{Body, ClientBuilder};
use kube::config::{KubeConfigOptions, Kubeconfig};
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
/// included) and retrying transient failures with [`retry::Policy`] in place of kube's
/// unbounded default.
pub fn counted_client(
    mut config: Config,
    counter: Arc<RequestCounter>,
) -> Result<Client, kube::Error> {
    config.default_retry = false;
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

/// Bound how long any one request may stall, so a hung server cannot hold a pass past its
/// deadline (kube waits forever by default).
pub fn with_timeouts(mut config: Config, timeout: Duration) -> Config {
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config
}

/// The job's own cluster: `--kubeconfig`/`--context` when given, else in-cluster, else the
/// default kubeconfig.
pub async fn own_client(
    args: &CommonArgs,
    counter: Arc<RequestCounter>,
) -> Result<Client, PassError> {
    counted_client(own_config(args).await?, counter)
        .map_err(|e| PassError::kube("building the Kubernetes client", &e))
}

/// The configuration behind [`own_client`], for passes that reach other paths or hosts of the
/// same server family with the same credentials (kcp workspaces and virtual workspaces).
pub async fn own_config(args: &CommonArgs) -> Result<Config, PassError> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                PassError::Config(format!("reading kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| PassError::Config(format!("kubeconfig {}: {e}", path.display())))?
        }
        None if args.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| PassError::Config(format!("kubeconfig context: {e}")))?,
        None => Config::infer().await.map_err(|e| {
            PassError::Config(format!("no in-cluster config and no kubeconfig: {e}"))
        })?,
    };
    Ok(with_timeouts(config, args.request_timeout))
}
