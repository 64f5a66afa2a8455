//! Conditions shaped like Kubernetes' `metav1.Condition`, and a set of them with upsert
//! semantics.
//!
//! Conditions are where progress lives: a restarted controller reads them back and resumes.
//! The transition time is kept when a condition is rewritten with the same status, so it
//! can serve as a timeout clock (the evacuation's, for one) across restarts.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// `True`, `False` or `Unknown`, as in `metav1.ConditionStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known, or in between (used for intents written before an outcome is known).
    Unknown,
}

/// One condition, field for field a `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, such as `TalosUpgrade`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its status.
    pub status: ConditionStatus,
    /// A CamelCase machine-readable reason.
    pub reason: String,
    /// A human-readable message.
    pub message: String,
    /// When the status last changed.
    pub last_transition_time: Timestamp,
    /// The generation of the object the condition was set from, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A condition to write; the set fills in the transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// The condition's type.
    pub type_: String,
    /// The new status.
    pub status: ConditionStatus,
    /// The new reason.
    pub reason: String,
    /// The new message.
    pub message: String,
    /// The generation observed, if any.
    pub observed_generation: Option<i64>,
}

impl ConditionUpdate {
    /// An update of `type_` to `status` with a reason and message.
    #[must_use]
    pub fn new(
        type_: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self { type_: type_.into(), status, reason: reason.into(), message: message.into(), observed_generation: None }
    }

    /// The same update, recording the generation it was decided from.
    #[must_use]
    pub fn with_generation(mut self, generation: i64) -> Self {
        self.observed_generation = Some(generation);
        self
    }
}

/// The conditions of one object, at most one per type, in insertion order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Conditions(Vec<Condition>);

impl Conditions {
    /// No conditions.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The condition of this type, if set.
    #[must_use]
    pub fn get(&self, type_: &str) -> Option<&Condition> {
        self.0.iter().find(|c| c.type_ == type_)
    }

    /// Whether the condition of this type is set with status `True`.
    #[must_use]
    pub fn is_true(&self, type_: &str) -> bool {
        self.get(type_).is_some_and(|c| c.status == ConditionStatus::True)
    }

    /// Sets a condition. The transition time becomes `now` when the type is new or its
    /// status changes, and is kept otherwise. Returns whether anything changed, so a
    /// caller can skip a write that would change nothing.
    pub fn upsert(&mut self, update: ConditionUpdate, now: Timestamp) -> bool {
        let ConditionUpdate { type_, status, reason, message, observed_generation } = update;
        if let Some(existing) = self.0.iter_mut().find(|c| c.type_ == type_) {
            let before = existing.clone();
            if existing.status != status {
                existing.last_transition_time = now;
            }
            existing.status = status;
            existing.reason = reason;
            existing.message = message;
            existing.observed_generation = observed_generation;
            return *existing != before;
        }
        self.0.push(Condition { type_, status, reason, message, last_transition_time: now, observed_generation });
        true
    }

    /// Removes the condition of this type; returns whether it was there.
    pub fn remove(&mut self, type_: &str) -> bool {
        let before = self.0.len();
        self.0.retain(|c| c.type_ != type_);
        self.0.len() != before
    }

    /// All conditions, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Condition> {
        self.0.iter()
    }

    /// Whether there are no conditions.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<Condition> for Conditions {
    /// Collects conditions; a later condition of a type already seen replaces the earlier.
    fn from_iter<I: IntoIterator<Item = Condition>>(iter: I) -> Self {
        let mut set = Self::new();
        for condition in iter {
            set.remove(&condition.type_);
            set.0.push(condition);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_secs(secs)
    }

    fn update(status: ConditionStatus, reason: &str) -> ConditionUpdate {
        ConditionUpdate::new("StorageEvacuation", status, reason, "message")
    }

    #[test]
    fn a_new_condition_takes_now_as_its_transition_time() {
        let mut set = Conditions::new();
        assert!(set.upsert(update(ConditionStatus::True, "Evacuating"), at(10)));
        let c = set.get("StorageEvacuation").unwrap();
        assert_eq!(c.last_transition_time, at(10));
        assert_eq!(c.status, ConditionStatus::True);
        assert!(set.is_true("StorageEvacuation"));
    }

    #[test]
    fn same_status_keeps_the_transition_time_but_takes_the_new_reason_and_message() {
        let mut set = Conditions::new();
        set.upsert(update(ConditionStatus::True, "Evacuating"), at(10));
        let mut later = update(ConditionStatus::True, "StillEvacuating");
        later.message = "3 replicas left".into();
        assert!(set.upsert(later, at(50)));
        let c = set.get("StorageEvacuation").unwrap();
        assert_eq!(c.last_transition_time, at(10), "the timeout clock must not restart");
        assert_eq!((c.reason.as_str(), c.message.as_str()), ("StillEvacuating", "3 replicas left"));
    }

    #[test]
    fn a_status_change_moves_the_transition_time() {
        let mut set = Conditions::new();
        set.upsert(update(ConditionStatus::True, "Evacuating"), at(10));
        set.upsert(update(ConditionStatus::False, "Ended"), at(70));
        assert_eq!(set.get("StorageEvacuation").unwrap().last_transition_time, at(70));
    }

    #[test]
    fn an_identical_upsert_reports_no_change() {
        let mut set = Conditions::new();
        set.upsert(update(ConditionStatus::True, "Evacuating"), at(10));
        assert!(!set.upsert(update(ConditionStatus::True, "Evacuating"), at(99)));
    }

    #[test]
    fn one_condition_per_type_and_remove() {
        let mut set = Conditions::new();
        set.upsert(update(ConditionStatus::True, "A"), at(1));
        set.upsert(ConditionUpdate::new("TalosUpgrade", ConditionStatus::True, "B", "m").with_generation(4), at(2));
        set.upsert(update(ConditionStatus::False, "C"), at(3));
        assert_eq!(set.iter().count(), 2);
        assert_eq!(set.get("TalosUpgrade").unwrap().observed_generation, Some(4));
        assert!(set.remove("TalosUpgrade"));
        assert!(!set.remove("TalosUpgrade"));
        assert!(set.get("TalosUpgrade").is_none());
    }

    #[test]
    fn collecting_keeps_the_last_of_each_type() {
        let first = Condition {
            type_: "X".into(),
            status: ConditionStatus::True,
            reason: "First".into(),
            message: String::new(),
            last_transition_time: at(1),
            observed_generation: None,
        };
        let second = Condition { reason: "Second".into(), ..first.clone() };
        let set: Conditions = [first, second].into_iter().collect();
        assert_eq!(set.iter().count(), 1);
        assert_eq!(set.get("X").unwrap().reason, "Second");
    }
}
