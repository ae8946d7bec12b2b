//! A full sweep of `kbind issue` (docs/issue.md): observe every Grant, the catalog and what is
//! issued; per Grant revoke, or plan and issue, then record its status; revoke what Grants
//! removed by hand left.

use std::collections::{BTreeMap, BTreeSet};

use kube::{Api, ResourceExt};
use serde_json::Value;

use crate::api::catalog::Export;
use crate::api::iam::{Grant, REVOKE_FINALIZER};
use crate::pass::budget::Exhausted;
use crate::pass::walk::{Items, Look, Phase, Roots, TurnError, Walk};
use crate::pass::{PassError, finalizer};

use super::plan::{self, Blocked, Pin, Token};
use super::record::{self, GrantOutcome};
use super::{Run, apply, args, observe, render};

/// What a full sweep leaves the rest of the run.
pub(super) struct Swept {
    /// The Grants of this shard waiting for their first heartbeat (the pin window's).
    pub awaiting: Vec<Grant>,
    /// Why it stopped before the last Grant.
    pub stopped: Option<Exhausted>,
}

/// One sweep's walk over the Grants (src/pass/walk.rs): a live Grant is worked on, a deleted
/// one holding the revoke finalizer is revoked.
struct Grants<'s, 'a> {
    run: &'s mut Run<'a>,
    obs: &'s observe::Observed,
    pinned: BTreeMap<String, String>,
    /// The Grants waiting for their first heartbeat (the pin window's).
    awaiting: Vec<Grant>,
}

/// The observed Grant named `name`.
fn grant<'o>(obs: &'o observe::Observed, name: &str) -> Option<&'o Grant> {
    obs.grants.iter().find(|g| g.name_any() == name)
}

impl Roots for Grants<'_, '_> {
    type Error = std::convert::Infallible;

    fn look(&mut self, name: &str) -> Look {
        let Some(g) = grant(self.obs, name) else {
            return Look::Absent;
        };
        Look::Due {
            generation: g.metadata.generation.unwrap_or(0),
            phase: Phase::of(
                g.metadata.deletion_timestamp.is_some(),
                finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER),
            ),
        }
    }

    async fn apply(&mut self, name: &str) -> Result<(), TurnError<Self::Error>> {
        let obs = self.obs;
        let Some(g) = grant(obs, name) else {
            return Ok(());
        };
        let empty = plan::Issued::default();
        let issued = obs.issued.get(name).unwrap_or(&empty);
        let waiting = self.run.work(g, issued, obs, &mut self.pinned).await?;
        if plan::sweep::follows_after_sweep(g, waiting, self.run.cfg.now) {
            self.awaiting.push(g.clone());
        }
        Ok(())
    }

    async fn cleanup(&mut self, name: &str) -> Result<(), TurnError<Self::Error>> {
        let empty = plan::Issued::default();
        let issued = self.obs.issued.get(name).unwrap_or(&empty);
        self.run.revoke(name, issued).await;
        Ok(())
    }
}

impl Run<'_> {
    /// Every Grant of this shard (and `--selector`): issue, repair, re-issue, narrow, revoke.
    pub(super) async fn full_sweep(&mut self) -> Result<Swept, PassError> {
        self.cfg.now = k8s_openapi::jiff::Timestamp::now();
        if self.cfg.confinement == args::Confinement::Shipped {
            self.confinement_in_force().await?;
        }
        let obs = observe::observe(
            &self.ctx.client,
            &self.cfg.namespace,
            self.args.selector.as_deref(),
            self.cfg.confinement,
        )
        .await
        .map_err(|e| PassError::unreachable("observing Grants", e))?;
        // Counts of state, not of events: a later sweep of the same run says them again.
        self.summary.counts.remove("blocked");
        self.summary
            .counts
            .insert("grants".into(), obs.grants.len() as i64);
        // Exports first: their status says which APIs are missing.
        self.export_statuses(&obs).await;

        // In name order from the first every sweep, never resumed elsewhere: the first Grant
        // to pin a consumer cluster holds it. The Grants take the budget per write.
        let walk = Walk::new(
            "Grant",
            obs.grants.iter().map(ResourceExt::name_any),
            self.ctx.args.shard,
            None,
        )
        .items(Items::PerWrite);
        let (budget, poison) = (self.ctx.budget.clone(), self.ctx.poison.clone());
        let mut grants = Grants {
            // Consumer clusters already pinned (by any Grant, selected or not), so no two
            // Grants hold one.
            pinned: obs.pinned.clone(),
            run: self,
            obs: &obs,
            awaiting: Vec::new(),
        };
        let stopped = walk.run(&budget, &poison, &mut grants).await.stopped;
        let awaiting = grants.awaiting;
        if stopped.is_none() && self.args.selector.is_none() {
            let live: BTreeSet<String> = obs.grants.iter().map(ResourceExt::name_any).collect();
            self.orphans(&obs.issued, &live).await;
        }
        Ok(Swept { awaiting, stopped })
    }

    /// Nothing is issued that would write unconfined (docs/issue.md "Confinement").
    async fn confinement_in_force(&self) -> Result<(), PassError> {
        let gaps = observe::confinement_gaps(&self.ctx.client)
            .await
            .map_err(|e| {
                PassError::unreachable(
                    "reading the admission policies confining issued identities",
                    e,
                )
            })?;
        if gaps.is_empty() {
            return Ok(());
        }
        Err(PassError::Config(format!(
            "the admission policies confining issued identities are not in force ({}): \
             install them as shipped (deploy/provider, or the chart with \
             passes.issue.enabled), or on kcp run with --confinement per-grant; until then \
             kbind issue writes nothing (docs/issue.md \"Confinement\")",
            gaps.join("; ")
        )))
    }

    /// Each Export's status (of this shard; with `--selector`, only those the selected Grants
    /// name).
    async fn export_statuses(&mut self, obs: &observe::Observed) {
        let exports_api: Api<Export> = Api::all(self.ctx.client.clone());
        let named: Option<BTreeSet<String>> = self.args.selector.as_ref().map(|_| {
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
            let name = e.name_any();
            if !crate::pass::shard::owns(self.ctx.args.shard, &name)
                || named.as_ref().is_some_and(|n| !n.contains(&name))
            {
                continue;
            }
            let Some(st) = record::export_status(
                e.status.as_ref(),
                &e.spec,
                &obs.catalog,
                e.metadata.generation,
                self.cfg.now,
            ) else {
                continue;
            };
            self.write_status(&exports_api, "Export", &name, apply::status_body(&st))
                .await;
        }
    }

    /// A deleted Grant: everything issued for it goes, then its finalizer.
    async fn revoke(&mut self, name: &str, issued: &plan::Issued) {
        self.summary.count("revoked", 1);
        let kinds = plan::revoke(issued);
        let _ = self.ctx.budget.take();
        let leases: Vec<String> = issued.leases.iter().map(|h| h.name.clone()).collect();
        if let Err(e) = apply::revoke(
            &self.ctx.client,
            name,
            &self.cfg.namespace,
            (&kinds, &leases),
            issued.secret.is_some(),
            &mut self.writes,
        )
        .await
        {
            tracing::warn!(grant = %name, error = %e, "revocation unfinished; the next run continues");
            return;
        }
        if !self.writes.will(
            "release-finalizer",
            format!("Grant {name}"),
            REVOKE_FINALIZER,
        ) {
            return;
        }
        let grants: Api<Grant> = Api::all(self.ctx.client.clone());
        match finalizer::set(&grants, name, None, &self.manager, REVOKE_FINALIZER, false).await {
            Ok(()) => self.writes.bookkeeping_done(),
            Err(e) => {
                tracing::warn!(grant = %name, error = %e, "finalizer not released")
            }
        }
    }

    /// A live Grant: plan it, issue (or narrow what a blocked one holds), record its status.
    /// `Ok(true)`: it is issued and waits for its first heartbeat; `Err`: the budget ran out
    /// before its writes.
    async fn work(
        &mut self,
        g: &Grant,
        issued: &plan::Issued,
        obs: &observe::Observed,
        pinned: &mut BTreeMap<String, String>,
    ) -> Result<bool, Exhausted> {
        let name = g.name_any();
        let recorded = g.status.as_ref().and_then(|s| s.consumer_cluster.clone());
        let others: BTreeMap<String, String> = pinned
            .iter()
            .filter(|(_, by)| **by != name)
            .map(|(u, b)| (u.clone(), b.clone()))
            .collect();
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
        let provider = plan::Provider {
            catalog: &obs.catalog,
            tenancy: &obs.tenancy,
            namespaces: &obs.namespaces,
            in_use: &obs.in_use,
            handover: &obs.handover,
            cfg: &self.cfg,
        };
        let planned = plan::plan_grant(
            owner,
            &g.spec,
            recorded.as_deref(),
            approved,
            issued,
            &others,
            &provider,
        );
        let mut outcome = GrantOutcome::default();
        match planned {
            Err(b) => {
                self.summary.count("blocked", 1);
                let r = if plan::is_isolation(b.reason) {
                    plan::reduce(owner, &g.spec, issued, &provider)
                } else {
                    plan::Reduction::default()
                };
                if r != plan::Reduction::default() {
                    self.ctx.budget.take()?;
                    if let Err(e) = apply::reduce(
                        &self.ctx.client,
                        &self.manager,
                        &name,
                        &self.cfg.namespace,
                        &r,
                        &mut self.writes,
                    )
                    .await
                    {
                        tracing::warn!(grant = %name, error = %e.message, "RBAC of a Grant that is not Ready not reduced; the next run tries again");
                    }
                }
                outcome.blocked = Some(b);
            }
            Ok(p) => {
                if let Pin::Pinned { uid, new: true } = &p.pin {
                    pinned.insert(uid.clone(), name.clone());
                }
                self.issue(g, owner, issued, &p, &mut outcome).await?;
            }
        }
        self.record(g, &outcome).await;
        Ok(outcome.blocked.is_none() && matches!(outcome.pin, Some(Pin::Waiting)))
    }

    /// An issuable Grant: its finalizer first, then what it gets (docs/issue.md "What a Grant
    /// gets"). `Err`: the budget ran out before its writes.
    async fn issue(
        &mut self,
        g: &Grant,
        owner: render::GrantRef<'_>,
        issued: &plan::Issued,
        p: &plan::GrantPlan,
        outcome: &mut GrantOutcome,
    ) -> Result<(), Exhausted> {
        outcome.apis = Some(p.resolved.apis.iter().map(|a| a.name.clone()).collect());
        outcome.pin = Some(p.pin.clone());
        outcome.shared = Some(p.shared.clone());
        if let Token::Keep { expires_at } = &p.token {
            outcome.expires_at = Some(*expires_at);
        }
        let has_fin = finalizer::has(g.metadata.finalizers.as_ref(), REVOKE_FINALIZER);
        let busy = !p.writes.is_empty() || matches!(p.token, Token::Issue { .. }) || !has_fin;
        if busy {
            self.ctx.budget.take()?;
        }
        let name = owner.name;
        if !has_fin
            && self
                .writes
                .will("add-finalizer", format!("Grant {name}"), REVOKE_FINALIZER)
        {
            let grants: Api<Grant> = Api::all(self.ctx.client.clone());
            match finalizer::set(&grants, name, None, &self.manager, REVOKE_FINALIZER, true).await {
                Ok(()) => self.writes.bookkeeping_done(),
                Err(e) => {
                    outcome.blocked = Some(Blocked {
                        reason: plan::ISSUE_FAILED,
                        message: format!("adding finalizer {REVOKE_FINALIZER}: {}", e),
                    });
                    return Ok(());
                }
            }
        }
        match apply::issue(
            &self.ctx.client,
            &self.manager,
            owner,
            p,
            issued.sa_uid.as_deref(),
            &self.cfg,
            &mut self.writes,
        )
        .await
        {
            Ok(a) => {
                if let Some(t) = a.issued_until {
                    self.summary.count("tokensIssued", 1);
                    outcome.expires_at = Some(t);
                }
            }
            Err(b) => {
                self.summary.count("blocked", 1);
                outcome.blocked = Some(b);
            }
        }
        Ok(())
    }

    /// The Grant's status, when it differs from what is recorded.
    async fn record(&mut self, g: &Grant, outcome: &GrantOutcome) {
        let name = g.name_any();
        let Some(st) = record::grant_status(
            g.status.as_ref(),
            &self.cfg.namespace,
            &name,
            outcome,
            g.metadata.generation,
            self.cfg.now,
        ) else {
            return;
        };
        let grants: Api<Grant> = Api::all(self.ctx.client.clone());
        self.write_status(&grants, "Grant", &name, apply::status_body(&st))
            .await;
    }

    /// A status write (`kind` names it in the summary's plan and the log); a failure is
    /// logged, and the next run writes it again.
    async fn write_status<K>(&mut self, api: &Api<K>, kind: &str, name: &str, body: Value)
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        if !self
            .writes
            .will("apply-status", format!("{kind} {name}"), "")
        {
            return;
        }
        match crate::pass::status::apply_status(api, name, &self.manager, body, None).await {
            Ok(_) => self.writes.bookkeeping_done(),
            Err(e) => {
                tracing::warn!(kind = %kind, name = %name, error = %e, "status not written")
            }
        }
    }

    /// Issued objects whose Grant is gone without revocation (finalizer removed by hand).
    async fn orphans(&mut self, issued: &BTreeMap<String, plan::Issued>, live: &BTreeSet<String>) {
        for (name, issued) in issued {
            if live.contains(name) || !crate::pass::shard::owns(self.ctx.args.shard, name) {
                continue;
            }
            let kinds = plan::revoke(issued);
            if kinds.is_empty() && issued.secret.is_none() && issued.leases.is_empty() {
                continue;
            }
            self.summary.count("orphansRevoked", 1);
            let leases: Vec<String> = issued.leases.iter().map(|h| h.name.clone()).collect();
            if let Err(e) = apply::revoke(
                &self.ctx.client,
                name,
                &self.cfg.namespace,
                (&kinds, &leases),
                issued.secret.is_some(),
                &mut self.writes,
            )
            .await
            {
                tracing::warn!(grant = %name, error = %e, "revoking what a deleted Grant left");
            }
        }
    }
}
