//! [`HttpStore`]: the SpiceDB HTTP gateway client — requests, read streams, bounded answers,
//! retries of transient failures — and the gateway's JSON shapes.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    Collect, DELETE_LIMIT, Filter, MAX_UPDATES, Op, Rel, RelRef, RelationshipStore, SpiceError,
};
use crate::pass::backoff::Backoff;
use crate::pass::lock;
use crate::relsync::auth::Token;
use crate::relsync::limits::DEFAULT_MAX_RESPONSE_BYTES;
use crate::upstream::{self, Lines, UpstreamError, read_capped};

/// Retries of a transient failure. Every call retried here is safe to repeat: reads, writes
/// made only of TOUCH and DELETE, and deletes by filter, which leave the same state however
/// often they land.
const RETRIES: u32 = 3;

/// The waits between them: from 200 ms, doubling, jittered (see `pass::backoff`).
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_millis(800));

/// `call`, again after a transient failure, unless the wait would pass `ends`.
async fn with_retries<T, F, Fut>(ends: Option<Instant>, mut call: F) -> Result<T, SpiceError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SpiceError>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(e) if e.transient() && attempt < RETRIES => {
                let Some(wait) = BACKOFF.within(attempt, None, ends.map(Instant::into_std)) else {
                    return Err(e);
                };
                tracing::debug!(error = %e, attempt, "SpiceDB: transient failure; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The HTTP gateway client.
#[derive(Clone)]
pub struct HttpStore {
    http: reqwest::Client,
    base: String,
    token: Token,
    request_timeout: Duration,
    max_bytes: u64,
    /// Nothing of this store outlives this instant (the pass's end).
    ends: Option<Instant>,
}

fn rel_json(r: &Rel) -> Value {
    json!({
        "resource": {"objectType": r.resource.kind, "objectId": r.resource.id},
        "relation": r.relation,
        "subject": {"object": {"objectType": r.subject.kind, "objectId": r.subject.id}},
    })
}

/// One line of a read stream, decoded without building a JSON tree: strings borrow from the
/// line unless they carry escapes.
#[derive(Deserialize)]
struct WireLine<'a> {
    #[serde(borrow, default)]
    result: Option<WireResult<'a>>,
    #[serde(default)]
    error: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct WireResult<'a> {
    /// ReadRelationships: one per line.
    #[serde(borrow, default)]
    relationship: Option<WireRel<'a>>,
    /// Bulk export: a page per line.
    #[serde(borrow, default)]
    relationships: Option<Vec<WireRel<'a>>>,
}

#[derive(Deserialize)]
struct WireRel<'a> {
    #[serde(borrow)]
    resource: WireObj<'a>,
    #[serde(borrow)]
    relation: Cow<'a, str>,
    #[serde(borrow)]
    subject: WireSubject<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireObj<'a> {
    #[serde(borrow)]
    object_type: Cow<'a, str>,
    #[serde(borrow)]
    object_id: Cow<'a, str>,
}

#[derive(Deserialize)]
struct WireSubject<'a> {
    #[serde(borrow)]
    object: WireObj<'a>,
}

impl WireRel<'_> {
    fn as_ref(&self) -> RelRef<'_> {
        RelRef {
            resource_type: &self.resource.object_type,
            resource_id: &self.resource.object_id,
            relation: &self.relation,
            subject_type: &self.subject.object.object_type,
            subject_id: &self.subject.object.object_id,
        }
    }
}

/// Decode one stream line into `into`; a blank line is nothing.
fn parse_line<C: Collect + ?Sized>(line: &[u8], into: &mut C) -> Result<(), SpiceError> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(());
    }
    let v: WireLine<'_> = serde_json::from_slice(line).map_err(SpiceError::Undecodable)?;
    if let Some(err) = v.error {
        return Err(SpiceError::Stream(body_message(err.get())));
    }
    match v.result {
        Some(WireResult {
            relationship: Some(r),
            ..
        }) => into.push(r.as_ref()),
        Some(WireResult {
            relationships: Some(page),
            ..
        }) => page.iter().for_each(|r| into.push(r.as_ref())),
        _ => return Err(SpiceError::Stream("line without a relationship".into())),
    }
    Ok(())
}

/// What one DeleteRelationships answer says: (relationships deleted, whether more match).
/// `relationshipsDeletedCount` is a uint64, which the gateway writes as a string, and leaves out
/// when zero; a partial deletion always reached the limit, so a server too old to report the
/// count is taken to have deleted that many. A partial answer that deleted nothing would loop
/// forever: it is an error.
fn parse_delete(v: &Value) -> Result<(u64, bool), SpiceError> {
    let partial =
        v.get("deletionProgress").and_then(Value::as_str) == Some("DELETION_PROGRESS_PARTIAL");
    let count = match v.get("relationshipsDeletedCount") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<u64>()
                .map_err(|_| SpiceError::Delete(format!("undecodable count {s:?}")))?,
        ),
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .ok_or_else(|| SpiceError::Delete(format!("undecodable count {n}")))?,
        ),
        Some(other) => {
            return Err(SpiceError::Delete(format!(
                "undecodable count {}",
                crate::scrub::scrub_bounded(&other.to_string(), 40)
            )));
        }
    };
    let n = count.unwrap_or(if partial { u64::from(DELETE_LIMIT) } else { 0 });
    if partial && n == 0 {
        return Err(SpiceError::Delete(
            "a partial deletion that deleted nothing".into(),
        ));
    }
    Ok((n, partial))
}

/// Shorten an error body for a message (it may quote our request): scrubbed before the cut, as a
/// cut could split what the scrub looks for.
fn body_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| crate::scrub::scrub_bounded(body.trim(), 300))
}

impl HttpStore {
    /// `base` is the gateway URL (e.g. `http://127.0.0.1:8443`); `token` the preshared key.
    pub fn new(base: &str, token: Token) -> Result<Self, SpiceError> {
        Self::with_limits(
            base,
            token,
            Duration::from_secs(60),
            DEFAULT_MAX_RESPONSE_BYTES,
        )
    }

    /// [`HttpStore::new`] with the pass's bounds: a request completes within `request_timeout`
    /// (a read stream may go on for longer, but never stalls that long), and an answer — or one
    /// line of a stream — is at most `max_bytes`.
    pub fn with_limits(
        base: &str,
        token: Token,
        request_timeout: Duration,
        max_bytes: u64,
    ) -> Result<Self, SpiceError> {
        let http = upstream::client(request_timeout).map_err(SpiceError::Client)?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
            request_timeout,
            max_bytes,
            ends: None,
        })
    }

    /// Nothing of this store — request, stream, wait — outlives `ends`.
    pub fn ending_at(mut self, ends: std::time::Instant) -> Self {
        self.ends = Some(Instant::from_std(ends));
        self
    }

    /// `fut`, cut off at the store's end.
    async fn by_end<T>(
        &self,
        what: &'static str,
        fut: impl Future<Output = Result<T, SpiceError>>,
    ) -> Result<T, SpiceError> {
        match self.ends {
            Some(end) => tokio::time::timeout_at(end, fut)
                .await
                .unwrap_or(Err(SpiceError::Deadline(what))),
            None => fut.await,
        }
    }

    /// Send a POST; an error status becomes [`SpiceError::Http`] with the answer's (bounded)
    /// message.
    async fn send(
        &self,
        what: &'static str,
        path: &str,
        body: &Value,
    ) -> Result<reqwest::Response, SpiceError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.token.expose())
            .json(body)
            .send()
            .await
            .map_err(|source| SpiceError::Send { what, source })?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let message = match read_capped(resp, self.max_bytes).await {
                Ok(b) => body_message(&String::from_utf8_lossy(&b)),
                Err(UpstreamError::TooLarge { .. }) => "(an error answer too large to read)".into(),
                Err(e) => e.to_string(),
            };
            return Err(SpiceError::Http {
                what,
                status,
                message,
            });
        }
        Ok(resp)
    }

    /// POST and read the whole (bounded) answer within `--request-timeout` and the store's end.
    async fn post(
        &self,
        what: &'static str,
        path: &str,
        body: &Value,
    ) -> Result<Vec<u8>, SpiceError> {
        let call = async {
            let resp = self.send(what, path, body).await?;
            read_capped(resp, self.max_bytes)
                .await
                .map_err(|e| match e {
                    UpstreamError::TooLarge { cap } => SpiceError::TooLarge { what, cap },
                    source => SpiceError::Read { what, source },
                })
        };
        let timeout = self.request_timeout;
        self.by_end(what, async {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(SpiceError::TimedOut { what, timeout }))
        })
        .await
    }

    /// Write a schema (tests, demo, benchmark).
    pub async fn write_schema(&self, schema: &str) -> Result<(), SpiceError> {
        self.post(
            "schema write",
            "/v1/schema/write",
            &json!({ "schema": schema }),
        )
        .await
        .map(|_| ())
    }

    /// POST and parse a newline-delimited stream into `into`; each line's `result` holds one
    /// relationship (ReadRelationships) or a page of them (bulk export). An in-band
    /// `{"error": …}` fails the whole read.
    async fn stream<C: Collect>(
        &self,
        what: &'static str,
        path: &str,
        body: &Value,
        into: &Mutex<&mut C>,
    ) -> Result<(), SpiceError> {
        self.by_end(what, self.stream_unbounded(what, path, body, into))
            .await
    }

    /// [`HttpStore::stream`] without the store's end: the stream may run as long as it keeps
    /// moving; each line is at most `--max-response-bytes`. Lines are decoded as they arrive
    /// (borrowing from the line, no JSON tree), so a read costs what `into` keeps of it.
    async fn stream_unbounded<C: Collect>(
        &self,
        what: &'static str,
        path: &str,
        body: &Value,
        into: &Mutex<&mut C>,
    ) -> Result<(), SpiceError> {
        let timeout = self.request_timeout;
        let mut resp = tokio::time::timeout(timeout, self.send(what, path, body))
            .await
            .unwrap_or(Err(SpiceError::TimedOut { what, timeout }))?;
        let mut lines = Lines::new(self.max_bytes);
        loop {
            let chunk = resp.chunk().await.map_err(SpiceError::Cut)?;
            let Some(chunk) = chunk else { break };
            let done = lines.push(&chunk).map_err(|_| SpiceError::TooLarge {
                what,
                cap: self.max_bytes,
            })?;
            let mut into = lock(into);
            for line in done {
                parse_line(&line, &mut **into)?;
            }
        }
        parse_line(&lines.finish(), &mut **lock(into))
    }

    /// A fully consistent read of every relationship matching `filter` (sent as `filter_field`)
    /// from one of the gateway's streaming endpoints, again from the start after a transient
    /// failure.
    async fn read_stream<C: Collect>(
        &self,
        what: &'static str,
        path: &str,
        filter_field: &str,
        filter: &Filter,
        into: &mut C,
    ) -> Result<(), SpiceError> {
        let mut body = json!({ "consistency": {"fullyConsistent": true} });
        body[filter_field] = filter.to_json();
        let into = Mutex::new(into);
        with_retries(self.ends, || async {
            lock(&into).restart();
            self.stream(what, path, &body, &into).await
        })
        .await
    }

    /// Read the schema: a cheap call that proves the gateway is reachable and the key accepted.
    pub async fn ping(&self) -> Result<(), SpiceError> {
        let empty = json!({});
        match with_retries(self.ends, || {
            self.post("schema read", "/v1/schema/read", &empty)
        })
        .await
        {
            Ok(_) => Ok(()),
            // No schema yet is still a reachable, authenticated server.
            Err(SpiceError::Http { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl RelationshipStore for HttpStore {
    async fn read(&self, filter: &Filter) -> Result<Vec<Rel>, SpiceError> {
        let mut out = Vec::new();
        self.read_stream(
            "read",
            "/v1/relationships/read",
            "relationshipFilter",
            filter,
            &mut out,
        )
        .await?;
        Ok(out)
    }

    /// Bulk export streams pages of up to 10,000 relationships: several times faster than
    /// ReadRelationships for a whole source.
    async fn read_bulk<C: Collect>(&self, filter: &Filter, into: &mut C) -> Result<(), SpiceError> {
        self.read_stream(
            "export",
            "/v1/relationships/exportbulk",
            "optionalRelationshipFilter",
            filter,
            into,
        )
        .await
    }

    async fn write(&self, updates: &[(Op, Rel)]) -> Result<(), SpiceError> {
        if updates.len() > MAX_UPDATES {
            return Err(SpiceError::TooManyUpdates(updates.len()));
        }
        if updates.is_empty() {
            return Ok(());
        }
        let ups: Vec<Value> = updates
            .iter()
            .map(|(op, r)| {
                json!({
                    "operation": match op { Op::Touch => "OPERATION_TOUCH", Op::Delete => "OPERATION_DELETE" },
                    "relationship": rel_json(r),
                })
            })
            .collect();
        let body = json!({ "updates": ups });
        with_retries(self.ends, || {
            self.post("write", "/v1/relationships/write", &body)
        })
        .await
        .map(|_| ())
    }

    async fn delete(&self, filter: &Filter) -> Result<u64, SpiceError> {
        // A filter naming no object (nor a prefix) would delete a whole object type: every
        // source's relationships. kbind never means that.
        if filter.resource_id.as_deref().is_none_or(str::is_empty)
            && filter
                .resource_id_prefix
                .as_deref()
                .is_none_or(str::is_empty)
        {
            return Err(SpiceError::Delete(format!(
                "refusing to delete every {} relationship: the filter names no object or prefix",
                filter.resource_type
            )));
        }
        let body = json!({
            "relationshipFilter": filter.to_json(),
            "optionalLimit": DELETE_LIMIT,
            "optionalAllowPartialDeletions": true,
        });
        let mut total = 0u64;
        loop {
            let answer = with_retries(self.ends, || async {
                let bytes = self
                    .post("delete", "/v1/relationships/delete", &body)
                    .await?;
                serde_json::from_slice::<Value>(&bytes).map_err(|source| SpiceError::Decode {
                    what: "delete",
                    source,
                })
            })
            .await?;
            let (n, partial) = parse_delete(&answer)?;
            total = total.saturating_add(n);
            if !partial {
                return Ok(total);
            }
        }
    }
}

#[cfg(test)]
mod tests;
