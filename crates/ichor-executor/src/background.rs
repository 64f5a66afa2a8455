//! Calls that outlive a reconcile pass: the lifecycle executor's install (a stream of 30 s
//! to minutes) and installer pre-pulls. A pass that waited for them would hold every other
//! machine of the operation; instead it hands them to a [`Background`], which the
//! controller's runner carries out beside its passes ([`crate::jobs::run_job`]) and which tells later
//! passes what is still under way.
//!
//! Nothing here is a record: what must survive a restart is written by the job itself
//! (the install's intent before the stream, its outcome after), exactly as the pass would
//! write it. A controller that dies takes its jobs with it; the next one finds the intent
//! and installs again (decision 0010).
//!
//! # Authority (DESIGN §3.11, decision 0012)
//! An install job carries the authority of the pass that submitted it and no more: before
//! each side effect (the intent's write, the install call) it reads the operation, the
//! Lease, the machine and its Node again and goes on only if that fresh read still
//! authorises it ([`crate::effects`]'s job authority: not held, not paused, not deleting, the lock held,
//! the machine still recorded as started), and it writes the intent under a precondition
//! on the machine's resourceVersion as read then. A pass that stops the machine (a hold, a
//! pause, a deletion) sets the job's [`StopFlag`] first, so the job writes no intent even
//! when no read would show the stop yet; a job that committed to its intent first makes the
//! machine past its call, and the stop leaves it to be finished. A stopped job reports
//! nothing: the machine is as the stop left it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::UpgradeMarker;

use crate::kube_api::MachineInfo;

/// The reason of the outcome of an install job that stopped before a side effect: not a
/// step of the machine, so no pass records it.
pub const INSTALL_STOPPED: &str = "InstallStopped";

/// Set by a pass that stops a machine (a hold, a pause, a deletion): the machine's install
/// job ends before its next side effect. Shared by the job and the queue; two flags are
/// equal only if they are the same flag.
///
/// The job commits to its intent's write through the same flag ([`StopFlag::commit`]), so
/// that a stop and the intent cannot cross: either the stop comes first and the job writes
/// nothing, or the job committed first and the stop learns that the machine is past its
/// call (its evacuation must not be ended under the install).
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<Mutex<FlagState>>);

#[derive(Debug, Default)]
struct FlagState {
    stopped: bool,
    committed: bool,
}

impl StopFlag {
    fn state(&self) -> std::sync::MutexGuard<'_, FlagState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the job to stop before its next side effect; `true` when it is too late for
    /// the intent: the job committed to it, and the machine is to be taken as past its call.
    pub fn stop(&self) -> bool {
        let mut state = self.state();
        state.stopped = true;
        state.committed
    }

    /// The job is about to write its intent: `false` if a stop came first (it must not).
    #[must_use]
    pub fn commit(&self) -> bool {
        let mut state = self.state();
        if !state.stopped {
            state.committed = true;
        }
        !state.stopped
    }

    /// Whether it was asked to stop.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.state().stopped
    }
}

impl PartialEq for StopFlag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StopFlag {}

/// Work handed out of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// A machine's lifecycle install: the pull (at once if the image is there), the
    /// `TalosLifecycle` intent, `LifecycleService.Upgrade`, and its outcome written, each
    /// side effect under an authority read again (see the module's doc).
    Install {
        /// The machine as the pass read it.
        machine: Arc<MachineInfo>,
        /// Its node name, as the pass knew it.
        node: Option<String>,
        /// The installer image.
        image: String,
        /// What the intent records.
        marker: UpgradeMarker,
        /// The operation whose pass submitted it.
        operation: String,
        /// Set when a pass stops the machine.
        stop: StopFlag,
    },
    /// A pull of the installer image onto a machine ahead of its turn. Nothing is written
    /// and a failure is no failure: the upgrade pulls again.
    Prepull {
        /// The machine.
        machine: String,
        /// Its Talos API address.
        address: String,
        /// The installer image.
        image: String,
    },
}

impl Job {
    /// The machine the job is about.
    #[must_use]
    pub fn machine(&self) -> &str {
        match self {
            Self::Install { machine, .. } => &machine.name,
            Self::Prepull { machine, .. } => machine,
        }
    }

    fn kind(&self) -> JobKind {
        match self {
            Self::Install { .. } => JobKind::Install,
            Self::Prepull { .. } => JobKind::Prepull,
        }
    }
}

/// What a job is, for the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    Install,
    Prepull,
}

/// Where a pass hands jobs, and learns which are under way.
pub trait Background: Send + Sync {
    /// The operation whose jobs these are.
    fn operation(&self) -> &str;
    /// A pass stops `machine` (a hold, a pause, a deletion): its install job, if one is
    /// under way, ends before its next side effect. `true` when the job already committed
    /// to its intent: the machine is past its call, and the stop leaves it alone.
    fn stop_install(&self, machine: &str) -> bool;
    /// A pass begins: until the next one, an install under way now counts as under way
    /// even if it ends meanwhile, since the pass read the machine before that end (and
    /// would otherwise take the intent it read for one left by a dead controller).
    fn begin_pass(&self);
    /// Takes `job` to run outside the pass; `false` when it is not taken: one already runs
    /// for the machine, or (a pre-pull) as many pre-pulls run as allowed.
    fn submit(&self, job: Job) -> bool;
    /// Whether an install job runs for `machine`.
    fn installing(&self, machine: &str) -> bool;
    /// Whether this process pulled (or is pulling) the installer onto `machine` ahead of
    /// its turn (an operation pulls one image per machine).
    fn prepulled(&self, machine: &str) -> bool;
    /// The outcomes of install jobs that ended since the last call: a pass records them
    /// (a failure pauses the operation), as if it had carried the install out itself.
    fn take_finished(&self) -> Vec<(String, MachineOutcome)>;
    /// This process saw `machine`'s install begin on boot `boot` (the node answered the
    /// call): kept for as long as the process lives, for a stream an outage cuts before
    /// the record of it could be written.
    fn install_started(&self, machine: &str, boot: &str) {
        let _ = (machine, boot);
    }
    /// Whether this process saw `machine`'s install begin on boot `boot`.
    fn install_seen(&self, machine: &str, boot: &str) -> bool {
        let _ = (machine, boot);
        false
    }
}

/// A [`Background`] for a runner that polls it: jobs submitted wait in it until the
/// runner [`take`](JobQueue::take)s them, and each is under way until the runner says it is
/// [`done`](JobQueue::done).
#[derive(Debug)]
pub struct JobQueue {
    operation: String,
    prepull_limit: usize,
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    pending: Vec<Job>,
    /// Machine -> the kind of the job under way for it (pending or running).
    under_way: BTreeMap<String, JobKind>,
    /// The machines whose install was under way when the current pass began.
    installing_at_pass: BTreeSet<String>,
    /// Machines pulled ahead of their turn by this process.
    prepulled: BTreeSet<String>,
    /// Outcomes of install jobs not yet seen by a pass.
    finished: Vec<(String, MachineOutcome)>,
    /// The stop flag of each machine's install job under way.
    stops: BTreeMap<String, StopFlag>,
    /// Machine -> the boot on which this process saw its install begin.
    started: BTreeMap<String, String>,
}

impl JobQueue {
    /// The queue of operation `operation`, allowing `prepull_limit` pre-pulls under way at
    /// once.
    #[must_use]
    pub fn new(operation: &str, prepull_limit: usize) -> Self {
        Self { operation: operation.to_owned(), prepull_limit, state: Mutex::new(QueueState::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The jobs submitted since the last call, to run now.
    pub fn take(&self) -> Vec<Job> {
        std::mem::take(&mut self.lock().pending)
    }

    /// `job` ended, with `outcome`: its machine is free for another.
    pub fn done(&self, job: &Job, outcome: MachineOutcome) {
        let mut state = self.lock();
        // A pre-pull that ends while its machine's install runs leaves the install's entry.
        if state.under_way.get(job.machine()) == Some(&job.kind()) {
            state.under_way.remove(job.machine());
        }
        if let Job::Install { machine, stop, .. } = job {
            if state.stops.get(&machine.name) == Some(stop) {
                state.stops.remove(&machine.name);
            }
            // A job that stopped before a side effect did nothing a pass must record.
            if !matches!(&outcome, MachineOutcome::Waiting { reason, .. } if reason == INSTALL_STOPPED) {
                state.finished.push((machine.name.clone(), outcome));
            }
        }
    }

    /// Forgets everything: the controller restarted, and its jobs died with it.
    pub fn clear(&self) {
        *self.lock() = QueueState::default();
    }

    /// How many jobs are under way (pending or running).
    #[must_use]
    pub fn under_way(&self) -> usize {
        self.lock().under_way.len()
    }
}

impl Background for JobQueue {
    fn operation(&self) -> &str {
        &self.operation
    }

    fn stop_install(&self, machine: &str) -> bool {
        self.lock().stops.get(machine).is_some_and(StopFlag::stop)
    }

    fn install_started(&self, machine: &str, boot: &str) {
        self.lock().started.insert(machine.to_owned(), boot.to_owned());
    }

    fn install_seen(&self, machine: &str, boot: &str) -> bool {
        self.lock().started.get(machine).is_some_and(|b| b == boot)
    }

    fn begin_pass(&self) {
        let mut state = self.lock();
        let installing =
            state.under_way.iter().filter(|(_, k)| **k == JobKind::Install).map(|(m, _)| m.clone()).collect();
        state.installing_at_pass = installing;
    }

    fn submit(&self, job: Job) -> bool {
        let mut state = self.lock();
        let machine = job.machine().to_owned();
        match (state.under_way.get(&machine), job.kind()) {
            // An install waits for no pre-pull: the install pulls too, and containerd
            // shares one fetch of the same image.
            (None | Some(JobKind::Prepull), JobKind::Install) => {}
            (None, JobKind::Prepull) => {
                let prepulls = state.under_way.values().filter(|k| **k == JobKind::Prepull).count();
                if prepulls >= self.prepull_limit {
                    return false;
                }
            }
            (Some(_), JobKind::Prepull) | (Some(JobKind::Install), JobKind::Install) => return false,
        }
        if job.kind() == JobKind::Prepull {
            state.prepulled.insert(machine.clone());
        }
        if let Job::Install { stop, .. } = &job {
            state.stops.insert(machine.clone(), stop.clone());
        }
        state.under_way.insert(machine, job.kind());
        state.pending.push(job);
        true
    }

    fn installing(&self, machine: &str) -> bool {
        let state = self.lock();
        state.under_way.get(machine) == Some(&JobKind::Install) || state.installing_at_pass.contains(machine)
    }

    fn prepulled(&self, machine: &str) -> bool {
        self.lock().prepulled.contains(machine)
    }

    fn take_finished(&self) -> Vec<(String, MachineOutcome)> {
        std::mem::take(&mut self.lock().finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_upgrade_core::Timestamp;
    use ichor_upgrade_core::versions::TalosVersion;

    fn machine(name: &str) -> Arc<MachineInfo> {
        Arc::new(MachineInfo {
            name: name.into(),
            role: ichor_upgrade_core::machine::vocabulary::MachineRole::Worker,
            hostname: None,
            address: "10.5.0.9".into(),
            labels: Default::default(),
            annotations: Default::default(),
            conditions: Default::default(),
            resource_version: None,
        })
    }

    fn install(name: &str) -> Job {
        let marker = UpgradeMarker {
            target: TalosVersion::parse("v1.14.4").unwrap(),
            boot_id: "b".into(),
            call_deadline: Timestamp::from_unix_secs(1),
            node: None,
        };
        Job::Install {
            machine: machine(name),
            node: Some(name.into()),
            image: "i".into(),
            marker,
            operation: "op".into(),
            stop: StopFlag::default(),
        }
    }

    fn prepull(name: &str) -> Job {
        Job::Prepull { machine: name.into(), address: "10.5.0.9".into(), image: "i".into() }
    }

    #[test]
    fn one_install_per_machine_and_a_bound_on_pre_pulls() {
        let queue = JobQueue::new("op", 2);
        assert!(queue.submit(install("w1")));
        assert!(!queue.submit(install("w1")), "one install at a time per machine");
        assert!(queue.installing("w1"));
        assert!(queue.submit(prepull("w2")) && queue.submit(prepull("w3")));
        assert!(!queue.submit(prepull("w4")), "two pre-pulls at most");
        assert!(!queue.submit(prepull("w1")), "never on a machine being upgraded");
        assert!(queue.prepulled("w2") && !queue.prepulled("w4"));
        assert_eq!(queue.take().len(), 3);
        assert!(queue.take().is_empty());
    }

    #[test]
    fn a_pre_pull_that_ends_during_its_machines_install_leaves_the_install_under_way() {
        // Found by the restart property: the pre-pull's end freed the machine, and the next
        // pass installed it a second time.
        let queue = JobQueue::new("op", 2);
        let pulling = prepull("w1");
        assert!(queue.submit(pulling.clone()));
        assert!(queue.submit(install("w1")), "an install does not wait for its machine's pre-pull");
        queue.done(&pulling, MachineOutcome::Progressed { action: "Prepull" });
        assert!(queue.installing("w1"));
        let installed = install("w1");
        queue.done(&installed, MachineOutcome::Progressed { action: "Installed" });
        queue.begin_pass();
        assert!(!queue.installing("w1"));
        assert_eq!(queue.take_finished(), vec![("w1".to_owned(), MachineOutcome::Progressed { action: "Installed" })]);
    }

    #[test]
    fn an_install_that_ends_during_a_pass_counts_as_under_way_until_the_next() {
        // Found by the restart property: a pass read the machine's intent, the install ended
        // meanwhile, and the pass took the intent for one a dead controller left.
        let queue = JobQueue::new("op", 2);
        let job = install("w1");
        assert!(queue.submit(job.clone()));
        queue.begin_pass();
        queue.done(&job, MachineOutcome::Progressed { action: "Installed" });
        assert!(queue.installing("w1"), "the pass that began before its end");
        queue.begin_pass();
        assert!(!queue.installing("w1"), "the next pass reads its outcome");
    }

    #[test]
    fn a_stop_reaches_the_machines_install_job_and_a_stopped_job_reports_nothing() {
        let queue = JobQueue::new("op", 2);
        let job = install("w1");
        let Job::Install { stop, .. } = &job else { unreachable!() };
        assert!(queue.submit(job.clone()));
        assert!(!queue.stop_install("w2"));
        assert!(!stop.stopped(), "another machine's stop");
        assert!(!queue.stop_install("w1"), "not committed to its intent");
        assert!(stop.stopped());
        assert!(!stop.commit(), "a stopped job writes no intent");
        let stopped =
            MachineOutcome::Waiting { reason: INSTALL_STOPPED.into(), message: "held".into(), recheck_at: None };
        queue.done(&job, stopped);
        assert!(queue.take_finished().is_empty(), "nothing for a pass to record");
        assert!(!queue.installing("w1"));
    }

    #[test]
    fn a_stop_after_the_job_committed_to_its_intent_leaves_the_machine_past_its_call() {
        // Seen in the simulator: a pause's stop ended worker-7's evacuation while its job,
        // past the intent, installed and rebooted it with its storage no longer evacuated.
        let queue = JobQueue::new("op", 2);
        let job = install("w1");
        let Job::Install { stop, .. } = &job else { unreachable!() };
        assert!(queue.submit(job.clone()));
        assert!(stop.commit(), "no stop yet");
        assert!(queue.stop_install("w1"), "too late: the stop must leave the machine alone");
    }

    #[test]
    fn a_restart_forgets_every_job() {
        let queue = JobQueue::new("op", 2);
        assert!(queue.submit(install("w1")));
        queue.clear();
        assert!(!queue.installing("w1") && queue.take().is_empty() && queue.under_way() == 0);
    }
}
