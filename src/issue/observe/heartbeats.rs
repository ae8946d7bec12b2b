//! What a run between full sweeps and the pin window read: the Grants and the heartbeat
//! Leases (docs/issue.md "Full sweeps", "Pin window").

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use super::{labelled, listed};
use crate::api::iam::Grant;
use crate::issue::IssueError;
use crate::issue::plan::Heartbeat;
use crate::pass::list;

/// The heartbeat Leases in the grants namespace `ns`, per Grant label.
pub(super) async fn heartbeats(
    c: &Client,
    ns: &str,
) -> Result<BTreeMap<String, Vec<Heartbeat>>, IssueError> {
    let mut out: BTreeMap<String, Vec<Heartbeat>> = BTreeMap::new();
    for (g, l) in labelled(Api::<Lease>::namespaced(c.clone(), ns), "Leases", Some(ns)).await? {
        if let (Some(name), Some(created)) = (l.metadata.name, l.metadata.creation_timestamp) {
            let cluster = l
                .metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(crate::api::keys::CONSUMER_CLUSTER))
                .cloned();
            out.entry(g).or_default().push(Heartbeat {
                created: created.0,
                name,
                cluster,
            });
        }
    }
    Ok(out)
}

/// What a run between full sweeps reads ([`changed`]).
#[derive(Debug, Default)]
pub struct Changes {
    /// How many Grants there are.
    pub all: usize,
    /// Those of this shard a run can do something for, each with why
    /// ([`crate::issue::plan::sweep::changed`]).
    pub changed: BTreeMap<String, &'static str>,
    /// Those of this shard the pin window follows ([`crate::issue::plan::sweep::awaits_pin`]).
    pub awaiting: Vec<Grant>,
}

/// For a run between full sweeps: the Grants that need a run, and those waiting for their first
/// heartbeat. Two LISTs: the Grants, the heartbeats.
pub async fn changed(
    client: &Client,
    ns: &str,
    tokens: (Option<std::time::Duration>, Timestamp),
    owns: &dyn Fn(&str) -> bool,
) -> Result<Changes, IssueError> {
    let grants = list::all(&Api::<Grant>::all(client.clone()), &ListParams::default())
        .await
        .map_err(listed("Grants", None))?;
    let beats = heartbeats(client, ns).await?;
    let mut out = Changes {
        all: grants.len(),
        ..Changes::default()
    };
    for g in grants {
        // Another shard's Grant never makes this shard sweep.
        let Some(name) = g.metadata.name.clone().filter(|n| owns(n)) else {
            continue;
        };
        let mine = beats.get(&name).map(Vec::as_slice).unwrap_or_default();
        if let Some(why) = crate::issue::plan::sweep::changed(&g, mine, tokens) {
            out.changed.insert(name, why);
        } else if crate::issue::plan::sweep::awaits_pin(&g, mine, tokens.1) {
            out.awaiting.push(g);
        }
    }
    Ok(out)
}

/// For a look of the pin window: whether a heartbeat now names a UID for one of `awaiting`.
/// One LIST: the heartbeats.
pub async fn heartbeat_came(
    client: &Client,
    ns: &str,
    awaiting: &[Grant],
) -> Result<bool, IssueError> {
    let beats = heartbeats(client, ns).await?;
    Ok(awaiting.iter().any(|g| {
        let name = g.metadata.name.as_deref().unwrap_or_default();
        let mine = beats.get(name).map(Vec::as_slice).unwrap_or_default();
        crate::issue::plan::sweep::names_a_uid(g, mine)
    }))
}
