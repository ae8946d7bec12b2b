//! A Connection skipped because two runs in a row died while working on it (src/pass/poison.rs,
//! docs/operations.md "Poison items"): its status says so, and nothing else of it changes.

use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{ConditionStatus as S, Conditions};
use crate::api::core::ConnectionStatus;
use crate::api::core::condition::READY;

pub const REASON_QUARANTINED: &str = "Quarantined";

/// Why a quarantined Connection is skipped, and how a person makes kbind try it again.
pub fn quarantine_message(generation: i64, lease: &str) -> String {
    format!(
        "two runs in a row died while working on this Connection (generation {generation}): \
         it is skipped until its spec changes, so the other Connections keep being served. \
         Check the provider (docs/operations.md \"Poison items\"), then change the spec, or \
         remove the entry from the kbind.io/quarantined annotation of Lease {lease}"
    )
}

/// The status of a quarantined Connection: `Ready=False Quarantined`, everything else as it
/// was. `None` when it already says so.
pub fn quarantined_status(
    status: &ConnectionStatus,
    generation: i64,
    lease: &str,
    now: Timestamp,
) -> Option<ConnectionStatus> {
    let mut s = status.clone();
    let changed = s.conditions.set_condition(
        READY,
        S::False,
        REASON_QUARANTINED,
        &quarantine_message(generation, lease),
        Some(generation),
        now,
    );
    changed.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantined_connection_says_so_once_and_keeps_the_rest_of_its_status() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let before = ConnectionStatus {
            remote_cluster_uid: Some("r".into()),
            ..Default::default()
        };
        let after = quarantined_status(&before, 3, "kbind-system/kbind-schema", now).unwrap();
        let ready = after.conditions.condition(READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_QUARANTINED)
        );
        assert!(ready.message.contains("generation 3"), "{}", ready.message);
        assert!(
            ready.message.contains("Lease kbind-system/kbind-schema"),
            "{}",
            ready.message
        );
        assert_eq!(after.remote_cluster_uid.as_deref(), Some("r"));
        assert_eq!(
            quarantined_status(&after, 3, "kbind-system/kbind-schema", now),
            None,
            "a second run writes nothing"
        );
        assert!(quarantined_status(&after, 4, "kbind-system/kbind-schema", now).is_some());
    }
}
