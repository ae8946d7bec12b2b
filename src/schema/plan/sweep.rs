//! Which Connections a run reconciles (docs/schema.md "Full sweeps"). With
//! `--full-sweep-every`, a run reconciles every Connection only when the last full sweep is that
//! old; runs in between reconcile only what changed since it was last reconciled, so the
//! CronJob can run every minute (a new binding is set up within a minute) while the provider
//! is asked no more often than before.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::core::Connection;
use crate::pass::summary::Sweep;

use super::BindingView;

/// Whether this run sweeps fully: always with `every` zero (the default), when no full sweep
/// is recorded, when the last one is `every` old, or when the record lies more than `every`
/// ahead (written by a clock that ran fast: it must not put sweeps off until it is reached).
pub fn sweep(every: Duration, swept_at: Option<Timestamp>, now: Timestamp) -> Sweep {
    let due = |at: Timestamp| {
        let since = now.duration_since(at);
        let ahead = at.duration_since(now);
        let at_least = |d: k8s_openapi::jiff::SignedDuration| {
            Duration::try_from(d).is_ok_and(|d: Duration| d >= every)
        };
        at_least(since) || ahead.is_positive() && at_least(ahead)
    };
    if every.is_zero() || swept_at.is_none_or(due) {
        Sweep::Full
    } else {
        Sweep::Changed
    }
}

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

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_full_sweep_comes_when_due_or_when_none_is_recorded() {
        let five = Duration::from_secs(300);
        assert_eq!(sweep(Duration::ZERO, Some(t(1000)), t(1000)), Sweep::Full);
        assert_eq!(sweep(five, None, t(1000)), Sweep::Full);
        assert_eq!(sweep(five, Some(t(1000)), t(1299)), Sweep::Changed);
        assert_eq!(sweep(five, Some(t(1000)), t(1300)), Sweep::Full);
        // A record a little ahead (clocks differ a little): not due yet; far ahead (a clock that
        // ran fast): due, or it would put every sweep off until the clock reached it.
        assert_eq!(sweep(five, Some(t(1100)), t(1000)), Sweep::Changed);
        assert_eq!(sweep(five, Some(t(1300)), t(1000)), Sweep::Full);
        assert_eq!(sweep(five, Some(t(100_000)), t(1000)), Sweep::Full);
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
