//! Pinning a Grant's consumer cluster from its heartbeats (docs/issue.md "Confinement"): a
//! recorded pin is kept; else the oldest fresh heartbeat's UID, if no other Grant has pinned it
//! (which no approval overrides) and no provider object carries it (any object, those handed over
//! to this Grant included), unless a person approved that UID on the Grant.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{Heartbeat, Pin};
use crate::api::keys;
use crate::issue::render::GrantRef;

/// A cluster UID as the heartbeat Lease name carries it: a label value with no character that
/// could leave a CEL string literal.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 63
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && uid.as_bytes()[0].is_ascii_alphanumeric()
        && uid.as_bytes()[uid.len() - 1].is_ascii_alphanumeric()
}

/// Who holds provider objects carrying a consumer cluster UID (docs/issue.md "Confinement").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The one Grant holding where they live.
    Grant(String),
    /// No Grant alone: left by a revoked Grant, or of a shared cluster-scoped API.
    Nobody,
    /// The issuer could not look (a LIST refused or failed).
    Unchecked,
}

/// Per UID, who holds the provider objects carrying it, each with one such object
/// (`<api> <ns>/<name>`; for [`Holder::Unchecked`], what could not be listed and why).
pub type InUse = BTreeMap<String, Vec<(Holder, String)>>;

/// What the pin of one Grant is decided from.
pub struct PinInputs<'a> {
    pub grant: &'a str,
    /// `status.consumerCluster`.
    pub recorded: Option<&'a str>,
    pub leases: &'a [Heartbeat],
    /// UIDs pinned by other Grants, to the Grant holding each.
    pub others: &'a BTreeMap<String, String>,
    pub in_use: &'a InUse,
    /// The Grant's `iam.kbind.io/approve-consumer-cluster` annotation.
    pub approved: Option<&'a str>,
}

/// The pin: kept once recorded; else the oldest heartbeat Lease of this Grant naming a UID no
/// other Grant holds and no provider object carries, unless a person approved it (trust on
/// first use, docs/issue.md "Confinement"). Objects anywhere count, a revoked Grant's left
/// where no Grant holds them and those handed over to this Grant too: pinned, the consumer
/// would write them, and read them once its Grant is given their place, with no hand-over to
/// approve.
pub fn pin(i: &PinInputs<'_>) -> Pin {
    if let Some(uid) = i.recorded.filter(|u| valid_uid(u)) {
        return Pin::Pinned {
            uid: uid.to_string(),
            new: false,
        };
    }
    let mut leases = i.leases.to_vec();
    leases.sort();
    let mut refused = None;
    for h in &leases {
        let Some(uid) = h.uid(i.grant) else {
            continue;
        };
        if let Some(by) = i.others.get(uid) {
            refused.get_or_insert(Pin::Taken {
                uid: uid.to_string(),
                by: by.clone(),
            });
            continue;
        }
        // Any object carrying it: before its pin a Grant's identity writes nothing, so none
        // is this Grant's doing, wherever it is. An object found says more than a LIST that
        // failed (the approval must not look like one for a glitch).
        let theirs = i.in_use.get(uid).and_then(|v| {
            v.iter()
                .find(|(h, _)| *h != Holder::Unchecked)
                .or_else(|| v.first())
        });
        if let Some((holder, example)) = theirs.filter(|_| i.approved != Some(uid)) {
            let why = match holder {
                Holder::Grant(g) if g == i.grant => format!(
                    "its objects already exist on the provider (such as {example}, handed over to this Grant, which wrote none of them: it writes nothing before its pin)"
                ),
                Holder::Grant(g) => format!(
                    "its objects already exist on the provider (such as {example}, of Grant {g})"
                ),
                Holder::Nobody => format!(
                    "its objects already exist on the provider (such as {example}, which no Grant holds alone)"
                ),
                Holder::Unchecked => {
                    format!("the issuer could not look for its objects ({example})")
                }
            };
            refused.get_or_insert(Pin::NeedsApproval {
                uid: uid.to_string(),
                why,
            });
            continue;
        }
        return Pin::Pinned {
            uid: uid.to_string(),
            new: true,
        };
    }
    refused.unwrap_or(Pin::Waiting)
}

/// Whether a heartbeat was written before its Grant existed: for an earlier Grant of the same
/// name (revoked, or removed by hand), perhaps by whoever held that one's kubeconfig. It pins
/// nothing, and the issuer deletes it so the consumer's next heartbeat writes a fresh one
/// (docs/issue.md "Confinement").
pub fn stale(h: &Heartbeat, grant_created: Option<Timestamp>) -> bool {
    // Strictly older: timestamps are whole seconds, and a heartbeat in its Grant's second is
    // the new consumer's (a holder of the earlier Grant's token has none that works any more:
    // revocation deletes the ServiceAccount first, and one the earlier Grant owns is replaced).
    grant_created.is_some_and(|g| h.created < g)
}

/// The UIDs an unpinned Grant's heartbeats name: what the issuer checks provider objects for.
pub fn candidates(grant: GrantRef<'_>, leases: &[Heartbeat]) -> Vec<String> {
    leases
        .iter()
        .filter(|h| !stale(h, grant.created))
        .filter_map(|h| h.uid(grant.name).map(String::from))
        .collect()
}

/// The label selector of provider objects carrying `uid`.
pub fn labelled_with(uid: &str) -> String {
    format!("{}={uid}", keys::CONSUMER_CLUSTER)
}
