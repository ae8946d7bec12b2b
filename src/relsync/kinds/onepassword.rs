//! 1Password SCIM bridge (customer-hosted, so `spec.baseURL` is required and must be admitted by
//! the credential's allowedHosts). Scopes are groups (`GET /scim/Groups`); a group's members come
//! from `GET /scim/Groups/{id}` paged with startIndex/count as the bridge does; emails from one
//! paged `GET /scim/Users` per pass (primary email, else the first). SCIM paging is trusted only
//! as far as it advances: a page that brings no new ids while the server claims more is an
//! error (a bridge that ignores startIndex would otherwise loop forever or look complete).

use std::collections::{BTreeSet, HashMap};

use futures::future::BoxFuture;
use reqwest::Url;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::OnceCell;

use super::{
    CrossSet, Fetched, Http, JoinConfig, Kind, KindError, Link, Member, PageCount, Scope, get_json,
    page_size,
};

pub const GROUP: &str = "scim_group";
/// Every object type this kind writes.
pub const OBJECT_TYPES: &[&str] = &[GROUP];

/// `spec.config` of kind `onepassword`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    #[serde(default)]
    pub join: JoinConfig,
    /// Items per page asked of the bridge.
    #[serde(default = "default_page")]
    pub page_size: u32,
}

fn default_page() -> u32 {
    100
}

pub struct OnePassword {
    config: Config,
    http: Http,
    base: Url,
    users: OnceCell<HashMap<String, Member>>,
}

impl OnePassword {
    pub(crate) fn new(config: Config, http: Http, base: Url) -> Self {
        Self {
            config,
            http,
            base,
            users: OnceCell::new(),
        }
    }

    fn url(&self, path: &str) -> Url {
        let root = self.base.as_str().trim_end_matches('/');
        let root = root.strip_suffix("/scim").unwrap_or(root);
        Url::parse(&format!("{root}/scim/{path}")).unwrap_or_else(|_| self.base.clone())
    }

    async fn get(
        &self,
        what: &str,
        mut url: Url,
        params: &[(&str, String)],
    ) -> Result<(u16, Value), KindError> {
        url.query_pairs_mut()
            .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
        let (status, body) = get_json(&self.http, what, url, false).await?;
        match status {
            200..=299 | 404 => Ok((status, body)),
            401 | 403 => Err(KindError::Auth {
                method: what.to_string(),
                message: scim_detail(status, &body),
            }),
            _ => Err(KindError::Upstream {
                method: what.to_string(),
                message: scim_detail(status, &body),
            }),
        }
    }

    /// Walk startIndex/count pages of `key` items (`Resources`, or a group's `members`) until
    /// an empty page, a short page at or past the total, or a page larger than asked (a server
    /// that does not page at all), keeping each item as `keep` makes it (only what is used: a
    /// listing may be long). At most `--max-pages` pages. Returns `None` on 404.
    async fn pages<T>(
        &self,
        what: &str,
        url: Url,
        key: &str,
        extra: &[(&str, String)],
        keep: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>, KindError> {
        let count = page_size(self.config.page_size) as usize;
        let mut start = 1usize;
        let mut seen = BTreeSet::new();
        let mut pages = PageCount::new(&self.http.limits);
        let mut out = Vec::new();
        loop {
            pages.next(what)?;
            let mut params = extra.to_vec();
            params.push(("startIndex", start.to_string()));
            params.push(("count", count.to_string()));
            let (status, body) = self.get(what, url.clone(), &params).await?;
            if status == 404 {
                return Ok(None);
            }
            let total = body.get("totalResults").and_then(Value::as_u64);
            let items = body.get(key).and_then(Value::as_array);
            let n = items.map_or(0, Vec::len);
            let mut new = 0;
            for item in items.into_iter().flatten() {
                let id = item
                    .get("id")
                    .or_else(|| item.get("value"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if seen.insert(id.to_string()) {
                    new += 1;
                    out.extend(keep(item));
                }
            }
            drop(body);
            if n == 0 || n > count {
                return Ok(Some(out));
            }
            if new == 0 {
                return Err(KindError::Stalled {
                    method: what.to_string(),
                    message: format!(
                        "page at startIndex {start} repeated ids already seen (does the server ignore startIndex?)"
                    ),
                });
            }
            start += n;
            // A short page is the end only when the total agrees; a full page never is.
            if n < count && total.is_none_or(|t| start as u64 > t) {
                return Ok(Some(out));
            }
        }
    }

    async fn users(&self) -> Result<&HashMap<String, Member>, KindError> {
        self.users
            .get_or_try_init(|| async {
                let items = self
                    .pages("Users", self.url("Users"), "Resources", &[], user_member)
                    .await?
                    .unwrap_or_default();
                Ok(items.into_iter().map(|m| (m.id.clone(), m)).collect())
            })
            .await
    }
}

fn scim_detail(status: u16, body: &Value) -> String {
    match body.get("detail").and_then(Value::as_str) {
        Some(d) => format!("HTTP {status}: {d}"),
        None => format!("HTTP {status}"),
    }
}

fn user_member(u: &Value) -> Option<Member> {
    let id = u.get("id")?.as_str()?.to_string();
    let emails = u
        .get("emails")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let value = |e: &Value| {
        e.get("value")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let email = emails
        .iter()
        .find(|e| e.get("primary").and_then(Value::as_bool) == Some(true))
        .and_then(value)
        .or_else(|| emails.iter().find_map(value));
    Some(Member {
        id,
        email,
        bot: false,
        deleted: u.get("active").and_then(Value::as_bool) == Some(false),
        unknown: false,
    })
}

impl Kind for OnePassword {
    fn enumerate(&self) -> BoxFuture<'_, Result<Vec<Scope>, KindError>> {
        Box::pin(async move {
            let ids = self
                .pages(
                    "Groups",
                    self.url("Groups"),
                    "Resources",
                    &[("excludedAttributes", "members".to_string())],
                    |g| g.get("id").and_then(Value::as_str).map(str::to_string),
                )
                .await?
                .unwrap_or_default();
            let mut scopes: Vec<Scope> = ids
                .into_iter()
                .map(|id| Scope {
                    id: format!("group/{id}"),
                    object_type: GROUP,
                    upstream_id: id,
                })
                .collect();
            scopes.sort();
            Ok(scopes)
        })
    }

    fn scope(&self, id: &str) -> Option<Scope> {
        let upstream = id.strip_prefix("group/").filter(|s| !s.is_empty())?;
        Some(Scope {
            id: id.to_string(),
            object_type: GROUP,
            upstream_id: upstream.to_string(),
        })
    }

    fn fetch<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Fetched, KindError>> {
        Box::pin(async move {
            let mut url = self.url("Groups");
            url.path_segments_mut()
                .map_err(|_| KindError::Upstream {
                    method: "Group".into(),
                    message: "baseURL cannot carry a path".into(),
                })?
                .push(&scope.upstream_id);
            let value = |m: &Value| m.get("value").and_then(Value::as_str).map(str::to_string);
            let Some(members) = self.pages("Group", url, "members", &[], value).await? else {
                return Ok(Fetched::Gone);
            };
            let users = self.users().await?;
            Ok(Fetched::Members(
                members
                    .into_iter()
                    .map(|id| {
                        users.get(&id).cloned().unwrap_or(Member {
                            id,
                            unknown: true,
                            ..Default::default()
                        })
                    })
                    .collect(),
            ))
        })
    }

    fn links<'a>(&'a self, _scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Link>, KindError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn cross(&self) -> BoxFuture<'_, Result<Vec<CrossSet>, KindError>> {
        Box::pin(async { Ok(Vec::new()) })
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
    fn primary_email_wins_then_first() {
        let u = json!({"id": "u1", "active": true, "emails": [{"value": "b@x.io"}, {"value": "a@x.io", "primary": true}]});
        assert_eq!(user_member(&u).unwrap().email.as_deref(), Some("a@x.io"));
        let u =
            json!({"id": "u2", "active": false, "emails": [{"value": ""}, {"value": "c@x.io"}]});
        let m = user_member(&u).unwrap();
        assert_eq!(m.email.as_deref(), Some("c@x.io"));
        assert!(m.deleted, "inactive users do not join");
    }
}
