//! Slack: scopes are channels (`conversations.list`, public and private, archived excluded)
//! and, when enabled, user groups (`usergroups.list`). Members come from
//! `conversations.members` / `usergroups.users.list`; emails from one `users.list` per pass,
//! with `users.info` for ids the list did not carry. The workspace (from `auth.test`) is the
//! cross-resource object: every joinable user is its member, and every channel links to it.
//! The token travels in the Authorization header, never in a query string or form.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use futures::future::BoxFuture;
use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::OnceCell;

use super::{
    CrossSet, Fetched, Http, JoinConfig, Kind, KindError, Link, Member, PageCount, Scope, get_json,
    page_size,
};

pub const CHANNEL: &str = "slack_channel";
pub const USERGROUP: &str = "slack_usergroup";
pub const WORKSPACE: &str = "slack_workspace";
/// Every object type this kind writes.
pub const OBJECT_TYPES: &[&str] = &[CHANNEL, USERGROUP, WORKSPACE];

/// `spec.config` of kind `slack`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Channel types to sync: `public_channel`, `private_channel`. Default both.
    #[serde(default = "default_types")]
    pub types: Vec<ChannelType>,
    /// Also sync user groups (needs `usergroups:read`).
    #[serde(default)]
    pub usergroups: bool,
    #[serde(default)]
    pub join: JoinConfig,
    /// Items per page asked of list methods (Slack advises at most 200).
    #[serde(default = "default_page")]
    pub page_size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelType {
    PublicChannel,
    PrivateChannel,
}

fn default_types() -> Vec<ChannelType> {
    vec![ChannelType::PublicChannel, ChannelType::PrivateChannel]
}

fn default_page() -> u32 {
    200
}

/// Published per-minute limits (Slack tiers) of the methods used.
pub(crate) fn tiers() -> HashMap<&'static str, u32> {
    HashMap::from([
        ("auth.test", 100),
        ("conversations.list", 20),
        ("conversations.members", 100),
        ("users.list", 20),
        ("users.info", 100),
        ("usergroups.list", 20),
        ("usergroups.users.list", 20),
    ])
}

pub struct Slack {
    config: Config,
    http: Http,
    api: Url,
    team: OnceCell<String>,
    users: OnceCell<HashMap<String, Member>>,
    /// users.info answers for ids users.list did not carry.
    looked_up: Mutex<HashMap<String, Member>>,
}

fn ok_false(method: &str, body: &Value) -> Option<KindError> {
    if body.get("ok") == Some(&Value::Bool(true)) {
        return None;
    }
    let code = body
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("unknown_error")
        .to_string();
    let auth = matches!(
        code.as_str(),
        "invalid_auth"
            | "not_authed"
            | "account_inactive"
            | "token_revoked"
            | "token_expired"
            | "missing_scope"
            | "not_allowed_token_type"
    );
    let message = match body.get("needed").and_then(Value::as_str) {
        Some(needed) => format!("{code} (needed: {needed})"),
        None => code,
    };
    Some(if auth {
        KindError::Auth {
            method: method.to_string(),
            message,
        }
    } else {
        KindError::Upstream {
            method: method.to_string(),
            message,
        }
    })
}

fn member_of(u: &Value) -> Option<Member> {
    let id = u.get("id")?.as_str()?.to_string();
    Some(Member {
        email: u
            .pointer("/profile/email")
            .and_then(Value::as_str)
            .filter(|e| !e.is_empty())
            .map(str::to_string),
        bot: u.get("is_bot").and_then(Value::as_bool).unwrap_or(false) || id == "USLACKBOT",
        deleted: u.get("deleted").and_then(Value::as_bool).unwrap_or(false),
        unknown: false,
        id,
    })
}

impl Slack {
    pub(crate) fn new(config: Config, http: Http, api: &str) -> Result<Self, KindError> {
        let api = Url::parse(&format!("{}/", api.trim_end_matches('/'))).map_err(|source| {
            KindError::Url {
                method: "--slack-api-url".into(),
                source,
            }
        })?;
        Ok(Self {
            config,
            http,
            api,
            team: OnceCell::new(),
            users: OnceCell::new(),
            looked_up: Mutex::default(),
        })
    }

    async fn call(&self, method: &str, params: &[(&str, &str)]) -> Result<Value, KindError> {
        let mut url = self.api.join(method).map_err(|source| KindError::Url {
            method: method.to_string(),
            source,
        })?;
        url.query_pairs_mut().extend_pairs(params);
        let (status, body) = get_json(&self.http, method, url, true).await?;
        if status >= 400 {
            return Err(if status == 401 || status == 403 {
                KindError::Auth {
                    method: method.to_string(),
                    message: format!("HTTP {status}"),
                }
            } else {
                KindError::Upstream {
                    method: method.to_string(),
                    message: format!("HTTP {status}"),
                }
            });
        }
        Ok(body)
    }

    /// Every item of a cursor-paginated method, each kept as `keep` makes it (only what is
    /// used: a listing may be long). Short and empty pages with a live cursor are normal; a
    /// cursor already seen is an error, never an end; so is a listing past `--max-pages`.
    async fn paged<T>(
        &self,
        method: &str,
        params: &[(&str, &str)],
        key: &str,
        on_error: impl Fn(&str) -> Option<()>,
        keep: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>, KindError> {
        let limit = page_size(self.config.page_size).to_string();
        let mut cursor = String::new();
        let mut seen = BTreeSet::new();
        let mut pages = PageCount::new(&self.http.limits);
        let mut out = Vec::new();
        loop {
            pages.next(method)?;
            let mut p: Vec<(&str, &str)> = params.to_vec();
            p.push(("limit", &limit));
            if !cursor.is_empty() {
                p.push(("cursor", &cursor));
            }
            let body = self.call(method, &p).await?;
            if let Some(err) = ok_false(method, &body) {
                let code = body.get("error").and_then(Value::as_str).unwrap_or("");
                if on_error(code).is_some() {
                    return Ok(None);
                }
                return Err(err);
            }
            if let Some(items) = body.get(key).and_then(Value::as_array) {
                out.extend(items.iter().filter_map(&keep));
            }
            let next = body
                .pointer("/response_metadata/next_cursor")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if next.is_empty() {
                return Ok(Some(out));
            }
            if !seen.insert(next.clone()) {
                return Err(KindError::Stalled {
                    method: method.to_string(),
                    message: "the server returned a cursor it had already returned".into(),
                });
            }
            cursor = next;
        }
    }

    async fn team_id(&self) -> Result<&String, KindError> {
        self.team
            .get_or_try_init(|| async {
                let body = self.call("auth.test", &[]).await?;
                if let Some(e) = ok_false("auth.test", &body) {
                    return Err(e);
                }
                body.get("team_id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| KindError::Upstream {
                        method: "auth.test".into(),
                        message: "no team_id".into(),
                    })
            })
            .await
    }

    async fn users(&self) -> Result<&HashMap<String, Member>, KindError> {
        self.users
            .get_or_try_init(|| async {
                let items = self
                    .paged("users.list", &[], "members", |_| None, member_of)
                    .await?
                    .unwrap_or_default();
                Ok(items.into_iter().map(|m| (m.id.clone(), m)).collect())
            })
            .await
    }

    async fn describe(&self, ids: Vec<String>) -> Result<Vec<Member>, KindError> {
        let users = self.users().await?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(m) = users.get(&id) {
                out.push(m.clone());
                continue;
            }
            let cached = self
                .looked_up
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .cloned();
            let m = match cached {
                Some(m) => m,
                None => {
                    let body = self.call("users.info", &[("user", &id)]).await?;
                    let m = match ok_false("users.info", &body) {
                        None => body.get("user").and_then(member_of),
                        Some(_)
                            if body.get("error").and_then(Value::as_str)
                                == Some("user_not_found") =>
                        {
                            None
                        }
                        Some(e) => return Err(e),
                    }
                    .unwrap_or(Member {
                        id: id.clone(),
                        unknown: true,
                        ..Default::default()
                    });
                    self.looked_up
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.clone(), m.clone());
                    m
                }
            };
            out.push(m);
        }
        Ok(out)
    }

    fn types_param(&self) -> String {
        let mut t: Vec<&str> = self
            .config
            .types
            .iter()
            .map(|t| match t {
                ChannelType::PublicChannel => "public_channel",
                ChannelType::PrivateChannel => "private_channel",
            })
            .collect();
        t.sort_unstable();
        t.dedup();
        t.join(",")
    }

    async fn enumerate_all(&self) -> Result<Vec<Scope>, KindError> {
        let types = self.types_param();
        let channels = self
            .paged(
                "conversations.list",
                &[("types", &types), ("exclude_archived", "true")],
                "channels",
                |_| None,
                |c| c.get("id").and_then(Value::as_str).map(str::to_string),
            )
            .await?
            .unwrap_or_default();
        let mut scopes: Vec<Scope> = channels
            .into_iter()
            .map(|id| Scope {
                id: format!("channel/{id}"),
                object_type: CHANNEL,
                upstream_id: id,
            })
            .collect();
        if self.config.usergroups {
            let body = self.call("usergroups.list", &[]).await?;
            if let Some(e) = ok_false("usergroups.list", &body) {
                return Err(e);
            }
            scopes.extend(
                body.get("usergroups")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g.get("id").and_then(Value::as_str))
                    .map(|id| Scope {
                        id: format!("usergroup/{id}"),
                        object_type: USERGROUP,
                        upstream_id: id.to_string(),
                    }),
            );
        }
        scopes.sort();
        scopes.dedup_by(|a, b| a.id == b.id);
        Ok(scopes)
    }

    async fn fetch_scope(&self, scope: &Scope) -> Result<Fetched, KindError> {
        let ids: Vec<String> = match scope.object_type {
            CHANNEL => {
                let gone = |code: &str| (code == "channel_not_found").then_some(());
                match self
                    .paged(
                        "conversations.members",
                        &[("channel", &scope.upstream_id)],
                        "members",
                        gone,
                        |v| v.as_str().map(str::to_string),
                    )
                    .await?
                {
                    None => return Ok(Fetched::Gone),
                    Some(ids) => ids,
                }
            }
            _ => {
                let body = self
                    .call(
                        "usergroups.users.list",
                        &[("usergroup", &scope.upstream_id)],
                    )
                    .await?;
                if let Some(e) = ok_false("usergroups.users.list", &body) {
                    let code = body.get("error").and_then(Value::as_str).unwrap_or("");
                    if code == "no_such_subteam" || code == "subteam_not_found" {
                        return Ok(Fetched::Gone);
                    }
                    return Err(e);
                }
                body.get("users")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            }
        };
        Ok(Fetched::Members(self.describe(ids).await?))
    }
}

impl Kind for Slack {
    fn enumerate(&self) -> BoxFuture<'_, Result<Vec<Scope>, KindError>> {
        Box::pin(self.enumerate_all())
    }

    fn scope(&self, id: &str) -> Option<Scope> {
        let (what, upstream) = id.split_once('/')?;
        let object_type = match what {
            "channel" => CHANNEL,
            "usergroup" => USERGROUP,
            _ => return None,
        };
        (!upstream.is_empty()).then(|| Scope {
            id: id.to_string(),
            object_type,
            upstream_id: upstream.to_string(),
        })
    }

    fn fetch<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Fetched, KindError>> {
        Box::pin(self.fetch_scope(scope))
    }

    fn links<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Link>, KindError>> {
        Box::pin(async move {
            if scope.object_type != CHANNEL {
                return Ok(Vec::new());
            }
            let team = self.team_id().await?;
            Ok(vec![("workspace", WORKSPACE, team.clone())])
        })
    }

    fn cross(&self) -> BoxFuture<'_, Result<Vec<CrossSet>, KindError>> {
        Box::pin(async move {
            let team = self.team_id().await?.clone();
            let mut members: Vec<Member> = self.users().await?.values().cloned().collect();
            members.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(vec![CrossSet {
                object_type: WORKSPACE,
                upstream_id: team,
                relation: "member",
                members,
            }])
        })
    }

    fn object_types(&self) -> &'static [&'static str] {
        OBJECT_TYPES
    }

    fn throttles(&self) -> u64 {
        self.http.pacer.throttles()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_are_classified() {
        let bot = member_of(&json!({"id": "USLACKBOT", "profile": {"email": "x@y.z"}})).unwrap();
        assert!(bot.bot, "USLACKBOT is a bot even without is_bot");
        let gone = member_of(&json!({"id": "U1", "deleted": true})).unwrap();
        assert!(gone.deleted && gone.email.is_none());
        let ada = member_of(&json!({"id": "U2", "profile": {"email": "ada@example.com"}})).unwrap();
        assert_eq!(ada.email.as_deref(), Some("ada@example.com"));
    }

    #[test]
    fn slack_errors_are_classified() {
        assert!(ok_false("m", &json!({"ok": true})).is_none());
        assert!(matches!(
            ok_false("m", &json!({"ok": false, "error": "invalid_auth"})),
            Some(KindError::Auth { .. })
        ));
        let e = ok_false(
            "m",
            &json!({"ok": false, "error": "missing_scope", "needed": "groups:read"}),
        )
        .unwrap();
        assert!(e.to_string().contains("groups:read"), "{e}");
        assert!(matches!(
            ok_false("m", &json!({"ok": false, "error": "fatal_error"})),
            Some(KindError::Upstream { .. })
        ));
    }
}
