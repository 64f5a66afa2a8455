//! The operation's status between passes: what it knows of each machine it started, how
//! that becomes the rollout engine's [`MachineProgress`], and the next status from a
//! decision and the machines' outcomes. Pure, so the reconcile driver only moves data.

use serde::{Deserialize, Serialize};

use crate::etcd_snapshot::SnapshotState;
use crate::rollout::{Decision, FailedMachine, MachineProgress, OperationStatus, PauseReason, Phase};
use crate::time::Timestamp;

/// Where a started machine stands, as the operation records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    /// Started, not converged.
    InProgress,
    /// Verified on the target.
    Converged,
    /// Failed; the operation is paused.
    Failed,
}

/// One machine's entry in the operation's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRecord {
    /// Where it stands.
    pub state: RecordState,
    /// The last CamelCase reason (a wait, a failure, an action).
    pub reason: String,
    /// The last message.
    pub message: String,
    /// When it asked to be looked at again, if it is waiting on a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_at: Option<Timestamp>,
}

/// What advancing one machine one step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineOutcome {
    /// An action was carried out (a write or a call); observe again at once.
    Progressed {
        /// The action's CamelCase name.
        action: &'static str,
    },
    /// Nothing to do until something changes or `recheck_at`.
    Waiting {
        /// CamelCase reason.
        reason: String,
        /// Why, for people.
        message: String,
        /// When to look again at the latest.
        recheck_at: Option<Timestamp>,
    },
    /// On the target and verified.
    Converged,
    /// Failed: the operation pauses.
    Failed {
        /// CamelCase reason.
        reason: String,
        /// Why, for people.
        message: String,
    },
}

impl OperationStatus {
    /// The engine's view of a machine: its record, or, with none, whether its conditions
    /// show an Upgrade call in flight (left by an earlier operation or controller); such a
    /// machine is observed to the end, never treated as not started. `converged` is whether
    /// the machine's own conditions record it verified on the target: that is its record
    /// of convergence, unless a failure is recorded. `evacuating` is whether its
    /// conditions (or its storage backend's record) show an evacuation open: a machine
    /// whose evacuation began is in progress, whatever the status says (a pass killed
    /// between the backend's write and its status write left it so; counted as pending, it
    /// stayed evacuated beside another machine, and the preflight held it, issue 29 item 4).
    #[must_use]
    pub fn progress_of(
        &self,
        machine: &str,
        past_upgrade_call: bool,
        evacuating: bool,
        converged: bool,
    ) -> MachineProgress {
        match self.machines.get(machine).map(|r| (r.state, r)) {
            Some((RecordState::Failed, record)) => MachineProgress::Failed { reason: record.message.clone() },
            Some((RecordState::Converged, _)) => MachineProgress::Converged,
            _ if converged && !past_upgrade_call => MachineProgress::Converged,
            Some((RecordState::InProgress, _)) => MachineProgress::InProgress { past_upgrade_call },
            None if past_upgrade_call || evacuating => MachineProgress::InProgress { past_upgrade_call },
            None => MachineProgress::Pending,
        }
    }

    /// A Kubernetes upgrade's view of a machine in its current stage, from the machine's own
    /// conditions: `converged` (the stage's record,
    /// [`crate::kubernetes_step::stage_converged`]) is its only record of convergence, and
    /// `past_apply` ([`crate::kubernetes_step::past_apply`]: an apply of this stage
    /// intended or made, not yet verified) its only record of being under way. A record of
    /// the status says neither: it may be the other stage's (a control plane's record left
    /// in progress by its first stage once carried it into its kubelet's with no start, past
    /// the rule that starts one control plane at a time, all of them Ready). Only a failure
    /// is read from the status. A machine started and not yet applied is pending again: it
    /// has changed nothing, and the rules start it again (the same one, in the same order).
    #[must_use]
    pub fn kubernetes_progress_of(&self, machine: &str, past_apply: bool, converged: bool) -> MachineProgress {
        match self.machines.get(machine).map(|r| (r.state, r)) {
            Some((RecordState::Failed, record)) => MachineProgress::Failed { reason: record.message.clone() },
            _ if converged => MachineProgress::Converged,
            _ if past_apply => MachineProgress::InProgress { past_upgrade_call: true },
            _ => MachineProgress::Pending,
        }
    }

    /// Drops the records of converged machines, counting them in `converged` instead: a
    /// machine's convergence is recorded in its own conditions, and the status stays small
    /// whatever the cluster's size. `converged` is how many machines are converged now;
    /// `is_converged` says whether a machine is (whatever its record said: a record left in
    /// progress by a pass whose status write was lost is dropped too). A failure's record
    /// is kept.
    pub fn forget_converged(&mut self, converged: usize, is_converged: impl Fn(&str) -> bool) {
        self.machines.retain(|name, r| {
            r.state == RecordState::Failed || (r.state != RecordState::Converged && !is_converged(name))
        });
        self.converged = converged;
    }

    /// Whether this status, compared with the one `written`, carries nothing that must be
    /// written at once: the same phase, generation and resume token, no machine newly
    /// recorded and none whose state changed; only records dropped (machines converged,
    /// which their own conditions record), the count of converged machines, and the last
    /// reason, message or recheck time of machines in progress. Losing such a change in a
    /// crash loses nothing: the next pass derives it again from the machines' conditions.
    /// A new record must be written at once: it is what bounds how many machines are
    /// started.
    #[must_use]
    pub fn only_bookkeeping_since(&self, written: &Self) -> bool {
        self.phase == written.phase
            && self.observed_generation == written.observed_generation
            && self.observed_resume == written.observed_resume
            && self.etcd_snapshot == written.etcd_snapshot
            && self.manifests == written.manifests
            && self.started_target == written.started_target
            && self.machines.iter().all(|(name, r)| written.machines.get(name).is_some_and(|w| w.state == r.state))
    }

    /// The status to read for `generation`: when the spec changed since the status was
    /// written, converged records no longer prove anything and are dropped (the executor
    /// re-verifies each machine, at no cost for one already on the target).
    #[must_use]
    pub fn for_generation(mut self, generation: i64) -> Self {
        if self.observed_generation.is_some_and(|g| g != generation) {
            self.machines.retain(|_, r| r.state != RecordState::Converged);
        }
        self
    }

    /// The status after carrying out `decision`, with the outcome of each machine advanced.
    /// A failure among the outcomes pauses at once, naming every failed machine.
    #[must_use]
    pub fn next(&self, generation: i64, decision: &Decision, outcomes: &[(String, MachineOutcome)]) -> Self {
        self.next_recording(generation, decision, outcomes, false)
    }

    /// As [`Self::next`], but a machine under way has its record follow its every wait and
    /// step: for an operation on one machine (a removal), where a person needs to see why
    /// it waits (an eviction a PodDisruptionBudget blocks) and the writes cost nothing.
    #[must_use]
    pub fn next_tracking_waits(
        &self,
        generation: i64,
        decision: &Decision,
        outcomes: &[(String, MachineOutcome)],
    ) -> Self {
        self.next_recording(generation, decision, outcomes, true)
    }

    fn next_recording(
        &self,
        generation: i64,
        decision: &Decision,
        outcomes: &[(String, MachineOutcome)],
        track_waits: bool,
    ) -> Self {
        let mut next = self.clone().for_generation(generation);
        next.observed_generation = Some(generation);
        if let Some(token) = &decision.acknowledge_resume {
            next.observed_resume = Some(token.clone());
            // A resume takes a failed snapshot again (the executor records the new one).
            if matches!(next.etcd_snapshot, Some(SnapshotState::Failed { .. })) {
                next.etcd_snapshot = None;
            }
        }
        if let Some(manifests) = &decision.record_manifests {
            next.manifests = Some(manifests.clone());
        }
        if next.started_target.is_none() {
            next.started_target.clone_from(&decision.started_target);
        }
        for name in decision.retry.iter().chain(&decision.stop) {
            next.machines.remove(name);
        }
        for (name, outcome) in outcomes {
            // A machine under way keeps the record it started with: its waits and steps are
            // in its own conditions and in the log, not rewritten into the operation's
            // status at every pass (a write per change of reason would cost the API server
            // more than the whole upgrade).
            // A failure stands until a person resumes (the retry above drops its record):
            // nothing the machine does meanwhile (an install that ended outside the pass,
            // a later step) rewrites it, so a pause never lifts itself.
            if next.machines.get(name).is_some_and(|r| r.state == RecordState::Failed) {
                continue;
            }
            let under_way = next.machines.get(name).is_some_and(|r| r.state == RecordState::InProgress);
            if under_way
                && !track_waits
                && matches!(outcome, MachineOutcome::Progressed { .. } | MachineOutcome::Waiting { .. })
            {
                continue;
            }
            let record = match outcome {
                MachineOutcome::Progressed { action } => MachineRecord {
                    state: RecordState::InProgress,
                    reason: (*action).to_owned(),
                    message: String::new(),
                    recheck_at: None,
                },
                MachineOutcome::Waiting { reason, message, recheck_at } => MachineRecord {
                    state: RecordState::InProgress,
                    reason: reason.clone(),
                    message: message.clone(),
                    recheck_at: if track_waits { *recheck_at } else { None },
                },
                MachineOutcome::Converged => MachineRecord {
                    state: RecordState::Converged,
                    reason: "Converged".to_owned(),
                    message: String::new(),
                    recheck_at: None,
                },
                MachineOutcome::Failed { reason, message } => MachineRecord {
                    state: RecordState::Failed,
                    reason: reason.clone(),
                    message: message.clone(),
                    recheck_at: None,
                },
            };
            next.machines.insert(name.clone(), record);
        }
        let failed: Vec<FailedMachine> = next
            .machines
            .iter()
            .filter(|(_, r)| r.state == RecordState::Failed)
            .map(|(name, r)| FailedMachine { name: name.clone(), reason: r.message.clone() })
            .collect();
        let newly_failed = outcomes.iter().any(|(_, o)| matches!(o, MachineOutcome::Failed { .. }));
        next.phase = if newly_failed {
            Phase::Paused(PauseReason::MachineFailed { machines: failed })
        } else {
            decision.phase.clone()
        };
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::LockAction;

    fn record(state: RecordState) -> MachineRecord {
        MachineRecord { state, reason: "R".into(), message: "m".into(), recheck_at: None }
    }

    fn decision(phase: Phase) -> Decision {
        Decision {
            lock: LockAction::Keep,
            retry: vec![],
            start: vec![],
            advance: vec![],
            stop: vec![],
            phase,
            held: vec![],
            warnings: vec![],
            acknowledge_resume: None,
            check_etcd: false,
            check_preflight: vec![],
            preflight_blocked: vec![],
            take_etcd_snapshot: None,
            apply_manifests: false,
            record_manifests: None,
            authority: std::collections::BTreeMap::new(),
            finish_authority: std::collections::BTreeMap::new(),
            prepull: vec![],
            finalized: false,
            started_target: None,
            recheck_at: None,
        }
    }

    #[test]
    fn a_kubernetes_upgrade_reads_convergence_from_the_stage_record_never_from_the_status() {
        let record = |state| MachineRecord { state, reason: "r".into(), message: "m".into(), recheck_at: None };
        let mut status = OperationStatus::default();
        // A record left Converged by the first stage is not the kubelet's convergence.
        status.machines.insert("cp-1".into(), record(RecordState::Converged));
        assert_eq!(status.kubernetes_progress_of("cp-1", false, false), MachineProgress::Pending);
        assert_eq!(status.kubernetes_progress_of("cp-1", false, true), MachineProgress::Converged);
        assert_eq!(
            status.kubernetes_progress_of("cp-1", true, false),
            MachineProgress::InProgress { past_upgrade_call: true },
            "an intent recorded is in progress whatever the status says"
        );
        status.machines.insert("cp-1".into(), record(RecordState::Failed));
        assert!(matches!(status.kubernetes_progress_of("cp-1", false, true), MachineProgress::Failed { .. }));
        // Found by the property: a record left in progress by the first stage is no start
        // of the second.
        status.machines.insert("cp-1".into(), record(RecordState::InProgress));
        assert_eq!(status.kubernetes_progress_of("cp-1", false, false), MachineProgress::Pending);
    }

    #[test]
    fn a_resume_clears_a_failed_snapshot_and_keeps_a_taken_one() {
        let at = Timestamp::from_unix_secs(5);
        let failed = SnapshotState::Failed { reason: "disk full".into(), at };
        let status = OperationStatus { etcd_snapshot: Some(failed.clone()), ..OperationStatus::default() };
        let mut resume = decision(Phase::Progressing);
        resume.acknowledge_resume = Some("t".into());
        assert_eq!(status.next(1, &resume, &[]).etcd_snapshot, None);
        assert_eq!(status.next(1, &decision(Phase::Progressing), &[]).etcd_snapshot, Some(failed));
        let taken = SnapshotState::Taken(crate::etcd_snapshot::SnapshotRecord {
            location: "l".into(),
            size: 1,
            sha256: "s".into(),
            node: "cp-1".into(),
            taken_at: at,
        });
        let status = OperationStatus { etcd_snapshot: Some(taken.clone()), ..OperationStatus::default() };
        assert_eq!(status.next(1, &resume, &[]).etcd_snapshot, Some(taken));
        // A snapshot's record is never held back like bookkeeping.
        let before = OperationStatus::default();
        assert!(!status.only_bookkeeping_since(&before));
    }

    #[test]
    fn a_failure_stands_whatever_the_machine_reports_until_a_resume() {
        // Seen in the simulator: a failed machine's install ended outside the pass, its
        // outcome overwrote the failure, and the pause lifted itself.
        let mut status = OperationStatus::default();
        status.machines.insert("w".into(), record(RecordState::Failed));
        let late = [
            ("w".to_owned(), MachineOutcome::Progressed { action: "Installed" }),
            ("w".to_owned(), MachineOutcome::Converged),
        ];
        let next = status.next(1, &decision(Phase::Progressing), &late);
        assert_eq!(next.machines["w"].state, RecordState::Failed);
        assert_eq!(next.machines["w"].message, "m", "the failure's own words");
        let mut resume = decision(Phase::Progressing);
        resume.retry = vec!["w".into()];
        let retried = status.next(1, &resume, &[("w".to_owned(), MachineOutcome::Progressed { action: "Retry" })]);
        assert_eq!(retried.machines["w"].state, RecordState::InProgress, "a resume retries it");
    }

    #[test]
    fn progress_comes_from_the_record_or_the_machines_conditions() {
        let mut status = OperationStatus::default();
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::Failed));
        status.machines.insert("c".into(), record(RecordState::InProgress));
        assert_eq!(status.progress_of("a", false, false, false), MachineProgress::Converged);
        assert_eq!(status.progress_of("b", true, false, false), MachineProgress::Failed { reason: "m".into() });
        assert_eq!(status.progress_of("b", false, false, true), MachineProgress::Failed { reason: "m".into() });
        assert_eq!(
            status.progress_of("c", true, false, false),
            MachineProgress::InProgress { past_upgrade_call: true }
        );
        assert_eq!(status.progress_of("c", false, false, true), MachineProgress::Converged, "its conditions say so");
        assert_eq!(status.progress_of("d", false, false, false), MachineProgress::Pending);
        assert_eq!(status.progress_of("d", false, false, true), MachineProgress::Converged, "no record needed");
        assert_eq!(
            status.progress_of("d", true, false, false),
            MachineProgress::InProgress { past_upgrade_call: true },
            "a call in flight from an earlier controller is observed, not ignored"
        );
        assert_eq!(
            status.progress_of("d", false, true, false),
            MachineProgress::InProgress { past_upgrade_call: false },
            "an evacuation begun is in progress with no record"
        );
        assert_eq!(status.progress_of("a", false, true, false), MachineProgress::Converged, "a record wins");
    }

    #[test]
    fn only_convergences_and_the_reasons_of_machines_in_progress_may_wait_to_be_written() {
        let mut written = OperationStatus { phase: Phase::Progressing, ..OperationStatus::default() };
        written.machines.insert("a".into(), record(RecordState::InProgress));
        written.machines.insert("b".into(), record(RecordState::InProgress));
        let mut next = written.clone();
        assert!(next.only_bookkeeping_since(&written), "nothing changed");
        next.machines.remove("a");
        next.converged = 1;
        next.machines.get_mut("b").unwrap().reason = "WaitingForReboot".into();
        assert!(next.only_bookkeeping_since(&written), "a convergence and a new reason");
        let mut started = next.clone();
        started.machines.insert("c".into(), record(RecordState::InProgress));
        assert!(!started.only_bookkeeping_since(&written), "a machine started bounds the others");
        let mut failed = next.clone();
        failed.machines.get_mut("b").unwrap().state = RecordState::Failed;
        assert!(!failed.only_bookkeeping_since(&written), "a failure");
        let paused = OperationStatus { phase: Phase::Completed, ..next.clone() };
        assert!(!paused.only_bookkeeping_since(&written), "a new phase");
        let resumed = OperationStatus { observed_resume: Some("t".into()), ..next.clone() };
        assert!(!resumed.only_bookkeeping_since(&written), "a resume acknowledged");
        let regenerated = OperationStatus { observed_generation: Some(2), ..next };
        assert!(!regenerated.only_bookkeeping_since(&written), "a new generation");
    }

    #[test]
    fn a_new_generation_drops_converged_records_only() {
        let mut status = OperationStatus { observed_generation: Some(1), ..OperationStatus::default() };
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::InProgress));
        let same = status.clone().for_generation(1);
        assert_eq!(same.machines.len(), 2);
        let next = status.for_generation(2);
        assert_eq!(next.machines.keys().collect::<Vec<_>>(), vec!["b"]);
    }

    #[test]
    fn outcomes_are_recorded_and_a_failure_pauses_at_once() {
        let status = OperationStatus::default();
        let outcomes = vec![
            ("a".to_owned(), MachineOutcome::Converged),
            (
                "b".to_owned(),
                MachineOutcome::Waiting { reason: "Rebooting".into(), message: "m".into(), recheck_at: None },
            ),
            ("c".to_owned(), MachineOutcome::Failed { reason: "AbFallback".into(), message: "booted v1.14.3".into() }),
        ];
        let next = status.next(3, &decision(Phase::Progressing), &outcomes);
        assert_eq!(next.observed_generation, Some(3));
        assert_eq!(next.machines["a"].state, RecordState::Converged);
        assert_eq!(next.machines["b"].state, RecordState::InProgress);
        assert_eq!(
            next.phase,
            Phase::Paused(PauseReason::MachineFailed {
                machines: vec![FailedMachine { name: "c".into(), reason: "booted v1.14.3".into() }]
            })
        );
    }

    #[test]
    fn a_machine_under_way_keeps_its_record_until_it_converges_or_fails() {
        let status = OperationStatus::default();
        let started = status.next(
            1,
            &decision(Phase::Progressing),
            &[("a".to_owned(), MachineOutcome::Progressed { action: "BeginEvacuation" })],
        );
        assert_eq!(started.machines["a"].reason, "BeginEvacuation");
        for outcome in [
            MachineOutcome::Waiting { reason: "Evacuating".into(), message: "2 left".into(), recheck_at: None },
            MachineOutcome::Progressed { action: "UpgradeRequested" },
        ] {
            let next = started.next(1, &decision(Phase::Progressing), &[("a".to_owned(), outcome)]);
            assert_eq!(next, started, "no status change, so no status write");
        }
        let blocked = MachineOutcome::Waiting {
            reason: "EvictionBlocked".into(),
            message: "ledger-0: a PodDisruptionBudget allows 0".into(),
            recheck_at: None,
        };
        let tracked = started.next_tracking_waits(1, &decision(Phase::Progressing), &[("a".to_owned(), blocked)]);
        assert_eq!(tracked.machines["a"].reason, "EvictionBlocked", "a removal's status says why it waits");
        let converged = started.next(1, &decision(Phase::Progressing), &[("a".to_owned(), MachineOutcome::Converged)]);
        assert_eq!(converged.machines["a"].state, RecordState::Converged);
    }

    #[test]
    fn converged_machines_are_counted_not_listed() {
        let mut status = OperationStatus::default();
        status.machines.insert("a".into(), record(RecordState::Converged));
        status.machines.insert("b".into(), record(RecordState::InProgress));
        status.machines.insert("c".into(), record(RecordState::InProgress));
        status.forget_converged(3, |name| ["a", "c", "d"].contains(&name));
        assert_eq!(status.machines.keys().collect::<Vec<_>>(), vec!["b"], "c's record was left behind");
        assert_eq!(status.converged, 3);
    }

    #[test]
    fn retry_and_stop_clear_records_and_a_resume_is_remembered() {
        let mut status = OperationStatus::default();
        status.machines.insert("failed".into(), record(RecordState::Failed));
        status.machines.insert("stopped".into(), record(RecordState::InProgress));
        let mut d = decision(Phase::Progressing);
        d.retry = vec!["failed".into()];
        d.stop = vec!["stopped".into()];
        d.acknowledge_resume = Some("t1".into());
        let next = status.next(1, &d, &[]);
        assert!(next.machines.is_empty());
        assert_eq!(next.observed_resume.as_deref(), Some("t1"));
        assert_eq!(next.phase, Phase::Progressing);
    }
}
