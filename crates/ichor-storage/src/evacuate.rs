//! The one definition of starting and ending an evacuation, called by both the upgrade
//! driver and the removal driver.
//!
//! An evacuation begins with one write, the backend's: scheduling off, the replicas asked
//! to move and the evacuation's record kept on the backend's object (decision 0011); the
//! machine's next conditions write carries `StorageEvacuation=True` from that record
//! ([`with_recorded_evacuation`](ichor_upgrade_core::evacuation::with_recorded_evacuation)).
//! It ends with the backend's write that puts the scheduling back and drops the record,
//! then `StorageEvacuation=False`: a crash in between leaves the condition open and the
//! next pass repeats the (idempotent) call. The record's time is the timeout clock.

use ichor_upgrade_core::Timestamp;
use ichor_upgrade_core::conditions::{ConditionStatus, ConditionUpdate, Conditions};
use ichor_upgrade_core::evacuation::{STORAGE_EVACUATION, StorageObservation, reason, scheduling_to_restore};

use crate::api::{
    ConditionWriteError, EvacuationFor, EvacuationRequest, EvacuationWrites, Labels, StorageError, StorageReads,
};
use crate::selection::selecting;

/// Why an evacuation step could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvacuationError {
    /// The storage backend failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A storage object's selector cannot be evaluated.
    #[error("TalosStorage {name}: {error}")]
    Selector {
        /// The storage object.
        name: String,
        /// What is wrong with its selector.
        error: crate::selection::SelectorError,
    },
    /// The condition could not be written.
    #[error(transparent)]
    Write(#[from] ConditionWriteError),
}

impl EvacuationError {
    /// Whether waiting and retrying can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Storage(e) => e.transient,
            Self::Write(e) => e.transient,
            Self::Selector { .. } => false,
        }
    }
}

/// How an evacuation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvacuationEnd {
    /// The node was verified (upgrade) or is gone (removal): scheduling back on.
    Ended,
    /// The timeout passed: scheduling back on, and the caller fails or retries.
    TimedOut,
}

/// What storage says about a node: which storage objects select it, the backend's record
/// of an evacuation of it (asked for whatever selects it: a selector changed during an
/// evacuation must not hide it), and, when one selects it or an evacuation is open, how
/// much of its data is left on it: its replicas, and for a removal its backing images'
/// files too (the observation's `replicas_left` counts both).
///
/// # Errors
/// The backend's error, or a selector that cannot be evaluated.
pub async fn observe_storage(
    storage: &dyn StorageReads,
    node: &str,
    labels: &Labels,
    conditions: &Conditions,
    purpose: EvacuationFor,
) -> Result<StorageObservation, EvacuationError> {
    let objects = storage.storage_objects().await?;
    let selected_by = selecting(&objects, labels)
        .map_err(|(name, error)| EvacuationError::Selector { name, error })?
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    let evacuation_timeout =
        objects.iter().filter(|o| selected_by.contains(&o.name)).filter_map(|o| o.evacuation_timeout).max();
    let recorded = storage.evacuation_record(node).await?;
    let open = conditions.is_true(STORAGE_EVACUATION) || recorded.is_some();
    let replicas_left = if selected_by.is_empty() && !open {
        None
    } else {
        let replicas = storage.replicas_on(node).await?;
        let backing_images = match purpose {
            EvacuationFor::Removal => storage.backing_images_on(node).await?,
            EvacuationFor::Upgrade => 0,
        };
        Some(replicas.saturating_add(backing_images))
    };
    Ok(StorageObservation { selected_by, replicas_left, recorded, evacuation_timeout })
}

/// Starts evacuating a node: storage scheduling off, replicas asked to move and the
/// evacuation's record kept by the backend (its time, `now`, starts the clock; its
/// scheduling from before is what the end puts back), in the backend's one write; the
/// machine's conditions are not written. A node the storage system does not have keeps
/// no record, so it opens the evacuation in the conditions instead, saying there is
/// nothing to evacuate: it has no replica to wait for, and nothing pauses.
///
/// # Errors
/// The first call or write that failed; nothing after it was done.
pub async fn evacuate_machine(
    writes: &dyn EvacuationWrites,
    machine: &str,
    node: &str,
    conditions: &Conditions,
    now: Timestamp,
) -> Result<EvacuationRequest, EvacuationError> {
    let request = writes.request_evacuation(node, now).await?;
    if request == EvacuationRequest::NoSuchNode {
        let message = format!("the storage system has no node {node}: nothing to evacuate");
        let mut next = conditions.clone();
        next.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, message), now);
        writes.write_conditions(machine, &next).await?;
    }
    Ok(request)
}

/// Ends an evacuation: storage scheduling put back as it was before it (as the open
/// condition recorded; on when it recorded nothing), then `StorageEvacuation=False`
/// written with the reason of `end`.
///
/// # Errors
/// The first call or write that failed; nothing after it was done.
pub async fn end_machine_evacuation(
    writes: &dyn EvacuationWrites,
    machine: &str,
    node: &str,
    conditions: &Conditions,
    end: EvacuationEnd,
    now: Timestamp,
) -> Result<(), EvacuationError> {
    writes.restore_scheduling(node, scheduling_to_restore(conditions)).await?;
    let next = evacuation_ended(conditions, node, end, now);
    writes.write_conditions(machine, &next).await?;
    Ok(())
}

/// The conditions once an evacuation has ended: `StorageEvacuation=False` with the reason
/// of `end`. For a caller that re-enabled scheduling itself and writes these conditions
/// together with others, in one write.
#[must_use]
pub fn evacuation_ended(conditions: &Conditions, node: &str, end: EvacuationEnd, now: Timestamp) -> Conditions {
    let restored = scheduling_to_restore(conditions);
    let scheduling = format!(
        "storage scheduling restored on {node} (allowScheduling={}, evictionRequested={})",
        restored.allowed, restored.eviction_requested
    );
    let (why, message) = match end {
        EvacuationEnd::Ended => (reason::ENDED, scheduling),
        EvacuationEnd::TimedOut => (reason::TIMED_OUT, format!("evacuation timed out; {scheduling}")),
    };
    let mut next = conditions.clone();
    next.upsert(ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::False, why, message), now);
    next
}

#[cfg(test)]
mod tests {
    use mockall::Sequence;
    use mockall::predicate::eq;

    use ichor_upgrade_core::evacuation::{EvacuationRecord, Scheduling};

    use super::*;
    use crate::api::{MockEvacuationWrites, MockStorageReads};
    use crate::selection::{LabelSelector, StorageObject};

    fn now() -> Timestamp {
        Timestamp::from_unix_secs(1_000)
    }

    fn worker_labels() -> Labels {
        [("storage".to_owned(), "longhorn".to_owned())].into()
    }

    fn longhorn() -> StorageObject {
        StorageObject {
            name: "longhorn".into(),
            node_selector: LabelSelector { match_labels: worker_labels(), ..LabelSelector::default() },
            evacuation_timeout: None,
        }
    }

    #[tokio::test]
    async fn the_longest_timeout_of_the_objects_that_select_the_node_applies() {
        let mut storage = MockStorageReads::new();
        let timed = |name: &str, secs: u64, labels: Labels| StorageObject {
            name: name.into(),
            node_selector: LabelSelector { match_labels: labels, ..LabelSelector::default() },
            evacuation_timeout: Some(std::time::Duration::from_secs(secs)),
        };
        let elsewhere: Labels = [("storage".to_owned(), "ceph".to_owned())].into();
        let objects = vec![longhorn(), timed("big", 7200, worker_labels()), timed("other", 90_000, elsewhere)];
        storage.expect_storage_objects().returning(move || Ok(objects.clone()));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        storage.expect_replicas_on().returning(|_| Ok(4));
        let seen = observe_storage(&storage, "worker-1", &worker_labels(), &Conditions::new(), EvacuationFor::Upgrade)
            .await
            .unwrap();
        assert_eq!(seen.selected_by, ["longhorn", "big"]);
        assert_eq!(seen.evacuation_timeout, Some(std::time::Duration::from_secs(7200)), "not the unselected 25 h");
    }

    // Decision 0011: the backend's write is the evacuation's record; the conditions are
    // not written to open it (one Kubernetes write per worker fewer).
    #[tokio::test]
    async fn evacuation_is_one_backend_write_that_keeps_its_record_and_no_conditions_write() {
        // Any other write (the conditions, a restore) would panic: none is expected.
        let mut writes = MockEvacuationWrites::new();
        // An operator had turned scheduling off by hand.
        let before = Scheduling { allowed: false, eviction_requested: false };
        writes
            .expect_request_evacuation()
            .with(eq("worker-1"), eq(now()))
            .times(1)
            .returning(move |_, _| Ok(EvacuationRequest::Requested { before }));
        let request = evacuate_machine(&writes, "m-1", "worker-1", &Conditions::new(), now()).await.unwrap();
        assert_eq!(request, EvacuationRequest::Requested { before });
    }

    #[tokio::test]
    async fn an_observation_carries_the_backends_record_and_counts_replicas_for_it_even_unselected() {
        let record = EvacuationRecord { before: Scheduling::ON, since: Some(now()), bytes: None };
        let mut storage = MockStorageReads::new();
        // The selector no longer selects the node: the open evacuation still counts.
        storage.expect_storage_objects().returning(|| Ok(vec![]));
        storage.expect_evacuation_record().with(eq("worker-1")).returning(move |_| Ok(Some(record)));
        storage.expect_replicas_on().with(eq("worker-1")).times(1).returning(|_| Ok(2));
        let seen = observe_storage(&storage, "worker-1", &worker_labels(), &Conditions::new(), EvacuationFor::Upgrade)
            .await
            .unwrap();
        assert_eq!(
            seen,
            StorageObservation {
                selected_by: vec![],
                replicas_left: Some(2),
                recorded: Some(record),
                evacuation_timeout: None
            }
        );
    }

    #[tokio::test]
    async fn a_node_the_storage_system_does_not_have_opens_an_evacuation_with_nothing_to_wait_for() {
        let mut writes = MockEvacuationWrites::new();
        writes.expect_request_evacuation().returning(|_, _| Ok(EvacuationRequest::NoSuchNode));
        writes
            .expect_write_conditions()
            .withf(|_, c| {
                let cond = c.get(STORAGE_EVACUATION).unwrap();
                cond.status == ConditionStatus::True && cond.message.contains("has no node worker-1")
            })
            .times(1)
            .returning(|_, _| Ok(()));
        let request = evacuate_machine(&writes, "m-1", "worker-1", &Conditions::new(), now()).await.unwrap();
        assert_eq!(request, EvacuationRequest::NoSuchNode);
        // Its end restores "on" on a node that is not there: the backend's no-op.
        assert_eq!(scheduling_to_restore(&Conditions::new()), Scheduling::ON);
    }

    #[tokio::test]
    async fn a_backend_failure_writes_nothing() {
        let mut writes = MockEvacuationWrites::new();
        writes.expect_request_evacuation().returning(|_, _| Err(StorageError::transient("connection refused")));
        let err = evacuate_machine(&writes, "m-1", "worker-1", &Conditions::new(), now()).await.unwrap_err();
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn ending_re_enables_scheduling_before_closing_the_condition() {
        let mut seq = Sequence::new();
        let mut writes = MockEvacuationWrites::new();
        writes
            .expect_restore_scheduling()
            .with(eq("worker-1"), eq(Scheduling::ON))
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _| Ok(()));
        writes
            .expect_write_conditions()
            .withf(|_, c| {
                let cond = c.get(STORAGE_EVACUATION).unwrap();
                cond.status == ConditionStatus::False && cond.reason == reason::TIMED_OUT
            })
            .times(1)
            .in_sequence(&mut seq)
            .returning(|_, _| Ok(()));
        end_machine_evacuation(&writes, "m-1", "worker-1", &Conditions::new(), EvacuationEnd::TimedOut, now())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn ending_puts_back_the_scheduling_the_evacuation_recorded() {
        let before = Scheduling { allowed: false, eviction_requested: true };
        let mut open = Conditions::new();
        let message = format!("storage scheduling disabled on worker-1; replicas asked to move{}", before.marker());
        open.upsert(
            ConditionUpdate::new(STORAGE_EVACUATION, ConditionStatus::True, reason::EVACUATING, message),
            now(),
        );
        let mut writes = MockEvacuationWrites::new();
        writes.expect_restore_scheduling().with(eq("worker-1"), eq(before)).times(1).returning(|_, _| Ok(()));
        writes
            .expect_write_conditions()
            .withf(|_, c| {
                let cond = c.get(STORAGE_EVACUATION).unwrap();
                cond.status == ConditionStatus::False
                    && cond.message.contains("allowScheduling=false, evictionRequested=true")
            })
            .times(1)
            .returning(|_, _| Ok(()));
        end_machine_evacuation(&writes, "m-1", "worker-1", &open, EvacuationEnd::Ended, now()).await.unwrap();
    }

    #[tokio::test]
    async fn observing_asks_for_replicas_only_when_selected_or_open() {
        let mut storage = MockStorageReads::new();
        storage.expect_storage_objects().returning(|| Ok(vec![longhorn()]));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        storage.expect_replicas_on().with(eq("worker-1")).times(1).returning(|_| Ok(3));
        storage.expect_backing_images_on().never();
        let seen = observe_storage(&storage, "worker-1", &worker_labels(), &Conditions::new(), EvacuationFor::Upgrade)
            .await
            .unwrap();
        assert_eq!(
            seen,
            StorageObservation {
                selected_by: vec!["longhorn".into()],
                replicas_left: Some(3),
                recorded: None,
                evacuation_timeout: None
            }
        );

        let mut storage = MockStorageReads::new();
        storage.expect_storage_objects().returning(|| Ok(vec![longhorn()]));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        storage.expect_replicas_on().never();
        let seen = observe_storage(&storage, "cp-1", &Labels::new(), &Conditions::new(), EvacuationFor::Upgrade)
            .await
            .unwrap();
        assert_eq!(seen, StorageObservation::default(), "no storage object selects it: nothing to evacuate");
    }

    // Issue 17: a removal wipes the disks; a backing image whose only copy is there was
    // lost, since only replicas were waited for.
    #[tokio::test]
    async fn a_removal_waits_for_backing_images_as_well_as_replicas() {
        let mut storage = MockStorageReads::new();
        storage.expect_storage_objects().returning(|| Ok(vec![longhorn()]));
        storage.expect_evacuation_record().returning(|_| Ok(None));
        storage.expect_replicas_on().returning(|_| Ok(0));
        storage.expect_backing_images_on().with(eq("worker-1")).times(1).returning(|_| Ok(2));
        let seen = observe_storage(&storage, "worker-1", &worker_labels(), &Conditions::new(), EvacuationFor::Removal)
            .await
            .unwrap();
        assert_eq!(seen.replicas_left, Some(2), "no replica left, two backing images: not evacuated");
    }

    #[tokio::test]
    async fn a_broken_selector_is_a_failure_not_nothing_to_evacuate() {
        let mut storage = MockStorageReads::new();
        let mut broken = longhorn();
        broken.node_selector.match_expressions.push(crate::selection::LabelSelectorRequirement {
            key: "k".into(),
            operator: "Gt".into(),
            values: vec!["1".into()],
        });
        storage.expect_storage_objects().returning(move || Ok(vec![broken.clone()]));
        let err = observe_storage(&storage, "worker-1", &worker_labels(), &Conditions::new(), EvacuationFor::Upgrade)
            .await
            .unwrap_err();
        assert!(matches!(err, EvacuationError::Selector { ref name, .. } if name == "longhorn"));
        assert!(!err.is_transient());
    }
}
