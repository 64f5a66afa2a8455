//! Calls that outlive a reconcile pass: the lifecycle executor's install (a stream of 30 s
//! to minutes) and installer pre-pulls. A pass that waited for them would hold every other
//! machine of the operation; instead it hands them to a [`Background`], which the
//! controller's runner carries out beside its passes ([`run_job`]) and which tells later
//! passes what is still under way.
//!
//! Nothing here is a record: what must survive a restart is written by the job itself
//! (the install's intent before the stream, its outcome after), exactly as the pass would
//! write it. A controller that dies takes its jobs with it; the next one finds the intent
//! and installs again (decision 0010).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use ichor_upgrade_core::status::MachineOutcome;
use ichor_upgrade_core::upgrade_marker::UpgradeMarker;

use crate::advance::Executor;
use crate::kube_api::MachineInfo;
use crate::talos_api::PullRequest;

/// Work handed out of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// A machine's lifecycle install: the pull (at once if the image is there), the
    /// `TalosLifecycle` intent, `LifecycleService.Upgrade`, and its outcome written.
    Install {
        /// The machine as the pass read it.
        machine: Arc<MachineInfo>,
        /// The installer image.
        image: String,
        /// What the intent records.
        marker: UpgradeMarker,
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
    /// Takes `job` to run outside the pass; `false` when it is not taken: one already runs
    /// for the machine, or (a pre-pull) as many pre-pulls run as allowed.
    fn submit(&self, job: Job) -> bool;
    /// Whether an install job runs for `machine`.
    fn installing(&self, machine: &str) -> bool;
    /// Whether this process pulled (or is pulling) `image` onto `machine` ahead of its
    /// turn.
    fn prepulled(&self, machine: &str, image: &str) -> bool;
    /// The outcomes of install jobs that ended since the last call: a pass records them
    /// (a failure pauses the operation), as if it had carried the install out itself.
    fn take_finished(&self) -> Vec<(String, MachineOutcome)>;
}

/// A [`Background`] for a runner that polls it: jobs submitted wait in it until the
/// runner [`take`](JobQueue::take)s them, and each is under way until the runner says it is
/// [`done`](JobQueue::done).
#[derive(Debug)]
pub struct JobQueue {
    prepull_limit: usize,
    state: Mutex<QueueState>,
}

#[derive(Debug, Default)]
struct QueueState {
    pending: Vec<Job>,
    /// Machine -> the kind of the job under way for it (pending or running).
    under_way: BTreeMap<String, JobKind>,
    /// (machine, image) pulled ahead of its turn by this process.
    prepulled: BTreeSet<(String, String)>,
    /// Outcomes of install jobs not yet seen by a pass.
    finished: Vec<(String, MachineOutcome)>,
}

impl JobQueue {
    /// A queue allowing `prepull_limit` pre-pulls under way at once.
    #[must_use]
    pub fn new(prepull_limit: usize) -> Self {
        Self { prepull_limit, state: Mutex::new(QueueState::default()) }
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
        state.under_way.remove(job.machine());
        if let Job::Install { machine, .. } = job {
            state.finished.push((machine.name.clone(), outcome));
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
        if let Job::Prepull { image, .. } = &job {
            state.prepulled.insert((machine.clone(), image.clone()));
        }
        state.under_way.insert(machine, job.kind());
        state.pending.push(job);
        true
    }

    fn installing(&self, machine: &str) -> bool {
        self.lock().under_way.get(machine) == Some(&JobKind::Install)
    }

    fn prepulled(&self, machine: &str, image: &str) -> bool {
        self.lock().prepulled.contains(&(machine.to_owned(), image.to_owned()))
    }

    fn take_finished(&self) -> Vec<(String, MachineOutcome)> {
        std::mem::take(&mut self.lock().finished)
    }
}

/// Carries a job out to its end: what a runner's task does with each job it takes.
pub async fn run_job(ex: &Executor<'_>, job: &Job) -> MachineOutcome {
    match job {
        Job::Install { machine, image, marker } => {
            crate::lifecycle::install(ex, machine, image.clone(), marker.clone()).await.unwrap_or_else(|e| e.outcome())
        }
        Job::Prepull { machine, address, image } => {
            let pull = PullRequest { image: image.clone(), timeout: ex.config.step.upgrade_call };
            match crate::advance::bounded("pre-pull", pull.timeout, ex.talos.image_pull(address, &pull)).await {
                Ok(Ok(_)) => tracing::debug!(%machine, %image, "pre-pulled"),
                // Not a failure: the upgrade pulls again.
                Ok(Err(e)) => tracing::info!(%machine, %image, error = %crate::cause::report(&e), "pre-pull failed"),
                Err(e) => tracing::info!(%machine, %image, error = %e, "pre-pull failed"),
            }
            MachineOutcome::Progressed { action: "Prepull" }
        }
    }
}
