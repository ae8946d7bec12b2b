//! `kbind issue`: the provider-side issuer of the optional service layer (docs/issue.md). One
//! bounded pass over every Grant: resolve its Export (or Collection) to exported CRDs; keep a
//! ServiceAccount and RBAC with exactly the consumer passes' needs, its writes confined to the
//! Grant's own consumer cluster (by shipped admission policies, checked first, or on kcp by one
//! the issuer writes per Grant); issue a token by TokenRequest into a
//! kubeconfig Secret and re-issue it before it expires; revoke everything when the Grant goes.
//!
//! The files, in the order of a run: this one (whether to sweep), `sweep.rs` (a full sweep,
//! Grant by Grant), `observe.rs` (Grants, catalog, everything issued, by label), `plan.rs`
//! (pure: resolution, pin in `plan/pinning.rs`, token due, what differs; tests in
//! plan/tests.rs; `plan/sweep.rs`: whether a Grant needs a run), `render.rs` (pure: the issued
//! objects; the per-Grant policy in `render/policy.rs`), `apply.rs` (writes, token,
//! revocation), `record.rs` (Grant and Export status), `window.rs` (the pin window), `args.rs`
//! (flags).

pub mod apply;
pub mod args;
pub mod confinement;
pub mod observe;
pub mod plan;
pub mod record;
pub mod render;
mod sweep;
mod window;

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::Api;

use crate::api::iam::{GRANT_KEY, Grant};
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::summary::Sweep;
use crate::pass::writes::Writes;
use crate::pass::{CommonArgs, PassContext, PassError, Summary};

pub use args::IssueArgs;
use plan::Config;

pub const PASS: &str = "issue";

/// What failed, on which object.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("listing {what}: {source}")]
    List {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading --server-ca-file {path}: {source}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn config(args: &IssueArgs) -> Result<Config, PassError> {
    let server = args
        .server_url
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| PassError::Config("--server-url is required".into()))?;
    if !server.starts_with("https://") {
        return Err(PassError::Config(format!(
            "--server-url {server:?} must be https://: kbind refuses a Connection kubeconfig with any other server"
        )));
    }
    let ca_pem = std::fs::read(&args.server_ca_file).map_err(|source| {
        PassError::Config(
            IssueError::CaFile {
                path: args.server_ca_file.display().to_string(),
                source,
            }
            .to_string(),
        )
    })?;
    Ok(Config {
        namespace: args.grants_namespace.clone(),
        server,
        ca_pem,
        reissue_before: args.reissue_before,
        now: Timestamp::now(),
        confinement: args.confinement,
    })
}

/// One run's state: what each step of it reads and adds to.
struct Run<'a> {
    ctx: &'a PassContext,
    args: &'a IssueArgs,
    cfg: Config,
    manager: String,
    summary: Summary,
    writes: Writes,
}

/// Run one issue pass: a full sweep when one is due or a Grant needs it (else the run reads
/// only the Grants and heartbeats), then the pin window while an issued Grant waits for its
/// first heartbeat.
pub async fn run(ctx: PassContext, args: IssueArgs) -> Result<Summary, PassError> {
    let cfg = config(&args)?;
    let mut run = Run {
        ctx: &ctx,
        args: &args,
        cfg,
        manager: ctx.field_manager(),
        summary: Summary::new(PASS, ctx.args.dry_run),
        writes: Writes::new(ctx.args.dry_run),
    };
    let mut awaiting = Vec::new();
    let mut stopped = None;
    // A one-off run with --selector does everything for what it selects, and is no full sweep.
    // Between full sweeps a run sweeps fully as soon as a Grant needs a run, so what one Grant's
    // change takes from another (a namespace it now holds) goes in the same run.
    let full = match args.selector {
        Some(_) => true,
        None => {
            let mut sweep =
                crate::pass::sweep::due(args.full_sweep_every, ctx.swept_at, run.cfg.now);
            if sweep == Sweep::Changed {
                let changes = run.changes().await?;
                if changes.changed.is_empty() {
                    run.summary.count("unchanged", changes.all as i64);
                    awaiting = changes.awaiting;
                } else {
                    for (grant, why) in &changes.changed {
                        tracing::info!(grant = %grant, why = %why, "a full sweep before it is due");
                    }
                    sweep = Sweep::Full;
                }
            }
            run.summary.sweep = Some(sweep);
            sweep == Sweep::Full
        }
    };
    let started = std::time::Instant::now();
    if full {
        let swept = run.full_sweep().await?;
        awaiting = swept.awaiting;
        stopped = swept.stopped;
    }
    if stopped.is_none() && !ctx.args.dry_run && !args.pin_window.is_zero() {
        run.pin_window(awaiting, started.elapsed()).await;
    }
    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!("stopped early ({why}); the next run continues"),
        resume_after: None,
    });
    let Run {
        mut summary,
        writes,
        ..
    } = run;
    summary.finish(writes, stopped);
    Ok(summary)
}

impl Run<'_> {
    /// What changed since the Grants were last worked on ([`observe::changed`]).
    async fn changes(&self) -> Result<observe::Changes, PassError> {
        let owns = |g: &str| crate::pass::shard::owns(self.ctx.args.shard, g);
        observe::changed(
            &self.ctx.client,
            &self.cfg.namespace,
            (self.cfg.reissue_before, self.cfg.now),
            &owns,
        )
        .await
        .map_err(|e| PassError::unreachable("observing Grants", e))
    }
}

/// `kbind issue --print-kubeconfig GRANT`: print the issued kubeconfig; returns the exit code.
pub async fn print_kubeconfig(common: CommonArgs, grant: String) -> i32 {
    crate::install_crypto_provider();
    crate::set_command(PASS);
    match read_kubeconfig(&common, &grant).await {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            crate::logging::print_error("issue --print-kubeconfig", &e);
            e.exit_code()
        }
    }
}

async fn read_kubeconfig(common: &CommonArgs, grant: &str) -> Result<String, PassError> {
    let config = own_config(common).await?;
    let client = counted_client(config, Arc::new(RequestCounter::default()))
        .map_err(|e| PassError::kube("building the Kubernetes client", e))?;
    let g = Api::<Grant>::all(client.clone())
        .get_opt(grant)
        .await
        .map_err(|e| PassError::kube(format!("reading Grant {grant}"), e))?
        .ok_or_else(|| PassError::Config(format!("Grant {grant} not found")))?;
    let r = g.status.and_then(|s| s.secret_ref).ok_or_else(|| {
        PassError::Config(format!(
            "Grant {grant} has no issued kubeconfig yet (status.secretRef): run kbind issue"
        ))
    })?;
    let s = crate::secrets::read(&client, &r.namespace, &r.name)
        .await
        .map_err(|e| {
            PassError::unreachable(format!("reading Secret {}/{}", r.namespace, r.name), e)
        })?;
    if s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(GRANT_KEY))
        .map(String::as_str)
        != Some(grant)
    {
        return Err(PassError::Config(format!(
            "Secret {}/{} is not labelled {GRANT_KEY}={grant}",
            r.namespace, r.name
        )));
    }
    crate::secrets::key_bytes(&s, render::KUBECONFIG_KEY)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            PassError::Config(format!(
                "Secret {}/{} holds no kubeconfig",
                r.namespace, r.name
            ))
        })
}
