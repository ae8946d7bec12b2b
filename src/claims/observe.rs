//! Observe: what a claims run reads before it writes anything — the hub topology, the
//! catalog (this shard's share, and which entries are duplicates), the Grants, the core export
//! and its identity; and the list again after core bindings opened workspaces.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::args::{self, HubArgs};
use super::hub::{self, Hub, SlimBinding};
use super::policy::{self, Consent};
use super::{GrantKey, display_export, unreachable};
use crate::api::kcp::APIExport;
use crate::api::providers::{CatalogEntry, ExportRef, Grant};
use crate::pass::client::{counted_client, own_config};
use crate::pass::{PassContext, PassError, list, shard};

/// This shard's CatalogEntries (those the selector matches), sorted by name, and the
/// duplicates of the whole catalog: entry name -> the older entry naming the same export.
pub(super) async fn entries(
    ctx: &PassContext,
    selector: Option<&str>,
) -> Result<(Vec<CatalogEntry>, BTreeMap<String, String>), PassError> {
    let entries_api: Api<CatalogEntry> = Api::all(ctx.client.clone());
    // One CatalogEntry per export, decided over the whole catalog (not this shard's share or the
    // selector's), so every run and every shard agrees on the winner.
    let catalog = list::all(&entries_api, &ListParams::default())
        .await
        .map_err(|e| PassError::kube("listing CatalogEntries", e))?;
    let losers = policy::duplicate_entries(catalog.iter().map(|e| {
        (
            &e.spec.export,
            e.metadata.creation_timestamp.as_ref().map(|t| t.0),
            e.metadata.name.as_deref().unwrap_or_default(),
        )
    }));
    let mut entries = match selector {
        None => catalog.clone(),
        Some(sel) => list::all(&entries_api, &ListParams::default().labels(sel))
            .await
            .map_err(|e| PassError::kube("listing CatalogEntries", e))?,
    };
    // This shard's share: the bindings kcp maintains are looked up for it alone (the walk
    // over it, src/pass/walk.rs, takes the same share).
    entries.retain(|e| shard::owns(ctx.args.shard, &e.name_any()));
    entries.sort_by_key(|e| e.name_any());
    Ok((entries, losers))
}

/// The core APIExport, when one is configured. Every shard reads it: its identity is one a
/// provider's own requirement may carry. Unreadable, the pass stops before any write.
pub(super) async fn core_export(
    hub: &Hub,
    core: Option<&args::Core>,
) -> Result<Option<APIExport>, PassError> {
    let Some(core) = core else {
        return Ok(None);
    };
    let export = hub
        .get_export(&core.path, &core.export)
        .await
        .map_err(unreachable)?
        .ok_or_else(|| {
            PassError::Config(format!(
                "core APIExport {} not found in {} (check --core-export and --core-export-path)",
                core.export,
                if core.path.is_empty() {
                    "the hub"
                } else {
                    &core.path
                }
            ))
        })?;
    Ok(Some(export))
}

/// The core export's identity as this run read it.
pub(super) enum CoreIdentity {
    /// No core export configured (single-cluster mode without the core flags).
    NotConfigured,
    /// Configured, but its `status.identityHash` is empty: the message says which export.
    Unknown(String),
    Known(String),
}

impl CoreIdentity {
    pub(super) fn read(core: &args::Core, export: &crate::api::kcp::APIExport) -> Self {
        match export.status.as_ref().map(|s| s.identity_hash.as_str()) {
            Some(h) if !h.is_empty() => Self::Known(h.to_string()),
            _ => Self::Unknown(display_export(&ExportRef {
                path: core.path.clone(),
                name: core.export.clone(),
            })),
        }
    }

    pub(super) fn known(&self) -> Option<String> {
        match self {
            Self::Known(h) => Some(h.clone()),
            _ => None,
        }
    }
}

/// Consent per (workspace, provider); `None` when no Grant store is configured.
pub(super) async fn grants(
    client: &Client,
    namespace: Option<&str>,
) -> Result<Option<BTreeMap<GrantKey, Consent>>, PassError> {
    let Some(ns) = namespace else {
        return Ok(None);
    };
    let api: Api<Grant> = Api::namespaced(client.clone(), ns);
    let grants = list::all(&api, &ListParams::default())
        .await
        .map_err(|e| PassError::kube(format!("listing Grants in {ns}"), e))?;
    let mut out: BTreeMap<GrantKey, Consent> = BTreeMap::new();
    for g in grants {
        out.entry((g.spec.workspace.clone(), g.spec.provider.clone()))
            .or_default()
            .extend(
                g.spec
                    .compositions
                    .into_iter()
                    .map(|c| (c.group, c.resource)),
            );
    }
    Ok(Some(out))
}

/// List again after core bindings accepted the apibindings claim. kcp labels a newly opened
/// workspace's bindings for the virtual workspace asynchronously and one by one (observed on kcp
/// v0.31: the list right after the write shows none, the next one some), so the list is
/// repeated a second apart until the opened workspaces' bindings are visible and their number
/// held still between two lists, at most five times and within the deadline. Whatever is still
/// hidden is reconciled by the next run.
pub(super) async fn relist_opened(
    hub: &Hub,
    core: &args::Core,
    opened: &BTreeSet<String>,
    ctx: &PassContext,
) -> Result<Vec<SlimBinding>, PassError> {
    let wait = std::time::Duration::from_secs(1);
    let mut previous = None;
    let mut tries = 0;
    loop {
        tries += 1;
        let bindings = hub.list_bindings().await.map_err(unreachable)?;
        let visible = bindings
            .iter()
            .filter(|b| opened.contains(&b.cluster) && !core.is_core_binding(b))
            .count();
        let settled = visible > 0 && previous == Some(visible);
        if settled || tries >= 5 || ctx.budget.remaining() <= wait {
            return Ok(bindings);
        }
        previous = Some(visible);
        tokio::time::sleep(wait).await;
    }
}

/// Build the hub topology from the job's kubeconfig.
pub(super) async fn connect(ctx: &PassContext, args: &HubArgs) -> Result<Hub, PassError> {
    if args.single_cluster {
        return Ok(Hub::Single {
            client: ctx.client.clone(),
            cluster_name: args.cluster_name.clone(),
        });
    }
    let core = args.core()?.ok_or_else(|| {
        PassError::Config(
            "kcp mode needs --core-export, --core-export-path and --core-binding (or pass --single-cluster)"
                .into(),
        )
    })?;
    if core.path.is_empty() {
        return Err(PassError::Config(
            "kcp mode needs --core-export-path (the workspace path of the core APIExport, e.g. root:hub)".into(),
        ));
    }
    let config = own_config(&ctx.args).await?;
    let root_url = hub::server_root(&config.cluster_url).map_err(unreachable)?;
    let client_for = |url: http::Uri| {
        let mut c = config.clone();
        c.cluster_url = url;
        counted_client(c, ctx.counter.clone())
            .map_err(|e| PassError::kube("building a kcp client", e))
    };
    let root = client_for(root_url)?;
    let slice = args.core_endpoint_slice.as_deref().unwrap_or(&core.export);
    let urls = hub::endpoint_urls(&root, &core.path, slice)
        .await
        .map_err(unreachable)?;
    let mut endpoints = Vec::with_capacity(urls.len());
    for url in urls {
        let uri: http::Uri = url.parse().map_err(|_| {
            PassError::Config(format!(
                "APIExportEndpointSlice {slice} lists an invalid URL {}",
                url
            ))
        })?;
        endpoints.push(client_for(uri)?);
    }
    Ok(Hub::Kcp { root, endpoints })
}
