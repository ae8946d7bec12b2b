//! SpiceDB over its HTTP gateway (`/v1/relationships/read|write|delete`), behind
//! [`RelationshipStore`] so a gRPC backend can be added without touching the pass.
//!
//! Hazards handled here: the gateway silently drops unknown JSON fields, so a misspelt filter
//! field would *widen* a read (the field names are pinned by a test); a read is a
//! newline-delimited stream whose failure can arrive in-band after HTTP 200; a write takes at
//! most 1000 updates and refuses two updates of one relationship; a delete by filter without an
//! object id or prefix would take every source's relationships of that type, so it is refused.
//!
//! Bounded (docs/relsync.md "Bounds"): an answer is read only up to `--max-response-bytes`, and
//! a read stream line by line, each line within that cap (a stream is not one body); a request
//! completes within `--request-timeout` (a stream: each stall); nothing — request, stream or
//! wait before a retry — outlives the pass's end.

mod http;

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};

use crate::upstream::{self, UpstreamError, show_bytes};

pub use http::HttpStore;

/// SpiceDB's default (and advisory) cap on updates per WriteRelationships call.
pub const MAX_UPDATES: usize = 1000;

/// Relationships one DeleteRelationships call deletes at most: SpiceDB's default
/// `--max-delete-relationships-limit`. A larger match is deleted in several calls, each its own
/// transaction.
pub const DELETE_LIMIT: u32 = 1000;

/// An object reference `type:id`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Obj {
    pub kind: String,
    pub id: String,
}

impl Obj {
    pub fn new(kind: &str, id: impl Into<String>) -> Self {
        Self {
            kind: kind.to_string(),
            id: id.into(),
        }
    }
}

/// `resource#relation@subject` (subjects are whole objects; kbind writes no subject relations).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rel {
    pub resource: Obj,
    pub relation: String,
    pub subject: Obj,
}

impl std::fmt::Display for Rel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}#{}@{}:{}",
            self.resource.kind, self.resource.id, self.relation, self.subject.kind, self.subject.id
        )
    }
}

/// A relationship as one line of a read stream spells it, borrowed from that line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelRef<'a> {
    pub resource_type: &'a str,
    pub resource_id: &'a str,
    pub relation: &'a str,
    pub subject_type: &'a str,
    pub subject_id: &'a str,
}

impl<'a> From<&'a Rel> for RelRef<'a> {
    fn from(r: &'a Rel) -> Self {
        Self {
            resource_type: &r.resource.kind,
            resource_id: &r.resource.id,
            relation: &r.relation,
            subject_type: &r.subject.kind,
            subject_id: &r.subject.id,
        }
    }
}

impl From<RelRef<'_>> for Rel {
    fn from(r: RelRef<'_>) -> Self {
        Self {
            resource: Obj::new(r.resource_type, r.resource_id),
            relation: r.relation.to_string(),
            subject: Obj::new(r.subject_type, r.subject_id),
        }
    }
}

/// Where a streamed read puts each relationship as it arrives, so a large read is never held
/// as a list first (see `relsync::held`).
pub trait Collect: Send {
    /// A retry reads from the start again: forget what the broken attempt delivered.
    fn restart(&mut self);
    fn push(&mut self, rel: RelRef<'_>);
}

impl Collect for Vec<Rel> {
    fn restart(&mut self) {
        self.clear();
    }

    fn push(&mut self, rel: RelRef<'_>) {
        Vec::push(self, rel.into());
    }
}

/// TOUCH (upsert) or DELETE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Touch,
    Delete,
}

/// A ReadRelationships filter: one resource type, optionally one object id or an id prefix,
/// optionally one relation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub resource_type: String,
    pub resource_id: Option<String>,
    pub resource_id_prefix: Option<String>,
    pub relation: Option<String>,
}

impl Filter {
    /// The gateway's JSON. Field names are exactly the proto's: a typo would be dropped by the
    /// gateway and widen the filter.
    pub fn to_json(&self) -> Value {
        let mut f = json!({ "resourceType": self.resource_type });
        if let Some(id) = &self.resource_id {
            f["optionalResourceId"] = json!(id);
        }
        if let Some(p) = &self.resource_id_prefix {
            f["optionalResourceIdPrefix"] = json!(p);
        }
        if let Some(r) = &self.relation {
            f["optionalRelation"] = json!(r);
        }
        f
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpiceError {
    #[error("SpiceDB {what}: HTTP {status}: {message}")]
    Http {
        what: &'static str,
        status: u16,
        message: String,
    },
    /// The request did not get an answer (connection refused, reset, stalled). Error texts may
    /// name the gateway's URL: scrubbed where printed, as every `SpiceError`.
    #[error("SpiceDB {what}: {source}")]
    Send {
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
    /// The answer's body broke off.
    #[error("SpiceDB {what}: {source}")]
    Read {
        what: &'static str,
        #[source]
        source: UpstreamError,
    },
    /// The answer was not the JSON the gateway sends (a proxy's page, a cut-off body).
    #[error("SpiceDB {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("SpiceDB read stream: {0}")]
    Stream(String),
    /// A line of the read stream that is not the JSON object SpiceDB documents.
    #[error("SpiceDB read stream: undecodable line: {0}")]
    Undecodable(#[source] serde_json::Error),
    /// The stream broke off mid-read (a dropped connection, a stall): worth reading again.
    #[error("SpiceDB read stream cut off: {0}")]
    Cut(#[source] reqwest::Error),
    #[error("SpiceDB write of {0} updates exceeds the {MAX_UPDATES}-update cap")]
    TooManyUpdates(usize),
    /// A DeleteRelationships answer that cannot be trusted to mean progress.
    #[error("SpiceDB delete: {0}")]
    Delete(String),
    /// An answer (or one line of a stream) past `--max-response-bytes`.
    #[error("SpiceDB {what}: the answer is larger than the {} cap (--max-response-bytes)", show_bytes(*cap))]
    TooLarge { what: &'static str, cap: u64 },
    /// A request that did not complete within `--request-timeout`.
    #[error("SpiceDB {what}: no complete answer within --request-timeout {}", crate::relsync::limits::show_duration(*timeout))]
    TimedOut {
        what: &'static str,
        timeout: Duration,
    },
    /// The pass's end came first.
    #[error("SpiceDB {0}: cut off at the pass deadline")]
    Deadline(&'static str),
    /// The HTTP client could not be built.
    #[error("SpiceDB client: {0}")]
    Client(#[source] UpstreamError),
}

impl SpiceError {
    /// A failure the same request may not meet again: the connection dropped or stalled, the
    /// stream was cut, the answer did not come in time, or the server said it was unavailable,
    /// overloaded or broken.
    fn transient(&self) -> bool {
        match self {
            Self::Send { .. }
            | Self::Read { .. }
            | Self::Decode { .. }
            | Self::Cut(_)
            | Self::TimedOut { .. } => true,
            Self::Http { status, .. } => upstream::transient(*status),
            Self::Stream(_)
            | Self::Undecodable(_)
            | Self::TooManyUpdates(_)
            | Self::Delete(_)
            | Self::TooLarge { .. }
            | Self::Deadline(_)
            | Self::Client(_) => false,
        }
    }
}

/// Where relationships are read and written.
pub trait RelationshipStore: Send + Sync {
    /// Every relationship matching `filter`, fully consistent.
    fn read(&self, filter: &Filter) -> impl Future<Output = Result<Vec<Rel>, SpiceError>> + Send;
    /// Every relationship matching `filter`, for large reads (whole sources), streamed into
    /// `into`: SpiceDB's bulk export.
    fn read_bulk<C: Collect>(
        &self,
        filter: &Filter,
        into: &mut C,
    ) -> impl Future<Output = Result<(), SpiceError>> + Send;
    /// One atomic write of at most [`MAX_UPDATES`] updates.
    fn write(&self, updates: &[(Op, Rel)]) -> impl Future<Output = Result<(), SpiceError>> + Send;
    /// Delete every relationship matching `filter` (DeleteRelationships), in transactions of at
    /// most [`DELETE_LIMIT`]; returns how many SpiceDB reports deleted.
    fn delete(&self, filter: &Filter) -> impl Future<Output = Result<u64, SpiceError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_field_names_are_the_protos() {
        let f = Filter {
            resource_type: "slack_channel".into(),
            resource_id: Some("a/b/C1".into()),
            resource_id_prefix: None,
            relation: Some("member".into()),
        };
        assert_eq!(
            f.to_json(),
            json!({"resourceType": "slack_channel", "optionalResourceId": "a/b/C1", "optionalRelation": "member"})
        );
        let p = Filter {
            resource_type: "scim_group".into(),
            resource_id_prefix: Some("a/b/".into()),
            ..Default::default()
        };
        assert_eq!(
            p.to_json(),
            json!({"resourceType": "scim_group", "optionalResourceIdPrefix": "a/b/"})
        );
    }
}
