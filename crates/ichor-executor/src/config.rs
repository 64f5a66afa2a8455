//! The executor's configuration.

use std::time::Duration;

use ichor_upgrade_core::machine::kubernetes::KubernetesTimeouts;
use ichor_upgrade_core::machine::lifecycle::ExecutorChoice;
use ichor_upgrade_core::machine::vocabulary::StepTimeouts;
use ichor_upgrade_core::plan::{Defaults, models};
use ichor_upgrade_core::rollout::RolloutConfig;
use ichor_upgrade_core::window::TurnP90;

/// How long calls may take, and the step's and engine's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutorConfig {
    /// The bound of every call but Upgrade (default 15 s).
    pub call_timeout: Duration,
    /// The step's bounds; `upgrade_call` (default 10 minutes) is the Upgrade call's own
    /// bound, since the node pulls and checks the installer image before it answers.
    pub step: StepTimeouts,
    /// The cluster lock's timing.
    pub rollout: RolloutConfig,
    /// How long a status change that may wait is held back before it is written on its
    /// own (default 30 s): machines converged and the reasons of machines in progress,
    /// which the machines' conditions record, ride with the next write that must be
    /// made. The status's count of converged machines lags by at most this much.
    pub status_hold: Duration,
    /// The bound of a whole etcd snapshot, streamed from a control plane into the snapshot
    /// store (default 30 minutes: etcd's largest supported database, 8 GiB, at a few MB/s).
    /// A stream that sends nothing for [`ExecutorConfig::call_timeout`] is broken off too.
    pub snapshot_timeout: Duration,
    /// Which Talos executor upgrades a machine (default [`ExecutorChoice::Auto`]: the
    /// lifecycle one on Talos 1.18 and later, where the legacy call is gone). A machine
    /// under way keeps the executor it started on.
    pub executor: ExecutorChoice,
    /// Pulling the installer image onto the machines expected to start next, while the
    /// current ones upgrade.
    pub prepull: Prepull,
    /// The least time from the start of one pass of an operation to the start of the next
    /// one woken from outside (default 2 s). What arrives meanwhile (watch events, timed
    /// requeues, an install's end) is folded into that next pass, which then starts at
    /// once; a pass that asks to look again at once (it wrote what it must read back, or
    /// its step goes on) is followed at once. A pass reads and decides over every machine
    /// of the cluster; at 5,000 machines with 100 under way, watch events come every few
    /// hundred milliseconds, and without this each one would bring a pass of its own (and
    /// its reads) for one machine's change. It costs a rollout at most this much per step
    /// a machine waits on from outside (an evacuation's end, a Node Ready, a slot freed):
    /// under 1% of a machine's few minutes (`docs/performance.md`). Unlike kube-runtime's
    /// trailing debounce it cannot be put off for ever by a stream of events.
    pub pass_interval: Duration,
    /// A Kubernetes upgrade's bounds: how long a changed component may take to be verified.
    pub kubernetes: KubernetesTimeouts,
    /// The p90 of one machine's turn by role, which a start is admitted on into a
    /// maintenance window ([`ichor_upgrade_core::window`]). The operator sets it for each
    /// pass from the cluster's last completed upgrade
    /// ([`ichor_upgrade_core::plan::Models::p90`]); the default, for a cluster with no
    /// history, is the p90 of each default phase of a Talos turn, summed (4.5 minutes, from
    /// [`Defaults::talos`]), which errs long.
    pub turn_p90: TurnP90,
}

/// Pre-pulling the installer image ahead of a machine's turn.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Prepull {
    /// Whether to (default on). Only with a runner for calls outside the pass
    /// ([`crate::calls::Executor::background`]).
    pub enabled: bool,
    /// How many pre-pulls may be under way at once (default 10): each shares the
    /// registry's bandwidth with the pulls of the machines upgrading now.
    pub limit: usize,
}

impl Default for Prepull {
    fn default() -> Self {
        Self { enabled: true, limit: 10 }
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(15),
            step: StepTimeouts::default(),
            rollout: RolloutConfig::default(),
            status_hold: Duration::from_secs(30),
            snapshot_timeout: Duration::from_secs(30 * 60),
            executor: ExecutorChoice::Auto,
            prepull: Prepull::default(),
            pass_interval: Duration::from_secs(2),
            kubernetes: KubernetesTimeouts::default(),
            turn_p90: models(None, &Defaults::talos(2.0)).p90(),
        }
    }
}

impl ExecutorConfig {
    /// The same configuration with another ordinary call bound.
    #[must_use]
    pub fn with_call_timeout(mut self, bound: Duration) -> Self {
        self.call_timeout = bound;
        self
    }

    /// The same configuration with another [`ExecutorConfig::pass_interval`].
    #[must_use]
    pub fn with_pass_interval(mut self, interval: Duration) -> Self {
        self.pass_interval = interval;
        self
    }

    /// The same configuration with another choice of executor.
    #[must_use]
    pub fn with_executor(mut self, executor: ExecutorChoice) -> Self {
        self.executor = executor;
        self
    }

    /// The same configuration with pre-pulls on or off.
    #[must_use]
    pub fn with_prepull(mut self, enabled: bool) -> Self {
        self.prepull.enabled = enabled;
        self
    }

    /// The same configuration with another Upgrade call bound.
    #[must_use]
    pub fn with_upgrade_call_timeout(mut self, bound: Duration) -> Self {
        self.step.upgrade_call = bound;
        self
    }
}
