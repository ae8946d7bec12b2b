//! The registry of upstream kinds. A kind parses its own `spec.config` (unknown keys refused),
//! lists its scopes, fetches one scope's whole membership, and names the cross-resource edges
//! it asserts. The pass never knows which service it talks to.

mod http;
pub mod onepassword;
pub mod slack;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use super::auth::Credential;
use super::limits::{Limits, Turn};
use super::ratelimit::{Pacer, Rate, Throttled};
use crate::upstream::{self, UpstreamError};

pub(crate) use http::{Http, PageCount, get_json, page_size};

/// One unit of sync: an upstream object whose membership is diffed as a whole.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Scope {
    /// Stable, sortable id: `<what>/<upstream id>`, e.g. `channel/C024BE91L`. The cursor
    /// (`status.sync.resumeAfter`) compares these as strings.
    pub id: String,
    /// SpiceDB object type written for this scope.
    pub object_type: &'static str,
    /// The upstream object's id.
    pub upstream_id: String,
}

/// An upstream member as the kind sees it, before the identity join.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub email: Option<String>,
    pub bot: bool,
    pub deleted: bool,
    /// The upstream could not describe this member (unknown user).
    pub unknown: bool,
}

/// A scope's membership, or the news that the scope no longer exists upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetched {
    Members(Vec<Member>),
    Gone,
}

/// A relationship from a scope's object to another object this source writes (e.g. a
/// channel's workspace): `(relation, subject object type, subject upstream id)`.
pub type Link = (&'static str, &'static str, String);

/// Edges that no single scope owns (workspace membership): written every pass, pruned only
/// when a pass covered every scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossSet {
    pub object_type: &'static str,
    pub upstream_id: String,
    pub relation: &'static str,
    pub members: Vec<Member>,
}

/// What went wrong talking to the upstream.
#[derive(Debug, thiserror::Error)]
pub enum KindError {
    /// The credential was refused.
    #[error("{method}: credential refused: {message}")]
    Auth { method: String, message: String },
    /// The upstream answered with an error.
    #[error("{method}: {message}")]
    Upstream { method: String, message: String },
    /// The request did not complete.
    #[error("{method}: {message}")]
    Transport { method: String, message: String },
    /// The configured API URL, or a method's URL built from it, is not a URL.
    #[error("{method}: {source}")]
    Url {
        method: String,
        #[source]
        source: url::ParseError,
    },
    /// A page did not advance (repeated cursor, or a page of ids already seen).
    #[error("{method}: pagination stalled: {message}")]
    Stalled { method: String, message: String },
    /// A listing ran past `--max-pages`.
    #[error("{method}: {message}")]
    TooManyPages { method: String, message: String },
    /// An answer larger than `--max-response-bytes`.
    #[error("{method}: {message}")]
    TooLarge { method: String, message: String },
    /// A request that did not complete within `--request-timeout`.
    #[error("{method}: {message}")]
    TimedOut { method: String, message: String },
    /// The source's turn (its share of the pass deadline) ended while a request was in flight.
    #[error("{method}: {message}")]
    OutOfTime { method: String, message: String },
    #[error(transparent)]
    Throttled(#[from] Throttled),
    /// The HTTP client could not be built.
    #[error("client: {0}")]
    Client(#[source] UpstreamError),
}

impl KindError {
    /// Whether the source must stop here (cursor saved) rather than count a scope error: its
    /// turn ended, or a wait would have outlasted it.
    pub fn stops_pass(&self) -> bool {
        matches!(
            self,
            Self::Throttled(Throttled::Deadline { .. }) | Self::OutOfTime { .. }
        )
    }

    /// The request in flight was cut off by the end of the source's turn.
    pub fn cut_off(&self) -> bool {
        matches!(self, Self::OutOfTime { .. })
    }

    /// The `Ready=False` reason when this error ends a source's enumeration.
    pub fn enumeration_reason(&self) -> &'static str {
        match self {
            Self::Auth { .. } => "UpstreamAuthFailed",
            Self::TooLarge { .. } => "ResponseTooLarge",
            Self::TimedOut { .. } => "RequestTimedOut",
            Self::TooManyPages { .. } => "TooManyPages",
            Self::OutOfTime { .. } | Self::Throttled(Throttled::Deadline { .. }) => {
                "DeadlineExceeded"
            }
            _ => "EnumerationFailed",
        }
    }
}

/// A registered upstream kind.
pub trait Kind: Send + Sync {
    /// Every current scope, sorted by id. An error means the enumeration is incomplete.
    fn enumerate(&self) -> BoxFuture<'_, Result<Vec<Scope>, KindError>>;
    /// The scope named by a `--scope` argument (a scope id such as `channel/C1`).
    fn scope(&self, id: &str) -> Option<Scope>;
    /// The scope's whole membership; never a partial list.
    fn fetch<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Fetched, KindError>>;
    /// Edges from the scope's object to other objects of this source.
    fn links<'a>(&'a self, scope: &'a Scope) -> BoxFuture<'a, Result<Vec<Link>, KindError>>;
    /// Cross-resource edge sets (empty for kinds without any).
    fn cross(&self) -> BoxFuture<'_, Result<Vec<CrossSet>, KindError>>;
    /// Throttle responses seen so far.
    fn throttles(&self) -> u64;
    /// Every object type this kind writes (scope objects and cross-resource objects), for the
    /// reap scan.
    fn object_types(&self) -> &'static [&'static str];
}

/// Every object type any registered kind writes. A deleted source's cleanup covers them all, so
/// relationships written before its `spec.kind` was changed go too.
pub fn all_object_types() -> impl Iterator<Item = &'static str> {
    slack::OBJECT_TYPES
        .iter()
        .chain(onepassword::OBJECT_TYPES)
        .copied()
}

/// The relations kbind writes on an object type; no other relation is ever diffed or deleted.
pub fn relations(object_type: &str) -> &'static [&'static str] {
    match object_type {
        slack::CHANNEL => &["member", "workspace"],
        _ => &["member"],
    }
}

/// `spec.config.join`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JoinConfig {
    /// Only `email`.
    #[serde(default = "email")]
    pub by: String,
    #[serde(default)]
    pub directory: Option<DirectoryRef>,
}

impl Default for JoinConfig {
    fn default() -> Self {
        Self {
            by: email(),
            directory: None,
        }
    }
}

fn email() -> String {
    "email".into()
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DirectoryRef {
    pub config_map_ref: ConfigMapKey,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMapKey {
    pub name: String,
    pub key: String,
}

/// A kind's parsed configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum KindConfig {
    Slack(slack::Config),
    OnePassword(onepassword::Config),
}

/// Why a source's kind or config was refused (Ready=False).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("kind {0:?} is not registered (known kinds: slack, onepassword)")]
    UnknownKind(String),
    #[error("spec.config for kind {kind}: {message}")]
    Invalid { kind: String, message: String },
    #[error("kind {0} needs spec.baseURL (its service has no fixed address)")]
    BaseUrlRequired(String),
}

impl ConfigError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::UnknownKind(_) => "UnknownKind",
            Self::Invalid { .. } => "InvalidConfig",
            Self::BaseUrlRequired(_) => "BaseURLRequired",
        }
    }
}

impl KindConfig {
    /// Parse `spec.config` for `kind`; unknown keys are refused by name.
    pub fn parse(
        kind: &str,
        config: Option<&Value>,
        base_url: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let value = config
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        let invalid = |e: serde_json::Error| ConfigError::Invalid {
            kind: kind.to_string(),
            message: e.to_string(),
        };
        let cfg = match kind {
            "slack" => Self::Slack(serde_json::from_value(value).map_err(invalid)?),
            "onepassword" => {
                if base_url.is_none_or(|u| u.trim().is_empty()) {
                    return Err(ConfigError::BaseUrlRequired(kind.to_string()));
                }
                Self::OnePassword(serde_json::from_value(value).map_err(invalid)?)
            }
            other => return Err(ConfigError::UnknownKind(other.to_string())),
        };
        let join = cfg.join();
        if join.by != "email" {
            return Err(ConfigError::Invalid {
                kind: kind.to_string(),
                message: format!("join.by {:?} is not supported (only \"email\")", join.by),
            });
        }
        Ok(cfg)
    }

    /// Where this kind sends the credential when that is not `spec.baseURL` — an operator-set
    /// endpoint — and its name for messages. The credential's allowedHosts, when it has any,
    /// must admit it (docs/relsync.md "One source, one pass").
    pub fn fixed_endpoint<'a>(&self, upstreams: &'a Upstreams) -> Option<(&'a str, &'static str)> {
        match self {
            Self::Slack(_) => Some((
                upstreams.slack_api_url.as_str(),
                "the Slack API URL (--slack-api-url)",
            )),
            Self::OnePassword(_) => None,
        }
    }

    pub fn join(&self) -> &JoinConfig {
        match self {
            Self::Slack(c) => &c.join,
            Self::OnePassword(c) => &c.join,
        }
    }
}

/// Operator-level settings every kind may need.
#[derive(Clone, Debug)]
pub struct Upstreams {
    /// Slack Web API root (`--slack-api-url`).
    pub slack_api_url: String,
    /// `--pace` and the (test-only) multiplier on published rate limits.
    pub rate: Rate,
    /// `--max-response-bytes`, `--request-timeout`, `--max-pages`.
    pub limits: Limits,
}

/// Build the kind for a source whose config parsed and whose credential was admitted; its
/// requests end with `turn`.
pub fn build(
    config: &KindConfig,
    cred: &Credential,
    upstreams: &Upstreams,
    turn: Arc<Turn>,
) -> Result<Box<dyn Kind>, KindError> {
    let limits = upstreams.limits;
    // The whole request is bounded by `get_json`; the client's own timeouts only end a dead
    // connection early.
    let http = upstream::client(limits.request_timeout).map_err(KindError::Client)?;
    let http = |tiers, default_per_min| Http {
        client: http,
        pacer: Pacer::new(tiers, default_per_min, upstreams.rate, turn),
        token: cred.token.clone(),
        limits,
    };
    Ok(match config {
        KindConfig::Slack(c) => Box::new(slack::Slack::new(
            c.clone(),
            http(slack::tiers(), 20),
            &upstreams.slack_api_url,
        )?),
        KindConfig::OnePassword(c) => {
            let base = cred.base_url.as_ref().ok_or_else(|| KindError::Upstream {
                method: "config".into(),
                message: "baseURL required".into(),
            })?;
            // No published limit ("fair use"): a modest default pace.
            Box::new(onepassword::OnePassword::new(
                c.clone(),
                http(HashMap::new(), 600),
                base.url.clone(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_table() {
        let ok = KindConfig::parse(
            "slack",
            Some(
                &json!({"types": ["public_channel"], "usergroups": true, "join": {"by": "email"}}),
            ),
            None,
        );
        assert!(matches!(ok, Ok(KindConfig::Slack(_))), "{ok:?}");
        assert!(matches!(
            KindConfig::parse("slack", None, None),
            Ok(KindConfig::Slack(_))
        ));
        let unknown_key = KindConfig::parse("slack", Some(&json!({"channelz": true})), None);
        match unknown_key {
            Err(e @ ConfigError::Invalid { .. }) => {
                assert!(e.to_string().contains("channelz"), "{e}");
                assert_eq!(e.reason(), "InvalidConfig");
            }
            other => panic!("{other:?}"),
        }
        let nested = KindConfig::parse(
            "slack",
            Some(&json!({"join": {"by": "email", "dir": {}}})),
            None,
        );
        assert!(nested.unwrap_err().to_string().contains("dir"));
        assert_eq!(
            KindConfig::parse("slack", Some(&json!({"join": {"by": "name"}})), None)
                .unwrap_err()
                .reason(),
            "InvalidConfig"
        );
        assert_eq!(
            KindConfig::parse("github", None, None).unwrap_err(),
            ConfigError::UnknownKind("github".into())
        );
        assert_eq!(
            KindConfig::parse("onepassword", None, None)
                .unwrap_err()
                .reason(),
            "BaseURLRequired"
        );
        assert!(KindConfig::parse("onepassword", None, Some("https://scim.example.com")).is_ok());
    }
}
