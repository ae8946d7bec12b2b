//! Where `kbind claims` reads and writes APIBindings and APIExports.
//!
//! On kcp, bindings are read across workspaces through the core export's virtual workspace (one
//! URL per shard, from its APIExportEndpointSlice) and each write goes to the binding's own
//! workspace (`/clusters/<logical cluster>/…`) with the hub's credential and a resourceVersion
//! precondition. In single-cluster mode (a plain API server with kbind's kcp CRDs) there is no
//! `/clusters` prefix and a binding's workspace is its `kcp.io/cluster` annotation.

use std::collections::BTreeMap;

use kube::api::{ListParams, ObjectList, Patch, PatchParams};
use kube::core::Request;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::kcp::{
    APIBinding, APIExport, APIExportEndpointSlice, AcceptablePermissionClaim, ExportReference,
};
use crate::pass::StatusCode;
use crate::pass::list::PAGE;

use super::merge::PLACEHOLDERS;

/// kcp's annotation naming an object's logical cluster.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

const BINDINGS: &str = "apis/apis.kcp.io/v1alpha2/apibindings";
const EXPORTS: &str = "apis/apis.kcp.io/v1alpha2/apiexports";
const SLICES: &str = "apis/apis.kcp.io/v1alpha1/apiexportendpointslices";

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("building a request for {what}: {source}")]
    Request {
        what: String,
        #[source]
        source: kube::core::request::Error,
    },
    #[error("APIExportEndpointSlice {slice} not found in {path}")]
    NoSlice { slice: String, path: String },
    #[error("endpoint URL {url} is not a valid URL")]
    BadEndpoint { url: String },
}

impl HubError {
    pub fn kube_source(&self) -> Option<&kube::Error> {
        match self {
            Self::Kube { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A binding as claims sees it: enough to plan and to write with a precondition.
#[derive(Clone, Debug)]
pub struct SlimBinding {
    pub name: String,
    /// Logical cluster (workspace) of the binding.
    pub cluster: String,
    pub resource_version: String,
    pub export: ExportReference,
    pub claims: Vec<AcceptablePermissionClaim>,
    pub placeholders: Option<String>,
}

impl SlimBinding {
    fn from_binding(b: APIBinding, default_cluster: &str) -> Self {
        let cluster = b
            .annotations()
            .get(CLUSTER_ANNOTATION)
            .cloned()
            .unwrap_or_else(|| default_cluster.to_string());
        Self {
            name: b.name_any(),
            resource_version: b.resource_version().unwrap_or_default(),
            placeholders: b.annotations().get(PLACEHOLDERS).cloned(),
            cluster,
            export: b.spec.reference.export,
            claims: b.spec.permission_claims,
        }
    }

    /// `<cluster>|<name>`: the order bindings are handled in and the CatalogEntry cursor.
    pub fn key(&self) -> String {
        format!("{}|{}", self.cluster, self.name)
    }
}

/// The topology: kcp (workspaces + virtual workspace) or one plain cluster.
pub enum Hub {
    Kcp {
        /// The server root (the kubeconfig URL without its `/clusters/…` part).
        root: Client,
        /// One client per virtual-workspace endpoint (one per shard).
        endpoints: Vec<Client>,
    },
    Single {
        client: Client,
        /// Workspace name for bindings without a `kcp.io/cluster` annotation.
        cluster_name: String,
    },
}

impl Hub {
    fn prefix(&self, cluster: &str) -> String {
        match self {
            Hub::Kcp { .. } => format!("/clusters/{cluster}/"),
            Hub::Single { .. } => "/".into(),
        }
    }

    fn write_client(&self) -> &Client {
        match self {
            Hub::Kcp { root, .. } => root,
            Hub::Single { client, .. } => client,
        }
    }

    /// Object `name` of `collection` (e.g. `apis/core.kcp.io/v1alpha1/logicalclusters`) in
    /// workspace `workspace` (a logical cluster name or a path), as JSON; `None` when it does
    /// not exist, and always on a single cluster (no workspaces there).
    pub async fn get_in_workspace(
        &self,
        workspace: &str,
        collection: &str,
        name: &str,
        what: &str,
    ) -> Result<Option<serde_json::Value>, HubError> {
        match self {
            Hub::Kcp { root, .. } => {
                get_opt(
                    root,
                    &format!("/clusters/{workspace}/{collection}"),
                    name,
                    what,
                )
                .await
            }
            Hub::Single { .. } => Ok(None),
        }
    }

    /// Every APIBinding visible to the hub, deduplicated by (cluster, name), in pages.
    pub async fn list_bindings(&self) -> Result<Vec<SlimBinding>, HubError> {
        let mut out: BTreeMap<String, SlimBinding> = BTreeMap::new();
        let (clients, path, default_cluster): (Vec<&Client>, String, &str) = match self {
            Hub::Kcp { endpoints, .. } => (
                endpoints.iter().collect(),
                format!("/clusters/*/{BINDINGS}"),
                "",
            ),
            Hub::Single {
                client,
                cluster_name,
            } => (vec![client], format!("/{BINDINGS}"), cluster_name.as_str()),
        };
        for client in clients {
            let mut lp = ListParams::default().limit(PAGE);
            let mut pages = 0usize;
            loop {
                // A hub handing out a continue token on every page must not hold the pass
                // until its deadline (docs/hostile-inputs.md).
                pages += 1;
                if pages > crate::pass::list::MAX_PAGES {
                    return Err(HubError::Kube {
                        what: "listing APIBindings".into(),
                        source: crate::pass::list::too_many_pages(),
                    });
                }
                let req = Request::new(&path)
                    .list(&lp)
                    .map_err(|source| HubError::Request {
                        what: "listing APIBindings".into(),
                        source,
                    })?;
                let page: ObjectList<APIBinding> =
                    client.request(req).await.map_err(|source| HubError::Kube {
                        what: "listing APIBindings".into(),
                        source,
                    })?;
                for b in page.items {
                    let slim = SlimBinding::from_binding(b, default_cluster);
                    out.insert(slim.key(), slim);
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
        }
        Ok(out.into_values().collect())
    }

    /// The APIExport `name` in workspace `path`; `None` when it does not exist.
    pub async fn get_export(&self, path: &str, name: &str) -> Result<Option<APIExport>, HubError> {
        let what = format!("reading APIExport {name} in {}", display_path(path));
        let url = format!("{}{EXPORTS}", self.prefix(path));
        get_opt(self.write_client(), &url, name, &what).await
    }

    /// One binding, read from its own workspace (after a conflicting write); `None` if gone.
    pub async fn get_binding(
        &self,
        cluster: &str,
        name: &str,
    ) -> Result<Option<SlimBinding>, HubError> {
        let what = format!("reading APIBinding {name} in workspace {cluster}");
        let url = format!("{}{BINDINGS}", self.prefix(cluster));
        let default_cluster = match self {
            Hub::Kcp { .. } => cluster,
            Hub::Single { cluster_name, .. } => cluster_name.as_str(),
        };
        Ok(
            get_opt::<APIBinding>(self.write_client(), &url, name, &what)
                .await?
                .map(|b| SlimBinding::from_binding(b, default_cluster)),
        )
    }

    /// Replace the binding's claims (a JSON merge patch replaces the whole list) and its
    /// placeholder annotation, only if it is still at `resource_version`.
    pub async fn write_claims(
        &self,
        binding: &SlimBinding,
        claims: &[AcceptablePermissionClaim],
        placeholders: Option<&str>,
        field_manager: &str,
    ) -> Result<(), HubError> {
        let what = format!(
            "writing claims of APIBinding {} in workspace {}",
            binding.name, binding.cluster
        );
        let body = json!({
            "metadata": {
                "resourceVersion": binding.resource_version,
                "annotations": { PLACEHOLDERS: placeholders },
            },
            "spec": { "permissionClaims": claims },
        });
        let pp = PatchParams {
            field_manager: Some(field_manager.to_string()),
            ..Default::default()
        };
        let url = format!("{}{BINDINGS}", self.prefix(&binding.cluster));
        let req = Request::new(url)
            .patch(&binding.name, &pp, &Patch::Merge(&body))
            .map_err(|source| HubError::Request {
                what: what.clone(),
                source,
            })?;
        self.write_client()
            .request::<APIBinding>(req)
            .await
            .map(|_| ())
            .map_err(|source| HubError::Kube { what, source })
    }
}

/// The virtual-workspace URLs of the core export (one per shard serving a binding of it; none
/// before the first binding).
pub async fn endpoint_urls(
    root: &Client,
    path: &str,
    slice: &str,
) -> Result<Vec<String>, HubError> {
    let what = format!("reading APIExportEndpointSlice {slice} in {path}");
    let url = format!("/clusters/{path}/{SLICES}");
    let Some(s) = get_opt::<APIExportEndpointSlice>(root, &url, slice, &what).await? else {
        return Err(HubError::NoSlice {
            slice: slice.into(),
            path: path.into(),
        });
    };
    let urls: Vec<String> = s
        .status
        .map(|st| st.endpoints.into_iter().map(|e| e.url).collect())
        .unwrap_or_default();
    if urls.is_empty() {
        // kcp lists a shard's virtual workspace only once a workspace on it binds the export:
        // before the first tenant binds the core export there is simply nothing in scope.
        tracing::info!(
            slice,
            path,
            "no workspace has bound the core export yet (its APIExportEndpointSlice lists no endpoints)"
        );
    }
    Ok(urls)
}

/// The server root of a kcp URL: everything before `/clusters/`.
pub fn server_root(url: &http::Uri) -> Result<http::Uri, HubError> {
    let text = url.to_string();
    let root = match text.find("/clusters/") {
        Some(i) => &text[..i],
        None => text.trim_end_matches('/'),
    };
    root.parse()
        .map_err(|_| HubError::BadEndpoint { url: text })
}

fn display_path(path: &str) -> &str {
    if path.is_empty() { "the hub" } else { path }
}

async fn get_opt<K: serde::de::DeserializeOwned>(
    client: &Client,
    collection: &str,
    name: &str,
    what: &str,
) -> Result<Option<K>, HubError> {
    let req = Request::new(collection)
        .get(name, &Default::default())
        .map_err(|source| HubError::Request {
            what: what.into(),
            source,
        })?;
    match client.request::<K>(req).await {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(source) => Err(HubError::Kube {
            what: what.into(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_root_strips_the_workspace_part() {
        let cases = [
            (
                "https://kcp.example:6443/clusters/root:hub",
                "https://kcp.example:6443",
            ),
            ("https://kcp.example:6443/", "https://kcp.example:6443"),
            ("https://proxy/kcp/clusters/root", "https://proxy/kcp"),
        ];
        for (url, want) in cases {
            let got = server_root(&url.parse().unwrap()).unwrap();
            assert_eq!(got.to_string().trim_end_matches('/'), want, "{url}");
        }
    }

    /// A hub handing out a continue token on every APIBinding page is cut off at the shared
    /// page cap (docs/hostile-inputs.md), with an error naming it, instead of holding the pass.
    #[tokio::test]
    async fn endless_apibinding_pages_stop_at_the_page_cap() {
        use http::{Request, Response};
        use kube::client::Body;
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut served = 0usize;
            while let Some((_, send)) = handle.next_request().await {
                served += 1;
                let page = serde_json::json!({"apiVersion": "apis.kcp.io/v1alpha2",
                    "kind": "APIBindingList",
                    "metadata": {"continue": format!("page-{served}")}, "items": []});
                send.send_response(Response::new(Body::from(page.to_string().into_bytes())));
            }
            served
        });
        let hub = Hub::Single {
            client: Client::new(mock, "default"),
            cluster_name: "hub".into(),
        };
        // Without the cap the listing never ends: fail instead of hanging.
        let listed = tokio::time::timeout(std::time::Duration::from_secs(120), hub.list_bindings());
        let err = listed.await.expect("listing never stopped").unwrap_err();
        assert!(err.to_string().contains("more than 10000 pages"), "{err}");
        drop(hub);
        assert_eq!(server.await.unwrap(), crate::pass::list::MAX_PAGES);
    }
}
