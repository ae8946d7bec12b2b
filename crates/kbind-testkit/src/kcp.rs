//! A kcp front for a plain kube-apiserver holding kbind's kcp CRDs, so `kbind claims` can run its
//! kcp code path (workspace URLs, the core export's virtual workspace) in tests and the demo.
//!
//! It emulates only what claims touches, following kcp's documented behaviour:
//! - `/clusters/<ws>/apis/<g>/<v>/<resource>[/<name>]` reaches `<ws>`'s cluster-scoped objects.
//!   A workspace's object `x` is stored upstream as `<ws>.x` (`:` in paths becomes `-`) with the
//!   annotation `kcp.io/cluster: <ws>`, and served back as `x`.
//! - `/services/apiexport/<path>/<export>/clusters/*/apis/apis.kcp.io/v1alpha2/apibindings` lists
//!   the bindings to that export in every workspace, plus every other binding in workspaces whose
//!   binding to the export accepted the `apis.kcp.io/apibindings` claim (what the real virtual
//!   workspace shows), paged with `limit`/`continue`.
//! - `/clusters/*/…` on the normal API is refused, as on a kcp front-proxy.
//!
//! Requests go upstream with the fake's own (admin) client: it does not emulate kcp's
//! authorization.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Running, serve};

pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";
const BINDINGS: &str = "apis/apis.kcp.io/v1alpha2/apibindings";

pub struct KcpState {
    upstream: kube::Client,
    /// The hub workspace: its requests for anything but kcp's own APIs pass straight through,
    /// so kbind's CatalogEntries, Grants, Leases and Events live upstream as they are.
    hub: String,
    /// Test knob: before forwarding the next PATCH of this upstream object, apply this merge
    /// patch to it first (a tenant's edit racing kbind's write).
    race: std::sync::Mutex<Option<(String, Value)>>,
}

impl KcpState {
    /// Make a tenant edit land between kbind's read and its write of workspace `ws`'s binding.
    pub fn race_next_patch(&self, ws: &str, binding: &str, tenant_patch: Value) {
        *super::lock(&self.race) = Some((upstream_name(ws, binding), tenant_patch));
    }
}

/// Start the front on 127.0.0.1:`port` (0 = any) in front of `upstream`, with `hub` as the
/// workspace the upstream cluster itself stands for.
pub async fn start(
    upstream: kube::Client,
    hub: &str,
    port: u16,
) -> std::io::Result<Running<KcpState>> {
    let state = Arc::new(KcpState {
        upstream,
        hub: hub.to_string(),
        race: std::sync::Mutex::new(None),
    });
    let router = Router::new().fallback(handle).with_state(state.clone());
    serve(router, state, port).await
}

/// The upstream name prefix of a workspace's objects.
pub fn prefix(ws: &str) -> String {
    format!("{}.", ws.replace(':', "-"))
}

/// The upstream name of `name` in workspace `ws`, for fixtures creating objects directly.
pub fn upstream_name(ws: &str, name: &str) -> String {
    format!("{}{name}", prefix(ws))
}

async fn handle(
    State(st): State<Arc<KcpState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    if let Some(rest) = path.strip_prefix("/services/apiexport/") {
        let mut parts = rest.splitn(3, '/');
        let (Some(ws), Some(export), Some(tail)) = (parts.next(), parts.next(), parts.next())
        else {
            return status(404, "NotFound", "no such virtual workspace path");
        };
        if tail != format!("clusters/*/{BINDINGS}") || method != Method::GET {
            return status(404, "NotFound", "this fake serves only the APIBinding list");
        }
        return virtual_list(&st, ws, export, query).await;
    }
    let Some(rest) = path.strip_prefix("/clusters/") else {
        return status(404, "NotFound", "use /clusters/<workspace>/…");
    };
    let Some((ws, tail)) = rest.split_once('/') else {
        return status(404, "NotFound", "no workspace path");
    };
    if ws == "*" {
        return status(
            403,
            "Forbidden",
            "wildcard requests need a shard, not the front-proxy",
        );
    }
    let kcp_api = tail.starts_with("apis/apis.kcp.io/") || tail.starts_with("apis/core.kcp.io/");
    if !kcp_api {
        if ws != st.hub {
            return status(
                404,
                "NotFound",
                "this fake serves only kcp APIs outside the hub",
            );
        }
        let up = if query.is_empty() {
            format!("/{tail}")
        } else {
            format!("/{tail}?{query}")
        };
        return forward(&st, method, up, &headers, body, None).await;
    }
    let seg: Vec<&str> = tail.split('/').collect();
    if seg.len() < 4 || seg[0] != "apis" {
        return status(
            404,
            "NotFound",
            "this fake serves only /apis/<g>/<v>/<resource>",
        );
    }
    let collection = format!("/apis/{}/{}/{}", seg[1], seg[2], seg[3]);
    let Some(name) = seg.get(4) else {
        if method != Method::GET {
            return status(405, "MethodNotAllowed", "collections are read-only here");
        }
        return workspace_list(&st, ws, &collection, query).await;
    };
    let mut up = format!("{collection}/{}", upstream_name(ws, name));
    for s in &seg[5..] {
        up.push('/');
        up.push_str(s);
    }
    if method == Method::PATCH {
        let raced = {
            let mut race = super::lock(&st.race);
            match race.as_ref() {
                Some((target, _)) if *target == upstream_name(ws, name) => race.take(),
                _ => None,
            }
        };
        if let Some((_, tenant)) = raced
            && let Ok(req) = http::Request::patch(&up)
                .header(header::CONTENT_TYPE, "application/merge-patch+json")
                .body(tenant.to_string().into_bytes())
        {
            let _ = st.upstream.request::<Value>(req).await;
        }
    }
    if !query.is_empty() {
        up = format!("{up}?{query}");
    }
    forward(&st, method, up, &headers, body, Some(ws)).await
}

/// Send the request upstream and relay the answer; `ws` strips its prefix from the object name.
async fn forward(
    st: &KcpState,
    method: Method,
    uri: String,
    headers: &HeaderMap,
    body: Bytes,
    ws: Option<&str>,
) -> Response {
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let Ok(req) = req.body(body.to_vec()) else {
        return status(400, "BadRequest", "malformed request");
    };
    match st.upstream.request::<Value>(req).await {
        Ok(mut obj) => {
            if let Some(ws) = ws {
                unprefix(&mut obj, ws);
            }
            json_response(200, &obj)
        }
        Err(e) => upstream_error(e),
    }
}

/// Every upstream object of the collection (paged upstream).
async fn list_all(st: &KcpState, collection: &str) -> Result<Vec<Value>, kube::Error> {
    let mut items = Vec::new();
    let mut cont = String::new();
    loop {
        let uri = if cont.is_empty() {
            format!("{collection}?limit=500")
        } else {
            format!("{collection}?limit=500&continue={cont}")
        };
        let req = http::Request::get(uri)
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let page: Value = st.upstream.request(req).await?;
        if let Some(list) = page["items"].as_array() {
            items.extend(list.iter().cloned());
        }
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_string(),
            _ => return Ok(items),
        }
    }
}

fn workspace_of(obj: &Value) -> Option<String> {
    obj["metadata"]["annotations"][CLUSTER_ANNOTATION]
        .as_str()
        .map(String::from)
}

async fn workspace_list(st: &KcpState, ws: &str, collection: &str, query: &str) -> Response {
    let items = match list_all(st, collection).await {
        Ok(i) => i,
        Err(e) => return upstream_error(e),
    };
    let mine: Vec<Value> = items
        .into_iter()
        .filter(|o| workspace_of(o).as_deref() == Some(ws))
        .map(|mut o| {
            unprefix(&mut o, ws);
            o
        })
        .collect();
    page(mine, query)
}

async fn virtual_list(st: &KcpState, path: &str, export: &str, query: &str) -> Response {
    let items = match list_all(st, &format!("/{BINDINGS}")).await {
        Ok(i) => i,
        Err(e) => return upstream_error(e),
    };
    let to_export = |o: &Value| {
        let r = &o["spec"]["reference"]["export"];
        r["name"] == export && (r["path"].as_str().unwrap_or("").is_empty() || r["path"] == path)
    };
    let opened: std::collections::BTreeSet<String> = items
        .iter()
        .filter(|o| to_export(o))
        .filter(|o| {
            o["spec"]["permissionClaims"]
                .as_array()
                .is_some_and(|claims| {
                    claims.iter().any(|c| {
                        c["group"] == "apis.kcp.io"
                            && c["resource"] == "apibindings"
                            && c["state"] == "Accepted"
                    })
                })
        })
        .filter_map(workspace_of)
        .collect();
    let visible: Vec<Value> = items
        .into_iter()
        .filter_map(|mut o| {
            let ws = workspace_of(&o)?;
            (to_export(&o) || opened.contains(&ws)).then(|| {
                unprefix(&mut o, &ws);
                o
            })
        })
        .collect();
    page(visible, query)
}

/// Serve `items` as an APIBindingList page: `limit` items from offset `continue`.
fn page(items: Vec<Value>, query: &str) -> Response {
    let param = |k: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(key, _)| *key == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let start = param("continue").unwrap_or(0).min(items.len());
    let limit = param("limit").filter(|l| *l > 0).unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(items.len());
    let cont = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    let list = json!({
        "apiVersion": "apis.kcp.io/v1alpha2",
        "kind": "APIBindingList",
        "metadata": { "continue": cont },
        "items": items[start..end],
    });
    json_response(200, &list)
}

fn unprefix(obj: &mut Value, ws: &str) {
    let p = prefix(ws);
    if let Some(name) = obj["metadata"]["name"].as_str()
        && let Some(stripped) = name.strip_prefix(&p)
    {
        obj["metadata"]["name"] = json!(stripped);
    }
}

fn json_response(code: u16, v: &Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "reason": reason, "code": code,
        }),
    )
}

fn upstream_error(e: kube::Error) -> Response {
    match e {
        kube::Error::Api(s) => json_response(
            s.code,
            &serde_json::to_value(&s).unwrap_or_else(|_| json!({"code": s.code})),
        ),
        other => status(502, "BadGateway", &other.to_string()),
    }
}
