//! A Slack Web API stand-in: `/api/<method>`, GET query or POST form, Bearer auth, opaque cursors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};

use super::{Control, Fault, Generated, Running, lock};

#[derive(Clone, Debug, Default)]
pub struct User {
    pub id: String,
    pub email: Option<String>,
    pub is_bot: bool,
    pub deleted: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Channel {
    pub id: String,
    pub name: String,
    pub is_private: bool,
    pub is_archived: bool,
    pub members: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Usergroup {
    pub id: String,
    pub handle: String,
    pub users: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Workspace {
    pub team_id: String,
    pub users: Vec<User>,
    pub channels: Vec<Channel>,
    pub usergroups: Vec<Usergroup>,
    /// The token clients must send as `Authorization: Bearer …`.
    pub token: String,
    /// Largest page the server returns, whatever `limit` asks (Slack may return fewer).
    pub max_page: usize,
    /// Return a short page (half the items, at least one) with a live cursor.
    pub short_pages: bool,
    /// Return one empty page with a live cursor before each real page.
    pub empty_pages: bool,
    /// Per-method request budget per window: beyond it, 429 with Retry-After (tier emulation).
    pub tier_limits: HashMap<String, u32>,
    /// A broken pager: every page carries the same `next_cursor`, whatever cursor was sent, so
    /// a client that trusts it never reaches the end (or loops forever).
    pub repeat_cursor: bool,
    /// `conversations.list` answers with this generated body instead: a slow drip, a huge body,
    /// or both.
    pub generated: Option<Generated>,
    /// Every `conversations.list` page is full of channels never listed before, with a fresh
    /// cursor, forever.
    pub endless_pages: bool,
}

#[derive(Debug)]
pub struct SlackState {
    pub workspace: Mutex<Workspace>,
    pub control: Mutex<Control>,
    /// Requests per method in the current window, for `tier_limits`.
    window: Mutex<(std::time::Instant, HashMap<String, u32>)>,
}

impl SlackState {
    pub fn workspace(&self) -> std::sync::MutexGuard<'_, Workspace> {
        lock(&self.workspace)
    }
    pub fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        lock(&self.control)
    }
}

/// Start the fake on 127.0.0.1 (`port` 0 picks a free one).
pub async fn start(workspace: Workspace, port: u16) -> std::io::Result<Running<SlackState>> {
    start_at(
        workspace,
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    )
    .await
}

/// [`start`] on another address (the real node's namespace).
pub async fn start_at(
    workspace: Workspace,
    addr: std::net::SocketAddr,
) -> std::io::Result<Running<SlackState>> {
    let state = Arc::new(SlackState {
        workspace: Mutex::new(Workspace {
            max_page: workspace.max_page.max(1),
            ..workspace
        }),
        control: Mutex::default(),
        window: Mutex::new((std::time::Instant::now(), HashMap::new())),
    });
    let router = Router::new()
        .route("/api/{method}", any(handle))
        .with_state(state.clone());
    crate::serve_at(router, state, addr).await
}

fn ok(mut body: Value) -> Response {
    body["ok"] = json!(true);
    axum::Json(body).into_response()
}

fn ok_false(code: &str) -> Response {
    axum::Json(json!({"ok": false, "error": code})).into_response()
}

fn fault_response(f: Fault) -> Response {
    match f {
        Fault::TooManyRequests { retry_after } => {
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                axum::Json(json!({"ok": false, "error": "ratelimited"})),
            )
                .into_response();
            if let Some(s) = retry_after {
                r.headers_mut().insert(header::RETRY_AFTER, s.into());
            }
            r
        }
        Fault::OkFalseRatelimited => ok_false("ratelimited"),
        Fault::OkFalse(code) => ok_false(&code),
        Fault::Status(code, body) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        )
            .into_response(),
        Fault::Bytes(code, body) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        )
            .into_response(),
    }
}

async fn handle(
    State(state): State<Arc<SlackState>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    uri: axum::http::Uri,
    body: String,
) -> Response {
    let mut params: HashMap<String, String> = parse_form(uri.query().unwrap_or(""));
    params.extend(parse_form(&body));
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    {
        let mut c = state.control();
        c.count(&method);
        c.seen_auth.push(auth.clone());
        if let Some(n) = params.get("limit").and_then(|l| l.parse::<u64>().ok()) {
            c.asked_page(n);
        }
        if let Some(f) = c.next_fault(&method) {
            return fault_response(f);
        }
    }
    if params.contains_key("token") {
        // Newer apps may not pass tokens in the query string or form.
        return ok_false("invalid_auth");
    }
    let ws = state.workspace();
    if auth != format!("Bearer {}", ws.token) {
        return ok_false(if auth.is_empty() {
            "not_authed"
        } else {
            "invalid_auth"
        });
    }
    if let Some(&limit) = ws.tier_limits.get(&method) {
        let mut w = lock(&state.window);
        if w.0.elapsed() >= std::time::Duration::from_secs(1) {
            *w = (std::time::Instant::now(), HashMap::new());
        }
        let n = w.1.entry(method.clone()).or_default();
        *n += 1;
        if *n > limit {
            drop(w);
            *state
                .control()
                .tier_rejections
                .entry(method.clone())
                .or_default() += 1;
            return fault_response(Fault::TooManyRequests {
                retry_after: Some(1),
            });
        }
    }
    match method.as_str() {
        "auth.test" => ok(json!({"team_id": ws.team_id, "user_id": "UBOT", "bot_id": "BBOT"})),
        "conversations.list" if ws.generated.is_some() => match &ws.generated {
            Some(g) => g.response(
                "application/json",
                r#"{"ok":true,"channels":[{"id":"C1","name":"c1"}"#.to_string(),
                r#"],"response_metadata":{"next_cursor":""}}"#.to_string(),
            ),
            None => ok_false("internal_error"),
        },
        "conversations.list" if ws.endless_pages => {
            let offset = params
                .get("cursor")
                .and_then(|c| c.strip_prefix("dXNl"))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let n = params
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or(100)
                .clamp(1, 1000)
                .min(ws.max_page);
            let items: Vec<Value> = (offset..offset + n)
                .map(|i| json!({"id": format!("CE{i}"), "name": format!("endless-{i}")}))
                .collect();
            ok(
                json!({"channels": items, "response_metadata": {"next_cursor": format!("dXNl{}", offset + n)}}),
            )
        }
        "conversations.list" => {
            let types = params
                .get("types")
                .cloned()
                .unwrap_or_else(|| "public_channel".into());
            let want_public = types.split(',').any(|t| t == "public_channel");
            let want_private = types.split(',').any(|t| t == "private_channel");
            let exclude_archived = params
                .get("exclude_archived")
                .is_some_and(|v| v == "true" || v == "1");
            let items: Vec<Value> = ws
                .channels
                .iter()
                .filter(|c| if c.is_private { want_private } else { want_public })
                .filter(|c| !(exclude_archived && c.is_archived))
                .map(|c| json!({"id": c.id, "name": c.name, "is_private": c.is_private, "is_archived": c.is_archived}))
                .collect();
            page(&ws, &params, items, "channels")
        }
        "conversations.members" => {
            let Some(ch) = params
                .get("channel")
                .and_then(|id| ws.channels.iter().find(|c| &c.id == id))
            else {
                return ok_false("channel_not_found");
            };
            let items = ch.members.iter().map(|m| json!(m)).collect();
            page(&ws, &params, items, "members")
        }
        "users.list" => {
            let items = ws.users.iter().map(user_json).collect();
            page(&ws, &params, items, "members")
        }
        "users.info" => match params
            .get("user")
            .and_then(|id| ws.users.iter().find(|u| &u.id == id))
        {
            Some(u) => ok(json!({"user": user_json(u)})),
            None => ok_false("user_not_found"),
        },
        "usergroups.list" => {
            let include_users = params
                .get("include_users")
                .is_some_and(|v| v == "true" || v == "1");
            let groups: Vec<Value> = ws
                .usergroups
                .iter()
                .map(|g| {
                    let mut v = json!({"id": g.id, "handle": g.handle, "name": g.handle});
                    if include_users {
                        v["users"] = json!(g.users);
                    }
                    v
                })
                .collect();
            ok(json!({"usergroups": groups}))
        }
        "usergroups.users.list" => {
            match params
                .get("usergroup")
                .and_then(|id| ws.usergroups.iter().find(|g| &g.id == id))
            {
                Some(g) => ok(json!({"users": g.users})),
                None => ok_false("no_such_subteam"),
            }
        }
        _ => ok_false("unknown_method"),
    }
}

fn user_json(u: &User) -> Value {
    let mut profile = json!({});
    if let Some(e) = &u.email {
        profile["email"] = json!(e);
    }
    json!({"id": u.id, "deleted": u.deleted, "is_bot": u.is_bot, "profile": profile})
}

/// Cursor = "dXNl" + offset (opaque to clients, like Slack's base64 cursors); "e" suffix marks
/// that the empty page before this offset was already served.
fn page(
    ws: &Workspace,
    params: &HashMap<String, String>,
    items: Vec<Value>,
    key: &str,
) -> Response {
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let (offset, empty_served) = match params.get("cursor").filter(|c| !c.is_empty()) {
        None => (0, false),
        Some(c) => {
            let Some(rest) = c.strip_prefix("dXNl") else {
                return ok_false("invalid_cursor");
            };
            let (num, e) = rest.strip_suffix('e').map_or((rest, false), |n| (n, true));
            match num.parse::<usize>() {
                Ok(o) if o <= items.len() => (o, e),
                _ => return ok_false("invalid_cursor"),
            }
        }
    };
    if ws.empty_pages && !empty_served && offset < items.len() {
        return ok(
            json!({key: [], "response_metadata": {"next_cursor": format!("dXNl{offset}e")}}),
        );
    }
    if ws.repeat_cursor {
        let n = limit.min(ws.max_page).min(items.len());
        return ok(json!({key: items[..n], "response_metadata": {"next_cursor": "dXNl1"}}));
    }
    let mut n = limit.min(ws.max_page);
    if ws.short_pages {
        n = (n / 2).max(1);
    }
    let end = (offset + n).min(items.len());
    let next = if end < items.len() {
        format!("dXNl{end}")
    } else {
        String::new()
    };
    ok(json!({key: items[offset..end], "response_metadata": {"next_cursor": next}}))
}

fn parse_form(s: &str) -> HashMap<String, String> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let h = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}
