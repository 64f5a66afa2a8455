//! Where a machine's storage evacuation stands, from the `StorageEvacuation` condition and
//! what the storage backend reports. One definition, used by the upgrade step and by node
//! removal.
//!
//! An evacuation is recorded where it happens: the storage backend's write that turns the
//! node's scheduling off and asks for its replicas to move also keeps an
//! [`EvacuationRecord`] on the backend's own object (Longhorn: an annotation of its Node),
//! and the write that puts the scheduling back removes it. So no crash can leave a node
//! unschedulable with nothing saying so, and opening an evacuation costs no write of the
//! machine's conditions (decision 0011). The machine's next conditions write (its upgrade
//! intent) carries `StorageEvacuation=True` from the record, its transition time the
//! record's time: [`with_recorded_evacuation`] is the machine's conditions as its step
//! sees them meanwhile. `StorageEvacuation` is `True` until the evacuation ends, when it
//! turns `False` with storage scheduling put back.

use std::time::Duration;

use crate::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use crate::time::Timestamp;

/// The condition type that marks an evacuation.
pub const STORAGE_EVACUATION: &str = "StorageEvacuation";

/// Condition reasons of [`STORAGE_EVACUATION`], one source for drivers and tests.
pub mod reason {
    /// `True`: scheduling disabled and replicas asked to move.
    pub const EVACUATING: &str = "Evacuating";
    /// `True`: the backend reports no replica left on the node.
    pub const EVACUATED: &str = "Evacuated";
    /// `False`: the evacuation ended and scheduling is back on.
    pub const ENDED: &str = "Ended";
    /// `False`: the evacuation timed out; scheduling is back on.
    pub const TIMED_OUT: &str = "TimedOut";
}

/// A node's storage scheduling as the backend has it: whether new replicas may be placed
/// there, and whether an eviction of its replicas is requested. An evacuation records the
/// node's scheduling from before it (in the backend's [`EvacuationRecord`], then in the
/// `StorageEvacuation` condition), and its end puts that back, not "on": a node an
/// operator had made unschedulable, or was evicting by hand, stays so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduling {
    /// New replicas may be scheduled on the node.
    pub allowed: bool,
    /// The node's replicas are asked to move elsewhere.
    pub eviction_requested: bool,
}

/// How the condition's message records [`Scheduling`]: its last part, in parentheses.
const BEFORE: &str = " (before: ";

impl Scheduling {
    /// Scheduling on, no eviction: a node as the storage system creates it, and what is
    /// restored when an evacuation recorded nothing (begun by an older version).
    pub const ON: Self = Self { allowed: true, eviction_requested: false };

    /// The record appended to the message of the condition that opens an evacuation.
    #[must_use]
    pub fn marker(self) -> String {
        format!("{BEFORE}allowScheduling={}, evictionRequested={})", self.allowed, self.eviction_requested)
    }

    /// The record at the end of `message`, if it ends with one written by [`Self::marker`];
    /// anything else is no record.
    #[must_use]
    pub fn from_message(message: &str) -> Option<Self> {
        let start = message.rfind(BEFORE)?;
        let inner = message[start + BEFORE.len()..].strip_suffix(')')?;
        let (allowed, eviction) = inner.split_once(", ")?;
        let flag = |text: &str, key: &str| match text.strip_prefix(key)? {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        };
        Some(Self {
            allowed: flag(allowed, "allowScheduling=")?,
            eviction_requested: flag(eviction, "evictionRequested=")?,
        })
    }
}

/// The scheduling to put back when the evacuation open in `conditions` ends: the one it
/// recorded, or [`Scheduling::ON`] when it recorded none.
#[must_use]
pub fn scheduling_to_restore(conditions: &Conditions) -> Scheduling {
    conditions
        .get(STORAGE_EVACUATION)
        .filter(|c| c.status == ConditionStatus::True)
        .and_then(|c| Scheduling::from_message(&c.message))
        .unwrap_or(Scheduling::ON)
}

/// The storage backend's own record of an evacuation the engine asked for on a node: kept
/// on the backend's object by the very write that asks for it and removed by the write
/// that puts the node's scheduling back, so it is atomic with the change it records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvacuationRecord {
    /// The node's scheduling from before the evacuation, which its end puts back.
    pub before: Scheduling,
    /// When the evacuation was first asked for: its timeout's clock. `None` from a record
    /// that kept no time, which counts as now (the timeout never fires early).
    pub since: Option<Timestamp>,
    /// The bytes on the node when the evacuation was first asked for: the sizes of the
    /// replicas' volumes there (Longhorn: the sum of their `spec.volumeSize`), what the
    /// evacuation moves at most. `None` when the backend did not say.
    pub bytes: Option<u64>,
}

/// How the condition's message records [`EvacuationRecord::bytes`]: a part in parentheses
/// ending with this, before the scheduling's record.
const BYTES: &str = " bytes on it)";

/// The bytes an evacuation moved at most, as the message of the condition that opened it
/// records them (written by [`with_recorded_evacuation`] from the backend's record);
/// `None` when it records none.
#[must_use]
pub fn bytes_from_message(message: &str) -> Option<u64> {
    let end = message.find(BYTES)?;
    let start = message[..end].rfind('(')? + 1;
    message[start..end].parse().ok()
}

/// The message of `StorageEvacuation=True/Evacuating` for an evacuation of `node` asked
/// for with the backend's scheduling from before it, and the bytes on the node then when
/// the backend said.
#[must_use]
fn opened_message(node: &str, before: Scheduling, bytes: Option<u64>) -> String {
    let bytes = bytes.map(|b| format!(" ({b}{BYTES}")).unwrap_or_default();
    format!("storage scheduling disabled on {node}; replicas asked to move{bytes}{}", before.marker())
}

/// The machine's conditions as its step sees them, when the storage backend records an
/// evacuation of its node that `conditions` do not show open: `StorageEvacuation=True/
/// Evacuating` added from the record (the scheduling from before it in the message, the
/// record's time as the transition time, at most `now`). `None` when nothing is to add.
/// The next write of the machine's conditions carries it.
#[must_use]
pub fn with_recorded_evacuation(
    conditions: &Conditions,
    storage: &StorageObservation,
    node: &str,
    now: Timestamp,
) -> Option<Conditions> {
    let record = storage.recorded?;
    if conditions.is_true(STORAGE_EVACUATION) {
        return None;
    }
    let mut seen = conditions.clone();
    let update = ConditionUpdate::new(
        STORAGE_EVACUATION,
        ConditionStatus::True,
        reason::EVACUATING,
        opened_message(node, record.before, record.bytes),
    );
    seen.upsert(update, record.since.map_or(now, |since| since.min(now)));
    Some(seen)
}

/// What storage says about one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StorageObservation {
    /// The storage objects whose selector selects the node; empty means nothing to evacuate.
    pub selected_by: Vec<String>,
    /// Replicas still on the node, as the backend reports; `None` when not asked (the
    /// driver asks whenever the node is selected or an evacuation is open).
    pub replicas_left: Option<u32>,
    /// The backend's record of an evacuation of the node, if it keeps one: an evacuation
    /// open whatever the conditions say (see [`with_recorded_evacuation`]).
    pub recorded: Option<EvacuationRecord>,
    /// The longest evacuation timeout the selecting storage objects set; `None`: the
    /// caller's default applies.
    pub evacuation_timeout: Option<Duration>,
}

/// Where an evacuation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationState {
    /// No storage object selects the node and no evacuation is open.
    NothingToEvacuate,
    /// Storage selects the node; no evacuation is open: begin one.
    NotStarted,
    /// Open, replicas remain, within the timeout.
    InProgress {
        /// Replicas left, if known.
        replicas_left: Option<u32>,
        /// When it times out.
        deadline: Timestamp,
    },
    /// Open, and the backend reports no replica left.
    Evacuated,
    /// Open, replicas remain, and the timeout has passed.
    TimedOut {
        /// Replicas left, if known.
        replicas_left: Option<u32>,
    },
}

impl EvacuationState {
    /// Whether an evacuation is open (storage scheduling is off on the node).
    #[must_use]
    pub fn is_open(self) -> bool {
        match self {
            Self::InProgress { .. } | Self::Evacuated | Self::TimedOut { .. } => true,
            Self::NothingToEvacuate | Self::NotStarted => false,
        }
    }
}

/// Derives where the evacuation stands. A transition time in the future (clock skew) counts
/// as now: the timeout never fires early and nothing panics.
#[must_use]
pub fn evacuation_state(
    conditions: &Conditions,
    storage: &StorageObservation,
    timeout: Duration,
    now: Timestamp,
) -> EvacuationState {
    let timeout = storage.evacuation_timeout.unwrap_or(timeout);
    let open = conditions.get(STORAGE_EVACUATION).filter(|c| c.status == ConditionStatus::True);
    match open {
        None if storage.selected_by.is_empty() => EvacuationState::NothingToEvacuate,
        None => EvacuationState::NotStarted,
        Some(_) if storage.replicas_left == Some(0) => EvacuationState::Evacuated,
        Some(condition) => {
            let started = condition.last_transition_time.min(now);
            if now.saturating_since(started) >= timeout {
                EvacuationState::TimedOut { replicas_left: storage.replicas_left }
            } else {
                EvacuationState::InProgress {
                    replicas_left: storage.replicas_left,
                    deadline: started.saturating_add(timeout),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(600);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_unix_secs(secs)
    }

    fn open_since(secs: i64) -> Conditions {
        let mut c = Conditions::new();
        c.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, ""), at(secs));
        c
    }

    fn selected(replicas_left: Option<u32>) -> StorageObservation {
        StorageObservation {
            selected_by: vec!["longhorn".into()],
            replicas_left,
            recorded: None,
            evacuation_timeout: None,
        }
    }

    #[test]
    fn no_storage_object_selecting_means_nothing_to_evacuate() {
        let s = evacuation_state(&Conditions::new(), &StorageObservation::default(), TIMEOUT, at(0));
        assert_eq!(s, EvacuationState::NothingToEvacuate);
        assert!(!s.is_open());
    }

    #[test]
    fn a_selected_node_without_an_open_evacuation_is_not_started() {
        let s = evacuation_state(&Conditions::new(), &selected(Some(4)), TIMEOUT, at(0));
        assert_eq!(s, EvacuationState::NotStarted);
        let mut ended = open_since(0);
        ended.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::False, reason::ENDED, ""), at(5));
        assert_eq!(evacuation_state(&ended, &selected(Some(4)), TIMEOUT, at(9)), EvacuationState::NotStarted);
    }

    #[test]
    fn an_open_evacuation_runs_until_no_replica_is_left() {
        let s = evacuation_state(&open_since(100), &selected(Some(3)), TIMEOUT, at(200));
        assert_eq!(s, EvacuationState::InProgress { replicas_left: Some(3), deadline: at(700) });
        assert!(s.is_open());
        assert_eq!(
            evacuation_state(&open_since(100), &selected(Some(0)), TIMEOUT, at(200)),
            EvacuationState::Evacuated
        );
    }

    #[test]
    fn the_timeout_counts_from_the_transition_time() {
        let s = evacuation_state(&open_since(100), &selected(Some(1)), TIMEOUT, at(700));
        assert_eq!(s, EvacuationState::TimedOut { replicas_left: Some(1) });
        let evacuated_late = evacuation_state(&open_since(100), &selected(Some(0)), TIMEOUT, at(9_999));
        assert_eq!(evacuated_late, EvacuationState::Evacuated, "done is done, even after the timeout");
    }

    #[test]
    fn a_transition_time_in_the_future_is_treated_as_now() {
        let s = evacuation_state(&open_since(5_000), &selected(Some(2)), TIMEOUT, at(100));
        assert_eq!(s, EvacuationState::InProgress { replicas_left: Some(2), deadline: at(700) });
    }

    #[test]
    fn the_scheduling_from_before_is_read_back_from_the_open_condition_only() {
        for allowed in [true, false] {
            for eviction_requested in [true, false] {
                let before = Scheduling { allowed, eviction_requested };
                let message = format!("storage scheduling disabled on w-1; replicas asked to move{}", before.marker());
                assert_eq!(Scheduling::from_message(&message), Some(before), "{message}");
                let mut c = Conditions::new();
                c.upsert(
                    ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, message),
                    at(0),
                );
                assert_eq!(scheduling_to_restore(&c), before);
            }
        }
        // No record (an older version's), a damaged one, or no open evacuation: on.
        for message in [
            "storage scheduling disabled on w-1; replicas asked to move",
            "x (before: allowScheduling=no, evictionRequested=false)",
            "x (before: allowScheduling=false, evictionRequested=false",
            "x (before: allowScheduling=false)",
        ] {
            assert_eq!(Scheduling::from_message(message), None, "{message}");
            let mut c = Conditions::new();
            c.upsert(
                ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, message),
                at(0),
            );
            assert_eq!(scheduling_to_restore(&c), Scheduling::ON, "{message}");
        }
        assert_eq!(scheduling_to_restore(&Conditions::new()), Scheduling::ON);
    }

    #[test]
    fn an_open_evacuation_stays_open_when_the_selector_stops_selecting() {
        let s = evacuation_state(
            &open_since(0),
            &StorageObservation {
                selected_by: vec![],
                replicas_left: Some(2),
                recorded: None,
                evacuation_timeout: None,
            },
            TIMEOUT,
            at(1),
        );
        assert!(s.is_open(), "scheduling was turned off; only ending the evacuation turns it back on");
    }

    fn recorded(since: Option<i64>) -> StorageObservation {
        let before = Scheduling { allowed: false, eviction_requested: false };
        let record = EvacuationRecord { before, since: since.map(at), bytes: None };
        StorageObservation { recorded: Some(record), ..selected(Some(3)) }
    }

    #[test]
    fn the_bytes_on_the_node_ride_in_the_opening_message_beside_the_scheduling() {
        let before = Scheduling { allowed: true, eviction_requested: true };
        for bytes in [None, Some(0), Some(53_687_091_200)] {
            let record = EvacuationRecord { before, since: Some(at(100)), bytes };
            let storage = StorageObservation { recorded: Some(record), ..selected(Some(3)) };
            let seen = with_recorded_evacuation(&Conditions::new(), &storage, "w-1", at(200)).unwrap();
            let message = &seen.get(STORAGE_EVACUATION).unwrap().message;
            assert_eq!(bytes_from_message(message), bytes, "{message}");
            assert_eq!(scheduling_to_restore(&seen), before, "{message}");
        }
        for message in ["", "replicas asked to move (x bytes on it)", "no parenthesis bytes on it)"] {
            assert_eq!(bytes_from_message(message), None, "{message}");
        }
    }

    #[test]
    fn the_backends_record_opens_the_evacuation_with_its_time_and_its_scheduling() {
        let storage = recorded(Some(100));
        let seen = with_recorded_evacuation(&Conditions::new(), &storage, "w-1", at(200)).expect("recorded");
        let c = seen.get(STORAGE_EVACUATION).unwrap();
        assert_eq!(
            (c.status, c.reason.as_str(), c.last_transition_time),
            (ConditionStatus::True, reason::EVACUATING, at(100))
        );
        assert_eq!(scheduling_to_restore(&seen), Scheduling { allowed: false, eviction_requested: false });
        // The timeout runs from the record's time, across restarts.
        assert_eq!(
            evacuation_state(&seen, &storage, TIMEOUT, at(200)),
            EvacuationState::InProgress { replicas_left: Some(3), deadline: at(700) }
        );
        assert_eq!(
            evacuation_state(&seen, &storage, TIMEOUT, at(700)),
            EvacuationState::TimedOut { replicas_left: Some(3) }
        );
    }

    #[test]
    fn a_record_without_a_time_or_with_one_ahead_counts_from_now() {
        for since in [None, Some(9_000)] {
            let seen = with_recorded_evacuation(&Conditions::new(), &recorded(since), "w-1", at(200)).unwrap();
            assert_eq!(seen.get(STORAGE_EVACUATION).unwrap().last_transition_time, at(200), "{since:?}");
        }
    }

    #[test]
    fn conditions_that_show_the_evacuation_open_or_no_record_add_nothing() {
        assert_eq!(with_recorded_evacuation(&open_since(50), &recorded(Some(100)), "w-1", at(200)), None);
        assert_eq!(with_recorded_evacuation(&Conditions::new(), &selected(Some(3)), "w-1", at(200)), None);
        // An ended evacuation with the backend still recording one: open again, from the record.
        let mut ended = open_since(0);
        ended.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::False, reason::ENDED, ""), at(5));
        let seen = with_recorded_evacuation(&ended, &recorded(Some(100)), "w-1", at(200)).unwrap();
        assert!(seen.is_true(STORAGE_EVACUATION));
    }

    #[test]
    fn a_storage_objects_own_timeout_replaces_the_default() {
        let mut conditions = Conditions::default();
        conditions
            .upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, ""), at(0));
        let longer = StorageObservation { evacuation_timeout: Some(Duration::from_secs(7200)), ..selected(Some(3)) };
        // 600 s is the default here: past it, the default would time out; the object's 2 h has not.
        assert_eq!(
            evacuation_state(&conditions, &selected(Some(3)), TIMEOUT, at(601)),
            EvacuationState::TimedOut { replicas_left: Some(3) }
        );
        assert_eq!(
            evacuation_state(&conditions, &longer, TIMEOUT, at(601)),
            EvacuationState::InProgress { replicas_left: Some(3), deadline: at(7200) }
        );
        assert_eq!(
            evacuation_state(&conditions, &longer, TIMEOUT, at(7200)),
            EvacuationState::TimedOut { replicas_left: Some(3) }
        );
    }
}
