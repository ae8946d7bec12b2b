//! Which Connections a run reconciles (docs/schema.md "Full sweeps"). With
//! `--full-sweep-every`, a run reconciles every Connection only when the last full sweep is that
//! old; runs in between reconcile only what changed since it was last reconciled, so the
//! CronJob can run every minute (a new binding is set up within a minute) while the provider
//! is asked no more often than before.

use crate::api::core::Connection;

use super::BindingView;

/// Why `conn` is reconciled in a run that reconciles only what changed; `None`: nothing it or
/// its bindings (`bindings`, of every Connection) hold changed since it was last reconciled.
/// What only the provider changes (its exports, a revoked credential) and a Secret rotated in
/// place wait for the next full sweep, as they waited for the next run before.
pub fn changed(conn: &Connection, bindings: &[BindingView]) -> Option<&'static str> {
    let name = conn.metadata.name.as_deref().unwrap_or_default();
    let observed = conn.status.as_ref().and_then(|s| s.observed_generation);
    if conn.metadata.deletion_timestamp.is_some() {
        return Some("deleting");
    }
    if !crate::pass::finalizer::has(
        conn.metadata.finalizers.as_ref(),
        crate::api::keys::CLEANUP_FINALIZER,
    ) {
        return Some("new");
    }
    if observed.is_none() || observed != conn.metadata.generation {
        return Some("spec changed");
    }
    for b in bindings.iter().filter(|b| b.connection == name) {
        if b.deleting {
            return Some("a binding is deleting");
        }
        if b.status.observed_generation.is_none() || b.status.observed_generation != b.generation {
            return Some("a binding is new or changed");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::core::{BindingStatus, ConnectionStatus};
    use serde_json::json;

    fn t(s: i64) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::from_second(s).unwrap()
    }

    fn conn(generation: i64, observed: Option<i64>, finalizer: bool, deleting: bool) -> Connection {
        let mut c: Connection = serde_json::from_value(json!({
            "metadata": {"name": "p", "generation": generation},
            "spec": {"kubeconfigSecretRef": {"name": "s", "namespace": "kbind-system", "key": "kubeconfig"}},
        }))
        .unwrap();
        if finalizer {
            c.metadata.finalizers = Some(vec![crate::api::keys::CLEANUP_FINALIZER.into()]);
        }
        if deleting {
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(5)));
        }
        c.status = Some(ConnectionStatus {
            observed_generation: observed,
            ..Default::default()
        });
        c
    }

    fn binding(
        connection: &str,
        generation: i64,
        observed: Option<i64>,
        deleting: bool,
    ) -> BindingView {
        BindingView {
            key: crate::api::BindingKey {
                namespace: None,
                name: "b".into(),
            },
            connection: connection.into(),
            apis: vec!["widgets.example.org".into()],
            generation: Some(generation),
            status: BindingStatus {
                observed_generation: observed,
                ..Default::default()
            },
            deleting,
            labels: Default::default(),
            admission: Default::default(),
        }
    }

    #[test]
    fn between_full_sweeps_only_a_connection_that_changed_or_whose_binding_did_is_reconciled() {
        let settled = conn(2, Some(2), true, false);
        let quiet = [
            binding("p", 3, Some(3), false),
            binding("other", 1, None, false),
        ];
        assert_eq!(
            changed(&settled, &quiet),
            None,
            "another Connection's new binding"
        );
        assert_eq!(changed(&settled, &[]), None);
        let cases = [
            (conn(1, None, false, false), vec![], "new"),
            (conn(2, Some(1), true, false), vec![], "spec changed"),
            (conn(2, None, true, false), vec![], "spec changed"),
            (conn(2, Some(2), true, true), vec![], "deleting"),
            (
                settled.clone(),
                vec![binding("p", 1, None, false)],
                "a binding is new or changed",
            ),
            (
                settled.clone(),
                vec![binding("p", 4, Some(3), false)],
                "a binding is new or changed",
            ),
            (
                settled.clone(),
                vec![binding("p", 3, Some(3), true)],
                "a binding is deleting",
            ),
        ];
        for (c, bs, want) in cases {
            assert_eq!(changed(&c, &bs), Some(want), "{c:?} {bs:?}");
        }
    }
}
