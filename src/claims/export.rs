//! `kbind claims export <entry>`: the APIExport side of a provider's claims, rendered by the
//! same grouping that computes its tenants' bindings, so the export lists exactly what bindings
//! carry. Read-only; prints YAML for `kubectl apply --server-side`.

use std::sync::Arc;

use kube::Api;
use serde_json::json;

use crate::api::providers::CatalogEntry;
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::{CommonArgs, PassError};

use super::hub::{self, Hub};
use super::{HubArgs, policy};

/// Render and print; returns the exit code.
pub async fn run(common: CommonArgs, entry: String, args: HubArgs) -> i32 {
    crate::install_crypto_provider();
    match render(&common, &entry, &args).await {
        Ok(yaml) => {
            print!("{yaml}");
            0
        }
        Err(e) => {
            crate::logging::print_error("claims export", &e);
            e.exit_code()
        }
    }
}

async fn render(common: &CommonArgs, entry: &str, args: &HubArgs) -> Result<String, PassError> {
    let config = own_config(common).await?;
    let counter = Arc::new(RequestCounter::default());
    let client = counted_client(config.clone(), counter.clone())
        .map_err(|e| PassError::kube("building the Kubernetes client", e))?;
    let hub = if args.single_cluster {
        Hub::Single {
            client: client.clone(),
            cluster_name: args.cluster_name.clone(),
        }
    } else {
        let mut root = config;
        root.cluster_url = hub::server_root(&root.cluster_url).map_err(bad)?;
        Hub::Kcp {
            root: counted_client(root, counter)
                .map_err(|e| PassError::kube("building a kcp client", e))?,
            endpoints: Vec::new(),
        }
    };
    let entries: Api<CatalogEntry> = Api::all(client);
    let get_entry = |name: String| {
        let entries = entries.clone();
        async move {
            entries
                .get_opt(&name)
                .await
                .map_err(|e| PassError::kube(format!("reading CatalogEntry {name}"), e))?
                .ok_or_else(|| PassError::Config(format!("CatalogEntry {name} not found")))
        }
    };
    let own = get_entry(entry.to_string()).await?;

    // identityHash of each provider's export, read once; compositions name other providers.
    let mut names = vec![entry.to_string()];
    for r in &own.spec.requires {
        if let Some(p) = r.provider.as_ref().filter(|p| !p.is_empty()) {
            names.push(p.clone());
        }
    }
    let mut identities = std::collections::BTreeMap::new();
    for name in names {
        if identities.contains_key(&name) {
            continue;
        }
        let e = if name == entry {
            own.clone()
        } else {
            get_entry(name.clone()).await?
        };
        let id = match hub
            .get_export(&e.spec.export.path, &e.spec.export.name)
            .await
            .map_err(bad)?
        {
            Some(x) => x.status.map(|s| s.identity_hash).unwrap_or_default(),
            None => String::new(),
        };
        identities.insert(name, id);
    }
    let claims = policy::export_claims(entry, &own.spec.requires, |p| {
        match identities.get(p).filter(|id| !id.is_empty()) {
            Some(id) => Ok(id.clone()),
            None => Err(PassError::Config(format!(
                "the APIExport of provider {p} has no identityHash yet (is it created, and does CatalogEntry {p} name it?)"
            ))),
        }
    })?;
    let doc = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIExport",
        "metadata": { "name": own.spec.export.name },
        "spec": { "permissionClaims": claims },
    });
    serde_saphyr::to_string(&doc).map_err(|e| PassError::invalid("rendering YAML", e))
}

fn bad(e: hub::HubError) -> PassError {
    PassError::unreachable("kcp", e)
}
