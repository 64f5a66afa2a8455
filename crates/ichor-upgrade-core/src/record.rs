//! What a pass records, decided: the operation's next status from the rollout engine's
//! [`Decision`] and what became of each machine it advanced ([`next_status`]), whether that
//! status must be written now or may wait for the next write that must be made, and when
//! to look at the operation again ([`record`]). The reconcile driver's stage "record"
//! carries the result out (the write, the Events, the finalizer) and decides nothing.

use std::collections::HashSet;
use std::time::Duration;

use crate::etcd::snapshot::SnapshotState;
use crate::rollout::{Decision, MachineView};
use crate::status::{
    FailedMachine, MachineOutcome, MachineProgress, MachineRecord, OperationStatus, PauseReason, Phase, RecordState,
};
use crate::time::Timestamp;

/// The status after carrying out `decision`, with the outcome of each machine advanced.
/// A failure among the outcomes pauses at once, naming every failed machine.
#[must_use]
pub fn next_status(
    status: &OperationStatus,
    generation: i64,
    decision: &Decision,
    outcomes: &[(String, MachineOutcome)],
) -> OperationStatus {
    next_recording(status, generation, decision, outcomes, false)
}

/// As [`next_status`], but a machine under way has its record follow its every wait and
/// step: for an operation on one machine (a removal), where a person needs to see why
/// it waits (an eviction a PodDisruptionBudget blocks) and the writes cost nothing.
#[must_use]
pub fn next_status_tracking_waits(
    status: &OperationStatus,
    generation: i64,
    decision: &Decision,
    outcomes: &[(String, MachineOutcome)],
) -> OperationStatus {
    next_recording(status, generation, decision, outcomes, true)
}

fn next_recording(
    status: &OperationStatus,
    generation: i64,
    decision: &Decision,
    outcomes: &[(String, MachineOutcome)],
    track_waits: bool,
) -> OperationStatus {
    let mut next = status.clone().for_generation(generation);
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
    if let Some(gates) = &decision.gates {
        next.gates.clone_from(gates);
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

/// What an operation does to its machines, as recording a pass tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A Talos upgrade: converged machines are counted, not listed.
    Upgrade,
    /// A Kubernetes upgrade: as an upgrade, and a record left by the other stage is dropped.
    Kubernetes,
    /// A removal: one machine, whose record follows its every wait, written at once.
    Removal,
}

/// What a pass hands to [`record`].
#[derive(Clone, Copy)]
pub struct PassRecord<'a> {
    /// The status as last written (the operation's own).
    pub written: &'a OperationStatus,
    /// The status as this pass read it for the operation's generation.
    pub read: &'a OperationStatus,
    /// The operation's generation.
    pub generation: i64,
    /// What the rollout engine decided in this pass.
    pub decision: &'a Decision,
    /// What became of each machine in this pass (installs that ended outside it first).
    pub outcomes: &'a [(String, MachineOutcome)],
    /// The machines as the engine saw them in this pass.
    pub views: &'a [MachineView],
    /// What the operation does.
    pub work: Work,
    /// The etcd snapshot this pass took and recorded (or failed to), if it did.
    pub snapshot: Option<&'a SnapshotState>,
    /// Whether a machine's own conditions, as this pass read them, record it converged.
    pub converged: &'a dyn Fn(&str) -> bool,
    /// The earliest recheck of the machines this pass passed over (their waits stand).
    pub kept_recheck: Option<Timestamp>,
    /// Since when a change that may wait has been held back, if one is.
    pub held_since: Option<Timestamp>,
    /// How long such a change may be held back.
    pub status_hold: Duration,
    /// Now.
    pub now: Timestamp,
}

/// Whether the next status is written in this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// Written now (a write that changes nothing is the writer's to skip).
    Now,
    /// Held back: only bookkeeping changed (convergences, the reasons of machines in
    /// progress; [`OperationStatus::only_bookkeeping_since`]), so it rides with the next
    /// write that must be made, one status write per machine, not two; at the latest it
    /// is written at `until`.
    HeldBack {
        /// Since when a change has been held back.
        since: Timestamp,
        /// When it is written at the latest.
        until: Timestamp,
    },
}

/// What [`record`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The operation's next status.
    pub status: OperationStatus,
    /// Whether it is written now.
    pub write: StatusWrite,
    /// When to look again, the write aside.
    look_again: Option<Timestamp>,
    now: Timestamp,
}

impl Recorded {
    /// When to look at the operation again: the decision's recheck, a retried machine's
    /// next observation (at once), each outcome's recheck, the waits passed over, the
    /// held-back write's latest time, and, when the pass wrote its status (`wrote`: the
    /// write changed it), at once: what a pass writes is not watched.
    #[must_use]
    pub fn requeue_at(&self, wrote: bool) -> Option<Timestamp> {
        Timestamp::min_opt(self.look_again, wrote.then_some(self.now))
    }
}

/// The status a pass records, whether it is written now, and when to look again.
///
/// A Completed operation stays as it was written, records and counts included: it is not
/// judged again against a target that moved on since. Otherwise an upgrade's converged
/// machines are counted, not listed (each one's convergence is in its own conditions),
/// and a Kubernetes upgrade keeps a record only of a machine it started or advances in
/// this pass, one that failed, or one it does not observe. A removal's record follows
/// its every wait, and is never held back.
#[must_use]
pub fn record(pass: &PassRecord<'_>) -> Recorded {
    let PassRecord { written, read, generation, decision, outcomes, views, work, now, .. } = *pass;
    let mut next = match work {
        Work::Removal => next_status_tracking_waits(read, generation, decision, outcomes),
        Work::Upgrade | Work::Kubernetes => next_status(read, generation, decision, outcomes),
    };
    let terminal = written.phase == Phase::Completed
        && decision.phase == Phase::Completed
        && written.observed_generation == Some(generation);
    if let Some(snapshot) = pass.snapshot {
        next.etcd_snapshot = Some(snapshot.clone());
    }
    if work != Work::Removal && !terminal {
        // A machine converged before this pass is not advanced in it: the two add up.
        let converged_in_pass = |name: &str| outcomes.iter().any(|(n, o)| n == name && *o == MachineOutcome::Converged);
        let count = views.iter().filter(|v| v.progress == MachineProgress::Converged).count()
            + outcomes.iter().filter(|(_, o)| *o == MachineOutcome::Converged).count();
        next.forget_converged(count, |name| converged_in_pass(name) || (pass.converged)(name));
        if work == Work::Kubernetes {
            forget_other_stage(&mut next, decision, views);
        }
    }
    let write = if work != Work::Removal && next != *written && next.only_bookkeeping_since(written) {
        let since = pass.held_since.unwrap_or(now);
        let until = since.saturating_add(pass.status_hold);
        if now < until { StatusWrite::HeldBack { since, until } } else { StatusWrite::Now }
    } else {
        StatusWrite::Now
    };
    // A machine reset for a retry was not stepped: observe again at once.
    let retried = (!decision.retry.is_empty()).then_some(now);
    let look_again = outcomes
        .iter()
        .map(|(_, o)| o.recheck_at(now))
        .fold(Timestamp::min_opt(decision.recheck_at, retried), Timestamp::min_opt);
    let held_until = match write {
        StatusWrite::HeldBack { until, .. } => Some(until),
        StatusWrite::Now => None,
    };
    let look_again = Timestamp::min_opt(Timestamp::min_opt(look_again, pass.kept_recheck), held_until);
    Recorded { status: next, write, look_again, now }
}

/// The status a pass that took the cluster lock, and did nothing else, records: the status
/// as the decision leaves it, with the etcd snapshot it took, and, but for a removal (whose
/// record follows its every wait), the machines converged by then counted, not listed
/// (`converged` says whether a machine's own conditions record it converged). Written at
/// once: the lock's taking is never held back.
#[must_use]
pub fn lock_taken(
    read: &OperationStatus,
    generation: i64,
    decision: &Decision,
    views: &[MachineView],
    work: Work,
    snapshot: Option<&SnapshotState>,
    converged: &dyn Fn(&str) -> bool,
) -> OperationStatus {
    let mut next = next_status(read, generation, decision, &[]);
    if let Some(snapshot) = snapshot {
        next.etcd_snapshot = Some(snapshot.clone());
    }
    if work != Work::Removal {
        let count = views.iter().filter(|v| v.progress == MachineProgress::Converged).count();
        next.forget_converged(count, converged);
    }
    next
}

/// A Kubernetes upgrade keeps a record only of a machine it started or advances in this
/// pass, one that failed, or one it does not observe (waited on): its machines' progress
/// is read from their own conditions, and a record left by the other stage (a control
/// plane's, once its first stage converged in a pass whose status write was held back)
/// would stand for ever, an operation paused with it counting as one still under way.
fn forget_other_stage(next: &mut OperationStatus, decision: &Decision, views: &[MachineView]) {
    let seen: HashSet<&str> = views.iter().map(|v| v.name.as_str()).collect();
    next.machines.retain(|name, record| {
        record.state == RecordState::Failed
            || decision.start.contains(name)
            || decision.advance.contains(name)
            || !seen.contains(name.as_str())
    });
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
            gates: None,
            recheck_at: None,
        }
    }

    #[test]
    fn a_resume_clears_a_failed_snapshot_and_keeps_a_taken_one() {
        let at = Timestamp::from_unix_secs(5);
        let failed = SnapshotState::Failed { reason: "disk full".into(), at };
        let status = OperationStatus { etcd_snapshot: Some(failed.clone()), ..OperationStatus::default() };
        let mut resume = decision(Phase::Progressing);
        resume.acknowledge_resume = Some("t".into());
        assert_eq!(next_status(&status, 1, &resume, &[]).etcd_snapshot, None);
        assert_eq!(next_status(&status, 1, &decision(Phase::Progressing), &[]).etcd_snapshot, Some(failed));
        let taken = SnapshotState::Taken(crate::etcd::snapshot::SnapshotRecord {
            location: "l".into(),
            size: 1,
            sha256: "s".into(),
            node: "cp-1".into(),
            taken_at: at,
        });
        let status = OperationStatus { etcd_snapshot: Some(taken.clone()), ..OperationStatus::default() };
        assert_eq!(next_status(&status, 1, &resume, &[]).etcd_snapshot, Some(taken));
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
        let next = next_status(&status, 1, &decision(Phase::Progressing), &late);
        assert_eq!(next.machines["w"].state, RecordState::Failed);
        assert_eq!(next.machines["w"].message, "m", "the failure's own words");
        let mut resume = decision(Phase::Progressing);
        resume.retry = vec!["w".into()];
        let retried =
            next_status(&status, 1, &resume, &[("w".to_owned(), MachineOutcome::Progressed { action: "Retry" })]);
        assert_eq!(retried.machines["w"].state, RecordState::InProgress, "a resume retries it");
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
        let next = next_status(&status, 3, &decision(Phase::Progressing), &outcomes);
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
        let started = next_status(
            &status,
            1,
            &decision(Phase::Progressing),
            &[("a".to_owned(), MachineOutcome::Progressed { action: "BeginEvacuation" })],
        );
        assert_eq!(started.machines["a"].reason, "BeginEvacuation");
        for outcome in [
            MachineOutcome::Waiting { reason: "Evacuating".into(), message: "2 left".into(), recheck_at: None },
            MachineOutcome::Progressed { action: "UpgradeRequested" },
        ] {
            let next = next_status(&started, 1, &decision(Phase::Progressing), &[("a".to_owned(), outcome)]);
            assert_eq!(next, started, "no status change, so no status write");
        }
        let blocked = MachineOutcome::Waiting {
            reason: "EvictionBlocked".into(),
            message: "ledger-0: a PodDisruptionBudget allows 0".into(),
            recheck_at: None,
        };
        let tracked =
            next_status_tracking_waits(&started, 1, &decision(Phase::Progressing), &[("a".to_owned(), blocked)]);
        assert_eq!(tracked.machines["a"].reason, "EvictionBlocked", "a removal's status says why it waits");
        let converged =
            next_status(&started, 1, &decision(Phase::Progressing), &[("a".to_owned(), MachineOutcome::Converged)]);
        assert_eq!(converged.machines["a"].state, RecordState::Converged);
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
        let next = next_status(&status, 1, &d, &[]);
        assert!(next.machines.is_empty());
        assert_eq!(next.observed_resume.as_deref(), Some("t1"));
        assert_eq!(next.phase, Phase::Progressing);
    }

    fn view(name: &str, progress: MachineProgress) -> MachineView {
        MachineView {
            name: name.into(),
            role: crate::machine::vocabulary::MachineRole::Worker,
            order_label: None,
            held: false,
            node_ready: true,
            os_image: None,
            progress,
            last: false,
        }
    }

    const HOLD: Duration = Duration::from_secs(3);

    /// A pass's record with nothing in it: a Talos upgrade at generation 1, now at 100 s.
    fn pass<'a>(
        written: &'a OperationStatus,
        decision: &'a Decision,
        outcomes: &'a [(String, MachineOutcome)],
        views: &'a [MachineView],
        converged: &'a dyn Fn(&str) -> bool,
    ) -> PassRecord<'a> {
        PassRecord {
            written,
            read: written,
            generation: 1,
            decision,
            outcomes,
            views,
            work: Work::Upgrade,
            snapshot: None,
            converged,
            kept_recheck: None,
            held_since: None,
            status_hold: HOLD,
            now: Timestamp::from_unix_secs(100),
        }
    }

    fn progressing() -> OperationStatus {
        OperationStatus { phase: Phase::Progressing, observed_generation: Some(1), ..OperationStatus::default() }
    }

    #[test]
    fn the_lock_taking_pass_counts_the_converged_keeps_a_failure_and_records_its_snapshot() {
        let mut read = progressing();
        read.machines.insert("a".into(), record(RecordState::Converged));
        read.machines.insert("b".into(), record(RecordState::InProgress));
        read.machines.insert("c".into(), record(RecordState::Failed));
        read.machines.insert("d".into(), record(RecordState::InProgress));
        let views = [
            view("a", MachineProgress::Converged),
            view("b", MachineProgress::Converged),
            view("c", MachineProgress::Pending),
            view("d", MachineProgress::InProgress { past_upgrade_call: true }),
        ];
        let taken = SnapshotState::Failed { reason: "disk full".into(), at: Timestamp::from_unix_secs(90) };
        // "b"'s record was left in progress by a pass whose write was lost: its own
        // conditions say converged, so it is counted and its record dropped.
        let converged = |name: &str| name == "b";
        let next = lock_taken(&read, 1, &decision(Phase::Progressing), &views, Work::Upgrade, Some(&taken), &converged);
        assert_eq!(next.converged, 2);
        assert_eq!(next.machines.keys().collect::<Vec<_>>(), ["c", "d"]);
        assert_eq!(next.etcd_snapshot, Some(taken));
        // A removal's records follow their every wait: none is dropped.
        let removal = lock_taken(&read, 1, &decision(Phase::Progressing), &views, Work::Removal, None, &converged);
        assert_eq!(removal.machines.len(), 4);
        assert_eq!(removal.etcd_snapshot, None);
    }

    #[test]
    fn a_convergence_alone_is_held_back_until_the_hold_runs_out_then_written() {
        let mut written = progressing();
        written.machines.insert("a".into(), record(RecordState::InProgress));
        let d = decision(Phase::Progressing);
        let outcomes = [("a".to_owned(), MachineOutcome::Converged)];
        let views = [view("a", MachineProgress::InProgress { past_upgrade_call: true })];
        let converged = |name: &str| name == "a";
        let now = Timestamp::from_unix_secs(100);
        let held = super::record(&pass(&written, &d, &outcomes, &views, &converged));
        assert!(held.status.machines.is_empty(), "the converged machine's record is dropped");
        assert_eq!(held.status.converged, 1);
        let until = now.saturating_add(HOLD);
        assert_eq!(held.write, StatusWrite::HeldBack { since: now, until });
        assert_eq!(held.requeue_at(false), Some(now), "its convergence asks to look again at once");
        // Held since long enough: written now.
        let since = Timestamp::from_unix_secs(97);
        let due =
            super::record(&PassRecord { held_since: Some(since), ..pass(&written, &d, &outcomes, &views, &converged) });
        assert_eq!(due.write, StatusWrite::Now);
        assert_eq!(due.status, held.status);
    }

    #[test]
    fn a_start_is_written_at_once_and_a_write_looks_again_at_once() {
        let written = progressing();
        let mut d = decision(Phase::Progressing);
        d.start = vec!["a".into()];
        d.recheck_at = Some(Timestamp::from_unix_secs(500));
        let outcomes = [(
            "a".to_owned(),
            MachineOutcome::Waiting {
                reason: "Evacuating".into(),
                message: String::new(),
                recheck_at: Some(Timestamp::from_unix_secs(130)),
            },
        )];
        let views = [view("a", MachineProgress::Pending)];
        let never = |_: &str| false;
        let kept = Timestamp::from_unix_secs(120);
        let recorded =
            super::record(&PassRecord { kept_recheck: Some(kept), ..pass(&written, &d, &outcomes, &views, &never) });
        assert_eq!(recorded.write, StatusWrite::Now, "a new record bounds how many machines start");
        assert_eq!(recorded.status.machines["a"].state, RecordState::InProgress);
        assert_eq!(recorded.requeue_at(false), Some(kept), "the earliest of the waits, kept or new");
        assert_eq!(recorded.requeue_at(true), Some(Timestamp::from_unix_secs(100)), "what it wrote is not watched");
        let mut retry = d.clone();
        retry.retry = vec!["b".into()];
        let retried = super::record(&pass(&written, &retry, &outcomes, &views, &never));
        assert_eq!(retried.requeue_at(false), Some(Timestamp::from_unix_secs(100)), "a retried machine at once");
    }

    #[test]
    fn a_completed_operation_stays_as_it_was_written() {
        let mut written = OperationStatus { phase: Phase::Completed, ..progressing() };
        written.machines.insert("a".into(), record(RecordState::Converged));
        written.converged = 7;
        let d = decision(Phase::Completed);
        let views = [view("a", MachineProgress::Converged)];
        let always = |_: &str| true;
        let recorded = super::record(&pass(&written, &d, &[], &views, &always));
        assert_eq!(recorded.status.converged, 7, "not counted again against a target that moved on");
        assert!(recorded.status.machines.contains_key("a"));
        // Not yet written Completed: counted.
        let first = progressing();
        let counted = super::record(&pass(&first, &d, &[], &views, &always));
        assert_eq!(counted.status.converged, 1);
        assert!(counted.status.machines.is_empty());
    }

    #[test]
    fn a_removal_records_its_every_wait_at_once() {
        let mut written = progressing();
        written.machines.insert("a".into(), record(RecordState::InProgress));
        let d = decision(Phase::Progressing);
        let blocked = MachineOutcome::Waiting {
            reason: "EvictionBlocked".into(),
            message: "a budget allows 0".into(),
            recheck_at: None,
        };
        let outcomes = [("a".to_owned(), blocked)];
        let views = [view("a", MachineProgress::InProgress { past_upgrade_call: false })];
        let never = |_: &str| false;
        let removal =
            super::record(&PassRecord { work: Work::Removal, ..pass(&written, &d, &outcomes, &views, &never) });
        assert_eq!(removal.status.machines["a"].reason, "EvictionBlocked");
        assert_eq!(removal.write, StatusWrite::Now, "a removal's status is never held back");
        let upgrade = super::record(&pass(&written, &d, &outcomes, &views, &never));
        assert_eq!(upgrade.status.machines["a"].reason, "R", "an upgrade's machine keeps the record it started with");
    }

    #[test]
    fn a_kubernetes_upgrade_keeps_only_the_records_of_this_stage() {
        let mut written = progressing();
        for (name, state) in [
            ("left", RecordState::InProgress),
            ("advanced", RecordState::InProgress),
            ("failed", RecordState::Failed),
            ("unseen", RecordState::InProgress),
        ] {
            written.machines.insert(name.into(), record(state));
        }
        let mut d = decision(Phase::Progressing);
        d.advance = vec!["advanced".into()];
        let views = [
            view("left", MachineProgress::Pending),
            view("advanced", MachineProgress::InProgress { past_upgrade_call: true }),
            view("failed", MachineProgress::Failed { reason: "m".into() }),
        ];
        let never = |_: &str| false;
        let kubernetes =
            super::record(&PassRecord { work: Work::Kubernetes, ..pass(&written, &d, &[], &views, &never) });
        let kept: Vec<&String> = kubernetes.status.machines.keys().collect();
        assert_eq!(kept, ["advanced", "failed", "unseen"], "the other stage's record is dropped");
        let upgrade = super::record(&pass(&written, &d, &[], &views, &never));
        assert!(upgrade.status.machines.contains_key("left"), "a Talos upgrade keeps it");
    }

    #[test]
    fn the_snapshot_taken_in_the_pass_is_recorded() {
        let written = progressing();
        let d = decision(Phase::Progressing);
        let never = |_: &str| false;
        let failed = SnapshotState::Failed { reason: "disk full".into(), at: Timestamp::from_unix_secs(99) };
        let recorded = super::record(&PassRecord { snapshot: Some(&failed), ..pass(&written, &d, &[], &[], &never) });
        assert_eq!(recorded.status.etcd_snapshot, Some(failed));
        assert_eq!(recorded.write, StatusWrite::Now);
    }
}
