//! A 1Password SCIM bridge stand-in: `/scim/Users`, `/scim/Groups` (and `/{id}`), RFC 7644
//! ListResponse paging, with the quirks real bridges show.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{Control, Fault, Generated, Running, lock};

#[derive(Clone, Debug, Default)]
pub struct ScimUser {
    pub id: String,
    pub user_name: String,
    /// (address, primary)
    pub emails: Vec<(String, bool)>,
    pub active: bool,
}

#[derive(Clone, Debug, Default)]
pub struct ScimGroup {
    pub id: String,
    pub display_name: String,
    pub members: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Directory {
    pub token: String,
    pub users: Vec<ScimUser>,
    pub groups: Vec<ScimGroup>,
    /// Server-side cap on `count`.
    pub max_results: usize,
    /// Ignore `startIndex` and always serve the first page (a broken bridge).
    pub ignore_start_index: bool,
    /// Omit `totalResults`.
    pub omit_total: bool,
    /// Answers of these endpoints (`Users`, `Groups`, `Group`: a group's members) are a
    /// generated body instead: a slow drip, a huge body, or both (a hostile or broken bridge).
    pub generated: BTreeMap<String, Generated>,
    /// Every `/Groups` page is full — `count` (at most 1000) groups never listed before, past
    /// `startIndex` — and `totalResults` never ends.
    pub endless_pages: bool,
}

#[derive(Debug, Default)]
pub struct ScimState {
    pub directory: Mutex<Directory>,
    pub control: Mutex<Control>,
}

impl ScimState {
    pub fn directory(&self) -> std::sync::MutexGuard<'_, Directory> {
        lock(&self.directory)
    }
    pub fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        lock(&self.control)
    }
}

pub async fn start(directory: Directory, port: u16) -> std::io::Result<Running<ScimState>> {
    start_at(
        directory,
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    )
    .await
}

/// [`start`] on another address (the real node's namespace).
pub async fn start_at(
    directory: Directory,
    addr: std::net::SocketAddr,
) -> std::io::Result<Running<ScimState>> {
    let state = Arc::new(ScimState {
        directory: Mutex::new(Directory {
            max_results: directory.max_results.max(1),
            ..directory
        }),
        control: Mutex::default(),
    });
    let router = Router::new()
        .route("/scim/Users", get(list_users))
        .route("/scim/Users/{id}", get(get_user))
        .route("/scim/Groups", get(list_groups))
        .route("/scim/Groups/{id}", get(get_group))
        .route("/ping", get(|| async { "pong" }))
        .with_state(state.clone());
    crate::serve_at(router, state, addr).await
}

fn scim_error(status: StatusCode, detail: &str) -> Response {
    let body = json!({
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:Error"],
        "status": status.as_u16().to_string(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/scim+json")],
        body.to_string(),
    )
        .into_response()
}

/// Count the call, apply a queued fault, check auth. `Err` is the response to send.
fn gate(state: &ScimState, kind: &str, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut c = state.control();
    c.count(kind);
    c.seen_auth.push(auth.clone());
    if let Some(f) = c.next_fault(kind) {
        return Err(Box::new(match f {
            Fault::TooManyRequests { retry_after } => {
                let mut r = scim_error(StatusCode::TOO_MANY_REQUESTS, "too many requests");
                if let Some(s) = retry_after {
                    r.headers_mut().insert(header::RETRY_AFTER, s.into());
                }
                r
            }
            Fault::Status(code, detail) => scim_error(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &detail,
            ),
            Fault::OkFalse(detail) => scim_error(StatusCode::BAD_REQUEST, &detail),
            Fault::OkFalseRatelimited => scim_error(StatusCode::TOO_MANY_REQUESTS, "rate limited"),
            Fault::Bytes(code, body) => (
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body,
            )
                .into_response(),
        }));
    }
    drop(c);
    if auth != format!("Bearer {}", state.directory().token) {
        return Err(Box::new(scim_error(
            StatusCode::UNAUTHORIZED,
            "invalid bearer token",
        )));
    }
    Ok(())
}

fn user_json(u: &ScimUser) -> Value {
    let emails: Vec<Value> = u
        .emails
        .iter()
        .map(|(v, p)| json!({"value": v, "primary": p, "type": "work"}))
        .collect();
    json!({
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
        "id": u.id, "userName": u.user_name, "active": u.active, "emails": emails,
    })
}

fn group_json(g: &ScimGroup, members: &[String]) -> Value {
    let members: Vec<Value> = members
        .iter()
        .map(|m| json!({"value": m, "type": "User"}))
        .collect();
    json!({
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
        "id": g.id, "displayName": g.display_name, "members": members,
    })
}

/// The generated body standing in for a ListResponse.
fn generated(g: &Generated) -> Response {
    g.response(
        "application/scim+json",
        r#"{"schemas":["urn:ietf:params:scim:api:messages:2.0:ListResponse"],"totalResults":1,"Resources":[{"id":"g1","displayName":"g1","members":[]}"#.to_string(),
        "]}".to_string(),
    )
}

/// Record the `count` a client asked for.
fn asked(state: &ScimState, params: &HashMap<String, String>) {
    if let Some(n) = params.get("count").and_then(|c| c.parse::<u64>().ok()) {
        state.control().asked_page(n);
    }
}

/// A page of groups never listed before: ids from `startIndex` on.
fn endless(params: &HashMap<String, String>) -> Response {
    let start = params
        .get("startIndex")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    let count = params
        .get("count")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let items: Vec<Value> = (start..start + count)
        .map(|i| json!({"id": format!("e{i}"), "displayName": format!("endless {i}")}))
        .collect();
    let body = json!({
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
        "Resources": items,
        "startIndex": start,
        "itemsPerPage": count,
        "totalResults": u32::MAX,
    });
    (
        [(header::CONTENT_TYPE, "application/scim+json")],
        body.to_string(),
    )
        .into_response()
}

fn list_response(dir: &Directory, params: &HashMap<String, String>, items: Vec<Value>) -> Response {
    let start = params
        .get("startIndex")
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(1)
        .max(1) as usize;
    let start = if dir.ignore_start_index { 1 } else { start };
    let count = params
        .get("count")
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(100)
        .max(0) as usize;
    let n = count.min(dir.max_results);
    let from = (start - 1).min(items.len());
    let to = (from + n).min(items.len());
    let mut body = json!({
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"],
        "Resources": items[from..to],
        "startIndex": start,
        "itemsPerPage": to - from,
    });
    if !dir.omit_total {
        body["totalResults"] = json!(items.len());
    }
    (
        [(header::CONTENT_TYPE, "application/scim+json")],
        body.to_string(),
    )
        .into_response()
}

async fn list_users(
    State(s): State<Arc<ScimState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, "Users", &headers) {
        return *r;
    }
    asked(&s, &q);
    let dir = s.directory();
    if let Some(g) = dir.generated.get("Users") {
        return generated(g);
    }
    let items = dir.users.iter().map(user_json).collect();
    list_response(&dir, &q, items)
}

async fn get_user(
    State(s): State<Arc<ScimState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = gate(&s, "User", &headers) {
        return *r;
    }
    let dir = s.directory();
    match dir.users.iter().find(|u| u.id == id) {
        Some(u) => (
            [(header::CONTENT_TYPE, "application/scim+json")],
            user_json(u).to_string(),
        )
            .into_response(),
        None => scim_error(StatusCode::NOT_FOUND, "user not found"),
    }
}

async fn list_groups(
    State(s): State<Arc<ScimState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, "Groups", &headers) {
        return *r;
    }
    asked(&s, &q);
    let dir = s.directory();
    if let Some(g) = dir.generated.get("Groups") {
        return generated(g);
    }
    if dir.endless_pages {
        return endless(&q);
    }
    let exclude_members = q
        .get("excludedAttributes")
        .is_some_and(|a| a.contains("members"));
    let items = dir
        .groups
        .iter()
        .map(|g| group_json(g, if exclude_members { &[] } else { &g.members }))
        .collect();
    list_response(&dir, &q, items)
}

/// Member paging on a group GET (non-standard, as 1Password's bridge does it).
async fn get_group(
    State(s): State<Arc<ScimState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, "Group", &headers) {
        return *r;
    }
    asked(&s, &q);
    let dir = s.directory();
    if let Some(g) = dir.generated.get("Group") {
        return generated(g);
    }
    let Some(g) = dir.groups.iter().find(|g| g.id == id) else {
        return scim_error(StatusCode::NOT_FOUND, "group not found");
    };
    let start = q
        .get("startIndex")
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let start = if dir.ignore_start_index { 1 } else { start };
    let count = q
        .get("count")
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(usize::MAX)
        .min(dir.max_results);
    let from = (start - 1).min(g.members.len());
    let to = from.saturating_add(count).min(g.members.len());
    let mut body = group_json(g, &g.members[from..to]);
    if !dir.omit_total {
        body["totalResults"] = json!(g.members.len());
    }
    (
        [(header::CONTENT_TYPE, "application/scim+json")],
        body.to_string(),
    )
        .into_response()
}
