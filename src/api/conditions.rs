//! metav1.Condition upkeep with the API conventions: `lastTransitionTime` moves only when the
//! status changes, `observedGeneration` is always the generation the pass looked at.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    pub fn from_bool(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// Extension methods on a condition list.
pub trait Conditions {
    /// Set (or add) a condition. Returns true when anything but the timestamps changed.
    fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        generation: Option<i64>,
        now: Timestamp,
    ) -> bool;
    /// The condition of this type, if present.
    fn condition(&self, type_: &str) -> Option<&Condition>;
    /// True when the condition is present with status True.
    fn is_true(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }
    /// Remove a condition; returns true if one was removed.
    fn remove_condition(&mut self, type_: &str) -> bool;
}

impl Conditions for Vec<Condition> {
    fn set_condition(
        &mut self,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: &str,
        generation: Option<i64>,
        now: Timestamp,
    ) -> bool {
        let status = status.as_str();
        // A condition message is scrubbed (whatever built it) and bounded so one noisy error
        // cannot bloat the object.
        let message = crate::scrub::scrub_bounded(message, 1024);
        match self.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                let changed = c.status != status
                    || c.reason != reason
                    || c.message != message
                    || c.observed_generation != generation;
                if c.status != status {
                    c.last_transition_time = Time(now);
                }
                c.status = status.to_string();
                c.reason = reason.to_string();
                c.message = message;
                c.observed_generation = generation;
                changed
            }
            None => {
                self.push(Condition {
                    type_: type_.to_string(),
                    status: status.to_string(),
                    reason: reason.to_string(),
                    message,
                    observed_generation: generation,
                    last_transition_time: Time(now),
                });
                self.sort_by(|a, b| a.type_.cmp(&b.type_));
                true
            }
        }
    }

    fn condition(&self, type_: &str) -> Option<&Condition> {
        self.iter().find(|c| c.type_ == type_)
    }

    fn remove_condition(&mut self, type_: &str) -> bool {
        let before = self.len();
        self.retain(|c| c.type_ != type_);
        before != self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut c: Vec<Condition> = Vec::new();
        assert!(c.set_condition(
            "Ready",
            ConditionStatus::False,
            "Waiting",
            "m",
            Some(1),
            t(10)
        ));
        // Same status, new reason: a change, but the transition time stays.
        assert!(c.set_condition(
            "Ready",
            ConditionStatus::False,
            "Other",
            "m",
            Some(1),
            t(20)
        ));
        assert_eq!(c[0].last_transition_time.0, t(10));
        // Identical: no change at all.
        assert!(!c.set_condition(
            "Ready",
            ConditionStatus::False,
            "Other",
            "m",
            Some(1),
            t(30)
        ));
        // Status flips: transition time moves.
        assert!(c.set_condition("Ready", ConditionStatus::True, "Ok", "", Some(2), t(40)));
        assert_eq!(c[0].last_transition_time.0, t(40));
        assert_eq!(c[0].observed_generation, Some(2));
    }

    #[test]
    fn conditions_stay_sorted_and_removable() {
        let mut c: Vec<Condition> = Vec::new();
        c.set_condition("Synced", ConditionStatus::True, "Ok", "", None, t(1));
        c.set_condition("Ready", ConditionStatus::True, "Ok", "", None, t(1));
        assert_eq!(c[0].type_, "Ready");
        assert!(c.is_true("Synced"));
        assert!(c.remove_condition("Synced"));
        assert!(!c.remove_condition("Synced"));
    }
}
