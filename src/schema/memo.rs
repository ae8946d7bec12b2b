//! What one pass learned about each provider credential (its client, cluster identity and
//! discovered exports), shared by the Connections using it and dropped after the last of them:
//! with a credential per Connection, memory stays with one Connection's exports instead of
//! growing with Connections × exports (docs/performance.md).

use std::collections::{BTreeSet, HashMap};

use kube::Client;

use super::plan::{Discovered, DiscoveryError};
use crate::api::core::{SchemaSource, SecretKeyRef};
use crate::connection::{self, IdentityError};
use crate::discovery;

/// A Connection's Secret: (namespace, name, key).
type SecretKey = (String, String, String);

fn secret_key(r: &SecretKeyRef) -> SecretKey {
    (r.namespace.clone(), r.name.clone(), r.key.clone())
}

/// The memos of one pass, by kubeconfig fingerprint.
#[derive(Default)]
pub(super) struct Providers {
    memos: HashMap<String, ProviderMemo>,
    /// Connections still to be reconciled this pass, per Secret they name.
    pending: HashMap<SecretKey, usize>,
    /// The Secrets seen holding each fingerprint (two Secrets may hold one kubeconfig).
    holders: HashMap<String, BTreeSet<SecretKey>>,
}

impl Providers {
    /// The Secrets the Connections of this pass's order name, one entry per Connection.
    pub(super) fn expect<'a>(&mut self, secrets: impl IntoIterator<Item = &'a SecretKeyRef>) {
        for r in secrets {
            *self.pending.entry(secret_key(r)).or_default() += 1;
        }
    }

    /// The memo of the credential with `fingerprint`, read from `secret`.
    pub(super) fn entry(&mut self, fingerprint: &str, secret: &SecretKeyRef) -> &mut ProviderMemo {
        self.holders
            .entry(fingerprint.to_string())
            .or_default()
            .insert(secret_key(secret));
        self.memos.entry(fingerprint.to_string()).or_default()
    }

    /// One Connection naming `secret` is done: drop every memo no Connection still to come
    /// names a holder of. (A later Connection whose Secret was not seen yet but holds the same
    /// kubeconfig reads it again: a cost, never a wrong answer.)
    pub(super) fn done(&mut self, secret: &SecretKeyRef) {
        if let Some(n) = self.pending.get_mut(&secret_key(secret)) {
            *n = n.saturating_sub(1);
        }
        let pending = &self.pending;
        let finished: Vec<String> = self
            .holders
            .iter()
            .filter(|(_, held_by)| {
                held_by
                    .iter()
                    .all(|s| pending.get(s).is_none_or(|n| *n == 0))
            })
            .map(|(f, _)| f.clone())
            .collect();
        for f in finished {
            self.holders.remove(&f);
            self.memos.remove(&f);
        }
    }

    /// How many credentials' memos are held (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.memos.len()
    }
}

/// What one pass learned about a provider, shared by the Connections using the same credential.
#[derive(Default)]
pub(super) struct ProviderMemo {
    pub(super) client: Option<Client>,
    identity: Option<Result<String, IdentityError>>,
    discovery: HashMap<SchemaSource, Result<Discovered, DiscoveryError>>,
}

impl ProviderMemo {
    /// The provider's cluster identity, read once per credential and pass.
    pub(super) async fn identity(&mut self, p: &Client) -> Option<Result<String, IdentityError>> {
        self.client = Some(p.clone());
        if self.identity.is_none() {
            self.identity = Some(connection::cluster_uid(p).await);
        }
        self.identity.clone()
    }

    /// What the provider exports from `source`, discovered once per credential and pass.
    pub(super) async fn discover(
        &mut self,
        p: &Client,
        source: SchemaSource,
    ) -> Result<Discovered, DiscoveryError> {
        match self.discovery.get(&source) {
            Some(d) => d.clone(),
            None => {
                let d = discovery::discover(p, source).await;
                self.discovery.insert(source, d.clone());
                d
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str) -> SecretKeyRef {
        SecretKeyRef {
            namespace: "kbind-system".into(),
            name: name.into(),
            key: "kubeconfig".into(),
        }
    }

    #[test]
    fn a_memo_lives_until_the_last_connection_naming_its_secrets() {
        let (a, b, c) = (r("a"), r("b"), r("c"));
        let mut p = Providers::default();
        // Order: a, b, a, c; b holds the same kubeconfig as a.
        p.expect([&a, &b, &a, &c]);
        p.entry("fp-ab", &a);
        p.done(&a);
        assert_eq!(p.held(), 1, "a is named again");
        p.entry("fp-ab", &b);
        p.done(&b);
        assert_eq!(
            p.held(),
            1,
            "a, holding the same kubeconfig, is still to come"
        );
        p.entry("fp-ab", &a);
        p.done(&a);
        assert_eq!(p.held(), 0);
        p.entry("fp-c", &c);
        p.done(&c);
        assert_eq!(p.held(), 0);
    }
}
