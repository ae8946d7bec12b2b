//! `kbind issue`: the provider-side issuer of the optional service layer (docs/issue.md). One
//! bounded pass over every Grant: resolve its Export (or Collection) to exported CRDs; keep a
//! ServiceAccount and RBAC with exactly the consumer passes' needs, its writes confined to the
//! Grant's own consumer cluster (by shipped admission policies, checked first, or on kcp by one
//! the issuer writes per Grant); issue a token by TokenRequest into a
//! kubeconfig Secret and re-issue it before it expires; revoke everything when the Grant goes.
//!
//! The files, in the order of a run: `observe.rs` (Grants, catalog, everything issued, by
//! label), `plan.rs` (pure: resolution, pin, token due, what differs; tests in plan/tests.rs),
//! `render.rs` (pure: the issued objects), `apply.rs` (writes, token, revocation), `record.rs`
//! (Grant and Export status), `args.rs` (flags).

pub mod apply;
pub mod args;
pub mod confinement;
pub mod observe;
pub mod plan;
pub mod record;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};

use crate::api::catalog::Export;
use crate::api::iam::{GRANT_KEY, Grant, REVOKE_FINALIZER};
use crate::pass::budget::Exhausted;
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::summary::Sweep;
use crate::pass::writes::Writes;
use crate::pass::{CommonArgs, PassContext, PassError, Summary, finalizer};
use crate::scrub::scrub;

pub use args::IssueArgs;
use plan::{Blocked, Config, Pin, Token};
use record::GrantOutcome;

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

/// Run one issue pass.
pub async fn run(ctx: PassContext, args: IssueArgs) -> Result<Summary, PassError> {
    let cfg = config(&args)?;
    let mut summary = Summary::new(PASS, ctx.args.dry_run);
    let mut writes = Writes::new(ctx.args.dry_run);
    let manager = ctx.field_manager();
    let ns = cfg.namespace.clone();
    // A one-off run with --selector does everything for what it selects, and is no full sweep.
    // Between full sweeps a run sweeps fully as soon as a Grant needs a run, so what one Grant's
    // change takes from another (a namespace it now holds) goes in the same run.
    if args.selector.is_none() {
        let mut sweep = crate::pass::sweep::due(args.full_sweep_every, ctx.swept_at, cfg.now);
        if sweep == Sweep::Changed {
            let owns = |g: &str| crate::pass::shard::owns(ctx.args.shard, g);
            let (all, changed) =
                observe::changed(&ctx.client, &ns, (cfg.reissue_before, cfg.now), &owns)
                    .await
                    .map_err(|e| PassError::Unreachable {
                        what: "observing Grants".into(),
                        message: scrub(&e.to_string()),
                    })?;
            if changed.is_empty() {
                summary.count("unchanged", all as i64);
                summary.sweep = Some(Sweep::Changed);
                summary.finish(writes, None);
                return Ok(summary);
            }
            for (grant, why) in &changed {
                tracing::info!(grant = %grant, why = %why, "a full sweep before it is due");
            }
            sweep = Sweep::Full;
        }
        summary.sweep = Some(sweep);
    }
    if cfg.confinement == args::Confinement::Shipped {
        // Nothing is issued that would write unconfined (docs/issue.md "Confinement").
        let gaps =
            observe::confinement_gaps(&ctx.client)
                .await
                .map_err(|e| PassError::Unreachable {
                    what: "reading the admission policies confining issued identities".into(),
                    message: scrub(&e.to_string()),
                })?;
        if !gaps.is_empty() {
            return Err(PassError::Config(format!(
                "the admission policies confining issued identities are not in force ({}): \
                 install them as shipped (deploy/provider, or the chart with \
                 passes.issue.enabled), or on kcp run with --confinement per-grant; until then \
                 kbind issue writes nothing (docs/issue.md \"Confinement\")",
                gaps.join("; ")
            )));
        }
    }
    let obs = observe::observe(&ctx.client, &ns, args.selector.as_deref(), cfg.confinement)
        .await
        .map_err(|e| PassError::Unreachable {
            what: "observing Grants".into(),
            message: scrub(&e.to_string()),
        })?;
    summary.count("grants", obs.grants.len() as i64);
    let grants_api: Api<Grant> = Api::all(ctx.client.clone());

    // Exports first: their status says which APIs are missing.
    let exports_api: Api<Export> = Api::all(ctx.client.clone());
    // With --selector, only the Exports the selected Grants name.
    let named: Option<BTreeSet<String>> = args.selector.as_ref().map(|_| {
        obs.grants
            .iter()
            .flat_map(|g| {
                let mut v: Vec<String> = g.spec.export.iter().cloned().collect();
                if let Some(c) = g
                    .spec
                    .collection
                    .as_ref()
                    .and_then(|c| obs.catalog.collections.get(c))
                {
                    v.extend(c.exports.iter().map(|e| e.name.clone()));
                }
                v
            })
            .collect()
    });
    for e in &obs.exports {
        if !crate::pass::shard::owns(ctx.args.shard, &e.name_any())
            || named.as_ref().is_some_and(|n| !n.contains(&e.name_any()))
        {
            continue;
        }
        if let Some(st) = record::export_status(
            e.status.as_ref(),
            &e.spec,
            &obs.catalog,
            e.metadata.generation,
            cfg.now,
        ) && writes.will("apply-status", format!("Export {}", e.name_any()), "")
        {
            match crate::pass::status::apply_status(
                &exports_api,
                &e.name_any(),
                &manager,
                apply::status_body(&st),
                None,
            )
            .await
            {
                Ok(_) => writes.bookkeeping_done(),
                Err(err) => {
                    tracing::warn!(export = %e.name_any(), error = %scrub(&err.to_string()), "Export status not written")
                }
            }
        }
    }

    // Consumer clusters already pinned (by any Grant, selected or not), so no two Grants hold one.
    let mut pinned: BTreeMap<String, String> = obs.pinned.clone();
    let provider = plan::Provider {
        catalog: &obs.catalog,
        tenancy: &obs.tenancy,
        namespaces: &obs.namespaces,
        in_use: &obs.in_use,
        handover: &obs.handover,
        cfg: &cfg,
    };
    let live: BTreeSet<String> = obs.grants.iter().map(ResourceExt::name_any).collect();
    let mut stopped: Option<Exhausted> = None;

    for g in &obs.grants {
        let name = g.name_any();
        if !crate::pass::shard::owns(ctx.args.shard, &name) {
            continue;
        }
        if let Err(why) = ctx.budget.check() {
            stopped = Some(why);
            break;
        }
        let empty = plan::Issued::default();
        let issued = obs.issued.get(&name).unwrap_or(&empty);
        let has_fin = finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER);

        if g.metadata.deletion_timestamp.is_some() {
            if !has_fin {
                continue;
            }
            summary.count("revoked", 1);
            let kinds = plan::revoke(issued);
            let _ = ctx.budget.take();
            let leases: Vec<String> = issued.leases.iter().map(|h| h.name.clone()).collect();
            match apply::revoke(
                &ctx.client,
                &name,
                &ns,
                (&kinds, &leases),
                issued.secret.is_some(),
                &mut writes,
            )
            .await
            {
                Ok(()) => {
                    if writes.will(
                        "release-finalizer",
                        format!("Grant {name}"),
                        REVOKE_FINALIZER,
                    ) {
                        match finalizer::set(
                            &grants_api,
                            &name,
                            None,
                            &manager,
                            REVOKE_FINALIZER,
                            false,
                        )
                        .await
                        {
                            Ok(()) => writes.bookkeeping_done(),
                            Err(e) => {
                                tracing::warn!(grant = %name, error = %scrub(&e.to_string()), "finalizer not released")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(grant = %name, error = %e, "revocation unfinished; the next run continues")
                }
            }
            continue;
        }

        let recorded = g.status.as_ref().and_then(|s| s.consumer_cluster.clone());
        let others: BTreeMap<String, String> = pinned
            .iter()
            .filter(|(_, by)| **by != name)
            .map(|(u, b)| (u.clone(), b.clone()))
            .collect();
        let mut outcome = GrantOutcome::default();
        let approved = g
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::api::iam::APPROVE_CONSUMER_CLUSTER))
            .map(String::as_str);
        let owner = render::GrantRef {
            name: &name,
            uid: g.metadata.uid.as_deref().unwrap_or_default(),
            created: g.metadata.creation_timestamp.as_ref().map(|t| t.0),
        };
        match plan::plan_grant(
            owner,
            &g.spec,
            recorded.as_deref(),
            approved,
            issued,
            &others,
            &provider,
        ) {
            Err(b) => {
                summary.count("blocked", 1);
                let r = if plan::is_isolation(b.reason) {
                    plan::reduce(owner, &g.spec, issued, &provider)
                } else {
                    plan::Reduction::default()
                };
                if r != plan::Reduction::default() {
                    if let Err(why) = ctx.budget.take() {
                        stopped = Some(why);
                        break;
                    }
                    if let Err(e) =
                        apply::reduce(&ctx.client, &manager, &name, &ns, &r, &mut writes).await
                    {
                        tracing::warn!(grant = %name, error = %e.message, "RBAC of a Grant that is not Ready not reduced; the next run tries again");
                    }
                }
                outcome.blocked = Some(b);
            }
            Ok(p) => {
                outcome.apis = Some(p.resolved.apis.iter().map(|a| a.name.clone()).collect());
                outcome.pin = Some(p.pin.clone());
                outcome.shared = Some(p.shared.clone());
                if let Pin::Pinned { uid, new: true } = &p.pin {
                    pinned.insert(uid.clone(), name.clone());
                }
                if let Token::Keep { expires_at } = &p.token {
                    outcome.expires_at = Some(*expires_at);
                }
                let busy =
                    !p.writes.is_empty() || matches!(p.token, Token::Issue { .. }) || !has_fin;
                if busy && let Err(why) = ctx.budget.take() {
                    stopped = Some(why);
                    break;
                }
                let fin_ok = has_fin
                    || !writes.will("add-finalizer", format!("Grant {name}"), REVOKE_FINALIZER)
                    || match finalizer::set(
                        &grants_api,
                        &name,
                        None,
                        &manager,
                        REVOKE_FINALIZER,
                        true,
                    )
                    .await
                    {
                        Ok(()) => {
                            writes.bookkeeping_done();
                            true
                        }
                        Err(e) => {
                            outcome.blocked = Some(Blocked {
                                reason: plan::ISSUE_FAILED,
                                message: format!(
                                    "adding finalizer {REVOKE_FINALIZER}: {}",
                                    scrub(&e.to_string())
                                ),
                            });
                            false
                        }
                    };
                if fin_ok {
                    match apply::issue(
                        &ctx.client,
                        &manager,
                        owner,
                        &p,
                        issued.sa_uid.as_deref(),
                        &cfg,
                        &mut writes,
                    )
                    .await
                    {
                        Ok(a) => {
                            if let Some(t) = a.issued_until {
                                summary.count("tokensIssued", 1);
                                outcome.expires_at = Some(t);
                            }
                        }
                        Err(b) => {
                            summary.count("blocked", 1);
                            outcome.blocked = Some(b);
                        }
                    }
                }
            }
        }
        if let Some(st) = record::grant_status(
            g.status.as_ref(),
            &ns,
            &name,
            &outcome,
            g.metadata.generation,
            cfg.now,
        ) && writes.will("apply-status", format!("Grant {name}"), "")
        {
            match crate::pass::status::apply_status(
                &grants_api,
                &name,
                &manager,
                apply::status_body(&st),
                None,
            )
            .await
            {
                Ok(_) => writes.bookkeeping_done(),
                Err(e) => {
                    tracing::warn!(grant = %name, error = %scrub(&e.to_string()), "Grant status not written")
                }
            }
        }
    }

    // Issued objects whose Grant is gone without revocation (finalizer removed by hand).
    if stopped.is_none() && args.selector.is_none() {
        for (name, issued) in &obs.issued {
            if live.contains(name) || !crate::pass::shard::owns(ctx.args.shard, name) {
                continue;
            }
            let kinds = plan::revoke(issued);
            if kinds.is_empty() && issued.secret.is_none() && issued.leases.is_empty() {
                continue;
            }
            summary.count("orphansRevoked", 1);
            let leases: Vec<String> = issued.leases.iter().map(|h| h.name.clone()).collect();
            if let Err(e) = apply::revoke(
                &ctx.client,
                name,
                &ns,
                (&kinds, &leases),
                issued.secret.is_some(),
                &mut writes,
            )
            .await
            {
                tracing::warn!(grant = %name, error = %e, "revoking what a deleted Grant left");
            }
        }
    }

    let stopped = stopped.map(|why| crate::pass::Stopped {
        message: format!("stopped early ({why}); the next run continues"),
        resume_after: None,
    });
    summary.finish(writes, stopped);
    Ok(summary)
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
            eprintln!("kbind issue --print-kubeconfig: {e}");
            e.exit_code()
        }
    }
}

async fn read_kubeconfig(common: &CommonArgs, grant: &str) -> Result<String, PassError> {
    let config = own_config(common).await?;
    let client = counted_client(config, Arc::new(RequestCounter::default()))
        .map_err(|e| PassError::kube("building the Kubernetes client", &e))?;
    let g = Api::<Grant>::all(client.clone())
        .get_opt(grant)
        .await
        .map_err(|e| PassError::kube(format!("reading Grant {grant}"), &e))?
        .ok_or_else(|| PassError::Config(format!("Grant {grant} not found")))?;
    let r = g.status.and_then(|s| s.secret_ref).ok_or_else(|| {
        PassError::Config(format!(
            "Grant {grant} has no issued kubeconfig yet (status.secretRef): run kbind issue"
        ))
    })?;
    let s = crate::secrets::read(&client, &r.namespace, &r.name)
        .await
        .map_err(|e| PassError::Unreachable {
            what: format!("reading Secret {}/{}", r.namespace, r.name),
            message: scrub(&e.to_string()),
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
